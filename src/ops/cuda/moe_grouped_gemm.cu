// Grouped FP8 x FP4 expert GEMM on the tensor cores (mma.sync m16n8k32 e4m3, sm_89+).
//
// The weight rows are the MMA's M side and the tokens its N side, so one expert's 16 weight rows
// meet 8 tokens per instruction: with the 1-4 tokens an expert sees in decode, the kernel streams
// each weight byte once (bandwidth bound) and the tensor cores idle. One K step of the MMA is
// exactly one 32-wide scale block of both operands, so each instruction starts from a zero
// accumulator and its result is scaled by s_x * s_w (powers of two, exact) and added to the
// running sum in K order, the released fp8_gemm/fp4_gemm's block-by-block accumulation.
//
// Inside a 32-block the MMA sums products in any order we like, so each thread's K slots are
// permuted to contiguous bytes: thread t of a quad holds K [8t, 8t+8) of the block for both the
// weight (one 32-bit load of 8 fp4 values or a 64-bit load of 8 e4m3) and the activation (one
// 64-bit load of 8 e4m3 bytes). For fp4 the 8 values are split even / odd (the even elements are
// the low nibbles of the 4 bytes, so a mask and two shifts turn 4 of them into e4m3 bytes), and
// the activation quantizer stores each 8 in that order.
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cub/block/block_scan.cuh>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8_mma.cuh"
#include "ops/cuda/linear.cuh"
#include "ops/cuda/moe_expert_rows.cuh"
#include "ops/cuda/moe_grouped_gemm.h"
#include "ops/cuda/moe_prefill_items.cuh"
#include "ops/cuda/moe_prefill_wgmma.h"

namespace deepinfer::ops::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 16;  // the MMA's M
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kScaleBlock = 32;     // the MMA's K, and both operands' scale block
constexpr int kBlocksPerChunk = 8;  // K blocks loaded together (K % 256 == 0)
constexpr int kChunk = kScaleBlock * kBlocksPerChunk;

// Four fp4 codes in the low nibbles of the bytes of `codes` -> four e4m3 bytes of 2^-6 times
// their value: the magnitude bits (e1 e0 m) placed at byte bits 4..2 read as an e4m3 exponent
// e1e0 and mantissa m00, which is the e2m1 value scaled by 2^(1-7) for normal and subnormal
// codes alike; the sign moves to bit 7. Exact: the caller scales the block's sum by 2^6.
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3x4_scaled(uint32_t codes) {
  return ((codes & 0x07070707u) << 2) | ((codes & 0x08080808u) << 4);
}
constexpr float kE2m1Rescale = 64.0f;

// The ue8m0 scale held in bits [shift, shift + 8) of a word of four codes.
__device__ __forceinline__ float scale_code(uint32_t codes, int shift) {
  return deepinfer::cuda::e8m0_to_float(static_cast<uint8_t>(codes >> shift));
}

__device__ __forceinline__ void mma_e4m3(const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                         float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// The released activation quantizer (linear.cu's kFp8PerBlock32) stored as e4m3 bytes and a
// ue8m0 scale code per block (the scale is a power of two): one warp per 32-block, one value
// per lane. CodeLayout (linear.cuh) says where each code goes inside its block.

// Quantizes one activation (lane `lane` of a warp that holds the whole 32-block `block` of row
// `row`) and stores its e4m3 code where kLayout puts it, and lane 0 the block's ue8m0 scale code.
template <CodeLayout kLayout>
__device__ __forceinline__ void store_quantized(float value, int64_t row, int64_t cols, int64_t k,
                                                int64_t block, uint8_t* codes,
                                                uint8_t* scale_codes) {
  const int lane = threadIdx.x & 31;
  const float scale = deepinfer::cuda::fp8_block_scale(deepinfer::cuda::warp_max(fabsf(value)));
  const float quantized =
      deepinfer::cuda::round_to_e4m3(fminf(fmaxf(value / scale, -448.0f), 448.0f));
  const int in_eight = lane & 7;
  int64_t stored = k;
  if constexpr (kLayout == CodeLayout::kEvenOdd8) {
    stored = (k & ~int64_t{7}) | ((in_eight & 1) << 2) | (in_eight >> 1);
  } else if constexpr (kLayout == CodeLayout::kMmaHalves) {
    stored = (k & ~int64_t{31}) | ((lane & 1) << 4) | ((lane >> 3) << 2) | (in_eight >> 1);
  }
  codes[row * cols + stored] =
      static_cast<uint8_t>(__nv_cvt_float_to_fp8(quantized, __NV_SATFINITE, __NV_E4M3));
  if (lane == 0) scale_codes[block] = static_cast<uint8_t>(__float_as_uint(scale) >> 23);
}

template <CodeLayout kLayout>
__global__ void quantize_rows_kernel(DeviceRows<const float> x, uint8_t* codes,
                                     uint8_t* scale_codes, int64_t blocks_per_row) {
  // A GEMM launched as its dependent (linear.cuh's decode tiles) may start streaming its weights
  // now; it waits for this grid's completion before reading the codes. This grid, launched as a
  // dependent itself (launch_dependent), reads x only once the kernel before it is done.
  allow_dependent_grids();
  wait_for_prior_grids();
  const int64_t block = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (block >= x.rows * blocks_per_row) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = block / blocks_per_row;
  const int64_t k = (block % blocks_per_row) * kScaleBlock + lane;
  store_quantized<kLayout>(x.row(row)[k], row, x.cols, k, block, codes, scale_codes);
}

template <CodeLayout kLayout, bool kSwiglu>
__global__ void quantize_expert_rows_kernel(ExpertRowsSource source, uint8_t* codes,
                                            uint8_t* scale_codes) {
  const int64_t blocks_per_row = source.cols / kScaleBlock;
  const int64_t block = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (block >= source.rows * blocks_per_row) return;
  const int64_t row = block / blocks_per_row;  // the same for the whole warp
  if (row >= *source.placed) return;
  const int lane = threadIdx.x & 31;
  const int64_t k = (block % blocks_per_row) * kScaleBlock + lane;
  const float value = expert_row_value<kSwiglu>(source, row, k);
  store_quantized<kLayout>(value, row, source.cols, k, block, codes, scale_codes);
}

struct GroupedArgs {
  const uint8_t* x_codes;   // [R, K] e4m3
  const uint8_t* x_scales;  // [R, K / 32] ue8m0
  const int32_t* offsets;   // [E + 1]; null: one group of all R rows
  const uint8_t* weight;    // fp4: [E, N, K / 2] packed; fp8: [N, K] e4m3
  const uint8_t* w_scales;  // fp4: [E, N, K / 32]; fp8: [ceil(N / 32), K / 32] (ue8m0)
  // fp4 only, optional: expert e's [N, K / 2] weight and [N, K / 32] scale are experts[e].bytes
  // and .scale (the model's experts are separate allocations); weight / w_scales are unused.
  const DeviceWeight* experts;
  float* out;
  // fp4 with `experts` only, optional: a second weight table of the same shape over the same
  // activations, written to second_out (w1 and w3 in one launch); grid.x then covers both, the
  // first table's row blocks before the second's.
  const DeviceWeight* second_experts;
  float* second_out;
  int64_t out_stride;
  int64_t rows;    // R
  int64_t groups;  // E
  int64_t n;
  int64_t k;
};

__device__ __forceinline__ int clamp_offset(int32_t offset, int64_t rows) {
  return static_cast<int>(min(max(static_cast<int64_t>(offset), int64_t{0}), rows));
}

// The n-th group (from 0) that has rows, or -1; every thread of a full warp gets it. Offsets are
// read as the kernel reads them (clamped, a group is empty unless its end passes its start).
__device__ int nth_nonempty_group(const int32_t* offsets, int64_t groups, int64_t rows, int n) {
  const int lane = threadIdx.x & 31;
  int seen = 0;
  for (int64_t base = 0; base < groups; base += 32) {
    const int64_t g = base + lane;
    const bool nonempty =
        g < groups && clamp_offset(offsets[g + 1], rows) > clamp_offset(offsets[g], rows);
    unsigned mask = __ballot_sync(0xffffffffu, nonempty);
    const int here = __popc(mask);
    if (n < seen + here) {
      for (int skip = n - seen; skip > 0; --skip) mask &= mask - 1;
      return static_cast<int>(base) + __ffs(mask) - 1;
    }
    seen += here;
  }
  return -1;
}

// Block (x: 64 weight rows, y: expert, or with fewer y than experts the y-th expert with rows);
// warp w owns weight rows [16w, 16w+16) of the block and walks the group's tokens in tiles of 8 *
// kTokenTiles. kFp8Weight: e4m3 weights with 32x32 block scales (the dense FP8 roles, one group);
// else packed fp4 with per-row scales per 32.
template <bool kFp8Weight, int kTokenTiles>
__global__ void __launch_bounds__(kWarps * 32) mma_gemm_kernel(GroupedArgs args) {
  // A thread's 8 weight values of one 32-block: 4 bytes of fp4 or 8 bytes of e4m3.
  using Word = std::conditional_t<kFp8Weight, uint2, uint32_t>;
  constexpr int kWordBytes = sizeof(Word);
  constexpr int kBlockBytes = 4 * kWordBytes;  // one row's 32-block
  constexpr int kChunkBytes = kBlocksPerChunk * kBlockBytes;
  int expert = blockIdx.y;
  if (args.offsets != nullptr && gridDim.y < args.groups) {
    expert = nth_nonempty_group(args.offsets, args.groups, args.rows, blockIdx.y);
    if (expert < 0) return;
  }
  int first = 0;
  int last = static_cast<int>(args.rows);
  if (args.offsets != nullptr) {
    first = clamp_offset(args.offsets[expert], args.rows);
    last = max(first, clamp_offset(args.offsets[expert + 1], args.rows));
  }
  const int count = last - first;
  int64_t row_block = blockIdx.x;
  const DeviceWeight* experts = args.experts;
  float* out = args.out;
  if constexpr (!kFp8Weight) {
    const int64_t row_blocks = (args.n + kRowsPerBlock - 1) / kRowsPerBlock;
    if (args.second_out != nullptr && row_block >= row_blocks) {
      row_block -= row_blocks;
      experts = args.second_experts;
      out = args.second_out;
    }
  }
  const int64_t n_base = row_block * kRowsPerBlock + (threadIdx.x / 32) * kRowsPerWarp;
  if (count == 0 || n_base >= args.n) return;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;  // MMA row (weights) / column (tokens) of this thread
  const int quad = lane & 3;
  const int64_t k_blocks = args.k / kScaleBlock;
  const int64_t chunks = args.k / kChunk;
  const int64_t w_row_bytes = args.k * kWordBytes / 8;
  const uint8_t* weight = args.weight;
  const uint8_t* w_scales = args.w_scales;
  int64_t w_row = expert * args.n + n_base + group;
  if (!kFp8Weight && experts != nullptr) {
    weight = experts[expert].bytes;
    w_scales = experts[expert].scale;
    w_row = n_base + group;
  }
  const uint8_t* w_lo = weight + w_row * w_row_bytes + kWordBytes * quad;
  const uint8_t* w_hi = w_lo + 8 * w_row_bytes;
  // fp8: rows n_base..n_base+15 lie in one 32-row scale block (n_base is a multiple of 16).
  const uint8_t* s_lo = w_scales + (kFp8Weight ? (n_base / kScaleBlock) : w_row) * k_blocks;
  const uint8_t* s_hi = kFp8Weight ? s_lo : s_lo + 8 * k_blocks;

  // Token tiles are spread over grid.z (one group: the host knows the rows) and then looped.
  for (int tile = blockIdx.z * 8 * kTokenTiles; tile < count; tile += gridDim.z * 8 * kTokenTiles) {
    // Rows this thread loads activations for (MMA column `group`) and accumulates outputs for
    // (MMA columns 2*quad, 2*quad+1); tokens past the group's end load its last row and are
    // never stored.
    int64_t load_row[kTokenTiles];
    int64_t acc_row[kTokenTiles][2];
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
      load_row[j] = first + min(tile + 8 * j + group, count - 1);
      acc_row[j][0] = first + min(tile + 8 * j + 2 * quad, count - 1);
      acc_row[j][1] = first + min(tile + 8 * j + 2 * quad + 1, count - 1);
    }
    float acc[kTokenTiles][4] = {};
    Word w_next[2][kBlocksPerChunk];
    uint2 s_next[2];
    auto load_chunk = [&](int64_t chunk) {
#pragma unroll
      for (int b = 0; b < kBlocksPerChunk; ++b) {
        w_next[0][b] =
            __ldg(reinterpret_cast<const Word*>(w_lo + chunk * kChunkBytes + b * kBlockBytes));
        w_next[1][b] =
            __ldg(reinterpret_cast<const Word*>(w_hi + chunk * kChunkBytes + b * kBlockBytes));
      }
      s_next[0] = __ldg(reinterpret_cast<const uint2*>(s_lo + chunk * kBlocksPerChunk));
      s_next[1] = __ldg(reinterpret_cast<const uint2*>(s_hi + chunk * kBlocksPerChunk));
    };
    // The chunk's 8 activation scale codes of the two rows this thread accumulates, per tile.
    auto x_scale_codes = [&](int j, int which, int64_t chunk) {
      return __ldg(reinterpret_cast<const uint2*>(args.x_scales + acc_row[j][which] * k_blocks +
                                                  chunk * kBlocksPerChunk));
    };
    load_chunk(0);
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      Word w_cur[2][kBlocksPerChunk];
      uint2 s_cur[2] = {s_next[0], s_next[1]};
#pragma unroll
      for (int b = 0; b < kBlocksPerChunk; ++b) {
        w_cur[0][b] = w_next[0][b];
        w_cur[1][b] = w_next[1][b];
      }
      if (chunk + 1 < chunks) load_chunk(chunk + 1);
      uint2 x_codes[kTokenTiles][2];
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        x_codes[j][0] = x_scale_codes(j, 0, chunk);
        x_codes[j][1] = x_scale_codes(j, 1, chunk);
      }
#pragma unroll
      for (int b = 0; b < kBlocksPerChunk; ++b) {
        const int64_t k_block = chunk * kBlocksPerChunk + b;
        uint32_t a[4];
        if constexpr (kFp8Weight) {
          a[0] = w_cur[0][b].x;
          a[1] = w_cur[1][b].x;
          a[2] = w_cur[0][b].y;
          a[3] = w_cur[1][b].y;
        } else {
          a[0] = e2m1x4_to_e4m3x4_scaled(w_cur[0][b]);
          a[1] = e2m1x4_to_e4m3x4_scaled(w_cur[1][b]);
          a[2] = e2m1x4_to_e4m3x4_scaled(w_cur[0][b] >> 4);
          a[3] = e2m1x4_to_e4m3x4_scaled(w_cur[1][b] >> 4);
        }
        const int shift = 8 * (b & 3);
        const uint32_t lo_word = b < 4 ? s_cur[0].x : s_cur[0].y;
        const uint32_t hi_word = b < 4 ? s_cur[1].x : s_cur[1].y;
        const float rescale = kFp8Weight ? 1.0f : kE2m1Rescale;
        const float w_scale_lo = scale_code(lo_word, shift) * rescale;
        const float w_scale_hi = scale_code(hi_word, shift) * rescale;
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          const uint2 activation = __ldg(reinterpret_cast<const uint2*>(
              args.x_codes + load_row[j] * args.k + k_block * kScaleBlock + 8 * quad));
          float d[4];
          mma_e4m3(a, activation.x, activation.y, d);
          const float x_scale0 = scale_code(b < 4 ? x_codes[j][0].x : x_codes[j][0].y, shift);
          const float x_scale1 = scale_code(b < 4 ? x_codes[j][1].x : x_codes[j][1].y, shift);
          acc[j][0] += d[0] * (x_scale0 * w_scale_lo);
          acc[j][1] += d[1] * (x_scale1 * w_scale_lo);
          acc[j][2] += d[2] * (x_scale0 * w_scale_hi);
          acc[j][3] += d[3] * (x_scale1 * w_scale_hi);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
      const int token = tile + 8 * j + 2 * quad;
      const int64_t n = n_base + group;
      if (token < count) {
        out[acc_row[j][0] * args.out_stride + n] = acc[j][0];
        out[acc_row[j][0] * args.out_stride + n + 8] = acc[j][2];
      }
      if (token + 1 < count) {
        out[acc_row[j][1] * args.out_stride + n] = acc[j][1];
        out[acc_row[j][1] * args.out_stride + n + 8] = acc[j][3];
      }
    }
  }
}

