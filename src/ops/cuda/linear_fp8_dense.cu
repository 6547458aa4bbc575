// Dense FP8 x FP8 GEMM with 32x32 block-scaled weights (mma.sync m16n8k32 e4m3 -> f32, sm_89+).
//
// The released dense roles went through linear_fp8_mma (the grouped expert kernel with one group):
// N / 16 warps at decode (80 for wq_a on 132 SMs) and, from 16 rows on, every 8- or 32-token tile
// re-reading the weight. Here, as in linear_bf16_mma.cu:
//  - decode kernels (8, 16 or 32 tokens per block) cut K into S slices chosen from the weight's
//    shape only (until N / 16 * S reaches about 1024 warps); a row group's S slices are S warps of
//    one block whose partials are added through shared memory in slice order; each warp streams
//    its rows of its slice through shared memory (split_tile_kernel; split_kernel, the register
//    loads before it, stays behind DEEPINFER_FP8_DENSE_DECODE_TILE=0 with the same bits);
//  - a prefill kernel stages a 128-row weight tile and a 64-token activation tile per 128 K in
//    shared memory (cp.async, 3 stages) and runs all S slices of its outputs in order.
//
// Numerics (linear_fp8_mma's): one MMA step of K is one 32-wide scale block of both operands,
// so each instruction starts from a zero accumulator and its result times s_x * s_w (powers of
// two, exact) is added to the slice's partial in K order. Inside the 32-block the K order is ours
// to choose as long as both operands agree and every kernel uses the same one: thread t of a quad
// holds K [8t, 8t + 8) of the block for the weight rows and the token (register 0 / 2 of the A
// fragment and b0 / b1 take the first / last four), exactly linear_fp8_mma's assignment, so with
// one slice the bits equal its own. Every kernel here computes each output element as the same
// sequence (the same MMAs, the same scaled additions per slice, 0 + P_0 + P_1 + ...), which keeps
// batch invariance when the launch changes with the row count.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8_mma.cuh"
#include "ops/cuda/linear.cuh"
#include "ops/cuda/linear_fp8_dense.h"

