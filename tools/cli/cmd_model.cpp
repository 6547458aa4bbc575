// Subcommands of the model layer.
#include "commands.h"

namespace deepinfer::cli {

void register_model_commands(CLI::App& /*app*/) {}

}  // namespace deepinfer::cli
