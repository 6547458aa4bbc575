// The CSA2 compressed branch: the compressor's gated pooling, the indexer's scores, and the
// two-level top-k selection. Both selections use one exact per-row top-k: a radix select finds
// the k-th largest key, then one ordered pass keeps everything above it and the lowest-index
// ties at it, which is the CPU reference's "larger first, then lower index" order.
#include <cuda_bf16.h>
#include <algorithm>
#include <cstddef>
#include <cub/block/block_scan.cuh>
#include <limits>
#include <vector>

#include "ops/batch_invariance.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/fp8_mma.cuh"

namespace deepinfer::ops::cuda {
namespace {

using deepinfer::cuda::e2m1_to_float;
using deepinfer::cuda::e8m0_to_float;
using deepinfer::cuda::round_to_e2m1;

constexpr int kThreads = 256;

__global__ void compress_pool_kernel(DeviceRows<const float> kv, DeviceRows<const float> gate,
                                     int ratio, DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= out.rows * out.cols) return;
  const int64_t group = index / out.cols;
  const int64_t c = index % out.cols;
  float max_gate = -INFINITY;
  for (int j = 0; j < ratio; ++j) max_gate = fmaxf(max_gate, gate.row(group * ratio + j)[c]);
  float denominator = 0.0f;
  for (int j = 0; j < ratio; ++j) denominator += expf(gate.row(group * ratio + j)[c] - max_gate);
  float sum = 0.0f;
  for (int j = 0; j < ratio; ++j) {
    const float weight = expf(gate.row(group * ratio + j)[c] - max_gate) / denominator;
    sum += kv.row(group * ratio + j)[c] * weight;
  }
  out.row(group)[c] = sum;
}

// ---- the indexer key cache (ops::IndexerKeys: e2m1 codes, a ue8m0 scale per 32 channels) ----

constexpr int kKeyBlock = 32;

// A key cache on the device: key j's codes at codes + j * code_stride (dim / 2 bytes, channel
// 2i in the low nibble of byte i), its scales at scales + j * scale_stride (dim / 32 bytes).
struct DeviceKeys {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  int64_t code_stride = 0;
  int64_t scale_stride = 0;
  int64_t rows = 0;
  int64_t dim = 0;
};

DeviceKeys device_keys(const IndexerKeys& keys, const char* what) {
  DeviceKeys result;
  if (keys.rows() == 0) return result;
  const TensorView& codes = keys.codes;
  const TensorView& scales = keys.scales;
  DI_CHECK(codes.device().is_cuda() && scales.device().is_cuda(), what, " is not in device memory");
  DI_CHECK(codes.dtype() == DType::kF4E2M1x2 && scales.dtype() == DType::kF8E8M0 &&
               codes.rank() == 2 && scales.rank() == 2 && scales.size(0) == codes.size(0) &&
               codes.size(1) % kKeyBlock == 0 && scales.size(1) == codes.size(1) / kKeyBlock &&
               (scales.size(1) == 1 || scales.stride(1) == 1),
           what, ": codes ", codes.to_string(), " and scales ", scales.to_string(),
           " are not fp4 keys with a scale per ", kKeyBlock, " channels");
  // Packed fp4 strides count values: a row's bytes are half of them.
  result.codes = static_cast<const uint8_t*>(codes.raw_data());
  result.scales = static_cast<const uint8_t*>(scales.raw_data());
  result.code_stride = codes.stride(0) / 2;
  result.scale_stride = scales.stride(0);
  result.rows = codes.size(0);
  result.dim = codes.size(1);
  return result;
}

// Channel d of key j: exact in f32 (the value fake_quant_fp4 produced).
__device__ __forceinline__ float key_value(const DeviceKeys& keys, int64_t j, int64_t d) {
  const uint8_t pair = keys.codes[j * keys.code_stride + d / 2];
  return e2m1_to_float((d & 1) ? pair >> 4 : pair & 0xF) *
         e8m0_to_float(keys.scales[j * keys.scale_stride + d / kKeyBlock]);
}

// The ue8m0 code of 2^ceil(log2(t)) (exponent field plus one when a mantissa bit is set, as
// e8m0_pow2_ceil on the host); non-finite t and results past 2^127 give 0xFF (NaN).
__device__ __forceinline__ uint32_t e8m0_pow2_ceil_code(float t) {
  const uint32_t bits = __float_as_uint(t);
  const uint32_t code = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0);
  return code >= 0xFF ? 0xFFu : code;
}

// e2m1 code of a value on the e2m1 grid (sign in bit 3).
__device__ __forceinline__ uint32_t e2m1_code(float value) {
  const float m = fabsf(value);
  const uint32_t magnitude =
      m < 2.0f ? static_cast<uint32_t>(2.0f * m)
               : (m < 4.0f ? 2u + static_cast<uint32_t>(m) : (m == 4.0f ? 6u : 7u));
  return magnitude | (signbit(value) ? 8u : 0u);
}

struct KeyDestination {
  uint8_t* codes;
  uint8_t* scales;
  int64_t source_row;
};

// One block per written key, one warp per 32-channel block: the block's amax by shuffles, the
// scale and codes as ops::cpu::write_indexer_keys computes them, lane pairs packed into bytes.
__global__ void write_indexer_keys_kernel(DeviceRows<const float> keys,
                                          const KeyDestination* destinations) {
  const KeyDestination destination = destinations[blockIdx.x];
  const int block = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const float v = keys.row(destination.source_row)[threadIdx.x];
  float amax = fabsf(v);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  const bool nan = __any_sync(0xffffffffu, isnan(v));
  const uint32_t scale_code =
      nan ? 0xFFu : e8m0_pow2_ceil_code(fmaxf(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
  const float scale = e8m0_to_float(static_cast<uint8_t>(scale_code));
  // A NaN scale stores zero codes (the block reads as NaN whatever they are).
  const uint32_t code =
      scale_code == 0xFFu ? 0u : e2m1_code(round_to_e2m1(fminf(fmaxf(v / scale, -6.0f), 6.0f)));
  const uint32_t high = __shfl_down_sync(0xffffffffu, code, 1);
  if ((lane & 1) == 0) {
    destination.codes[(threadIdx.x >> 1)] = static_cast<uint8_t>(code | (high << 4));
  }
  if (lane == 0) destination.scales[block] = static_cast<uint8_t>(scale_code);
}

constexpr int kIndexerWarps = 8;

// One block per (token, 8 keys): the token's queries sit in shared memory, each warp scores
// one key against every head in head order.
__global__ void __launch_bounds__(kIndexerWarps * 32)
    indexer_scores_kernel(DeviceRows<const float> q, int64_t heads, int64_t dim, DeviceKeys keys,
                          DeviceRows<const float> weights, const int32_t* visible, float scale,
                          DeviceRows<float> out) {
  extern __shared__ float query[];  // heads * dim
  const int64_t t = blockIdx.y;
  for (int64_t i = threadIdx.x; i < heads * dim; i += blockDim.x) query[i] = q.row(t)[i];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kIndexerWarps + (threadIdx.x >> 5);
  if (j >= keys.rows) return;
  const int64_t limit = deepinfer::cuda::min64(visible[t], keys.rows);
  if (j >= limit) {
    if (lane == 0) out.row(t)[j] = -INFINITY;
    return;
  }
  float sum = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    float partial = 0.0f;
    for (int64_t d = lane; d < dim; d += 32) partial += query[h * dim + d] * key_value(keys, j, d);
    const float s = deepinfer::cuda::warp_sum(partial);
    sum += fmaxf(s, 0.0f) * scale * weights.row(t)[h];
  }
  if (lane == 0) out.row(t)[j] = sum;
}

// ---- indexer_scores_batch on the tensor cores ------------------------------------------------
//
// Per token the scores are a GEMM, q [heads, dim] . keys^T [dim, keys], followed by a weighted
// relu sum over heads. mma.sync m16n8k16 (bf16 in, f32 accumulate) runs it with heads as M and
// keys as N: the forward fake-quantizes q and keys to fp4 (e2m1 times a power-of-two scale per
// 32 dims), so their bf16 roundings are exact and so is every product (at most 8 significant
// bits); a 32-dim block's sum needs at most 13 bits, so a whole dot is exact in f32 in any order
// -- the reference's dots exactly -- unless the block scales of one q row and key span more than
// about 2^10. Only the head sum's order differs from the reference. Other inputs are rounded to
// bf16 (ops.h says so). A block owns 256 keys of one request (each warp 32 of them, held as
// bf16 B fragments in registers for the whole block) and serves up to 64 of that request's
// tokens, their q rows staged through shared memory a few tokens per pass (cp.async into a
// landing buffer while the block computes the previous pass, then bf16 rows the MMAs read).
// Decode (one token per request) reads each key once, at the memory floor of f32 keys; prefill
// reuses each block's keys for its 64 tokens.
//
// Batch invariance: an element's arithmetic is its own MMA k order (fixed by dim), then its
// heads summed in a fixed order (per lane heads g, g+8 of each 16-head tile ascending, then a
// butterfly over the 8 lane groups) -- nothing depends on the call's tokens, requests or grid.

// false: indexer_scores_batch launches the FP32 per-request kernel once per request (plus a fill
// of the columns past each request's keys), the forward's path before the batched op.
// DEEPINFER_INDEXER_MMA=0 does the same at run time.
RuntimeSwitch kIndexerTensorCores{"DEEPINFER_INDEXER_MMA", true};

// One block row of a batched call: a run of one request's tokens and that request's keys
// (8-byte fields only: no padding in the uploaded table).
struct IndexerChunk {
  const uint8_t* codes;  // the request's key cache (DeviceKeys)
  const uint8_t* scales;
  int64_t code_stride;
  int64_t scale_stride;
  int64_t entries;
  int64_t token_begin;  // rows [token_begin, token_end) of the call
  int64_t token_end;
};

constexpr int kMmaWarps = 8;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kKeyTilesPerWarp = 4;  // MMA N tiles of 8 keys
constexpr int kKeysPerWarp = kKeyTilesPerWarp * 8;
constexpr int kKeysPerBlock = kMmaWarps * kKeysPerWarp;
constexpr int kTokensPerBlock = 64;
// q rows per pass (tokens x heads padded to 16); also the most heads the kernel takes.
constexpr int kStageRows = 64;

// bf16 pairs per staged q row: dim/2 plus 8 words of padding, so the 8-byte A-fragment loads of
// a half warp (4 rows x 4 lanes) fall in distinct banks.
__host__ __device__ constexpr int staged_row_words(int dim) {
  return dim / 2 + 8;
}

// Shared memory, in 4-byte words: two landing buffers of raw f32 q rows and their weights
// (cp.async fills one while the block computes from the other), then the bf16 q rows and the
// weights the MMAs read.
__host__ __device__ constexpr int landing_words(int dim) {
  return kStageRows * dim + kStageRows;
}
__host__ __device__ constexpr int indexer_mma_shared_words(int dim) {
  return 2 * landing_words(dim) + kStageRows * staged_row_words(dim) + kStageRows;
}

// Two floats -> bf16x2 (round to nearest even), `low` in bits 0-15 (the lower MMA k index).
__device__ __forceinline__ uint32_t pack_bf16x2(float low, float high) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}

