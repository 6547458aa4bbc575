// The routed experts' prefill GEMM on Hopper's warpgroup MMA (wgmma, sm_90a): the grouped
// FP8 x FP4 GEMM's prefill tile (moe_grouped_gemm.cu) when batch invariance is off.
//
// Why only then: Hopper's FP8 wgmma accumulates with about 13 fraction bits where mma.sync rounds
// like FP32 (docs/BENCHMARKS.md, "The wgmma numerics probe"), so its block dots do not have the
// decode tile's bits, and the tile is chosen by rows per expert. With ops::batch_invariant() off
// the op may follow DeepSeek's own SM90 numerics instead: promote the FP8 accumulator to FP32
// once per 128 of K (as DeepGEMM and their SM90 MXFP4 MoE kernel do):
//  - activations: the released per-32 quantization (the same e4m3 codes as today) re-expressed
//    against the largest of the step's four scales, s128 = max_b s32_b: codes times
//    s32_b / s128 rounded to nearest-even e4m3 (exact unless a code becomes subnormal);
//  - weights: each 32-block's fp4 codes become e4m3 codes of value * 2^(6 - d), with
//    d = max_b e_b - e_b over the row's four ue8m0 exponents of the step, exact for d <= 14
//    (moe_prefill_wgmma.cu says why; beyond, nearest-even, and from d = 19 on, zero);
//  - the four k32 wgmmas of a step add into one accumulator, folded once:
//    acc += step_dot * (x_s128 * w_s128 * 2^-6).
// How the fold-per-128 tile gets its e4m3 weights: converted straight into wgmma's A registers
// (the default), or into shared memory with DEEPINFER_MOE_WGMMA_REGISTER_A=0; the same bits.
// DEEPINFER_MOE_WGMMA_FOLD=32 instead takes the first version of this tile (one fold per
// 32-block from a fresh accumulator, today's per-32 codes and scales; the wgmma numerics but
// the released block structure), kept for the comparison in cuda_layer_bench.
// Internal to the CUDA backend.
#pragma once

#include <cstdint>

