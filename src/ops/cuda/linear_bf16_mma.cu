// BF16 weights times f32 activations on the tensor cores (mma.sync m16n8k16 bf16 -> f32).
//
// Swap AB, as linear_fp8_mma: 16 weight rows are the MMA's M and 8 tokens its N, so decode's
// 1-16 tokens waste MMA lanes but never weight bytes. Each f32 activation x is split into bf16
// terms, hi = bf16(x), then bf16 of each exact remainder (x - hi, ...), and every term meets the
// same exact bf16 weight fragment in its own MMA: the products are exact, so two terms lose only
// x's remainder below about 2^-16 |x| and three lose nothing (kActivationTerms).
//
// Inside one MMA the K order is ours to choose (both operands just have to agree), so thread t of
// a quad holds K [8t, 8t + 8) of each 32-wide chunk: one 16-byte load per weight row and two
// float4 loads per token. The first MMA of a chunk takes each thread's first four values, the
// second the last four.
//
// Batch invariance: K is cut into S equal slices, S a function of the weight's shape only. A
// slice's partial starts at zero and adds, per 32-chunk in ascending order, the result of the
// chained MMAs of that chunk (every term of both halves, from a zero accumulator); the output
// is 0 + P_0 + P_1 + ... in slice order. Decode spreads a row group's S slices over S warps of
// one block and adds their partials through shared memory in slice order; prefill runs all S
// slices in one warp in the same order. Either way each output is the same sequence of
// operations whatever M, the tile or the other rows. The decode tile and the wide tile below run
// those same per-output operations with their operands staged in shared memory, and so does the
// big tile (256 weight rows a block, 64 a warp), which sums its slices through the output or,
// with the slices on grid.z, through scratch in slice order. Tensor-core results
// of one output element depend only on its weight row and token column (the FP8 kernel's bit-exact
// invariance test on the H200 relies on the same property).
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/fp8_mma.cuh"
#include "ops/cuda/linear.cuh"
#include "ops/cuda/linear_bf16_mma.h"
#include "ops/cuda/linear_cublaslt.h"

namespace deepinfer::ops::cuda {
namespace {

// The path's one switch: false sends every bf16 weight back to the FMA tile kernel.
constexpr bool kBf16MmaEnabled = true;
// bf16 terms per f32 activation in ops::cuda::linear: 3 is exact (f32-like results, as the FMA
// kernel's), 2 keeps x to about 2^-16 (a few 1e-6 of an output's scale) for a third fewer MMAs
// and conversions.
constexpr int kActivationTerms = 3;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 16;  // the MMA's M
constexpr int kChunk = 32;        // K per step: 8 bf16 (16 bytes) per thread per weight row
constexpr int kChunkBytes = kChunk * 2;
// linear.cuh's split_k_slices gives the K slices for this block shape.
static_assert(kSplitKRowsPerWarp == kRowsPerWarp && kSplitKChunk == kChunk &&
                  kWarps % kSplitKMaxSlices == 0,
              "split_k_slices must match the kernel's rows per warp, chunk and warps");
// Prefill (one warp runs all slices, 8 row groups share the block's activations) once it gives
// the GPU at least this many blocks (INT64_MAX: never; the split kernel computes the same bits).
constexpr int64_t kWideMinBlocks = 512;

// Two floats -> bf16x2 (round to nearest even), `low` in bits 0-15 as the MMA's lower-K element.
__device__ __forceinline__ uint32_t pack_bf16x2(float low, float high) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}

// a and b as kTerms bf16 terms each, largest first: term t is bf16 of what the terms before it
// left over (each remainder is exact in f32). Two terms keep a and b to about 2^-16 of their
// magnitude, three exactly (8 + 8 + 8 significand bits cover f32's 24) unless a remainder
// underflows.
template <int kTerms>
__device__ __forceinline__ void split_pair(float a, float b, uint32_t (&terms)[kTerms]) {
#pragma unroll
  for (int t = 0; t < kTerms; ++t) {
    terms[t] = pack_bf16x2(a, b);
    a -= __uint_as_float(terms[t] << 16);
    b -= __uint_as_float(terms[t] & 0xFFFF0000u);
  }
}

// A thread's 8 activations of a chunk (two float4 as raw bits) as kTerms words: word t holds the
// bf16x2 pairs of term t for elements (0, 1), (2, 3) -- the first MMA's B registers -- and
// (4, 5), (6, 7), the second's.
template <int kTerms>
__device__ __forceinline__ void split_eight(uint4 first, uint4 second, uint4 (&terms)[kTerms]) {
  uint32_t pair[4][kTerms];
  split_pair(__uint_as_float(first.x), __uint_as_float(first.y), pair[0]);
  split_pair(__uint_as_float(first.z), __uint_as_float(first.w), pair[1]);
  split_pair(__uint_as_float(second.x), __uint_as_float(second.y), pair[2]);
  split_pair(__uint_as_float(second.z), __uint_as_float(second.w), pair[3]);
#pragma unroll
  for (int t = 0; t < kTerms; ++t)
    terms[t] = make_uint4(pair[0][t], pair[1][t], pair[2][t], pair[3][t]);
}

struct Bf16MmaArgs {
  DeviceRows<const float> x;
  const uint8_t* weight;  // [n, k] bf16
  int64_t row_bytes;
  int64_t n;
  int64_t k;
  int slices;  // S: K slices, each k / S long (a multiple of kChunk)
  DeviceRows<float> out;
  // Pre-split activations (kPreSplit): split_eight's words of row m, chunk c, quad t at
  // [((m * k / kChunk + c) * 4 + t) * kTerms].
  const uint4* x_split;
  // Prefill only: row blocks per group of the block order (0: blockIdx as it comes).
  int group_row_blocks;
  // Decode tile only, grouped linear (linear_grouped): weight rows [g * group_rows, (g + 1) *
  // group_rows) meet x's columns from g * group_x_cols on (k of them). 0: one plain linear.
  int64_t group_rows;
  int64_t group_x_cols;
  // Big tile with the K slices on grid.z only: slice s's partial of output (m, n) at
  // [(s * rows + m) * n_total + n], summed in slice order by sum_slices_kernel.
  float* slice_partials;
  // Decode tile on an fp8 weight (kFp8Weight): `weight` holds e4m3 codes [n, k] and scale the
  // ue8m0 code of rows [r * scale_block_out, ...) and K [32 c, 32 c + 32) at [r * scale_cols + c].
  const uint8_t* scale;
  int64_t scale_cols;
  int64_t scale_block_out;
};

// Prefill's grid is (row blocks, token blocks) and the GPU starts blocks in x-fastest order, so
// every token block sweeps all of the weight before the next starts: a weight larger than L2
// (the LM head, 1.3 GB) is read from HBM once per 32-token block (8 times at batch 256). In
// groups of kWideGroupRowBlocks row blocks (10 MB of a 5120-wide weight) the blocks of one group
// run every token block of those rows back to back, so the group's weights are read from HBM
// once and served from L2 to the other token blocks, while the activations each group reads
// again (6 bytes per value pre-split) stay in L2 as well up to a few hundred rows. Only which
// block computes which tile changes, never an output's operations: same bits.
RuntimeSwitch kGroupWideBlocks{"DEEPINFER_BF16_WIDE_GROUPS", true};
constexpr int kWideGroupRowBlocks = 8;

// kGroupWideBlocks unless DEEPINFER_BF16_WIDE_GROUPS=0.
bool wide_groups_enabled() {
  return kGroupWideBlocks.enabled();
}

// This block's (row block, token block) under the grouped order: linear block id (x fastest) in
// groups of `group_row_blocks` row blocks (the last group holds what is left), each group's ids
// running its row blocks fastest and its token blocks after them. A bijection onto the grid.
__device__ __forceinline__ void wide_block_position(int group_row_blocks, int64_t& row_block,
                                                    int64_t& token_block) {
  row_block = blockIdx.x;
  token_block = blockIdx.y;
  if (group_row_blocks <= 0) return;
  const int64_t id = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  const int64_t per_group = static_cast<int64_t>(group_row_blocks) * gridDim.y;
  const int64_t first_row_block = id / per_group * group_row_blocks;
  const int64_t inner = id % per_group;
  const int64_t rows_in_group = min(static_cast<int64_t>(group_row_blocks),
                                    static_cast<int64_t>(gridDim.x) - first_row_block);
  row_block = first_row_block + inner % rows_in_group;
  token_block = inner / rows_in_group;
}

// Many rows: every row-group block would convert the same activations again, so a first kernel
// splits them once into scratch (6 bytes per value with 3 terms). The words are the same either
// way, so this changes no result. false: always split inside the GEMM.
constexpr bool kPreSplitActivations = true;
constexpr int64_t kPreSplitMinRows = 17;

// One thread per (row, chunk, quad): the 8 values the GEMM's thread `quad` would load.
template <int kTerms>
__global__ void split_activations_kernel(DeviceRows<const float> x, uint4* out, int64_t chunks) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= x.rows * chunks * 4) return;
  const int64_t row = index / (chunks * 4);
  const int64_t chunk_quad = index % (chunks * 4);  // chunk * 4 + quad: 8 floats each
  const uint4* source = reinterpret_cast<const uint4*>(x.row(row) + chunk_quad * 8);
  uint4 terms[kTerms];
  split_eight(__ldg(source), __ldg(source + 1), terms);
#pragma unroll
  for (int t = 0; t < kTerms; ++t) out[index * kTerms + t] = terms[t];
}

// Registers of in-flight chunks per warp (weights and activations loaded this many chunks ahead).
template <int kTokenTiles>
constexpr int kRingDepth = kTokenTiles == 1 ? 8 : (kTokenTiles == 2 ? 4 : 2);