// The MMA kernels' k map: lane quad c holds channels [c * dim / 4, (c + 1) * dim / 4) of a key,
// dim / 8 adjacent code bytes under one scale (dim <= 128), taken four channels a 16-k step:
// step s gives the quad k = 2c, 2c+1 (fragment register 0) and 2c+8, 2c+9 (register 1) as
// channels c * dim / 4 + 4s + {0, 1} and + {2, 3}, i.e. code bytes 2s and 2s + 1 of the lane's.
// A and B use the same map, so the dot is unchanged. Staged q rows keep the word order the
// fragments read (step s, quad c at word 8s + 2c), so the channels' 4-quad d4 goes to:
template <int kDim>
__device__ __forceinline__ int staged_quad_word(int d4) {
  constexpr int kKSteps = kDim / 16;
  return 8 * (d4 % kKSteps) + 2 * (d4 / kKSteps);
}

template <int kDim>
struct LaneCodes {
  static constexpr int kWords = kDim / 32;  // dim / 8 bytes
  uint32_t words[kWords];
  float scale;
};

// Lane quad `quad`'s code bytes and scale of key `key` (zeros when absent), through L2 only
// (ld.global.cg): the keys may be written by the kernel a dependent launch waited for, after this
// grid started, and the non-coherent path promises data that does not change while a grid runs.
template <int kDim>
__device__ __forceinline__ LaneCodes<kDim> load_lane_codes(const uint8_t* codes,
                                                           const uint8_t* scales,
                                                           int64_t code_stride,
                                                           int64_t scale_stride, int64_t key,
                                                           bool present, int quad) {
  static_assert(kDim == 32 || kDim == 64 || kDim == 128, "one scale a lane: dim <= 128");
  LaneCodes<kDim> lane{};
  if (!present) return lane;
  const uint8_t* source = codes + key * code_stride + quad * (kDim / 8);
  if constexpr (kDim == 128) {
    const uint4 v = __ldcg(reinterpret_cast<const uint4*>(source));
    lane.words[0] = v.x;
    lane.words[1] = v.y;
    lane.words[2] = v.z;
    lane.words[3] = v.w;
  } else if constexpr (kDim == 64) {
    const uint2 v = __ldcg(reinterpret_cast<const uint2*>(source));
    lane.words[0] = v.x;
    lane.words[1] = v.y;
  } else {
    lane.words[0] = __ldcg(reinterpret_cast<const unsigned int*>(source));
  }
  lane.scale = e8m0_to_float(scales[key * scale_stride + quad * kDim / 128]);
  return lane;
}

// The e2m1 nibble at bit `shift` of `word` as an f32 equal to 2^-126 times its value: the
// magnitude's two exponent bits land in the f32 exponent's low bits and its mantissa bit in the
// f32 mantissa's top bit, so the normal codes read 2^(e-127) (1 + m/2) and the subnormal 0.5
// the subnormal 2^-127 -- each 2^-126 times its e2m1 value -- without a table or a branch.
__device__ __forceinline__ float e2m1_bits_as_float(uint32_t word, int shift) {
  const uint32_t nibble = word >> shift;
  return __uint_as_float(((nibble & 7u) << 22) | ((nibble & 8u) << 28));
}

// Code byte `byte` of the lane's (two channels) times the scale, as bf16x2: exact (an e2m1
// value times a power of two has at most 2 significant bits; the products by powers of two are
// exact in f32, subnormals included).
template <int kDim>
__device__ __forceinline__ uint32_t lane_pair_bf16x2(const LaneCodes<kDim>& lane, int byte) {
  const uint32_t word = lane.words[byte / 4];
  const int shift = 8 * (byte % 4);
  return pack_bf16x2(e2m1_bits_as_float(word, shift) * 0x1p126f * lane.scale,
                     e2m1_bits_as_float(word, shift + 4) * 0x1p126f * lane.scale);
}

// The decode kernel's cheaper conversion (the invariant kernels keep lane_pair_bf16x2's k map and
// bits). Nibbles j and j + 4 of a code word (channels 8i + j and 8i + j + 4 of the lane's word
// i, j < 4) lie 16 bits apart, as the two halves of a bf16x2 do, so one pair of shifts and masks
// places both: magnitude bits in the bf16 exponent's low bits and mantissa's top bit, sign in
// bit 15, each half 2^-126 times its e2m1 value (the subnormal 0.5 the bf16 subnormal 2^-127).
// 4 integer operations for two channels against lane_pair_bf16x2's ~14 with two f32 multiplies.
__device__ __forceinline__ uint32_t e2m1_pair_bits_bf16x2(uint32_t word, int j) {
  const uint32_t shifted = word >> (4 * j);
  return ((shifted << 6) & 0x01C001C0u) | ((shifted << 12) & 0x80008000u);
}

// The decode kernel's q carries 2^64 (its bf16 rounding unchanged: a power of two) and each key
// 2^-64, so a key's factor, 2^126 x scale x 2^-64 = 2^(E - 65) for the ue8m0 exponent E, is a
// normal bf16 for every E in [0, 192] (scales to 2^65; 2^126 x scale alone overflows from
// E = 129, a scale of 4). The two powers cancel in each product: the MMA sees the exact products.
constexpr float kDecodeQFactor = 0x1p64f;

// The factor in both bf16 halves, from the scale byte: exponent field E + 62 (a select, no
// branch, keeps the NaN scale 0xFF a NaN).
__device__ __forceinline__ __nv_bfloat162 decode_key_factor_bf16x2(uint32_t scale_exponent) {
  const uint32_t bits =
      scale_exponent == 0xFFu ? 0x7FC07FC0u : (scale_exponent + 62u) * 0x00800080u;
  return *reinterpret_cast<const __nv_bfloat162*>(&bits);
}

// One bf16x2 multiply takes a pair above to value x scale x 2^-64, exactly (a power of two times
// a 2-significant-bit value; bf16 arithmetic keeps subnormals on SM90, so the 0.5 code's 2^-127
// input is not flushed, and the products stay exact down to scales of 2^-68).
__device__ __forceinline__ uint32_t scaled_e2m1_pair_bf16x2(uint32_t word, int j,
                                                            __nv_bfloat162 factor) {
  const uint32_t bits = e2m1_pair_bits_bf16x2(word, j);
  const __nv_bfloat162 product = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits), factor);
  return *reinterpret_cast<const uint32_t*>(&product);
}

// 4 bytes global -> shared (one weight; weight rows need not be 16-byte aligned).
__device__ __forceinline__ void copy_4_async(uint32_t shared, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared), "l"(global) : "memory");
}

// One head's share of a score, rounded as the reference rounds it: (relu(dot) * scale) * w,
// two roundings (no contraction into an FMA).
__device__ __forceinline__ float head_term(float dot, float scale, float weight) {
  return __fmul_rn(__fmul_rn(fmaxf(dot, 0.0f), scale), weight);
}

