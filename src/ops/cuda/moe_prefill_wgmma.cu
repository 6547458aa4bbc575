// The fp4 prefill tile of moe_grouped_gemm.cu on Hopper's warpgroup MMA (wgmma, sm_90a).
//
// The mma.sync tile is issue bound: every m16n8k32 is followed by four scale FMAs in the same
// warp, so the tensor cores wait on the scheduler. wgmma does a 64 x N x 32 product per
// instruction from shared memory, so one instruction replaces 4 x N / 8 mma.sync and the warps'
// issue slots go to the scale folds only, while the next block's product runs.
//
// Same bits as the mma.sync tile, which keeps the op batch invariant (the kernel is chosen by rows
// per expert): every output element is, per 32-wide K block, one tensor-core dot of the same 32
// products from a fresh accumulator (scale-d false; the probe in tests/ops/moe_wgmma_test.cpp
// checks that wgmma's and mma.sync's dots agree bit for bit), times the same scale product
// (x_scale * (w_scale * 64), the same floats), added in ascending K with the same expression.
// The K slot of each product is also the same: the activations keep CodeLayout::kMmaHalves (byte
// s of a block's 32 holds the code of mma.sync's k-slot s), and the weights' 16-byte fp4 block
// becomes 32 e4m3 bytes with the low nibbles (K 8t + 2i, slot 4t + i) first and the high nibbles
// (K 8t + 2i + 1, slot 16 + 4t + i) after, which is where the mma.sync tile's fragments put them.
//
// Block: 256 threads, two warpgroups; warpgroup g owns weight rows [64g, 64g + 64) of the
// block's 128 and all the tile's tokens (128 or 32: the same token tile list as the mma.sync
// tile). K runs in steps of 128 (4 scale blocks) through kStages shared-memory slots filled by
// cp.async: the tokens' 128 e4m3 bytes per step form one 128-byte line each, the 16-byte chunk c
// of token t at c ^ (t % 8) (wgmma's 128-byte swizzle, so both operands are K-major with no
// transpose, as e4m3 requires). The block converts each step's raw fp4 weights into an e4m3
// buffer of the same swizzled layout and decodes the scale codes into float tables; each
// warpgroup runs a step's 4 blocks with block b + 1's wgmma issued into the second partial
// before block b's partial is folded into the totals, so the tensor cores work while the warps
// scale. The default schedule converts step s + 1 (into a second buffer) while step s's first
// two wgmmas run; DEEPINFER_MOE_WGMMA_OVERLAP=0 converts between steps instead (one buffer).
//
// The warps' issue slots bound this kernel too: per 32-block each accumulator element takes a
// multiply (x_scale * w_scale) and an FMA, 2 instructions per 2 x 32 x 1 tensor FLOP, which caps
// it near half of the FP8 peak; what it removes is the mma.sync tile's per-MMA fragment loads
// and conversions and its 8-token granularity.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8_mma.cuh"
#include "ops/cuda/linear.cuh"
#include "ops/cuda/moe_prefill_wgmma.h"