namespace deepinfer::ops::cuda {
namespace {

// The path's switch: false sends every FP8 weight back to linear_fp8_mma.
RuntimeSwitch kFp8DenseEnabled{"DEEPINFER_FP8_DENSE", true};
// The prefill tile's switch: false makes kAuto use the 32-token decode kernel for every batch
// above 16 rows (same bits, slower at prefill).
RuntimeSwitch kFp8DenseTileEnabled{"DEEPINFER_FP8_DENSE_TILE", true};
// false: linear_fp8_dense_pair makes two calls (same bits).
RuntimeSwitch kFp8DensePair{"DEEPINFER_FP8_DENSE_PAIR", true};

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 16;  // the MMA's M
constexpr int kBlockK = 32;       // the MMA's K and both operands' scale block
constexpr int kRequiredK = 128;   // K multiple: the tile's stage (4 blocks)
// linear.cuh's split_k_slices gives the K slices for this block shape.
static_assert(kSplitKRowsPerWarp == kRowsPerWarp && kSplitKChunk == kBlockK &&
                  kWarps % kSplitKMaxSlices == 0,
              "split_k_slices must match the kernel's rows per warp, K block and warps");

struct DenseArgs {
  const uint8_t* x_codes;   // [rows, k] e4m3, K order
  const uint8_t* x_scales;  // [rows, k / 32] ue8m0 codes
  const uint8_t* weight;    // [n, k] e4m3
  const uint8_t* w_scales;  // [ceil(n / 32), k / 32] ue8m0 codes
  float* out;
  int64_t out_stride;
  int64_t rows;
  int64_t n;
  int64_t k;
  int slices;  // S: K slices of k / 32 / S blocks each
  // A pair launch (linear_fp8_dense_pair; the decode tile only): blocks from second_first_block
  // on compute the second weight [n2, k] of the same x into out2, with the same slices.
  // second_first_block stays past the grid in every other launch.
  const uint8_t* weight2;
  const uint8_t* w_scales2;
  float* out2;
  int64_t out2_stride;
  int64_t n2;
  unsigned second_first_block = ~0u;
};

__device__ __forceinline__ float scale_value(uint8_t code) {
  return deepinfer::cuda::e8m0_to_float(code);
}

// One 32-block's MMA for 16 weight rows x 8 tokens added to a slice's partial: `lo` / `hi` are
// this thread's 8 weight bytes (K [8t, 8t + 8) of the block) of rows g and g + 8, `x` its 8
// activation bytes of token g; x_scale0 / x_scale1 belong to tokens 2t and 2t + 1, the
// accumulator's columns. The one place every kernel does its arithmetic.
__device__ __forceinline__ void mma_block(uint2 lo, uint2 hi, uint2 x, float w_scale,
                                          float x_scale0, float x_scale1, float (&acc)[4]) {
  const uint32_t a[4] = {lo.x, hi.x, lo.y, hi.y};
  float d[4];
  mma_e4m3_from_zero(a, x.x, x.y, d);
  acc[0] += d[0] * (x_scale0 * w_scale);
  acc[1] += d[1] * (x_scale1 * w_scale);
  acc[2] += d[2] * (x_scale0 * w_scale);
  acc[3] += d[3] * (x_scale1 * w_scale);
}

// A decode kernel's summed MMA results: total[0], [1] are weight row n for tokens `token` and
// token + 1, [2], [3] row n + 8; tokens past the call's rows are not stored.
__device__ __forceinline__ void store_mma_totals(const DenseArgs& args, int64_t n, int64_t token,
                                                 const float (&total)[4]) {
  if (token < args.rows) {
    args.out[token * args.out_stride + n] = total[0];
    args.out[token * args.out_stride + n + 8] = total[2];
  }
  if (token + 1 < args.rows) {
    args.out[(token + 1) * args.out_stride + n] = total[1];
    args.out[(token + 1) * args.out_stride + n + 8] = total[3];
  }
}

// ---- decode: K slices over the warps of a block ---------------------------------------------

// Blocks of K loaded ahead per warp (registers of a ring slot: 4 weight words, 2 per token tile,
// and their scale codes).
template <int kTokenTiles>
constexpr int kRingDepth = kTokenTiles == 1 ? 8 : (kTokenTiles == 2 ? 4 : 2);

// Block: 8 warps; a row group's S slices are S consecutive warps (8 / S row groups per block).
// Tokens: tiles of 8 * kTokenTiles per block along grid.y (looped past 65535 tiles).
template <int kTokenTiles>
__global__ void __launch_bounds__(kThreads) split_kernel(DenseArgs args) {
  constexpr int kTokensPerBlock = 8 * kTokenTiles;
  constexpr int kRing = kRingDepth<kTokenTiles>;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;  // MMA row (weights) and column (tokens) of this thread
  const int quad = lane & 3;
  const int slices = args.slices;
  const int64_t row_group = static_cast<int64_t>(blockIdx.x) * (kWarps / slices) + warp / slices;
  const int64_t n_base = row_group * kRowsPerWarp;
  // Warps past the last row group still reach every barrier; they only skip the work.
  const bool active = n_base < args.n;
  const int slice = warp % slices;
  const int64_t k_blocks = args.k / kBlockK;
  const int slice_blocks = static_cast<int>(k_blocks / slices);
  const int64_t block_begin = static_cast<int64_t>(slice) * slice_blocks;
  const uint8_t* w_lo =
      args.weight + (active ? (n_base + group) * args.k : 0) + block_begin * kBlockK + 8 * quad;
  const uint8_t* w_hi = w_lo + (active ? 8 * args.k : 0);
  // Rows n_base .. n_base + 15 lie in one 32-row scale block (n_base is a multiple of 16).
  const uint8_t* w_scale_at =
      args.w_scales + (active ? (n_base / kBlockK) * k_blocks : 0) + block_begin;
  const int64_t rows = args.rows;

  for (int64_t tile = static_cast<int64_t>(blockIdx.y) * kTokensPerBlock; tile < rows;
       tile += static_cast<int64_t>(gridDim.y) * kTokensPerBlock) {
    float acc[kTokenTiles][4] = {};
    if (active) {
      // Tokens past the end load the last row (never stored).
      const uint8_t* x_at[kTokenTiles];
      const uint8_t* x_scale_at[kTokenTiles][2];
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        const int64_t row = min(tile + 8 * j + group, rows - 1);
        x_at[j] = args.x_codes + row * args.k + block_begin * kBlockK + 8 * quad;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int64_t acc_row = min(tile + 8 * j + 2 * quad + c, rows - 1);
          x_scale_at[j][c] = args.x_scales + acc_row * k_blocks + block_begin;
        }
      }
      uint2 w_ring[kRing][2];
      uint8_t w_scale_ring[kRing];
      uint2 x_ring[kRing][kTokenTiles];
      uint8_t x_scale_ring[kRing][kTokenTiles][2];
      auto load = [&](int slot, int block) {
        w_ring[slot][0] = __ldg(reinterpret_cast<const uint2*>(w_lo + block * kBlockK));
        w_ring[slot][1] = __ldg(reinterpret_cast<const uint2*>(w_hi + block * kBlockK));
        w_scale_ring[slot] = __ldg(w_scale_at + block);
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          x_ring[slot][j] = __ldg(reinterpret_cast<const uint2*>(x_at[j] + block * kBlockK));
          x_scale_ring[slot][j][0] = __ldg(x_scale_at[j][0] + block);
          x_scale_ring[slot][j][1] = __ldg(x_scale_at[j][1] + block);
        }
      };
#pragma unroll
      for (int slot = 0; slot < kRing; ++slot) {
        if (slot < slice_blocks) load(slot, slot);
      }
      for (int base = 0; base < slice_blocks; base += kRing) {
#pragma unroll
        for (int slot = 0; slot < kRing; ++slot) {
          const int block = base + slot;
          if (block < slice_blocks) {
            const float w_scale = scale_value(w_scale_ring[slot]);
#pragma unroll
            for (int j = 0; j < kTokenTiles; ++j) {
              mma_block(w_ring[slot][0], w_ring[slot][1], x_ring[slot][j], w_scale,
                        scale_value(x_scale_ring[slot][j][0]),
                        scale_value(x_scale_ring[slot][j][1]), acc[j]);
            }
            if (block + kRing < slice_blocks) load(slot, block + kRing);
          }
        }
      }
    }
    // 0 + P_0 + P_1 + ... in slice order (the prefill tile's additions).
    __shared__ float partials[kWarps][kTokenTiles * 4][32];
    sum_slice_partials(partials, acc, active, slice == 0, slices,
                       [&](int j, const float(&total)[4]) {
                         store_mma_totals(args, n_base + group, tile + 8 * j + 2 * quad, total);
                       });
    __syncthreads();  // partials are rewritten by the next token tile
  }
}

// ---- prefill: shared-memory tiles -----------------------------------------------------------
//
// A block computes 128 weight rows x 64 tokens; its 8 warps are 4 along the rows x 2 along the
// tokens, 32 rows (two MMA row tiles) x 32 tokens (four MMA token tiles) each. Each stage holds
// 128 K: the weight tile's 128 rows and the 64 tokens' codes, 128 bytes each, copied with
// cp.async (16-byte chunk c of row r at chunk c ^ 2 (r % 4), so the 8-byte fragment reads of
// rows r .. r + 3 by a half warp hit 32 different banks), and the stage's scales as floats.

