// The routed experts' GEMM for all experts in one launch (CUDA only): FP8-quantized activations
// times packed FP4 e2m1 expert weights on the tensor cores, for rows already grouped by expert.
#pragma once

#include "core/tensor.h"
#include "ops/ops.h"

namespace deepinfer::ops::cuda {

// For every expert e and every row r in [expert_offsets[e], expert_offsets[e+1]):
//   out[r, n] = sum over K blocks b (of 32, ascending) of
//               (q(x[r])_b . W[e, n]_b) * s_x[r, b] * s_w[e, n, b]
// where q(x) is the released activation quantizer (e4m3 with a ue8m0 scale per 32, as
// ops::linear's kFp8PerBlock32) and W is fp4 e2m1 with ue8m0 scales per 32 along K — the same
// function as ops::linear(x_rows, {W[e], scale[e]}, out_rows, kFp8PerBlock32).
//  - x [R, K] f32 (row stride may exceed K), device; rows grouped by expert (the caller permutes).
//  - expert_offsets [E + 1] i32, device, non-decreasing; offsets are clamped to [0, R] on the
//    device, so bad offsets skip rows instead of reading outside x.
//  - weight [E, N, K] kF4E2M1x2 and scale [E, N, K / 32] kF8E8M0, contiguous, device.
//  - out [R, N] f32, device; rows outside every expert's range are not written.
// K must be a multiple of 256 and N of 16 (every V4.1 expert matrix is).
// Batch invariance: each output element is the same sequence of operations (one tensor-core
// dot per 32-block, scaled, added in K order) whatever the number of rows, the tile that holds
// it and the other experts' rows, so a row's result does not depend on the batch. It differs
// from ops::cuda::linear's (one FMA chain) in the last bits.
// With ops::batch_invariant() off on an sm_90 device the prefill regime (below) runs on the wgmma
// tile instead, which promotes its FP8 accumulator once per 128 of K (moe_prefill_wgmma.h): a
// different function in the last bits (per-128 activation scales, FP8 accumulation within 128).
// So does the decode regime (fewer than 16 rows per expert, aligned weights, N % 64 == 0), on the
// wgmma decode tile (launch_moe_decode_wgmma), which gives the prefill tiles' bits row for row;
// with batch invariance on it keeps the decode tile described next.
// The tile (8 rows per warp when R / E is small, as in decode; with R >= 16 E, N % 128 == 0 and
// aligned weights, as in prefill, a shared-memory tile of 128 weight rows x 128 or 32 tokens; a
// 64-token register tile otherwise) only changes which rows share a weight load, not any row's
// arithmetic.
void moe_grouped_gemm_fp4(const TensorView& x, const TensorView& expert_offsets,
                          const TensorView& weight, const TensorView& scale, const TensorView& out);

// The same kernel over one group with FP8 e4m3 weights [N, K] and ue8m0 32x32 block scales
// [ceil(N / 32), K / 32] (the released dense roles): ops::linear(x, weight, out,
// kFp8PerBlock32) on the tensor cores, with the same per-block accumulation and batch
// invariance as above. K % 256 == 0, N % 16 == 0.
void linear_fp8_mma(const TensorView& x, const LinearWeight& weight, const TensorView& out);

// Run-time switches (RuntimeSwitch objects; tests flip them with ScopedSwitch, same bits):
//  DEEPINFER_MOE_DECODE_TILE=0: the FP4 decode regime (fewer than 16 rows per expert, aligned
//    weights) takes the register kernel instead of streaming each warp's weight rows through
//    shared memory (decode_tile_kernel);
//  DEEPINFER_MOE_WGMMA=0 / DEEPINFER_MOE_WGMMA_FOLD=32: with batch invariance off, the prefill
//    regime keeps the mma.sync tile / takes the wgmma tile's fold-per-32 version (other bits);
//  DEEPINFER_MOE_WGMMA_DECODE=0 / 1 / 2 (unset or -1: 2): with batch
//    invariance off and the fold per 128, the decode regime keeps the mma.sync decode tile / takes
//    the wgmma prefill tiles / the wgmma decode tile (1 and 2: the same bits);
//  DEEPINFER_MOE_FUSED=0: ops::cuda::moe_experts runs FP4 experts under the released numerics
//    through the earlier per-projection path instead of one fused sequence (rows quantized
//    straight from x, w1 and w3 in one launch, the SwiGLU folded into w2's quantizer).

}  // namespace deepinfer::ops::cuda