namespace deepinfer::ops::cuda {
namespace {

// false: DEEPINFER_MOE_WGMMA=1 or set_moe_wgmma(true) is needed to take this kernel (the first
// version, until the H200 run has checked the probe and the bits); true: it is the prefill path
// and DEEPINFER_MOE_WGMMA=0 returns to the mma.sync tile.
constexpr bool kUseWgmmaByDefault = false;

// -1: follow the environment; 0 / 1: set_moe_wgmma's override.
std::atomic<int> wgmma_override{-1};

// true: each step's weight conversion runs while the step before it is on the tensor cores, and
// the next step's first wgmmas are issued before the last fold (see wgmma_tile); false, or
// DEEPINFER_MOE_WGMMA_OVERLAP=0: convert, barrier, then the step's wgmmas (the first version).
// The same bits either way.
constexpr bool kOverlapConversion = true;
std::atomic<bool> overlap_allowed{true};

bool overlap_enabled() {
  static const bool by_environment =
      kOverlapConversion && !disabled_by_environment("DEEPINFER_MOE_WGMMA_OVERLAP");
  return by_environment && overlap_allowed.load(std::memory_order_relaxed);
}

bool wgmma_by_environment() {
  static const bool enabled = [] {
    const char* setting = std::getenv("DEEPINFER_MOE_WGMMA");
    if (setting != nullptr && std::string_view(setting) == "1") return true;
    return kUseWgmmaByDefault && !disabled_by_environment("DEEPINFER_MOE_WGMMA");
  }();
  return enabled;
}

// The kernels are built for sm_90a only (wgmma): other devices keep the mma.sync tile.
bool device_is_sm90() {
  static const bool sm90 = [] {
    int device = 0;
    int major = 0;
    int minor = 0;
    DI_CUDA_CHECK(cudaGetDevice(&device));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    DI_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major == 9 && minor == 0;
  }();
  return sm90;
}

constexpr int kScaleBlock = 32;                    // the wgmma's K and both operands' scale block
constexpr int kStepBlocks = 4;                     // scale blocks per pipeline step
constexpr int kStepK = kStepBlocks * kScaleBlock;  // 128 bytes of e4m3: one swizzled line
constexpr int kRows = 128;                         // weight rows per block
constexpr int kWarpgroupRows = 64;                 // wgmma's M
constexpr int kThreads = 2 * 128;                  // two warpgroups
constexpr int kStages = 4;
constexpr int kMaxTokens = kPrefillBigTileTokens;
constexpr float kE2m1Rescale = 64.0f;  // undoes the 2^-6 of the e4m3 weight codes
static_assert(kPrefillSmallTileTokens % 16 == 0 && kMaxTokens % 16 == 0,
              "the fold reads the token scales of two 8-token column groups at a time");
static_assert(kRows + kMaxTokens <= kThreads,
              "one thread per weight row and per token copies and decodes a step's scale codes");

// One pipeline slot: the tokens' e4m3 lines (swizzled, wgmma's B), the raw fp4 weight rows (64
// bytes each, read only by the conversion), and the step's ue8m0 codes (4 per row / token).
constexpr int kCodesOffset = 0;
constexpr int kRawWeightOffset = kCodesOffset + kMaxTokens * kStepK;
constexpr int kWeightCodesOffset = kRawWeightOffset + kRows * kStepK / 2;
constexpr int kTokenCodesOffset = kWeightCodesOffset + kRows * kStepBlocks;
constexpr int kStageBytes = kTokenCodesOffset + kMaxTokens * kStepBlocks;
// After the slots, two buffers (the overlapped schedule converts step s + 1 into one while
// step s's wgmmas read the other; the plain one uses buffer 0): a step's e4m3 weights
// (swizzled, wgmma's A), then its decoded scales.
constexpr int kWeightsOffset = kStages * kStageBytes;
constexpr int kWeightsBytes = kRows * kStepK;
constexpr int kScalesOffset = kWeightsOffset + 2 * kWeightsBytes;
constexpr int kWeightScalesBytes = kStepBlocks * kRows * 4;  // f32 [block][row]
// The token scales of a block grouped by the accumulator's quad (token 8j + 2q + e at
// q * kQuadStride + 2j + e), so a thread's come 4 at a time; the stride's 4 extra floats put
// the quads' 16-byte loads in different banks.
constexpr int kQuadStride = kMaxTokens / 4 + 4;
constexpr int kTokenScalesPerBlock = 4 * kQuadStride;
constexpr int kTokenScalesBytes = kStepBlocks * kTokenScalesPerBlock * 4;
constexpr int kScalesBytes = kWeightScalesBytes + kTokenScalesBytes;
constexpr int kSharedBytes = kScalesOffset + 2 * kScalesBytes;
constexpr int kSwizzleAtom = 1024;  // 8 lines of 128 bytes: the swizzle repeats from there
constexpr int kSharedAllocation = kSharedBytes + kSwizzleAtom;  // room to align the base
static_assert(kStageBytes % kSwizzleAtom == 0 && kWeightsOffset % kSwizzleAtom == 0 &&
                  kWeightsBytes % kSwizzleAtom == 0 &&
                  (kWarpgroupRows * kStepK) % kSwizzleAtom == 0,
              "the wgmma operands start on swizzle atoms");

// moe_grouped_gemm.cu's conversion (the same bits): four fp4 codes in the low nibbles of the
// bytes -> four e4m3 bytes of 2^-6 times their value, exact for normal and subnormal codes.
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3x4_scaled(uint32_t codes) {
  return ((codes & 0x07070707u) << 2) | ((codes & 0x08080808u) << 4);
}

__device__ __forceinline__ float scale_code(uint32_t codes, int shift) {
  return deepinfer::cuda::e8m0_to_float(static_cast<uint8_t>(codes >> shift));
}

// 4 bytes global -> shared (the scale codes of a row: 4 blocks).
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

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// After wgmma_wait: the registers' values are read only after this point (the compiler sees
// the wgmma as producing them when it is issued).
template <int kCount>
__device__ __forceinline__ void hold_after_wait(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x N) = A . B from descriptors with scale-d false: a fresh f32 result per call, the
// registers' old values unused. d[4j + {0, 1, 2, 3}] of lane (g, t) of warp w in the warpgroup
// is (row 16w + g, col 8j + 2t), (16w + g, 8j + 2t + 1), (16w + g + 8, 8j + 2t), (16w + g + 8,
// 8j + 2t + 1), the mma.sync accumulator layout repeated along N.
__device__ __forceinline__ void wgmma_m64n32k32_fresh(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
      "}, %16, %17, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(0)
      : "memory");
}

__device__ __forceinline__ void wgmma_m64n64k32_fresh(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, accumulate, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(0)
      : "memory");
}