constexpr int kTileRows = 128;
constexpr int kTileTokens = 64;
constexpr int kTileWarpsAlongRows = 4;
constexpr int kTileWarpRows = kTileRows / kTileWarpsAlongRows;                 // 32: one scale row
constexpr int kTileWarpTokens = kTileTokens / (kWarps / kTileWarpsAlongRows);  // 32
constexpr int kTileTokenMmas = kTileWarpTokens / 8;
constexpr int kStepBlocks = kRequiredK / kBlockK;  // 4
constexpr int kStages = 3;
constexpr int kStageRowBytes = kRequiredK;  // 128 e4m3 per weight row or token
constexpr int kScaleRowsPerTile = kTileRows / kBlockK;
constexpr int kStageWeightBytes = kTileRows * kStageRowBytes;
constexpr int kStageCodeBytes = kTileTokens * kStageRowBytes;
constexpr int kCodeOffset = kStageWeightBytes;
constexpr int kWeightScaleOffset = kCodeOffset + kStageCodeBytes;  // [block][scale row] f32
constexpr int kCodeScaleOffset =
    kWeightScaleOffset + kStepBlocks * kScaleRowsPerTile * 4;  // [block][token] f32
constexpr int kStageBytes = kCodeScaleOffset + kStepBlocks * kTileTokens * 4;
constexpr int kTileSmemBytes = kStages * kStageBytes;
// Row tiles walked per group of blocks (token tiles inner): the blocks in flight share a few
// weight tiles and the tokens' codes in L2.
constexpr int kTileGroupRows = 8;
// kAuto takes the tile from this many blocks on (fewer: the 32-token kernel fills the GPU better).
constexpr int64_t kTileMinBlocks = 264;
static_assert(kStageBytes % 16 == 0 && kCodeScaleOffset % 8 == 0, "stages start on 16 bytes");
static_assert(kTileTokens + kScaleRowsPerTile <= kThreads, "one thread per scale word");

// Byte offset of logical byte `offset` (0..127) of stage row `row` (a weight row or a token).
__device__ __forceinline__ int swizzled(int row, int offset) {
  return row * kStageRowBytes + ((((offset >> 4) ^ ((row & 3) << 1))) << 4) + (offset & 15);
}