// The k map is staged_quad_word's: a key's lane bytes load as one vector, a staged q row's
// four channels of a step as one 8-byte word pair.
template <int kDim>
__global__ void __launch_bounds__(kMmaThreads, 2)
    indexer_scores_mma_kernel(const IndexerChunk* chunks, DeviceRows<const float> q, int heads,
                              DeviceRows<const float> weights, const int32_t* visible, float scale,
                              DeviceRows<float> out) {
  static_assert(kDim % 16 == 0, "dim must be a whole number of MMA k steps");
  constexpr int kKSteps = kDim / 16;
  constexpr int kRowWords = staged_row_words(kDim);
  constexpr int kQuadsPerHead = kDim / 4;
  extern __shared__ float4 shared_memory[];
  float* landing = reinterpret_cast<float*>(shared_memory);  // [2][q rows, then weights]
  uint32_t* staged = reinterpret_cast<uint32_t*>(landing + 2 * landing_words(kDim));
  float* staged_weights = reinterpret_cast<float*>(staged + kStageRows * kRowWords);

  const IndexerChunk chunk = chunks[blockIdx.y];
  const int64_t tile_begin = static_cast<int64_t>(blockIdx.x) * kKeysPerBlock;
  const int64_t tile_end = deepinfer::cuda::min64(out.cols, tile_begin + kKeysPerBlock);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;  // the MMA's groupID: a head row of A / C, a key of B / C
  const int quad = lane & 3;    // thread in group: k pairs of A / B, key pairs of C
  const int64_t warp_begin = tile_begin + warp * kKeysPerWarp;
  // Per token of the run: how many of the request's keys it sees (read once, not per use).
  __shared__ int64_t token_limits[kTokensPerBlock];
  bool any_visible = false;
  for (int i = threadIdx.x; i < chunk.token_end - chunk.token_begin; i += kMmaThreads) {
    const int64_t limit = deepinfer::cuda::min64(visible[chunk.token_begin + i], chunk.entries);
    token_limits[i] = limit;
    any_visible = any_visible || limit > tile_begin;
  }
  auto limit_of = [&](int64_t t) { return token_limits[t - chunk.token_begin]; };
  if (!__syncthreads_or(any_visible)) {
    for (int64_t t = chunk.token_begin; t < chunk.token_end; ++t) {
      for (int64_t j = tile_begin + threadIdx.x; j < tile_end; j += kMmaThreads) {
        out.row(t)[j] = -INFINITY;
      }
    }
    return;
  }

  const int head_tiles = (heads + 15) / 16;
  const int rows_per_token = head_tiles * 16;
  const int tokens_per_stage = kStageRows / rows_per_token;
  const int quads_per_token = heads * kQuadsPerHead;
  // Issues the copies of the q rows and weights of tokens [stage, stage + tokens_per_stage) into
  // landing buffer `buffer` (tokens this tile shows nothing to are skipped: their scores here
  // are all -inf), as one commit group.
  auto copy_pass = [&](int64_t stage, int buffer) {
    const int count =
        static_cast<int>(deepinfer::cuda::min64(tokens_per_stage, chunk.token_end - stage));
    float* rows = landing + buffer * landing_words(kDim);
    float* row_weights = rows + kStageRows * kDim;
    for (int i = threadIdx.x; i < count * quads_per_token; i += kMmaThreads) {
      const int slot = i / quads_per_token;
      if (limit_of(stage + slot) <= tile_begin) continue;
      copy_16_async(shared_address(rows + 4 * i),
                    q.row(stage + slot) + 4 * (i - slot * quads_per_token));
    }
    for (int i = threadIdx.x; i < count * heads; i += kMmaThreads) {
      const int slot = i / heads;
      copy_4_async(shared_address(row_weights + i), weights.row(stage + slot) + (i - slot * heads));
    }
    commit_copies();
  };
  copy_pass(chunk.token_begin, 0);

  // The warp's keys as B fragments (loaded while the first pass's q copies are in flight);
  // keys past the request's entries are zeros.
  uint32_t key_pairs[kKeyTilesPerWarp][kKSteps][2];
#pragma unroll
  for (int n = 0; n < kKeyTilesPerWarp; ++n) {
    const int64_t key = warp_begin + n * 8 + group;
    const LaneCodes<kDim> lane_codes =
        load_lane_codes<kDim>(chunk.codes, chunk.scales, chunk.code_stride, chunk.scale_stride, key,
                              key < chunk.entries, quad);
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) {
      key_pairs[n][s][0] = lane_pair_bf16x2(lane_codes, 2 * s);
      key_pairs[n][s][1] = lane_pair_bf16x2(lane_codes, 2 * s + 1);
    }
  }

  // Head rows past `heads` (to the 16-row tile) stay zero with weight zero: their terms are +0.
  const int padding_rows = rows_per_token - heads;
  for (int i = threadIdx.x; i < tokens_per_stage * padding_rows * kRowWords; i += kMmaThreads) {
    const int slot = i / (padding_rows * kRowWords);
    staged[(slot * rows_per_token + heads) * kRowWords + (i - slot * padding_rows * kRowWords)] = 0;
  }
  for (int i = threadIdx.x; i < tokens_per_stage * padding_rows; i += kMmaThreads) {
    const int slot = i / padding_rows;
    staged_weights[slot * rows_per_token + heads + (i - slot * padding_rows)] = 0.0f;
  }

  int buffer = 0;
  for (int64_t stage = chunk.token_begin; stage < chunk.token_end;
       stage += tokens_per_stage, buffer ^= 1) {
    const int count =
        static_cast<int>(deepinfer::cuda::min64(tokens_per_stage, chunk.token_end - stage));
    // The next pass's copies go into the other buffer, which every thread finished converting
    // before the last pass's second barrier.
    if (stage + tokens_per_stage < chunk.token_end) {
      copy_pass(stage + tokens_per_stage, buffer ^ 1);
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    __syncthreads();  // this pass's copies have landed; the last pass's MMAs are done
    const float* rows = landing + buffer * landing_words(kDim);
    const float* row_weights = rows + kStageRows * kDim;
    for (int i = threadIdx.x; i < count * quads_per_token; i += kMmaThreads) {
      const int slot = i / quads_per_token;
      if (limit_of(stage + slot) <= tile_begin) continue;
      const float4 v = reinterpret_cast<const float4*>(rows)[i];
      const int within = i - slot * quads_per_token;
      const int h = within / kQuadsPerHead;
      *reinterpret_cast<uint2*>(staged + (slot * rows_per_token + h) * kRowWords +
                                staged_quad_word<kDim>(within - h * kQuadsPerHead)) =
          make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
    for (int i = threadIdx.x; i < count * heads; i += kMmaThreads) {
      const int slot = i / heads;
      staged_weights[slot * rows_per_token + (i - slot * heads)] = row_weights[i];
    }
    __syncthreads();

    for (int slot = 0; slot < count; ++slot) {
      const int64_t t = stage + slot;
      const int64_t limit = limit_of(t);
      float* y = out.row(t);
      if (limit <= warp_begin) {  // none of the warp's keys is visible to this token
        const int64_t j = warp_begin + lane;
        if (j < tile_end) y[j] = -INFINITY;
        continue;
      }
      float total[kKeyTilesPerWarp][2] = {};
      for (int m = 0; m < head_tiles; ++m) {
        float acc[kKeyTilesPerWarp][4] = {};
        const uint32_t* upper =
            staged + (slot * rows_per_token + m * 16 + group) * kRowWords + 2 * quad;  // head row g
        const uint32_t* lower = upper + 8 * kRowWords;  // head row g + 8
#pragma unroll
        for (int s = 0; s < kKSteps; ++s) {
          const uint2 a_upper = *reinterpret_cast<const uint2*>(upper + 8 * s);
          const uint2 a_lower = *reinterpret_cast<const uint2*>(lower + 8 * s);
          const uint32_t a[4] = {a_upper.x, a_lower.x, a_upper.y, a_lower.y};
#pragma unroll
          for (int n = 0; n < kKeyTilesPerWarp; ++n) {
            mma_bf16_m16n8k16(a, key_pairs[n][s][0], key_pairs[n][s][1], acc[n]);
          }
        }
        const float w_upper = staged_weights[slot * rows_per_token + m * 16 + group];
        const float w_lower = staged_weights[slot * rows_per_token + m * 16 + group + 8];
#pragma unroll
        for (int n = 0; n < kKeyTilesPerWarp; ++n) {
#pragma unroll
          for (int column = 0; column < 2; ++column) {
            total[n][column] =
                __fadd_rn(total[n][column], head_term(acc[n][column], scale, w_upper));
            total[n][column] =
                __fadd_rn(total[n][column], head_term(acc[n][column + 2], scale, w_lower));
          }
        }
      }
      // The 8 lane groups' head sums, in a butterfly (every lane ends with the same bits).
#pragma unroll
      for (int offset = 4; offset < 32; offset <<= 1) {
#pragma unroll
        for (int n = 0; n < kKeyTilesPerWarp; ++n) {
#pragma unroll
          for (int column = 0; column < 2; ++column) {
            total[n][column] =
                __fadd_rn(total[n][column], __shfl_xor_sync(0xffffffffu, total[n][column], offset));
          }
        }
      }
      // Lane (g, c) with g < 4 writes key tile g's columns 2c, 2c+1.
      if (group < kKeyTilesPerWarp) {
        float first = 0.0f;
        float second = 0.0f;
#pragma unroll
        for (int n = 0; n < kKeyTilesPerWarp; ++n) {
          if (n == group) {
            first = total[n][0];
            second = total[n][1];
          }
        }
        const int64_t j = warp_begin + group * 8 + 2 * quad;
        if (j < tile_end) y[j] = j < limit ? first : -INFINITY;
        if (j + 1 < tile_end) y[j + 1] = j + 1 < limit ? second : -INFINITY;
      }
    }
  }
}

// ---- indexer_scores_batch's decode rows, batch invariance off ---------------------------------
//
// A decode request (one token) shares nothing across its keys but the token's q, so the block
// above (256 keys as B fragments, then one token's 64 MMAs a warp) is latency-bound at decode:
// each block lives for one load of its keys, with its q staging, barriers and conversion in
// series around it. Here the keys are the MMA's M side (16 keys a tile, A fragments read from
// the warp's cp.async ring, below) and the token's heads its N side (the q B fragments stay in
// registers for the block's whole key range), and each warp streams its tiles with the next
// three tiles' copies in flight while it multiplies the current one. A key's heads
// reduce within its lane quad (2 shuffles, not the 3-level butterfly over 8 lane groups).
// The products are the same exact bf16 products (the codes converted by
// scaled_e2m1_pair_bf16x2, whose k map pairs channels j, j + 4); the channels enter the MMAs
// in that other k order and the head sum runs in another fixed order (per lane heads 8n + 2c,
// 8n + 2c + 1 for n ascending, then lane quads xor 1, xor 2), so the bits differ from
// indexer_scores_mma_kernel's by the order of the f32 additions alone. The
// order depends only on the key's index mod 16 and the head count: a row's scores do not depend
// on the call's other requests or the grid (still batch invariant, but not the invariant path's
// bits, hence gated on ops::batch_invariant()).
constexpr int kDecodeWarps = 8;
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeKeysPerTile = 16;  // MMA M
constexpr int kDecodeHeadTiles = 4;     // MMA N tiles of 8 heads: at most 32 heads
constexpr int kDecodeMaxHeads = kDecodeHeadTiles * 8;

struct DecodeIndexerRow {
  const uint8_t* codes;  // the request's key cache (DeviceKeys)
  const uint8_t* scales;
  int64_t code_stride;
  int64_t scale_stride;
  int64_t entries;
  int64_t token;  // row of the call
};

// false (or DEEPINFER_INDEXER_DECODE=0): with batch invariance off, decode requests still take
// indexer_scores_mma_kernel (the A/B baseline).
RuntimeSwitch kIndexerDecodeKernel{"DEEPINFER_INDEXER_DECODE", true};

// Each warp streams its tiles through a private ring of kDecodeStages shared-memory slots filled
// by cp.async: kDecodeStages - 1 tiles (3 KB at dim 128) in flight a warp while it multiplies
// one, none of them in registers (the q fragments hold 64). One copy a lane vector of codes
// (dim / 8 bytes, the loads' old size and alignment) and the tile's packed scale bytes in 4-byte
// copies; keys at or past `limit` are zero-filled, never read. Key indices are 32-bit (the host
// checks the width).
constexpr int kDecodeStages = 4;

template <int kDim>
struct DecodeSlot {
  static constexpr int kCodeBytes = kDecodeKeysPerTile * kDim / 2;
  static constexpr int kScaleBytes = kDecodeKeysPerTile * kDim / 32;
  alignas(16) uint8_t codes[kCodeBytes];  // key-major rows of dim / 2 bytes
  alignas(4) uint8_t scales[kScaleBytes];
};

// dst <- src-size bytes of src, the rest of cp-size zero-filled (src-size 0 reads nothing).
template <int kBytes>
__device__ __forceinline__ void copy_async_zfill(uint32_t shared, const void* global,
                                                 int source_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(shared), "l"(global),
               "n"(kBytes), "r"(source_bytes)
               : "memory");
}