__device__ __forceinline__ void wgmma_m64n128k32_fresh(float (&d)[64], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %66, 0;\n"
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
      : "l"(a), "l"(b), "r"(0)
      : "memory");
}

template <int kTokens>
__device__ __forceinline__ void wgmma_fresh(float (&d)[kTokens / 2], uint64_t a, uint64_t b) {
  if constexpr (kTokens == 128) {
    wgmma_m64n128k32_fresh(d, a, b);
  } else if constexpr (kTokens == 64) {
    wgmma_m64n64k32_fresh(d, a, b);
  } else {
    static_assert(kTokens == 32, "token tiles of 32, 64 or 128");
    wgmma_m64n32k32_fresh(d, a, b);
  }
}

// One work item: weight rows [128 row_tile, +128) times one token tile of kTokens (128 or 32).
template <int kTokens, bool kOverlap>
__device__ __forceinline__ void wgmma_tile(const PrefillWgmmaArgs& args,
                                           const PrefillTokenTile& tile, int row_tile,
                                           uint8_t* shared) {
  constexpr int kPartial = kTokens / 2;  // f32 registers of one m64nNk32 result per thread
  const int tokens = min(tile.end - tile.first, kTokens);  // >= 1
  const int thread = threadIdx.x;
  const int warpgroup = thread / 128;
  const int lane = thread & 31;
  const int group = lane >> 2;
  const int quad = lane & 3;
  // This thread's accumulator rows within the block: row and row + 8.
  const int row = warpgroup * kWarpgroupRows + ((thread / 32) % 4) * 16 + group;
  const int64_t n_first = static_cast<int64_t>(row_tile) * kRows;
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
  // Tokens past the tile's rows load the last row and are never stored (as the mma.sync tile).
  const auto token_row = [&](int token) -> int64_t { return tile.first + min(token, tokens - 1); };

  const auto copy_stage = [&](int step, int slot) {
    uint8_t* base = shared + slot * kStageBytes;
    constexpr int kWeightChunks = kRows * (kStepK / 2) / 16;
    for (int chunk = thread; chunk < kWeightChunks; chunk += kThreads) {
      const int r = chunk / 4;
      const int c = chunk % 4;
      copy_16_async(shared_address(base + kRawWeightOffset + r * (kStepK / 2) + c * 16),
                    weight + (w_row_first + r) * w_row_bytes +
                        static_cast<int64_t>(step) * (kStepK / 2) + c * 16);
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
                   w_scales + (w_row_first + thread) * k_blocks + block);
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
    // One chunk at a time: the overlapped schedule runs this with two partials in flight.
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
        token_scales[b * kTokenScalesPerBlock + ((token >> 1) & 3) * kQuadStride +
                     2 * (token >> 3) + (token & 1)] = scale_code(codes, 8 * b);
      }
    }
    // The overlapped schedule's next warp-collective instruction (wgmma.wait_group, .aligned)
    // follows without a barrier: the warp is whole again first.
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

  // wgmma of K block b of `step` into d, reading the converted weights of `buffer`.
  const auto issue = [&](float(&d)[kPartial], int step, int buffer, int b) {
    const uint32_t weights_address =
        shared_address(weights_of(buffer) + warpgroup * kWarpgroupRows * kStepK);
    const uint32_t codes_address = shared_address(shared + (step % kStages) * kStageBytes);
    wgmma_fence();  // d was read by a fold (or the registers are fresh)
    wgmma_fresh<kTokens>(d, swizzled_operand(weights_address + b * kScaleBlock),
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
  static_assert(kStepBlocks == 4, "the schedules below are written out for 4 blocks a step");

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) copy_stage(s, s);
    commit_copies();
  }
  if constexpr (!kOverlap) {
    for (int step = 0; step < steps; ++step) {
      wait_copies<kStages - 2>();
      // Step `step` has landed; every warp is done with the last step's buffers and slot.
      __syncthreads();
      const int ahead = step + kStages - 1;
      if (ahead < steps) copy_stage(ahead, ahead % kStages);
      commit_copies();
      prepare_stage(step % kStages, 0);
      fence_shared_for_wgmma();
      __syncthreads();
      issue(partial[0], step, 0, 0);
      issue(partial[1], step, 0, 1);
      fold_after_one(partial[0], 0, 0);
      issue(partial[0], step, 0, 2);
      fold_after_one(partial[1], 0, 1);
      issue(partial[1], step, 0, 3);
      fold_after_one(partial[0], 0, 2);
      fold_after_all(partial[1], 0, 3);
    }
  } else {
    // Step s reads buffer s % 2. While its first two wgmmas run, the block converts step s + 1
    // into the other buffer, whose last readers (step s - 1's wgmmas and folds) finished before
    // barrier X; barrier Y makes step s + 1's copies visible to the converting threads, and the
    // next step's X makes the conversion visible to the wgmmas. The slot refilled after X held
    // step s - 1's activations, whose wgmmas every warp waited for before X.
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
  }

  const int64_t n = n_first + row;