__global__ void __launch_bounds__(kThreads, 1) prefill_tile_kernel(DenseArgs args) {
  extern __shared__ __align__(128) uint8_t shared[];
  const int row_tiles = static_cast<int>(args.n / kTileRows);
  const int64_t token_tiles = (args.rows + kTileTokens - 1) / kTileTokens;
  // Blocks in groups of kTileGroupRows row tiles, token tiles inner.
  const int64_t item = blockIdx.x;
  const int64_t group_index = item / (kTileGroupRows * token_tiles);
  const int first_row_tile = static_cast<int>(group_index) * kTileGroupRows;
  const int group_rows = min(kTileGroupRows, row_tiles - first_row_tile);
  const int64_t local = item - group_index * kTileGroupRows * token_tiles;
  const int row_tile = first_row_tile + static_cast<int>(local % group_rows);
  const int64_t token_first = (local / group_rows) * kTileTokens;
  const int tokens =
      static_cast<int>(min(static_cast<int64_t>(kTileTokens), args.rows - token_first));

  const int thread = threadIdx.x;
  const int lane = thread & 31;
  const int warp = thread >> 5;
  const int group = lane >> 2;
  const int quad = lane & 3;
  const int warp_row = (warp % kTileWarpsAlongRows) * kTileWarpRows;
  const int warp_token = (warp / kTileWarpsAlongRows) * kTileWarpTokens;
  const int64_t n_first = static_cast<int64_t>(row_tile) * kTileRows;
  const int64_t k_blocks = args.k / kBlockK;
  const int steps = static_cast<int>(args.k / kRequiredK);
  const int slice_blocks = static_cast<int>(k_blocks / args.slices);
  // Tokens past the tile's rows load the last row and are never stored.
  const auto token_row = [&](int token) -> int64_t { return token_first + min(token, tokens - 1); };
  const auto stage_base = [&](int slot) { return shared + slot * kStageBytes; };

  const auto copy_stage = [&](int step, int slot) {
    uint8_t* base = stage_base(slot);
    constexpr int kChunksPerRow = kStageRowBytes / 16;
    for (int chunk = thread; chunk < kTileRows * kChunksPerRow; chunk += kThreads) {
      const int row = chunk / kChunksPerRow;
      const int c = chunk % kChunksPerRow;
      copy_16_async(shared_address(base + swizzled(row, 16 * c)),
                    args.weight + (n_first + row) * args.k +
                        static_cast<int64_t>(step) * kStageRowBytes + 16 * c);
    }
    for (int chunk = thread; chunk < kTileTokens * kChunksPerRow; chunk += kThreads) {
      const int token = chunk / kChunksPerRow;
      const int c = chunk % kChunksPerRow;
      copy_16_async(shared_address(base + kCodeOffset + swizzled(token, 16 * c)),
                    args.x_codes + token_row(token) * args.k +
                        static_cast<int64_t>(step) * kStageRowBytes + 16 * c);
    }
  };
  // The stage's 4 scale codes of this thread's token (threads [0, 64)) or weight scale row (the
  // next 4 threads) as one word; the others load nothing.
  const auto load_scale_codes = [&](int step) -> uint32_t {
    const int64_t block = static_cast<int64_t>(step) * kStepBlocks;
    if (thread < kTileTokens) {
      return __ldg(
          reinterpret_cast<const uint32_t*>(args.x_scales + token_row(thread) * k_blocks + block));
    }
    if (thread < kTileTokens + kScaleRowsPerTile) {
      const int64_t scale_row = n_first / kBlockK + (thread - kTileTokens);
      return __ldg(reinterpret_cast<const uint32_t*>(args.w_scales + scale_row * k_blocks + block));
    }
    return 0;
  };
  const auto store_scales = [&](uint32_t codes, int slot) {
    uint8_t* base = stage_base(slot);
    if (thread < kTileTokens) {
      auto* x_scale = reinterpret_cast<float*>(base + kCodeScaleOffset);
#pragma unroll
      for (int b = 0; b < kStepBlocks; ++b) {
        x_scale[b * kTileTokens + thread] = scale_value(static_cast<uint8_t>(codes >> (8 * b)));
      }
    } else if (thread < kTileTokens + kScaleRowsPerTile) {
      auto* w_scale = reinterpret_cast<float*>(base + kWeightScaleOffset);
#pragma unroll
      for (int b = 0; b < kStepBlocks; ++b) {
        w_scale[b * kScaleRowsPerTile + thread - kTileTokens] =
            scale_value(static_cast<uint8_t>(codes >> (8 * b)));
      }
    }
  };

  const bool warp_has_tokens = warp_token < tokens;
  // acc: the current slice's partial; total: 0 + P_0 + P_1 + ... (the decode kernels' sums).
  float acc[2][kTileTokenMmas][4] = {};
  float total[2][kTileTokenMmas][4] = {};

  const auto compute_stage = [&](int slot, int step) {
    const uint8_t* base = stage_base(slot);
    const uint8_t* codes = base + kCodeOffset;
    const auto* w_scale = reinterpret_cast<const float*>(base + kWeightScaleOffset);
    const auto* x_scale = reinterpret_cast<const float*>(base + kCodeScaleOffset);
#pragma unroll 1
    for (int b = 0; b < kStepBlocks; ++b) {
      const int offset = b * kBlockK + 8 * quad;  // K [8t, 8t + 8) of block b
      const float ws = w_scale[b * kScaleRowsPerTile + warp_row / kBlockK];
      uint2 lo[2];
      uint2 hi[2];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const int row = warp_row + 16 * m + group;
        lo[m] = *reinterpret_cast<const uint2*>(base + swizzled(row, offset));
        hi[m] = *reinterpret_cast<const uint2*>(base + swizzled(row + 8, offset));
      }
#pragma unroll
      for (int j = 0; j < kTileTokenMmas; ++j) {
        const int token = warp_token + 8 * j;
        const uint2 x = *reinterpret_cast<const uint2*>(codes + swizzled(token + group, offset));
        // Tokens 2t and 2t + 1 of the MMA tile (an even index: 8-byte aligned).
        const float2 xs =
            *reinterpret_cast<const float2*>(x_scale + b * kTileTokens + token + 2 * quad);
#pragma unroll
        for (int m = 0; m < 2; ++m) mma_block(lo[m], hi[m], x, ws, xs.x, xs.y, acc[m][j]);
      }
      if ((step * kStepBlocks + b + 1) % slice_blocks == 0) {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
#pragma unroll
          for (int j = 0; j < kTileTokenMmas; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              total[m][j][i] += acc[m][j][i];
              acc[m][j][i] = 0.0f;
            }
          }
        }
      }
    }
  };

  run_stage_pipeline<kStages>(steps, warp_has_tokens, copy_stage, load_scale_codes, store_scales,
                              compute_stage);
  wait_copies<0>();  // nothing in flight when the block exits

#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int64_t n = n_first + warp_row + 16 * m + group;
#pragma unroll
    for (int j = 0; j < kTileTokenMmas; ++j) {
      const int token = warp_token + 8 * j + 2 * quad;
      if (token < tokens) {
        float* out = args.out + (token_first + token) * args.out_stride + n;
        out[0] = total[m][j][0];
        out[8] = total[m][j][2];
      }
      if (token + 1 < tokens) {
        float* out = args.out + (token_first + token + 1) * args.out_stride + n;
        out[0] = total[m][j][1];
        out[8] = total[m][j][3];
      }
    }
  }
}

// ---- decode tile: each warp's weight rows through shared memory ----------------------------
//
// split_kernel takes its weight words straight into registers: per 32-block a quad reads 8 bytes
// of one row and the warp's 8 quads rows a row-length apart (32-byte pieces of 8 lines per load),
// with only a few blocks in flight per warp, far too little to keep HBM busy; its decode calls
// reached about a fifth of the bandwidth. Here, as moe_grouped_gemm's decode tile does for FP4
// experts, each warp streams its own 16 weight rows of its K slice through kDecodeStages
// shared-memory slots of one 4-block chunk (16 rows x 128 bytes: whole 128-byte lines per 8
// lanes, 16-byte cp.async), so (kDecodeStages - 1) x 2 KB per warp are in flight. Only warp-level
// syncs in the stream: the warps of a block share nothing until the slice sums.
//
// Same bits as split_kernel: the same warps own the same rows and K slices, every thread takes
// the same 8 weight bytes per row and block (K [8t, 8t + 8), now read from the swizzled slot),
// the same activation words and the same scale floats, and calls mma_block in the same block
// order, then the same slice sums. The token scale codes become floats once per chunk in a small
// per-warp table (each lane converts one to four) rather than twice per MMA in every thread.

