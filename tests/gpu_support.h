// What the GPU tests share: whether GPU 0 can run the CUDA backend (they skip where it cannot)
// and the source tree (the GPU machine runs staged binaries from a copy elsewhere).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"

#ifdef DEEPINFER_HAS_CUDA
#include "ops/cuda/cuda_device.h"
#endif

namespace deepinfer::testing {

// Empty when GPU 0 can run the CUDA backend; otherwise why it cannot.
inline std::string gpu_unavailable() {
#ifdef DEEPINFER_HAS_CUDA
  try {
    cuda::require_supported_device(0);
    return {};
  } catch (const Error& error) {
    return error.what();
  }
#else
  return "this build has no CUDA backend (-DDEEPINFER_CUDA=ON)";
#endif
}

// DEEPINFER_SOURCE_DIR from the environment when set, else the tree this was built from.
inline std::filesystem::path source_dir() {
  const char* dir = std::getenv("DEEPINFER_SOURCE_DIR");
  return dir != nullptr && *dir != '\0' ? dir : DEEPINFER_SOURCE_DIR;
}

}  // namespace deepinfer::testing

#define DEEPINFER_SKIP_WITHOUT_GPU()                                                 \
  if (const std::string why = ::deepinfer::testing::gpu_unavailable(); !why.empty()) \
  GTEST_SKIP() << "no usable GPU: " << why
