// Subcommands of the tokenizer layer.
#include "commands.h"

namespace deepinfer::cli {

void register_tokenizer_commands(CLI::App& /*app*/) {}

}  // namespace deepinfer::cli