// false: the decode launches take split_kernel again (the path before this one).
RuntimeSwitch kFp8DenseDecodeTileEnabled{"DEEPINFER_FP8_DENSE_DECODE_TILE", true};

// A warp's ring: kDecodeStages chunk slots, kDecodeStages - 1 chunks in flight. 5 and 6 were
// measured on the H100 (2026-12-07, b1 step 2.94 and 2.95 ms against 2.91 at 4): no gain.
constexpr int kDecodeStages = 4;
constexpr int kDecodeChunkBlocks = kRequiredK / kBlockK;           // 4 blocks of 32 K
constexpr int kDecodeRowBytes = kDecodeChunkBlocks * kBlockK;      // a 128-byte line
constexpr int kDecodeStageBytes = kRowsPerWarp * kDecodeRowBytes;  // 2 KB
constexpr int kDecodePiecesPerLane = kDecodeStageBytes / 16 / 32;  // 16-byte copies
// A decode tile kernel's shared memory: per warp its slots, then the chunk's token scales as
// floats, [block][token].
template <int kTokenTiles>
struct DecodeTileSmem {
  static constexpr int kTokenScaleBytes = kDecodeChunkBlocks * 8 * kTokenTiles * 4;
  static constexpr int kWarpBytes = kDecodeStages * kDecodeStageBytes + kTokenScaleBytes;
  static constexpr int kBytes = kWarps * kWarpBytes;
};
static_assert(kDecodeRowBytes == kStageRowBytes, "the slots use the prefill tile's swizzle");
static_assert(DecodeTileSmem<1>::kWarpBytes % 128 == 0 && kDecodeStageBytes % 128 == 0,
              "every slot starts on 128 bytes, where the swizzle is conflict-free");
static_assert(kDecodeStageBytes % (16 * 32) == 0, "each lane copies the same number of pieces");
static_assert(DecodeTileSmem<4>::kBytes + kWarps * 4 * 4 * 32 * 4 <= 227 * 1024,
              "the slots and the slice partials fit one SM");

