// The fp4 prefill tile of moe_grouped_gemm.cu on Hopper's warpgroup MMA (wgmma, sm_90a), taken
// when batch invariance is off (moe_prefill_wgmma.h says what changes in the numerics and why).
//
// The mma.sync tile is issue bound: every m16n8k32 is followed by four scale FMAs in the same
// warp, so the tensor cores wait on the scheduler. wgmma does a 64 x N x 32 product per
// instruction from shared memory, so one instruction replaces 4 x N / 8 mma.sync, and the warps'
// issue slots go to the scale folds and the fp4 -> e4m3 conversion while the tensor cores run.
// The first version (kPer32, de421e1..8e45ec1) still folded once per 32-block: per 32-block each
// accumulator element took a multiply and an FMA, 2 instructions per 2 x 32 x 1 tensor FLOP, and
// every fold waited for the wgmma before it. kPer128 folds once per 128 of K: the four k32
// wgmmas of a step chain in one accumulator (scale-d true after the first), so the fold costs a
// quarter as much.
//
// Both tiles take a block of 128 weight rows x one token tile (128 or 32 tokens: the same token
// tile list as the mma.sync tile). kPer32: 256 threads, warpgroup g owns rows [64g, 64g + 64) and
// all the tile's tokens. kPer128: 512 threads, warpgroup g owns rows [64 (g % 2), + 64) and half
// of the tokens (fold128 says why). K runs in steps of 128 through shared-memory slots filled by
// cp.async: the tokens' 128 e4m3 bytes per step form one 128-byte line each, the 16-byte chunk c
// of token t at c ^ (t % 8) (wgmma's 128-byte swizzle, so both operands are K-major with no
// transpose, as e4m3 requires). The block converts each step's raw fp4 weights into an e4m3
// buffer of the same swizzled layout while the step before it is on the tensor cores. Within a
// 32-block the K slots follow CodeLayout::kMmaHalves: the weights' 16-byte fp4 block becomes 32
// e4m3 bytes with the low nibbles (K 8t + 2i, slot 4t + i) first and the high nibbles
// (K 8t + 2i + 1, slot 16 + 4t + i) after, which is where the quantizers put the activations'
// codes.
//
// Where the time goes (H200, 8192 tokens, docs/BENCHMARKS.md): both versions issue about as
// many warp instructions a step as the tensor cores need cycles for it (the fold's multiply and
// FMA per accumulator element, ~1.6 instructions per converted weight value, the copies), and a
// 32-token tile converts as many weights as a 128-token one (so register_a lists one sized tile an
// expert, kMoeWgmmaTiles: 9.53 -> 7.65 ms a layer at 8192 tokens); kPer128 on 16 warps (IPC 0.62
// per scheduler) ran within 3% of the same schedule on 8 (IPC 0.42). register_a (the default for
// kPer128) converts into wgmma's A registers instead of shared memory: 16.5 -> 14.3 ms for a
// layer's routed experts at 8192 tokens. Measured and not kept (history): the producers
// converting for two consumer warpgroups (3% faster than fold128), and register_a
// warp-specialized with an mbarrier ring (10% slower than register_a: docs/BENCHMARKS.md), and
// register_a folding one token half while the other half's wgmmas run (2-4% slower: the tile
// is bound by instruction issue and short dependency chains, not by the fold's latency).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/batch_invariance.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8_mma.cuh"
#include "ops/cuda/linear.cuh"
#include "ops/cuda/moe_decode_map.h"
#include "ops/cuda/moe_expert_rows.cuh"
#include "ops/cuda/moe_prefill_items.cuh"
#include "ops/cuda/moe_prefill_wgmma.h"
#include "ops/cuda/wgmma.cuh"

// Device passes for other architectures (an SM100 build) compile every kernel body below to a
// trap, which leaves the sm_90a helpers unreferenced: nvcc's "declared but never referenced"
// would fail a -Werror build there.
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#pragma nv_diag_suppress 177
#endif

namespace deepinfer::ops::cuda {
namespace {

// false (DEEPINFER_MOE_WGMMA=0): the mma.sync prefill tile also without batch invariance.
RuntimeSwitch kMoeWgmma{"DEEPINFER_MOE_WGMMA", true};
// 128: one fold per 128 of K (the default); 32: the first version, one per 32-block.
RuntimeSetting kMoeWgmmaFold{"DEEPINFER_MOE_WGMMA_FOLD", 128, 32, 128};
// true: the fold-per-128 tile converts the weights into wgmma's A registers (register_a); false
// (DEEPINFER_MOE_WGMMA_REGISTER_A=0): into shared memory (fold128), the same bits.
RuntimeSwitch kMoeWgmmaRegisterA{"DEEPINFER_MOE_WGMMA_REGISTER_A", true};
// true: quantize_rows_per128 rounds with the hardware's e4m3 conversions (float4 rows: its vector
// kernel); false (DEEPINFER_MOE_QUANT_HW_CVT=0): with round_to_e4m3 in the scalar kernel, the
// same codes (moe_wgmma_test compares them).
RuntimeSwitch kQuantHardwareCvt{"DEEPINFER_MOE_QUANT_HW_CVT", true};

constexpr int kScaleBlock = 32;                    // the wgmma's K and both operands' scale block
constexpr int kStepBlocks = 4;                     // scale blocks per pipeline step
constexpr int kStepK = kStepBlocks * kScaleBlock;  // 128 bytes of e4m3: one swizzled line
constexpr int kRows = 128;                         // weight rows per block
constexpr int kWarpgroupRows = 64;                 // wgmma's M
constexpr int kThreads = 2 * 128;                  // two warpgroups
constexpr int kMaxTokens = kPrefillBigTileTokens;
constexpr int kSwizzleAtom = 1024;  // 8 lines of 128 bytes: the swizzle repeats from there
static_assert(kPrefillSmallTileTokens % 16 == 0 && kMaxTokens % 16 == 0,
              "the fold reads the token scales of two 8-token column groups at a time");
static_assert(kRows + kMaxTokens <= kThreads,
              "one thread per weight row and per token copies a step's scale codes");
// The token scales of a block grouped by the accumulator's quad (token 8j + 2q + e at
// q * kQuadStride + 2j + e), so a thread's come 4 at a time; the stride's 4 extra floats put
// the quads' 16-byte loads in different banks.
constexpr int kQuadStride = kMaxTokens / 4 + 4;
constexpr int kTokenScalesPerBlock = 4 * kQuadStride;
__host__ __device__ constexpr int quad_grouped(int token) {
  return ((token >> 1) & 3) * kQuadStride + 2 * (token >> 3) + (token & 1);
}
constexpr int round_up_to_atom(int bytes) {
  return (bytes + kSwizzleAtom - 1) / kSwizzleAtom * kSwizzleAtom;
}

// moe_grouped_gemm.cu's conversion (the same bits): four fp4 codes in the low nibbles of the
// bytes -> four e4m3 bytes of 2^-6 times their value, exact for normal and subnormal codes.
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3x4_scaled(uint32_t codes) {
  return ((codes & 0x07070707u) << 2) | ((codes & 0x08080808u) << 4);
}
constexpr float kE2m1Rescale = 64.0f;  // undoes the 2^-6 of those codes

__device__ __forceinline__ float scale_code(uint32_t codes, int shift) {
  return deepinfer::cuda::e8m0_to_float(static_cast<uint8_t>(codes >> shift));
}

// 4 bytes global -> shared (a row's 4 scale codes of a step, or a token's step scale).
__device__ __forceinline__ void copy_4_async(uint32_t shared, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared), "l"(global) : "memory");
}

// Makes this thread's shared-memory writes (stores and landed cp.async) visible to the async
// proxy, which is where wgmma reads its operands; a barrier after it covers the other threads.
__device__ __forceinline__ void fence_shared_for_wgmma() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A K-major operand of 128-byte lines, 128-byte swizzle, starting `address` bytes into a swizzle
// atom's first line (0, 32, 64, 96: the K block): start address, leading byte offset 16 (unused
// by swizzled K-major layouts), stride byte offset 1024 (the next 8 lines), swizzle mode 1.
__device__ __forceinline__ uint64_t swizzled_operand(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFFu) >> 4) | (uint64_t{16 >> 4} << 16) |
         (uint64_t{kSwizzleAtom >> 4} << 32) | (uint64_t{1} << 62);
}

using deepinfer::cuda::wgmma::hold_after_wait;
using deepinfer::cuda::wgmma::wgmma_commit;
using deepinfer::cuda::wgmma::wgmma_fence;
using deepinfer::cuda::wgmma::wgmma_wait;

// d (64 x N) = A . B (fresh: scale-d false, the registers' old values unused, so they are outputs
// only and need not stay live until the wgmma is issued; in_place: the same product with d as
// operands in and out, as the first version had it) or d + A . B (add), from descriptors.
// d[4j + {0, 1, 2, 3}] of lane (g, t) of warp w in the warpgroup is (row 16w + g, col 8j + 2t),
// (16w + g, 8j + 2t + 1), (16w + g + 8, 8j + 2t), (16w + g + 8, 8j + 2t + 1), the mma.sync
// accumulator layout repeated along N.
__device__ __forceinline__ void wgmma_m64n32k32_in_place(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
      "}, %16, %17, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_m64n128k32_in_place(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, %64, %65, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "l"(a), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_m64n16k32_fresh(float (&d)[8], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7"
      "}, %8, %9, accumulate, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7])
      : "l"(a), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_m64n16k32_add(float (&d)[8], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7"
      "}, %8, %9, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "l"(a), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_m64n64k32_fresh(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, accumulate, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
        "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
        "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "l"(a), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_m64n64k32_add(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b)
      : "memory");
}

// The fold-per-32 tile's fresh products in place (N = 32 or 128); the fold-per-128 tile's
// chained ones (N = 16 or 64: a warpgroup's half of the token tile).
enum class WgmmaWrite { kFresh, kFreshInPlace, kAdd };

template <int kN, WgmmaWrite kWrite>
__device__ __forceinline__ void wgmma_k32(float (&d)[kN / 2], uint64_t a, uint64_t b) {
  if constexpr (kWrite == WgmmaWrite::kFreshInPlace) {
    static_assert(kN == 32 || kN == 128, "the fold-per-32 tile's N");
    if constexpr (kN == 128) {
      wgmma_m64n128k32_in_place(d, a, b);
    } else {
      wgmma_m64n32k32_in_place(d, a, b);
    }
  } else {
    static_assert(kN == 16 || kN == 64, "the fold-per-128 tile's N");
    if constexpr (kWrite == WgmmaWrite::kFresh && kN == 64) wgmma_m64n64k32_fresh(d, a, b);
    if constexpr (kWrite == WgmmaWrite::kFresh && kN == 16) wgmma_m64n16k32_fresh(d, a, b);
    if constexpr (kWrite == WgmmaWrite::kAdd && kN == 64) wgmma_m64n64k32_add(d, a, b);
    if constexpr (kWrite == WgmmaWrite::kAdd && kN == 16) wgmma_m64n16k32_add(d, a, b);
  }
}

__device__ __forceinline__ uint8_t* align_to_swizzle_atom(uint8_t* pointer) {
  const uint32_t address = shared_address(pointer);
  return pointer + ((kSwizzleAtom - (address % kSwizzleAtom)) % kSwizzleAtom);
}

// The parts of a work item (weight rows [128 row_tile, +128) x one token tile) both folds share.
struct TileRows {
  const uint8_t* weight;    // the expert's fp4 rows from the block's first
  const uint8_t* w_scales;  // their ue8m0 codes
  int tokens;               // rows of the tile, >= 1
  int64_t n_first;
};

__device__ __forceinline__ TileRows tile_rows(const PrefillWgmmaArgs& args,
                                              const PrefillTokenTile& tile, int row_tile,
                                              int max_tokens) {
  TileRows rows;
  rows.n_first = static_cast<int64_t>(row_tile) * kRows;
  rows.tokens = min(tile.end - tile.first, max_tokens);
  const int64_t k_blocks = args.k / kScaleBlock;
  if (args.experts != nullptr) {
    rows.weight = args.experts[tile.expert].bytes + rows.n_first * (args.k / 2);
    rows.w_scales = args.experts[tile.expert].scale + rows.n_first * k_blocks;
  } else {
    const int64_t first = tile.expert * args.n + rows.n_first;
    rows.weight = args.weight + first * (args.k / 2);
    rows.w_scales = args.w_scales + first * k_blocks;
  }
  return rows;
}

// Writes a warpgroup thread's accumulator (rows `row` and row + 8 of the block, the tile's
// tokens first_token + 8j + 2 quad + {0, 1}, kTokens of them from first_token) to out.
template <int kTokens>
__device__ __forceinline__ void store_tile(const PrefillWgmmaArgs& args,
                                           const PrefillTokenTile& tile, const TileRows& rows,
                                           int row, int quad, int first_token,
                                           const float (&acc)[kTokens / 2]) {
  const int64_t n = rows.n_first + row;
#pragma unroll
  for (int j = 0; j < kTokens / 8; ++j) {
    const int token = first_token + 8 * j + 2 * quad;
    if (token < rows.tokens) {
      float* out = args.out + (tile.first + token) * args.out_stride + n;
      out[0] = acc[4 * j + 0];
      out[8] = acc[4 * j + 2];
    }
    if (token + 1 < rows.tokens) {
      float* out = args.out + (tile.first + token + 1) * args.out_stride + n;
      out[0] = acc[4 * j + 1];
      out[8] = acc[4 * j + 3];
    }
  }
}