// Block: 8 warps. kSplitSlices (decode): a row group's S slices are S warps of the block (8 / S
// row groups per block); else (prefill) warp w is row group 8 * blockIdx.x + w over all of K.
// Tokens: tiles of 8 * kTokenTiles per block along grid.y (looped past 65535 tiles).
template <int kTokenTiles, bool kSplitSlices, int kTerms, bool kPreSplit>
__global__ void __launch_bounds__(kThreads, 1) bf16_mma_kernel(Bf16MmaArgs args) {
  constexpr int kTokensPerBlock = 8 * kTokenTiles;
  constexpr int kRing = kRingDepth<kTokenTiles>;
  // 16-byte words of a thread's activations per chunk, and between its chunks.
  constexpr int kXWords = kPreSplit ? kTerms : 2;
  constexpr int kXChunkWords = kPreSplit ? 4 * kTerms : kChunk / 4;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;  // MMA row (weights) and column (tokens) of this thread
  const int quad = lane & 3;
  const int slices = args.slices;
  const int warps_per_row_group = kSplitSlices ? slices : 1;
  int64_t row_block = blockIdx.x;
  int64_t token_block = blockIdx.y;
  if constexpr (!kSplitSlices) wide_block_position(args.group_row_blocks, row_block, token_block);
  const int64_t row_group = row_block * (kWarps / warps_per_row_group) + warp / warps_per_row_group;
  const int64_t n_base = row_group * kRowsPerWarp;
  // Warps past the last row group still reach every barrier; they only skip the work.
  const bool active = n_base < args.n;
  const int first_slice = kSplitSlices ? warp % slices : 0;
  const int chunks_per_slice = static_cast<int>(args.k / (kChunk * slices));
  const int chunk_begin = first_slice * chunks_per_slice;
  const int chunk_count = (kSplitSlices ? 1 : slices) * chunks_per_slice;
  const uint8_t* w_lo = args.weight + (active ? (n_base + group) * args.row_bytes : 0) + 16 * quad +
                        static_cast<int64_t>(chunk_begin) * kChunkBytes;
  const uint8_t* w_hi = w_lo + (active ? 8 * args.row_bytes : 0);
  const int64_t rows = args.x.rows;

  for (int64_t tile = token_block * kTokensPerBlock; tile < rows;
       tile += static_cast<int64_t>(gridDim.y) * kTokensPerBlock) {
    // acc: the current slice's partial; total: 0 + P_0 + P_1 + ... (prefill only).
    float acc[kTokenTiles][4] = {};
    float total[kTokenTiles][4] = {};
    if (active) {
      // Tokens past the end load the last row (never stored).
      const uint4* x_at[kTokenTiles];
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        const int64_t row = min(tile + 8 * j + group, rows - 1);
        if constexpr (kPreSplit) {
          x_at[j] = args.x_split + ((row * (args.k / kChunk) + chunk_begin) * 4 + quad) * kTerms;
        } else {
          x_at[j] = reinterpret_cast<const uint4*>(args.x.row(row) + 8 * quad +
                                                   static_cast<int64_t>(chunk_begin) * kChunk);
        }
      }
      uint4 w_ring[kRing][2];
      uint4 x_ring[kRing][kTokenTiles][kXWords];
      auto load = [&](int slot, int chunk) {
        w_ring[slot][0] = __ldg(reinterpret_cast<const uint4*>(w_lo + chunk * kChunkBytes));
        w_ring[slot][1] = __ldg(reinterpret_cast<const uint4*>(w_hi + chunk * kChunkBytes));
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
#pragma unroll
          for (int word = 0; word < kXWords; ++word) {
            x_ring[slot][j][word] = __ldg(x_at[j] + chunk * kXChunkWords + word);
          }
        }
      };
#pragma unroll
      for (int slot = 0; slot < kRing; ++slot) {
        if (slot < chunk_count) load(slot, slot);
      }
      int left_in_slice = chunks_per_slice;
      for (int base = 0; base < chunk_count; base += kRing) {
#pragma unroll
        for (int slot = 0; slot < kRing; ++slot) {
          const int chunk = base + slot;
          if (chunk < chunk_count) {
            // Weight rows g and g + 8, K [8t, 8t + 8) of the chunk: the first MMA takes K
            // [8t, 8t + 4) (registers .x, .y), the second [8t + 4, 8t + 8) (.z, .w).
            const uint4 w_row_lo = w_ring[slot][0];
            const uint4 w_row_hi = w_ring[slot][1];
            const uint32_t a_first[4] = {w_row_lo.x, w_row_hi.x, w_row_lo.y, w_row_hi.y};
            const uint32_t a_second[4] = {w_row_lo.z, w_row_hi.z, w_row_lo.w, w_row_hi.w};
#pragma unroll
            for (int j = 0; j < kTokenTiles; ++j) {
              uint4 terms[kTerms];
              if constexpr (kPreSplit) {
#pragma unroll
                for (int t = 0; t < kTerms; ++t) terms[t] = x_ring[slot][j][t];
              } else {
                split_eight(x_ring[slot][j][0], x_ring[slot][j][1], terms);
              }
              // The chunk's 2 * kTerms MMAs chained from zero, smallest terms first.
              float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
              for (int t = kTerms - 1; t >= 0; --t)
                mma_bf16_m16n8k16(a_first, terms[t].x, terms[t].y, d);
#pragma unroll
              for (int t = kTerms - 1; t >= 0; --t)
                mma_bf16_m16n8k16(a_second, terms[t].z, terms[t].w, d);
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[j][i] += d[i];
            }
            if (chunk + kRing < chunk_count) load(slot, chunk + kRing);
            if (--left_in_slice == 0) {
              left_in_slice = chunks_per_slice;
              if constexpr (!kSplitSlices) {
#pragma unroll
                for (int j = 0; j < kTokenTiles; ++j) {
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
                    total[j][i] += acc[j][i];
                    acc[j][i] = 0.0f;
                  }
                }
              }
            }
          }
        }
      }
    }
    if constexpr (kSplitSlices) {
      // The same additions as prefill's total: 0 + P_0 + P_1 + ... in slice order.
      __shared__ float partials[kWarps][kTokenTiles * 4][32];
      sum_slice_partials(partials, acc, active, first_slice == 0, slices,
                         [&](int j, const float(&sums)[4]) {
                           for (int i = 0; i < 4; ++i) total[j][i] = sums[i];
                         });
      __syncthreads();  // partials are rewritten by the next token tile
    }
    if (active && first_slice == 0) {
      // d[0], d[1]: weight row g, tokens 2t and 2t + 1; d[2], d[3]: row g + 8, same tokens.
      const int64_t n = n_base + group;
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        const int64_t token = tile + 8 * j + 2 * quad;
        if (token < rows) {
          args.out.row(token)[n] = total[j][0];
          args.out.row(token)[n + 8] = total[j][2];
        }
        if (token + 1 < rows) {
          args.out.row(token + 1)[n] = total[j][1];
          args.out.row(token + 1)[n + 8] = total[j][3];
        }
      }
    }
  }
}

// ---- wide tile: prefill's operands shared through shared memory -------------------------------
//
// bf16_mma_kernel<4, false, kTerms, true> gives each warp 16 weight rows and 32 tokens: per
// 32-chunk it loads 3 x 16 bytes of pre-split activation terms per token tile from L1 for 24 MMAs,
// every warp of the block the same 6 KB, with two chunks in flight and 200 registers (one block
// of 8 warps per SM): the LM head at batch 256 ran at about 117 TFLOP/s of MMAs, latency- and
// L1-bound. Here a block stages 128 weight rows and 64 tokens' activation terms per chunk in
// shared memory (16-byte cp.async, kWideStages chunks in flight) and each warp computes 32 rows x
// 32 tokens from them: every 16-byte activation read feeds two row groups' MMAs, every weight
// read four token tiles', half the shared-memory bytes per MMA. (Up to 64 rows the block takes
// 32 tokens, 16 per warp.) With 3 terms a token's 192 bytes put the quarter-warp's reads
// (tokens 2i, 2i + 1, quads 0-3) on 8 different 16-byte bank groups: no conflicts.
//
// Same bits as that kernel: thread (g, t) reads the same 16 weight bytes (rows g and g + 8 of its
// row group, K [8t, 8t + 8) of the chunk) and the same pre-split words, chains the same MMAs from
// zero per chunk, adds them to the slice partial in ascending K and the partials to the total
// (0 + P_0 + P_1 + ...) at the same slice ends. Only which warp computes which output changes.

// false: prefill takes bf16_mma_kernel<4, false, ...> again (the path before this one).
RuntimeSwitch kUseWideTile{"DEEPINFER_BF16_WIDE_TILE", true};

// kUseWideTile unless DEEPINFER_BF16_WIDE_TILE=0.
bool wide_tile_enabled() {
  return kUseWideTile.enabled();
}

constexpr int kWideRows = kWarps * kRowsPerWarp;  // 128: the register kernel's row block
constexpr int kWideWarpRowGroups = 2;             // 32 rows per warp
constexpr int kWideRowWarps = kWideRows / (kRowsPerWarp * kWideWarpRowGroups);  // 4
constexpr int kWideTokenWarps = kWarps / kWideRowWarps;                         // 2
constexpr int kWideStages = 5;
constexpr int kWideWeightBytes = kWideRows * kChunkBytes;  // a stage's weights, [row][64 bytes]
// 32 tokens a block from 17 to 64 rows (16 per warp: no MMA spent on tokens past the end at
// 32), 64 beyond (32 per warp: each weight read feeds four token tiles).
constexpr int64_t kWideLargeTokensFrom = 65;

// A stage's activation terms, [token][quad][term] 16-byte words: the pre-split layout of one
// chunk, token after token.
template <int kTerms>
constexpr int kWideTokenBytes = 4 * kTerms * 16;
template <int kTerms, int kBlockTokens>
constexpr int kWideStageBytes = kWideWeightBytes + kBlockTokens* kWideTokenBytes<kTerms>;
template <int kTerms, int kBlockTokens>  // 100 KB with 3 terms and 64 tokens
constexpr int kWideSmemBytes = kWideStages* kWideStageBytes<kTerms, kBlockTokens>;

