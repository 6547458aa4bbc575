// The measurements the GPU benchmarks share: a kernel's median time per call, and the HBM read
// roofline they hold their kernels against: a grid-stride pass of
// 16-byte streaming loads (__ldcs, evict-first) over a buffer far larger than the L2, 8 blocks of
// 512 threads per SM. One copy for every benchmark (cuda_layer_bench, cuda_model_bench, and
// cuda_attention_bench can include it too: the names do not meet its own), so their "% of the
// read roofline" columns divide by the same kernel. Include from one .cu file per program; it
// defines everything in an unnamed namespace.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_runtime.h"

namespace deepinfer::bench {
namespace {

__global__ void hbm_read_kernel(const uint4* data, size_t count, unsigned* sink) {
  uint32_t acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const uint4 v = __ldcs(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) atomicAdd(sink, 1u);  // keeps the loads alive; practically never true
}

constexpr int kHbmReadThreads = 512;

// The read pass's grid on GPU 0: 8 blocks per SM. Query it once, outside timed loops.
inline unsigned hbm_read_blocks() {
  int sms = 0;
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  return static_cast<unsigned>(sms) * 8;
}

// One read pass over `bytes` (rounded down to 16) of device memory at `data` (16-byte aligned) on
// the default stream; `sink` is one device unsigned the kernel may write.
inline void launch_hbm_read(const void* data, size_t bytes, unsigned* sink, unsigned blocks) {
  hbm_read_kernel<<<blocks, kHbmReadThreads>>>(static_cast<const uint4*>(data), bytes / 16, sink);
  DI_CUDA_CHECK(cudaGetLastError());
}

// Median GB/s of 10 read passes (after 2 warm-ups) over a fresh buffer of `bytes` on GPU 0.
inline double measure_hbm_read_gbps(size_t bytes) {
  bytes &= ~static_cast<size_t>(15);
  void* data = nullptr;
  unsigned* sink = nullptr;
  DI_CUDA_CHECK(cudaMalloc(&data, bytes));
  DI_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  DI_CUDA_CHECK(cudaMemset(data, 0x5A, bytes));
  const unsigned blocks = hbm_read_blocks();
  cudaEvent_t start, stop;
  DI_CUDA_CHECK(cudaEventCreate(&start));
  DI_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> gbps;
  for (int run = 0; run < 12; ++run) {
    DI_CUDA_CHECK(cudaEventRecord(start));
    launch_hbm_read(data, bytes, sink, blocks);
    DI_CUDA_CHECK(cudaEventRecord(stop));
    DI_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DI_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (run >= 2) gbps.push_back(static_cast<double>(bytes) / ms * 1e-6);  // 2 warm-ups
  }
  DI_CUDA_CHECK(cudaEventDestroy(start));
  DI_CUDA_CHECK(cudaEventDestroy(stop));
  DI_CUDA_CHECK(cudaFree(sink));
  DI_CUDA_CHECK(cudaFree(data));
  std::sort(gbps.begin(), gbps.end());
  return gbps[gbps.size() / 2];
}

// Median milliseconds per call: a warm-up call, then rounds of `inner` calls between two events,
// `inner` sized so a round lasts about 2 ms.
inline double time_ms(const std::function<void()>& call) {
  cudaEvent_t start, stop;
  DI_CUDA_CHECK(cudaEventCreate(&start));
  DI_CUDA_CHECK(cudaEventCreate(&stop));
  call();
  DI_CUDA_CHECK(cudaEventRecord(start));
  call();
  DI_CUDA_CHECK(cudaEventRecord(stop));
  DI_CUDA_CHECK(cudaEventSynchronize(stop));
  float first = 0;
  DI_CUDA_CHECK(cudaEventElapsedTime(&first, start, stop));
  const int inner = std::clamp(static_cast<int>(2.0 / std::max(first, 1e-4f)), 1, 200);
  const int rounds = std::clamp(static_cast<int>(300.0 / (std::max(first, 1e-4f) * inner)), 3, 15);
  std::vector<double> per_call;
  for (int r = 0; r < rounds; ++r) {
    DI_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < inner; ++i) call();
    DI_CUDA_CHECK(cudaEventRecord(stop));
    DI_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DI_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    per_call.push_back(ms / inner);
  }
  DI_CUDA_CHECK(cudaEventDestroy(start));
  DI_CUDA_CHECK(cudaEventDestroy(stop));
  deepinfer::cuda::synchronize();
  std::nth_element(per_call.begin(), per_call.begin() + per_call.size() / 2, per_call.end());
  return per_call[per_call.size() / 2];
}

}  // namespace
}  // namespace deepinfer::bench
