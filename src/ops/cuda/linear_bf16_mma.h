// The BF16 tensor-core path of ops::cuda::linear (CUDA only): f32 activations times bf16 weights
// without activation quantization (the released checkpoint's BF16 roles: attention wo_a, the
// router gate, the compressor, the indexer's weights_proj and wk; every linear of a bf16 model
// under dense numerics).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/ops.h"

namespace deepinfer::ops::cuda {

// out[m, n] = sum over k of x[m, k] * W[n, k] on mma.sync m16n8k16 (bf16 x bf16 -> f32), the
// weight rows as the MMA's M and the tokens as its N. Each f32 activation enters as
// `activation_terms` bf16 terms (hi = bf16(x), then bf16 of each exact remainder) against the
// same exact bf16 weight: 3 terms hold x exactly, 2 to about 2^-16 of |x|. 0 takes the count
// ops::cuda::linear uses (linear_bf16_mma_activation_terms()).
//  - x [M, K] f32 (row stride may exceed K, a multiple of 4; data 16-byte aligned), device.
//  - weight [N, K] bf16, contiguous, device; out [M, N] f32 (row stride free), device.
//  - K % 32 == 0, N % 16 == 0; throws Error otherwise (ops::cuda::linear falls back to the FMA
//    tile kernel instead).
// Batch invariance: K is cut into linear_bf16_mma_k_slices(N, K) equal slices (a function of the
// weight's shape only); each slice sums one tensor-core result per 32 K values in ascending
// order, from zero, and the slices' sums are added in slice order. Every output element is that
// sequence of operations whatever M, the token tile or the other rows.
void linear_bf16_mma(const TensorView& x, const LinearWeight& weight, const TensorView& out,
                     int activation_terms = 0);

// Whether ops::cuda::linear sends bf16 weights without activation quantization here at all (the
// one switch of the path; shapes and alignment are checked per call).
bool linear_bf16_mma_enabled();

// The activation terms ops::cuda::linear runs this path with (2 or 3).
int linear_bf16_mma_activation_terms();

// The path's run-time switches (RuntimeSwitch objects in linear_bf16_mma.cu; tests flip them
// with ScopedSwitch, all give the same bits):
//  DEEPINFER_BF16_DECODE_TILE=0: decode calls (K slices over warps: up to 32 rows, or more while
//    the weight gives too few blocks for the prefill kernel) take the register-ring kernel
//    instead of streaming each warp's weight rows through shared memory (the decode tile);
//  DEEPINFER_BF16_WIDE_TILE=0: prefill calls (all K slices in one warp) take the
//    one-row-group-per-warp kernel instead of the wide tile (128 weight rows and 32 or 64 tokens'
//    activation terms per K chunk in shared memory, 32 rows x 16 or 32 tokens per warp);
//  DEEPINFER_BF16_BIG_TILE=0: weights with N % 256 == 0 and K % 64 == 0 take the paths before the
//    big tile (256 weight rows, 64 x 16-32 per warp), which otherwise serves their prefill calls,
//    9-16 rows of weights >= 256 MB (the LM head; DEEPINFER_BF16_BIG_TILE_DECODE=0: not) and, with
//    K slices on grid.z, calls from 17 rows where the decode tile ran
//    (DEEPINFER_BF16_BIG_TILE_SPLIT=0: not);
//  DEEPINFER_BF16_WIDE_GROUPS=0: prefill blocks in plain grid order instead of groups of row
//    blocks that run all their token blocks back to back (weights served from L2);
//  DEEPINFER_BF16_GROUPED=0: ops::linear_grouped on bf16 weights at 1-16 rows makes the
//    per-group ops::linear calls instead of one decode tile launch for every group.
// DEEPINFER_BF16_DECODE_VARIANT (a RuntimeSetting, tests loop over all bf16_decode_variants()
// with ScopedSetting): decode variants for weights of at least 256 MB (the LM head) at 1-16
// rows, all the same bits, the sum of: 1 pre-split activations at 1-8 rows, 2 pre-split at 9-16
// rows, 4 two row groups per warp at 9-16 rows; 0 is the round 2 decode tile and the default.
int bf16_decode_variants();

// The weight size from which variants 1 and 2 pre-split (tests lower it to reach small shapes);
// a negative value restores the default 256 MB.
void set_bf16_decode_pre_split_min_bytes(int64_t bytes);

// How many K slices a [n, k] weight is reduced in (1, 2, 4 or 8).
int linear_bf16_mma_k_slices(int64_t n, int64_t k);

}  // namespace deepinfer::ops::cuda