template <int kDim>
__global__ void __launch_bounds__(kDecodeThreads, 2)
    indexer_decode_scores_kernel(const DecodeIndexerRow* rows, DeviceRows<const float> q, int heads,
                                 DeviceRows<const float> weights, const int32_t* visible,
                                 float scale, int tiles_per_warp, DeviceRows<float> out) {
  static_assert(kDim % 32 == 0 && kDim <= 128, "lane vectors of dim / 8 bytes under one scale");
  constexpr int kKSteps = kDim / 16;
  constexpr int kRowWords = staged_row_words(kDim);
  constexpr int kVectorBytes = kDim / 8;  // a lane quad's share of a key
  constexpr int kKeyScaleBytes = kDim / 32;
  constexpr int kScaleCopies = DecodeSlot<kDim>::kScaleBytes / 4;
  using Slot = DecodeSlot<kDim>;
  __shared__ uint32_t staged[kDecodeMaxHeads * kRowWords];  // bf16 q rows, zero past `heads`
  __shared__ Slot slots[kDecodeWarps][kDecodeStages];
  wait_for_prior_grids();
  allow_dependent_grids();
  const DecodeIndexerRow row = rows[blockIdx.y];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;
  const int quad = lane & 3;
  const int64_t t = row.token;
  const int limit = static_cast<int>(deepinfer::cuda::min64(visible[t], row.entries));
  const int width = static_cast<int>(out.cols);
  float* y = out.row(t);
  const int width_tiles = (width + kDecodeKeysPerTile - 1) / kDecodeKeysPerTile;
  // Warp w takes tiles first + w + 8 i, i < tiles_per_warp: the block's warps read adjacent keys.
  const int first_tile = static_cast<int>(blockIdx.x) * kDecodeWarps * tiles_per_warp + warp;
  const int warp_tiles =
      first_tile < width_tiles
          ? min(tiles_per_warp, (width_tiles - first_tile + kDecodeWarps - 1) / kDecodeWarps)
          : 0;
  // The lane's two code copies a tile: keys lane / 4 and lane / 4 + 8, vector lane % 4 (the
  // host keeps the code stride 32-bit).
  const int copy_key = lane / 4;
  const int code_stride = static_cast<int>(row.code_stride);
  const int copy_offset = copy_key * code_stride + (lane % 4) * kVectorBytes;
  const uint32_t slot_base = shared_address(&slots[warp][0]);
  const uint32_t copy_slot_offset = copy_key * (kDim / 2) + (lane % 4) * kVectorBytes;
  // Tile i's copies into slot i % kDecodeStages; a tile wholly past `limit` copies nothing (its
  // scores are -inf without reading the slot). Always one commit group a call.
  auto issue = [&](int i) {
    const int tile_key = (first_tile + kDecodeWarps * i) * kDecodeKeysPerTile;
    if (i < warp_tiles && tile_key < limit) {
      const uint32_t slot = slot_base + (i % kDecodeStages) * sizeof(Slot);
      const uint8_t* tile_codes = row.codes + static_cast<int64_t>(tile_key) * row.code_stride;
      const bool first_present = tile_key + copy_key < limit;
      const bool second_present = tile_key + copy_key + 8 < limit;
      copy_async_zfill<kVectorBytes>(slot + copy_slot_offset,
                                     first_present ? tile_codes + copy_offset : row.codes,
                                     first_present ? kVectorBytes : 0);
      copy_async_zfill<kVectorBytes>(
          slot + copy_slot_offset + 8 * (kDim / 2),
          second_present ? tile_codes + copy_offset + 8 * code_stride : row.codes,
          second_present ? kVectorBytes : 0);
      if (lane < kScaleCopies) {
        // Packed scale rows (scale_stride == dim / 32): the tile's scales are one span. A word
        // the last key ends inside (dim < 128) is read byte by byte: a 4-byte copy would read
        // past the cache's last row.
        const int first_byte = tile_key * kKeyScaleBytes + 4 * lane;
        const int valid = limit * kKeyScaleBytes - first_byte;
        const uint32_t destination = slot + offsetof(Slot, scales) + 4 * lane;
        if (valid >= 4) {
          copy_async_zfill<4>(destination, row.scales + first_byte, 4);
        } else {
          uint32_t word = 0;
          if constexpr (kKeyScaleBytes < 4) {  // at dim 128 a word is one key's: all or none
            for (int b = 0; b < valid; ++b) {
              word |= static_cast<uint32_t>(row.scales[first_byte + b]) << (8 * b);
            }
          }
          asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(destination), "r"(word) : "memory");
        }
      }
    }
    commit_copies();
  };
#pragma unroll
  for (int i = 0; i < kDecodeStages - 1; ++i) issue(i);  // in flight while the block stages q

  // q (times kDecodeQFactor) in the decode k map (scaled_e2m1_pair_bf16x2's): step s of quad c
  // takes the lane's word s / 2, its nibble pairs (j, j + 4) for j = 2 (s % 2) (register 0) and
  // j + 1 (register 1), so staged word 8s + 2c + r holds channels ch and ch + 4,
  // ch = c dim/4 + 8 (s/2) + 2 (s%2) + r.
  const float* q_row = q.row(t);
  for (int i = threadIdx.x; i < kDecodeMaxHeads * (kDim / 2); i += kDecodeThreads) {
    const int h = i / (kDim / 2);
    const int w = i - h * (kDim / 2);
    const int s = w / 8;
    const int c = (w % 8) / 2;
    const int r = w % 2;
    const int ch = c * (kDim / 4) + 8 * (s / 2) + 2 * (s % 2) + r;
    const float* head_q = q_row + h * kDim;
    staged[h * kRowWords + w] = h < heads ? pack_bf16x2(__ldcg(head_q + ch) * kDecodeQFactor,
                                                        __ldcg(head_q + ch + 4) * kDecodeQFactor)
                                          : 0u;
  }
  // The lane's C columns are heads 8n + 2c and 8n + 2c + 1; padding heads weigh zero.
  float head_weights[kDecodeHeadTiles][2];
#pragma unroll
  for (int n = 0; n < kDecodeHeadTiles; ++n) {
#pragma unroll
    for (int column = 0; column < 2; ++column) {
      const int h = 8 * n + 2 * quad + column;
      head_weights[n][column] = h < heads ? weights.row(t)[h] : 0.0f;
    }
  }
  __syncthreads();
  uint32_t q_pairs[kDecodeHeadTiles][kKSteps][2];
#pragma unroll
  for (int n = 0; n < kDecodeHeadTiles; ++n) {
#pragma unroll
    for (int s = 0; s < kKSteps; ++s) {
      const uint2 v =
          *reinterpret_cast<const uint2*>(staged + (8 * n + group) * kRowWords + 8 * s + 2 * quad);
      q_pairs[n][s][0] = v.x;
      q_pairs[n][s][1] = v.y;
    }
  }

  // The lane's code words of key `key` (row g or g + 8 of the A tile) in a slot.
  struct KeyWords {
    uint32_t words[kDim / 32];
  };
  auto key_words = [&](const Slot& slot, int key) {
    KeyWords codes;
    const uint8_t* source = slot.codes + key * (kDim / 2) + quad * kVectorBytes;
    if constexpr (kDim == 128) {
      const uint4 v = *reinterpret_cast<const uint4*>(source);
      codes.words[0] = v.x;
      codes.words[1] = v.y;
      codes.words[2] = v.z;
      codes.words[3] = v.w;
    } else if constexpr (kDim == 64) {
      const uint2 v = *reinterpret_cast<const uint2*>(source);
      codes.words[0] = v.x;
      codes.words[1] = v.y;
    } else {
      codes.words[0] = *reinterpret_cast<const uint32_t*>(source);
    }
    return codes;
  };
  auto key_factor = [&](const Slot& slot, int key) {
    return decode_key_factor_bf16x2(slot.scales[key * kKeyScaleBytes + quad * kDim / 128]);
  };

  for (int i = 0; i < warp_tiles; ++i) {
    wait_copies<kDecodeStages - 2>();  // this lane's copies of tile i have landed
    __syncwarp();  // and every lane's; the slot tile i - 1 read is free for tile i + stages - 1
    issue(i + kDecodeStages - 1);
    const int tile_key = (first_tile + kDecodeWarps * i) * kDecodeKeysPerTile;
    float sums[2] = {0.0f, 0.0f};  // keys tile_key + group, + group + 8
    if (tile_key < limit) {
      const Slot& slot = slots[warp][i % kDecodeStages];
      const KeyWords keys[2] = {key_words(slot, group), key_words(slot, group + 8)};
      const __nv_bfloat162 factors[2] = {key_factor(slot, group), key_factor(slot, group + 8)};
      float acc[kDecodeHeadTiles][4] = {};
#pragma unroll
      for (int s = 0; s < kKSteps; ++s) {
        const int j = 2 * (s % 2);
        const uint32_t a[4] = {scaled_e2m1_pair_bf16x2(keys[0].words[s / 2], j, factors[0]),
                               scaled_e2m1_pair_bf16x2(keys[1].words[s / 2], j, factors[1]),
                               scaled_e2m1_pair_bf16x2(keys[0].words[s / 2], j + 1, factors[0]),
                               scaled_e2m1_pair_bf16x2(keys[1].words[s / 2], j + 1, factors[1])};
#pragma unroll
        for (int n = 0; n < kDecodeHeadTiles; ++n) {
          mma_bf16_m16n8k16(a, q_pairs[n][s][0], q_pairs[n][s][1], acc[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kDecodeHeadTiles; ++n) {
#pragma unroll
        for (int column = 0; column < 2; ++column) {
          sums[0] = __fadd_rn(sums[0], head_term(acc[n][column], scale, head_weights[n][column]));
          sums[1] =
              __fadd_rn(sums[1], head_term(acc[n][column + 2], scale, head_weights[n][column]));
        }
      }
#pragma unroll
      for (int offset = 1; offset < 4; offset <<= 1) {
        sums[0] = __fadd_rn(sums[0], __shfl_xor_sync(0xffffffffu, sums[0], offset));
        sums[1] = __fadd_rn(sums[1], __shfl_xor_sync(0xffffffffu, sums[1], offset));
      }
    }
    // Lanes of quad position 0 write key g, position 1 key g + 8: 16 adjacent scores.
    if (quad < 2) {
      const int j = tile_key + group + 8 * quad;
      if (j < width) y[j] = j < limit ? (quad == 0 ? sums[0] : sums[1]) : -INFINITY;
    }
  }
  wait_copies<0>();  // the ring's last (empty) groups, before the block's shared memory goes
}

// Float -> unsigned key with the same order (-0 folded onto +0, as float comparison does).
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

using BlockScan = cub::BlockScan<int, kThreads>;

struct SelectShared {
  typename BlockScan::TempStorage scan;
  int histogram[256];
  int valid_count;
  uint32_t prefix;
  int remaining;
  int chunk_total;
};

// The top `k` of row[0, n) among entries other than -inf, larger first, ties by lower index.
// Calls emit(j, kept, rank) for every j in ascending order, rank = kept entries before j.
// Returns the number kept. Every thread of the block must call it.
template <typename Emit>
__device__ int select_top_k(const float* row, int64_t n, int k, SelectShared& shared, Emit emit) {
  if (threadIdx.x == 0) shared.valid_count = 0;
  __syncthreads();
  int local_valid = 0;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) local_valid += row[j] != -INFINITY;
  atomicAdd(&shared.valid_count, local_valid);
  __syncthreads();
  const int valid = shared.valid_count;
  // threshold 0 keeps every valid entry: -inf's key is the smallest a valid one can beat.
  uint32_t threshold = 0;
  int take_at_threshold = 0;
  if (valid > k) {
    uint32_t prefix = 0;
    uint32_t mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += kThreads) shared.histogram[b] = 0;
      __syncthreads();
      for (int64_t j = threadIdx.x; j < n; j += kThreads) {
        const float v = row[j];
        if (v == -INFINITY) continue;
        const uint32_t key = order_key(v);
        if ((key & mask) == prefix) atomicAdd(&shared.histogram[(key >> shift) & 0xFF], 1);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int above = 0;
        int digit = 255;
        for (; digit > 0; --digit) {
          if (above + shared.histogram[digit] >= remaining) break;
          above += shared.histogram[digit];
        }
        shared.prefix = prefix | (static_cast<uint32_t>(digit) << shift);
        shared.remaining = remaining - above;
      }
      __syncthreads();
      prefix = shared.prefix;
      remaining = shared.remaining;
      mask |= 0xFFu << shift;
      __syncthreads();
    }
    threshold = prefix;
    take_at_threshold = remaining;
  }
  int ties_before = 0;
  int kept_before = 0;
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t j = base + threadIdx.x;
    const bool in_row = j < n;
    const float v = in_row ? row[j] : -INFINITY;
    const bool is_valid = v != -INFINITY;
    const uint32_t key = is_valid ? order_key(v) : 0;
    const int tie = is_valid && key == threshold && valid > k;
    int tie_rank = 0;
    int ties_here = 0;
    BlockScan(shared.scan).ExclusiveSum(tie, tie_rank, ties_here);
    __syncthreads();
    const int kept =
        is_valid && (key > threshold || (tie && ties_before + tie_rank < take_at_threshold));
    int kept_rank = 0;
    int kept_here = 0;
    BlockScan(shared.scan).ExclusiveSum(kept, kept_rank, kept_here);
    __syncthreads();
    if (in_row) emit(j, kept != 0, kept_before + kept_rank);
    ties_before += ties_here;
    kept_before += kept_here;
  }
  return kept_before;
}

