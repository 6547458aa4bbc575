// Subcommands of the checkpoint layer.
#include "commands.h"

namespace deepinfer::cli {

void register_checkpoint_commands(CLI::App& /*app*/) {}

}  // namespace deepinfer::cli