// ---- prefill: shared-memory tiles ---------------------------------------------------------
//
// With many rows per expert the kernel above reloads each activation from L1 for every MMA and
// keeps its weights in registers. Here a block stages a 128-row weight tile and a token tile in
// shared memory (cp.async, kStages-deep) and its 8 warps (4 along the weight rows x 2 along the
// tokens, 32 rows x kWarpTokens tokens each) take their MMA fragments with ldmatrix. Every
// output element is computed exactly as above: the same instruction with the same K position in
// each k-slot (the fp4 word of thread t is bytes 4t..4t+3 of the row's 16-byte block, as before;
// the activations use CodeLayout::kMmaHalves, which puts the same K in the same slots), one MMA
// per 32-block from zero, times the same scale product, added in ascending K. So a row's bits do
// not depend on which kernel ran it, which keeps batch invariance across the two.
//
// The host does not know the experts' row counts, so a one-block kernel lists the token tiles:
// 128-token tiles, and each expert's remainder in 32-token tiles unless it needs 4 of them (then
// one more 128-token tile), so an expert wastes fewer than 32 token slots instead of up to 127.
// The list holds at most R / 97 + min(R, 3E) tiles, which bounds its scratch.

// false: prefill takes mma_gemm_kernel's wide token tile again (the path before the tile).
RuntimeSwitch kUsePrefillTiles{"DEEPINFER_MOE_PREFILL_TILE", true};

// kUsePrefillTiles unless DEEPINFER_MOE_PREFILL_TILE=0, which lets one binary compare the two
// prefill paths (or step around this one) on the GPU machine.
bool prefill_tiles_enabled() {
  return kUsePrefillTiles.enabled();
}

constexpr int kTileRows = 128;  // weight rows per block
constexpr int kTileWarpsAlongRows = 4;
constexpr int kTileWarpsAlongTokens = 2;
constexpr int kTileWarpRows = kTileRows / kTileWarpsAlongRows;  // two 16-row MMA tiles
constexpr int kTileThreads = 32 * kTileWarpsAlongRows * kTileWarpsAlongTokens;
constexpr int kStepBlocks = 4;  // 32-blocks of K per pipeline stage
constexpr int kStepK = kStepBlocks * kScaleBlock;
constexpr int kStages = 3;
constexpr int kBigTileTokens = 128;   // warps of 64 tokens
constexpr int kSmallTileTokens = 32;  // warps of 16 tokens
// A remainder of more rows than 3 small tiles hold takes a full-size tile (still under 32 slots
// wasted): every listed big tile has at least this many rows, which bounds their number.
constexpr int kBigTileMinRows = kBigTileTokens - kSmallTileTokens + 1;
constexpr int kMaxSmallTilesPerGroup = kBigTileTokens / kSmallTileTokens - 1;

// Rows [first, min(first + tile tokens, end)) of `expert`, whose rows end at `end`; tile tokens
// is kSmallTileTokens if `small`, else kBigTileTokens. The wgmma tile reads the same list.
using TokenTile = PrefillTokenTile;
static_assert(kBigTileTokens == kPrefillBigTileTokens &&
              kSmallTileTokens == kPrefillSmallTileTokens);

// The token tiles in expert order (an expert's full-size tiles, then its small ones), so the
// blocks that share an expert's weights run close together and find them in L2. kBigTokens /
// kSmallTokens: the prefill tiles' sizes above, or the decode tile's (16 and 8: a remainder of
// up to 8 rows takes an 8-token tile, of 9 to 15 a 16-token one). kSized (the prefill sizes
// only): the register tile's sized tiles up to kSized tokens (moe_prefill_wgmma.h): full-size
// tiles while more than kSized rows are left, then one tile of the smallest size that holds the
// rest, `small` its index in kPrefillTileSizes. An expert gets no more tiles than without kSized
// (c = 128 b + r rows: at most b full-size ones, and r = 0 leaves b - 1 and one of 128 or more),
// so max_tiles bounds either list.
template <int kThreads, int kBigTokens = kBigTileTokens, int kSmallTokens = kSmallTileTokens,
          int kSized = 0>