__global__ void __launch_bounds__(kThreads)
    topk_indices_kernel(DeviceRows<const float> scores, int k, DeviceRows<int32_t> out) {
  __shared__ SelectShared shared;
  const float* row = scores.row(blockIdx.x);
  int32_t* y = out.row(blockIdx.x);
  const int kept = select_top_k(row, scores.cols, k, shared, [&](int64_t j, bool keep, int rank) {
    if (keep) y[rank] = static_cast<int32_t>(j);
  });
  for (int i = kept + static_cast<int>(threadIdx.x); i < k; i += kThreads) y[i] = -1;
}

// topk_indices_kernel's selection (the same indices: the top k are a set fixed by the row, and
// they are written in ascending index) from a copy of the row in shared memory. The old kernel
// reads the row from global memory six times, a load at a time per thread; thread 0 walks up to
// 255 histogram bins per radix digit; and the ranks take two block scans and barriers per 256
// entries (64 at 8192 candidates). Here: one pass of loads all in flight; the digit from one
// block scan of the histogram; warp-aggregated histogram counts (the first digit of scores of
// one sign and scale falls in a few bins); and the ranks from ballots over each warp's
// contiguous segment of the row, the warps' totals added once.
constexpr int kSelectWarps = kThreads / 32;
constexpr int64_t kMaxSharedSelectColumns = 16384;  // 64 KB of row
static_assert(kThreads == 256, "one thread per histogram bin");

__global__ void __launch_bounds__(kThreads)
    topk_indices_shared_kernel(DeviceRows<const float> scores, int k, bool float4_rows,
                               DeviceRows<int32_t> out) {
  extern __shared__ float row[];  // [scores.cols]
  __shared__ typename BlockScan::TempStorage scan;
  __shared__ int histogram[256];
  __shared__ int warp_counts[kSelectWarps];
  __shared__ int valid_count;
  __shared__ uint32_t chosen_prefix;
  __shared__ int chosen_remaining;
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int n = static_cast<int>(scores.cols);
  const float* source = scores.row(blockIdx.x);
  if (threadIdx.x == 0) valid_count = 0;
  int local_valid = 0;
  if (float4_rows) {
    const float4* quads = reinterpret_cast<const float4*>(source);
#pragma unroll 8
    for (int q = threadIdx.x; q < n / 4; q += kThreads) {
      const float4 v = quads[q];
      reinterpret_cast<float4*>(row)[q] = v;
      local_valid +=
          (v.x != -INFINITY) + (v.y != -INFINITY) + (v.z != -INFINITY) + (v.w != -INFINITY);
    }
  } else {
#pragma unroll 8
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const float v = source[j];
      row[j] = v;
      local_valid += v != -INFINITY;
    }
  }
  local_valid = __reduce_add_sync(all, local_valid);
  __syncthreads();  // valid_count is 0
  if (lane == 0) atomicAdd(&valid_count, local_valid);
  __syncthreads();
  const int valid = valid_count;

  // threshold 0 keeps every valid entry: -inf's key is the smallest a valid one can beat.
  uint32_t threshold = 0;
  int take_at_threshold = 0;
  if (valid > k) {
    uint32_t prefix = 0;
    uint32_t mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      histogram[threadIdx.x] = 0;
      __syncthreads();
      for (int base = 0; base < n; base += kThreads) {
        const int j = base + static_cast<int>(threadIdx.x);
        const float v = j < n ? row[j] : -INFINITY;
        const uint32_t key = order_key(v);
        const bool counted = v != -INFINITY && (key & mask) == prefix;
        const unsigned counting = __ballot_sync(all, counted);
        if (counted) {
          const uint32_t digit = (key >> shift) & 0xFF;
          const unsigned same_digit = __match_any_sync(counting, digit);
          if (lane == __ffs(same_digit) - 1) atomicAdd(&histogram[digit], __popc(same_digit));
        }
      }
      __syncthreads();
      // The largest digit whose bin, with every bin above it, holds `remaining` entries (0 when
      // none does): thread t holds digit 255 - t, so an exclusive scan gives the count above.
      const int digit = 255 - static_cast<int>(threadIdx.x);
      const int here = histogram[digit];
      int above = 0;
      BlockScan(scan).ExclusiveSum(here, above);
      if (above < remaining && (digit == 0 || above + here >= remaining)) {
        chosen_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
        chosen_remaining = remaining - above;
      }
      __syncthreads();
      prefix = chosen_prefix;
      remaining = chosen_remaining;
      mask |= 0xFFu << shift;
      __syncthreads();  // before the histogram and chosen_* are written again
    }
    threshold = prefix;
    take_at_threshold = remaining;
  }

  // Warp w ranks the entries of [w * segment, (w + 1) * segment) in index order.
  const int segment = (n + kSelectWarps * 32 - 1) / (kSelectWarps * 32) * 32;
  const int begin = warp * segment;
  const int end = min(n, begin + segment);
  const unsigned lanes_below = (1u << lane) - 1u;
  const bool ties_possible = valid > k;
  struct Entry {
    bool valid;
    uint32_t key;
  };
  const auto entry = [&](int j) {
    const float v = j < end ? row[j] : -INFINITY;
    return Entry{v != -INFINITY, v != -INFINITY ? order_key(v) : 0u};
  };
  // The warp's ties, then each warp's ties before it.
  int count = 0;
  for (int base = begin; base < end; base += 32) {
    const Entry x = entry(base + lane);
    count += __popc(__ballot_sync(all, x.valid && x.key == threshold && ties_possible));
  }
  if (lane == 0) warp_counts[warp] = count;
  __syncthreads();
  int ties_before = 0;
  for (int w = 0; w < warp; ++w) ties_before += warp_counts[w];
  __syncthreads();
  // Kept entries: above the threshold, or among the first take_at_threshold ties.
  const auto kept_ballot = [&](const Entry& x, int& ties_seen) {
    const unsigned ties = __ballot_sync(all, x.valid && x.key == threshold && ties_possible);
    const bool tie = (ties >> lane) & 1u;
    const int tie_rank = ties_seen + __popc(ties & lanes_below);
    ties_seen += __popc(ties);
    return __ballot_sync(all,
                         x.valid && (x.key > threshold || (tie && tie_rank < take_at_threshold)));
  };
  count = 0;
  int ties_seen = ties_before;
  for (int base = begin; base < end; base += 32) {
    count += __popc(kept_ballot(entry(base + lane), ties_seen));
  }
  if (lane == 0) warp_counts[warp] = count;
  __syncthreads();
  int kept_before = 0;
  int kept_total = 0;
  for (int w = 0; w < kSelectWarps; ++w) {
    if (w < warp) kept_before += warp_counts[w];
    kept_total += warp_counts[w];
  }
  int32_t* y = out.row(blockIdx.x);
  ties_seen = ties_before;
  for (int base = begin; base < end; base += 32) {
    const unsigned kept = kept_ballot(entry(base + lane), ties_seen);
    if ((kept >> lane) & 1u) y[kept_before + __popc(kept & lanes_below)] = base + lane;
    kept_before += __popc(kept);
  }
  for (int i = kept_total + static_cast<int>(threadIdx.x); i < k; i += kThreads) y[i] = -1;
}

// false (or DEEPINFER_TOPK_SHARED=0): topk_indices_kernel.
RuntimeSwitch kSharedTopK{"DEEPINFER_TOPK_SHARED", true};

// topk_indices for rows of up to 32768 entries with batch invariance off (the same indices as
// the kernels above: the selection is a set fixed by the row, written in ascending index). At
// decode the rows are few and wide (256 rows of 16384-32768 entries at 32k context): the
// shared-memory kernel takes at most 16384 columns (64 KB of row), and past it the
// global-memory kernel reads the row six times with 256 threads, ~170 us a call at 256 x 32768.
// Here 1024 threads a row hold its order keys in registers, kPerThread adjacent entries each
// (so one block scan of per-thread counts ranks them in index order): one pass of loads, the
// radix passes over registers (warp-aggregated shared histogram counts, the digit chosen by one
// warp), and two block scans for the ties and the kept ranks.
constexpr int kRegisterSelectThreads = 1024;
constexpr int kRegisterSelectWarps = kRegisterSelectThreads / 32;
constexpr int64_t kMaxRegisterSelectColumns = 32 * kRegisterSelectThreads;
using WideBlockScan = cub::BlockScan<int, kRegisterSelectThreads>;