// split_kernel's grid, warps, K slices and token tiles; chunk c of a warp's slice lives in slot
// c % kDecodeStages, weight row r at row r of the slot with swizzled() (so the 8-byte reads of
// rows r .. r + 3 by a half warp hit 32 different banks). A slice that does not end on a chunk
// (slices of 3, 5 or 10 blocks) copies and computes only its own blocks of the last chunk.
template <int kTokenTiles>
__global__ void __launch_bounds__(kThreads) split_tile_kernel(DenseArgs args) {
  extern __shared__ __align__(128) uint8_t shared[];
  unsigned block_x = blockIdx.x;
  if (block_x >= args.second_first_block) {
    block_x -= args.second_first_block;
    args.weight = args.weight2;
    args.w_scales = args.w_scales2;
    args.out = args.out2;
    args.out_stride = args.out2_stride;
    args.n = args.n2;
  }
  constexpr int kTokens = 8 * kTokenTiles;
  // Token scale codes per chunk, entry e = block * kTokens + token, lane e % 32 loads it.
  constexpr int kScaleEntries = kDecodeChunkBlocks * kTokens;
  constexpr int kEntriesPerLane = kScaleEntries / 32;
  static_assert(kScaleEntries % 32 == 0, "every lane converts the same number of scale codes");
  // At 8 tokens a chunk's activation words and scale codes are loaded one chunk ahead (110
  // registers instead of 74: still two blocks per SM, and every decode grid of the model's
  // shapes fits in two per SM); at 16 tokens that took 156 registers, one block per SM.
  constexpr bool kPrefetchOperands = kTokenTiles == 1;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;  // MMA row (weights) and column (tokens) of this thread
  const int quad = lane & 3;
  const int slices = args.slices;
  const int64_t row_group = static_cast<int64_t>(block_x) * (kWarps / slices) + warp / slices;
  const int64_t n_base = row_group * kRowsPerWarp;
  // Warps past the last row group still reach every barrier; they only skip the work.
  const bool active = n_base < args.n;
  const int slice = warp % slices;
  const int64_t k_blocks = args.k / kBlockK;
  const int slice_blocks = static_cast<int>(k_blocks / slices);
  const int64_t block_begin = static_cast<int64_t>(slice) * slice_blocks;
  const int chunks = (slice_blocks + kDecodeChunkBlocks - 1) / kDecodeChunkBlocks;
  // Row 0 of the warp's 16 at the slice's first byte.
  const uint8_t* weight_rows = args.weight + (active ? n_base * args.k : 0) + block_begin * kBlockK;
  // Rows n_base .. n_base + 15 lie in one 32-row scale block (n_base is a multiple of 16).
  const uint8_t* w_scale_at =
      args.w_scales + (active ? (n_base / kBlockK) * k_blocks : 0) + block_begin;
  uint8_t* warp_shared = shared + warp * DecodeTileSmem<kTokenTiles>::kWarpBytes;
  float* token_scale = reinterpret_cast<float*>(warp_shared + kDecodeStages * kDecodeStageBytes);
  const int64_t rows = args.rows;

  const auto blocks_in = [&](int chunk) {
    return min(kDecodeChunkBlocks, slice_blocks - chunk * kDecodeChunkBlocks);
  };
  const auto copy_chunk = [&](int chunk, int slot) {
    uint8_t* stage = warp_shared + slot * kDecodeStageBytes;
    const int chunk_bytes = blocks_in(chunk) * kBlockK;
#pragma unroll
    for (int i = 0; i < kDecodePiecesPerLane; ++i) {
      const int piece = lane + 32 * i;
      const int row = piece / (kDecodeRowBytes / 16);
      const int offset = 16 * (piece % (kDecodeRowBytes / 16));
      if (offset < chunk_bytes) {
        copy_16_async(
            shared_address(stage + swizzled(row, offset)),
            weight_rows + row * args.k + static_cast<int64_t>(chunk) * kDecodeRowBytes + offset);
      }
    }
  };

  for (int64_t tile = static_cast<int64_t>(blockIdx.y) * kTokens; tile < rows;
       tile += static_cast<int64_t>(gridDim.y) * kTokens) {
    float acc[kTokenTiles][4] = {};
    if (active) {
      __syncwarp();  // every lane is done with the slots and the table of the previous tile
#pragma unroll
      for (int s = 0; s < kDecodeStages - 1; ++s) {
        if (s < chunks) copy_chunk(s, s);
        commit_copies();
      }
    }
    // Launched as a dependent (linear.cuh's decode_pdl_enabled): the weights above are in
    // flight; x's codes, the quantizer's, come from the kernel before this one. Every warp
    // waits here, also those past the last row group, before any store.
    wait_for_prior_grids();
    if (active) {
      // Tokens past the end load the last row (never stored).
      const uint8_t* x_at[kTokenTiles];
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        const int64_t row = min(tile + 8 * j + group, rows - 1);
        x_at[j] = args.x_codes + row * args.k + block_begin * kBlockK + 8 * quad;
      }
      const uint8_t* token_code_at[kEntriesPerLane];
#pragma unroll
      for (int i = 0; i < kEntriesPerLane; ++i) {
        const int e = lane + 32 * i;
        const int64_t row = min(tile + e % kTokens, rows - 1);
        token_code_at[i] = args.x_scales + row * k_blocks + block_begin + e / kTokens;
      }
      // A chunk's operands besides the weights: activation words, weight and token scale codes.
      struct ChunkOperands {
        uint2 x[kDecodeChunkBlocks][kTokenTiles];
        uint8_t w_codes[kDecodeChunkBlocks];
        uint8_t token_codes[kEntriesPerLane];
      };
      const auto load_operands = [&](int chunk) {
        ChunkOperands o;
        const int valid = blocks_in(chunk);
        const int64_t first_block = static_cast<int64_t>(chunk) * kDecodeChunkBlocks;
#pragma unroll
        for (int b = 0; b < kDecodeChunkBlocks; ++b) {
          o.w_codes[b] = b < valid ? __ldg(w_scale_at + first_block + b) : uint8_t{0};
#pragma unroll
          for (int j = 0; j < kTokenTiles; ++j) {
            const auto* word =
                reinterpret_cast<const uint2*>(x_at[j] + (first_block + b) * kBlockK);
            // The activations through L2 only (ld.global.cg), not the non-coherent path: this
            // grid may have started before the kernel that wrote them (a dependent launch), and
            // .nc loads promise data that does not change while the grid runs.
            o.x[b][j] = b < valid ? __ldcg(word) : make_uint2(0u, 0u);
          }
        }
#pragma unroll
        for (int i = 0; i < kEntriesPerLane; ++i) {
          const int block = (lane + 32 * i) / kTokens;
          o.token_codes[i] = block < valid ? __ldcg(token_code_at[i] + first_block) : uint8_t{0};
        }
        return o;
      };
      ChunkOperands next{};
      if constexpr (kPrefetchOperands) next = load_operands(0);
      for (int chunk = 0; chunk < chunks; ++chunk) {
        const int valid = blocks_in(chunk);
        // Loaded before the wait, so their latency hides behind it; prefetched, a chunk early,
        // behind this chunk's wait and MMAs as well.
        ChunkOperands current;
        if constexpr (kPrefetchOperands) {
          current = next;
          if (chunk + 1 < chunks) next = load_operands(chunk + 1);
        } else {
          current = load_operands(chunk);
        }
        wait_copies<kDecodeStages - 2>();
        __syncwarp();  // chunk `chunk` is in; every lane is done with the slot `ahead` reuses
        const int ahead = chunk + kDecodeStages - 1;
        if (ahead < chunks) copy_chunk(ahead, ahead % kDecodeStages);
        commit_copies();
#pragma unroll
        for (int i = 0; i < kEntriesPerLane; ++i) {
          token_scale[lane + 32 * i] = scale_value(current.token_codes[i]);
        }
        __syncwarp();  // the chunk's token scales are written
        const uint8_t* stage = warp_shared + (chunk % kDecodeStages) * kDecodeStageBytes;
#pragma unroll
        for (int b = 0; b < kDecodeChunkBlocks; ++b) {
          if (b < valid) {
            const int offset = b * kBlockK + 8 * quad;  // K [8t, 8t + 8) of block b
            const uint2 lo = *reinterpret_cast<const uint2*>(stage + swizzled(group, offset));
            const uint2 hi = *reinterpret_cast<const uint2*>(stage + swizzled(group + 8, offset));
            const float w_scale = scale_value(current.w_codes[b]);
#pragma unroll
            for (int j = 0; j < kTokenTiles; ++j) {
              // Tokens 2t and 2t + 1 of MMA tile j (an even index: 8-byte aligned).
              const float2 xs =
                  *reinterpret_cast<const float2*>(token_scale + b * kTokens + 8 * j + 2 * quad);
              mma_block(lo, hi, current.x[b][j], w_scale, xs.x, xs.y, acc[j]);
            }
          }
        }
      }
      wait_copies<0>();  // only empty groups are left; nothing in flight past the tile
    }
    // 0 + P_0 + P_1 + ... in slice order, as split_kernel.
    __shared__ float partials[kWarps][kTokenTiles * 4][32];
    sum_slice_partials(partials, acc, active, slice == 0, slices,
                       [&](int j, const float(&total)[4]) {
                         store_mma_totals(args, n_base + group, tile + 8 * j + 2 * quad, total);
                       });
    __syncthreads();  // partials are rewritten by the next token tile
  }
}

