#include <cuda_runtime.h>

#include "core/error.h"
#include "ops/cuda/cuda_device.h"

namespace deepinfer::cuda {

DeviceInfo require_supported_device(int ordinal) {
  int count = 0;
  if (cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess) {
    DI_THROW("DEEPINFER_ACCELERATOR=nvidia but CUDA is unavailable: ", cudaGetErrorString(status));
  }
  if (ordinal < 0 || ordinal >= count) {
    DI_THROW("CUDA device ", ordinal, " requested but ", count, " device(s) are visible");
  }
  cudaDeviceProp prop{};
  if (cudaError_t status = cudaGetDeviceProperties(&prop, ordinal); status != cudaSuccess) {
    DI_THROW("cannot query CUDA device ", ordinal, ": ", cudaGetErrorString(status));
  }
  if (prop.major < 9) {
    DI_THROW("CUDA device ", ordinal, " (", prop.name, ") has compute capability ", prop.major,
             ".", prop.minor, "; deepinfer's CUDA backend needs Hopper (9.0) or newer");
  }
  return DeviceInfo{ordinal, prop.name, prop.major, prop.minor, prop.totalGlobalMem};
}

}  // namespace deepinfer::cuda
