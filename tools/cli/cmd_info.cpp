// `deepinfer info`: what this build contains; the smoke run of the CLI.
#include <cstdio>

#include "commands.h"
#include "core/dtype.h"

namespace deepinfer::cli {

void register_info_command(CLI::App& app) {
  auto* info = app.add_subcommand("info", "Print build configuration and supported dtypes");
  info->callback([] {
    std::printf("deepinfer %s\n", DEEPINFER_VERSION);
#ifdef DEEPINFER_HAS_CUDA
    std::printf("backends: cpu, cuda (sm_90a)\n");
#else
    std::printf("backends: cpu\n");
#endif
    std::printf("dtypes:");
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2,
                        DType::kF8E8M0, DType::kF4E2M1x2, DType::kI8, DType::kI32, DType::kI64,
                        DType::kBool}) {
      std::printf(" %.*s", static_cast<int>(dtype_name(dtype).size()), dtype_name(dtype).data());
    }
    std::printf("\n");
  });
}

}  // namespace deepinfer::cli