// ---- kPer32: the first version (one fold per 32-block) -------------------------------------
namespace fold32 {

constexpr int kStages = 4;
// One pipeline slot: the tokens' e4m3 lines (swizzled, wgmma's B), the raw fp4 weight rows (64
// bytes each, read only by the conversion), and the step's ue8m0 codes (4 per row / token).
constexpr int kCodesOffset = 0;
constexpr int kRawWeightOffset = kCodesOffset + kMaxTokens * kStepK;
constexpr int kWeightCodesOffset = kRawWeightOffset + kRows * kStepK / 2;
constexpr int kTokenCodesOffset = kWeightCodesOffset + kRows * kStepBlocks;
constexpr int kStageBytes = kTokenCodesOffset + kMaxTokens * kStepBlocks;
// After the slots, two buffers (step s + 1 is converted into one while step s's wgmmas read
// the other): a step's e4m3 weights (swizzled, wgmma's A), then its decoded scales.
constexpr int kWeightsOffset = kStages * kStageBytes;
constexpr int kWeightsBytes = kRows * kStepK;
constexpr int kScalesOffset = kWeightsOffset + 2 * kWeightsBytes;
constexpr int kWeightScalesBytes = kStepBlocks * kRows * 4;  // f32 [block][row]
constexpr int kTokenScalesBytes = kStepBlocks * kTokenScalesPerBlock * 4;
constexpr int kScalesBytes = kWeightScalesBytes + kTokenScalesBytes;
constexpr int kSharedBytes = kScalesOffset + 2 * kScalesBytes;
constexpr int kSharedAllocation = kSharedBytes + kSwizzleAtom;  // room to align the base
static_assert(kStageBytes % kSwizzleAtom == 0 && kWeightsOffset % kSwizzleAtom == 0 &&
                  kWeightsBytes % kSwizzleAtom == 0 &&
                  (kWarpgroupRows * kStepK) % kSwizzleAtom == 0,
              "the wgmma operands start on swizzle atoms");

// One work item: weight rows [128 row_tile, +128) times one token tile of kTokens (128 or 32).
// Step s reads buffer s % 2. While its first two wgmmas run, the block converts step s + 1 into
// the other buffer, whose last readers (step s - 1's wgmmas and folds) finished before barrier
// X; barrier Y makes step s + 1's copies visible to the converting threads, and the next step's
// X makes the conversion visible to the wgmmas. The slot refilled after X held step s - 1's
// activations, whose wgmmas every warp waited for before X.
template <int kTokens>
__device__ __forceinline__ void wgmma_tile(const PrefillWgmmaArgs& args,
                                           const PrefillTokenTile& tile, int row_tile,
                                           uint8_t* shared) {
  constexpr int kPartial = kTokens / 2;  // f32 registers of one m64nNk32 result per thread
  const TileRows rows = tile_rows(args, tile, row_tile, kTokens);
  const int thread = threadIdx.x;
  const int warpgroup = thread / 128;
  const int lane = thread & 31;
  const int group = lane >> 2;
  const int quad = lane & 3;
  // This thread's accumulator rows within the block: row and row + 8.
  const int row = warpgroup * kWarpgroupRows + ((thread / 32) % 4) * 16 + group;
  const int64_t k_blocks = args.k / kScaleBlock;
  const int64_t w_row_bytes = args.k / 2;
  const int steps = static_cast<int>(args.k / kStepK);
  // Tokens past the tile's rows load the last row and are never stored (as the mma.sync tile).
  const auto token_row = [&](int token) -> int64_t {
    return tile.first + min(token, rows.tokens - 1);
  };

  const auto copy_stage = [&](int step, int slot) {
    uint8_t* base = shared + slot * kStageBytes;
    constexpr int kWeightChunks = kRows * (kStepK / 2) / 16;
    for (int chunk = thread; chunk < kWeightChunks; chunk += kThreads) {
      const int r = chunk / 4;
      const int c = chunk % 4;
      copy_16_async(
          shared_address(base + kRawWeightOffset + r * (kStepK / 2) + c * 16),
          rows.weight + r * w_row_bytes + static_cast<int64_t>(step) * (kStepK / 2) + c * 16);
    }
    constexpr int kCodeChunks = kTokens * kStepK / 16;
    for (int chunk = thread; chunk < kCodeChunks; chunk += kThreads) {
      const int token = chunk / 8;
      const int c = chunk % 8;
      copy_16_async(
          shared_address(base + kCodesOffset + token * kStepK + ((c ^ (token & 7)) << 4)),
          args.x_codes + token_row(token) * args.k + static_cast<int64_t>(step) * kStepK + c * 16);
    }
    const int64_t block = static_cast<int64_t>(step) * kStepBlocks;
    if (thread < kRows) {
      copy_4_async(shared_address(base + kWeightCodesOffset + thread * kStepBlocks),
                   rows.w_scales + thread * k_blocks + block);
    } else if (thread - kRows < kTokens) {
      const int token = thread - kRows;
      copy_4_async(shared_address(base + kTokenCodesOffset + token * kStepBlocks),
                   args.x_scales + token_row(token) * k_blocks + block);
    }
  };

  const auto weights_of = [&](int buffer) {
    return shared + kWeightsOffset + buffer * kWeightsBytes;
  };
  const auto weight_scales_of = [&](int buffer) {
    return reinterpret_cast<float*>(shared + kScalesOffset + buffer * kScalesBytes);
  };
  const auto token_scales_of = [&](int buffer) {
    return reinterpret_cast<float*>(shared + kScalesOffset + buffer * kScalesBytes +
                                    kWeightScalesBytes);
  };
  // A landed slot -> the e4m3 weights and the float scales a step's wgmmas and folds read.
  const auto prepare_stage = [&](int slot, int buffer) {
    const uint8_t* base = shared + slot * kStageBytes;
    uint8_t* weights = weights_of(buffer);
    float* weight_scales = weight_scales_of(buffer);
    float* token_scales = token_scales_of(buffer);
    constexpr int kWeightChunks = kRows * kStepBlocks;  // one 16-byte fp4 block each
    // One chunk at a time: this runs with two partials in flight.
#pragma unroll 1
    for (int chunk = thread; chunk < kWeightChunks; chunk += kThreads) {
      const int r = chunk / kStepBlocks;
      const int b = chunk % kStepBlocks;
      const uint4 packed =
          *reinterpret_cast<const uint4*>(base + kRawWeightOffset + r * (kStepK / 2) + b * 16);
      const uint4 low{e2m1x4_to_e4m3x4_scaled(packed.x), e2m1x4_to_e4m3x4_scaled(packed.y),
                      e2m1x4_to_e4m3x4_scaled(packed.z), e2m1x4_to_e4m3x4_scaled(packed.w)};
      const uint4 high{
          e2m1x4_to_e4m3x4_scaled(packed.x >> 4), e2m1x4_to_e4m3x4_scaled(packed.y >> 4),
          e2m1x4_to_e4m3x4_scaled(packed.z >> 4), e2m1x4_to_e4m3x4_scaled(packed.w >> 4)};
      uint8_t* line = weights + r * kStepK;
      *reinterpret_cast<uint4*>(line + (((2 * b) ^ (r & 7)) << 4)) = low;
      *reinterpret_cast<uint4*>(line + (((2 * b + 1) ^ (r & 7)) << 4)) = high;
    }
    if (thread < kRows) {
      const uint32_t codes =
          *reinterpret_cast<const uint32_t*>(base + kWeightCodesOffset + thread * kStepBlocks);
#pragma unroll
      for (int b = 0; b < kStepBlocks; ++b) {
        weight_scales[b * kRows + thread] = scale_code(codes, 8 * b) * kE2m1Rescale;
      }
    } else if (thread - kRows < kTokens) {
      const int token = thread - kRows;
      const uint32_t codes =
          *reinterpret_cast<const uint32_t*>(base + kTokenCodesOffset + token * kStepBlocks);
#pragma unroll
      for (int b = 0; b < kStepBlocks; ++b) {
        token_scales[b * kTokenScalesPerBlock + quad_grouped(token)] = scale_code(codes, 8 * b);
      }
    }
    // The next warp-collective instruction (wgmma.wait_group, .aligned) follows without a
    // barrier: the warp is whole again first.
    __syncwarp();
  };

  float acc[kPartial] = {};
  float partial[2][kPartial] = {};
  // The mma.sync tile's fold, element for element: acc += d * (x_scale * w_scale).
  const auto fold = [&](const float(&d)[kPartial], int buffer, int b) {
    const float* weight_scales = weight_scales_of(buffer);
    const float* token_scales = token_scales_of(buffer);
    const float w_scale_lo = weight_scales[b * kRows + row];
    const float w_scale_hi = weight_scales[b * kRows + row + 8];
    const float* quad_scales = token_scales + b * kTokenScalesPerBlock + quad * kQuadStride;
#pragma unroll
    for (int pair = 0; pair < kTokens / 16; ++pair) {
      // Tokens 16 pair + 2 quad + {0, 1} and 16 pair + 8 + 2 quad + {0, 1}.
      const float4 x_scales = *reinterpret_cast<const float4*>(quad_scales + 4 * pair);
      const float scale[2][2] = {{x_scales.x, x_scales.y}, {x_scales.z, x_scales.w}};
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * pair + half;
        acc[4 * j + 0] += d[4 * j + 0] * (scale[half][0] * w_scale_lo);
        acc[4 * j + 1] += d[4 * j + 1] * (scale[half][1] * w_scale_lo);
        acc[4 * j + 2] += d[4 * j + 2] * (scale[half][0] * w_scale_hi);
        acc[4 * j + 3] += d[4 * j + 3] * (scale[half][1] * w_scale_hi);
      }
    }
  };

  // wgmma of K block b of `step` into d (fresh), reading the converted weights of `buffer`.
  const auto issue = [&](float(&d)[kPartial], int step, int buffer, int b) {
    const uint32_t weights_address =
        shared_address(weights_of(buffer) + warpgroup * kWarpgroupRows * kStepK);
    const uint32_t codes_address = shared_address(shared + (step % kStages) * kStageBytes);
    wgmma_fence();  // d was read by a fold (or the registers are fresh)
    wgmma_k32<kTokens, WgmmaWrite::kFreshInPlace>(
        d, swizzled_operand(weights_address + b * kScaleBlock),
        swizzled_operand(codes_address + b * kScaleBlock));
    wgmma_commit();
  };
  // Waits until only the latest wgmma (or none) is in flight, then folds d, the older one.
  const auto fold_after_one = [&](float(&d)[kPartial], int buffer, int b) {
    wgmma_wait<1>();
    hold_after_wait(d);
    fold(d, buffer, b);
  };
  const auto fold_after_all = [&](float(&d)[kPartial], int buffer, int b) {
    wgmma_wait<0>();
    hold_after_wait(d);
    fold(d, buffer, b);
  };
  static_assert(kStepBlocks == 4, "the schedule below is written out for 4 blocks a step");

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) copy_stage(s, s);
    commit_copies();
  }
  wait_copies<kStages - 2>();
  __syncthreads();
  prepare_stage(0, 0);
  fence_shared_for_wgmma();
  for (int step = 0; step < steps; ++step) {
    const int buffer = step & 1;
    __syncthreads();  // X
    const int ahead = step + kStages - 1;
    if (ahead < steps) copy_stage(ahead, ahead % kStages);
    commit_copies();
    issue(partial[0], step, buffer, 0);
    issue(partial[1], step, buffer, 1);
    if (step + 1 < steps) {
      // Step + 1 has landed: kStages + step groups committed, step + 2 of them needed.
      wait_copies<kStages - 2>();
      __syncthreads();  // Y
      prepare_stage((step + 1) % kStages, buffer ^ 1);
      fence_shared_for_wgmma();
    }
    fold_after_one(partial[0], buffer, 0);
    issue(partial[0], step, buffer, 2);
    fold_after_one(partial[1], buffer, 1);
    issue(partial[1], step, buffer, 3);
    fold_after_one(partial[0], buffer, 2);
    fold_after_all(partial[1], buffer, 3);
  }
  store_tile<kTokens>(args, tile, rows, row, quad, 0, acc);
}

}  // namespace fold32

// ---- kPer128: one fold per 128 of K -------------------------------------------------------
namespace fold128 {

// Four warpgroups: warpgroup g takes weight rows [64 (g % 2), + 64) of the block's 128 and tokens
// [(g / 2) kTokens / 2, + kTokens / 2) of the tile (m64n64k32 or m64n16k32), with one step's
// accumulator besides the sum (64 registers), so 16 warps fit where the two-warpgroup tile
// (64 x 128 each and two step accumulators, 192 registers) had 8: the two-warpgroup version
// (23de7d6) issued every 2.4 cycles per scheduler on the H200 (ncu), latency bound. A warpgroup
// folds its step after waiting for it; the other warpgroups' wgmmas keep the tensor cores busy
// meanwhile. The wgmmas read each step's weights and tokens twice (64 KB of shared memory a
// step instead of 48).
constexpr int kThreads = 4 * 128;

// Six slots: step s refills the slot of step s - 2 with step s + 4 and converts step s + 1, so
// the copies of steps s + 2 .. s + 4 are in flight while it runs.
constexpr int kStages = 6;
constexpr int kCopyAhead = kStages - 2;
// Three weight buffers: step s converts step s + 1 into the buffer step s - 2 used, which every
// warpgroup finished with before step s's barrier; so one barrier a step suffices.
constexpr int kWeightBuffers = 3;
// One pipeline slot: the tokens' e4m3 lines (swizzled, wgmma's B), the raw fp4 weight rows (64
// bytes each, read only by the conversion), the rows' 4 ue8m0 codes of the step, and the tokens'
// f32 step scales (already quad-grouped by the copy).
constexpr int kCodesOffset = 0;
constexpr int kRawWeightOffset = kCodesOffset + kMaxTokens * kStepK;
constexpr int kWeightCodesOffset = kRawWeightOffset + kRows * kStepK / 2;
constexpr int kTokenScalesOffset = kWeightCodesOffset + kRows * kStepBlocks;
constexpr int kStageBytes = round_up_to_atom(kTokenScalesOffset + kTokenScalesPerBlock * 4);
// After the slots, the buffers of a step's e4m3 weights (swizzled, wgmma's A), then the rows'
// f32 step scales of each buffer, and the shift table.
constexpr int kWeightsOffset = kStages * kStageBytes;
constexpr int kWeightsBytes = kRows * kStepK;
constexpr int kWeightScalesOffset = kWeightsOffset + kWeightBuffers * kWeightsBytes;
constexpr int kShiftTableOffset = kWeightScalesOffset + kWeightBuffers * kRows * 4;
// The weight codes of a 32-block d exponents below the step's largest are e4m3 codes of
// e2m1 * 2^(6 - d). 2^6 puts the largest e2m1 value, 6, at 384 <= 448 (the most headroom a
// power of two gives). Every e2m1 value is m * 2^-1 with m in {0, 1, 2, 3, 4, 6, 8, 12}, at
// most 2 significant bits, so m * 2^(5 - d) is an e4m3 value (normal, or a subnormal multiple
// of 2^-9) exactly when 5 - d >= -9: d <= kExactShift. Past it the conversion rounds to nearest
// even (d = 15 turns 0.5 into 0 and 1.5 into 2 * 2^-9), and from d = kFlushShift on every code is
// 0 (6 * 2^(6 - 19) is below 2^-10, half the smallest subnormal): the table stops there.
constexpr int kExactShift = kWgmmaExactWeightShift;
constexpr int kFlushShift = kWgmmaFlushWeightShift;
static_assert(5 - kExactShift == -9 && 6.0 * (1 << 6) <= 448.0,
              "the exact range of the weight shift, as derived above");
constexpr int kShiftTableBytes = (kFlushShift + 1) * 8;
constexpr int kSharedBytes = kShiftTableOffset + kShiftTableBytes;
constexpr int kSharedAllocation = kSharedBytes + kSwizzleAtom;  // room to align the base
constexpr float kWeightShiftRescale = 1.0f / 64.0f;             // undoes the 2^6
static_assert(kStageBytes % kSwizzleAtom == 0 && kWeightsOffset % kSwizzleAtom == 0 &&
                  kWeightsBytes % kSwizzleAtom == 0 &&
                  (kWarpgroupRows * kStepK) % kSwizzleAtom == 0,
              "the wgmma operands start on swizzle atoms");
static_assert(kFlushShift + 1 <= kThreads, "one thread per shift fills the table");

// Entry d: bytes j = 0..7 are the e4m3 codes (nearest even, as cvt.rn) of the e2m1 magnitude
// code j times 2^(6 - d), as the two words __byte_perm looks up.
__device__ __forceinline__ void fill_shift_table(uint2* table) {
  const int d = static_cast<int>(threadIdx.x);
  if (d > kFlushShift) return;
  constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint32_t words[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float value = ldexpf(kMagnitudes[j], 6 - d);
    const auto code =
        static_cast<uint32_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3));
    words[j / 4] |= code << (8 * (j % 4));
  }
  table[d] = make_uint2(words[0], words[1]);
}