// kFp8DenseDecodeTileEnabled unless DEEPINFER_FP8_DENSE_DECODE_TILE=0 (one binary A/Bs the two
// decode kernels on the GPU machine).
bool decode_tile_enabled() {
  return kFp8DenseDecodeTileEnabled.enabled();
}

// ---- host ---------------------------------------------------------------------------------

bool tile_fits(int64_t n) {
  return n % kTileRows == 0;
}

bool weight_fits(const LinearWeight& weight) {
  const TensorView& w = weight.weight;
  const TensorView& s = weight.scale;
  if (w.rank() != 2 || w.dtype() != DType::kF8E4M3 || !w.is_contiguous() || !w.device().is_cuda())
    return false;
  const int64_t n = w.size(0);
  const int64_t k = w.size(1);
  if (n == 0 || k == 0 || n % kRowsPerWarp != 0 || k % kRequiredK != 0) return false;
  if (s.rank() != 2 || s.dtype() != DType::kF8E8M0 || !s.is_contiguous() || !s.device().is_cuda() ||
      s.size(0) != (n + kBlockK - 1) / kBlockK || s.size(1) != k / kBlockK)
    return false;
  return aligned_to(w.raw_data(), 16) && aligned_to(s.raw_data(), 4);
}

template <int kTokenTiles>
void launch_split_tile(const DenseArgs& args, dim3 grid, deepinfer::cuda::StreamHandle stream) {
  static const bool configured = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(split_tile_kernel<kTokenTiles>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       DecodeTileSmem<kTokenTiles>::kBytes));
    return true;
  }();
  (void)configured;
  launch_decode_kernel(split_tile_kernel<kTokenTiles>, grid, kThreads,
                       DecodeTileSmem<kTokenTiles>::kBytes, stream, /*ranks=*/1,
                       decode_pdl_enabled(), args);
}

// The decode launch of `args` (and, where args.weight2 is set, of its second weight: the blocks
// of the first weight's row groups, then the second's).
template <int kTokenTiles>
void launch_split(DenseArgs args, deepinfer::cuda::StreamHandle stream) {
  const unsigned first_blocks = blocks_for(args.n / kRowsPerWarp, kWarps / args.slices);
  const unsigned second_blocks =
      args.weight2 != nullptr ? blocks_for(args.n2 / kRowsPerWarp, kWarps / args.slices) : 0u;
  const dim3 grid(first_blocks + second_blocks,
                  std::min(blocks_for(args.rows, 8 * kTokenTiles), 65535u));
  if (decode_tile_enabled()) {
    args.second_first_block = args.weight2 != nullptr ? first_blocks : ~0u;
    launch_split_tile<kTokenTiles>(args, grid, stream);
    return;
  }
  require(args.weight2 == nullptr, "linear_fp8_dense: a pair launch needs the decode tile");
  split_kernel<kTokenTiles><<<grid, kThreads, 0, stream>>>(args);
  DI_CUDA_LAUNCHED(split_kernel);
}

}  // namespace

bool linear_fp8_dense_enabled() {
  return kFp8DenseEnabled.enabled();
}

bool linear_fp8_dense_tile_enabled() {
  return kFp8DenseTileEnabled.enabled();
}

bool linear_fp8_dense_decode_tile_enabled() {
  return decode_tile_enabled();
}

int linear_fp8_dense_k_slices(int64_t n, int64_t k) {
  // The same rule as linear_bf16_mma's (for the K % 128 == 0 this path takes).
  return split_k_slices(n, k);
}

Fp8DenseLaunch linear_fp8_dense_auto_launch(int64_t rows, int64_t n, int64_t k) {
  (void)k;
  if (rows <= 8) return Fp8DenseLaunch::kTokens8;
  if (rows <= 16) return Fp8DenseLaunch::kTokens16;
  const int64_t tile_blocks = (n / kTileRows) * ((rows + kTileTokens - 1) / kTileTokens);
  if (linear_fp8_dense_tile_enabled() && tile_fits(n) && tile_blocks >= kTileMinBlocks) {
    return Fp8DenseLaunch::kPrefillTile;
  }
  return Fp8DenseLaunch::kTokens32;
}

bool linear_fp8_dense_supports(const LinearWeight& weight) {
  return linear_fp8_dense_enabled() && weight_fits(weight);
}