__global__ void __launch_bounds__(kThreads)
    list_token_tiles_kernel(const int32_t* offsets, int64_t groups, int64_t rows, TokenTile* tiles,
                            int max_tiles, int* tile_count) {
  constexpr int kMaxSmallTiles = kBigTokens / kSmallTokens - 1;
  static_assert(kSized == 0 || (kBigTokens == kPrefillBigTileTokens &&
                                kSmallTokens == kPrefillSmallTileTokens && kSized >= kBigTokens &&
                                kSized <= kPrefillLargestTileTokens),
                "sized tiles of the prefill tile sizes");
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  wait_for_prior_grids();
  allow_dependent_grids();
  int listed = 0;
  for (int64_t base = 0; base < groups; base += kThreads) {
    const int64_t expert = base + threadIdx.x;
    int first = 0;
    int end = 0;
    if (expert < groups) {  // read as mma_gemm_kernel reads them
      first = clamp_offset(offsets[expert], rows);
      end = max(first, clamp_offset(offsets[expert + 1], rows));
    }
    int big_here = (end - first) / kBigTokens;
    int rest_first = first + big_here * kBigTokens;
    int small_here = (end - rest_first + kSmallTokens - 1) / kSmallTokens;
    int rest_size = 1;  // the rest's tiles' `small`
    if constexpr (kSized > 0) {
      const int count = end - first;
      big_here = count > kSized ? (count - kSized + kBigTokens - 1) / kBigTokens : 0;
      rest_first = first + big_here * kBigTokens;
      const int rest = end - rest_first;  // 0 (no rows) .. kSized
      small_here = rest > 0 ? 1 : 0;
      // (Constants: device code cannot read the host array itself.)
      constexpr int kSizes[] = {kPrefillTileSizes[0], kPrefillTileSizes[1], kPrefillTileSizes[2],
                                kPrefillTileSizes[3], kPrefillTileSizes[4]};
      rest_size = rest <= kSizes[1]   ? 1
                  : rest <= kSizes[2] ? 2
                  : rest <= kSizes[3] ? 3
                  : rest <= kSizes[0] ? 0
                  : rest <= kSizes[4] ? 4
                                      : 5;
    } else if (small_here > kMaxSmallTiles) {
      ++big_here;
      small_here = 0;
    }
    int at = 0;
    int total = 0;
    Scan(scan_storage).ExclusiveSum(big_here + small_here, at, total);
    __syncthreads();  // the scan's storage is reused by the next chunk of experts
    // Overlapping ranges (offsets that decrease) can list more tiles than the rows bound the
    // list by; those past the end are dropped.
    const int expert_id = static_cast<int>(expert);
    for (int t = 0; t < big_here + small_here && listed + at + t < max_tiles; ++t) {
      tiles[listed + at + t] =
          t < big_here
              ? TokenTile{expert_id, first + t * kBigTokens, end, 0}
              : TokenTile{expert_id, rest_first + (t - big_here) * kSmallTokens, end, rest_size};
    }
    listed += total;
  }
  if (threadIdx.x == 0) *tile_count = min(listed, max_tiles);
}

// One pipeline stage in shared memory. Weights: 128 rows of 64 bytes (128 fp4), 16-byte chunk c
// of row r at chunk c ^ ((r / 2) % 4); activations: a row of 128 e4m3 per token, chunk c of
// token t at c ^ (t % 8). Either way the 8 rows of one ldmatrix 8x8 matrix (same logical chunk)
// land in 8 different 16-byte bank groups. Scales are decoded to floats once per stage (the
// weights' with the fp4 rescale folded in, as the other kernel's w_scale).
template <int kWarpTokens>
struct PrefillTile {
  static constexpr int kTokens = kTileWarpsAlongTokens * kWarpTokens;
  static constexpr int kTokenMmas = kWarpTokens / 8;  // 8-token MMA tiles per warp
  static constexpr int kWeightRowBytes = kStepK / 2;
  static constexpr int kCodeRowBytes = kStepK;
  static constexpr int kWeightBytes = kTileRows * kWeightRowBytes;
  static constexpr int kCodeBytes = kTokens * kCodeRowBytes;
  static constexpr int kWeightScaleBytes = kStepBlocks * kTileRows * 4;  // [block][row] f32
  static constexpr int kCodeScaleBytes = kStepBlocks * kTokens * 4;      // [block][token] f32
  static constexpr int kCodeOffset = kWeightBytes;
  static constexpr int kWeightScaleOffset = kCodeOffset + kCodeBytes;
  static constexpr int kCodeScaleOffset = kWeightScaleOffset + kWeightScaleBytes;
  static constexpr int kStageBytes = kCodeScaleOffset + kCodeScaleBytes;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kTokenMmas % 2 == 0, "ldmatrix.x4 takes two token tiles");
  static_assert(kTileRows <= kTileThreads && kTokens <= kTileThreads - kTileRows,
                "one thread per weight row and per token loads a stage's scale codes");
};

__device__ __forceinline__ void load_matrices_x4(uint32_t (&r)[4], uint32_t shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared)
               : "memory");
}

// One work item: weight rows [128 row_tile, +128) times one token tile. fp4 weights only.
template <int kWarpTokens>
__device__ __forceinline__ void prefill_tile(const GroupedArgs& args, const TokenTile& tile,
                                             int row_tile, uint8_t* shared) {
  using Tile = PrefillTile<kWarpTokens>;
  const int tokens = min(tile.end - tile.first, Tile::kTokens);  // >= 1
  const int thread = threadIdx.x;
  const int lane = thread & 31;
  const int warp = thread >> 5;
  const int group = lane >> 2;
  const int quad = lane & 3;
  const int warp_row = (warp % kTileWarpsAlongRows) * kTileWarpRows;
  const int warp_token = (warp / kTileWarpsAlongRows) * kWarpTokens;
  const int64_t n_first = static_cast<int64_t>(row_tile) * kTileRows;
  const int64_t k_blocks = args.k / kScaleBlock;
  const int64_t w_row_bytes = args.k / 2;
  const int steps = static_cast<int>(args.k / kStepK);
  const uint8_t* weight = args.weight;
  const uint8_t* w_scales = args.w_scales;
  int64_t w_row_first = tile.expert * args.n + n_first;
  if (args.experts != nullptr) {
    weight = args.experts[tile.expert].bytes;
    w_scales = args.experts[tile.expert].scale;
    w_row_first = n_first;
  }
  // Tokens past the tile's rows load the last row and are never stored.
  const auto token_row = [&](int token) -> int64_t { return tile.first + min(token, tokens - 1); };

  const auto stage_base = [&](int slot) { return shared + slot * Tile::kStageBytes; };
  const auto copy_stage = [&](int step, int slot) {
    uint8_t* base = stage_base(slot);
    constexpr int kWeightChunks = kTileRows * Tile::kWeightRowBytes / 16;
    for (int chunk = thread; chunk < kWeightChunks; chunk += kTileThreads) {
      const int row = chunk / (Tile::kWeightRowBytes / 16);
      const int c = chunk % (Tile::kWeightRowBytes / 16);
      copy_16_async(
          shared_address(base + row * Tile::kWeightRowBytes + ((c ^ ((row >> 1) & 3)) << 4)),
          weight + (w_row_first + row) * w_row_bytes +
              static_cast<int64_t>(step) * Tile::kWeightRowBytes + c * 16);
    }
    constexpr int kCodeChunks = Tile::kTokens * Tile::kCodeRowBytes / 16;
    for (int chunk = thread; chunk < kCodeChunks; chunk += kTileThreads) {
      const int token = chunk / (Tile::kCodeRowBytes / 16);
      const int c = chunk % (Tile::kCodeRowBytes / 16);
      copy_16_async(shared_address(base + Tile::kCodeOffset + token * Tile::kCodeRowBytes +
                                   ((c ^ (token & 7)) << 4)),
                    args.x_codes + token_row(token) * args.k +
                        static_cast<int64_t>(step) * Tile::kCodeRowBytes + c * 16);
    }
  };
  // The stage's 4 scale codes of this thread's weight row (threads [0, 128)) or token (the next
  // kTokens threads), as one word; the others load nothing.
  const auto load_scale_codes = [&](int step) -> uint32_t {
    const int64_t block = static_cast<int64_t>(step) * kStepBlocks;
    if (thread < kTileRows) {
      return __ldg(
          reinterpret_cast<const uint32_t*>(w_scales + (w_row_first + thread) * k_blocks + block));
    }
    if (thread < kTileRows + Tile::kTokens) {
      return __ldg(reinterpret_cast<const uint32_t*>(
          args.x_scales + token_row(thread - kTileRows) * k_blocks + block));
    }
    return 0;
  };
  const auto store_scales = [&](uint32_t codes, int slot) {
    uint8_t* base = stage_base(slot);
    if (thread < kTileRows) {
      auto* w_scale = reinterpret_cast<float*>(base + Tile::kWeightScaleOffset);
#pragma unroll
      for (int b = 0; b < kStepBlocks; ++b) {
        w_scale[b * kTileRows + thread] = scale_code(codes, 8 * b) * kE2m1Rescale;
      }
    } else if (thread < kTileRows + Tile::kTokens) {
      auto* x_scale = reinterpret_cast<float*>(base + Tile::kCodeScaleOffset);
#pragma unroll
      for (int b = 0; b < kStepBlocks; ++b) {
        x_scale[b * Tile::kTokens + thread - kTileRows] = scale_code(codes, 8 * b);
      }
    }
  };

  // ldmatrix addresses: lane l gives row l % 8 of matrix l / 8.
  const int matrix = lane >> 3;
  const int matrix_row = lane & 7;
  // Weights: matrices (rows 0-7, block b), (rows 8-15, b), (rows 0-7, b + 1), (rows 8-15, b + 1)
  // of a 16-row MMA tile, so registers 0/1 are the low/high rows' words of block b, 2/3 of b + 1.
  int weight_row[2];
#pragma unroll
  for (int m = 0; m < 2; ++m) weight_row[m] = warp_row + 16 * m + (matrix & 1) * 8 + matrix_row;
  const int weight_block_offset = matrix >> 1;
  // Activations: matrices (tokens 0-7, half 0), (0-7, half 1), (8-15, half 0), (8-15, half 1) of
  // two 8-token MMA tiles, so registers 0/1 are b0/b1 of the first tile, 2/3 of the second.
  const int code_half = matrix & 1;
  const int code_token_offset = (matrix >> 1) * 8 + matrix_row;

  const bool warp_has_tokens = warp_token < tokens;
  float acc[2][Tile::kTokenMmas][4] = {};

  const auto compute_stage = [&](int slot, int /*step*/) {
    const uint8_t* base = stage_base(slot);
    const uint32_t weight_base = shared_address(base);
    const uint32_t code_base = shared_address(base + Tile::kCodeOffset);
    const auto* w_scale = reinterpret_cast<const float*>(base + Tile::kWeightScaleOffset);
    const auto* x_scale = reinterpret_cast<const float*>(base + Tile::kCodeScaleOffset);
    // Not unrolled: the whole stage at once takes more than 255 registers.
#pragma unroll 1
    for (int pair = 0; pair < kStepBlocks; pair += 2) {
      uint32_t words[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const int row = weight_row[m];
        const int c = pair + weight_block_offset;
        load_matrices_x4(words[m],
                         weight_base + row * Tile::kWeightRowBytes + ((c ^ ((row >> 1) & 3)) << 4));
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int b = pair + half;
        uint32_t a[2][4];
        float w_scale_lo[2];
        float w_scale_hi[2];
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          const uint32_t lo = words[m][2 * half];
          const uint32_t hi = words[m][2 * half + 1];
          a[m][0] = e2m1x4_to_e4m3x4_scaled(lo);
          a[m][1] = e2m1x4_to_e4m3x4_scaled(hi);
          a[m][2] = e2m1x4_to_e4m3x4_scaled(lo >> 4);
          a[m][3] = e2m1x4_to_e4m3x4_scaled(hi >> 4);
          w_scale_lo[m] = w_scale[b * kTileRows + warp_row + 16 * m + group];
          w_scale_hi[m] = w_scale[b * kTileRows + warp_row + 16 * m + group + 8];
        }
#pragma unroll
        for (int jp = 0; jp < Tile::kTokenMmas; jp += 2) {
          uint32_t codes[4];
          const int token = warp_token + 8 * jp + code_token_offset;
          const int c = 2 * b + code_half;
          load_matrices_x4(codes,
                           code_base + token * Tile::kCodeRowBytes + ((c ^ (token & 7)) << 4));
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const int j = jp + jj;
            const float2 x_scales = *reinterpret_cast<const float2*>(x_scale + b * Tile::kTokens +
                                                                     warp_token + 8 * j + 2 * quad);
#pragma unroll
            for (int m = 0; m < 2; ++m) {
              float d[4];
              mma_e4m3_from_zero(a[m], codes[2 * jj], codes[2 * jj + 1], d);
              acc[m][j][0] += d[0] * (x_scales.x * w_scale_lo[m]);
              acc[m][j][1] += d[1] * (x_scales.y * w_scale_lo[m]);
              acc[m][j][2] += d[2] * (x_scales.x * w_scale_hi[m]);
              acc[m][j][3] += d[3] * (x_scales.y * w_scale_hi[m]);
            }
          }
        }
      }
    }
  };

  run_stage_pipeline<kStages>(steps, warp_has_tokens, copy_stage, load_scale_codes, store_scales,
                              compute_stage);