namespace deepinfer::ops::cuda {

struct DeviceWeight;
struct ExpertRowsSource;

// The prefill token tiles (listed on the device by moe_grouped_gemm.cu): rows
// [first, min(first + tile tokens, end)) of `expert`, whose rows end at `end`; tile tokens is
// kPrefillSmallTileTokens if `small`, else kPrefillBigTileTokens (in the register tile's sized
// lists: kPrefillTileSizes[small]).
struct PrefillTokenTile {
  int expert;
  int first;
  int end;
  int small;
};
inline constexpr int kPrefillBigTileTokens = 128;
inline constexpr int kPrefillSmallTileTokens = 32;
// The register tile's sized token tiles (moe_prefill_sized_tiles()): `small` indexes these sizes
// (0 and 1 are the big and small tiles above, so those lists read the same); each expert gets
// 128-token tiles while more rows are left than the largest tile holds, then one tile of the
// smallest size that holds the rest.
inline constexpr int kPrefillTileSizes[] = {
    kPrefillBigTileTokens, kPrefillSmallTileTokens, 64, 96, 144, 160};
inline constexpr int kPrefillLargestTileTokens = 160;
// The decode tile's token tiles (the same struct, another list): 16 tokens, or 8 if `small`.
inline constexpr int kDecodeBigTileTokens = 16;
inline constexpr int kDecodeSmallTileTokens = 8;
inline constexpr int kDecodeTileRows = 64;  // weight rows per decode work item

// kPer128's weight shift d (see above): exact up to kWgmmaExactWeightShift; from
// kWgmmaFlushWeightShift on every code of the block becomes 0 (the tests count how often).
inline constexpr int kWgmmaExactWeightShift = 14;
inline constexpr int kWgmmaFlushWeightShift = 19;

// How the fp4 prefill tile folds, chosen per call by moe_wgmma_fold().
enum class WgmmaFold {
  kNone,    // the mma.sync tile (batch invariance on, no sm_90 device, DEEPINFER_MOE_WGMMA=0)
  kPer32,   // wgmma, one fold per 32-block (DEEPINFER_MOE_WGMMA_FOLD=32)
  kPer128,  // wgmma, one fold per 128 of K (the default when batch invariance is off)
};

// kNone unless !ops::batch_invariant() and the device is sm_90; then DEEPINFER_MOE_WGMMA (on
// by default; =0 keeps the mma.sync tile) and DEEPINFER_MOE_WGMMA_FOLD (128 by default, or 32;
// another value is an Error naming the variable).
WgmmaFold moe_wgmma_fold();

// What the wgmma prefill kernel reads: activations already quantized in CodeLayout::kMmaHalves,
// x_codes [R, K] e4m3 with x_scales [R, K / 32] ue8m0 (kPer32) or x_step_scales [R, K / 128]
// f32 (kPer128, from quantize_rows_per128), and fp4 weights either as [E, N, K / 2] `weight` with
// [E, N, K / 32] `w_scales`, or per expert through `experts` (then weight and w_scales are
// unused). Rows of `out` outside every tile are not written.
struct PrefillWgmmaArgs {
  const uint8_t* x_codes = nullptr;
  const uint8_t* x_scales = nullptr;
  const float* x_step_scales = nullptr;
  const uint8_t* weight = nullptr;
  const uint8_t* w_scales = nullptr;
  const DeviceWeight* experts = nullptr;
  float* out = nullptr;
  int64_t out_stride = 0;
  int64_t n = 0;  // % 128 == 0 (the decode tile: % 64)
  int64_t k = 0;  // % 128 == 0
  // The decode tile only, optional: a second weight table over the same activations, written to
  // second_out (w1 and w3 in one launch).
  const DeviceWeight* second_experts = nullptr;
  float* second_out = nullptr;
};

// The token tiles a kPer128 prefill lists for launch_moe_prefill_wgmma: 0, the big and small
// tiles (DEEPINFER_MOE_WGMMA_TILES=0, and always for the shared-memory tile), else the largest
// sized tile (DEEPINFER_MOE_WGMMA_TILES: 160 by default, or 128 or 144; another value is an
// Error naming the variable).
int moe_prefill_sized_tiles();

// Runs the tiles (*tile_count of them, at most max_tiles) x all N / 128 weight row blocks on the
// current stream, folding as `fold` says (kPer32 or kPer128). Sized tiles (small > 1) only with
// kPer128 and moe_prefill_sized_tiles() > 0.
void launch_moe_prefill_wgmma(const PrefillWgmmaArgs& args, WgmmaFold fold,
                              const PrefillTokenTile* tiles, const int* tile_count,
                              int64_t max_tiles);

// The fold-per-128 register tile shaped for decode (a few tokens per expert): blocks of one
// warpgroup, 64 weight rows x a token tile of kDecodeBigTileTokens or kDecodeSmallTileTokens
// (m64n16k32 / m64n8k32, A from registers), several blocks per SM so the weight stream has more
// bytes in flight. The same products, fold and order as register_a, so the same bits as the
// prefill tiles for every row. Runs the tiles (*tile_count of them, at most max_tiles) x N / 64
// row blocks x the tables (1, or 2 with args.second_out) on the current stream.
void launch_moe_decode_wgmma(const PrefillWgmmaArgs& args, const PrefillTokenTile* tiles,
                             const int* tile_count, int64_t max_tiles);

// kPer128's activation quantizer: rows [0, source.rows) of `source` (skipping rows from
// *source.placed on), each 128 of K as the released per-32 quantizer's four blocks (the same
// codes and scales) re-expressed against the largest of the four scales. codes [rows, cols]
// e4m3 in CodeLayout::kMmaHalves, step_scales [rows, cols / 128] f32. cols % 128 == 0.
template <bool kSwiglu>
void quantize_rows_per128(const ExpertRowsSource& source, uint8_t* codes, float* step_scales);

}  // namespace deepinfer::ops::cuda