#pragma unroll
  for (int j = 0; j < kTokens / 8; ++j) {
    const int token = 8 * j + 2 * quad;
    if (token < tokens) {
      float* out = args.out + (tile.first + token) * args.out_stride + n;
      out[0] = acc[4 * j + 0];
      out[8] = acc[4 * j + 2];
    }
    if (token + 1 < tokens) {
      float* out = args.out + (tile.first + token + 1) * args.out_stride + n;
      out[0] = acc[4 * j + 1];
      out[8] = acc[4 * j + 3];
    }
  }
}

__device__ __forceinline__ uint8_t* align_to_swizzle_atom(uint8_t* pointer) {
  const uint32_t address = shared_address(pointer);
  return pointer + ((kSwizzleAtom - (address % kSwizzleAtom)) % kSwizzleAtom);
}

// Persistent blocks (one per SM) walk the items (token tile, 128 weight rows) in list order,
// weight rows fastest, as prefill_tile_kernel does.
template <bool kOverlap>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_wgmma_kernel(PrefillWgmmaArgs args, const PrefillTokenTile* tiles,
                         const int* tile_count) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t dynamic_shared[];
  uint8_t* shared = align_to_swizzle_atom(dynamic_shared);
  const int row_tiles = static_cast<int>(args.n / kRows);
  const int64_t items = static_cast<int64_t>(*tile_count) * row_tiles;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const PrefillTokenTile tile = tiles[item / row_tiles];
    const int row_tile = static_cast<int>(item % row_tiles);
    if (tile.small != 0) {
      wgmma_tile<kPrefillSmallTileTokens, kOverlap>(args, tile, row_tile, shared);
    } else {
      wgmma_tile<kPrefillBigTileTokens, kOverlap>(args, tile, row_tile, shared);
    }
    __syncthreads();  // the next item's first copies overwrite what slow warps may still read
  }