#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int64_t n = n_first + warp_row + 16 * m + group;
#pragma unroll
    for (int j = 0; j < Tile::kTokenMmas; ++j) {
      const int token = warp_token + 8 * j + 2 * quad;
      if (token < tokens) {
        float* out = args.out + (tile.first + token) * args.out_stride + n;
        out[0] = acc[m][j][0];
        out[8] = acc[m][j][2];
      }
      if (token + 1 < tokens) {
        float* out = args.out + (tile.first + token + 1) * args.out_stride + n;
        out[0] = acc[m][j][1];
        out[8] = acc[m][j][3];
      }
    }
  }
}

// Persistent blocks walk the work items (token tile, 128 weight rows: for_each_prefill_item);
// both tile sizes run in the one launch.
__global__ void __launch_bounds__(kTileThreads, 1)
    prefill_tile_kernel(GroupedArgs args, const TokenTile* tiles, const int* tile_count) {
  extern __shared__ __align__(128) uint8_t shared[];
  for_each_prefill_item(
      args.n, kTileRows, tiles, tile_count, [&](const TokenTile& tile, int row_tile) {
        if (tile.small != 0) {
          prefill_tile<kSmallTileTokens / kTileWarpsAlongTokens>(args, tile, row_tile, shared);
        } else {
          prefill_tile<kBigTileTokens / kTileWarpsAlongTokens>(args, tile, row_tile, shared);
        }
      });
}
constexpr int kPrefillSmemBytes =
    std::max(PrefillTile<kSmallTileTokens / kTileWarpsAlongTokens>::kSmemBytes,
             PrefillTile<kBigTileTokens / kTileWarpsAlongTokens>::kSmemBytes);

// ---- decode: weight stripes staged through shared memory ----------------------------------
//
// mma_gemm_kernel above takes its weight words straight into registers: per 32-block a quad
// reads 16 bytes of one row and the warp's 8 quads 8 rows a row-length apart (half-used sectors,
// 16 load instructions per 2 KB), with only the next 8-block chunk in flight, about 2 KB per
// warp. That is too little in flight to keep HBM busy and the stream is what decode pays for.
// Here each warp streams its own 16 weight rows (no block barriers: the warps of a block share
// nothing) through kDecodeStages shared-memory slots of one 8-block chunk (16 rows x 128 bytes,
// whole 128-byte lines per 8 lanes, 16-byte cp.async), so (kDecodeStages - 1) x 2 KB per warp are
// in flight, and takes its MMA fragments with ldmatrix (four per chunk instead of 16 loads).
//
// Same bits as mma_gemm_kernel<false, *>: ldmatrix hands thread t of quad g word t of row g's
// 16-byte block, which is the word that kernel loads (K 8t..8t+7 of the block, converted the
// same way), the activations keep CodeLayout::kEvenOdd8 and the same 64-bit loads, and every
// output is one MMA per 32-block from zero, times the same scale product (the same floats: the
// same decode, the fp4 rescale folded into the weight's as there), added in ascending K. The
// token tiling (1 or 2 8-token tiles per pass over the weights) only decides which tokens share
// a pass, so a row's bits depend neither on the batch nor on which of the two kernels ran it.
//
// The scale codes become floats once per chunk in a small per-warp table (each lane converts a
// few), not in every thread for every MMA: with one or two tokens per expert those conversions
// were a large share of the instructions spent per weight byte, which matter once the loads no
// longer wait on latency.

// false: decode takes mma_gemm_kernel again (the path before this one).
RuntimeSwitch kUseDecodeTiles{"DEEPINFER_MOE_DECODE_TILE", true};

// kUseDecodeTiles unless DEEPINFER_MOE_DECODE_TILE=0 (one binary A/Bs the two decode paths on the
// GPU machine).
bool decode_tiles_enabled() {
  return kUseDecodeTiles.enabled();
}

// A decode tile shape (any shape gives the same bits: it changes only how many chunks are in
// flight, the register budget and which tokens share a pass):
//  - kStages: shared-memory slots per warp, kStages - 1 chunks (2 KB each) in flight;
//  - kMinBlocks: __launch_bounds__' blocks per SM (registers capped to fit them);
//  - kMaxTokenTiles: 8-token MMA tiles per pass over the weights (1: 8-token passes only, fewer
//    registers; 2: a 16-token pass while more than 8 tokens remain).
// 32-token passes would serve hot experts in fewer passes but took the kernel from 126 to 166
// registers (3 blocks per SM instead of 4) for every pass; decode experts rarely see 16 tokens.
template <int kStages_, int kMinBlocks_, int kMaxTokenTiles_>
struct DecodeShape {
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kMaxTokenTiles = kMaxTokenTiles_;
  static constexpr int kRowBytes = kChunk / 2;                   // one row's 8 fp4 32-blocks
  static constexpr int kPieces = kRowsPerWarp * kRowBytes / 16;  // 16-byte copies per chunk
  static constexpr int kWeightBytes = kRowsPerWarp * kRowBytes;
  static constexpr int kScaleCodeBytes = kRowsPerWarp * kBlocksPerChunk;  // [row][block] ue8m0
  static constexpr int kStageBytes = kWeightBytes + kScaleCodeBytes;
  // Per warp, after the stages: the current chunk's scales as floats, the weights' [row][block]
  // (fp4 rescale folded in) and the tokens' [block][token].
  static constexpr int kWeightScaleOffset = kStages * kStageBytes;
  static constexpr int kTokenScaleOffset = kWeightScaleOffset + kRowsPerWarp * kBlocksPerChunk * 4;
  static constexpr int kWarpBytes = kTokenScaleOffset + kBlocksPerChunk * 8 * kMaxTokenTiles * 4;
  static_assert(kStages >= 2, "a chunk in flight while one is read");
  static_assert(kStageBytes % 128 == 0 && kWarpBytes % 128 == 0,
                "each stage's rows start on 128 bytes, where the swizzle below is conflict-free");
  static_assert(kPieces % 32 == 0, "each lane copies the same number of 16-byte pieces");
  // Dynamic shared memory; kMinBlocks blocks (each with the 1 KB the system reserves) fit the
  // SM's 228 KB.
  static constexpr int kBlockBytes = kWarps * kWarpBytes;
  static_assert(kMinBlocks * (kBlockBytes + 1024) <= 228 * 1024, "kMinBlocks blocks per SM");
};

// The decode tile's shape: 4 stages (3 chunks in flight per warp), 16-token passes, 4 blocks per
// SM (128 registers, 96 KB in flight per SM). Ten shapes were measured on the H200 (2026-12-01,
// cuda_layer_bench, w1|w3 + w2 of one layer at b1 / b16 / b64 / b256): 5-8 stages, 3-5 blocks per
// SM, 8-token passes only, 2-4 items chained per block, and a one-round expert scan instead of
// nth_nonempty_group's walk; all were within 3% of each other and none beat this one (0.080 /
// 0.701 / 1.888 / 3.017 ms): more bytes in flight no longer buys time, the kernel is issue bound.
// docs/BENCHMARKS.md has the table; the variants went with this comment (git history).
using DecodeTileShape = DecodeShape<4, 4, 2>;