namespace {

// The checks every entry makes: the weight's form and the shapes of x, weight and out.
void check_call(const TensorView& x, const LinearWeight& weight, const TensorView& out) {
  require(weight_fits(weight),
          "linear_fp8_dense needs an e4m3 weight [N, K] with N % 16 == 0, K % 128 == 0, 16-byte "
          "aligned, and ue8m0 scales [ceil(N / 32), K / 32] 4-byte aligned, got weight ",
          weight.weight.to_string(), ", scale ", weight.scale.to_string());
  const DeviceRows<const float> in = device_rows<const float>(x, "linear_fp8_dense input");
  const DeviceRows<float> o = device_rows<float>(out, "linear_fp8_dense output");
  require(in.cols == weight.weight.size(1) && o.cols == weight.weight.size(0) && o.rows == in.rows,
          "linear_fp8_dense shapes do not match: x ", x.to_string(), ", weight ",
          weight.weight.to_string(), ", out ", out.to_string());
}

// x quantized by the released activation quantizer in K order (the tile's and the decode
// kernels' loads); `codes` and `scales` hold the results for the calls on this stream.
struct QuantizedRows {
  StreamBuffer codes;
  StreamBuffer scales;
  QuantizedRows(DeviceRows<const float> in, int64_t k)
      : codes(static_cast<size_t>(in.rows * k)),
        scales(static_cast<size_t>(in.rows * (k / kBlockK))) {
    quantize_fp8_rows(in, CodeLayout::kNatural, codes.as<uint8_t>(), scales.as<uint8_t>());
  }
};

DenseArgs dense_args(const QuantizedRows& x, int64_t rows, const LinearWeight& weight,
                     const TensorView& out) {
  const DeviceRows<float> o = device_rows<float>(out, "linear_fp8_dense output");
  DenseArgs args{};
  args.x_codes = x.codes.as<uint8_t>();
  args.x_scales = x.scales.as<uint8_t>();
  args.weight = static_cast<const uint8_t*>(weight.weight.raw_data());
  args.w_scales = static_cast<const uint8_t*>(weight.scale.raw_data());
  args.out = o.data;
  args.out_stride = o.stride;
  args.rows = rows;
  args.n = weight.weight.size(0);
  args.k = weight.weight.size(1);
  args.slices = linear_fp8_dense_k_slices(args.n, args.k);
  return args;
}

void launch(const DenseArgs& args, Fp8DenseLaunch launch, deepinfer::cuda::StreamHandle stream) {
  switch (launch) {
    case Fp8DenseLaunch::kTokens8:
      launch_split<1>(args, stream);
      return;
    case Fp8DenseLaunch::kTokens16:
      launch_split<2>(args, stream);
      return;
    case Fp8DenseLaunch::kAuto:  // resolved by the callers
    case Fp8DenseLaunch::kTokens32:
      launch_split<4>(args, stream);
      return;
    case Fp8DenseLaunch::kPrefillTile: {
      static const bool configured = [] {
        DI_CUDA_CHECK(cudaFuncSetAttribute(
            prefill_tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTileSmemBytes));
        return true;
      }();
      (void)configured;
      const int64_t blocks = (args.n / kTileRows) * ((args.rows + kTileTokens - 1) / kTileTokens);
      require(blocks <= INT32_MAX, "linear_fp8_dense: ", args.rows, " rows exceed one launch");
      prefill_tile_kernel<<<static_cast<unsigned>(blocks), kThreads, kTileSmemBytes, stream>>>(
          args);
      DI_CUDA_LAUNCHED(prefill_tile_kernel);
      return;
    }
  }
}

bool is_decode_launch(Fp8DenseLaunch launch) {
  return launch == Fp8DenseLaunch::kTokens8 || launch == Fp8DenseLaunch::kTokens16 ||
         launch == Fp8DenseLaunch::kTokens32;
}

}  // namespace

void linear_fp8_dense(const TensorView& x, const LinearWeight& weight, const TensorView& out,
                      Fp8DenseLaunch launch_kind) {
  check_call(x, weight, out);
  const DeviceRows<const float> in = device_rows<const float>(x, "linear_fp8_dense input");
  const int64_t n = weight.weight.size(0);
  const int64_t k = weight.weight.size(1);
  if (launch_kind == Fp8DenseLaunch::kAuto) {
    launch_kind = linear_fp8_dense_auto_launch(in.rows, n, k);
  }
  require(launch_kind != Fp8DenseLaunch::kPrefillTile || tile_fits(n),
          "linear_fp8_dense: the prefill tile needs N % ", kTileRows, " == 0, got weight ",
          weight.weight.to_string());
  if (in.rows == 0) return;
  const QuantizedRows quantized(in, k);
  launch(dense_args(quantized, in.rows, weight, out), launch_kind, current_stream());
}

bool linear_fp8_dense_pair_fuses(int64_t rows, const LinearWeight& first,
                                 const LinearWeight& second) {
  if (!kFp8DensePair.enabled() || !decode_tile_enabled() || !weight_fits(first) ||
      !weight_fits(second)) {
    return false;
  }
  const int64_t k = first.weight.size(1);
  const int64_t n1 = first.weight.size(0);
  const int64_t n2 = second.weight.size(0);
  const Fp8DenseLaunch kind = linear_fp8_dense_auto_launch(rows, n1, k);
  return second.weight.size(1) == k && is_decode_launch(kind) &&
         kind == linear_fp8_dense_auto_launch(rows, n2, k) &&
         linear_fp8_dense_k_slices(n1, k) == linear_fp8_dense_k_slices(n2, k);
}

void linear_fp8_dense_pair(const TensorView& x, const LinearWeight& first,
                           const TensorView& first_out, const LinearWeight& second,
                           const TensorView& second_out) {
  check_call(x, first, first_out);
  check_call(x, second, second_out);
  const DeviceRows<const float> in = device_rows<const float>(x, "linear_fp8_dense input");
  if (!linear_fp8_dense_pair_fuses(in.rows, first, second)) {
    linear_fp8_dense(x, first, first_out);
    linear_fp8_dense(x, second, second_out);
    return;
  }
  if (in.rows == 0) return;
  const int64_t k = first.weight.size(1);
  const QuantizedRows quantized(in, k);
  DenseArgs args = dense_args(quantized, in.rows, first, first_out);
  const DenseArgs second_args = dense_args(quantized, in.rows, second, second_out);
  args.weight2 = second_args.weight;
  args.w_scales2 = second_args.w_scales;
  args.out2 = second_args.out;
  args.out2_stride = second_args.out_stride;
  args.n2 = second_args.n;
  launch(args, linear_fp8_dense_auto_launch(in.rows, args.n, k), current_stream());
}

}  // namespace deepinfer::ops::cuda
