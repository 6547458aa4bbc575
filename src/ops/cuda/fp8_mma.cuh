// Device pieces the FP8 tensor-core GEMMs share (moe_grouped_gemm.cu, linear_fp8_dense.cu): the
// m16n8k32 e4m3 MMA from a zero accumulator, and the cp.async copies of their shared-memory
// pipelines. Internal to the CUDA backend; include from .cu files only (sm_89+ instructions).
#pragma once

#include <cstdint>

namespace deepinfer::ops::cuda {

// d = A (16 x 32 e4m3) . B (32 x 8 e4m3), from a zero accumulator, so the caller can scale each
// 32-block's result before adding it. Not volatile: the compiler may interleave independent MMAs
// with their scaling (the same instruction, so the same bits).
__device__ __forceinline__ void mma_e4m3_from_zero(const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                                   float (&d)[4]) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, bypassing L1 (the tiles are read once per block).
__device__ __forceinline__ void copy_16_async(uint32_t shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared), "l"(global) : "memory");
}

__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending committed copy groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace deepinfer::ops::cuda