// 8 bytes global -> shared (a chunk's 8 scale codes of one row).
__device__ __forceinline__ void copy_8_async(uint32_t shared, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(shared), "l"(global) : "memory");
}

// Element i of v (i known at compile time in the unrolled loops that call it).
__device__ __forceinline__ float component(const float4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// One warp's 16 weight rows of one expert; the rows it multiplies are [first, first + count).
struct DecodeStripe {
  const uint8_t* weight = nullptr;  // row 0 of the 16
  const uint8_t* scales = nullptr;  // its scale row
  float* out = nullptr;
  int64_t n_base = 0;  // the output column of row 0
  int first = 0;
  int count = 0;
};

// Rows [tile, tile + 8 * kTokenTiles) of the stripe's tokens (those past count load the last row
// and are never stored) times the stripe's weights, all of K: one pass over the weights.
// Chunk c lives in slot c % kDecodeStages; weight row r's 16-byte piece p of a chunk at piece
// p ^ (r % 8), so the 8 rows of one ldmatrix matrix (the same piece) hit 8 different bank groups.
template <typename Shape, int kTokenTiles>
__device__ __forceinline__ void decode_pass(const GroupedArgs& args, const DecodeStripe& stripe,
                                            int tile, uint8_t* warp_shared) {
  static_assert(kTokenTiles <= Shape::kMaxTokenTiles, "the token scale table's size");
  constexpr int kDecodeStages = Shape::kStages;
  constexpr int kDecodeRowBytes = Shape::kRowBytes;
  constexpr int kDecodePieces = Shape::kPieces;
  constexpr int kDecodeWeightBytes = Shape::kWeightBytes;
  constexpr int kDecodeStageBytes = Shape::kStageBytes;
  constexpr int kDecodeWeightScaleOffset = Shape::kWeightScaleOffset;
  constexpr int kDecodeTokenScaleOffset = Shape::kTokenScaleOffset;
  constexpr int kTokens = 8 * kTokenTiles;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;  // MMA row (weights) / column (tokens) of this thread
  const int quad = lane & 3;
  const int64_t k_blocks = args.k / kScaleBlock;
  const int64_t w_row_bytes = args.k / 2;
  const int chunks = static_cast<int>(args.k / kChunk);
  const int first = stripe.first;
  const int count = stripe.count;
  // The activation rows this thread loads (MMA column `group`), chunk 0's codes.
  const uint8_t* load_codes[kTokenTiles];
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j) {
    load_codes[j] =
        args.x_codes + (first + min(tile + 8 * j + group, count - 1)) * args.k + 8 * quad;
  }
  // A chunk's token scale codes are 2 words (blocks [0, 4) and [4, 8)) per token; word e of
  // them (token e % kTokens, half e / kTokens) goes to lane e % 32.
  constexpr int kTokenWords = 2 * kTokens;
  constexpr int kTokenWordsPerLane = (kTokenWords + 31) / 32;
  int64_t token_word_offset[kTokenWordsPerLane];  // into x_scales, chunk 0
#pragma unroll
  for (int i = 0; i < kTokenWordsPerLane; ++i) {
    const int e = min(lane + 32 * i, kTokenWords - 1);
    token_word_offset[i] =
        (first + min(tile + e % kTokens, count - 1)) * k_blocks + 4 * (e / kTokens);
  }

  const auto copy_chunk = [&](const DecodeStripe& rows, int chunk, int slot) {
    uint8_t* stage = warp_shared + slot * kDecodeStageBytes;
#pragma unroll
    for (int i = 0; i < kDecodePieces / 32; ++i) {
      const int piece = lane + 32 * i;
      const int row = piece / (kDecodeRowBytes / 16);
      const int p = piece % (kDecodeRowBytes / 16);
      copy_16_async(
          shared_address(stage + row * kDecodeRowBytes + ((p ^ (row & 7)) << 4)),
          rows.weight + row * w_row_bytes + static_cast<int64_t>(chunk) * kDecodeRowBytes + p * 16);
    }
    if (lane < kRowsPerWarp) {
      copy_8_async(shared_address(stage + kDecodeWeightBytes + lane * kBlocksPerChunk),
                   rows.scales + lane * k_blocks + static_cast<int64_t>(chunk) * kBlocksPerChunk);
    }
  };

  auto* weight_scale = reinterpret_cast<float*>(warp_shared + kDecodeWeightScaleOffset);
  auto* token_scale = reinterpret_cast<float*>(warp_shared + kDecodeTokenScaleOffset);
  // ldmatrix: lane l gives row l % 8 of matrix l / 8; the matrices are (rows 0-7, block b),
  // (rows 8-15, b), (rows 0-7, b + 1), (rows 8-15, b + 1), so registers 0/1 are the low/high
  // rows' words of block b and 2/3 of b + 1.
  const int matrix = lane >> 3;
  const int matrix_row = (matrix & 1) * 8 + (lane & 7);
  const int matrix_block = matrix >> 1;

  float acc[kTokenTiles][4] = {};
  __syncwarp();  // every lane is done with the slots and tables of the previous pass
#pragma unroll
  for (int s = 0; s < kDecodeStages - 1; ++s) {
    if (s < chunks) copy_chunk(stripe, s, s);
    commit_copies();
  }
  for (int chunk = 0; chunk < chunks; ++chunk) {
    // Issued before the wait: the load's latency hides behind it.
    uint32_t token_codes[kTokenWordsPerLane];
#pragma unroll
    for (int i = 0; i < kTokenWordsPerLane; ++i) {
      token_codes[i] = lane + 32 * i < kTokenWords
                           ? __ldg(reinterpret_cast<const uint32_t*>(
                                 args.x_scales + token_word_offset[i] +
                                 static_cast<int64_t>(chunk) * kBlocksPerChunk))
                           : 0u;
    }
    wait_copies<kDecodeStages - 2>();
    __syncwarp();  // chunk `chunk` is in; every lane is done with the slot `ahead` reuses
    const int ahead = chunk + kDecodeStages - 1;
    if (ahead < chunks) copy_chunk(stripe, ahead, ahead % kDecodeStages);
    commit_copies();
    const uint8_t* stage = warp_shared + (chunk % kDecodeStages) * kDecodeStageBytes;
    {
      // Lane l decodes row l / 2's codes [4 (l % 2), +4) and its tokens' words.
      const uint32_t codes =
          *reinterpret_cast<const uint32_t*>(stage + kDecodeWeightBytes + 4 * lane);
      float4 decoded;
      decoded.x = scale_code(codes, 0) * kE2m1Rescale;
      decoded.y = scale_code(codes, 8) * kE2m1Rescale;
      decoded.z = scale_code(codes, 16) * kE2m1Rescale;
      decoded.w = scale_code(codes, 24) * kE2m1Rescale;
      reinterpret_cast<float4*>(weight_scale)[lane] = decoded;
#pragma unroll
      for (int i = 0; i < kTokenWordsPerLane; ++i) {
        const int e = lane + 32 * i;
        if (e < kTokenWords) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            token_scale[(4 * (e / kTokens) + c) * kTokens + e % kTokens] =
                scale_code(token_codes[i], 8 * c);
          }
        }
      }
    }
    __syncwarp();  // the chunk's scale tables are written
    const float4* row_scales = reinterpret_cast<const float4*>(weight_scale);
    const float4 lo_scales[2] = {row_scales[2 * group], row_scales[2 * group + 1]};
    const float4 hi_scales[2] = {row_scales[2 * (group + 8)], row_scales[2 * (group + 8) + 1]};
    const uint32_t stage_address = shared_address(stage);
#pragma unroll
    for (int pair = 0; pair < kBlocksPerChunk; pair += 2) {
      uint32_t words[4];
      const int piece = pair + matrix_block;
      load_matrices_x4(
          words, stage_address + matrix_row * kDecodeRowBytes + ((piece ^ (matrix_row & 7)) << 4));
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int b = pair + half;
        const int64_t k_block = static_cast<int64_t>(chunk) * kBlocksPerChunk + b;
        const uint32_t lo = words[2 * half];
        const uint32_t hi = words[2 * half + 1];
        uint32_t a[4];
        a[0] = e2m1x4_to_e4m3x4_scaled(lo);
        a[1] = e2m1x4_to_e4m3x4_scaled(hi);
        a[2] = e2m1x4_to_e4m3x4_scaled(lo >> 4);
        a[3] = e2m1x4_to_e4m3x4_scaled(hi >> 4);
        const float w_scale_lo = component(lo_scales[b / 4], b % 4);
        const float w_scale_hi = component(hi_scales[b / 4], b % 4);
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          const uint2 activation =
              __ldg(reinterpret_cast<const uint2*>(load_codes[j] + k_block * kScaleBlock));
          float d[4];
          mma_e4m3_from_zero(a, activation.x, activation.y, d);
          const float2 x_scales =
              *reinterpret_cast<const float2*>(token_scale + b * kTokens + 8 * j + 2 * quad);
          acc[j][0] += d[0] * (x_scales.x * w_scale_lo);
          acc[j][1] += d[1] * (x_scales.y * w_scale_lo);
          acc[j][2] += d[2] * (x_scales.x * w_scale_hi);
          acc[j][3] += d[3] * (x_scales.y * w_scale_hi);
        }
      }
    }
  }
  // This thread's outputs: MMA columns 2 quad and 2 quad + 1 (tokens), rows group and group + 8.
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j) {
    const int token = tile + 8 * j + 2 * quad;
    float* out = stripe.out + (first + token) * args.out_stride + stripe.n_base + group;
    if (token < count) {
      out[0] = acc[j][0];
      out[8] = acc[j][2];
    }
    if (token + 1 < count) {
      out[args.out_stride] = acc[j][1];
      out[args.out_stride + 8] = acc[j][3];
    }
  }
}