// Block: 128 weight rows (the row block of bf16_mma_kernel's prefill, in the same grouped order)
// times kBlockTokens tokens (grid.y, looped past 65535 blocks); warp w computes rows
// 32 (w % 4) + [0, 32) and the (w / 4)-th half of the tokens over all of K.
template <int kTerms, int kBlockTokens>
__global__ void __launch_bounds__(kThreads, 1) bf16_wide_tile_kernel(Bf16MmaArgs args) {
  extern __shared__ __align__(128) uint8_t wide_shared[];
  constexpr int kWideTokens = kBlockTokens;
  constexpr int kWideWarpTokenTiles = kBlockTokens / (8 * kWideTokenWarps);
  static_assert(kWideWarpTokenTiles * 8 * kWideTokenWarps == kBlockTokens, "whole token tiles");
  constexpr int kTokenBytes = kWideTokenBytes<kTerms>;
  constexpr int kStageBytes = kWideStageBytes<kTerms, kBlockTokens>;
  constexpr int kWeightPieces = kWideRows * kChunkBytes / 16;
  constexpr int kTokenPieces = kWideTokens * kTokenBytes / 16;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;
  const int quad = lane & 3;
  int64_t row_block = blockIdx.x;
  int64_t token_block = blockIdx.y;
  wide_block_position(args.group_row_blocks, row_block, token_block);
  const int64_t block_row = row_block * kWideRows;
  const int warp_row = (warp % kWideRowWarps) * kRowsPerWarp * kWideWarpRowGroups;
  const int warp_token = (warp / kWideRowWarps) * 8 * kWideWarpTokenTiles;
  const int chunks = static_cast<int>(args.k / kChunk);
  const int chunks_per_slice = chunks / args.slices;
  const int64_t rows = args.x.rows;
  const uint32_t shared_base = shared_address(wide_shared);

  for (int64_t tile = token_block * kWideTokens; tile < rows;
       tile += static_cast<int64_t>(gridDim.y) * kWideTokens) {
    // Rows past n copy the last weight row and tokens past the end the last token (never stored).
    const auto copy_stage = [&](int chunk, int slot) {
      const uint32_t stage = shared_base + slot * kStageBytes;
      for (int piece = threadIdx.x; piece < kWeightPieces; piece += kThreads) {
        const int row = piece / (kChunkBytes / 16);
        const int part = piece % (kChunkBytes / 16);
        const int64_t n = min(block_row + row, args.n - 1);
        copy_16_async(stage + piece * 16, args.weight + n * args.row_bytes +
                                              static_cast<int64_t>(chunk) * kChunkBytes +
                                              part * 16);
      }
      for (int piece = threadIdx.x; piece < kTokenPieces; piece += kThreads) {
        const int token = piece / (kTokenBytes / 16);
        const int part = piece % (kTokenBytes / 16);
        const int64_t m = min(tile + token, rows - 1);
        copy_16_async(stage + kWideWeightBytes + piece * 16,
                      args.x_split + (m * chunks + chunk) * 4 * kTerms + part);
      }
    };
    // acc: the current slice's partial; total: 0 + P_0 + P_1 + ...
    float acc[kWideWarpRowGroups][kWideWarpTokenTiles][4] = {};
    float total[kWideWarpRowGroups][kWideWarpTokenTiles][4] = {};
    const auto compute_stage = [&](int slot, int chunk) {
      const uint8_t* stage = wide_shared + slot * kStageBytes;
      uint32_t a_first[kWideWarpRowGroups][4];
      uint32_t a_second[kWideWarpRowGroups][4];
#pragma unroll
      for (int r = 0; r < kWideWarpRowGroups; ++r) {
        // bf16_mma_kernel's w_ring words: rows g and g + 8 of the row group, K [8t, 8t + 8).
        const uint8_t* lo = stage + (warp_row + kRowsPerWarp * r + group) * kChunkBytes + 16 * quad;
        const uint4 w_row_lo = *reinterpret_cast<const uint4*>(lo);
        const uint4 w_row_hi = *reinterpret_cast<const uint4*>(lo + 8 * kChunkBytes);
        a_first[r][0] = w_row_lo.x;
        a_first[r][1] = w_row_hi.x;
        a_first[r][2] = w_row_lo.y;
        a_first[r][3] = w_row_hi.y;
        a_second[r][0] = w_row_lo.z;
        a_second[r][1] = w_row_hi.z;
        a_second[r][2] = w_row_lo.w;
        a_second[r][3] = w_row_hi.w;
      }
#pragma unroll
      for (int j = 0; j < kWideWarpTokenTiles; ++j) {
        // Token 8j + g's pre-split words of quad t: the register kernel's x_ring words.
        const uint4* words = reinterpret_cast<const uint4*>(
            stage + kWideWeightBytes + (warp_token + 8 * j + group) * kTokenBytes +
            quad * kTerms * 16);
        uint4 terms[kTerms];
#pragma unroll
        for (int t = 0; t < kTerms; ++t) terms[t] = words[t];
#pragma unroll
        for (int r = 0; r < kWideWarpRowGroups; ++r) {
          float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int t = kTerms - 1; t >= 0; --t)
            mma_bf16_m16n8k16(a_first[r], terms[t].x, terms[t].y, d);
#pragma unroll
          for (int t = kTerms - 1; t >= 0; --t)
            mma_bf16_m16n8k16(a_second[r], terms[t].z, terms[t].w, d);
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[r][j][i] += d[i];
        }
      }
      if ((chunk + 1) % chunks_per_slice == 0) {
#pragma unroll
        for (int r = 0; r < kWideWarpRowGroups; ++r) {
#pragma unroll
          for (int j = 0; j < kWideWarpTokenTiles; ++j) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              total[r][j][i] += acc[r][j][i];
              acc[r][j][i] = 0.0f;
            }
          }
        }
      }
    };
    run_stage_pipeline<kWideStages>(
        chunks, true, copy_stage, [](int) { return 0u; }, [](uint32_t, int) {}, compute_stage);
    __syncthreads();  // every warp is done with the slots before the next token tile's copies
#pragma unroll
    for (int r = 0; r < kWideWarpRowGroups; ++r) {
      const int64_t n_base = block_row + warp_row + kRowsPerWarp * r;
      if (n_base >= args.n) continue;
      const int64_t n = n_base + group;
#pragma unroll
      for (int j = 0; j < kWideWarpTokenTiles; ++j) {
        // d[0], d[1]: weight row g, tokens 2t and 2t + 1; d[2], d[3]: row g + 8, same tokens.
        const int64_t token = tile + warp_token + 8 * j + 2 * quad;
        if (token < rows) {
          args.out.row(token)[n] = total[r][j][0];
          args.out.row(token)[n + 8] = total[r][j][2];
        }
        if (token + 1 < rows) {
          args.out.row(token + 1)[n] = total[r][j][1];
          args.out.row(token + 1)[n + 8] = total[r][j][3];
        }
      }
    }
  }
}

// One wide tile launch; the first of each instance allows its dynamic shared memory.
template <int kTerms, int kBlockTokens>
void launch_wide_tile(const Bf16MmaArgs& args, int64_t row_groups, int64_t rows,
                      cudaStream_t stream) {
  constexpr auto kernel = bf16_wide_tile_kernel<kTerms, kBlockTokens>;
  constexpr int kSmemBytes = kWideSmemBytes<kTerms, kBlockTokens>;
  static const bool allowed = [] {
    DI_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)allowed;
  const dim3 grid(blocks_for(row_groups, kWarps), std::min(blocks_for(rows, kBlockTokens), 65535u));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(args);
  DI_CUDA_LAUNCHED(bf16_wide_tile_kernel);
}

// ---- big tile: 256 weight rows x 32 or 64 tokens, 64 x 16-32 per warp ------------------------
//
// The wide tile above still reads 16 bytes of shared memory per 1.5 MMAs per warp (per 32-chunk:
// 4 weight and 12 activation 16-byte reads for 48 MMAs, plus 20 KB of cp.async writes per block),
// so at 64-256 rows of the LM head its 8 warps spend about as long in shared-memory wavefronts
// (~670 a chunk) as in MMAs (~660 at mma.sync's H200 rate), and with one barrier per 32-chunk all
// warps do the two in lockstep instead of overlapping them: measured ~2000 cycles a chunk, about
// 180 TFLOP/s of MMAs. Here each warp holds 4 row groups (64 rows) of weight fragments against 2
// or 4 token tiles: per chunk 8 weight and 6-12 activation reads feed 48-96 MMAs (107 bytes per
// MMA at 4 tiles instead of 171); a stage holds two chunks (one 128-byte line per weight row,
// half the barriers, and two chunks of straight-line code the compiler can interleave); 256 rows
// a block halve how often the activations are copied per weight byte. The slice totals
// (0 + P_0 + P_1 + ...) go through the output itself: at each slice end a thread adds its
// partial to what it stored at the previous one (slice 0: to 0), the same f32 additions without
// 64 registers of totals; only the thread that computes an output ever touches it.
//
// Same bits as bf16_mma_kernel<4, false, kTerms, true> and the wide tile: thread (g, t) reads the
// same 16 weight bytes per row pair and chunk (rows g and g + 8 of a row group, K [8t, 8t + 8)),
// the same pre-split words, chains the same 2 * kTerms MMAs from zero per chunk, adds them to the
// slice partial in ascending K and the partials in slice order. Only which warp computes which
// output changes. Taken where N is a multiple of 256 (no rows past N) and K of 64 (whole stages).

// false: prefill takes the wide tile again (the path before this one).
RuntimeSwitch kUseBigTile{"DEEPINFER_BF16_BIG_TILE", true};

// kUseBigTile unless DEEPINFER_BF16_BIG_TILE=0.
bool big_tile_enabled() {
  return kUseBigTile.enabled();
}

constexpr int kBigWarpRowGroups = 4;  // 64 rows per warp
constexpr int kBigRowWarps = 4;
constexpr int kBigTokenWarps = kWarps / kBigRowWarps;                      // 2
constexpr int kBigRows = kBigRowWarps * kBigWarpRowGroups * kRowsPerWarp;  // 256
constexpr int kBigStageChunks = 2;
constexpr int kBigRowStageBytes = kBigStageChunks * kChunkBytes;  // 128: one line per weight row
constexpr int kBigStages = 3;
constexpr int kBigWeightBytes = kBigRows * kBigRowStageBytes;  // 32 KB a stage
// The same 10 MB of weight rows per group of the grouped block order as the wide tile's.
constexpr int kBigGroupRowBlocks = kWideGroupRowBlocks * kWideRows / kBigRows;
// Token tiles per warp: 2 (32 tokens a block) up to this many rows, 4 (64) beyond, so at 33-64
// rows one block column covers every token and each weight byte leaves L2 once.
constexpr int64_t kBigSmallTokensUpTo = 32;
static_assert(kBigRowStageBytes == 128, "the weight swizzle assumes 8 pieces per row");

// A token's 16-byte activation words per stage: kBigStageChunks chunks of 4 quads x kTerms terms,
// contiguous in the pre-split scratch.
template <int kTerms>
constexpr int kBigTokenWords = kBigStageChunks * 4 * kTerms;
template <int kTerms, int kBlockTokens>
constexpr int kBigStageBytes = kBigWeightBytes + kBlockTokens* kBigTokenWords<kTerms> * 16;
template <int kTerms, int kBlockTokens>  // 168 KB with 3 terms and 64 tokens
constexpr int kBigSmemBytes = kBigStages* kBigStageBytes<kTerms, kBlockTokens>;
static_assert(kBigSmemBytes<3, 64> <= 227 * 1024, "stages fit the H200's shared memory");

// Weight row r's 16-byte piece p (p < 4: the stage's first chunk) within a stage: odd rows swap
// their chunks, so a quarter-warp's reads (rows 2i and 2i + 1, pieces 4h + t) cover all 32 banks.
__device__ __forceinline__ int big_weight_offset(int row, int piece) {
  return row * kBigRowStageBytes + ((piece ^ ((row & 1) << 2)) << 4);
}