#else
  (void)args;
  (void)tiles;
  (void)tile_count;
  __trap();  // the host launches it on sm_90 only
#endif
}

// The probe: one warpgroup; see probe_fp8_block_dots.
constexpr int kProbeRows = 64;
constexpr int kProbeK = 128;
__global__ void __launch_bounds__(128)
    probe_block_dots_kernel(const uint8_t* a, const uint8_t* b, float* wgmma_out,
                            float* mma_sync_out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ uint8_t raw_shared[2 * kProbeRows * kProbeK + kSwizzleAtom];
  uint8_t* a_tile = align_to_swizzle_atom(raw_shared);
  uint8_t* b_tile = a_tile + kProbeRows * kProbeK;
  const int thread = threadIdx.x;
  for (int chunk = thread; chunk < kProbeRows * kProbeK / 16; chunk += 128) {
    const int r = chunk / 8;
    const int c = chunk % 8;
    const int swizzled = r * kProbeK + ((c ^ (r & 7)) << 4);
    *reinterpret_cast<uint4*>(a_tile + swizzled) =
        *reinterpret_cast<const uint4*>(a + r * kProbeK + c * 16);
    *reinterpret_cast<uint4*>(b_tile + swizzled) =
        *reinterpret_cast<const uint4*>(b + r * kProbeK + c * 16);
  }
  fence_shared_for_wgmma();
  __syncthreads();
  const int lane = thread & 31;
  const int group = lane >> 2;
  const int quad = lane & 3;
  const int row = (thread / 32) * 16 + group;
  const auto word = [&](const uint8_t* matrix, int r, int k) {
    return *reinterpret_cast<const uint32_t*>(matrix + r * kProbeK + k);
  };
  float d[32] = {};
  for (int block = 0; block < kProbeK / kScaleBlock; ++block) {
    wgmma_fence();
    wgmma_m64n64k32_fresh(d, swizzled_operand(shared_address(a_tile) + block * kScaleBlock),
                          swizzled_operand(shared_address(b_tile) + block * kScaleBlock));
    wgmma_commit();
    wgmma_wait<0>();
    hold_after_wait(d);
    float* wgmma_block = wgmma_out + block * kProbeRows * kProbeRows;
    float* mma_block = mma_sync_out + block * kProbeRows * kProbeRows;
    for (int j = 0; j < kProbeRows / 8; ++j) {
      const int col = 8 * j + 2 * quad;
      wgmma_block[row * kProbeRows + col] = d[4 * j + 0];
      wgmma_block[row * kProbeRows + col + 1] = d[4 * j + 1];
      wgmma_block[(row + 8) * kProbeRows + col] = d[4 * j + 2];
      wgmma_block[(row + 8) * kProbeRows + col + 1] = d[4 * j + 3];
      const int k = block * kScaleBlock + 4 * quad;
      const uint32_t fragment[4] = {word(a, row, k), word(a, row + 8, k), word(a, row, k + 16),
                                    word(a, row + 8, k + 16)};
      float e[4];
      mma_e4m3_from_zero(fragment, word(b, 8 * j + group, k), word(b, 8 * j + group, k + 16), e);
      mma_block[row * kProbeRows + col] = e[0];
      mma_block[row * kProbeRows + col + 1] = e[1];
      mma_block[(row + 8) * kProbeRows + col] = e[2];
      mma_block[(row + 8) * kProbeRows + col + 1] = e[3];
    }
  }
#else
  (void)a;
  (void)b;
  (void)wgmma_out;
  (void)mma_sync_out;
  __trap();
#endif
}

}  // namespace

