// Subcommands of the structured layer.
#include "commands.h"

namespace deepinfer::cli {

void register_structured_commands(CLI::App& /*app*/) {}

}  // namespace deepinfer::cli