// Token m's activation word w (chunk h = w / (4 kTerms), quad, term) within the token's stage
// words, swizzled so a quarter-warp's reads (tokens 2i and 2i + 1, quads 0-3, one term) hit 8
// different 16-byte bank groups: with 3 terms (24 words, 384 bytes a token) odd tokens swap their
// chunks (192 bytes: 4 bank groups over); with 2 (16 words, 256 bytes) they swap word pairs.
template <int kTerms>
__device__ __forceinline__ int big_token_word(int token, int word) {
  constexpr int kWords = kBigTokenWords<kTerms>;
  if constexpr (kTerms == 3) {
    return (token & 1) ? (word + kWords / 2) % kWords : word;
  } else {
    return word ^ (token & 1);
  }
}

// Block: 256 weight rows (grid.x, grouped order as the wide tile) times kBlockTokens tokens
// (grid.y, looped past 65535); warp w computes rows 64 (w % 4) + [0, 64) and the (w / 4)-th half
// of the tokens over all of K, or with kGridSlices over K slice blockIdx.z only, its partial
// stored for sum_slices_kernel.
template <int kTerms, int kWarpTokenTiles, bool kGridSlices>
__global__ void __launch_bounds__(kThreads, 1) bf16_big_tile_kernel(Bf16MmaArgs args) {
  extern __shared__ __align__(128) uint8_t big_shared[];
  constexpr int kBlockTokens = kBigTokenWarps * 8 * kWarpTokenTiles;
  constexpr int kTokenWords = kBigTokenWords<kTerms>;
  constexpr int kTokenBytes = kTokenWords * 16;
  constexpr int kStageBytes = kBigStageBytes<kTerms, kBlockTokens>;
  constexpr int kWeightPiecesPerThread = kBigRows * (kBigRowStageBytes / 16) / kThreads;  // 8
  constexpr int kTokenPieces = kBlockTokens * kTokenWords;
  constexpr int kTokenPiecesPerThread = (kTokenPieces + kThreads - 1) / kThreads;
  static_assert(kWeightPiecesPerThread * kThreads == kBigRows * (kBigRowStageBytes / 16),
                "whole weight pieces per thread");
  // A thread's weight pieces: rows threadIdx.x / 8 + 32 i, piece threadIdx.x % 8.
  static_assert(kThreads % (kBigRowStageBytes / 16) == 0, "one piece column per thread");
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;
  const int quad = lane & 3;
  int64_t row_block = blockIdx.x;
  int64_t token_block = blockIdx.y;
  wide_block_position(args.group_row_blocks, row_block, token_block);
  const int64_t block_row = row_block * kBigRows;
  const int warp_row = (warp % kBigRowWarps) * kBigWarpRowGroups * kRowsPerWarp;
  const int warp_token = (warp / kBigRowWarps) * 8 * kWarpTokenTiles;
  const int chunks = static_cast<int>(args.k / kChunk);
  const int chunks_per_slice = chunks / args.slices;
  // kGridSlices: this block's slice (whole stages: the launch checks chunks_per_slice is even).
  const int first_stage =
      kGridSlices ? static_cast<int>(blockIdx.z) * (chunks_per_slice / kBigStageChunks) : 0;
  const int stages = (kGridSlices ? chunks_per_slice : chunks) / kBigStageChunks;
  const int64_t rows = args.x.rows;
  const uint32_t shared_base = shared_address(big_shared);

  // The weight pieces this thread copies each stage (N % 256 == 0: every row exists).
  const int weight_piece = threadIdx.x % (kBigRowStageBytes / 16);
  const int weight_row = threadIdx.x / (kBigRowStageBytes / 16);
  constexpr int kWeightRowStep = kThreads / (kBigRowStageBytes / 16);  // 32
  const uint8_t* weight_source =
      args.weight + (block_row + weight_row) * args.row_bytes + weight_piece * 16;
  const int64_t weight_row_step = kWeightRowStep * args.row_bytes;
  const uint32_t weight_target = big_weight_offset(weight_row, weight_piece);
  static_assert(kWeightRowStep % 2 == 0, "the stepped rows keep the first row's swizzle");

  for (int64_t tile = token_block * kBlockTokens; tile < rows;
       tile += static_cast<int64_t>(gridDim.y) * kBlockTokens) {
    // Activation scratch from the tile's first token; tokens past the end copy the last token
    // (never stored).
    const uint4* tile_source = args.x_split + tile * chunks * 4 * kTerms;
    const int last_tile_token =
        static_cast<int>(min(rows - 1 - tile, static_cast<int64_t>(kBlockTokens - 1)));
    const auto copy_stage = [&](int stage, int slot) {
      const uint32_t slot_address = shared_base + slot * kStageBytes;
      const uint8_t* source =
          weight_source + static_cast<int64_t>(first_stage + stage) * kBigRowStageBytes;
#pragma unroll
      for (int i = 0; i < kWeightPiecesPerThread; ++i) {
        copy_16_async(slot_address + weight_target + i * kWeightRowStep * kBigRowStageBytes,
                      source + i * weight_row_step);
      }
      const uint4* stage_source = tile_source + (first_stage + stage) * kTokenWords;
      // Recomputed per stage rather than kept: the registers go to the MMA operands.
#pragma unroll
      for (int i = 0; i < kTokenPiecesPerThread; ++i) {
        const int piece = threadIdx.x + kThreads * i;
        if (kTokenPieces % kThreads == 0 || piece < kTokenPieces) {
          const int token = piece / kTokenWords;
          const int word = piece % kTokenWords;
          copy_16_async(slot_address + kBigWeightBytes +
                            (token * kTokenWords + big_token_word<kTerms>(token, word)) * 16,
                        stage_source + min(token, last_tile_token) * chunks * 4 * kTerms + word);
        }
      }
    };
    // The current slice's partials, [row group][token tile].
    float acc[kBigWarpRowGroups][kWarpTokenTiles][4] = {};
    // Slice s's end: the output becomes (its value at slice s - 1, or 0) + acc, acc restarts.
    const auto end_slice = [&](int slice) {
#pragma unroll
      for (int r = 0; r < kBigWarpRowGroups; ++r) {
        const int64_t n = block_row + warp_row + kRowsPerWarp * r + group;
#pragma unroll
        for (int j = 0; j < kWarpTokenTiles; ++j) {
          // acc[r][j][0], [1]: weight row g, tokens 2t and 2t + 1; [2], [3]: row g + 8.
          const int64_t token = tile + warp_token + 8 * j + 2 * quad;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int64_t m = token + (i & 1);
            if (m < rows) {
              if constexpr (kGridSlices) {
                args.slice_partials[(slice * rows + m) * args.n + n + 8 * (i >> 1)] = acc[r][j][i];
              } else {
                float* target = args.out.row(m) + n + 8 * (i >> 1);
                *target = (slice == 0 ? 0.0f : *target) + acc[r][j][i];
              }
            }
            acc[r][j][i] = 0.0f;
          }
        }
      }
    };
    const auto compute_stage = [&](int slot, int stage) {
      const uint8_t* stage_bytes = big_shared + slot * kStageBytes;
#pragma unroll 1
      for (int half = 0; half < kBigStageChunks; ++half) {
        // bf16_mma_kernel's w_ring words: rows g and g + 8 of each row group, K [8t, 8t + 8).
        uint32_t a_first[kBigWarpRowGroups][4];
        uint32_t a_second[kBigWarpRowGroups][4];
#pragma unroll
        for (int r = 0; r < kBigWarpRowGroups; ++r) {
          const int row = warp_row + kRowsPerWarp * r + group;
          const uint4 w_row_lo = *reinterpret_cast<const uint4*>(
              stage_bytes + big_weight_offset(row, 4 * half + quad));
          const uint4 w_row_hi = *reinterpret_cast<const uint4*>(
              stage_bytes + big_weight_offset(row + 8, 4 * half + quad));
          a_first[r][0] = w_row_lo.x;
          a_first[r][1] = w_row_hi.x;
          a_first[r][2] = w_row_lo.y;
          a_first[r][3] = w_row_hi.y;
          a_second[r][0] = w_row_lo.z;
          a_second[r][1] = w_row_hi.z;
          a_second[r][2] = w_row_lo.w;
          a_second[r][3] = w_row_hi.w;
        }
#pragma unroll
        for (int j = 0; j < kWarpTokenTiles; ++j) {
          // Token 8j + g's pre-split words of quad t: the register kernel's x_ring words.
          const int token = warp_token + 8 * j + group;
          const uint8_t* token_bytes = stage_bytes + kBigWeightBytes + token * kTokenBytes;
          uint4 terms[kTerms];
#pragma unroll
          for (int t = 0; t < kTerms; ++t) {
            terms[t] = *reinterpret_cast<const uint4*>(
                token_bytes + big_token_word<kTerms>(token, (half * 4 + quad) * kTerms + t) * 16);
          }
#pragma unroll
          for (int r = 0; r < kBigWarpRowGroups; ++r) {
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int t = kTerms - 1; t >= 0; --t)
              mma_bf16_m16n8k16(a_first[r], terms[t].x, terms[t].y, d);
#pragma unroll
            for (int t = kTerms - 1; t >= 0; --t) {
              mma_bf16_m16n8k16(a_second[r], terms[t].z, terms[t].w, d);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][j][i] += d[i];
          }
        }
        const int chunk = (first_stage + stage) * kBigStageChunks + half;
        if ((chunk + 1) % chunks_per_slice == 0) end_slice(chunk / chunks_per_slice);
      }
    };
    run_stage_pipeline<kBigStages>(
        stages, true, copy_stage, [](int) { return 0u; }, [](uint32_t, int) {}, compute_stage);
    __syncthreads();  // every warp is done with the slots before the next token tile's copies
  }
}

// The big tile's slice partials in slice order, 0 + P_0 + P_1 + ... (the other kernels'
// additions), into the output: one thread per output.
__global__ void sum_slices_kernel(const float* partials, int slices, DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t outputs = out.rows * out.cols;
  if (index >= outputs) return;
  float total = 0.0f;
  for (int slice = 0; slice < slices; ++slice) total += partials[slice * outputs + index];
  out.row(index / out.cols)[index % out.cols] = total;
}