// mma_gemm_kernel<false, 1>'s grid and work split (x: items of 64 weight rows of one table; y:
// expert or the y-th expert with rows; z: token tiles of one group), fp4 weights only; each
// warp's 16 rows stream through its own shared-memory slots. With grid.z == 1 a warp takes its
// expert's tokens 16 at a time while more than 8 are left, so one pass over the weights serves
// them. Shape: a DecodeShape.
template <typename Shape>
__global__ void __launch_bounds__(kWarps * 32, Shape::kMinBlocks)
    decode_tile_kernel(GroupedArgs args) {
  extern __shared__ __align__(128) uint8_t shared[];  // Shape::kBlockBytes
  int expert = blockIdx.y;
  if (args.offsets != nullptr && gridDim.y < args.groups) {
    expert = nth_nonempty_group(args.offsets, args.groups, args.rows, blockIdx.y);
    if (expert < 0) return;
  }
  int first = 0;
  int last = static_cast<int>(args.rows);
  if (args.offsets != nullptr) {
    first = clamp_offset(args.offsets[expert], args.rows);
    last = max(first, clamp_offset(args.offsets[expert + 1], args.rows));
  }
  const int count = last - first;
  // An 8-token pass's first tile and stride (grid.z > 1: token tiles spread over z).
  const int tile_start = gridDim.z == 1 ? 0 : static_cast<int>(blockIdx.z) * 8;
  const int narrow_step = gridDim.z == 1 ? 8 : static_cast<int>(gridDim.z) * 8;
  if (tile_start >= count) return;
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int64_t k_blocks = args.k / kScaleBlock;
  const int64_t w_row_bytes = args.k / 2;
  const int64_t row_blocks = (args.n + kRowsPerBlock - 1) / kRowsPerBlock;
  DecodeStripe stripe;
  stripe.first = first;
  stripe.count = count;
  int64_t row_block = blockIdx.x;
  const DeviceWeight* experts = args.experts;
  stripe.out = args.out;
  if (args.second_out != nullptr && row_block >= row_blocks) {
    row_block -= row_blocks;
    experts = args.second_experts;
    stripe.out = args.second_out;
  }
  stripe.n_base = row_block * kRowsPerBlock + warp * kRowsPerWarp;
  if (stripe.n_base >= args.n) return;  // the block's last warps past N (no block barriers)
  if (experts != nullptr) {
    stripe.weight = experts[expert].bytes + stripe.n_base * w_row_bytes;
    stripe.scales = experts[expert].scale + stripe.n_base * k_blocks;
  } else {
    const int64_t w_row = expert * args.n + stripe.n_base;
    stripe.weight = args.weight + w_row * w_row_bytes;
    stripe.scales = args.w_scales + w_row * k_blocks;
  }
  uint8_t* warp_shared = shared + warp * Shape::kWarpBytes;
  constexpr int kWideTiles = Shape::kMaxTokenTiles;  // 1 or 2
  static_assert(kWideTiles == 1 || kWideTiles == 2, "8- or 16-token passes");
  for (int tile = tile_start; tile < count;) {
    const bool wide = kWideTiles == 2 && gridDim.z == 1 && count - tile > 8;
    if (wide) {
      decode_pass<Shape, kWideTiles>(args, stripe, tile, warp_shared);
    } else {
      decode_pass<Shape, 1>(args, stripe, tile, warp_shared);
    }
    tile += wide ? 16 : narrow_step;
  }
}

// grid: one block per item (x), expert (y) and token tile (z), as mma_gemm_kernel's.
template <typename Shape>
void launch_decode_tiles(dim3 grid, cudaStream_t stream, const GroupedArgs& args) {
  static const bool configured = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(decode_tile_kernel<Shape>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Shape::kBlockBytes));
    return true;
  }();
  (void)configured;
  decode_tile_kernel<Shape><<<grid, kWarps * 32, Shape::kBlockBytes, stream>>>(args);
}

const uint8_t* device_bytes(const TensorView& view, DType dtype, const char* what) {
  require(view.device().is_cuda() && view.dtype() == dtype && view.is_contiguous(), what,
          " must be a contiguous ", dtype_name(dtype), " device tensor, got ", view.to_string());
  return static_cast<const uint8_t*>(view.raw_data());
}

// With batch invariance off on an sm_90 device (the fold-per-128 wgmma numerics), which tile the
// fp4 decode regime takes: 0, decode_tile_kernel (mma.sync, the released numerics: sm_90a
// emulates its FP8 mma.sync with 12 F2FP + 2 f16 HMMA, so it is issue bound); 1, the wgmma
// prefill tiles (register_a's 128 x 32 small tiles); 2, the wgmma decode tile
// (launch_moe_decode_wgmma: 64 rows x 16 or 8 tokens, 4 blocks per SM). 1 and 2 give the same
// bits. -1 (the default): 2 from kWgmmaDecodeMinRows rows on, 0 below.
// Measured on the H200 (cuda_layer_bench, one layer's routed experts, 2026-12-02 03:06 call, ms at
// b1 / b16 / b64 / b256 = 6 / 96 / 384 / 1536 rows): the grouped GEMMs (w1|w3 + w2) 0 0.0821 /
// 0.7096 / 1.9557 / 3.0087, 2 0.0800 / 0.5920 / 1.6411 / 2.5146; the model's op (with its sort,
// quantizers and combine) 0 0.0911 / 0.7200 / 1.9471 / 3.1431, 2 0.0948 / 0.6265 / 1.6788 /
// 2.6523. The decode tile's first version (removed) was 2.89 ms at b256; 1 (the prefill tiles,
// one 256-thread block an SM) was 5.26 ms there, latency bound.
RuntimeSetting kMoeWgmmaDecode{"DEEPINFER_MOE_WGMMA_DECODE", -1, -1, 2};
// The automatic choice's threshold. With the decode tile's lean step the op on it was 4% slower
// at 6 rows (b1) than on the mma.sync tile and 13% faster at 96 (b16), so the threshold sat at 64;
// the lean3 step made it faster at 6 rows too (H200, 2026-12-02 06:24
// call, cuda_layer_bench: the op 0.0751 against 0.0862 ms, the routed GEMMs 0.0652 against
// 0.0777), so every row count takes it.
constexpr int64_t kWgmmaDecodeMinRows = 1;

// Which kernel and token tile a call takes, and so which code layout its quantizer writes.
struct KernelChoice {
  bool wide = false;           // mma_gemm_kernel's wide token tile
  bool prefill_tiles = false;  // prefill_tile_kernel (fp4 only)
  bool decode_tiles = false;   // decode_tile_kernel (fp4 only)
  bool decode_wgmma = false;   // launch_moe_decode_wgmma (fp4, batch invariance off, sm_90)
  int64_t max_tiles = 0;       // its token tile list's bound
  CodeLayout layout = CodeLayout::kEvenOdd8;
  // Batch invariance off, sm_90: the prefill tiles on wgmma (moe_prefill_wgmma.h); kPer128
  // also changes the quantizer (quantize_rows_per128: one f32 scale per 128 of K).
  WgmmaFold wgmma = WgmmaFold::kNone;
};

// tile_aligned: the fp4 weight rows start on 16 bytes and the scale rows on 8 (the prefill and
// decode tiles' copies; every caller checks 8).
template <bool kFp8Weight>
KernelChoice choose_kernel(int64_t rows, int64_t groups, bool has_offsets, int64_t n, int64_t k,
                           bool tile_aligned) {
  KernelChoice choice;
  // Many rows per group (prefill): wider token tiles reuse each weight load.
  choice.wide = rows >= 16 * groups;
  // fp4 prefill over several groups: the shared-memory tile, when the grids fit.
  const int64_t max_big_tiles = rows / kBigTileMinRows;
  const int64_t max_small_tiles = std::min(rows, kMaxSmallTilesPerGroup * groups);
  choice.prefill_tiles = !kFp8Weight && choice.wide && tile_aligned && prefill_tiles_enabled() &&
                         has_offsets && n % kTileRows == 0 && k % kStepK == 0 &&
                         max_big_tiles + max_small_tiles <= INT32_MAX;
  choice.max_tiles = max_big_tiles + max_small_tiles;
  // fp4 decode: the shared-memory weight stream (cp.async needs the aligned rows), same layout.
  choice.decode_tiles = !kFp8Weight && !choice.wide && tile_aligned && decode_tiles_enabled();
  choice.layout = kFp8Weight             ? CodeLayout::kNatural
                  : choice.prefill_tiles ? CodeLayout::kMmaHalves
                                         : CodeLayout::kEvenOdd8;
  if (choice.prefill_tiles) choice.wgmma = moe_wgmma_fold();
  // fp4 decode with the wgmma numerics: a wgmma tile (kMoeWgmmaDecode) instead of the mma.sync
  // one; moe_wgmma_fold() is kNone with batch invariance on, which keeps its kernels and bits.
  const bool wgmma_decode_shape = !kFp8Weight && !choice.wide && tile_aligned && has_offsets &&
                                  k % kStepK == 0 && rows <= INT32_MAX / 2;
  int wgmma_decode = wgmma_decode_shape ? kMoeWgmmaDecode.value() : 0;
  if (wgmma_decode < 0) wgmma_decode = rows >= kWgmmaDecodeMinRows ? 2 : 0;
  if (wgmma_decode != 0 && moe_wgmma_fold() == WgmmaFold::kPer128) {
    if (wgmma_decode == 1 && n % kTileRows == 0) {
      choice.prefill_tiles = true;
    } else if (wgmma_decode == 2 && n % kDecodeTileRows == 0) {
      choice.decode_wgmma = true;
      // Decode tiles of 9 or more rows, at most one of 8 or fewer per group.
      constexpr int kDecodeBigMinRows = kDecodeBigTileTokens - kDecodeSmallTileTokens + 1;
      choice.max_tiles = rows / kDecodeBigMinRows + std::min(rows, groups);
    }
    if (choice.prefill_tiles || choice.decode_wgmma) {
      choice.decode_tiles = false;
      choice.layout = CodeLayout::kMmaHalves;
      choice.wgmma = WgmmaFold::kPer128;
    }
  }
  return choice;
}