// false (or DEEPINFER_TOPK_REGISTERS=0): with batch invariance off, topk_indices keeps the
// kernels the invariant path uses.
RuntimeSwitch kRegisterTopK{"DEEPINFER_TOPK_REGISTERS", true};

// The chunked selection (two passes of the register kernel): the top k of a row is among the top
// k of any chunk that holds them (an entry that k others of its chunk beat, larger or tied at a
// lower column, has k entries beating it in the row), so each chunk's top k, laid out chunk after
// chunk, keeps the row's column order, and a second selection over them gives the row's top k.
// Rows past the one-block kernel's 32768 entries take it, and so do rows that would leave most of
// the GPU idle (fewer than 64 rows of over 8192 entries: b1's indexer at long context). Chunks of
// DEEPINFER_TOPK_FEW_ROWS_CHUNK entries for those (default 4096: 4 a thread, 9 blocks for a row
// of 32769), of DEEPINFER_TOPK_CHUNK entries for many rows (fewer, fuller blocks: the SMs are busy
// anyway), at least 2k, wider where the k-a-chunk candidates would pass 32768.
constexpr int64_t kFewSelectRows = 64;
RuntimeSetting kFewRowsSelectChunk{"DEEPINFER_TOPK_FEW_ROWS_CHUNK", 4096, 1024, 32768};
RuntimeSetting kSelectChunk{"DEEPINFER_TOPK_CHUNK", 16384, 1024, 32768};

// The chunk width for topk_indices' chunked selection, or 0: one pass (a row that fits one block
// and leaves no SMs idle, or k too large for two passes: k > 16384 or k x chunks > 32768).
int64_t chunked_select_width(int64_t rows, int64_t cols, int k) {
  const bool few_rows = rows < kFewSelectRows;
  if (cols <= kMaxRegisterSelectColumns && (!few_rows || cols <= 2 * int64_t{4096})) return 0;
  const int64_t most_chunks = kMaxRegisterSelectColumns / k;
  if (most_chunks < 2) return 0;
  const int64_t target = (few_rows ? kFewRowsSelectChunk : kSelectChunk).value();
  int64_t width = std::max<int64_t>(target, 2 * int64_t{k});
  if ((cols + width - 1) / width > most_chunks) width = (cols + most_chunks - 1) / most_chunks;
  width = (width + 3) / 4 * 4;
  if (width > kMaxRegisterSelectColumns || (cols + width - 1) / width < 2) return 0;
  return width;
}

// What block (row r = blockIdx.x, chunk c = blockIdx.y) of topk_indices_registers_kernel selects
// from and where it writes: the top k of columns [c chunk_width, min(cols, (c + 1) chunk_width))
// of score row r into columns [c k, (c + 1) k) of out row r, each kept entry as its column in the
// score row, or, with `remap`, as remap row r's value at that column (the second pass of a
// chunked selection: the scores are the candidates, remap their columns in the original row).
// With `values`, each kept entry's score lands beside its index (-inf where out has -1): the
// first pass. One chunk (chunk_width = cols): the plain top k of each row.
struct RegisterSelectArgs {
  DeviceRows<const float> scores;
  int k = 0;
  int chunk_width = 0;
  bool float4_rows = false;  // chunk_width too is a multiple of 4
  DeviceRows<int32_t> out;
  DeviceRows<float> values;         // data null: none
  DeviceRows<const int32_t> remap;  // data null: none
};

template <int kPerThread>
__global__ void __launch_bounds__(kRegisterSelectThreads, 1)
    topk_indices_registers_kernel(RegisterSelectArgs args) {
  static_assert(kPerThread % 4 == 0, "whole float4 loads");
  __shared__ typename WideBlockScan::TempStorage scan;
  __shared__ int histogram[256];
  __shared__ int warp_valid[kRegisterSelectWarps];
  __shared__ uint32_t chosen_prefix;
  __shared__ int chosen_remaining;
  wait_for_prior_grids();
  allow_dependent_grids();
  const unsigned all = 0xffffffffu;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int k = args.k;
  const bool float4_rows = args.float4_rows;
  const int chunk_start = static_cast<int>(blockIdx.y) * args.chunk_width;
  const int n = min(args.chunk_width, static_cast<int>(args.scores.cols) - chunk_start);
  const float* source = args.scores.row(blockIdx.x) + chunk_start;
  const int first = static_cast<int>(threadIdx.x) * kPerThread;
  // Order keys; 0 marks an entry that is -inf or past the row (every other float's key is
  // larger: -inf's own key is 0x007fffff).
  uint32_t keys[kPerThread];
  if (float4_rows) {
#pragma unroll
    for (int i = 0; i < kPerThread; i += 4) {
      float4 v = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      if (first + i < n) v = *reinterpret_cast<const float4*>(source + first + i);
      keys[i] = v.x != -INFINITY ? order_key(v.x) : 0u;
      keys[i + 1] = v.y != -INFINITY ? order_key(v.y) : 0u;
      keys[i + 2] = v.z != -INFINITY ? order_key(v.z) : 0u;
      keys[i + 3] = v.w != -INFINITY ? order_key(v.w) : 0u;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const float v = first + i < n ? source[first + i] : -INFINITY;
      keys[i] = v != -INFINITY ? order_key(v) : 0u;
    }
  }
  int local_valid = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) local_valid += keys[i] != 0u;
  local_valid = __reduce_add_sync(all, local_valid);
  if (lane == 0) warp_valid[warp] = local_valid;
  __syncthreads();
  int valid = 0;
  for (int w = 0; w < kRegisterSelectWarps; ++w) valid += warp_valid[w];

  // threshold 0 keeps every valid entry (every valid key is above it).
  uint32_t threshold = 0;
  int take_at_threshold = 0;
  if (valid > k) {
    uint32_t prefix = 0;
    uint32_t mask = 0;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      if (threadIdx.x < 256) histogram[threadIdx.x] = 0;
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const uint32_t key = keys[i];
        const bool counted = key != 0u && (key & mask) == prefix;
        const unsigned counting = __ballot_sync(all, counted);
        if (counted) {
          const uint32_t digit = (key >> shift) & 0xFF;
          const unsigned same_digit = __match_any_sync(counting, digit);
          if (lane == __ffs(same_digit) - 1) atomicAdd(&histogram[digit], __popc(same_digit));
        }
      }
      __syncthreads();
      // Warp 0: lane l sums digits 255 - 8l down to 248 - 8l; the largest digit whose bin,
      // with every bin above it, holds `remaining` entries (0 when none does).
      if (warp == 0) {
        int lane_total = 0;
#pragma unroll
        for (int b = 0; b < 8; ++b) lane_total += histogram[255 - 8 * lane - b];
        int above = lane_total;  // inclusive scan over lanes, then made exclusive
#pragma unroll
        for (int offset = 1; offset < 32; offset <<= 1) {
          const int other = __shfl_up_sync(all, above, offset);
          if (lane >= offset) above += other;
        }
        above -= lane_total;
        const bool mine = above < remaining && (above + lane_total >= remaining || lane == 31);
        if (mine) {
          int digit = 255 - 8 * lane;
#pragma unroll
          for (int b = 0; b < 8; ++b) {
            const int here = histogram[255 - 8 * lane - b];
            if (digit == 255 - 8 * lane - b && above + here < remaining && b < 7) {
              above += here;
              digit -= 1;
            }
          }
          chosen_prefix = prefix | (static_cast<uint32_t>(digit) << shift);
          chosen_remaining = remaining - above;
        }
      }
      __syncthreads();
      prefix = chosen_prefix;
      remaining = chosen_remaining;
      mask |= 0xFFu << shift;
    }
    threshold = prefix;
    take_at_threshold = remaining;
  }

  const bool ties_possible = valid > k;
  int ties = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) ties += ties_possible && keys[i] == threshold;
  int ties_before = 0;
  WideBlockScan(scan).ExclusiveSum(ties, ties_before);
  __syncthreads();
  int kept = 0;
  int ties_seen = ties_before;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const bool tie = ties_possible && keys[i] == threshold;
    kept += keys[i] != 0u && (keys[i] > threshold || (tie && ties_seen < take_at_threshold));
    ties_seen += tie;
  }
  int kept_before = 0;
  int kept_total = 0;
  WideBlockScan(scan).ExclusiveSum(kept, kept_before, kept_total);
  const int out_start = static_cast<int>(blockIdx.y) * k;
  int32_t* y = args.out.row(blockIdx.x) + out_start;
  float* y_values = args.values.data != nullptr ? args.values.row(blockIdx.x) + out_start : nullptr;
  const int32_t* remap = args.remap.data != nullptr ? args.remap.row(blockIdx.x) : nullptr;
  ties_seen = ties_before;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const bool tie = ties_possible && keys[i] == threshold;
    if (keys[i] != 0u && (keys[i] > threshold || (tie && ties_seen < take_at_threshold))) {
      const int column = chunk_start + first + i;
      y[kept_before] = remap != nullptr ? remap[column] : column;
      if (y_values != nullptr) y_values[kept_before] = source[first + i];
      ++kept_before;
    }
    ties_seen += tie;
  }
  for (int i = kept_total + static_cast<int>(threadIdx.x); i < k; i += kRegisterSelectThreads) {
    y[i] = -1;
    if (y_values != nullptr) y_values[i] = -INFINITY;
  }
}

// One launch of topk_indices_registers_kernel over args.chunk_width-column chunks (grid.y).
void launch_register_select(const RegisterSelectArgs& args) {
  const int64_t chunks = (args.scores.cols + args.chunk_width - 1) / args.chunk_width;
  const dim3 grid(static_cast<unsigned>(args.scores.rows), static_cast<unsigned>(chunks));
  const int64_t per_thread =
      (args.chunk_width + kRegisterSelectThreads - 1) / kRegisterSelectThreads;
  const auto kernel = per_thread <= 4    ? topk_indices_registers_kernel<4>
                      : per_thread <= 8  ? topk_indices_registers_kernel<8>
                      : per_thread <= 16 ? topk_indices_registers_kernel<16>
                                         : topk_indices_registers_kernel<32>;
  launch_dependent(kernel, grid, kRegisterSelectThreads, 0, current_stream(), args);
}

