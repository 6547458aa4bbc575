// Each layer registers its subcommands on the one `deepinfer` binary.
#pragma once

#include <CLI/CLI.hpp>

namespace deepinfer::cli {

void register_info_command(CLI::App& app);
void register_checkpoint_commands(CLI::App& app);
void register_tokenizer_commands(CLI::App& app);
void register_structured_commands(CLI::App& app);
void register_model_commands(CLI::App& app);
void register_forward_command(CLI::App& app);
void register_generate_command(CLI::App& app);
void register_bench_command(CLI::App& app);

}  // namespace deepinfer::cli
