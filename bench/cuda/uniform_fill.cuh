// Random f32 device data for the GPU benchmarks that feed kernels activations and cache rows
// (cuda_attention_bench, cuda_indexer_bench): uniform in [-scale, scale) from a counter hash, so a
// (seed, index) pair always gives the same value. Include from one .cu file per program; it
// defines everything in an unnamed namespace.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_runtime.h"

namespace deepinfer::bench {
namespace {

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// Uniform [-scale, scale) floats; `bf16_exact`: rounded to bf16 (as the model's KV rows are).
__global__ void fill_kernel(float* data, int64_t count, uint64_t seed, float scale,
                            bool bf16_exact) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const uint64_t h = mix(seed * 0x100000001B3ull + static_cast<uint64_t>(i));
    const float value = (static_cast<float>(h >> 40) * 0x1p-23f - 1.0f) * scale;
    data[i] = bf16_exact ? __bfloat162float(__float2bfloat16_rn(value)) : value;
  }
}

void fill(Tensor& t, uint64_t seed, float scale, bool bf16_exact) {
  fill_kernel<<<2048, 256>>>(t.data<float>(), t.numel(), seed, scale, bf16_exact);
  DI_CUDA_CHECK(cudaGetLastError());
}

Tensor device_f32(Shape shape, uint64_t seed, float scale, bool bf16_exact = false) {
  Tensor t = Tensor::empty(DType::kF32, shape, deepinfer::cuda::device_allocator());
  fill(t, seed, scale, bf16_exact);
  return t;
}

}  // namespace
}  // namespace deepinfer::bench