// Eight fp4 codes (K 8t .. 8t + 7, two per byte, low nibble first) -> the e4m3 codes of the
// shifted values, `low` K 8t + 2i in byte i and `high` K 8t + 2i + 1 (CodeLayout::kMmaHalves'
// words t and 4 + t). The magnitudes of the low (high) nibbles are packed into one 16-bit
// selector, two per byte, so one __byte_perm looks four up in the shift's table; the sign bits
// only move to bit 7 of their byte.
__device__ __forceinline__ void e2m1x8_to_e4m3_shifted(uint32_t codes, uint2 table, uint32_t& low,
                                                       uint32_t& high) {
  const uint32_t magnitudes = codes & 0x77777777u;
  const uint32_t down4 = magnitudes >> 4;
  // Byte 0: low nibbles of bytes 0 and 1; byte 2: of bytes 2 and 3 (the high ones likewise).
  const uint32_t low_pairs = (magnitudes & 0x0F0F0F0Fu) | (down4 & 0xF0F0F0F0u);
  const uint32_t high_pairs = (down4 & 0x0F0F0F0Fu) | ((magnitudes >> 8) & 0xF0F0F0F0u);
  low = __byte_perm(table.x, table.y, __byte_perm(low_pairs, 0, 0x0020)) |
        ((codes << 4) & 0x80808080u);
  high = __byte_perm(table.x, table.y, __byte_perm(high_pairs, 0, 0x0020)) | (codes & 0x80808080u);
}

__device__ __forceinline__ uint32_t byte_of(uint32_t word, int b) {
  return (word >> (8 * b)) & 0xFFu;
}

// One work item: weight rows [128 row_tile, +128) times one token tile of kTokens (128 or 32).
// Step s's four wgmmas chain in one accumulator, its weights in buffer s % 3, its activations
// and scale codes in slot s % kStages. A step: wait for this thread's copies of step s + 1,
// barrier (step s's conversion and step s + 1's copies visible to all; every warpgroup has
// waited for and folded step s - 1, so the buffers and slots of steps before s are free), issue
// step s, refill step s - 2's slot with step s + kCopyAhead, convert step s + 1 (while step s is
// on the tensor cores), wait for step s and fold it.
template <int kTokens>
__device__ __forceinline__ void wgmma_tile(const PrefillWgmmaArgs& args,
                                           const PrefillTokenTile& tile, int row_tile,
                                           uint8_t* shared) {
  constexpr int kWarpgroupTokens = kTokens / 2;   // the wgmma's N
  constexpr int kPartial = kWarpgroupTokens / 2;  // f32 registers of one m64nNk32 result
  const TileRows rows = tile_rows(args, tile, row_tile, kTokens);
  const int thread = threadIdx.x;
  const int warpgroup = thread / 128;
  const int lane = thread & 31;
  const int group = lane >> 2;
  const int quad = lane & 3;
  const int row_half = warpgroup % 2;
  const int first_token = (warpgroup / 2) * kWarpgroupTokens;
  // This thread's accumulator rows within the block: row and row + 8.
  const int row = row_half * kWarpgroupRows + ((thread / 32) % 4) * 16 + group;
  const int64_t k_blocks = args.k / kScaleBlock;
  const int64_t w_row_bytes = args.k / 2;
  const int steps = static_cast<int>(args.k / kStepK);
  // Tokens past the tile's rows load the last row and are never stored (as the mma.sync tile).
  const auto token_row = [&](int token) -> int64_t {
    return tile.first + min(token, rows.tokens - 1);
  };
  const auto slot_of = [&](int step) { return shared + (step % kStages) * kStageBytes; };
  const auto weights_of = [&](int step) {
    return shared + kWeightsOffset + (step % kWeightBuffers) * kWeightsBytes;
  };
  const auto weight_scales_of = [&](int step) {
    return reinterpret_cast<float*>(shared + kWeightScalesOffset +
                                    (step % kWeightBuffers) * kRows * 4);
  };
  const uint2* shift_table = reinterpret_cast<const uint2*>(shared + kShiftTableOffset);

  const auto copy_stage = [&](int step) {
    uint8_t* base = slot_of(step);
    constexpr int kWeightChunks = kRows * (kStepK / 2) / 16;
#pragma unroll
    for (int chunk = thread; chunk < kWeightChunks; chunk += kThreads) {
      const int r = chunk / 4;
      const int c = chunk % 4;
      copy_16_async(
          shared_address(base + kRawWeightOffset + r * (kStepK / 2) + c * 16),
          rows.weight + r * w_row_bytes + static_cast<int64_t>(step) * (kStepK / 2) + c * 16);
    }
    constexpr int kCodeChunks = kTokens * kStepK / 16;
#pragma unroll
    for (int chunk = thread; chunk < kCodeChunks; chunk += kThreads) {
      const int token = chunk / 8;
      const int c = chunk % 8;
      copy_16_async(
          shared_address(base + kCodesOffset + token * kStepK + ((c ^ (token & 7)) << 4)),
          args.x_codes + token_row(token) * args.k + static_cast<int64_t>(step) * kStepK + c * 16);
    }
    if (thread < kRows) {
      copy_4_async(shared_address(base + kWeightCodesOffset + thread * kStepBlocks),
                   rows.w_scales + thread * k_blocks + static_cast<int64_t>(step) * kStepBlocks);
    } else if (thread - kRows < kTokens) {
      const int token = thread - kRows;
      copy_4_async(shared_address(base + kTokenScalesOffset + quad_grouped(token) * 4),
                   args.x_step_scales + token_row(token) * steps + step);
    }
  };

  // A landed slot -> the step's shifted e4m3 weights and the rows' step scales.
  const auto convert_step = [&](int step) {
    const uint8_t* base = slot_of(step);
    uint8_t* weights = weights_of(step);
    float* weight_scales = weight_scales_of(step);
    // One 16-byte fp4 block per chunk, one chunk per thread.
    constexpr int kWeightChunks = kRows * kStepBlocks;
#pragma unroll
    for (int chunk = thread; chunk < kWeightChunks; chunk += kThreads) {
      const int r = chunk / kStepBlocks;
      const int b = chunk % kStepBlocks;
      const uint32_t codes =
          *reinterpret_cast<const uint32_t*>(base + kWeightCodesOffset + r * kStepBlocks);
      const uint32_t top =
          max(max(byte_of(codes, 0), byte_of(codes, 1)), max(byte_of(codes, 2), byte_of(codes, 3)));
      const uint32_t shift = min(top - byte_of(codes, b), static_cast<uint32_t>(kFlushShift));
      const uint2 table = shift_table[shift];
      const uint4 packed =
          *reinterpret_cast<const uint4*>(base + kRawWeightOffset + r * (kStepK / 2) + b * 16);
      uint4 low;
      uint4 high;
      e2m1x8_to_e4m3_shifted(packed.x, table, low.x, high.x);
      e2m1x8_to_e4m3_shifted(packed.y, table, low.y, high.y);
      e2m1x8_to_e4m3_shifted(packed.z, table, low.z, high.z);
      e2m1x8_to_e4m3_shifted(packed.w, table, low.w, high.w);
      uint8_t* line = weights + r * kStepK;
      *reinterpret_cast<uint4*>(line + (((2 * b) ^ (r & 7)) << 4)) = low;
      *reinterpret_cast<uint4*>(line + (((2 * b + 1) ^ (r & 7)) << 4)) = high;
      if (b == 0) {
        weight_scales[r] =
            deepinfer::cuda::e8m0_to_float(static_cast<uint8_t>(top)) * kWeightShiftRescale;
      }
    }
    // The next warp-collective instruction (wgmma.wait_group, .aligned) may follow without a
    // barrier: the warp is whole again first.
    __syncwarp();
  };

  float acc[kPartial] = {};
  float partial[kPartial];
  // acc += d * (x_step_scale * w_step_scale), the promotion of one step's FP8 accumulator.
  const auto fold = [&](const float(&d)[kPartial], int step) {
    const float* weight_scales = weight_scales_of(step);
    const float w_scale_lo = weight_scales[row];
    const float w_scale_hi = weight_scales[row + 8];
    const float* quad_scales = reinterpret_cast<const float*>(slot_of(step) + kTokenScalesOffset) +
                               quad * kQuadStride + first_token / 4;
#pragma unroll
    for (int pair = 0; pair < kWarpgroupTokens / 16; ++pair) {
      // Tokens first_token + 16 pair + 2 quad + {0, 1} and first_token + 16 pair + 8 + 2 quad +
      // {0, 1}.
      const float4 x_scales = *reinterpret_cast<const float4*>(quad_scales + 4 * pair);
      const float scale[2][2] = {{x_scales.x, x_scales.y}, {x_scales.z, x_scales.w}};
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * pair + half;
        acc[4 * j + 0] += d[4 * j + 0] * (scale[half][0] * w_scale_lo);
        acc[4 * j + 1] += d[4 * j + 1] * (scale[half][1] * w_scale_lo);
        acc[4 * j + 2] += d[4 * j + 2] * (scale[half][0] * w_scale_hi);
        acc[4 * j + 3] += d[4 * j + 3] * (scale[half][1] * w_scale_hi);
      }
    }
  };

  // The step's four k32 wgmmas into d, one accumulator (fresh for the first), one group.
  const auto issue_step = [&](float(&d)[kPartial], int step) {
    const uint32_t weights_address =
        shared_address(weights_of(step) + row_half * kWarpgroupRows * kStepK);
    const uint32_t codes_address =
        shared_address(slot_of(step) + kCodesOffset + first_token * kStepK);
    wgmma_fence();  // d was read by a fold (or the registers are fresh)
    wgmma_k32<kWarpgroupTokens, WgmmaWrite::kFresh>(d, swizzled_operand(weights_address),
                                                    swizzled_operand(codes_address));
#pragma unroll
    for (int b = 1; b < kStepBlocks; ++b) {
      wgmma_k32<kWarpgroupTokens, WgmmaWrite::kAdd>(
          d, swizzled_operand(weights_address + b * kScaleBlock),
          swizzled_operand(codes_address + b * kScaleBlock));
    }
    wgmma_commit();
  };

  // Before step s's barrier: this thread's copies of step s + 1 have landed. kCopyAhead + s
  // groups are committed by then (group j: step j), s + 2 of them needed.
  const auto wait_for_next = [&](int step) {
    if (step + 1 < steps) wait_copies<kCopyAhead - 2>();
  };
  // After the issue: refill step s - 2's slot, convert step s + 1.
  const auto prepare_next = [&](int step) {
    if (step + kCopyAhead < steps) copy_stage(step + kCopyAhead);
    commit_copies();
    if (step + 1 < steps) {
      convert_step(step + 1);
      fence_shared_for_wgmma();
    }
  };
  const auto run_step = [&](int step) {
    wait_for_next(step);
    __syncthreads();
    issue_step(partial, step);
    prepare_next(step);
    wgmma_wait<0>();
    hold_after_wait(partial);
    fold(partial, step);
  };
  static_assert(kCopyAhead >= 2 && kStages >= kCopyAhead + 2 && kWeightBuffers == 3,
                "step s refills step s - 2's slot and converts into step s - 2's buffer");

#pragma unroll
  for (int s = 0; s < kCopyAhead; ++s) {
    if (s < steps) copy_stage(s);
    commit_copies();
  }
  wait_copies<kCopyAhead - 1>();  // step 0
  __syncthreads();
  convert_step(0);
  fence_shared_for_wgmma();
  for (int step = 0; step < steps; ++step) run_step(step);
  store_tile<kWarpgroupTokens>(args, tile, rows, row, quad, first_token, acc);
}

}  // namespace fold128

