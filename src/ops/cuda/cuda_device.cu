#include <cuda_runtime.h>

#include "core/error.h"
#include "ops/cuda/cuda_device.h"

namespace deepinfer::cuda {
namespace {
// Only here so that its presence in the binary can be asked: it has machine code for the GPU
// exactly when every kernel of this build does.
__global__ void probe_kernel() {}
}  // namespace

DeviceInfo require_supported_device(int ordinal) {
  int count = 0;
  if (cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess) {
    DI_THROW("CUDA is unavailable: ", cudaGetErrorString(status));
  }
  if (ordinal < 0 || ordinal >= count) {
    DI_THROW("CUDA device ", ordinal, " requested but ", count, " device(s) are visible");
  }
  cudaDeviceProp prop{};
  if (cudaError_t status = cudaGetDeviceProperties(&prop, ordinal); status != cudaSuccess) {
    DI_THROW("cannot query CUDA device ", ordinal, ": ", cudaGetErrorString(status));
  }
  if (prop.major != 9 && prop.major != 10) {
    DI_THROW("CUDA device ", ordinal, " (", prop.name, ") has compute capability ", prop.major, ".",
             prop.minor,
             "; deepinfer's CUDA backend supports Hopper (9.0) and Blackwell (10.x) GPUs");
  }
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(ordinal);
  cudaFuncAttributes attributes{};
  const cudaError_t status = cudaFuncGetAttributes(&attributes, probe_kernel);
  cudaSetDevice(previous);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls are not blamed for it
    DI_THROW("CUDA device ", ordinal, " (", prop.name, ", compute capability ", prop.major, ".",
             prop.minor, ") has no code in this build (", cudaGetErrorString(status),
             "); rebuild with CMAKE_CUDA_ARCHITECTURES including ", prop.major, prop.minor,
             prop.major >= 9 ? "a" : "");
  }
  return DeviceInfo{ordinal, prop.name, prop.major, prop.minor, prop.totalGlobalMem};
}

}  // namespace deepinfer::cuda
