// The routed experts' prefill GEMM on Hopper's warpgroup MMA (wgmma, sm_90a): the same
// function and the same bits as moe_grouped_gemm.cu's prefill tile, which calls it behind
// DEEPINFER_MOE_WGMMA. Internal to the CUDA backend (tests include it for the switch and the
// numerics probe).
#pragma once

#include <cstdint>

namespace deepinfer::ops::cuda {

struct DeviceWeight;

// The prefill token tiles (listed on the device by moe_grouped_gemm.cu): rows
// [first, min(first + tile tokens, end)) of `expert`, whose rows end at `end`; tile tokens is
// kPrefillSmallTileTokens if `small`, else kPrefillBigTileTokens.
struct PrefillTokenTile {
  int expert;
  int first;
  int end;
  int small;
};
inline constexpr int kPrefillBigTileTokens = 128;
inline constexpr int kPrefillSmallTileTokens = 32;

// What the wgmma prefill kernel reads: activations already quantized in CodeLayout::kMmaHalves
// (x_codes [R, K] e4m3, x_scales [R, K / 32] ue8m0) and fp4 weights either as [E, N, K / 2]
// `weight` with [E, N, K / 32] `w_scales`, or per expert through `experts` (then weight and
// w_scales are unused). Rows of `out` outside every tile are not written.
struct PrefillWgmmaArgs {
  const uint8_t* x_codes = nullptr;
  const uint8_t* x_scales = nullptr;
  const uint8_t* weight = nullptr;
  const uint8_t* w_scales = nullptr;
  const DeviceWeight* experts = nullptr;
  float* out = nullptr;
  int64_t out_stride = 0;
  int64_t n = 0;  // % 128 == 0
  int64_t k = 0;  // % 128 == 0
};

// Whether the prefill dispatch takes the wgmma kernel: off by default in this first version;
// DEEPINFER_MOE_WGMMA=1 turns it on (=0 off, for when the default flips), set_moe_wgmma
// overrides both for the calls that follow; never on a device that is not sm_90.
bool moe_wgmma_enabled();
void set_moe_wgmma(bool enabled);

// The wgmma kernel's schedule: the weight conversion of step s + 1 overlapped with step s's
// wgmmas (default), or converted between steps (DEEPINFER_MOE_WGMMA_OVERLAP=0, or false here for
// the calls that follow; true returns to the default). Same bits.
void set_moe_wgmma_overlap(bool enabled);

// Runs the tiles (*tile_count of them, at most max_tiles) x all N / 128 weight row blocks on
// the current stream.
void launch_moe_prefill_wgmma(const PrefillWgmmaArgs& args, const PrefillTokenTile* tiles,
                              const int* tile_count, int64_t max_tiles);

// The numerics probe: host a [64, 128] and b [64, 128] e4m3 codes (row-major, K contiguous) as
// four 32-wide K blocks; for each block k, wgmma m64n64k32 with scale-d false and mma.sync
// m16n8k32 from a zero accumulator compute a_k . b_k^T into wgmma_out / mma_sync_out, both host
// [4, 64, 64] (block, row of a, row of b). False (nothing run) where the device is not sm_90.
bool probe_fp8_block_dots(const uint8_t* a, const uint8_t* b, float* wgmma_out,
                          float* mma_sync_out);

}  // namespace deepinfer::ops::cuda