// One big tile launch; the first of each instance allows its dynamic shared memory.
// kGridSlices: the K slices on grid.z, partials through `args.slice_partials`, then summed.
template <int kTerms, int kWarpTokenTiles, bool kGridSlices = false>
void launch_big_tile(Bf16MmaArgs args, int64_t rows, cudaStream_t stream) {
  constexpr auto kernel = bf16_big_tile_kernel<kTerms, kWarpTokenTiles, kGridSlices>;
  constexpr int kBlockTokens = kBigTokenWarps * 8 * kWarpTokenTiles;
  constexpr int kSmemBytes = kBigSmemBytes<kTerms, kBlockTokens>;
  static const bool allowed = [] {
    DI_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)allowed;
  if (args.group_row_blocks > 0) args.group_row_blocks = kBigGroupRowBlocks;
  const dim3 grid(static_cast<unsigned>(args.n / kBigRows),
                  std::min(blocks_for(rows, kBlockTokens), 65535u),
                  kGridSlices ? static_cast<unsigned>(args.slices) : 1u);
  if constexpr (kGridSlices) {
    StreamBuffer partials(static_cast<size_t>(args.slices * rows * args.n) * sizeof(float));
    args.slice_partials = partials.as<float>();
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(args);
    DI_CUDA_LAUNCHED(bf16_big_tile_kernel);
    constexpr int kSumThreads = 256;
    sum_slices_kernel<<<blocks_for(rows * args.n, kSumThreads), kSumThreads, 0, stream>>>(
        args.slice_partials, args.slices, args.out);
    DI_CUDA_LAUNCHED(sum_slices_kernel);
  } else {
    kernel<<<grid, kThreads, kSmemBytes, stream>>>(args);
    DI_CUDA_LAUNCHED(bf16_big_tile_kernel);
  }
}

// 9-16 rows of weights of at least this size (the LM head) take the big tile instead of the
// decode tile unless DEEPINFER_BF16_BIG_TILE_DECODE=0 (or the big tile is off). At 16 rows the
// decode tile ran the LM head at 0.69 ms against a 0.29 ms HBM floor (it splits each activation
// into terms in every warp: ~120 instructions a chunk next to 12 MMAs); the big tile's 32-token
// block spends 0.13 PFLOP of MMAs (~0.23 ms at mma.sync's rate) and reads each weight byte once.
// Same bits: the big tile and the decode tile both run the register kernel's operations.
RuntimeSwitch kBigTileDecode{"DEEPINFER_BF16_BIG_TILE_DECODE", true};
constexpr int64_t kBigDecodeMinBytes = int64_t{256} << 20;

bool big_tile_decode_enabled() {
  return kBigTileDecode.enabled();
}

// From 17 rows, calls that give the prefill kernels too few blocks (wo_a, the compressor: 1024 x
// 4096-5120, K in 8 slices, up to about 2000 rows) ran the decode tile with 32 tokens a block, 16
// rows a warp and each slice on its own warp: at 256 rows wo_a's 8 groups took 589 us, 9% of HBM
// and 4% of the tensor cores. The big tile takes them with its slices on grid.z (4 row blocks x
// 4 token blocks x 8 slices = 128 blocks for one wo_a group at 256 rows), each slice's partial
// in scratch and summed in slice order by sum_slices_kernel: the decode tile's additions, the
// same bits. DEEPINFER_BF16_BIG_TILE_SPLIT=0 (or the big tile off): the decode tile.
RuntimeSwitch kBigTileSplit{"DEEPINFER_BF16_BIG_TILE_SPLIT", true};
// 2 token tiles a warp (32 tokens a block) up to this many rows, so a 1024-row weight at 64 rows
// still spreads over 64 blocks; 4 beyond.
constexpr int64_t kBigSplitSmallTokensUpTo = 64;

bool big_tile_split_enabled() {
  return kBigTileSplit.enabled();
}

// Whether the big tile can take this call: whole 256-row blocks and 64-wide stages.
bool big_tile_fits(const Bf16MmaArgs& args) {
  return big_tile_enabled() && args.n % kBigRows == 0 && args.k % (kBigStageChunks * kChunk) == 0;
}

// ---- decode tile: the weight rows through shared memory ---------------------------------------
//
// bf16_mma_kernel's decode instances take their weights straight into a register ring: per chunk
// a quad reads 64 bytes of one row (half a 128-byte line), eight rows a row apart per load
// instruction, and its ring costs as many registers as it keeps in flight, so the block holds the
// SM alone (launch bounds 1) and the LM head at batch 1 ran at about a third of HBM. Here each
// warp streams its own 16 weight rows through kDecodeStages shared-memory slots of two chunks
// (16 rows x 128 bytes: whole lines, 16-byte cp.async, no block barriers in the loop: a warp's
// slots are its own), so (kDecodeStages - 1) x 2 KB per warp are in flight while the registers
// hold only a short activation ring, and two blocks share an SM for one and two token tiles.
//
// Same bits as bf16_mma_kernel<kTokenTiles, true, kTerms, kPreSplit>: thread (g, t) reads from
// shared memory the same 16 bytes of rows g and g + 8 that kernel loads from global memory (K
// [8t, 8t + 8) of the chunk), builds the same A registers, splits (or reads) the same activation
// words, chains the same MMAs from zero per chunk and adds them to the slice partial in the same
// ascending chunk order; the slices are summed by the same sum_slice_partials. The grid, K
// slices and token tiles are that kernel's too, so nothing about a row depends on the batch.

// false: decode takes bf16_mma_kernel's register ring again (the path before this one).
RuntimeSwitch kUseDecodeTile{"DEEPINFER_BF16_DECODE_TILE", true};

// kUseDecodeTile unless DEEPINFER_BF16_DECODE_TILE=0 (one binary A/Bs the two decode paths on
// the GPU machine).
bool decode_tile_enabled() {
  return kUseDecodeTile.enabled();
}

constexpr int kDecodeStageChunks = 2;                               // one 128-byte line per row
constexpr int kDecodeRowBytes = kDecodeStageChunks * kChunkBytes;   // a row's bytes per stage
constexpr int kDecodePieces = kRowsPerWarp * kDecodeRowBytes / 16;  // 16-byte copies per stage
constexpr int kDecodeStageBytes = kRowsPerWarp * kDecodeRowBytes;
constexpr int kDecodeStages = 6;
constexpr int kDecodeWarpBytes = kDecodeStages * kDecodeStageBytes;
constexpr int kDecodeSmemBytes = kWarps * kDecodeWarpBytes;  // 96 KB: two blocks per SM
static_assert(kDecodePieces % 32 == 0, "each lane copies the same number of 16-byte pieces");
static_assert(kDecodeRowBytes == 128, "the swizzle below assumes 8 pieces per row");

// Two blocks per SM with one or two token tiles (their activation rings are small); four tiles
// keep 48 activation registers per chunk in flight with pre-split terms and take the SM alone.
template <int kTokenTiles>
constexpr int kDecodeBlocksPerSm = kTokenTiles <= 2 ? 2 : 1;

// Chunks of activations loaded ahead into registers (a multiple of the stage's chunks, so each
// slot's position in its stage is known at compile time): the activations are L1/L2 hits, but
// with one tile there are registers to spare for a longer look-ahead.
template <int kTokenTiles>
constexpr int kDecodeXSlots = kTokenTiles == 1 ? 4 : 2;

// Byte offset of weight row r's 16-byte piece p (p < 4: the stage's first chunk, K [8p, 8p + 8)
// of it; p >= 4: the second) within a stage. Odd rows swap their halves: a quarter-warp's 16-byte
// reads take rows 2i and 2i + 1, pieces 4h + t (t < 4), which then cover all 32 banks once.
__device__ __forceinline__ int decode_piece_offset(int row, int piece) {
  return row * kDecodeRowBytes + ((piece ^ ((row & 1) << 2)) << 4);
}

// The fp8 stage holds four chunks of 32 one-byte codes per row (the same 128-byte line), piece p
// = K [16p, 16p + 16) of the stage; thread (g, t) reads the 8 bytes K [8t, 8t + 8) of one chunk
// (pieces 2c, 2c + 1). Chunk c of row r sits in 32-byte run c ^ (r % 4) of the row's line, so
// the 16 lanes of a half-warp (rows g..g + 3, all quads) read 4 different runs: 128 bytes on 32
// different banks, one wavefront.
__device__ __forceinline__ int decode_fp8_piece_offset(int row, int piece) {
  return row * kDecodeRowBytes + ((piece ^ ((row & 3) << 1)) << 4);
}

// Two e4m3 weights (the low byte first) times their block's scale as a bf16x2 word: the values
// dequantize_fp8_weight_bf16 writes (e4m3 times a power of two, exact in f32 and in bf16), so
// the MMAs meet the same operands as on the dequantized bf16 weight.
__device__ __forceinline__ uint32_t scaled_e4m3x2_to_bf16x2(uint32_t two_codes, float scale) {
  const float2 pair = deepinfer::cuda::e4m3x2_to_float2(two_codes);
  return pack_bf16x2(pair.x * scale, pair.y * scale);
}

// bf16_mma_kernel<kTokenTiles, true, kTerms, kPreSplit>'s grid and work (8 / S row groups per
// block, a group's S slices on S warps, 8 * kTokenTiles tokens per block along grid.y) with each
// warp's weights streamed through its own shared-memory slots.
//
// kRowGroups == 2: each warp takes two row groups (32 weight rows) of the same K slice, so the
// activations it loads and splits per chunk feed twice the weight bytes (at 16 tokens the
// activations read from L2 otherwise outweigh the weights twice over). Each output is still
// the same MMA chain and additions; the stages hold 32 rows, so there are half as many.
//
// kClusterK (batch invariance off only, linear.cuh's decode_cluster_ranks): the grid's z blocks
// are one cluster whose rank r takes K slices [r S, r S + S) of S x ranks; rank 0 adds the ranks'
// sums in rank order (sum_cluster_slice_partials) and stores them. Other additions, other bits.
//
// kFp8Weight: the weight is e4m3 codes with 32 x 32-style ue8m0 blocks (scale_block_out rows a
// multiple of 16, 32 columns: one scale per row group and chunk); a stage holds four chunks of
// codes (the same 128-byte line per row, half the bytes per K) and each thread converts its 8
// codes per row to the bf16 words the dequantized weight holds: same MMAs, same bits.
template <int kTokenTiles, int kTerms, bool kPreSplit, int kRowGroups, bool kClusterK,
          bool kFp8Weight>