// ---- kPer128 with the weights in registers ----------------------------------------------------
// The same numerics as fold128 (the same shifted e4m3 weights, step scales and fold, so the same
// bits), another data path. fold128 writes each step's converted weights to shared memory and
// both of its row warpgroups' wgmmas read them back (with the tokens: 64 KB of shared-memory
// reads and 16 KB of writes a step, on top of the 24 KB the copies land), and its m64n64 / m64n16
// products read the token tile twice. Here the two warpgroups own rows [64 g, 64 g + 64) and all
// of the tile's tokens (m64n128k32 / m64n32k32), and each converts its rows' fp4 codes straight
// into wgmma's A registers (the register fragment is mma.sync's m16n8k32 A layout per warp, which
// is what CodeLayout::kMmaHalves' order of the 32-block gives a thread from one fp4 word), so the
// converted weights never touch shared memory: 32 KB of wgmma reads and 8 KB of fp4 reads a step.
// The conversion of step s + 1 runs while step s is on the tensor cores (two register sets).
namespace register_a {

constexpr int kThreads = 2 * 128;
constexpr int kStages = 6;
// Step s refills the slot step s - 1 used (every thread waited for its wgmmas and folded it
// before step s's barrier) with step s + 5.
constexpr int kCopyAhead = kStages - 1;
// The slots hold the largest token tile of kPrefillTileSizes. Its token scales are quad-grouped
// as quad_grouped's (token 8j + 2q + e at q * kSlotQuadStride + 2j + e) with this tile's stride:
// 44 floats put the four quads' 16-byte loads in banks 0, 12, 24 and 4 (mod 32).
constexpr int kSlotTokens = kPrefillLargestTileTokens;
constexpr int kSlotQuadStride = kSlotTokens / 4 + 4;
constexpr int kSlotTokenScales = 4 * kSlotQuadStride;
__device__ __forceinline__ int slot_quad_grouped(int token) {
  return ((token >> 1) & 3) * kSlotQuadStride + 2 * (token >> 3) + (token & 1);
}
// One pipeline slot: the tokens' e4m3 lines (swizzled, wgmma's B), the raw fp4 weight rows (64
// bytes each, their four 16-byte chunks swizzled by raw_chunk), the rows' 4 ue8m0 codes of the
// step, and the tokens' f32 step scales (quad-grouped by the copy).
constexpr int kCodesOffset = 0;
constexpr int kRawWeightOffset = kCodesOffset + kSlotTokens * kStepK;
constexpr int kWeightCodesOffset = kRawWeightOffset + kRows * kStepK / 2;
constexpr int kTokenScalesOffset = kWeightCodesOffset + kRows * kStepBlocks;
constexpr int kStageBytes = round_up_to_atom(kTokenScalesOffset + kSlotTokenScales * 4);
constexpr int kShiftTableOffset = kStages * kStageBytes;
constexpr int kSharedBytes = kShiftTableOffset + fold128::kShiftTableBytes;
constexpr int kSharedAllocation = kSharedBytes + kSwizzleAtom;  // room to align the base
static_assert(kStageBytes % kSwizzleAtom == 0, "the token lines start on swizzle atoms");
static_assert(kSharedAllocation <= 227 * 1024, "one block per SM");
static_assert(kSharedAllocation < (1 << 18), "a step's descriptor adds stay in the address field");
static_assert(kRows <= kThreads && kSlotTokens <= 2 * kThreads - kRows,
              "a step's scales: one thread per weight row, one or two copies per token");
static_assert(kSlotQuadStride % 8 == 4 && kSlotTokens % 16 == 0,
              "the fold's 16-byte scale loads: 4 quads in 4 bank groups, 16 tokens a load pair");

// Where chunk c (the 32-block c of the step) of block row r sits: a thread reads word `quad` of
// chunk b of rows g and g + 8 of its warp's 16, so the 8 rows of a read take 8 different bank
// quads (row r's 64 bytes start at bank 16 (r % 2); the chunk's xor with (r / 2) % 4 spreads
// the rest).
__device__ __forceinline__ int raw_chunk(int r, int c) {
  return r * (kStepK / 2) + ((c ^ ((r >> 1) & 3)) << 4);
}

__device__ __forceinline__ void wgmma_rs_m64n128k32_fresh(float (&d)[64], const uint32_t (&a)[4],
                                                          uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, {%64,%65,%66,%67}, %68, accumulate, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
        "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
        "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]),
        "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]),
        "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]),
        "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]),
        "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]),
        "=f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_rs_m64n128k32_add(float (&d)[64], const uint32_t (&a)[4],
                                                        uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
      "}, {%64,%65,%66,%67}, %68, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_rs_m64n32k32_fresh(float (&d)[16], const uint32_t (&a)[4],
                                                         uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
      "}, {%16,%17,%18,%19}, %20, accumulate, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_rs_m64n32k32_add(float (&d)[16], const uint32_t (&a)[4],
                                                       uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
      "}, {%16,%17,%18,%19}, %20, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_rs_m64n64k32_fresh(float (&d)[32], const uint32_t (&a)[4],
                                                         uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, accumulate, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
        "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
        "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_rs_m64n64k32_add(float (&d)[32], const uint32_t (&a)[4],
                                                       uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_rs_m64n96k32_fresh(float (&d)[48], const uint32_t (&a)[4],
                                                         uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
      "}, {%48,%49,%50,%51}, %52, accumulate, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
        "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
        "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]),
        "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]),
        "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_rs_m64n96k32_add(float (&d)[48], const uint32_t (&a)[4],
                                                       uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47"
      "}, {%48,%49,%50,%51}, %52, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_rs_m64n144k32_fresh(float (&d)[72], const uint32_t (&a)[4],
                                                          uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n144k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71"
      "}, {%72,%73,%74,%75}, %76, accumulate, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
        "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
        "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]),
        "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]),
        "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]),
        "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]),
        "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]),
        "=f"(d[63]), "=f"(d[64]), "=f"(d[65]), "=f"(d[66]), "=f"(d[67]), "=f"(d[68]), "=f"(d[69]),
        "=f"(d[70]), "=f"(d[71])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_rs_m64n144k32_add(float (&d)[72], const uint32_t (&a)[4],
                                                        uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n144k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71"
      "}, {%72,%73,%74,%75}, %76, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_rs_m64n160k32_fresh(float (&d)[80], const uint32_t (&a)[4],
                                                          uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n160k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79"
      "}, {%80,%81,%82,%83}, %84, accumulate, 1, 1;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
        "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]),
        "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]),
        "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]),
        "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]),
        "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]),
        "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]),
        "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]),
        "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]),
        "=f"(d[63]), "=f"(d[64]), "=f"(d[65]), "=f"(d[66]), "=f"(d[67]), "=f"(d[68]), "=f"(d[69]),
        "=f"(d[70]), "=f"(d[71]), "=f"(d[72]), "=f"(d[73]), "=f"(d[74]), "=f"(d[75]), "=f"(d[76]),
        "=f"(d[77]), "=f"(d[78]), "=f"(d[79])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

__device__ __forceinline__ void wgmma_rs_m64n160k32_add(float (&d)[80], const uint32_t (&a)[4],
                                                        uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n160k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79"
      "}, {%80,%81,%82,%83}, %84, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
      : "memory");
}

template <int kTokens, bool kFresh>
__device__ __forceinline__ void wgmma_rs(float (&d)[kTokens / 2], const uint32_t (&a)[4],
                                         uint64_t b) {
  static_assert(kTokens == 128 || kTokens == 32 || kTokens == 64 || kTokens == 96 ||
                    kTokens == 144 || kTokens == 160,
                "the token tiles (kPrefillTileSizes)");
  if constexpr (kTokens == 128 && kFresh) wgmma_rs_m64n128k32_fresh(d, a, b);
  if constexpr (kTokens == 128 && !kFresh) wgmma_rs_m64n128k32_add(d, a, b);
  if constexpr (kTokens == 32 && kFresh) wgmma_rs_m64n32k32_fresh(d, a, b);
  if constexpr (kTokens == 32 && !kFresh) wgmma_rs_m64n32k32_add(d, a, b);
  if constexpr (kTokens == 64 && kFresh) wgmma_rs_m64n64k32_fresh(d, a, b);
  if constexpr (kTokens == 64 && !kFresh) wgmma_rs_m64n64k32_add(d, a, b);
  if constexpr (kTokens == 96 && kFresh) wgmma_rs_m64n96k32_fresh(d, a, b);
  if constexpr (kTokens == 96 && !kFresh) wgmma_rs_m64n96k32_add(d, a, b);
  if constexpr (kTokens == 144 && kFresh) wgmma_rs_m64n144k32_fresh(d, a, b);
  if constexpr (kTokens == 144 && !kFresh) wgmma_rs_m64n144k32_add(d, a, b);
  if constexpr (kTokens == 160 && kFresh) wgmma_rs_m64n160k32_fresh(d, a, b);
  if constexpr (kTokens == 160 && !kFresh) wgmma_rs_m64n160k32_add(d, a, b);
}

// Keeps the A registers an in-flight wgmma reads allocated and untouched until after its wait:
// the compiler sees the wgmma as done with its operands when it is issued.
__device__ __forceinline__ void fence_registers(uint32_t (&values)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(values[i])::"memory");
}

// register_a's conversion: fold128::e2m1x8_to_e4m3_shifted's bits in fewer instructions. A byte of
// `even` holds the magnitude of its low nibble, of `odd` its high one; x + (x >> 4) puts the
// next byte's magnitude in the high nibble of each (the bits are disjoint, so the add is an or,
// and one LEA.HI), so bytes 0 and 2 are the selector of the four table lookups. The table's
// bytes have bit 7 clear (positive codes), so the sign bits are or-ed in after the lookup.
__device__ __forceinline__ void e2m1x8_to_e4m3_shifted_lean(uint32_t codes, uint2 table,
                                                            uint32_t& low, uint32_t& high) {
  const uint32_t even = codes & 0x07070707u;
  const uint32_t odd = (codes >> 4) & 0x07070707u;
  const uint32_t even_selector = __byte_perm(even + (even >> 4), 0, 0x0020);
  const uint32_t odd_selector = __byte_perm(odd + (odd >> 4), 0, 0x0020);
  // prmt itself: __byte_perm clears each selector nibble's bit 3 (prmt's sign-replicate bit)
  // with an instruction of its own, and these nibbles have it clear already.
  uint32_t low_magnitudes;
  uint32_t high_magnitudes;
  asm("prmt.b32 %0, %1, %2, %3;"
      : "=r"(low_magnitudes)
      : "r"(table.x), "r"(table.y), "r"(even_selector));
  asm("prmt.b32 %0, %1, %2, %3;"
      : "=r"(high_magnitudes)
      : "r"(table.x), "r"(table.y), "r"(odd_selector));
  low = low_magnitudes | ((codes << 4) & 0x80808080u);
  high = high_magnitudes | (codes & 0x80808080u);
}

// e8m0_to_float(code) (code < 256) with selects instead of the branches it compiles to.
__device__ __forceinline__ float e8m0_to_float_selected(uint32_t code) {
  uint32_t bits = code << 23;
  bits = code == 0 ? 0x00400000u : bits;
  bits = code == 0xFFu ? 0x7fc00000u : bits;
  return __uint_as_float(bits);
}

// One step of this thread's weights: the A registers of the step's four k32 wgmmas and the two
// rows' step scales.
struct StepWeights {
  uint32_t a[kStepBlocks][4];
  float scale_lo;
  float scale_hi;
};

// A K step of the tile is written for few instructions (ncu on an earlier form of it: no eligible
// warp 54% of the time, stalls on short dependency chains and the FMA/ALU pipes rather than on the
// tensor cores or the barrier; its SASS recomputed the copies' 64-bit addresses and the slots'
// modulo 6 every step): the copies' per-item addresses and the raw words' slot offsets are held in
// registers (through an empty asm, so ptxas cannot rematerialize them) and a step adds its
// offset, the scale codes' copy is one predicated copy, the slots are byte offsets stepped around
// the ring, the descriptors of a step's K blocks are one descriptor plus 2 each, and the
// conversion and the scale's e8m0 decode take fewer instructions (e2m1x8_to_e4m3_shifted_lean,
// e8m0_to_float_selected). SASS a 128-token step 380 instructions, a 32-token step 269
// (with the sized tiles' slots, 2026-12-02: 32 / 64 / 96 / 128 / 144 / 160 tokens 268 / 304 /
// 340 / 376 / 401 / 416)
// (docs/BENCHMARKS.md). The step before this one (490 / 364 instructions) and a variant with
// row-wide weight scales were measured on the H200 and removed on 2026-12-02 (one layer's routed
// experts at 8192 tokens: this step 10.87 ms, the step before 11.90 ms with the same bits; the
// row-wide scales 1% faster with other bits, not worth a second numerics); git history before
// that date has them.
template <int kTokens>
__device__ __forceinline__ void wgmma_tile(const PrefillWgmmaArgs& args,
                                           const PrefillTokenTile& tile, int row_tile,
                                           uint8_t* shared) {
  constexpr int kPartial = kTokens / 2;  // f32 registers of one m64nNk32 result per thread
  const TileRows rows = tile_rows(args, tile, row_tile, kTokens);
  const int thread = threadIdx.x;
  const int warpgroup = thread / 128;
  const int lane = thread & 31;
  const int group = lane >> 2;
  const int quad = lane & 3;
  // This thread's accumulator rows within the block: row and row + 8.
  const int row = warpgroup * kWarpgroupRows + ((thread / 32) % 4) * 16 + group;
  const int64_t k_blocks = args.k / kScaleBlock;
  const int64_t w_row_bytes = args.k / 2;
  const int steps = static_cast<int>(args.k / kStepK);
  // Tokens past the tile's rows load the last row and are never stored (as the mma.sync tile).
  const auto token_row = [&](int token) -> int64_t {
    return tile.first + min(token, rows.tokens - 1);
  };
  const uint2* shift_table = reinterpret_cast<const uint2*>(shared + kShiftTableOffset);

  // This thread's copies, the same chunks as fold128's copy loops (chunk thread + kThreads i), with
  // their addresses worked out once an item: a step only adds its offset. (Written as loops over
  // chunk numbers, the copies took ~300 instructions a thread a step in the SASS: run-time trip
  // counts, signed divisions and 64-bit products per chunk, about as many as the conversion and
  // the fold together.)
  constexpr int kWeightCopies = kRows * (kStepK / 2) / 16 / kThreads;
  static_assert(kWeightCopies * kThreads * 16 == kRows * (kStepK / 2) && kThreads % 8 == 0,
                "every thread copies the same number of 16-byte weight chunks a step");
  static_assert(kTokens <= kSlotTokens && kTokens % 16 == 0, "a slot holds the tile's tokens");
  // Weight chunk thread + kThreads i: row thread / 4 + (kThreads / 4) i, chunk thread % 4; its
  // raw_chunk is raw_chunk(row, chunk) + kWeightRowStep i (the xor's row bits do not change).
  constexpr int kWeightRowStep = kThreads / 4;
  const int weight_row = thread >> 2;
  const int weight_chunk = thread & 3;
  const uint32_t weight_shared = kRawWeightOffset + raw_chunk(weight_row, weight_chunk);
  const uint8_t* weight_global = rows.weight + weight_row * w_row_bytes + weight_chunk * 16;
  const int64_t weight_global_step = kWeightRowStep * w_row_bytes;
  // Token chunk thread + kThreads i: token thread / 8 + (kThreads / 8) i, chunk thread % 8. A
  // tile of 144 tokens copies its last 16 tokens' lines with the first half of the threads.
  constexpr int kTokenStep = kThreads / 8;
  constexpr int kTokenCopies = (kTokens + kTokenStep - 1) / kTokenStep;
  const int first_token = thread >> 3;
  const int token_chunk = thread & 7;
  const bool copies_last_token_chunk = first_token + kTokenStep * (kTokenCopies - 1) < kTokens;
  const uint32_t token_shared =
      kCodesOffset + first_token * kStepK + ((token_chunk ^ (first_token & 7)) << 4);
  const uint8_t* token_global = args.x_codes + tile.first * args.k + token_chunk * 16;
  uint32_t token_offset[kTokenCopies];  // (the token's clamped row - tile.first) * K
#pragma unroll
  for (int i = 0; i < kTokenCopies; ++i) {
    token_offset[i] =
        static_cast<uint32_t>((token_row(first_token + kTokenStep * i) - tile.first) * args.k);
  }
  // The step's scale codes: one row's four (threads < kRows) or one token's step scale; tokens
  // past kThreads - kRows (tiles of 144 and 160) take a second copy of the first threads.
  const bool copies_row_codes = thread < kRows;
  const bool copies_token_scale = !copies_row_codes && thread - kRows < kTokens;
  const uint8_t* row_codes_global = rows.w_scales + (copies_row_codes ? thread : 0) * k_blocks;
  const float* token_scale_global =
      args.x_step_scales + token_row(copies_token_scale ? thread - kRows : 0) * steps;
  const uint32_t scale_shared =
      copies_row_codes
          ? kWeightCodesOffset + thread * kStepBlocks
          : kTokenScalesOffset + slot_quad_grouped(copies_token_scale ? thread - kRows : 0) * 4;
  constexpr int kSecondScaleTokens = kTokens - (kThreads - kRows);  // > 0: that many tokens
  const int second_scale_token = kThreads - kRows + thread;
  const bool copies_second_scale = kSecondScaleTokens > 0 && thread < kSecondScaleTokens;

  // A step's copies: the per-item addresses plus the step's offset (the same for every thread).
  // The addresses and shared offsets go through an empty asm once an item, so ptxas keeps them in
  // registers instead of recomputing them from threadIdx every step (it did). A row's 4 scale
  // codes and a token's f32 step scale are both 4 bytes a step.
  uint64_t weight_source[kWeightCopies];
#pragma unroll
  for (int i = 0; i < kWeightCopies; ++i) {
    weight_source[i] = reinterpret_cast<uint64_t>(weight_global + i * weight_global_step);
  }
  uint64_t token_source[kTokenCopies];
#pragma unroll
  for (int i = 0; i < kTokenCopies; ++i) {
    token_source[i] = reinterpret_cast<uint64_t>(token_global + token_offset[i]);
  }
  const bool copies_scale = copies_row_codes || copies_token_scale;
  uint64_t scale_source = copies_row_codes ? reinterpret_cast<uint64_t>(row_codes_global)
                                           : reinterpret_cast<uint64_t>(token_scale_global);
  uint32_t copy_shared[3] = {weight_shared, token_shared, scale_shared};
#pragma unroll
  for (int i = 0; i < kWeightCopies; ++i) asm volatile("" : "+l"(weight_source[i]));
#pragma unroll
  for (int i = 0; i < kTokenCopies; ++i) asm volatile("" : "+l"(token_source[i]));
  asm volatile("" : "+l"(scale_source));
#pragma unroll
  for (int i = 0; i < 3; ++i) asm volatile("" : "+r"(copy_shared[i]));
  uint64_t second_scale_source = 0;
  uint32_t second_scale_shared = 0;
  if constexpr (kSecondScaleTokens > 0) {
    second_scale_source = reinterpret_cast<uint64_t>(
        args.x_step_scales + token_row(copies_second_scale ? second_scale_token : 0) * steps);
    second_scale_shared =
        kTokenScalesOffset + slot_quad_grouped(copies_second_scale ? second_scale_token : 0) * 4;
    asm volatile("" : "+l"(second_scale_source), "+r"(second_scale_shared));
  }
  const auto copy_stage = [&](uint32_t base, int step) {
    const uint64_t weight_step = static_cast<uint64_t>(step) * (kStepK / 2);
    const uint64_t token_step = static_cast<uint64_t>(step) * kStepK;
#pragma unroll
    for (int i = 0; i < kWeightCopies; ++i) {
      copy_16_async(base + copy_shared[0] + i * kWeightRowStep * (kStepK / 2),
                    reinterpret_cast<const void*>(weight_source[i] + weight_step));
    }
#pragma unroll
    for (int i = 0; i < kTokenCopies; ++i) {
      if (kTokens % kTokenStep == 0 || i + 1 < kTokenCopies || copies_last_token_chunk) {
        copy_16_async(base + copy_shared[1] + i * kTokenStep * kStepK,
                      reinterpret_cast<const void*>(token_source[i] + token_step));
      }
    }
    if (copies_scale) {
      copy_4_async(base + copy_shared[2],
                   reinterpret_cast<const void*>(scale_source + static_cast<uint64_t>(step) * 4));
    }
    if (kSecondScaleTokens > 0 && copies_second_scale) {
      copy_4_async(
          base + second_scale_shared,
          reinterpret_cast<const void*>(second_scale_source + static_cast<uint64_t>(step) * 4));
    }
  };

  // Where in a slot this thread's raw fp4 words sit (kept in registers as the copies'
  // addresses are, so a word's load is slot + offset with no add).
  uint32_t raw_word_offset[2][kStepBlocks];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int b = 0; b < kStepBlocks; ++b) {
      raw_word_offset[half][b] = kRawWeightOffset + raw_chunk(row + 8 * half, b) + 4 * quad;
      asm volatile("" : "+r"(raw_word_offset[half][b]));
    }
  }
  // A landed slot -> this thread's A registers and rows' scales of the step (fold128's
  // convert_step, element for element, into registers).
  const auto convert_step = [&](const uint8_t* base, StepWeights& weights) {
    // Each row's largest ue8m0 code of the step's four. (An array, not a scalar a row: with the
    // scalar the compiler gives the accumulators other registers, the same instructions.)
    uint32_t top[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row + 8 * half;
      const uint32_t codes =
          *reinterpret_cast<const uint32_t*>(base + kWeightCodesOffset + r * kStepBlocks);
      top[half] = max(max(fold128::byte_of(codes, 0), fold128::byte_of(codes, 1)),
                      max(fold128::byte_of(codes, 2), fold128::byte_of(codes, 3)));
      const float scale = e8m0_to_float_selected(top[half]) * fold128::kWeightShiftRescale;
      if (half == 0) {
        weights.scale_lo = scale;
      } else {
        weights.scale_hi = scale;
      }
#pragma unroll
      for (int b = 0; b < kStepBlocks; ++b) {
        const uint32_t shift = min(top[half] - fold128::byte_of(codes, b),
                                   static_cast<uint32_t>(fold128::kFlushShift));
        const uint32_t word = *reinterpret_cast<const uint32_t*>(base + raw_word_offset[half][b]);
        // a0 / a1: rows g / g + 8, K slots 4 quad .. + 3 (the low nibbles); a2 / a3: slots 16 +
        // 4 quad .. (the high ones).
        e2m1x8_to_e4m3_shifted_lean(word, shift_table[shift], weights.a[b][half],
                                    weights.a[b][2 + half]);
      }
    }
  };

