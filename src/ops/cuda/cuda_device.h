// Selecting and validating the GPU the CUDA backend runs on.
#pragma once

#include <string>

namespace deepinfer::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  size_t total_memory_bytes = 0;
};

// Returns the device or throws Error naming why it cannot be used (no driver, no GPU,
// compute capability below 9.0).
DeviceInfo require_supported_device(int ordinal);

}  // namespace deepinfer::cuda
