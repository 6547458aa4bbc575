// Device pieces the tensor-core kernels share: the m16n8k32 e4m3 MMA from a zero accumulator
// (moe_grouped_gemm.cu, linear_fp8_dense.cu), the m16n8k16 bf16 MMA (linear_bf16_mma.cu,
// attention.cu, the indexer in compressed_branch.cu), the cp.async copies of their shared-memory
// pipelines, and the prefill tiles' pipeline schedule. Internal to the CUDA backend; include from
// .cu files only (sm_89+ instructions).
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

// d += A (16 x 16 bf16) . B (16 x 8 bf16), f32 accumulate.
__device__ __forceinline__ void mma_bf16_m16n8k16(const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                                  float (&d)[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
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

// The prefill tiles' software pipeline over `steps` K steps in kStages shared-memory slots
// (step s in slot s % kStages): copy_stage(step, slot) issues a stage's cp.async copies,
// load_scale_codes(step) returns this thread's scale codes of a stage as a word and
// store_scales(codes, slot) writes them into the slot, compute_stage(slot, step) runs a stage's
// MMAs (only where `computes`: warps past the tile's tokens still reach every barrier). Each step
// waits for its own copies, then refills the slot the step before it used; the scale codes of
// that refill are loaded before this step's MMAs and stored after them, hiding the load. On
// return every copy of a real stage has landed (the groups still counted are the empty ones the
// last steps commit).
template <int kStages, typename CopyStage, typename LoadScaleCodes, typename StoreScales,
          typename ComputeStage>
__device__ __forceinline__ void run_stage_pipeline(int steps, bool computes,
                                                   const CopyStage& copy_stage,
                                                   const LoadScaleCodes& load_scale_codes,
                                                   const StoreScales& store_scales,
                                                   const ComputeStage& compute_stage) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) {
      copy_stage(s, s);
      store_scales(load_scale_codes(s), s);
    }
    commit_copies();
  }
  for (int step = 0; step < steps; ++step) {
    const int ahead = step + kStages - 1;
    // Loaded now, stored after this step's MMAs: the load's latency hides behind them.
    const uint32_t ahead_codes = ahead < steps ? load_scale_codes(ahead) : 0;
    wait_copies<kStages - 2>();
    __syncthreads();  // stage `step` is in; every warp is done with the slot `ahead` reuses
    if (ahead < steps) copy_stage(ahead, ahead % kStages);
    commit_copies();
    if (computes) compute_stage(step % kStages, step);
    if (ahead < steps) store_scales(ahead_codes, ahead % kStages);
  }
}

}  // namespace deepinfer::ops::cuda