__global__ void __launch_bounds__(kThreads, kDecodeBlocksPerSm<kTokenTiles>)
    bf16_decode_tile_kernel(Bf16MmaArgs args) {
  extern __shared__ __align__(128) uint8_t decode_shared[];
  constexpr int kWarpRows = kRowsPerWarp * kRowGroups;
  constexpr int kPieces = kWarpRows * kDecodeRowBytes / 16;  // 16-byte copies per stage
  constexpr int kStageBytes = kWarpRows * kDecodeRowBytes;
  constexpr int kStages = kDecodeStages / kRowGroups;  // the same 96 KB per block
  constexpr int kWarpBytes = kStages * kStageBytes;
  static_assert(kStages >= 3 && kWarps * kWarpBytes <= kDecodeSmemBytes, "stages fit 96 KB");
  // A weight row's bytes per chunk, and chunks per stage (one 128-byte line per row either way).
  constexpr int kRowChunkBytes = kFp8Weight ? kChunk : kChunkBytes;
  constexpr int kStageChunks = kDecodeRowBytes / kRowChunkBytes;
  constexpr int kPiecesPerChunk = kRowChunkBytes / 16;
  static_assert(!kFp8Weight || (!kPreSplit && kRowGroups == 1), "fp8: the plain decode tile");
  constexpr int kTokensPerBlock = 8 * kTokenTiles;
  constexpr int kTileXSlots = kDecodeXSlots<kTokenTiles>;
  constexpr int kXSlots = kTileXSlots > kStageChunks ? kTileXSlots : kStageChunks;
  static_assert(kXSlots % kStageChunks == 0, "x slots cover whole stages");
  constexpr int kXWords = kPreSplit ? kTerms : 2;
  constexpr int kXChunkWords = kPreSplit ? 4 * kTerms : kChunk / 4;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;
  const int quad = lane & 3;
  const int slices = args.slices;
  const int64_t warp_rows_index =
      static_cast<int64_t>(blockIdx.x) * (kWarps / slices) + warp / slices;
  const int64_t n_base = warp_rows_index * kWarpRows;
  const bool active = n_base < args.n;  // warps past the last row group only reach the barriers
  // Rows of this warp inside the weight (a multiple of 16: a second row group past N is skipped).
  const int64_t warp_rows = active ? min(static_cast<int64_t>(kWarpRows), args.n - n_base) : 0;
  const int first_slice = warp % slices;
  int cluster_rank = 0;
  int cluster_ranks = 1;
  if constexpr (kClusterK) {
    cluster_rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
    cluster_ranks = static_cast<int>(cooperative_groups::this_cluster().num_blocks());
  }
  const int chunk_count = static_cast<int>(args.k / (kChunk * slices * cluster_ranks));
  const int chunk_begin = (cluster_rank * slices + first_slice) * chunk_count;
  const int stage_count = (chunk_count + kStageChunks - 1) / kStageChunks;
  // This warp's 16 rows at its slice's first chunk.
  const uint8_t* w_slice = args.weight + (active ? n_base * args.row_bytes : 0) +
                           static_cast<int64_t>(chunk_begin) * kRowChunkBytes;
  // fp8: the scales of this warp's row group along its slice (one row group: kRowGroups == 1).
  const uint8_t* scale_slice =
      kFp8Weight ? args.scale + (active ? n_base / args.scale_block_out * args.scale_cols : 0) +
                       chunk_begin
                 : nullptr;
  uint8_t* warp_shared = decode_shared + warp * kWarpBytes;
  const uint32_t warp_address = shared_address(warp_shared);
  const int64_t rows = args.x.rows;

  // Stage s: chunks [kStageChunks s, kStageChunks (s + 1)) of the slice, those the slice has.
  const auto copy_stage = [&](int stage) {
    const uint32_t slot = warp_address + (stage % kStages) * kStageBytes;
#pragma unroll
    for (int i = 0; i < kPieces / 32; ++i) {
      const int piece_index = lane + 32 * i;
      const int row = piece_index / (kDecodeRowBytes / 16);
      const int piece = piece_index % (kDecodeRowBytes / 16);
      if (kStageChunks * stage + piece / kPiecesPerChunk < chunk_count && row < warp_rows) {
        copy_16_async(slot + (kFp8Weight ? decode_fp8_piece_offset(row, piece)
                                         : decode_piece_offset(row, piece)),
                      w_slice + row * args.row_bytes +
                          static_cast<int64_t>(stage) * kDecodeRowBytes + piece * 16);
      }
    }
  };

  for (int64_t tile = static_cast<int64_t>(blockIdx.y) * kTokensPerBlock; tile < rows;
       tile += static_cast<int64_t>(gridDim.y) * kTokensPerBlock) {
    float acc[kRowGroups * kTokenTiles][4] = {};  // the slice's partials, [row group][token tile]
    if (active) {
      const uint4* x_at[kTokenTiles];  // tokens past the end load the last row (never stored)
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        const int64_t row = min(tile + 8 * j + group, rows - 1);
        if constexpr (kPreSplit) {
          x_at[j] = args.x_split + ((row * (args.k / kChunk) + chunk_begin) * 4 + quad) * kTerms;
        } else {
          // A grouped linear's row group reads its group's columns (all 16 rows share a group:
          // group_rows is a multiple of 16).
          const int64_t group_columns =
              args.group_rows > 0 ? n_base / args.group_rows * args.group_x_cols : 0;
          x_at[j] = reinterpret_cast<const uint4*>(args.x.row(row) + group_columns + 8 * quad +
                                                   static_cast<int64_t>(chunk_begin) * kChunk);
        }
      }
      uint4 x_ring[kXSlots][kTokenTiles][kXWords];
      const auto load_x = [&](int slot, int chunk) {
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
#pragma unroll
          for (int word = 0; word < kXWords; ++word) {
            // L2 only (ld.global.cg): written by the kernel this dependent launch waited for,
            // while this grid ran; .nc loads promise data that does not change meanwhile.
            x_ring[slot][j][word] = __ldcg(x_at[j] + chunk * kXChunkWords + word);
          }
        }
      };
      __syncwarp();  // every lane is done with the slots of the previous token tile
#pragma unroll
      for (int s = 0; s < kStages - 1; ++s) {
        if (s < stage_count) copy_stage(s);
        commit_copies();
      }
      // Launched as a dependent: the weights above are in flight; the activations below are
      // the kernel before's output.
      wait_for_prior_grids();
#pragma unroll
      for (int slot = 0; slot < kXSlots; ++slot) {
        if (slot < chunk_count) load_x(slot, slot);
      }
      for (int base = 0; base < chunk_count; base += kXSlots) {
#pragma unroll
        for (int slot = 0; slot < kXSlots; ++slot) {
          const int chunk = base + slot;
          if (chunk < chunk_count) {
            const int half = slot % kStageChunks;  // the chunk's place in its stage
            const int stage = chunk / kStageChunks;
            if (half == 0) {
              wait_copies<kStages - 2>();
              __syncwarp();  // stage `stage` is in; every lane is done with the slot refilled
              if (stage + kStages - 1 < stage_count) copy_stage(stage + kStages - 1);
              commit_copies();
            }
            const uint8_t* stage_bytes = warp_shared + (stage % kStages) * kStageBytes;
            // The register kernel's w_ring words: rows g and g + 8 of each row group, K [8t, 8t +
            // 8) of the chunk.
            uint32_t a_first[kRowGroups][4];
            uint32_t a_second[kRowGroups][4];
            if constexpr (kFp8Weight) {
              // K [8t, 8t + 8) of the chunk: piece 2 half + t / 2, its (t % 2)-th 8 bytes.
              const int piece = kPiecesPerChunk * half + (quad >> 1);
              const int byte = (quad & 1) * 8;
              const uint2 lo = *reinterpret_cast<const uint2*>(
                  stage_bytes + decode_fp8_piece_offset(group, piece) + byte);
              const uint2 hi = *reinterpret_cast<const uint2*>(
                  stage_bytes + decode_fp8_piece_offset(group + 8, piece) + byte);
              const float scale = deepinfer::cuda::e8m0_to_float(__ldg(scale_slice + chunk));
              a_first[0][0] = scaled_e4m3x2_to_bf16x2(lo.x, scale);
              a_first[0][1] = scaled_e4m3x2_to_bf16x2(hi.x, scale);
              a_first[0][2] = scaled_e4m3x2_to_bf16x2(lo.x >> 16, scale);
              a_first[0][3] = scaled_e4m3x2_to_bf16x2(hi.x >> 16, scale);
              a_second[0][0] = scaled_e4m3x2_to_bf16x2(lo.y, scale);
              a_second[0][1] = scaled_e4m3x2_to_bf16x2(hi.y, scale);
              a_second[0][2] = scaled_e4m3x2_to_bf16x2(lo.y >> 16, scale);
              a_second[0][3] = scaled_e4m3x2_to_bf16x2(hi.y >> 16, scale);
            }
#pragma unroll
            for (int rg = 0; rg < (kFp8Weight ? 0 : kRowGroups); ++rg) {
              const uint4 w_row_lo = *reinterpret_cast<const uint4*>(
                  stage_bytes + decode_piece_offset(16 * rg + group, 4 * half + quad));
              const uint4 w_row_hi = *reinterpret_cast<const uint4*>(
                  stage_bytes + decode_piece_offset(16 * rg + group + 8, 4 * half + quad));
              a_first[rg][0] = w_row_lo.x;
              a_first[rg][1] = w_row_hi.x;
              a_first[rg][2] = w_row_lo.y;
              a_first[rg][3] = w_row_hi.y;
              a_second[rg][0] = w_row_lo.z;
              a_second[rg][1] = w_row_hi.z;
              a_second[rg][2] = w_row_lo.w;
              a_second[rg][3] = w_row_hi.w;
            }
#pragma unroll
            for (int j = 0; j < kTokenTiles; ++j) {
              uint4 terms[kTerms];
              if constexpr (kPreSplit) {
#pragma unroll
                for (int t = 0; t < kTerms; ++t) terms[t] = x_ring[slot][j][t];
              } else {
                split_eight(x_ring[slot][j][0], x_ring[slot][j][1], terms);
              }
#pragma unroll
              for (int rg = 0; rg < kRowGroups; ++rg) {
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int t = kTerms - 1; t >= 0; --t) {
                  mma_bf16_m16n8k16(a_first[rg], terms[t].x, terms[t].y, d);
                }
#pragma unroll
                for (int t = kTerms - 1; t >= 0; --t) {
                  mma_bf16_m16n8k16(a_second[rg], terms[t].z, terms[t].w, d);
                }
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[rg * kTokenTiles + j][i] += d[i];
              }
            }
            if (chunk + kXSlots < chunk_count) load_x(slot, chunk + kXSlots);
          }
        }
      }
    }
    wait_for_prior_grids();  // warps past the last row group, before any store
    // The register kernel's reduction: 0 + P_0 + P_1 + ... in slice order.
    __shared__ float partials[kWarps][kRowGroups * kTokenTiles * 4][32];
    float total[kRowGroups * kTokenTiles][4] = {};
    const auto keep = [&](int j, const float(&sums)[4]) {
      for (int i = 0; i < 4; ++i) total[j][i] = sums[i];
    };
    if constexpr (kClusterK) {
      sum_cluster_slice_partials(partials, acc, active, first_slice == 0, slices, keep);
    } else {
      sum_slice_partials(partials, acc, active, first_slice == 0, slices, keep);
    }
    __syncthreads();  // partials are rewritten by the next token tile
    if (active && first_slice == 0 && cluster_rank == 0) {
#pragma unroll
      for (int rg = 0; rg < kRowGroups; ++rg) {
        if (16 * rg >= warp_rows) break;
        const int64_t n = n_base + 16 * rg + group;
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          const float(&sums)[4] = total[rg * kTokenTiles + j];
          const int64_t token = tile + 8 * j + 2 * quad;
          if (token < rows) {
            args.out.row(token)[n] = sums[0];
            args.out.row(token)[n + 8] = sums[2];
          }
          if (token + 1 < rows) {
            args.out.row(token + 1)[n] = sums[1];
            args.out.row(token + 1)[n + 8] = sums[3];
          }
        }
      }
    }
  }
}