bool moe_wgmma_enabled() {
  const int forced = wgmma_override.load(std::memory_order_relaxed);
  const bool wanted = forced >= 0 ? forced == 1 : wgmma_by_environment();
  return wanted && device_is_sm90();
}

void set_moe_wgmma(bool enabled) {
  wgmma_override.store(enabled ? 1 : 0, std::memory_order_relaxed);
}

void set_moe_wgmma_overlap(bool enabled) {
  overlap_allowed.store(enabled, std::memory_order_relaxed);
}

void launch_moe_prefill_wgmma(const PrefillWgmmaArgs& args, const PrefillTokenTile* tiles,
                              const int* tile_count, int64_t max_tiles) {
  DI_CHECK(args.n % kRows == 0 && args.k % kStepK == 0, "launch_moe_prefill_wgmma: N ", args.n,
           " and K ", args.k, " must be multiples of ", kRows, " and ", kStepK);
  static const bool configured = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(prefill_wgmma_kernel<true>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kSharedAllocation));
    DI_CUDA_CHECK(cudaFuncSetAttribute(prefill_wgmma_kernel<false>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kSharedAllocation));
    return true;
  }();
  (void)configured;
  int device = 0;
  int sms = 0;
  DI_CUDA_CHECK(cudaGetDevice(&device));
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t max_items = max_tiles * (args.n / kRows);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(max_items, sms));
  if (blocks == 0) return;
  if (overlap_enabled()) {
    prefill_wgmma_kernel<true>
        <<<blocks, kThreads, kSharedAllocation, current_stream()>>>(args, tiles, tile_count);
  } else {
    prefill_wgmma_kernel<false>
        <<<blocks, kThreads, kSharedAllocation, current_stream()>>>(args, tiles, tile_count);
  }
  DI_CUDA_LAUNCHED(prefill_wgmma_kernel);
}

bool probe_fp8_block_dots(const uint8_t* a, const uint8_t* b, float* wgmma_out,
                          float* mma_sync_out) {
  if (!device_is_sm90()) return false;
  constexpr size_t kInputBytes = kProbeRows * kProbeK;
  constexpr size_t kOutputBytes = (kProbeK / kScaleBlock) * kProbeRows * kProbeRows * 4;
  const auto stream = current_stream();
  StreamBuffer buffer(2 * kInputBytes + 2 * kOutputBytes);
  uint8_t* device_a = buffer.as<uint8_t>();
  uint8_t* device_b = device_a + kInputBytes;
  auto* device_wgmma = reinterpret_cast<float*>(device_b + kInputBytes);
  auto* device_mma_sync = device_wgmma + kOutputBytes / 4;
  DI_CUDA_CHECK(cudaMemcpyAsync(device_a, a, kInputBytes, cudaMemcpyHostToDevice, stream));
  DI_CUDA_CHECK(cudaMemcpyAsync(device_b, b, kInputBytes, cudaMemcpyHostToDevice, stream));
  probe_block_dots_kernel<<<1, 128, 0, stream>>>(device_a, device_b, device_wgmma, device_mma_sync);
  DI_CUDA_LAUNCHED(probe_block_dots_kernel);
  DI_CUDA_CHECK(
      cudaMemcpyAsync(wgmma_out, device_wgmma, kOutputBytes, cudaMemcpyDeviceToHost, stream));
  DI_CUDA_CHECK(
      cudaMemcpyAsync(mma_sync_out, device_mma_sync, kOutputBytes, cudaMemcpyDeviceToHost, stream));
  DI_CUDA_CHECK(cudaStreamSynchronize(stream));
  return true;
}

}  // namespace deepinfer::ops::cuda