  float acc[kPartial] = {};
  float partial[kPartial];
  // acc += d * (x_step_scale * w_step_scale), fold128's fold.
  const auto fold = [&](const uint8_t* slot, const StepWeights& weights) {
    const float* quad_scales =
        reinterpret_cast<const float*>(slot + kTokenScalesOffset) + quad * kSlotQuadStride;
#pragma unroll
    for (int pair = 0; pair < kTokens / 16; ++pair) {
      // Tokens 16 pair + 2 quad + {0, 1} and 16 pair + 8 + 2 quad + {0, 1}.
      const float4 x_scales = *reinterpret_cast<const float4*>(quad_scales + 4 * pair);
      const float scale[2][2] = {{x_scales.x, x_scales.y}, {x_scales.z, x_scales.w}};
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * pair + half;
        acc[4 * j + 0] += partial[4 * j + 0] * (scale[half][0] * weights.scale_lo);
        acc[4 * j + 1] += partial[4 * j + 1] * (scale[half][1] * weights.scale_lo);
        acc[4 * j + 2] += partial[4 * j + 2] * (scale[half][0] * weights.scale_hi);
        acc[4 * j + 3] += partial[4 * j + 3] * (scale[half][1] * weights.scale_hi);
      }
    }
  };

  const auto issue_step = [&](const uint8_t* slot, StepWeights& weights) {
    const uint32_t codes_address = shared_address(slot + kCodesOffset);
#pragma unroll
    for (int b = 0; b < kStepBlocks; ++b) fence_registers(weights.a[b]);
    wgmma_fence();  // the A registers were written, the partial read by the last fold
    wgmma_rs<kTokens, true>(partial, weights.a[0], swizzled_operand(codes_address));
#pragma unroll
    for (int b = 1; b < kStepBlocks; ++b) {
      // The descriptor's start address field counts 16 bytes and a slot's lines sit far below the
      // field's 2^18-byte wrap, so the K block's 32 bytes add 2 to it.
      const uint64_t operand =
          swizzled_operand(codes_address) + static_cast<uint64_t>(b * kScaleBlock / 16);
      wgmma_rs<kTokens, false>(partial, weights.a[b], operand);
    }
    wgmma_commit();
  };

  // Step s: this thread's copies of step s + 1 have landed (kCopyAhead + s groups committed, s + 2
  // needed) and are made visible to the async proxy; the barrier publishes them and frees step
  // s - 1's slot; issue step s, refill, convert step s + 1 into the other register set while step
  // s runs, wait, fold.
  // Step s's slot is a byte offset into `shared`; step s + 1's follows it around the ring and
  // step s + kCopyAhead's (= s - 1's) precedes it.
  constexpr uint32_t kRingBytes = kStages * kStageBytes;
  static_assert(kCopyAhead == kStages - 1, "step s refills the slot before step s's");
  uint32_t slot_offset = 0;
  const uint32_t shared_base = shared_address(shared);
  const auto run_step = [&](int step, StepWeights& current, StepWeights& next) {
    const uint32_t next_offset =
        slot_offset + kStageBytes == kRingBytes ? 0u : slot_offset + kStageBytes;
    const uint32_t refill_offset =
        slot_offset == 0 ? kRingBytes - kStageBytes : slot_offset - kStageBytes;
    const uint8_t* slot = shared + slot_offset;
    const uint8_t* next_slot = shared + next_offset;
    if (step + 1 < steps) wait_copies<kCopyAhead - 2>();
    fence_shared_for_wgmma();
    __syncthreads();
    issue_step(slot, current);
    if (step + kCopyAhead < steps) copy_stage(shared_base + refill_offset, step + kCopyAhead);
    commit_copies();
    if (step + 1 < steps) convert_step(next_slot, next);
    wgmma_wait<0>();
    hold_after_wait(partial);
#pragma unroll
    for (int b = 0; b < kStepBlocks; ++b) fence_registers(current.a[b]);
    fold(slot, current);
    slot_offset = next_offset;
  };
  static_assert(kCopyAhead >= 2 && kCopyAhead <= kStages - 1, "the slot schedule above");

#pragma unroll
  for (int s = 0; s < kCopyAhead; ++s) {
    if (s < steps) copy_stage(shared_base + s * kStageBytes, s);
    commit_copies();
  }
  wait_copies<kCopyAhead - 1>();  // step 0
  __syncthreads();
  StepWeights weights[2];
  convert_step(shared, weights[0]);
  // Two steps an iteration: the register sets alternate by name, not by a run-time index.
  for (int step = 0; step < steps; step += 2) {
    run_step(step, weights[0], weights[1]);
    if (step + 1 < steps) run_step(step + 1, weights[1], weights[0]);
  }
  store_tile<kTokens>(args, tile, rows, row, quad, 0, acc);
}

}  // namespace register_a

// The three tiles: fold32::wgmma_tile, fold128::wgmma_tile, register_a::wgmma_tile.
enum class TileKind { kFold32, kFold128, kFold128RegisterA };

template <TileKind kKind>
constexpr int threads_of() {
  if constexpr (kKind == TileKind::kFold128) return fold128::kThreads;
  if constexpr (kKind == TileKind::kFold128RegisterA) {
    return register_a::kThreads;
  }
  return kThreads;
}

template <TileKind kKind>
constexpr int shared_allocation_of() {
  if constexpr (kKind == TileKind::kFold128) return fold128::kSharedAllocation;
  if constexpr (kKind == TileKind::kFold128RegisterA) {
    return register_a::kSharedAllocation;
  }
  return fold32::kSharedAllocation;
}

template <TileKind kKind, int kTokens>
__device__ __forceinline__ void run_tile(const PrefillWgmmaArgs& args, const PrefillTokenTile& tile,
                                         int row_tile, uint8_t* shared) {
  if constexpr (kKind == TileKind::kFold128) {
    fold128::wgmma_tile<kTokens>(args, tile, row_tile, shared);
  } else if constexpr (kKind == TileKind::kFold128RegisterA) {
    register_a::wgmma_tile<kTokens>(args, tile, row_tile, shared);
  } else {
    fold32::wgmma_tile<kTokens>(args, tile, row_tile, shared);
  }
}

// Persistent blocks walk the items (token tile, 128 weight rows) as prefill_tile_kernel does.
template <TileKind kKind>
__global__ void __launch_bounds__(threads_of<kKind>(), 1)
    prefill_wgmma_kernel(PrefillWgmmaArgs args, const PrefillTokenTile* tiles,
                         const int* tile_count) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t dynamic_shared[];
  uint8_t* shared = align_to_swizzle_atom(dynamic_shared);
  if constexpr (kKind == TileKind::kFold128) {
    fold128::fill_shift_table(reinterpret_cast<uint2*>(shared + fold128::kShiftTableOffset));
    __syncthreads();
  } else if constexpr (kKind == TileKind::kFold128RegisterA) {
    fold128::fill_shift_table(reinterpret_cast<uint2*>(shared + register_a::kShiftTableOffset));
    __syncthreads();
  }
  for_each_prefill_item(
      args.n, kRows, tiles, tile_count, [&](const PrefillTokenTile& tile, int row_tile) {
        if constexpr (kKind == TileKind::kFold128RegisterA) {
          static_assert(kPrefillTileSizes[2] == 64 && kPrefillTileSizes[3] == 96 &&
                            kPrefillTileSizes[4] == 144 && kPrefillTileSizes[5] == 160,
                        "the sized tiles' indices");
          switch (tile.small) {
            case 0:
              run_tile<kKind, kPrefillBigTileTokens>(args, tile, row_tile, shared);
              break;
            case 1:
              run_tile<kKind, kPrefillSmallTileTokens>(args, tile, row_tile, shared);
              break;
            case 2:
              run_tile<kKind, 64>(args, tile, row_tile, shared);
              break;
            case 3:
              run_tile<kKind, 96>(args, tile, row_tile, shared);
              break;
            case 4:
              run_tile<kKind, 144>(args, tile, row_tile, shared);
              break;
            default:
              run_tile<kKind, 160>(args, tile, row_tile, shared);
              break;
          }
        } else if (tile.small != 0) {
          run_tile<kKind, kPrefillSmallTileTokens>(args, tile, row_tile, shared);
        } else {
          run_tile<kKind, kPrefillBigTileTokens>(args, tile, row_tile, shared);
        }
      });
#else
  (void)args;
  (void)tiles;
  (void)tile_count;
  __trap();  // the host launches it on sm_90 only
#endif
}

// The per-128 quantizer for rows that are not float4-aligned and for its software rounding
// (DEEPINFER_MOE_QUANT_HW_CVT=0); aligned rows take quantize_rows_per128_vec_kernel (the same
// codes). One warp per (row, kQuantStepsPerWarp steps of 128 of K): lane l quantizes K 32b + l of
// each step's four blocks exactly as moe_grouped_gemm.cu's store_quantized (the same scale and e4m3
// value per block), then stores each code re-expressed against the step's largest scale:
// value * 2^-(e_step - e_block), rounded to nearest even by the e4m3 conversion (exact unless it
// becomes subnormal). Every step's loads are issued before the first is used: with one step a
// warp (its first version) a warp waited through its row index and four loads for 128 values,
// and the launch ran in ~7 waves of those latencies (32 us for the 1536 rows of a b256 step,
// 0.76 ms for the 49152 of a prefill of 8192 tokens; H200, 2026-12-02). kHardwareCvt: the same
// codes from the hardware's conversions. The block scale is a power of two, so
// value * (1 / scale) is value / scale exactly (both the correctly rounded value of one real
// number); after the clamp to +-448, cvt.rn.satfinite's nearest-even e4m3 code is round_to_e4m3's
// value (the nearest multiple of the binade's quantum, ties to the even multiple, which is the
// even mantissa), and its value comes back exactly through f16.
constexpr int kQuantStepsPerWarp = 4;

// The row and steps [first_step, first_step + step_count) of kQuantStepsPerWarp a warp of the
// per-128 quantizers takes (the same for the whole warp); inactive past the rows or *placed.
struct QuantWarp {
  bool active = false;
  int64_t steps_per_row = 0;
  int64_t row = 0;
  int64_t first_step = 0;
  int step_count = 0;
};