// One decode tile launch; the first of each instance allows its 96 KB of dynamic shared memory
// (an attribute of the kernel, so one static per instance).
template <int kTokenTiles, int kTerms, bool kPreSplit, int kRowGroups, bool kClusterK,
          bool kFp8Weight>
void allow_decode_tile_smem() {
  static const bool allowed = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(
        bf16_decode_tile_kernel<kTokenTiles, kTerms, kPreSplit, kRowGroups, kClusterK, kFp8Weight>,
        cudaFuncAttributeMaxDynamicSharedMemorySize, kDecodeSmemBytes));
    return true;
  }();
  (void)allowed;
}

// `ranks` > 1: the cluster form, grid.z = ranks (the row groups' K over a cluster's blocks).
template <int kTokenTiles, int kTerms, bool kPreSplit, int kRowGroups = 1, bool kFp8Weight = false>
void launch_decode_tile(const Bf16MmaArgs& args, dim3 grid, cudaStream_t stream, int ranks = 1) {
  if (ranks > 1) {
    constexpr auto kernel =
        bf16_decode_tile_kernel<kTokenTiles, kTerms, kPreSplit, kRowGroups, true, kFp8Weight>;
    allow_decode_tile_smem<kTokenTiles, kTerms, kPreSplit, kRowGroups, true, kFp8Weight>();
    launch_decode_kernel(kernel, dim3(grid.x, grid.y, static_cast<unsigned>(ranks)), kThreads,
                         kDecodeSmemBytes, stream, ranks, decode_pdl_enabled(), args);
    return;
  }
  constexpr auto kernel =
      bf16_decode_tile_kernel<kTokenTiles, kTerms, kPreSplit, kRowGroups, false, kFp8Weight>;
  allow_decode_tile_smem<kTokenTiles, kTerms, kPreSplit, kRowGroups, false, kFp8Weight>();
  launch_decode_kernel(kernel, grid, kThreads, kDecodeSmemBytes, stream, 1, decode_pdl_enabled(),
                       args);
}

// Decode variants for weights of at least kDecodePreSplitMinBytes (the LM head) at 1-16 rows,
// all the same bits, chosen at run time so one binary measures them:
// DEEPINFER_BF16_DECODE_VARIANT = the sum of
//  1: at 1-8 rows the activations come pre-split by split_activations_kernel instead of being
//     split into bf16 terms inside the decode tile (~60 of a warp's ~90 instructions a chunk);
//  2: the same at 9-16 rows (~120 of ~160, next to 12 MMAs; but 6 bytes per value from L2);
//  4: at 9-16 rows each warp takes two row groups, so every activation word it loads (and
//     splits) feeds 32 weight rows: at 16 tokens a warp otherwise reads 2 KB of activations
//     from L1/L2 per 1 KB of weights.
// 0 is round 2's decode tile. Smaller weights (wo_a, gate, compressor) always take 0.
// Measured on the H200 (2026-12-01, whole 7-layer step, ms at b1 / b16): 0 4.10 / 9.61, 1 4.17 /
// 9.61, 4 4.29 / 9.79, 5 4.18 / 9.48 -- within the run-to-run spread of one median of 5 steps, so
// the default stays the plain decode tile.
constexpr int kDefaultDecodeVariant = 0;
constexpr int kDecodeVariants = 8;
constexpr int64_t kDecodePreSplitMinBytes = int64_t{256} << 20;

// Tests loop over the variants in one process with ScopedSetting.
RuntimeSetting kDecodeVariant{"DEEPINFER_BF16_DECODE_VARIANT", kDefaultDecodeVariant, 0,
                              kDecodeVariants - 1};
std::atomic<int64_t> decode_pre_split_min_bytes{kDecodePreSplitMinBytes};

int decode_variant() {
  return kDecodeVariant.value();
}

// One launch for all the groups of a grouped linear (the attention's 8 wo_a groups) unless
// DEEPINFER_BF16_GROUPED=0 (a launch per group, as ops::linear would). Same bits: each row
// group's warp runs the per-group call's operations, only the grid covers every group.
RuntimeSwitch kGroupedLaunch{"DEEPINFER_BF16_GROUPED", true};
bool grouped_launch_enabled() {
  return kGroupedLaunch.enabled();
}

// A grouped linear's shape for launch_bf16_mma (groups == 1: a plain one).
struct Bf16Groups {
  int64_t groups = 1;
};

bool bf16_mma_fits(const DeviceWeight& w, const DeviceRows<const float>& x) {
  return w.kind == WeightKind::kBF16 && w.in % kChunk == 0 && w.out % kRowsPerWarp == 0 &&
         w.row_bytes == 2 * w.in && aligned_to(w.bytes, 16) && x.stride % 4 == 0 &&
         aligned_to(x.data, 16);
}

// groups > 1: the caller checked grouped_launch_possible (decode tile, 1-16 rows, group rows a
// multiple of 16); each group's K slices are the per-group call's.
// What every kernel of a linear (groups > 1: linear_grouped's) reads: the operands, the K slices
// of a group's shape, the groups' geometry and, for an fp8 weight, its scales.
Bf16MmaArgs linear_args(DeviceRows<const float> x, const DeviceWeight& w, DeviceRows<float> out,
                        int64_t groups) {
  Bf16MmaArgs args{};
  args.x = x;
  args.weight = w.bytes;
  args.row_bytes = w.row_bytes;
  args.n = w.out;
  args.k = w.in;
  args.slices = linear_bf16_mma_k_slices(w.out / groups, w.in);
  args.out = out;
  args.x_split = nullptr;
  args.group_row_blocks = wide_groups_enabled() ? kWideGroupRowBlocks : 0;
  args.group_rows = groups > 1 ? w.out / groups : 0;
  args.group_x_cols = groups > 1 ? w.in : 0;
  args.scale = w.scale;
  args.scale_cols = w.scale_cols;
  args.scale_block_out = w.block_out;
  return args;
}

template <int kTerms>
void launch_bf16_mma(DeviceRows<const float> x, const DeviceWeight& w, DeviceRows<float> out,
                     Bf16Groups grouping = {}) {
  const int64_t groups = grouping.groups;
  DI_CHECK(bf16_mma_fits(w, x) && x.cols == w.in * groups && out.cols == w.out &&
               out.rows == x.rows && w.out % (groups * kRowsPerWarp) == 0,
           "launch_linear_bf16_mma: unsupported weight [", w.out, ", ", w.in, "] or shapes");
  if (x.rows == 0 || w.out == 0) return;
  Bf16MmaArgs args = linear_args(x, w, out, groups);
  const int64_t row_groups = w.out / kRowsPerWarp;
  const auto stream = current_stream();
  const int variant = decode_variant();
  const bool decode_tile = decode_tile_enabled();
  // The variants apply where the decode tile runs, to a plain linear of a large weight.
  const bool large_decode =
      decode_tile && groups == 1 && x.rows <= 16 &&
      w.out * w.row_bytes >= decode_pre_split_min_bytes.load(std::memory_order_relaxed);
  const bool decode_pre_split = large_decode && (variant & (x.rows <= 8 ? 1 : 2)) != 0;
  const bool two_row_groups = large_decode && x.rows > 8 && (variant & 4) != 0;
  // 9-16 rows of a weight as large as the LM head on the big tile (its 32-token block: every
  // weight byte read once, half the MMAs on tokens past the end, still under the HBM time).
  const bool big_decode = groups == 1 && x.rows > 8 && x.rows <= 16 &&
                          w.out * w.row_bytes >= kBigDecodeMinBytes && big_tile_fits(args) &&
                          big_tile_decode_enabled();
  const bool pre_split =
      (kPreSplitActivations && x.rows >= kPreSplitMinRows) || decode_pre_split || big_decode;
  // From 17 rows, where too few blocks for the prefill kernels ran the decode tile: the big tile
  // with the weight's K slices on grid.z (whole stages per slice).
  const bool big_split = x.rows >= kPreSplitMinRows && args.slices > 1 &&
                         (w.in / kChunk / args.slices) % kBigStageChunks == 0 &&
                         big_tile_fits(args) && big_tile_split_enabled();
  const int64_t chunks = w.in / kChunk;
  StreamBuffer split(pre_split ? static_cast<size_t>(x.rows * chunks * 4 * kTerms) * sizeof(uint4)
                               : 0);
  if (pre_split) {
    constexpr int kSplitThreads = 256;
    split_activations_kernel<kTerms>
        <<<blocks_for(x.rows * chunks * 4, kSplitThreads), kSplitThreads, 0, stream>>>(
            x, split.as<uint4>(), chunks);
    DI_CUDA_LAUNCHED(split_activations_kernel);
    args.x_split = split.as<uint4>();
  }
  const auto run = [&](auto kernel, int tokens_per_block, int row_groups_per_block) {
    const dim3 grid(blocks_for(row_groups, row_groups_per_block),
                    std::min(blocks_for(x.rows, tokens_per_block), 65535u));
    kernel<<<grid, kThreads, 0, stream>>>(args);
    DI_CUDA_LAUNCHED(bf16_mma_kernel);
  };
  const int split_row_groups = kWarps / args.slices;
  // The decode instances of bf16_mma_kernel (K slices over warps), or the decode tile with the
  // same grid and bits.
  const auto run_decode = [&](auto register_kernel, auto launch_tile, int tokens_per_block) {
    if (!decode_tile) {
      run(register_kernel, tokens_per_block, split_row_groups);
      return;
    }
    const dim3 grid(blocks_for(row_groups, split_row_groups),
                    std::min(blocks_for(x.rows, tokens_per_block), 65535u));
    launch_tile(args, grid, stream,
                decode_cluster_ranks(static_cast<int64_t>(grid.x) * grid.y, w.in / kChunk,
                                     args.slices, kChunkBytes));
  };
  const bool wide = static_cast<int64_t>(blocks_for(row_groups, kWarps)) * blocks_for(x.rows, 32) >=
                    kWideMinBlocks;
  // The decode tile alone (the variants: decode_tile holds), kRowGroups row groups per warp.
  const auto run_tile = [&](auto launch_tile, int tokens_per_block, int row_groups_per_warp) {
    launch_tile(args,
                dim3(blocks_for(blocks_for(row_groups, row_groups_per_warp), split_row_groups),
                     std::min(blocks_for(x.rows, tokens_per_block), 65535u)),
                stream, 1);
  };
  if (big_decode) {
    launch_big_tile<kTerms, 2>(args, x.rows, stream);
  } else if (x.rows <= 8) {
    if (decode_pre_split) {
      run_tile(launch_decode_tile<1, kTerms, true>, 8, 1);
    } else {
      run_decode(bf16_mma_kernel<1, true, kTerms, false>, launch_decode_tile<1, kTerms, false>, 8);
    }
  } else if (x.rows <= 16) {
    if (decode_pre_split && two_row_groups) {
      run_tile(launch_decode_tile<2, kTerms, true, 2>, 16, 2);
    } else if (decode_pre_split) {
      run_tile(launch_decode_tile<2, kTerms, true>, 16, 1);
    } else if (two_row_groups) {
      run_tile(launch_decode_tile<2, kTerms, false, 2>, 16, 2);
    } else {
      run_decode(bf16_mma_kernel<2, true, kTerms, false>, launch_decode_tile<2, kTerms, false>, 16);
    }
  } else if (!pre_split) {
    if (wide) {
      run(bf16_mma_kernel<4, false, kTerms, false>, 32, kWarps);
    } else {
      run_decode(bf16_mma_kernel<4, true, kTerms, false>, launch_decode_tile<4, kTerms, false>, 32);
    }
  } else if (wide) {
    if (!wide_tile_enabled()) {
      run(bf16_mma_kernel<4, false, kTerms, true>, 32, kWarps);
    } else if (big_tile_fits(args)) {
      if (x.rows <= kBigSmallTokensUpTo) {
        launch_big_tile<kTerms, 2>(args, x.rows, stream);
      } else {
        launch_big_tile<kTerms, 4>(args, x.rows, stream);
      }
    } else if (x.rows >= kWideLargeTokensFrom) {
      launch_wide_tile<kTerms, 64>(args, row_groups, x.rows, stream);
    } else {
      launch_wide_tile<kTerms, 32>(args, row_groups, x.rows, stream);
    }
  } else if (big_split) {
    if (x.rows <= kBigSplitSmallTokensUpTo) {
      launch_big_tile<kTerms, 2, true>(args, x.rows, stream);
    } else {
      launch_big_tile<kTerms, 4, true>(args, x.rows, stream);
    }
  } else {
    run_decode(bf16_mma_kernel<4, true, kTerms, true>, launch_decode_tile<4, kTerms, true>, 32);
  }
}