// A token-tile list (tiles of kBigTokens and kSmallTokens) built on the device by
// list_token_tiles_kernel: the tile count first (16 bytes), then the tiles, in one stream-ordered
// buffer.
template <int kBigTokens, int kSmallTokens>
struct TokenTileList {
  static constexpr size_t kCountBytes = 16;
  static constexpr int kListThreads = 512;
  // sized: 0, or the register tile's largest sized tile (moe_prefill_sized_tiles()).
  TokenTileList(const GroupedArgs& args, int64_t max_tiles, cudaStream_t stream, int sized = 0)
      : buffer(kCountBytes + static_cast<size_t>(max_tiles) * sizeof(TokenTile)),
        tile_count(buffer.as<int>()),
        tiles(reinterpret_cast<TokenTile*>(buffer.as<uint8_t>() + kCountBytes)) {
    const auto list = [&](auto kernel) {
      launch_dependent(kernel, 1, kListThreads, 0, stream, args.offsets, args.groups, args.rows,
                       tiles, static_cast<int>(max_tiles), tile_count);
    };
    if constexpr (kBigTokens == kBigTileTokens && kSmallTokens == kSmallTileTokens) {
      if (sized == 128) {
        list(list_token_tiles_kernel<kListThreads, 128, 32, 128>);
        return;
      }
      if (sized == 144) {
        list(list_token_tiles_kernel<kListThreads, 128, 32, 144>);
        return;
      }
      if (sized == 160) {
        list(list_token_tiles_kernel<kListThreads, 128, 32, 160>);
        return;
      }
    }
    DI_CHECK(sized == 0, "TokenTileList: no sized tiles of ", sized, " tokens");
    list(list_token_tiles_kernel<kListThreads, kBigTokens, kSmallTokens>);
  }
  StreamBuffer buffer;
  int* tile_count;
  TokenTile* tiles;
};

// The wgmma tiles' arguments for `args` (one weight table; the caller adds a second): kPer128
// reads the per-128 step scales of quantize_rows_per128, kPer32 the per-32 ue8m0 codes.
PrefillWgmmaArgs wgmma_args(const GroupedArgs& args, WgmmaFold fold) {
  PrefillWgmmaArgs wgmma;
  wgmma.x_codes = args.x_codes;
  if (fold == WgmmaFold::kPer128) {
    wgmma.x_step_scales = reinterpret_cast<const float*>(args.x_scales);
  } else {
    wgmma.x_scales = args.x_scales;
  }
  wgmma.weight = args.weight;
  wgmma.w_scales = args.w_scales;
  wgmma.experts = args.experts;
  wgmma.out = args.out;
  wgmma.out_stride = args.out_stride;
  wgmma.n = args.n;
  wgmma.k = args.k;
  return wgmma;
}

// Runs the kernel `choice` names over activations already quantized into args.x_codes /
// x_scales in choice.layout; args carries everything else (rows, groups, out). With
// args.second_out, both weight tables (fp4 decode / register tile: one launch; prefill tile: two
// launches over one tile list).
template <bool kFp8Weight>
void run_quantized(GroupedArgs args, const KernelChoice& choice) {
  const auto stream = current_stream();
  if (choice.decode_wgmma) {
    const TokenTileList<kDecodeBigTileTokens, kDecodeSmallTileTokens> list(args, choice.max_tiles,
                                                                           stream);
    PrefillWgmmaArgs wgmma = wgmma_args(args, WgmmaFold::kPer128);
    wgmma.second_experts = args.second_experts;
    wgmma.second_out = args.second_out;
    launch_moe_decode_wgmma(wgmma, list.tiles, list.tile_count, choice.max_tiles);
    return;
  }
  if (choice.prefill_tiles) {
    // The register tile's sized tiles with the fold per 128 (moe_prefill_sized_tiles()).
    const int sized = choice.wgmma == WgmmaFold::kPer128 ? moe_prefill_sized_tiles() : 0;
    const TokenTileList<kBigTileTokens, kSmallTileTokens> list(args, choice.max_tiles, stream,
                                                               sized);
    const TokenTile* tiles = list.tiles;
    const int* tile_count = list.tile_count;
    if (choice.wgmma != WgmmaFold::kNone) {
      PrefillWgmmaArgs wgmma = wgmma_args(args, choice.wgmma);
      launch_moe_prefill_wgmma(wgmma, choice.wgmma, tiles, tile_count, choice.max_tiles);
      if (args.second_out != nullptr) {
        wgmma.experts = args.second_experts;
        wgmma.out = args.second_out;
        launch_moe_prefill_wgmma(wgmma, choice.wgmma, tiles, tile_count, choice.max_tiles);
      }
      return;
    }
    static const bool configured = [] {
      DI_CUDA_CHECK(cudaFuncSetAttribute(
          prefill_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPrefillSmemBytes));
      return true;
    }();
    (void)configured;
    const int sms = deepinfer::cuda::multiprocessor_count();
    const int64_t max_items = choice.max_tiles * (args.n / kTileRows);
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(max_items, sms));
    GroupedArgs single = args;
    single.second_experts = nullptr;
    single.second_out = nullptr;
    prefill_tile_kernel<<<blocks, kTileThreads, kPrefillSmemBytes, stream>>>(single, tiles,
                                                                             tile_count);
    DI_CUDA_LAUNCHED(prefill_tile_kernel);
    if (args.second_out != nullptr) {
      single.experts = args.second_experts;
      single.out = args.second_out;
      prefill_tile_kernel<<<blocks, kTileThreads, kPrefillSmemBytes, stream>>>(single, tiles,
                                                                               tile_count);
      DI_CUDA_LAUNCHED(prefill_tile_kernel);
    }
    return;
  }
  // 8 token tiles per block for fp4; 4 for fp8, whose double-buffered weight words take twice
  // the registers.
  constexpr int kWideTiles = kFp8Weight ? 4 : 8;
  // One group (dense): a block per token tile, so small N still fills the GPU as M grows.
  // Several groups: their row counts are on the device, each block loops over its group's.
  const int64_t token_tiles =
      args.groups == 1 ? blocks_for(args.rows, 8 * (choice.wide ? kWideTiles : 1)) : 1;
  // At most R groups have rows: with fewer rows than experts (decode), grid.y walks only the
  // experts that have some instead of launching a block per expert of the 384.
  const int64_t group_blocks = std::min(args.groups, args.rows);
  const int64_t row_blocks = blocks_for(args.n, kRowsPerBlock);
  const int64_t tables = !kFp8Weight && args.second_out != nullptr ? 2 : 1;
  const dim3 grid(static_cast<unsigned>(tables * row_blocks), static_cast<unsigned>(group_blocks),
                  static_cast<unsigned>(std::min<int64_t>(token_tiles, 65535)));
  if (!kFp8Weight && choice.decode_tiles) {
    launch_decode_tiles<DecodeTileShape>(grid, stream, args);
    DI_CUDA_LAUNCHED(decode_tile_kernel);
    return;
  }
  if (choice.wide) {
    mma_gemm_kernel<kFp8Weight, kWideTiles><<<grid, kWarps * 32, 0, stream>>>(args);
  } else {
    mma_gemm_kernel<kFp8Weight, 1><<<grid, kWarps * 32, 0, stream>>>(args);
  }
  DI_CUDA_LAUNCHED(mma_gemm_kernel);
}

// Quantizes x's rows (released activation numerics) and runs the kernel over `groups` groups
// of weight rows; args carries the weight side, n and k.
template <bool kFp8Weight>
void launch(const DeviceRows<const float>& in, const DeviceRows<float>& o, GroupedArgs args,
            int64_t groups, bool tile_aligned = false) {
  if (in.rows == 0 || args.n == 0 || groups == 0) return;
  const KernelChoice choice = choose_kernel<kFp8Weight>(in.rows, groups, args.offsets != nullptr,
                                                        args.n, args.k, tile_aligned);
  const int64_t blocks_per_row = args.k / kScaleBlock;
  StreamBuffer codes(static_cast<size_t>(in.rows * args.k));
  StreamBuffer scales(static_cast<size_t>(in.rows * blocks_per_row));
  if (choice.wgmma == WgmmaFold::kPer128) {  // one f32 per 128: the bytes of four codes per 32
    ExpertRowsSource rows;
    rows.x = in;
    rows.rows = in.rows;
    rows.cols = in.cols;
    quantize_rows_per128<false>(rows, codes.as<uint8_t>(), scales.as<float>());
  } else {
    quantize_fp8_rows(in, choice.layout, codes.as<uint8_t>(), scales.as<uint8_t>());
  }
  args.x_codes = codes.as<uint8_t>();
  args.x_scales = scales.as<uint8_t>();
  args.out = o.data;
  args.out_stride = o.stride;
  args.rows = in.rows;
  args.groups = groups;
  run_quantized<kFp8Weight>(args, choice);
}

template <bool kSwiglu>
void quantize_expert_rows(const ExpertRowsSource& source, const KernelChoice& choice,
                          uint8_t* codes, uint8_t* scales) {
  if (choice.wgmma == WgmmaFold::kPer128) {  // one f32 per 128: the bytes of four codes per 32
    quantize_rows_per128<kSwiglu>(source, codes, reinterpret_cast<float*>(scales));
    return;
  }
  const CodeLayout layout = choice.layout;
  constexpr int kQuantThreads = 256;
  const auto stream = current_stream();
  const unsigned quant_blocks = blocks_for(source.rows * source.cols, kQuantThreads);
  if (layout == CodeLayout::kMmaHalves) {
    quantize_expert_rows_kernel<CodeLayout::kMmaHalves, kSwiglu>
        <<<quant_blocks, kQuantThreads, 0, stream>>>(source, codes, scales);
  } else {
    quantize_expert_rows_kernel<CodeLayout::kEvenOdd8, kSwiglu>
        <<<quant_blocks, kQuantThreads, 0, stream>>>(source, codes, scales);
  }
  DI_CUDA_LAUNCHED(quantize_expert_rows_kernel);
}

// launch_moe_fp4_experts' scratch, carved from one allocation (every piece on 256 bytes, more
// than the kernels' 16-byte loads need); with a null base only `bytes` is meaningful.
struct MoeScratch {
  uint8_t* in_codes = nullptr;   // [entries, dim] e4m3
  uint8_t* in_scales = nullptr;  // [entries, dim / 32] ue8m0
  float* gate = nullptr;         // [entries, inter]
  float* up = nullptr;           // [entries, inter]
  uint8_t* mid_codes = nullptr;  // [entries, inter]
  uint8_t* mid_scales = nullptr;
  size_t bytes = 0;
};