// Block score = max entry; the block of the newest visible entry is pinned in with +inf.
__global__ void block_scores_kernel(DeviceRows<const float> scores, const int32_t* visible,
                                    int block_size, int64_t blocks, float* block_scores) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= scores.rows * blocks) return;
  const int64_t t = index / blocks;
  const int64_t b = index % blocks;
  float best = -INFINITY;
  const int64_t end = deepinfer::cuda::min64(scores.cols, (b + 1) * block_size);
  for (int64_t j = b * block_size; j < end; ++j) best = fmaxf(best, scores.row(t)[j]);
  if (visible[t] > 0 && (visible[t] - 1) / block_size == b) best = INFINITY;
  block_scores[index] = best;
}

__global__ void __launch_bounds__(kThreads)
    candidate_mask_kernel(const float* block_scores, int64_t blocks, int keep, int block_size,
                          DeviceRows<int8_t> mask) {
  __shared__ SelectShared shared;
  const float* row = block_scores + static_cast<int64_t>(blockIdx.x) * blocks;
  int8_t* m = mask.row(blockIdx.x);
  select_top_k(row, blocks, keep, shared, [&](int64_t b, bool kept, int) {
    const int64_t end = deepinfer::cuda::min64(mask.cols, (b + 1) * block_size);
    for (int64_t j = b * block_size; j < end; ++j) m[j] = kept ? 1 : 0;
  });
}

__global__ void mask_scores_kernel(DeviceRows<float> scores, DeviceRows<const int8_t> mask) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= scores.rows * scores.cols) return;
  const int64_t t = index / scores.cols;
  const int64_t j = index % scores.cols;
  if (mask.row(t)[j] == 0) scores.row(t)[j] = -INFINITY;
}

}  // namespace

void compress_pool(const TensorView& kv, const TensorView& gate, int ratio, const TensorView& out) {
  const auto k = device_rows<const float>(kv, "compressor kv");
  const auto g = device_rows<const float>(gate, "compressor gate");
  const auto o = device_rows<float>(out, "compressor output");
  DI_CHECK(ratio > 0 && k.rows == g.rows && k.cols == g.cols && k.rows == o.rows * ratio &&
               o.cols == k.cols,
           "compress_pool shapes kv ", kv.to_string(), " gate ", gate.to_string(), " out ",
           out.to_string(), " ratio ", ratio);
  if (o.rows * o.cols == 0) return;
  compress_pool_kernel<<<blocks_for(o.rows * o.cols, kThreads), kThreads, 0, current_stream()>>>(
      k, g, ratio, o);
  DI_CUDA_LAUNCHED(compress_pool_kernel);
}

void write_indexer_keys(const TensorView& keys, std::span<const IndexerKeyWrite> writes) {
  const auto x = device_rows<const float>(keys, "indexer keys to cache");
  std::vector<KeyDestination> destinations;
  for (size_t w = 0; w < writes.size(); ++w) {
    const IndexerKeyWrite& write = writes[w];
    if (write.count == 0) continue;
    const DeviceKeys cache = device_keys(write.cache, "indexer key cache");
    check_indexer_key_write(w, write, cache.rows, cache.dim, x.rows, x.cols, keys);
    for (int64_t i = 0; i < write.count; ++i) {
      const int64_t row = write.start + i;
      destinations.push_back({const_cast<uint8_t*>(cache.codes) + row * cache.code_stride,
                              const_cast<uint8_t*>(cache.scales) + row * cache.scale_stride,
                              write.offset + i});
    }
  }
  if (destinations.empty()) return;
  DI_CHECK(x.cols <= 1024, "write_indexer_keys: ", x.cols, " channels exceed one block");
  DI_CHECK(destinations.size() <= INT32_MAX, "write_indexer_keys: too many keys for one launch");
  deepinfer::cuda::StreamBuffer table(destinations.size() * sizeof(KeyDestination));
  const KeyDestination* device_destinations =
      deepinfer::cuda::upload(table, destinations.data(), destinations.size());
  write_indexer_keys_kernel<<<static_cast<unsigned>(destinations.size()),
                              static_cast<unsigned>(x.cols), 0, current_stream()>>>(
      x, device_destinations);
  DI_CUDA_LAUNCHED(write_indexer_keys_kernel);
}

void indexer_scores(const TensorView& q, const IndexerKeys& keys, const TensorView& weights,
                    const TensorView& visible, float scale, const TensorView& out) {
  DI_CHECK(q.rank() == 3, "indexer q must be [T, Hi, Di]: ", q.to_string());
  const int64_t tokens = q.size(0);
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  const auto qr = device_rows<const float>(q, "indexer q");
  const DeviceKeys k = device_keys(keys, "indexer keys");
  const auto w = device_rows<const float>(weights, "indexer weights");
  const int32_t* vis = deepinfer::cuda::device_flat<const int32_t>(visible, "indexer visible");
  const auto o = device_rows<float>(out, "indexer scores");
  DI_CHECK(k.rows == 0 || k.dim == dim, "indexer keys of ", k.dim, " channels for q ",
           q.to_string());
  DI_CHECK(w.rows == tokens && w.cols == heads, "indexer weights ", weights.to_string());
  DI_CHECK(o.rows == tokens && o.cols == k.rows, "indexer scores ", out.to_string());
  DI_CHECK(visible.numel() == tokens, "indexer visible ", visible.to_string());
  if (tokens * k.rows == 0) return;
  const size_t shared_bytes = static_cast<size_t>(heads * dim) * sizeof(float);
  if (shared_bytes > 48 * 1024) {
    DI_CUDA_CHECK(cudaFuncSetAttribute(indexer_scores_kernel,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(shared_bytes)));
  }
  DI_CHECK(tokens <= 65535, "indexer_scores: ", tokens, " tokens exceed one launch");
  const dim3 grid(blocks_for(k.rows, kIndexerWarps), static_cast<unsigned>(tokens));
  indexer_scores_kernel<<<grid, kIndexerWarps * 32, shared_bytes, current_stream()>>>(
      qr, heads, dim, k, w, vis, scale, o);
  DI_CUDA_LAUNCHED(indexer_scores_kernel);
}

namespace {

bool indexer_tensor_cores_on() {
  return kIndexerTensorCores.enabled();
}

template <int kDim>
void launch_indexer_mma(const std::vector<IndexerChunk>& chunks, int64_t width,
                        DeviceRows<const float> q, int heads, DeviceRows<const float> weights,
                        const int32_t* visible, float scale, DeviceRows<float> out) {
  constexpr size_t kSharedBytes = indexer_mma_shared_words(kDim) * sizeof(float);
  static const bool configured = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(indexer_scores_mma_kernel<kDim>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kSharedBytes)));
    return true;
  }();
  (void)configured;
  deepinfer::cuda::StreamBuffer table(chunks.size() * sizeof(IndexerChunk));
  const IndexerChunk* device_chunks = deepinfer::cuda::upload(table, chunks.data(), chunks.size());
  const int64_t key_tiles = (width + kKeysPerBlock - 1) / kKeysPerBlock;
  DI_CHECK(chunks.size() <= 65535 && key_tiles <= INT32_MAX,
           "indexer_scores_batch: ", chunks.size(), " token runs x ", key_tiles,
           " key tiles exceed one launch");
  // Key tiles vary fastest, so the blocks sharing a token run (and its q rows in L2) run together.
  const dim3 grid(static_cast<unsigned>(key_tiles), static_cast<unsigned>(chunks.size()));
  indexer_scores_mma_kernel<kDim><<<grid, kMmaThreads, kSharedBytes, current_stream()>>>(
      device_chunks, q, heads, weights, visible, scale, out);
  DI_CUDA_LAUNCHED(indexer_scores_mma_kernel);
}

template <int kDim>
void launch_indexer_decode(const std::vector<DecodeIndexerRow>& rows, int64_t width,
                           DeviceRows<const float> q, int heads, DeviceRows<const float> weights,
                           const int32_t* visible, float scale, DeviceRows<float> out) {
  const int64_t sms = deepinfer::cuda::multiprocessor_count();
  deepinfer::cuda::StreamBuffer table(rows.size() * sizeof(DecodeIndexerRow));
  const DecodeIndexerRow* device_rows_table =
      deepinfer::cuda::upload(table, rows.data(), rows.size());
  // Two blocks an SM fit (registers, 44 KB of shared memory): ~8 blocks an SM in all, so the last
  // wave is a small share of the call, and at least 2 tiles a warp (the ring's prologue copies are
  // wasted on fewer).
  const int64_t row_count = static_cast<int64_t>(rows.size());
  const int64_t tiles = (width + kDecodeKeysPerTile - 1) / kDecodeKeysPerTile;
  const int64_t blocks_per_row = std::max<int64_t>(1, (8 * sms + row_count - 1) / row_count);
  const int64_t tiles_per_warp = std::clamp<int64_t>(
      (tiles + kDecodeWarps * blocks_per_row - 1) / (kDecodeWarps * blocks_per_row), 2, 1 << 20);
  const int64_t key_blocks =
      (tiles + kDecodeWarps * tiles_per_warp - 1) / (kDecodeWarps * tiles_per_warp);
  DI_CHECK(rows.size() <= 65535, "indexer_scores_batch: ", rows.size(),
           " decode rows exceed one launch");
  DI_CHECK(width <= (int64_t{1} << 28), "indexer_scores_batch: ", width,
           " score columns exceed the decode kernel's 32-bit key indices");
  for (const DecodeIndexerRow& row : rows) {
    DI_CHECK(row.code_stride <= (int64_t{1} << 20), "indexer_scores_batch: key rows ",
             row.code_stride, " bytes apart exceed the decode kernel's 32-bit offsets");
  }
  const dim3 grid(static_cast<unsigned>(key_blocks), static_cast<unsigned>(rows.size()));
  launch_dependent(indexer_decode_scores_kernel<kDim>, grid, kDecodeThreads, 0, current_stream(),
                   device_rows_table, q, heads, weights, visible, scale,
                   static_cast<int>(tiles_per_warp), out);
}

}  // namespace

