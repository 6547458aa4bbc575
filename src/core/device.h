// Where a tensor's bytes live. Kernels dispatch on it; views carry it so that a CPU kernel
// never dereferences a CUDA pointer.
#pragma once

#include <cstdint>
#include <string>

namespace deepinfer {

enum class DeviceType : uint8_t { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // CUDA ordinal; always 0 for the CPU

  static constexpr Device cpu() { return Device{DeviceType::kCpu, 0}; }
  static constexpr Device cuda(int ordinal) { return Device{DeviceType::kCuda, ordinal}; }

  constexpr bool is_cpu() const { return type == DeviceType::kCpu; }
  constexpr bool is_cuda() const { return type == DeviceType::kCuda; }
  friend constexpr bool operator==(const Device&, const Device&) = default;

  // "cpu" or "cuda:N".
  std::string to_string() const {
    return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
  }
};

}  // namespace deepinfer