// The e4m3 value of value / scale (a power of two), clamped to +-448, by the hardware's
// conversions (the comment above: round_to_e4m3's value).
__device__ __forceinline__ float e4m3_value(float value, float scale) {
  const float clamped = fminf(fmaxf(value * (1.0f / scale), -448.0f), 448.0f);
  const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(clamped, __NV_SATFINITE, __NV_E4M3);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

__device__ __forceinline__ QuantWarp quant_warp(const ExpertRowsSource& source) {
  QuantWarp w;
  w.steps_per_row = source.cols / kStepK;
  const int64_t warps_per_row = (w.steps_per_row + kQuantStepsPerWarp - 1) / kQuantStepsPerWarp;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (warp >= source.rows * warps_per_row) return w;
  w.row = warp / warps_per_row;
  if (source.placed != nullptr && w.row >= *source.placed) return w;
  w.first_step = (warp % warps_per_row) * kQuantStepsPerWarp;
  w.step_count = static_cast<int>(
      min(static_cast<int64_t>(kQuantStepsPerWarp), w.steps_per_row - w.first_step));
  w.active = true;
  return w;
}

template <bool kSwiglu, bool kHardwareCvt>
__global__ void quantize_rows_per128_kernel(ExpertRowsSource source, uint8_t* codes,
                                            float* step_scales) {
  const QuantWarp warp = quant_warp(source);
  if (!warp.active) return;
  const int lane = threadIdx.x & 31;
  float value[kQuantStepsPerWarp][kStepBlocks];
#pragma unroll
  for (int s = 0; s < kQuantStepsPerWarp; ++s) {
    if (s < warp.step_count) {
#pragma unroll
      for (int b = 0; b < kStepBlocks; ++b) {
        value[s][b] = expert_row_value<kSwiglu>(
            source, warp.row, (warp.first_step + s) * kStepK + b * kScaleBlock + lane);
      }
    }
  }
  // kMmaHalves: K 8t + 2i at byte 4t + i of the block, K 8t + 2i + 1 at 16 + 4t + i.
  const int in_block = ((lane & 1) << 4) | ((lane >> 3) << 2) | ((lane & 7) >> 1);
#pragma unroll
  for (int s = 0; s < kQuantStepsPerWarp; ++s) {
    if (s >= warp.step_count) break;
    float quantized[kStepBlocks];
    float scale[kStepBlocks];
    float step_scale = 0.0f;
#pragma unroll
    for (int b = 0; b < kStepBlocks; ++b) {
      scale[b] = deepinfer::cuda::fp8_block_scale(deepinfer::cuda::warp_max(fabsf(value[s][b])));
      if constexpr (kHardwareCvt) {
        quantized[b] = e4m3_value(value[s][b], scale[b]);
      } else {
        quantized[b] =
            deepinfer::cuda::round_to_e4m3(fminf(fmaxf(value[s][b] / scale[b], -448.0f), 448.0f));
      }
      step_scale = fmaxf(step_scale, scale[b]);
    }
    uint8_t* row_codes = codes + warp.row * source.cols + (warp.first_step + s) * kStepK;
#pragma unroll
    for (int b = 0; b < kStepBlocks; ++b) {
      // Both scales are powers of two: the product is exact before the one rounding.
      const float shifted = quantized[b] * (scale[b] / step_scale);
      row_codes[b * kScaleBlock + in_block] =
          static_cast<uint8_t>(__nv_cvt_float_to_fp8(shifted, __NV_SATFINITE, __NV_E4M3));
    }
    if (lane == 0) step_scales[warp.row * warp.steps_per_row + warp.first_step + s] = step_scale;
  }
}

// quantize_rows_per128_kernel's codes and step scales (the same bits) from float4 rows: lane l
// holds K 4l .. 4l + 3 of a step (block l / 8), so a block's largest magnitude takes three
// shuffles over its 8 lanes instead of five over 32, each lane converts four values with one
// scale, and its codes go out as two 16-bit stores (kMmaHalves puts K 4j, 4j + 2 of a block at
// bytes 2j, 2j + 1 and K 4j + 1, 4j + 3 at 16 + 2j, 16 + 2j + 1, for j = l % 8).
template <bool kSwiglu>
__global__ void quantize_rows_per128_vec_kernel(ExpertRowsSource source, uint8_t* codes,
                                                float* step_scales) {
  wait_for_prior_grids();  // quant_warp reads the placed row count
  allow_dependent_grids();
  const QuantWarp warp = quant_warp(source);
  if (!warp.active) return;
  const int lane = threadIdx.x & 31;
  float4 values[kQuantStepsPerWarp];
#pragma unroll
  for (int s = 0; s < kQuantStepsPerWarp; ++s) {
    if (s < warp.step_count) {
      values[s] =
          expert_row_values4<kSwiglu>(source, warp.row, (warp.first_step + s) * kStepK + 4 * lane);
    }
  }
  const int j = lane & 7;
  const int block = lane >> 3;
#pragma unroll
  for (int s = 0; s < kQuantStepsPerWarp; ++s) {
    if (s >= warp.step_count) break;
    const float v[4] = {values[s].x, values[s].y, values[s].z, values[s].w};
    float largest = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
    for (int mask = 1; mask < 8; mask <<= 1) {
      largest = fmaxf(largest, __shfl_xor_sync(0xFFFFFFFFu, largest, mask));
    }
    const float scale = deepinfer::cuda::fp8_block_scale(largest);
    float step_scale = fmaxf(scale, __shfl_xor_sync(0xFFFFFFFFu, scale, 8));
    step_scale = fmaxf(step_scale, __shfl_xor_sync(0xFFFFFFFFu, step_scale, 16));
    // Both scales are powers of two: the product is exact before the one rounding.
    const float shift = scale / step_scale;
    uint32_t code[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      code[e] = __nv_cvt_float_to_fp8(e4m3_value(v[e], scale) * shift, __NV_SATFINITE, __NV_E4M3);
    }
    uint8_t* block_codes =
        codes + warp.row * source.cols + (warp.first_step + s) * kStepK + block * kScaleBlock;
    *reinterpret_cast<uint16_t*>(block_codes + 2 * j) =
        static_cast<uint16_t>(code[0] | code[2] << 8);
    *reinterpret_cast<uint16_t*>(block_codes + 16 + 2 * j) =
        static_cast<uint16_t>(code[1] | code[3] << 8);
    if (lane == 0) step_scales[warp.row * warp.steps_per_row + warp.first_step + s] = step_scale;
  }
}

// 0: the register tile reads the big and small token tiles; 128, 144 or 160 (the default): the
// sized tiles up to that many tokens (moe_prefill_wgmma.h; list_token_tiles_kernel's kSized
// lists). Why: a tile converts each K step's weights once for its tokens, so a 32-token tile
// pays a 128-token tile's conversion for a quarter of the products (268 SASS instructions a step
// against 376), and an expert of 140 rows took a 128 and a 32 (644 a step) where one 144-token
// tile takes 401; at 4096 tokens (~64 rows an expert) two or three 32-token tiles became one of
// 64 or 96 (304 / 340). Measured on the H200 (cuda_layer_bench, one layer's routed w1|w3 + w2,
// 2026-12-02 06:10 UTC call), ms at 1024, 4096, 8192 tokens:
//   0:   4.543, 10.962, 9.530       144: 4.544, 5.685, 7.887
//   128: 4.549,  5.689, 9.464       160: 4.533, 5.686, 7.647
//   the cuBLASLt FP8 loop: 7.607, 7.243, 8.673.
// 160 takes 255 registers without spilling; beyond it the two accumulator sets alone would leave
// too few.
RuntimeSetting kMoeWgmmaTiles{"DEEPINFER_MOE_WGMMA_TILES", 160, 0, kPrefillLargestTileTokens};

}  // namespace

int moe_prefill_sized_tiles() {
  if (!kMoeWgmmaRegisterA.enabled()) return 0;
  const int largest = kMoeWgmmaTiles.value();
  if (largest == 0 || largest == 128 || largest == 144 || largest == 160) return largest;
  DI_THROW("DEEPINFER_MOE_WGMMA_TILES=", largest, " is not accepted: 0, 128, 144 or 160");
}

namespace {

template <TileKind kKind>
void launch_kernel(const PrefillWgmmaArgs& args, unsigned blocks, const PrefillTokenTile* tiles,
                   const int* tile_count) {
  constexpr int kShared = shared_allocation_of<kKind>();
  static const bool configured = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(prefill_wgmma_kernel<kKind>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kShared));
    return true;
  }();
  (void)configured;
  prefill_wgmma_kernel<kKind>
      <<<blocks, threads_of<kKind>(), kShared, current_stream()>>>(args, tiles, tile_count);
  DI_CUDA_LAUNCHED(prefill_wgmma_kernel);
}

// ---- decode: the fold-per-128 register tile shaped for a few tokens per expert -------------
// In decode an expert sees a few tokens (b256: 1536 rows over ~376 of the 384 experts, ~4 each)
// and the GEMM streams each expert's weights once, so its time is the weight bytes over HBM as
// long as enough of them are in flight and the SMs issue the conversion fast enough.
// register_a's 128-row x 32-token tile (the prefill tile list's small tiles) keeps one block per
// SM, drains its copy pipeline at the end of every item (a w2 item is 18 steps) and folds 32
// token columns for ~4 real ones. Here a block is one warpgroup: 64 weight rows x a tile of 16 (or
// 8) tokens, several blocks per SM with several K steps of copies in flight each (DecodeShape),
// so one block's ramp overlaps the others' streams. A thread's work on a step is register_a's: two
// rows' four fp4 words of each 32-block converted into the A registers against the step's largest
// exponent (the same table, the same codes), the step's four k32 wgmmas chained in one
// accumulator (m64n16k32 / m64n8k32 with the tokens from shared memory, the same K slots), and
// the same fold, element for element, in ascending K: the same bits as the prefill tiles.
namespace decode_a {

constexpr int kThreads = 128;  // one warpgroup
constexpr int kRows = kWarpgroupRows;
static_assert(kRows == kDecodeTileRows, "the host's item count");
constexpr int kMaxTokens = kDecodeBigTileTokens;
// One step's pieces inside a slot: the tokens' e4m3 lines (swizzled, wgmma's B: 2 KB, two
// swizzle atoms), the 64 raw fp4 rows (register_a::raw_chunk's layout), their four ue8m0 codes
// and the tokens' f32 step scales (token order).
constexpr int kTokenStepBytes = kMaxTokens * kStepK;
constexpr int kRawStepBytes = kRows * kStepK / 2;
constexpr int kCodeStepBytes = kRows * kStepBlocks;
constexpr int kTokenScaleStepBytes = kMaxTokens * 4;
static_assert(kTokenStepBytes % kSwizzleAtom == 0, "each step's token lines start on an atom");

// The decode tile's pipeline shape (any shape gives the same bits): kSlots slots of kSteps K
// steps each, in two rings (the token lines on swizzle atoms, the rest after them); the copies
// of kSlots - 1 slots are in flight while one is read. A slot's copies read kSteps * 64
// contiguous bytes of every weight row (one 128-byte line at kSteps = 2), and the block waits
// for copies, fences them for the async proxy and meets at a barrier once a slot, not once a
// step.
template <int kSteps_, int kSlots_, int kBlocksPerSm_>
struct DecodeShape {
  static constexpr int kSteps = kSteps_;
  static constexpr int kSlots = kSlots_;
  static constexpr int kBlocksPerSm = kBlocksPerSm_;
  static constexpr int kSlotsAhead = kSlots - 1;
  static constexpr int kTokenSlotBytes = kSteps * kTokenStepBytes;
  static constexpr int kRawOffset = 0;  // [step][64 rows x 64 bytes]
  static constexpr int kCodesOffset = kRawOffset + kSteps * kRawStepBytes;  // [step][row][4]
  static constexpr int kTokenScalesOffset = kCodesOffset + kSteps * kCodeStepBytes;  // [step][16]
  static constexpr int kWeightSlotBytes = kTokenScalesOffset + kSteps * kTokenScaleStepBytes;
  static constexpr int kWeightRingOffset = kSlots * kTokenSlotBytes;
  // The tables after the rings: a shift-table entry (uint2) for every top - code of two ue8m0
  // bytes, and a weight step scale (f32) for every ue8m0 code (lean::fill_tables).
  static constexpr int kShiftTableOffset = kWeightRingOffset + kSlots * kWeightSlotBytes;
  static constexpr int kScaleTableOffset = kShiftTableOffset + 256 * 8;
  static constexpr int kSharedBytes = kScaleTableOffset + 256 * 4;
  static constexpr int kSharedAllocation = kSharedBytes + kSwizzleAtom;  // room to align the base
  static_assert(kSlots >= 2 && kSteps == 2,
                "a slot in flight while one is read; a slot's two steps are the loop's halves");
  static_assert(kWeightSlotBytes % 16 == 0 && kShiftTableOffset % 8 == 0,
                "16-byte copies into the weight slots, 8-byte reads of the shift table");
  // Each block also holds the 1 KB the system reserves.
  static_assert(kBlocksPerSm * (kSharedAllocation + 1024) <= 228 * 1024, "kBlocksPerSm per SM");
};
static_assert(kRows + kMaxTokens <= kThreads,
              "one thread per weight row and per token copies a step's scales");

// d (64 x kTokens) = A . B (kFresh) or d + A . B, A from registers (the mma.sync m16n8k32 A
// fragment per warp), B from a descriptor: register_a's wgmma_rs at N = 16 and 8.
template <int kTokens, bool kFresh>
__device__ __forceinline__ void wgmma_rs(float (&d)[kTokens / 2], const uint32_t (&a)[4],
                                         uint64_t b) {
  static_assert(kTokens == 16 || kTokens == 8, "the decode token tiles");
  if constexpr (kTokens == 16) {
    if constexpr (kFresh) {
      asm volatile(
          "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {"
          "%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, accumulate, 1, 1;\n}\n"
          : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]),
            "=f"(d[7])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
          : "memory");
    } else {
      asm volatile(
          "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {"
          "%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, accumulate, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
            "+f"(d[7])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
          : "memory");
    }
  } else {
    if constexpr (kFresh) {
      asm volatile(
          "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 0, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {"
          "%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, accumulate, 1, 1;\n}\n"
          : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
          : "memory");
    } else {
      asm volatile(
          "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, 1, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {"
          "%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, accumulate, 1, 1;\n}\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
          : "memory");
    }
  }
}

// d = the bytes of a and b (0-3, 4-7) selected by the four nibbles of `selector`'s low 16 bits,
// each nibble's bit 3 clear (PTX prmt's default mode; __byte_perm ignores bit 3, so the compiler
// masks every selector with 0x7777 first).
__device__ __forceinline__ uint32_t select_bytes(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// fold128::e2m1x8_to_e4m3_shifted's codes (the same bytes, so the same bits) in 9 instructions
// instead of ~15: the magnitudes of bytes 0-1 (nibbles K 8t .. 8t + 3 in K order) and of bytes
// 2-3 are already four 3-bit selectors each, so two table lookups give the shifted codes of K
// 8t .. 8t + 3 and 8t + 4 .. 8t + 7, and two byte permutations split them into the even K
// (`low`, K 8t + 2i in byte i) and the odd (`high`); the sign bits only move to bit 7.
__device__ __forceinline__ void e2m1x8_to_e4m3_shifted_by_pairs(uint32_t codes, uint2 table,
                                                                uint32_t& low, uint32_t& high) {
  const uint32_t magnitudes = codes & 0x77777777u;
  const uint32_t first = select_bytes(table.x, table.y, magnitudes);
  const uint32_t second = select_bytes(table.x, table.y, magnitudes >> 16);
  low = __byte_perm(first, second, 0x6420) | ((codes << 4) & 0x80808080u);
  high = __byte_perm(first, second, 0x7531) | (codes & 0x80808080u);
}

// ---- the decode step -------------------------------------------------------------------------
// register_a's products, folds and codes (the same bits: moe_wgmma_test), written for few
// instructions a step. Its first version (2026-12-02, removed after the H200 measured this one
// 14% faster at b256) issued ~250 warp instructions a 128-K step of 16 rows at 0.64 a cycle per
// scheduler (ncu: conversion PRMT/LOP3 27%, address and loop integer ops 28%, uniform descriptor
// rebuilds 14%, LDS 10%), bound by issue while the weight stream alone reaches the HBM floor. As
// register_a's lean step: the slots are ring positions stepped once a slot (no `% kSlots`, no
// `/ kSteps`: a slot's two steps are the loop body's two halves, so a step's place in its slot is
// a constant), this thread's shared-memory addresses of a slot are built once a slot and a step
// reads at constant offsets from them (immediates of the loads), each slot's wgmma descriptors are
// one low word plus a constant per step and K block. The step's shifts: the shift table has an
// entry for every top - code (0..255, zero from kFlushShift on, which is what the clamp to
// kFlushShift selected: fold128::fill_shift_table's entry kFlushShift is zero), so a block's entry
// is (table + 8 top) - 8 code, one multiply-add, and the rows' step scales come from a 256-entry
// table of e8m0_to_float(code) * kWeightShiftRescale computed by the same expression. The copies
// are predicated instead of branched around. SASS (scripts/cuda/sass.sh, the main loop's two
// steps over 2): 180 instructions a step with 8 tokens (the first version 244), 193 with 16
// (261); 128 registers, no spills. One layer's routed experts at b256 2.895 -> 2.490 ms (54% ->
// 63% of the HBM floor; H200, 2026-12-02 02:56 call).
namespace lean {

constexpr int kShiftEntries = 256;  // every top - code of two ue8m0 bytes
constexpr int kScaleEntries = 256;  // every ue8m0 code
static_assert(fold128::kFlushShift < kShiftEntries, "the flushed entries follow the computed ones");

template <typename Shape>
__device__ __forceinline__ void fill_tables(uint8_t* shared) {
  static_assert(Shape::kScaleTableOffset - Shape::kShiftTableOffset == kShiftEntries * 8 &&
                    Shape::kSharedBytes - Shape::kScaleTableOffset == kScaleEntries * 4,
                "DecodeShape's tables");
  auto* shifts = reinterpret_cast<uint2*>(shared + Shape::kShiftTableOffset);
  fold128::fill_shift_table(shifts);  // entries 0..kFlushShift, the default tile's
  for (int d = fold128::kFlushShift + 1 + static_cast<int>(threadIdx.x); d < kShiftEntries;
       d += kThreads) {
    shifts[d] = make_uint2(0, 0);
  }
  auto* scales = reinterpret_cast<float*>(shared + Shape::kScaleTableOffset);
  for (int code = static_cast<int>(threadIdx.x); code < kScaleEntries; code += kThreads) {
    scales[code] =
        deepinfer::cuda::e8m0_to_float(static_cast<uint8_t>(code)) * fold128::kWeightShiftRescale;
  }
}

// Shared-memory loads at 32-bit addresses (volatile, with a memory clobber: kept in order with the
// barriers and the copies' waits).
__device__ __forceinline__ uint32_t load_u32(uint32_t address) {
  uint32_t value;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(value) : "r"(address) : "memory");
  return value;
}
__device__ __forceinline__ uint2 load_u32x2(uint32_t address) {
  uint2 value;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
               : "=r"(value.x), "=r"(value.y)
               : "r"(address)
               : "memory");
  return value;
}
// f32 values: the same loads, bit-cast (a register's type does not exist in SASS).
__device__ __forceinline__ float load_f32(uint32_t address) {
  return __uint_as_float(load_u32(address));
}
__device__ __forceinline__ float2 load_f32x2(uint32_t address) {
  const uint2 bits = load_u32x2(address);
  return make_float2(__uint_as_float(bits.x), __uint_as_float(bits.y));
}