// The attention's wo_a as released: fp8 codes with 32 x 32 ue8m0 blocks times f32 activations
// (ActivationQuant::kNone, the BF16 roles' terms) on the decode tile, reading one byte a weight
// instead of the dequantized copy's two. Scale blocks of 32 columns (one a chunk) and a multiple
// of 16 rows (one a row group); each group's rows a multiple of 16.
bool fp8_decode_tile_fits(const DeviceWeight& w, const DeviceRows<const float>& x, int64_t groups) {
  return kBf16MmaEnabled && decode_tile_enabled() && w.kind == WeightKind::kF8 &&
         w.block_in == kChunk && w.block_out % kRowsPerWarp == 0 && w.in % kChunk == 0 &&
         (w.out / groups) % kRowsPerWarp == 0 && w.row_bytes == w.in && aligned_to(w.bytes, 16) &&
         x.rows >= 1 && x.rows <= 16 && x.stride % 4 == 0 && aligned_to(x.data, 16) &&
         (groups == 1 || grouped_launch_enabled());
}

// Same grid, K slices, cluster ranks and token tiles as launch_bf16_mma's decode tile on the
// dequantized weight, so the same bits.
template <int kTerms>
void launch_fp8_decode_tile(DeviceRows<const float> x, const DeviceWeight& w, DeviceRows<float> out,
                            int64_t groups) {
  const Bf16MmaArgs args = linear_args(x, w, out, groups);
  const int tokens_per_block = x.rows <= 8 ? 8 : 16;
  const dim3 grid(blocks_for(w.out / kRowsPerWarp, kWarps / args.slices),
                  std::min(blocks_for(x.rows, tokens_per_block), 65535u));
  const int ranks = decode_cluster_ranks(static_cast<int64_t>(grid.x) * grid.y, w.in / kChunk,
                                         args.slices, kChunkBytes);
  if (x.rows <= 8) {
    launch_decode_tile<1, kTerms, false, 1, true>(args, grid, current_stream(), ranks);
  } else {
    launch_decode_tile<2, kTerms, false, 1, true>(args, grid, current_stream(), ranks);
  }
}

// An fp8 weight without activation quantization where the decode tile does not take it: its
// exact bf16 dequantization (the values the decode tile converts to) into a stream buffer, then
// the bf16 path, per group as linear_grouped's own calls.
void linear_fp8_weight_via_bf16(const TensorView& x, const LinearWeight& weight, int64_t groups,
                                const TensorView& out) {
  const int64_t rows = weight.out_features();
  const int64_t cols = weight.in_features();
  StreamBuffer dense(static_cast<size_t>(rows * cols) * 2);
  const TensorView dense_view =
      TensorView::contiguous(dense.as<void>(), DType::kBF16, {rows, cols}, weight.weight.device());
  dequantize_fp8_weight_bf16(weight, dense_view);
  const int64_t group_out = rows / groups;
  for (int64_t g = 0; g < groups; ++g) {
    cuda::linear(groups > 1 ? x.narrow(1, g * cols, cols) : x,
                 LinearWeight{dense_view.narrow(0, g * group_out, group_out), TensorView()},
                 groups > 1 ? out.narrow(1, g * group_out, group_out) : out);
  }
}

}  // namespace

bool linear_fp8_weight_unquantized(const TensorView& x, const LinearWeight& weight, int64_t groups,
                                   const TensorView& out) {
  if (weight.weight.dtype() != DType::kF8E4M3) return false;
  const DeviceWeight w = describe(weight);
  const DeviceRows<const float> in = device_rows<const float>(x, "linear input");
  const DeviceRows<float> o = device_rows<float>(out, "linear output");
  if (fp8_decode_tile_fits(w, in, groups)) {
    launch_fp8_decode_tile<kActivationTerms>(in, w, o, groups);
  } else {
    linear_fp8_weight_via_bf16(x, weight, groups, out);
  }
  return true;
}

bool linear_bf16_mma_enabled() {
  return kBf16MmaEnabled;
}

int linear_bf16_mma_k_slices(int64_t n, int64_t k) {
  return split_k_slices(n, k);
}

bool bf16_mma_supports(const DeviceWeight& w, const DeviceRows<const float>& x) {
  return kBf16MmaEnabled && bf16_mma_fits(w, x);
}

void launch_linear_bf16_mma(DeviceRows<const float> x, const DeviceWeight& w,
                            DeviceRows<float> out) {
  launch_bf16_mma<kActivationTerms>(x, w, out);
}

void linear_bf16_mma(const TensorView& x, const LinearWeight& weight, const TensorView& out,
                     int activation_terms) {
  if (activation_terms == 0) activation_terms = kActivationTerms;
  if (activation_terms != 2 && activation_terms != 3) {
    DI_THROW("linear_bf16_mma: activation_terms must be 2 or 3, got ", activation_terms);
  }
  const DeviceWeight w = describe(weight);
  const DeviceRows<const float> in = device_rows<const float>(x, "linear_bf16_mma input");
  const DeviceRows<float> o = device_rows<float>(out, "linear_bf16_mma output");
  if (!bf16_mma_fits(w, in)) {
    DI_THROW("linear_bf16_mma needs a bf16 weight with K % ", kChunk, " == 0 and N % ",
             kRowsPerWarp, " == 0 and 16-byte aligned input rows, got weight ",
             weight.weight.to_string(), ", x ", x.to_string());
  }
  if (in.cols != w.in || o.cols != w.out || o.rows != in.rows) {
    DI_THROW("linear_bf16_mma shapes do not match: x ", x.to_string(), ", weight ",
             weight.weight.to_string(), ", out ", out.to_string());
  }
  if (activation_terms == 2) {
    launch_bf16_mma<2>(in, w, o);
  } else {
    launch_bf16_mma<3>(in, w, o);
  }
}

void linear_grouped(const TensorView& x, const LinearWeight& weight, int64_t groups,
                    const TensorView& out) {
  require(groups > 0 && weight.weight.rank() == 2 && x.rank() == 2 && out.rank() == 2 &&
              weight.out_features() % groups == 0 && x.size(1) == groups * weight.in_features() &&
              out.size(1) == weight.out_features() && out.size(0) == x.size(0),
          "linear_grouped shapes do not match: x ", x.to_string(), ", weight ",
          weight.weight.to_string(), ", groups ", groups, ", out ", out.to_string());
  const int64_t group_out = weight.out_features() / groups;
  const int64_t group_in = weight.in_features();
  const DeviceWeight w = describe(weight);
  const DeviceRows<const float> in = device_rows<const float>(x, "linear_grouped input");
  const DeviceRows<float> o = device_rows<float>(out, "linear_grouped output");
  // Batch invariance off and enough rows: all groups in one strided-batched cuBLASLt GEMM per
  // activation term (linear_cublaslt.h).
  if (linear_cublaslt_selected(in.rows) &&
      try_linear_cublaslt(x, weight, out, ActivationQuant::kNone, groups)) {
    return;
  }
  if (w.kind == WeightKind::kF8) {
    require(ops::linear_grouped_supports(weight, groups), "linear_grouped: ", groups,
            " groups of fp8 weight ", weight.weight.to_string(), " with scale ",
            weight.scale.to_string(), " are not whole scale blocks of ", w.block_out, " rows");
    linear_fp8_weight_unquantized(x, weight, groups, out);
    return;
  }
  // One launch where each group's own call would run the decode tile (1-16 rows) on this path;
  // anything else is the per-group calls themselves.
  if (grouped_launch_enabled() && groups > 1 && decode_tile_enabled() && in.rows <= 16 &&
      group_out % kRowsPerWarp == 0 && bf16_mma_supports(w, in)) {
    launch_bf16_mma<kActivationTerms>(in, w, o, Bf16Groups{groups});
    return;
  }
  for (int64_t g = 0; g < groups; ++g) {
    cuda::linear(x.narrow(1, g * group_in, group_in),
                 LinearWeight{weight.weight.narrow(0, g * group_out, group_out), TensorView()},
                 out.narrow(1, g * group_out, group_out));
  }
}

void set_bf16_decode_pre_split_min_bytes(int64_t bytes) {
  decode_pre_split_min_bytes.store(bytes < 0 ? kDecodePreSplitMinBytes : bytes,
                                   std::memory_order_relaxed);
}

int bf16_decode_variants() {
  return kDecodeVariants;
}

int linear_bf16_mma_activation_terms() {
  return kActivationTerms;
}

}  // namespace deepinfer::ops::cuda