MoeScratch carve_moe_scratch(void* base, int64_t entries, int64_t dim, int64_t inter) {
  MoeScratch scratch;
  const auto take = [&](int64_t bytes) {
    uint8_t* piece = base == nullptr ? nullptr : static_cast<uint8_t*>(base) + scratch.bytes;
    scratch.bytes += (static_cast<size_t>(bytes) + 255) / 256 * 256;
    return piece;
  };
  scratch.in_codes = take(entries * dim);
  scratch.in_scales = take(entries * dim / kScaleBlock);
  scratch.gate = reinterpret_cast<float*>(take(entries * inter * 4));
  scratch.up = reinterpret_cast<float*>(take(entries * inter * 4));
  scratch.mid_codes = take(entries * inter);
  scratch.mid_scales = take(entries * inter / kScaleBlock);
  return scratch;
}

}  // namespace

void quantize_fp8_rows(DeviceRows<const float> x, CodeLayout layout, uint8_t* codes,
                       uint8_t* scale_codes) {
  DI_CHECK(x.cols % kScaleBlock == 0, "quantize_fp8_rows: ", x.cols, " columns are not 32-blocks");
  constexpr int kQuantThreads = 256;
  const auto stream = current_stream();
  const int64_t blocks_per_row = x.cols / kScaleBlock;
  const unsigned quant_blocks = blocks_for(x.rows * x.cols, kQuantThreads);
  const auto kernel = layout == CodeLayout::kNatural ? quantize_rows_kernel<CodeLayout::kNatural>
                      : layout == CodeLayout::kMmaHalves
                          ? quantize_rows_kernel<CodeLayout::kMmaHalves>
                          : quantize_rows_kernel<CodeLayout::kEvenOdd8>;
  launch_dependent(kernel, quant_blocks, kQuantThreads, 0, stream, x, codes, scale_codes,
                   blocks_per_row);
}

bool grouped_fp4_supports(const DeviceWeight& w) {
  // The prefill tile copies weight rows in 16-byte pieces; the other kernel loads scales 8 at a
  // time.
  return w.kind == WeightKind::kF4 && w.block_in == kScaleBlock && w.in % kChunk == 0 &&
         w.out % kRowsPerWarp == 0 && aligned_to(w.bytes, 16) && aligned_to(w.scale, 8);
}

bool fp8_mma_supports(const DeviceWeight& w) {
  return w.kind == WeightKind::kF8 && w.block_out == kScaleBlock && w.block_in == kScaleBlock &&
         w.in % kChunk == 0 && w.out % kRowsPerWarp == 0;
}

void launch_grouped_fp4(DeviceRows<const float> x, const DeviceWeight& shape, DeviceRows<float> out,
                        const GemmGroups& groups) {
  DI_CHECK(grouped_fp4_supports(shape) && groups.offsets != nullptr && groups.weights != nullptr &&
               x.cols == shape.in && out.cols == shape.out && out.rows == x.rows,
           "launch_grouped_fp4: unsupported weight [", shape.out, ", ", shape.in, "] or shapes");
  GroupedArgs args{};
  args.offsets = groups.offsets;
  args.experts = groups.weights;
  args.n = shape.out;
  args.k = shape.in;
  // Every group's weight passed grouped_fp4_supports, alignment included.
  launch<false>(x, out, args, groups.count, /*tile_aligned=*/true);
}

size_t moe_fp4_scratch_bytes(int64_t entries, const MoeFp4Tables& tables) {
  return carve_moe_scratch(nullptr, entries, tables.w13_shape.in, tables.w13_shape.out).bytes;
}

void launch_moe_fp4_experts(DeviceRows<const float> x, const int32_t* sorted_token,
                            const float* sorted_weight, const GemmGroups& groups, int64_t entries,
                            const MoeFp4Tables& tables, float swiglu_limit, void* scratch,
                            DeviceRows<float> results) {
  const int64_t dim = tables.w13_shape.in;
  const int64_t inter = tables.w13_shape.out;
  DI_CHECK(grouped_fp4_supports(tables.w13_shape) && grouped_fp4_supports(tables.w2_shape) &&
               tables.w2_shape.in == inter && tables.w2_shape.out == dim && x.cols == dim &&
               results.cols == dim && results.rows == entries && groups.offsets != nullptr &&
               tables.w1 != nullptr && tables.w3 != nullptr && tables.w2 != nullptr,
           "launch_moe_fp4_experts: unsupported expert shapes [", inter, ", ", dim, "] / [",
           tables.w2_shape.out, ", ", tables.w2_shape.in, "] or rows");
  if (entries == 0 || groups.count == 0 || inter == 0 || dim == 0) return;
  const MoeScratch pieces = carve_moe_scratch(scratch, entries, dim, inter);
  const int32_t* placed = groups.offsets + groups.count;

  // w1 and w3 over one quantization of the gathered rows, in one launch (decode).
  const KernelChoice up_choice =
      choose_kernel<false>(entries, groups.count, true, inter, dim, /*tile_aligned=*/true);
  ExpertRowsSource gathered;
  gathered.x = x;
  gathered.sorted_token = sorted_token;
  gathered.placed = placed;
  gathered.rows = entries;
  gathered.cols = dim;
  quantize_expert_rows<false>(gathered, up_choice, pieces.in_codes, pieces.in_scales);
  GroupedArgs args{};
  args.x_codes = pieces.in_codes;
  args.x_scales = pieces.in_scales;
  args.offsets = groups.offsets;
  args.experts = tables.w1;
  args.out = pieces.gate;
  args.second_experts = tables.w3;
  args.second_out = pieces.up;
  args.out_stride = inter;
  args.rows = entries;
  args.groups = groups.count;
  args.n = inter;
  args.k = dim;
  run_quantized<false>(args, up_choice);

  // w2 over the SwiGLU's codes.
  const KernelChoice down_choice =
      choose_kernel<false>(entries, groups.count, true, dim, inter, /*tile_aligned=*/true);
  ExpertRowsSource intermediate;
  intermediate.gate = pieces.gate;
  intermediate.up = pieces.up;
  intermediate.sorted_weight = sorted_weight;
  intermediate.swiglu_limit = swiglu_limit;
  intermediate.placed = placed;
  intermediate.rows = entries;
  intermediate.cols = inter;
  quantize_expert_rows<true>(intermediate, down_choice, pieces.mid_codes, pieces.mid_scales);
  args.x_codes = pieces.mid_codes;
  args.x_scales = pieces.mid_scales;
  args.experts = tables.w2;
  args.out = results.data;
  args.out_stride = results.stride;
  args.second_experts = nullptr;
  args.second_out = nullptr;
  args.n = dim;
  args.k = inter;
  run_quantized<false>(args, down_choice);
}

void moe_grouped_gemm_fp4(const TensorView& x, const TensorView& expert_offsets,
                          const TensorView& weight, const TensorView& scale,
                          const TensorView& out) {
  const DeviceRows<const float> in = device_rows<const float>(x, "moe_grouped_gemm_fp4 input");
  const DeviceRows<float> o = device_rows<float>(out, "moe_grouped_gemm_fp4 output");
  if (weight.rank() != 3) {
    DI_THROW("moe_grouped_gemm_fp4 weight must be [E, N, K], got ", weight.to_string());
  }
  const int64_t experts = weight.size(0);
  const int64_t n = weight.size(1);
  const int64_t k = weight.size(2);
  require(k % kChunk == 0 && n % kRowsPerWarp == 0, "moe_grouped_gemm_fp4 needs K % ", kChunk,
          " == 0 and N % ", kRowsPerWarp, " == 0, got weight ", weight.to_string());
  require(scale.rank() == 3 && scale.size(0) == experts && scale.size(1) == n &&
              scale.size(2) == k / kScaleBlock,
          "moe_grouped_gemm_fp4 scale must be [E, N, K / 32], got ", scale.to_string(),
          " for weight ", weight.to_string());
  require(expert_offsets.rank() == 1 && expert_offsets.size(0) == experts + 1,
          "moe_grouped_gemm_fp4 expert_offsets must be [E + 1], got ", expert_offsets.to_string());
  require(in.cols == k && o.cols == n && o.rows == in.rows,
          "moe_grouped_gemm_fp4 shapes do not match: x ", x.to_string(), ", weight ",
          weight.to_string(), ", out ", out.to_string());
  require(experts <= 65535, "moe_grouped_gemm_fp4: ", experts, " experts exceed one launch");
  GroupedArgs args{};
  args.weight = device_bytes(weight, DType::kF4E2M1x2, "moe_grouped_gemm_fp4 weight");
  args.w_scales = device_bytes(scale, DType::kF8E8M0, "moe_grouped_gemm_fp4 scale");
  args.offsets = reinterpret_cast<const int32_t*>(
      device_bytes(expert_offsets, DType::kI32, "moe_grouped_gemm_fp4 expert_offsets"));
  args.n = n;
  args.k = k;
  launch<false>(in, o, args, experts, aligned_to(args.weight, 16) && aligned_to(args.w_scales, 8));
}

void linear_fp8_mma(const TensorView& x, const LinearWeight& weight, const TensorView& out) {
  const DeviceRows<const float> in = device_rows<const float>(x, "linear_fp8_mma input");
  const DeviceRows<float> o = device_rows<float>(out, "linear_fp8_mma output");
  const TensorView& w = weight.weight;
  const TensorView& scale = weight.scale;
  require(w.rank() == 2, "linear_fp8_mma weight must be [N, K], got ", w.to_string());
  const int64_t n = w.size(0);
  const int64_t k = w.size(1);
  require(k % kChunk == 0 && n % kRowsPerWarp == 0, "linear_fp8_mma needs K % ", kChunk,
          " == 0 and N % ", kRowsPerWarp, " == 0, got weight ", w.to_string());
  require(scale.rank() == 2 && scale.size(0) == (n + kScaleBlock - 1) / kScaleBlock &&
              scale.size(1) == k / kScaleBlock,
          "linear_fp8_mma needs 32x32 block scales [ceil(N / 32), K / 32], got ", scale.to_string(),
          " for weight ", w.to_string());
  require(in.cols == k && o.cols == n && o.rows == in.rows,
          "linear_fp8_mma shapes do not match: x ", x.to_string(), ", weight ", w.to_string(),
          ", out ", out.to_string());
  GroupedArgs args{};
  args.weight = device_bytes(w, DType::kF8E4M3, "linear_fp8_mma weight");
  args.w_scales = device_bytes(scale, DType::kF8E8M0, "linear_fp8_mma scale");
  args.n = n;
  args.k = k;
  launch<true>(in, o, args, 1);
}

}  // namespace deepinfer::ops::cuda