// cp.async of 16 (4) bytes when `copy` holds: one predicated copy instead of a branch around it.
__device__ __forceinline__ void copy_16_async_if(bool copy, uint32_t shared, const void* global) {
  asm volatile(
      "{\n.reg .pred copy;\nsetp.ne.b32 copy, %2, 0;\n"
      "@copy cp.async.cg.shared.global [%0], [%1], 16;\n}\n" ::"r"(shared),
      "l"(global), "r"(static_cast<uint32_t>(copy))
      : "memory");
}
__device__ __forceinline__ void copy_4_async_if(bool copy, uint32_t shared, const void* global) {
  asm volatile(
      "{\n.reg .pred copy;\nsetp.ne.b32 copy, %2, 0;\n"
      "@copy cp.async.ca.shared.global [%0], [%1], 4;\n}\n" ::"r"(shared),
      "l"(global), "r"(static_cast<uint32_t>(copy))
      : "memory");
}

// swizzled_operand(address) is this high word over ((address & 0x3FFFF) >> 4) | 1 << 16. A
// slot's token lines start on a swizzle atom below 2^18 - 4 KB (shared memory ends at 228 KB), so
// the step's 2 KB and the K block's 32 bytes add 128 and 2 to the low word without carrying out
// of the 14-bit address field: the same descriptors as swizzled_operand of the summed address.
constexpr uint32_t kDescriptorHigh = (kSwizzleAtom >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t descriptor_low(uint32_t address) {
  return ((address & 0x3FFFFu) >> 4) | (uint32_t{16 >> 4} << 16);
}
__device__ __forceinline__ uint64_t descriptor(uint32_t low) {
  return (static_cast<uint64_t>(kDescriptorHigh) << 32) | low;
}

// Byte b of `word`, zero-extended: one prmt.
__device__ __forceinline__ uint32_t byte_at(uint32_t word, int b) {
  return select_bytes(word, 0, 0x4440u + static_cast<uint32_t>(b));
}

// This thread's shared-memory addresses in one slot (built once a slot): its rows' raw words of
// each K block, its rows' codes, its quad's token scales, and the token lines' descriptor word.
struct SlotAddresses {
  uint32_t raw[kStepBlocks];
  uint32_t codes;
  uint32_t token_scales;
  uint32_t descriptor_low;
};

}  // namespace lean

// ---- lean3: lean's copy map and arithmetic, the step's latency shortened ----------------------
// lean issues ~180 warp instructions a step (8 tokens) at 2.2 a cycle an SM (ncu, b256: eligible
// 1.05 warps a scheduler); lean2 (fewer instructions, sector-wide copies, shifts through a shared
// buffer, one barrier a slot) ran 25% slower, so lean3 keeps lean's line-wide copies, shift
// table and arithmetic (the same bits) and changes what sits on a step's critical path: a step's
// raw words come from two ldmatrix.x4 (8 loads before) and both rows' codes from one 8-byte load
// (the codes copied in row pairs: decode_map::paired_codes); the loads of a step are issued
// first and the slot's copies go between them and the conversion that waits on them, so the
// copies fill the loads' latency instead of delaying them in the LSU queue; the last slot is
// peeled out of the loop (no per-step tests of the tail); the copies are predicated per thread
// on a slot count (no branch around them, so ptxas interleaves them with the conversion) and
// the loads address a slot as a uniform base plus per-thread offsets. SASS (the main loop's two
// steps over 2): 161.5 instructions a step with 8 tokens (lean 180.5), 177.5 with 16 (193.5);
// 123 registers, no spills. H200, 2026-12-02 06:24 call (docs/BENCHMARKS.md): one layer's routed
// experts at b256 2.525 -> 2.231 ms (63.5% -> 71.9% of the HBM floor), b64 1.641 -> 1.444, b16
// 0.576 -> 0.513; ncu of the op's w1|w3 launch at b256 1.565 -> 1.407 ms with the same IPC (2.20):
// the time went with the instructions. Where the rest goes (ncu, cycles a warp per issued
// instruction, 5.9 in all): long scoreboard 0.85 (copies still in flight at a slot's wait, and
// registers an LDGSTS has not yet read, rewritten soon after it), short scoreboard 0.72 (the
// codes -> shift entry -> lookup chain), math-pipe throttle 0.65 (PRMT / LOP3 keep the ALU pipe
// 58% busy), barrier 0.49, MIO throttle 0.47. Measured on the same call and not kept (all the
// same bits, removed): one barrier a slot (the refill behind the second barrier; the warpgroup
// then met at the first wgmma instead: b256 2.284 ms), the second selector's >> 16 as an IMAD.HI
// on the FMA pipe (dispatch stalls 0.14 -> 0.39: 2.342 ms), and that with a slot's codes in one
// 16-byte load and the copies' sources advanced first (ncu 1.418 ms against lean3's 1.407).
namespace lean3 {

// ldmatrix.x4 (.m8n8.b16, no transpose): lane i gives the row address of row i % 8 of matrix
// i / 8, and register m of lane t is the 4 bytes at 4 (t % 4) of row t / 4 of matrix m
// (decode_map::matrix_word emulates it for the test).
__device__ __forceinline__ void load_matrix_x4(uint32_t address, uint32_t (&d)[kStepBlocks]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(address)
               : "memory");
}

// A step's shared-memory reads that do not depend on each other: both rows' codes and the raw
// words of row half h and 32-block b (raw[h][b]).
struct StepLoads {
  uint2 codes;
  uint32_t raw[2][kStepBlocks];
};

// One slot's uniform addresses: its weight slot and its token lines' descriptor word.
struct SlotAddresses {
  uint32_t weights;
  uint32_t descriptor_low;
};

// p + a * b (a 32-bit product, no 64-bit multiply) as a mad.wide.u32; ptxas still turns the
// constant factors 1 and 2 into an add or an LEA pair.
__device__ __forceinline__ const uint8_t* wide_offset(const uint8_t* p, uint32_t a, uint32_t b) {
  uint64_t address;
  asm("mad.wide.u32 %0, %1, %2, %3;"
      : "=l"(address)
      : "r"(a), "r"(b), "l"(reinterpret_cast<uint64_t>(p)));
  return reinterpret_cast<const uint8_t*>(address);
}

template <typename Shape, int kTokens>
__device__ __forceinline__ void decode_tile_lean3(const PrefillWgmmaArgs& args,
                                                  const PrefillTokenTile& tile, int row_tile,
                                                  uint8_t* shared) {
  using lean::copy_16_async_if;
  using lean::copy_4_async_if;
  using lean::load_f32;
  using lean::load_f32x2;
  using lean::load_u32x2;
  constexpr int kPartial = kTokens / 2;  // f32 registers of one m64nNk32 result per thread
  constexpr int kSteps = Shape::kSteps;
  static_assert(kSteps == 2, "a slot's two steps are the main loop's two halves");
  static_assert(decode_map::kRows == kRows && decode_map::kRowBytes == kStepK / 2 &&
                    decode_map::kBlocks == kStepBlocks &&
                    decode_map::kStepRawBytes == kRawStepBytes,
                "decode_map's step");
  static_assert(decode_map::kCopyThreadsPerRow == 4 * kSteps &&
                    decode_map::kCopyRowStep * 2 * kSteps == kRows,
                "decode_map's copy map covers a slot's rows in 2 kSteps copies a thread");
  TileRows rows;
  rows.n_first = static_cast<int64_t>(row_tile) * kRows;
  rows.tokens = min(tile.end - tile.first, kTokens);
  const int64_t k_blocks = args.k / kScaleBlock;
  const int64_t w_row_bytes = args.k / 2;
  if (args.experts != nullptr) {
    rows.weight = args.experts[tile.expert].bytes + rows.n_first * w_row_bytes;
    rows.w_scales = args.experts[tile.expert].scale + rows.n_first * k_blocks;
  } else {
    const int64_t first = tile.expert * args.n + rows.n_first;
    rows.weight = args.weight + first * w_row_bytes;
    rows.w_scales = args.w_scales + first * k_blocks;
  }
  const int thread = threadIdx.x;
  const int warp = thread / 32;
  const int lane = thread & 31;
  const int group = lane >> 2;
  const int quad = lane & 3;
  // This thread's accumulator rows within the item: row and row + 8.
  const int row = warp * 16 + group;
  const int steps = static_cast<int>(args.k / kStepK);
  const int slots = (steps + kSteps - 1) / kSteps;
  const auto token_row = [&](int token) -> int64_t {
    return tile.first + min(token, rows.tokens - 1);
  };
  const uint32_t shared_base = shared_address(shared);
  const uint32_t shift_table = shared_base + Shape::kShiftTableOffset;
  const uint32_t scale_table = shared_base + Shape::kScaleTableOffset;
  const auto token_slot_address = [&](int position) {
    return shared_base + static_cast<uint32_t>(position * Shape::kTokenSlotBytes);
  };
  const auto weight_slot_address = [&](int position) {
    return shared_base +
           static_cast<uint32_t>(Shape::kWeightRingOffset + position * Shape::kWeightSlotBytes);
  };

  // The copies: lean's map (decode_map's weight map, 16-byte chunks of whole token lines, 4
  // bytes of codes and token scales a step), the codes in row pairs, written for few
  // instructions and no branch, so ptxas can spread them among the conversion's: each copy's
  // predicate is one compare of the slot against a per-thread count of the slots that hold its
  // step, the sources are three pointers advanced once a slot (the other weight rows one
  // mad.wide each from the first), and the slot's place is a uniform base plus per-thread
  // offsets.
  constexpr int kWeightCopies = 2 * kSteps;
  const int weight_step = decode_map::copy_step(thread);
  const int weight_chunk = decode_map::copy_chunk(thread);
  uint32_t weight_shared = Shape::kRawOffset + weight_step * kRawStepBytes +
                           decode_map::raw_offset(decode_map::copy_row(thread, 0), weight_chunk);
  // 32 bits (3 x 16 rows of at most 2.5 KB) and opaque, so ptxas neither widens nor rebuilds it.
  uint32_t weight_row_stride = static_cast<uint32_t>(decode_map::kCopyRowStep * w_row_bytes);
  constexpr uint32_t kWeightSharedRowStep = decode_map::kCopyRowStep * decode_map::kRowBytes;
  // Slots [0, n) hold step `q` of theirs when 2 slot + q < steps.
  const auto slots_with_step = [&](int q) { return (steps - q + 1) / 2; };
  const int weight_slots = slots_with_step(weight_step);
  constexpr int kTokenChunks = kTokens * kSteps * kStepK / 16;
  constexpr int kTokenCopies = (kTokenChunks + kThreads - 1) / kThreads;
  constexpr int kTokenRowStep = 16 / kSteps;
  const int token_step = thread % (8 * kSteps) / 8;
  const int token_chunk = thread & 7;
  const int token_slots = thread < kTokenChunks ? slots_with_step(token_step) : 0;
  uint32_t token_shared[kTokenCopies];
  // Token row offsets from copy 0's (token_row is non-decreasing in the token, so >= 0).
  uint32_t token_delta[kTokenCopies];
  const int first_token = thread / (8 * kSteps);
#pragma unroll
  for (int i = 0; i < kTokenCopies; ++i) {
    const int token = first_token + kTokenRowStep * i;
    token_shared[i] =
        token_step * kTokenStepBytes + token * kStepK + ((token_chunk ^ (token & 7)) << 4);
    token_delta[i] = static_cast<uint32_t>((token_row(token) - token_row(first_token)) * args.k);
  }
  const bool copies_row_codes = thread < kRows;
  const bool copies_token_scale = !copies_row_codes && thread - kRows < kTokens;
  const bool copies_scale = copies_row_codes || copies_token_scale;
  constexpr int kScaleStepBytes = 4;
  static_assert(kStepBlocks == kScaleStepBytes, "one scale copy map for rows and tokens");
  int scale_slots[kSteps];
  uint32_t scale_shared[kSteps];
#pragma unroll
  for (int q = 0; q < kSteps; ++q) {
    scale_slots[q] = copies_scale ? slots_with_step(q) : 0;
    scale_shared[q] = copies_row_codes ? Shape::kCodesOffset + q * kCodeStepBytes +
                                             decode_map::paired_codes(thread)
                                       : Shape::kTokenScalesOffset + q * kTokenScaleStepBytes +
                                             (copies_token_scale ? thread - kRows : 0) * 4;
  }
  asm volatile("" : "+r"(weight_row_stride), "+r"(weight_shared));
#pragma unroll
  for (int i = 0; i < kTokenCopies; ++i)
    asm volatile("" : "+r"(token_shared[i]), "+r"(token_delta[i]));
#pragma unroll
  for (int q = 0; q < kSteps; ++q) asm volatile("" : "+r"(scale_shared[q]));

  const uint8_t* weight_source = rows.weight + decode_map::copy_row(thread, 0) * w_row_bytes +
                                 weight_step * (kStepK / 2) + weight_chunk * 16;
  const uint8_t* token_source =
      args.x_codes + token_row(first_token) * args.k + token_step * kStepK + token_chunk * 16;
  const uint8_t* scale_source =
      copies_row_codes
          ? rows.w_scales + thread * k_blocks
          : reinterpret_cast<const uint8_t*>(
                args.x_step_scales + token_row(copies_token_scale ? thread - kRows : 0) * steps);
  int copied_slot = 0;
  int copy_position = 0;  // copied_slot % kSlots
  // Slot copied_slot into its place (predicated: past the last slot it copies nothing), then a
  // commit (empty past the last slot, so the waits' counts stay constant).
  const auto copy_next_slot = [&] {
    const uint32_t weight_base = weight_slot_address(copy_position);
    const bool copies_weights = copied_slot < weight_slots;
#pragma unroll
    for (int i = 0; i < kWeightCopies; ++i) {
      copy_16_async_if(copies_weights, weight_base + weight_shared + i * kWeightSharedRowStep,
                       i == 0 ? weight_source : wide_offset(weight_source, weight_row_stride, i));
    }
    const uint32_t token_base = token_slot_address(copy_position);
    const bool copies_tokens = copied_slot < token_slots;
#pragma unroll
    for (int i = 0; i < kTokenCopies; ++i) {
      copy_16_async_if(copies_tokens, token_base + token_shared[i],
                       i == 0 ? token_source : wide_offset(token_source, token_delta[i], 1));
    }
#pragma unroll
    for (int q = 0; q < kSteps; ++q) {
      copy_4_async_if(copied_slot < scale_slots[q], weight_base + scale_shared[q],
                      scale_source + q * kScaleStepBytes);
    }
    commit_copies();
    weight_source += kSteps * (kStepK / 2);
    token_source += kSteps * kStepK;
    scale_source += kSteps * kScaleStepBytes;
    ++copied_slot;
    copy_position = copy_position == Shape::kSlots - 1 ? 0 : copy_position + 1;
  };

  // This thread's offsets inside a weight slot, in registers (an empty asm, so ptxas does not
  // rebuild them from threadIdx); a load's address is one of them plus the slot's uniform base
  // plus a constant, which the loads take as their address operands.
  uint32_t raw_offset = Shape::kRawOffset + decode_map::matrix_row(warp, lane);
  uint32_t codes_offset = Shape::kCodesOffset + decode_map::paired_codes_read(warp, lane);
  uint32_t token_scales_offset = Shape::kTokenScalesOffset + 8 * quad;
  asm volatile("" : "+r"(raw_offset), "+r"(codes_offset), "+r"(token_scales_offset));
  const auto slot_addresses = [&](int position) {
    SlotAddresses at;
    at.weights = weight_slot_address(position);
    at.descriptor_low = lean::descriptor_low(token_slot_address(position));
    return at;
  };

  const auto load_step = [&](const SlotAddresses& at, int q) {
    StepLoads loads;
    loads.codes = load_u32x2(at.weights + codes_offset + q * kCodeStepBytes);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      load_matrix_x4(
          at.weights + raw_offset + q * kRawStepBytes + half * decode_map::kMatrixSecondHalf,
          loads.raw[half]);
    }
    return loads;
  };

  // lean's conversion of the loaded words (the same table entries and codes).
  const auto convert_step = [&](const StepLoads& loads, register_a::StepWeights& weights) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t codes = half == 0 ? loads.codes.x : loads.codes.y;
      uint32_t code[kStepBlocks];
