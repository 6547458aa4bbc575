#include <cstdio>
#include <exception>

#include "commands.h"
#include "core/error.h"
#include "core/logging.h"

int main(int argc, char** argv) {
  CLI::App app{"deepinfer: inference engine for DeepSeek-V4.1-Flash"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.parse_complete_callback(
      [&] { deepinfer::set_log_level(deepinfer::parse_log_level(log_level)); });

  deepinfer::cli::register_info_command(app);
  deepinfer::cli::register_checkpoint_commands(app);
  deepinfer::cli::register_tokenizer_commands(app);
  deepinfer::cli::register_structured_commands(app);
  deepinfer::cli::register_model_commands(app);
  deepinfer::cli::register_forward_command(app);
  deepinfer::cli::register_generate_command(app);
  deepinfer::cli::register_bench_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;  // usage error
  } catch (const deepinfer::Error& e) {
    std::fprintf(stderr, "deepinfer: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepinfer: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
