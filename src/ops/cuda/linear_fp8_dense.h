// The dense FP8 path of ops::cuda::linear (CUDA only): the released checkpoint's FP8 roles (e4m3
// weights with ue8m0 32x32 block scales, activations quantized to e4m3 with a ue8m0 scale per 32)
// on the tensor cores, with decode kernels that split K over warps and a shared-memory tile for
// prefill.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/ops.h"

namespace deepinfer::ops::cuda {

// Which kernel linear_fp8_dense runs. kAuto picks by row count (what ops::cuda::linear does);
// the others force one (tests compare them bit for bit). Every choice gives the same bits.
enum class Fp8DenseLaunch {
  kAuto,
  kTokens8,      // decode: 8 tokens per block, K slices over warps
  kTokens16,     // decode: 16 tokens per block
  kTokens32,     // 32 tokens per block (mid-size batches, and prefill where the tile cannot run)
  kPrefillTile,  // 128 weight rows x 64 tokens per block, shared-memory pipeline (N % 128 == 0)
};

// out[m, n] = sum over the 32-blocks b of K of (q(x[m])_b . W[n]_b) * s_x[m, b] * s_w[n / 32, b]
// with q the released activation quantizer (ops::linear's kFp8PerBlock32): ops::linear(x, weight,
// out, kFp8PerBlock32) up to summation order.
//  - x [M, K] f32 (row stride free), device; out [M, N] f32 (row stride free), device.
//  - weight [N, K] e4m3 contiguous (16-byte aligned), scale [ceil(N / 32), K / 32] ue8m0
//    contiguous (4-byte aligned), device; N % 16 == 0, K % 128 == 0. Throws Error otherwise.
// Batch invariance: K is cut into linear_fp8_dense_k_slices(N, K) equal slices (a function of
// the weight's shape only). A slice's partial starts at zero and adds, per 32-block in ascending
// order, one tensor-core dot (from zero) times s_x * s_w; the output is 0 + P_0 + P_1 + ... in
// slice order. Every kernel computes each output element as that sequence, so a row's bits do
// not depend on M, the kernel or the other rows. With one slice the bits equal linear_fp8_mma's.
void linear_fp8_dense(const TensorView& x, const LinearWeight& weight, const TensorView& out,
                      Fp8DenseLaunch launch = Fp8DenseLaunch::kAuto);

// linear_fp8_dense(x, first, first_out) and linear_fp8_dense(x, second, second_out), the same
// bits, with x quantized once and, where linear_fp8_dense_pair_fuses, one decode launch for both
// (the blocks of first's row groups, then second's): a layer's projections of one input at decode
// (wq_a and wkv, the shared expert's w1 and w3) are small calls that leave most SMs idle and
// cost their own launch and quantizer each. DEEPINFER_FP8_DENSE_PAIR=0: two calls.
void linear_fp8_dense_pair(const TensorView& x, const LinearWeight& first,
                           const TensorView& first_out, const LinearWeight& second,
                           const TensorView& second_out);

// Whether linear_fp8_dense_pair makes one launch for `rows` rows: both weights fit, the same K
// and K slices, the decode tile on, and kAuto picks the same decode kernel for both.
bool linear_fp8_dense_pair_fuses(int64_t rows, const LinearWeight& first,
                                 const LinearWeight& second);

// Whether ops::cuda::linear sends this weight (under kFp8PerBlock32) here: the path's switch
// (linear_fp8_dense_enabled()) and the shape, dtype and alignment rules above.
bool linear_fp8_dense_supports(const LinearWeight& weight);

// The path's switch: DEEPINFER_FP8_DENSE (a RuntimeSwitch in linear_fp8_dense.cu, on by
// default); =0 turns it off (ops::cuda::linear then takes linear_fp8_mma).
bool linear_fp8_dense_enabled();

// Whether kAuto may pick the prefill tile (DEEPINFER_FP8_DENSE_TILE=0 or a test's ScopedSwitch
// turns it off, kAuto then takes the 32-token kernel, same bits).
bool linear_fp8_dense_tile_enabled();

// Whether the decode launches (8, 16, 32 tokens) stream each warp's weight rows through shared
// memory (split_tile_kernel) rather than loading them into registers (split_kernel): unless
// DEEPINFER_FP8_DENSE_DECODE_TILE=0 or a test's ScopedSwitch (which compares the two bit for
// bit). Same bits either way.
bool linear_fp8_dense_decode_tile_enabled();

// How many K slices a [n, k] weight is reduced in (1, 2, 4 or 8).
int linear_fp8_dense_k_slices(int64_t n, int64_t k);

// The kernel kAuto picks for `rows` rows of a [n, k] weight.
Fp8DenseLaunch linear_fp8_dense_auto_launch(int64_t rows, int64_t n, int64_t k);

}  // namespace deepinfer::ops::cuda