void indexer_scores_batch(const TensorView& q, std::span<const IndexerRequest> requests,
                          const TensorView& weights, const TensorView& visible, float scale,
                          const TensorView& out) {
  DI_CHECK(q.rank() == 3, "indexer q must be [T, Hi, Di]: ", q.to_string());
  const int64_t tokens = q.size(0);
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  const auto qr = device_rows<const float>(q, "indexer q");
  const auto w = device_rows<const float>(weights, "indexer weights");
  const int32_t* vis = deepinfer::cuda::device_flat<const int32_t>(visible, "indexer visible");
  const auto o = device_rows<float>(out, "indexer scores");
  DI_CHECK(w.rows == tokens && w.cols == heads, "indexer weights ", weights.to_string());
  DI_CHECK(o.rows == tokens, "indexer scores ", out.to_string(), " for ", tokens, " tokens");
  DI_CHECK(visible.numel() == tokens, "indexer visible ", visible.to_string());
  const int64_t width = o.cols;

  // Shapes the kernel is built for, and 16-byte rows for its vector loads (the forward's q
  // scratch and key caches always have them; the choice is per call, so a caller mixing in an
  // unaligned view would change every request's rounding, not only its own).
  bool tensor_cores = indexer_tensor_cores_on() && (dim == 32 || dim == 64 || dim == 128) &&
                      heads >= 1 && heads <= kStageRows &&
                      deepinfer::cuda::aligned_to(qr.data, 16) && qr.stride % 4 == 0;
  std::vector<IndexerChunk> chunks;
  std::vector<DecodeIndexerRow> decode_rows;
  std::vector<IndexerChunk> other_chunks;  // chunks of the requests not in decode_rows
  std::vector<int32_t> owner(static_cast<size_t>(tokens), -1);
  bool decode_scales_packed = true;
  for (size_t r = 0; r < requests.size(); ++r) {
    const IndexerRequest& request = requests[r];
    DI_CHECK(request.offset >= 0 && request.count >= 0 && request.offset + request.count <= tokens,
             "indexer request ", r, ": rows [", request.offset, ", +", request.count, ") outside ",
             tokens, " tokens");
    for (int64_t t = request.offset; t < request.offset + request.count; ++t) {
      DI_CHECK(owner[static_cast<size_t>(t)] < 0, "indexer token ", t, " is in two requests");
      owner[static_cast<size_t>(t)] = static_cast<int32_t>(r);
    }
    IndexerChunk chunk{};
    if (request.keys.rows() > 0) {
      const DeviceKeys k = device_keys(request.keys, "indexer keys");
      DI_CHECK(k.dim == dim, "indexer keys of ", k.dim, " channels for q ", q.to_string());
      chunk.codes = k.codes;
      chunk.scales = k.scales;
      chunk.code_stride = k.code_stride;
      chunk.scale_stride = k.scale_stride;
      chunk.entries = k.rows;
      // The lanes' code vectors (dim / 8 bytes) must be aligned.
      tensor_cores = tensor_cores && deepinfer::cuda::aligned_to(k.codes, 16) &&
                     k.code_stride % (dim / 8) == 0;
    }
    DI_CHECK(chunk.entries <= width, "indexer request ", r, " has ", chunk.entries,
             " keys, more than the score width ", width);
    for (int64_t begin = request.offset; begin < request.offset + request.count;
         begin += kTokensPerBlock) {
      chunk.token_begin = begin;
      chunk.token_end = std::min(begin + kTokensPerBlock, request.offset + request.count);
      chunks.push_back(chunk);
      if (request.count != 1) other_chunks.push_back(chunk);
    }
    if (request.count == 1) {
      decode_rows.push_back({chunk.codes, chunk.scales, chunk.code_stride, chunk.scale_stride,
                             chunk.entries, request.offset});
      // The decode kernel copies a tile's scales as one span of 4-byte words.
      decode_scales_packed = decode_scales_packed &&
                             (chunk.entries == 0 || (chunk.scale_stride == dim / 32 &&
                                                     deepinfer::cuda::aligned_to(chunk.scales, 4)));
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    DI_CHECK(owner[static_cast<size_t>(t)] >= 0, "indexer token ", t, " is in no request");
  }
  if (tokens == 0 || width == 0) return;

  if (!tensor_cores) {
    for (const IndexerRequest& request : requests) {
      if (request.count == 0) continue;
      const int64_t entries = request.keys.rows();
      const TensorView rows = out.narrow(0, request.offset, request.count);
      if (entries < width) {
        fill(rows.narrow(1, entries, width - entries), -std::numeric_limits<float>::infinity());
      }
      if (entries > 0) {
        cuda::indexer_scores(q.narrow(0, request.offset, request.count), request.keys,
                             weights.narrow(0, request.offset, request.count),
                             visible.narrow(0, request.offset, request.count), scale,
                             rows.narrow(1, 0, entries));
      }
    }
    return;
  }
  const int head_count = static_cast<int>(heads);
  if (!ops::batch_invariant() && kIndexerDecodeKernel.enabled() && heads <= kDecodeMaxHeads &&
      decode_scales_packed && !decode_rows.empty()) {
    if (dim == 32) {
      launch_indexer_decode<32>(decode_rows, width, qr, head_count, w, vis, scale, o);
    } else if (dim == 64) {
      launch_indexer_decode<64>(decode_rows, width, qr, head_count, w, vis, scale, o);
    } else {
      launch_indexer_decode<128>(decode_rows, width, qr, head_count, w, vis, scale, o);
    }
    chunks.swap(other_chunks);
    if (chunks.empty()) return;
  }
  if (dim == 32) {
    launch_indexer_mma<32>(chunks, width, qr, head_count, w, vis, scale, o);
  } else if (dim == 64) {
    launch_indexer_mma<64>(chunks, width, qr, head_count, w, vis, scale, o);
  } else {
    launch_indexer_mma<128>(chunks, width, qr, head_count, w, vis, scale, o);
  }
}

void candidate_blocks(const TensorView& scores, const TensorView& visible, int topk_blocks,
                      int block_size, const TensorView& mask_out) {
  const auto s = device_rows<const float>(scores, "candidate scores");
  const int32_t* vis = deepinfer::cuda::device_flat<const int32_t>(visible, "candidate visible");
  const auto m = device_rows<int8_t>(mask_out, "candidate mask");
  DI_CHECK(block_size > 0 && m.rows == s.rows && m.cols == s.cols, "candidate_blocks shapes");
  DI_CHECK(visible.numel() == s.rows, "candidate visible ", visible.to_string());
  if (s.rows * s.cols == 0) return;
  const int64_t blocks = (s.cols + block_size - 1) / block_size;
  const int keep = static_cast<int>(deepinfer::cuda::min64(std::max(topk_blocks, 0), blocks));
  deepinfer::cuda::StreamBuffer block_scores(static_cast<size_t>(s.rows * blocks) * sizeof(float));
  block_scores_kernel<<<blocks_for(s.rows * blocks, kThreads), kThreads, 0, current_stream()>>>(
      s, vis, block_size, blocks, block_scores.as<float>());
  DI_CUDA_LAUNCHED(block_scores_kernel);
  candidate_mask_kernel<<<static_cast<unsigned>(s.rows), kThreads, 0, current_stream()>>>(
      block_scores.as<float>(), blocks, keep, block_size, m);
  DI_CUDA_LAUNCHED(candidate_mask_kernel);
}

void mask_scores(const TensorView& scores, const TensorView& mask) {
  const auto s = device_rows<float>(scores, "masked scores");
  const auto m = device_rows<const int8_t>(mask, "score mask");
  DI_CHECK(m.rows == s.rows && m.cols == s.cols, "mask_scores shapes");
  if (s.rows * s.cols == 0) return;
  mask_scores_kernel<<<blocks_for(s.rows * s.cols, kThreads), kThreads, 0, current_stream()>>>(s,
                                                                                               m);
  DI_CUDA_LAUNCHED(mask_scores_kernel);
}

void topk_indices(const TensorView& scores, int k, const TensorView& idx_out) {
  const auto s = device_rows<const float>(scores, "top-k scores");
  const auto o = device_rows<int32_t>(idx_out, "top-k indices");
  DI_CHECK(o.rows == s.rows && o.cols == k && k >= 0, "topk_indices output ", idx_out.to_string());
  if (s.rows == 0 || k == 0) return;
  if (!ops::batch_invariant() && kRegisterTopK.enabled()) {
    const bool float4_rows = s.cols % 4 == 0 && s.stride % 4 == 0 && aligned_to(s.data, 16);
    const int64_t chunk_width = chunked_select_width(s.rows, s.cols, k);
    if (chunk_width == 0 && s.cols <= kMaxRegisterSelectColumns) {
      launch_register_select({s, k, static_cast<int>(s.cols), float4_rows, o, {}, {}});
      return;
    }
    if (chunk_width != 0) {
      // Pass 1: each chunk's top k with its scores, chunk after chunk (so in column order);
      // pass 2: the top k of those candidates, written as their columns in the row.
      const int64_t candidates = (s.cols + chunk_width - 1) / chunk_width * k;
      deepinfer::cuda::StreamBuffer buffer(static_cast<size_t>(s.rows * candidates) *
                                           (sizeof(float) + sizeof(int32_t)));
      auto* values = buffer.as<float>();
      auto* columns = reinterpret_cast<int32_t*>(values + s.rows * candidates);
      const DeviceRows<float> candidate_values{values, s.rows, candidates, candidates};
      const DeviceRows<int32_t> candidate_columns{columns, s.rows, candidates, candidates};
      launch_register_select({s,
                              k,
                              static_cast<int>(chunk_width),
                              float4_rows && chunk_width % 4 == 0,
                              candidate_columns,
                              candidate_values,
                              {}});
      launch_register_select({{values, s.rows, candidates, candidates},
                              k,
                              static_cast<int>(candidates),
                              candidates % 4 == 0,
                              o,
                              {},
                              {columns, s.rows, candidates, candidates}});
      return;
    }
  }
  if (kSharedTopK.enabled() && s.cols <= kMaxSharedSelectColumns) {
    const size_t row_bytes = static_cast<size_t>(s.cols) * sizeof(float);
    const bool float4_rows = s.cols % 4 == 0 && s.stride % 4 == 0 && aligned_to(s.data, 16);
    if (row_bytes > 32 * 1024) {  // with the static storage, past the default 48 KB
      DI_CUDA_CHECK(cudaFuncSetAttribute(topk_indices_shared_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(row_bytes)));
    }
    topk_indices_shared_kernel<<<static_cast<unsigned>(s.rows), kThreads, row_bytes,
                                 current_stream()>>>(s, k, float4_rows, o);
    DI_CUDA_LAUNCHED(topk_indices_shared_kernel);
    return;
  }
  topk_indices_kernel<<<static_cast<unsigned>(s.rows), kThreads, 0, current_stream()>>>(s, k, o);
  DI_CUDA_LAUNCHED(topk_indices_kernel);
}

}  // namespace deepinfer::ops::cuda