#pragma unroll
      for (int b = 0; b < kStepBlocks; ++b) code[b] = lean::byte_at(codes, b);
      const uint32_t top = max(max(code[0], code[1]), max(code[2], code[3]));
      const float scale = load_f32(scale_table + 4 * top);
      if (half == 0) {
        weights.scale_lo = scale;
      } else {
        weights.scale_hi = scale;
      }
      const uint32_t top_entry = shift_table + 8 * top;
#pragma unroll
      for (int b = 0; b < kStepBlocks; ++b) {
        const uint2 entry = load_u32x2(top_entry - 8 * code[b]);
        e2m1x8_to_e4m3_shifted_by_pairs(loads.raw[half][b], entry, weights.a[b][half],
                                        weights.a[b][2 + half]);
      }
    }
  };

  float acc[kPartial] = {};
  float partial[kPartial];
  const auto fold = [&](const SlotAddresses& at, int q, const register_a::StepWeights& weights) {
#pragma unroll
    for (int j = 0; j < kTokens / 8; ++j) {
      const float2 x_scales =
          load_f32x2(at.weights + token_scales_offset + q * kTokenScaleStepBytes + 32 * j);
      acc[4 * j + 0] += partial[4 * j + 0] * (x_scales.x * weights.scale_lo);
      acc[4 * j + 1] += partial[4 * j + 1] * (x_scales.y * weights.scale_lo);
      acc[4 * j + 2] += partial[4 * j + 2] * (x_scales.x * weights.scale_hi);
      acc[4 * j + 3] += partial[4 * j + 3] * (x_scales.y * weights.scale_hi);
    }
  };

  // The descriptors as 64-bit values plus constants (uniform adds, no rebuild per wgmma).
  const auto issue_step = [&](const SlotAddresses& at, int q, register_a::StepWeights& weights) {
    const uint64_t step_descriptor =
        lean::descriptor(at.descriptor_low) + static_cast<uint64_t>(q * (kTokenStepBytes >> 4));
#pragma unroll
    for (int b = 0; b < kStepBlocks; ++b) register_a::fence_registers(weights.a[b]);
    wgmma_fence();  // the A registers were written, the partial read by the last fold
    wgmma_rs<kTokens, true>(partial, weights.a[0], step_descriptor);
#pragma unroll
    for (int b = 1; b < kStepBlocks; ++b) {
      wgmma_rs<kTokens, false>(partial, weights.a[b],
                               step_descriptor + static_cast<uint64_t>(b * kScaleBlock / 16));
    }
    wgmma_commit();
  };

  const auto finish_step = [&](const SlotAddresses& at, int q, register_a::StepWeights& current) {
    wgmma_wait<0>();
    hold_after_wait(partial);
#pragma unroll
    for (int b = 0; b < kStepBlocks; ++b) register_a::fence_registers(current.a[b]);
    fold(at, q, current);
  };

  // Slot j's loop body (lean's schedule): barrier (every warp folded slot j - 1), issue step
  // (j, 0), load step (j, 1), refill slot j - 1's place with slot j + 3, convert (j, 1), wait for
  // and fold (j, 0); wait for this thread's copies of slot j + 1, fence them for the async proxy,
  // barrier, issue (j, 1), load (j + 1, 0), convert (j + 1, 0), wait for and fold (j, 1).
  constexpr int kPendingAtWait = Shape::kSlotsAhead - 1;
#pragma unroll
  for (int s = 0; s < Shape::kSlotsAhead; ++s) copy_next_slot();
  wait_copies<Shape::kSlotsAhead - 1>();  // slot 0
  fence_shared_for_wgmma();
  __syncthreads();
  register_a::StepWeights weights[2];
  int read_position = 0;
  SlotAddresses current = slot_addresses(read_position);
  convert_step(load_step(current, 0), weights[0]);
  const int last_slot = slots - 1;
  for (int slot = 0; slot < last_slot; ++slot) {
    __syncthreads();
    issue_step(current, 0, weights[0]);
    StepLoads loads = load_step(current, 1);
    copy_next_slot();
    convert_step(loads, weights[1]);
    finish_step(current, 0, weights[0]);
    wait_copies<kPendingAtWait>();
    fence_shared_for_wgmma();
    __syncthreads();
    issue_step(current, 1, weights[1]);
    read_position = read_position == Shape::kSlots - 1 ? 0 : read_position + 1;
    const SlotAddresses next = slot_addresses(read_position);
    loads = load_step(next, 0);
    convert_step(loads, weights[0]);
    finish_step(current, 1, weights[1]);
    current = next;
  }
  // The last slot (one or two steps): its copies landed before the loop's last barrier (or the
  // prologue's), and nothing is copied any more, so it meets at no barrier.
  issue_step(current, 0, weights[0]);
  const bool has_second = 2 * last_slot + 1 < steps;
  if (has_second) convert_step(load_step(current, 1), weights[1]);
  finish_step(current, 0, weights[0]);
  if (has_second) {
    issue_step(current, 1, weights[1]);
    finish_step(current, 1, weights[1]);
  }
  store_tile<kTokens>(args, tile, rows, row, quad, 0, acc);
}

}  // namespace lean3

// Persistent blocks walk the items (token tile, table, 64 weight rows; weight rows fastest, as
// for_each_prefill_item) in list order, so the items in flight share few experts' weights.
template <typename Shape>
__global__ void __launch_bounds__(kThreads, Shape::kBlocksPerSm)
    decode_wgmma_kernel(PrefillWgmmaArgs args, const PrefillTokenTile* tiles,
                        const int* tile_count) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t dynamic_shared[];
  uint8_t* shared = align_to_swizzle_atom(dynamic_shared);
  lean::fill_tables<Shape>(shared);
  // Launched as a dependent (launch_dependent): the tables above are constants in shared memory,
  // built while the kernel before still runs; the tile list, the tokens' codes and the outputs
  // are touched only after it.
  wait_for_prior_grids();
  allow_dependent_grids();
  __syncthreads();
  const int row_tiles = static_cast<int>(args.n / kRows);
  const int64_t items_per_tile = (args.second_out != nullptr ? 2 : 1) * row_tiles;
  const int64_t items = static_cast<int64_t>(*tile_count) * items_per_tile;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const PrefillTokenTile tile = tiles[item / items_per_tile];
    const int in_tile = static_cast<int>(item % items_per_tile);
    PrefillWgmmaArgs table = args;
    if (in_tile >= row_tiles) {
      table.experts = args.second_experts;
      table.out = args.second_out;
    }
    if (tile.small != 0) {
      lean3::decode_tile_lean3<Shape, kDecodeSmallTileTokens>(table, tile, in_tile % row_tiles,
                                                              shared);
    } else {
      lean3::decode_tile_lean3<Shape, kDecodeBigTileTokens>(table, tile, in_tile % row_tiles,
                                                            shared);
    }
    // The next item's first copies overwrite slots that slow warps may still read.
    __syncthreads();
  }
#else
  (void)args;
  (void)tiles;
  (void)tile_count;
  __trap();  // the host launches it on sm_90 only
#endif
}

// Two K steps a slot, 4 slots, 4 blocks an SM: kSlotsAhead x 8 KB of weight copies in flight a
// block, 96 KB an SM. The first version of the step was also built with 1-step slots (8 of them)
// and 4-step slots (2 blocks an SM): on the H200 (cuda_layer_bench, one layer's w1|w3 + w2, ms at
// b1 / b16 / b64 / b256, 2026-12-02) 1-step 0.0925 / 0.7485 / 2.0402 / 3.1034, 2-step 0.0844 /
// 0.6868 / 1.9057 / 2.8934, 4-step 0.0986 / 0.8802 / 2.4276 / 3.6364; 3 and 5-6 blocks an SM
// bought at most 1.8%. The tile is bound by the SM's instruction issue, not by the weight stream,
// which alone reaches the HBM floor in 128-byte pieces a row (the layer bench's "stream 128 B/row"
// rows).
using DecodeSlots = DecodeShape<2, 4, 4>;
static_assert(DecodeSlots::kBlocksPerSm * (DecodeSlots::kSharedAllocation + 1024) <= 228 * 1024,
              "the tables fit beside kBlocksPerSm blocks an SM");

void launch(const PrefillWgmmaArgs& args, const PrefillTokenTile* tiles, const int* tile_count,
            int64_t max_items, int sms) {
  using Shape = DecodeSlots;
  const auto blocks = static_cast<unsigned>(
      std::min<int64_t>(max_items, static_cast<int64_t>(sms) * Shape::kBlocksPerSm));
  if (blocks == 0) return;
  static const bool configured = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(decode_wgmma_kernel<Shape>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Shape::kSharedAllocation));
    return true;
  }();
  (void)configured;
  launch_dependent(decode_wgmma_kernel<Shape>, blocks, kThreads, Shape::kSharedAllocation,
                   current_stream(), args, tiles, tile_count);
}

}  // namespace decode_a

}  // namespace

WgmmaFold moe_wgmma_fold() {
  // The kernels are built for sm_90a only (wgmma): other devices keep the mma.sync tile.
  if (ops::batch_invariant() || !kMoeWgmma.enabled() || !deepinfer::cuda::device_has_wgmma()) {
    return WgmmaFold::kNone;
  }
  const int fold = kMoeWgmmaFold.value();
  if (fold == 128) return WgmmaFold::kPer128;
  if (fold == 32) return WgmmaFold::kPer32;
  DI_THROW("DEEPINFER_MOE_WGMMA_FOLD=", fold, " is not accepted: 32 or 128");
}

void launch_moe_prefill_wgmma(const PrefillWgmmaArgs& args, WgmmaFold fold,
                              const PrefillTokenTile* tiles, const int* tile_count,
                              int64_t max_tiles) {
  DI_CHECK(args.n % kRows == 0 && args.k % kStepK == 0, "launch_moe_prefill_wgmma: N ", args.n,
           " and K ", args.k, " must be multiples of ", kRows, " and ", kStepK);
  DI_CHECK(fold != WgmmaFold::kNone, "launch_moe_prefill_wgmma needs a wgmma fold");
  const int sms = deepinfer::cuda::multiprocessor_count();
  const int64_t max_items = max_tiles * (args.n / kRows);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(max_items, sms));
  if (blocks == 0) return;
  if (fold == WgmmaFold::kPer32) {
    launch_kernel<TileKind::kFold32>(args, blocks, tiles, tile_count);
  } else if (kMoeWgmmaRegisterA.enabled()) {
    launch_kernel<TileKind::kFold128RegisterA>(args, blocks, tiles, tile_count);
  } else {
    launch_kernel<TileKind::kFold128>(args, blocks, tiles, tile_count);
  }
}

void launch_moe_decode_wgmma(const PrefillWgmmaArgs& args, const PrefillTokenTile* tiles,
                             const int* tile_count, int64_t max_tiles) {
  DI_CHECK(args.n % decode_a::kRows == 0 && args.k % kStepK == 0, "launch_moe_decode_wgmma: N ",
           args.n, " and K ", args.k, " must be multiples of ", decode_a::kRows, " and ", kStepK);
  DI_CHECK(
      args.second_out == nullptr || (args.experts != nullptr && args.second_experts != nullptr),
      "launch_moe_decode_wgmma: a second table needs both tables' expert weights");
  const int sms = deepinfer::cuda::multiprocessor_count();
  const int64_t tables = args.second_out != nullptr ? 2 : 1;
  const int64_t max_items = max_tiles * tables * (args.n / decode_a::kRows);
  // The copies step 16 weight rows with a 32-bit stride.
  DI_CHECK(args.k <= (int64_t{1} << 28), "launch_moe_decode_wgmma: K ", args.k,
           " is too large for the decode tile");
  decode_a::launch(args, tiles, tile_count, max_items, sms);
}

template <bool kSwiglu>
void quantize_rows_per128(const ExpertRowsSource& source, uint8_t* codes, float* step_scales) {
  DI_CHECK(source.cols % kStepK == 0, "quantize_rows_per128: ", source.cols,
           " columns are not 128-wide steps");
  constexpr int kQuantThreads = 256;
  const int64_t steps_per_row = source.cols / kStepK;
  const int64_t warps =
      source.rows * ((steps_per_row + kQuantStepsPerWarp - 1) / kQuantStepsPerWarp);
  if (warps == 0) return;
  const unsigned blocks = blocks_for(warps * 32, kQuantThreads);
  if (kQuantHardwareCvt.enabled() && expert_rows_float4(source) && aligned_to(codes, 2)) {
    launch_dependent(quantize_rows_per128_vec_kernel<kSwiglu>, blocks, kQuantThreads, 0,
                     current_stream(), source, codes, step_scales);
    return;
  }
  if (kQuantHardwareCvt.enabled()) {
    quantize_rows_per128_kernel<kSwiglu, true>
        <<<blocks, kQuantThreads, 0, current_stream()>>>(source, codes, step_scales);
  } else {
    quantize_rows_per128_kernel<kSwiglu, false>
        <<<blocks, kQuantThreads, 0, current_stream()>>>(source, codes, step_scales);
  }
  DI_CUDA_LAUNCHED(quantize_rows_per128_kernel);
}

template void quantize_rows_per128<false>(const ExpertRowsSource&, uint8_t*, float*);
template void quantize_rows_per128<true>(const ExpertRowsSource&, uint8_t*, float*);

}  // namespace deepinfer::ops::cuda
