// sink_attention: shared-KV attention with a per-head sink over a window range and a list of
// selected compressed entries, an online softmax whose running maximum starts at the sink logit.
// Two kernels compute the same op:
//  - the head-group kernel (head_dim 512, heads a multiple of 16, 16-byte aligned rows: the
//    V4.1-Flash shapes): one block per (token, 16 heads). K = V is one row shared by every head,
//    so a tile of 32 key rows is loaded into shared memory once and serves all 16 heads for the
//    scores and the weighted sum (the per-head kernel reads each row once per head: 64 times);
//  - the per-head kernel (every other shape): one block per (token, head), a warp per key.
// Which one runs depends on the shapes and alignment only, never on the token count, and each
// token's arithmetic is fixed by its own inputs (batch invariant).
// The head-group kernel's products run on the tensor cores by default (sink_attention_mma_kernel
// and its split form, "tensor-core head-group kernels" below); DEEPINFER_ATTENTION_MMA=0 keeps
// the FMA head-group kernels described here.
// The head-group kernel's work is also run as a split-KV path when a call has few tokens (decode:
// tokens x 4 blocks would leave most SMs idle): one block per (token, 16 heads, chunk of 64 keys)
// and a combine kernel. It gives the one-block kernel's bits exactly (see kChunkKeys), so
// choosing it by the token count keeps the op batch invariant.
// Both kernels serve both forms of the op: sink_attention (one window matrix, per-token ranges)
// and sink_attention_batch (every request of a step: each token's window read from its
// request's ring and this call's new rows, through a per-request table uploaded per call).
// Thread 0 of a block resolves where its token's keys are (TokenKeys) into shared memory, so
// the inner loops only change in how a key slot becomes a row pointer.
// With batch invariance off (ops::batch_invariant() false), calls of at least
// DEEPINFER_ATTENTION_PREFILL_MIN_TOKENS tokens at 64 heads take the prefill kernel instead
// (attention_prefill.cuh: the 4 head-group blocks of a token as one cluster sharing each key
// tile), and decode-sized calls of at least DEEPINFER_ATTENTION_PREFILL_DECODE tokens take it too,
// split into chunks of each token's keys below 96 tokens (prefill_kernel_chosen, prefill_chunks),
// so there the kernel, and the bits, depend on the token count. From DEEPINFER_ATTENTION_WGMMA
// tokens (default 32) those calls take the wgmma kernel instead (attention_prefill_wgmma.cuh: one
// block a token, all 64 heads as the warpgroup MMA's M; whole tokens).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "ops/batch_invariance.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/fp8_mma.cuh"
#include "ops/cuda/runtime_switch.h"
#include "ops/cuda/wgmma.cuh"

namespace deepinfer::ops::cuda {
namespace {

using deepinfer::cuda::DeviceRows;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxHeadDim = 1024;
constexpr int kDimsPerThread = kMaxHeadDim / kThreads;

// false: sink_attention_batch and write_window_rings loop over the requests on the host, each
// gathering its window rows with copies and calling the single-matrix form (the forward's path
// before the batched op). DEEPINFER_ATTENTION_BATCHED=0 does the same at run time.
RuntimeSwitch kUseBatchedAttention{"DEEPINFER_ATTENTION_BATCHED", true};

struct ChunkState;

// One request of a batched call, as the kernels read it (no padding: 8-byte fields only).
struct DeviceRequest {
  float* ring;  // [capacity, Dh]: position p at slot p % capacity
  int64_t ring_stride;
  int64_t ring_capacity;
  const float* compressed;
  int64_t compressed_stride;
  int64_t compressed_rows;
  const int32_t* selected;  // [count, k]; nullptr: no compressed keys
  int64_t selected_stride;
  int64_t selected_cols;
  int64_t offset;
  int64_t count;
  int64_t start;
};

struct AttentionArgs {
  DeviceRows<const float> q;  // [T, H*Dh]
  // The single-matrix form (requests == nullptr).
  DeviceRows<const float> window;
  DeviceRows<const int32_t> ranges;
  DeviceRows<const float> compressed;
  DeviceRows<const int32_t> selected;  // rows == 0: no compressed keys
  // The batched form.
  const DeviceRequest* requests;
  const int32_t* token_request;   // [T]
  DeviceRows<const float> fresh;  // [T, Dh]: this call's new K=V rows
  int64_t window_size;
  const float* sinks;
  float scale;
  int64_t heads;
  int64_t head_dim;
  DeviceRows<float> out;
  int* error;
  // The split path: per (token, head group) max_chunks chunk states.
  ChunkState* chunk_states;
  int64_t max_chunks;
  // The prefill kernel's split form: key tiles a chunk (attention_prefill.cuh).
  int64_t chunk_tiles;
  // The prefill kernel's fallback (attention_prefill.cuh): non-null, the one-block tensor-core
  // kernel computes only the tokens t with redo_tokens[t] != 0.
  int* redo_tokens;
};

// Where one token's keys are. Window slot s is position first + s: before ring_end it is the
// ring's slot position % capacity, from ring_end on the row of this call's rows `fresh` (the
// row of position ring_end, rows consecutive). The single-matrix form is a ring that holds all
// of its window (first = lo, ring_end = hi, capacity = its rows). Then the selected compressed
// rows. Lives in shared memory: no initializers.
struct TokenKeys {
  const float* ring;
  int64_t ring_stride;
  int64_t capacity;
  int64_t first;
  int64_t ring_end;
  const float* fresh;
  int64_t fresh_stride;
  int64_t window_count;
  const int32_t* selected;  // nullptr: no compressed keys
  int64_t selected_cols;
  const float* compressed;
  int64_t compressed_stride;
  int64_t compressed_rows;
  int bad_range;

  __device__ int64_t total() const {
    return window_count + (selected != nullptr ? selected_cols : 0);
  }
  __device__ const float* window_row(int64_t slot) const {
    const int64_t position = first + slot;
    return position < ring_end ? ring + (position % capacity) * ring_stride
                               : fresh + (position - ring_end) * fresh_stride;
  }
  // Selected entry `index`: nullptr when skipped (< 0) or past the rows (recorded).
  __device__ const float* compressed_row(int64_t index, int* error) const {
    const int32_t j = selected[index];
    if (j >= compressed_rows) {
      deepinfer::cuda::record_error(error, deepinfer::cuda::kCompressedIndexOutOfBounds);
      return nullptr;
    }
    return j >= 0 ? compressed + j * compressed_stride : nullptr;
  }
};

// Run by one thread per block: token t's keys, a bad range recorded (no window keys, NaN out).
__device__ void resolve_token_keys(const AttentionArgs& args, int64_t t, TokenKeys& keys) {
  if (args.requests == nullptr) {
    int32_t lo = args.ranges.row(t)[0];
    int32_t hi = args.ranges.row(t)[1];
    keys.bad_range = lo < 0 || hi > args.window.rows || lo > hi;
    if (keys.bad_range) {
      deepinfer::cuda::record_error(args.error, deepinfer::cuda::kWindowRangeOutOfBounds);
      lo = hi = 0;
    }
    keys.ring = args.window.data;
    keys.ring_stride = args.window.stride;
    keys.capacity = args.window.rows > 0 ? args.window.rows : 1;
    keys.first = lo;
    keys.ring_end = hi;
    keys.fresh = nullptr;
    keys.fresh_stride = 0;
    keys.window_count = hi - lo;
    const bool has_selected = args.selected.rows > 0 && args.selected.cols > 0;
    keys.selected = has_selected ? args.selected.row(t) : nullptr;
    keys.selected_cols = has_selected ? args.selected.cols : 0;
    keys.compressed = args.compressed.data;
    keys.compressed_stride = args.compressed.stride;
    keys.compressed_rows = args.compressed.rows;
    return;
  }
  const DeviceRequest& request = args.requests[args.token_request[t]];
  const int64_t position = request.start + t - request.offset;
  const int64_t first = position - args.window_size + 1 > 0 ? position - args.window_size + 1 : 0;
  // The host checked the table; a ring too short for the window is still caught here.
  keys.bad_range = request.start - first > request.ring_capacity;
  if (keys.bad_range) {
    deepinfer::cuda::record_error(args.error, deepinfer::cuda::kWindowRangeOutOfBounds);
  }
  keys.ring = request.ring;
  keys.ring_stride = request.ring_stride;
  keys.capacity = request.ring_capacity > 0 ? request.ring_capacity : 1;
  keys.first = first;
  keys.ring_end = request.start;
  keys.fresh = args.fresh.row(request.offset);
  keys.fresh_stride = args.fresh.stride;
  keys.window_count = keys.bad_range ? 0 : position - first + 1;
  const bool has_selected = request.selected != nullptr && request.selected_cols > 0;
  keys.selected =
      has_selected ? request.selected + (t - request.offset) * request.selected_stride : nullptr;
  keys.selected_cols = has_selected ? request.selected_cols : 0;
  keys.compressed = request.compressed;
  keys.compressed_stride = request.compressed_stride;
  keys.compressed_rows = request.compressed_rows;
}

__global__ void __launch_bounds__(kThreads) sink_attention_kernel(AttentionArgs args) {
  extern __shared__ float query[];  // head_dim floats
  __shared__ float chunk_scores[kWarps];
  __shared__ const float* chunk_keys[kWarps];
  __shared__ TokenKeys keys;
  const int64_t t = blockIdx.x / args.heads;
  const int64_t h = blockIdx.x % args.heads;
  const int64_t dim = args.head_dim;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) query[d] = args.q.row(t)[h * dim + d];
  if (threadIdx.x == 0) resolve_token_keys(args, t, keys);
  __syncthreads();
  const bool bad_range = keys.bad_range != 0;
  const int64_t window_count = keys.window_count;
  const int64_t total = keys.total();

  float acc[kDimsPerThread];
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) acc[i] = 0.0f;
  float running_max = args.sinks[h];
  float denominator = 1.0f;  // exp(sink - running_max)

  for (int64_t chunk = 0; chunk < total; chunk += kWarps) {
    const int64_t slot = chunk + warp;
    const float* key = nullptr;
    if (slot < window_count) {
      key = keys.window_row(slot);
    } else if (slot < total) {
      key = keys.compressed_row(slot - window_count, args.error);
    }
    float score = -INFINITY;
    if (key != nullptr) {
      float partial = 0.0f;
      for (int64_t d = lane; d < dim; d += 32) partial += query[d] * key[d];
      score = deepinfer::cuda::warp_sum(partial) * args.scale;
    }
    if (lane == 0) {
      chunk_scores[warp] = score;
      chunk_keys[warp] = key;
    }
    __syncthreads();
    float chunk_max = running_max;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (chunk_keys[w] != nullptr) chunk_max = fmaxf(chunk_max, chunk_scores[w]);
    }
    const float rescale = expf(running_max - chunk_max);
    denominator *= rescale;
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) acc[i] *= rescale;
    running_max = chunk_max;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float* value = chunk_keys[w];
      if (value == nullptr) continue;
      const float p = expf(chunk_scores[w] - running_max);
      denominator += p;
#pragma unroll
      for (int i = 0; i < kDimsPerThread; ++i) {
        const int64_t d = threadIdx.x + static_cast<int64_t>(i) * kThreads;
        if (d < dim) acc[i] = fmaf(p, value[d], acc[i]);
      }
    }
    __syncthreads();
  }
  float* y = args.out.row(t) + h * dim;
  const float inv = bad_range ? __int_as_float(0x7fc00000) : 1.0f / denominator;
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) {
    const int64_t d = threadIdx.x + static_cast<int64_t>(i) * kThreads;
    if (d < dim) y[d] = acc[i] * inv;
  }
}

// ---- head-group kernel ------------------------------------------------------------------------

// false: every call takes the per-head kernel again (the path before the head-group kernel).
RuntimeSwitch kUseHeadGroupKernel{"DEEPINFER_ATTENTION_HEAD_GROUPS", true};

constexpr int kGroupHeads = 16;     // heads per block: every key row loaded serves all of them
constexpr int kGroupHeadDim = 512;  // the one head_dim the kernel is built for (V4.1-Flash)
constexpr int kGroupKeys = 32;      // key rows per shared-memory tile
constexpr int kGroupWarps = 8;
constexpr int kGroupThreads = kGroupWarps * 32;
constexpr int kRowQuads = kGroupHeadDim / 4;  // float4 per row
constexpr int kRowPairs = kGroupHeadDim / 2;  // float2 per row
// Scores: warp w computes heads [8 (w / 4), +8) x keys [8 (w % 4), +8) of the tile, lanes
// splitting the dimension (consecutive floats: no bank conflicts), then folds the 64 partial
// sums across the lanes.
constexpr int kScoreHeads = 8;
constexpr int kScoreKeys = 8;
constexpr int kScorePairs = kScoreHeads * kScoreKeys;
constexpr int kKeyGroupsPerTile = kGroupKeys / kScoreKeys;
static_assert(kGroupHeads / kScoreHeads * kKeyGroupsPerTile == kGroupWarps);
static_assert(kScorePairs == 64, "the lane fold leaves two sums per lane");
static_assert(kGroupHeadDim % 32 == 0);
// Softmax: warp w updates heads 2w and 2w + 1, a lane per key of the tile.
static_assert(kGroupKeys == 32 && kGroupWarps * 2 == kGroupHeads);
// Weighted sum: thread i owns dimensions 2i and 2i + 1 of every head of the group.
static_assert(kGroupThreads == kRowPairs);
static_assert(kGroupHeads % 4 == 0);

// Split-KV ("flash decoding"): a token's keys (window first, then the selected compressed rows)
// are cut into chunks of kChunkKeys. Each chunk's softmax state (per head: max m, denominator l,
// unnormalized weighted sum acc) is computed from a fresh state, then merged into the running
// total, which starts at the sink (max = sink, denominator = exp(0) = 1, sum 0), in chunk order.
// The one-block kernel does this in one block per (token, head group); the split path computes
// every chunk in its own block into scratch and a combine kernel merges them. Both run the same
// chunk code and the same merge arithmetic (no FMA contraction possible: __fmul_rn/__fadd_rn),
// so their bits are identical and the split-or-not choice, made from the call's token count, is
// batch invariant.
constexpr int kChunkKeys = 64;
static_assert(kChunkKeys % kGroupKeys == 0, "chunks are whole key tiles");

// false: every head-group call takes the one-block kernel (same bits, fewer blocks at decode).
// DEEPINFER_ATTENTION_SPLIT=0 does the same at run time; DEEPINFER_ATTENTION_SPLIT=1 takes the
// split path whenever the head-group kernel fits (tests and benches force each path with it);
// unset (the default, kSplitKeysAuto): by the heuristic in split_keys_chosen.
constexpr int kSplitKeysNever = 0;
constexpr int kSplitKeysAlways = 1;
constexpr int kSplitKeysAuto = 2;
RuntimeSetting kSplitKeys{"DEEPINFER_ATTENTION_SPLIT", kSplitKeysAuto, kSplitKeysNever,
                          kSplitKeysAlways};
// The split path runs when the one-block kernel would launch fewer blocks than this many per
// SM: below it SMs idle while each block walks all of its token's keys. One, not the two that
// fit: on the H200 at 64 tokens (2 per SM) the split path took 0.299 ms against 0.245 ms (16
// tokens: 0.087 against 0.143, 1 token: 0.024 against 0.136).
constexpr int64_t kSplitBelowBlocksPerSm = 1;
// Scratch past this falls back to the one-block kernel (same bits) rather than allocating it.
constexpr size_t kMaxSplitScratchBytes = size_t{1} << 30;

struct GroupShared {
  float4 keys[kGroupKeys][kRowQuads];    // the tile's rows; absent keys are zeros
  float4 query[kGroupHeads][kRowQuads];  // the group's query rows
  float scores[kGroupHeads][kGroupKeys];
  float4 probs[kGroupKeys][kGroupHeads / 4];  // exp(score - chunk max), heads contiguous
  float chunk_max[kGroupHeads];               // the current chunk's state, from -inf and 0
  float chunk_denominator[kGroupHeads];
  // exp(previous max - new max) of the last tile, read as float4.
  alignas(16) float rescale[kGroupHeads];
  float total_max[kGroupHeads];  // the merged chunks and the sink
  float total_denominator[kGroupHeads];
  float keep[kGroupHeads];  // the last merge's factors for the total and for the chunk
  float add[kGroupHeads];
  const float* key_rows[kGroupKeys];
  TokenKeys token_keys;
};
constexpr size_t kGroupSharedBytes = sizeof(GroupShared);

// One chunk's state as the split kernel leaves it for the combine kernel: per head of the group
// the max, the denominator and the unnormalized sum (float2 pair i: dimensions 2i, 2i + 1).
struct ChunkState {
  float max[kGroupHeads];
  float denominator[kGroupHeads];
  float2 sum[kGroupHeads][kRowPairs];
};

// One merge of a chunk (chunk_max, chunk_denominator) into the total: the factors `keep` for the
// total and `add` for the chunk. A chunk without keys (max -inf) adds nothing and no NaN.
// The one place this arithmetic is written: both paths call it.
__device__ __forceinline__ void merge_chunk_scales(float& total_max, float& total_denominator,
                                                   float chunk_max, float chunk_denominator,
                                                   float& keep, float& add) {
  const float new_max = fmaxf(total_max, chunk_max);
  keep = total_max == -INFINITY ? 0.0f : expf(total_max - new_max);
  add = chunk_max == -INFINITY ? 0.0f : expf(chunk_max - new_max);
  total_denominator =
      __fadd_rn(__fmul_rn(total_denominator, keep), __fmul_rn(chunk_denominator, add));
  total_max = new_max;
}

__device__ __forceinline__ float2 merge_chunk_sum(float2 total, float2 chunk, float keep,
                                                  float add) {
  return make_float2(__fadd_rn(__fmul_rn(total.x, keep), __fmul_rn(chunk.x, add)),
                     __fadd_rn(__fmul_rn(total.y, keep), __fmul_rn(chunk.y, add)));
}

// The output: the total sum over the total denominator (NaN for a bad window range).
__device__ __forceinline__ void write_group_output(const AttentionArgs& args, int64_t t,
                                                   int64_t first_head, bool bad_range,
                                                   const float* total_denominator,
                                                   const float2 (&total)[kGroupHeads]) {
  float* y = args.out.row(t) + first_head * kGroupHeadDim;
#pragma unroll
  for (int h = 0; h < kGroupHeads; ++h) {
    const float inv = bad_range ? __int_as_float(0x7fc00000) : 1.0f / total_denominator[h];
    reinterpret_cast<float2*>(y + h * kGroupHeadDim)[threadIdx.x] =
        make_float2(total[h].x * inv, total[h].y * inv);
  }
}

// Block prologue of both head-group kernels: the group's query rows and the token's keys.
__device__ __forceinline__ void load_group(const AttentionArgs& args, GroupShared& shared,
                                           int64_t t, int64_t first_head) {
  const auto* q_quads = reinterpret_cast<const float4*>(args.q.row(t) + first_head * kGroupHeadDim);
  for (int i = threadIdx.x; i < kGroupHeads * kRowQuads; i += kGroupThreads) {
    shared.query[i / kRowQuads][i % kRowQuads] = q_quads[i];
  }
  if (threadIdx.x == 0) resolve_token_keys(args, t, shared.token_keys);
}

// One step of a transposing warp reduction: lanes whose `offset` bit is set keep the upper half
// of the live values, the others the lower half, each adding its partner's copy of the half it
// keeps. Five steps from 64 values leave every lane two full sums: those of indices 2 lane and
// 2 lane + 1 (bit b of the lane chose the half of size 2^(b+1)). 62 shuffles instead of 320.
template <int kHalf, int kOffset>
__device__ __forceinline__ void fold_across_lanes(float (&values)[kScorePairs], int lane) {
  const bool upper = (lane & kOffset) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? values[i] : values[i + kHalf];
    const float keep = upper ? values[i + kHalf] : values[i];
    values[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
  }
}

// Keys [begin, end) of the token (end - begin <= kChunkKeys) from a fresh state: on return
// chunk_max / chunk_denominator (shared, final after a __syncthreads) and `acc` (this thread's
// dimensions 2 tid, 2 tid + 1 of every head) hold the chunk's state. Starts and ends without a
// barrier of its own: the caller's shared reads of the previous chunk must be done.
__device__ __forceinline__ void accumulate_chunk(const AttentionArgs& args, GroupShared& shared,
                                                 int64_t begin, int64_t end,
                                                 float2 (&acc)[kGroupHeads]) {
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int64_t window_count = shared.token_keys.window_count;
  if (tid < kGroupHeads) {
    shared.chunk_max[tid] = -INFINITY;
    shared.chunk_denominator[tid] = 0.0f;
  }
#pragma unroll
  for (int h = 0; h < kGroupHeads; ++h) acc[h] = make_float2(0.0f, 0.0f);

  for (int64_t tile = begin; tile < end; tile += kGroupKeys) {
    // The tile's key rows, as the per-head kernel picks them (a bad compressed index is
    // recorded and skipped).
    if (tid < kGroupKeys) {
      const int64_t slot = tile + tid;
      const float* key = nullptr;
      if (slot < window_count) {
        key = shared.token_keys.window_row(slot);
      } else if (slot < end) {
        key = shared.token_keys.compressed_row(slot - window_count, args.error);
      }
      shared.key_rows[tid] = key;
    }
    __syncthreads();  // key_rows written; the last tile's weighted sum is done with `keys`

    // All loads of the tile in flight before the first store: step s moves rows
    // [s * kRowsPerLoadStep, +kRowsPerLoadStep), thread tid column tid % kRowQuads of one of them.
    constexpr int kRowsPerLoadStep = kGroupThreads / kRowQuads;
    constexpr int kLoadSteps = kGroupKeys / kRowsPerLoadStep;
    static_assert(kGroupThreads % kRowQuads == 0 && kGroupKeys % kRowsPerLoadStep == 0);
    const int load_row = tid / kRowQuads;
    const int load_column = tid % kRowQuads;
    float4 staged[kLoadSteps];
#pragma unroll
    for (int step = 0; step < kLoadSteps; ++step) {
      const float* row = shared.key_rows[step * kRowsPerLoadStep + load_row];
      staged[step] = row != nullptr ? reinterpret_cast<const float4*>(row)[load_column]
                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int step = 0; step < kLoadSteps; ++step) {
      shared.keys[step * kRowsPerLoadStep + load_row][load_column] = staged[step];
    }
    __syncthreads();

    {
      const int head0 = (warp / kKeyGroupsPerTile) * kScoreHeads;
      const int key0 = (warp % kKeyGroupsPerTile) * kScoreKeys;
      float partial[kScorePairs];
#pragma unroll
      for (int i = 0; i < kScorePairs; ++i) partial[i] = 0.0f;
#pragma unroll 2
      for (int column = lane; column < kGroupHeadDim; column += 32) {
        float key[kScoreKeys];
#pragma unroll
        for (int k = 0; k < kScoreKeys; ++k) {
          key[k] = reinterpret_cast<const float*>(shared.keys[key0 + k])[column];
        }
#pragma unroll
        for (int h = 0; h < kScoreHeads; ++h) {
          const float query = reinterpret_cast<const float*>(shared.query[head0 + h])[column];
#pragma unroll
          for (int k = 0; k < kScoreKeys; ++k) {
            partial[h * kScoreKeys + k] = fmaf(query, key[k], partial[h * kScoreKeys + k]);
          }
        }
      }
      fold_across_lanes<32, 16>(partial, lane);
      fold_across_lanes<16, 8>(partial, lane);
      fold_across_lanes<8, 4>(partial, lane);
      fold_across_lanes<4, 2>(partial, lane);
      fold_across_lanes<2, 1>(partial, lane);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int pair = 2 * lane + i;
        shared.scores[head0 + pair / kScoreKeys][key0 + pair % kScoreKeys] =
            __fmul_rn(partial[i], args.scale);
      }
    }
    __syncthreads();

    {
      const bool present = shared.key_rows[lane] != nullptr;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int head = 2 * warp + i;
        const float score = present ? shared.scores[head][lane] : -INFINITY;
        const float previous_max = shared.chunk_max[head];
        const float new_max = fmaxf(previous_max, deepinfer::cuda::warp_max(score));
        const float p = present ? expf(score - new_max) : 0.0f;
        const float tile_sum = deepinfer::cuda::warp_sum(p);
        reinterpret_cast<float*>(shared.probs[lane])[head] = p;
        __syncwarp();  // every lane has read chunk_max[head]
        if (lane == 0) {
          // A fresh chunk's max is -inf: exp(-inf - -inf) would be NaN; its sum is 0 anyway.
          const float rescale = previous_max == -INFINITY ? 0.0f : expf(previous_max - new_max);
          shared.rescale[head] = rescale;
          shared.chunk_denominator[head] =
              __fadd_rn(__fmul_rn(shared.chunk_denominator[head], rescale), tile_sum);
          shared.chunk_max[head] = new_max;
        }
      }
    }
    __syncthreads();

#pragma unroll
    for (int quad = 0; quad < kGroupHeads / 4; ++quad) {
      const float4 r = reinterpret_cast<const float4*>(shared.rescale)[quad];
      acc[4 * quad + 0].x = __fmul_rn(acc[4 * quad + 0].x, r.x);
      acc[4 * quad + 0].y = __fmul_rn(acc[4 * quad + 0].y, r.x);
      acc[4 * quad + 1].x = __fmul_rn(acc[4 * quad + 1].x, r.y);
      acc[4 * quad + 1].y = __fmul_rn(acc[4 * quad + 1].y, r.y);
      acc[4 * quad + 2].x = __fmul_rn(acc[4 * quad + 2].x, r.z);
      acc[4 * quad + 2].y = __fmul_rn(acc[4 * quad + 2].y, r.z);
      acc[4 * quad + 3].x = __fmul_rn(acc[4 * quad + 3].x, r.w);
      acc[4 * quad + 3].y = __fmul_rn(acc[4 * quad + 3].y, r.w);
    }
#pragma unroll 4
    for (int k = 0; k < kGroupKeys; ++k) {
      const float2 value = reinterpret_cast<const float2*>(shared.keys[k])[tid];
#pragma unroll
      for (int quad = 0; quad < kGroupHeads / 4; ++quad) {
        const float4 p = shared.probs[k][quad];
        acc[4 * quad + 0].x = fmaf(p.x, value.x, acc[4 * quad + 0].x);
        acc[4 * quad + 0].y = fmaf(p.x, value.y, acc[4 * quad + 0].y);
        acc[4 * quad + 1].x = fmaf(p.y, value.x, acc[4 * quad + 1].x);
        acc[4 * quad + 1].y = fmaf(p.y, value.y, acc[4 * quad + 1].y);
        acc[4 * quad + 2].x = fmaf(p.z, value.x, acc[4 * quad + 2].x);
        acc[4 * quad + 2].y = fmaf(p.z, value.y, acc[4 * quad + 2].y);
        acc[4 * quad + 3].x = fmaf(p.w, value.x, acc[4 * quad + 3].x);
        acc[4 * quad + 3].y = fmaf(p.w, value.y, acc[4 * quad + 3].y);
      }
    }
  }
}

// The one-block kernel: one block per (token, 16 heads) walks all of the token's chunks.
__global__ void __launch_bounds__(kGroupThreads, 2)
    sink_attention_head_group_kernel(AttentionArgs args) {
  extern __shared__ float4 shared_quads[];
  GroupShared& shared = *reinterpret_cast<GroupShared*>(shared_quads);
  const int64_t groups = args.heads / kGroupHeads;
  const int64_t t = blockIdx.x / groups;
  const int64_t first_head = (blockIdx.x % groups) * kGroupHeads;
  const int tid = threadIdx.x;

  load_group(args, shared, t, first_head);
  if (tid < kGroupHeads) {
    shared.total_max[tid] = args.sinks[first_head + tid];
    shared.total_denominator[tid] = 1.0f;  // exp(sink - total_max)
  }
  __syncthreads();  // token_keys written
  const bool bad_range = shared.token_keys.bad_range != 0;
  const int64_t total_keys = shared.token_keys.total();

  // The merged sums wait in this thread's own elements of the output row between chunks:
  // registers would spill (the chunk's sums and the score tile already fill them), shared
  // memory would cost the second block per SM.
  float2* y = reinterpret_cast<float2*>(args.out.row(t) + first_head * kGroupHeadDim) + tid;
  constexpr int kHeadPairs = kRowPairs;  // float2 from one head's row to the next
  for (int64_t begin = 0; begin < total_keys; begin += kChunkKeys) {
    float2 acc[kGroupHeads];
    accumulate_chunk(args, shared, begin, min(total_keys, begin + kChunkKeys), acc);
    // Loaded before the barriers, so the loads' latency hides behind them and the merge.
    float2 previous[kGroupHeads];
#pragma unroll
    for (int h = 0; h < kGroupHeads; ++h) {
      previous[h] = begin == 0 ? make_float2(0.0f, 0.0f) : y[h * kHeadPairs];
    }
    __syncthreads();  // the chunk's max and denominator are final
    if (tid < kGroupHeads) {
      merge_chunk_scales(shared.total_max[tid], shared.total_denominator[tid],
                         shared.chunk_max[tid], shared.chunk_denominator[tid], shared.keep[tid],
                         shared.add[tid]);
    }
    __syncthreads();  // keep and add written
#pragma unroll
    for (int h = 0; h < kGroupHeads; ++h) {
      y[h * kHeadPairs] = merge_chunk_sum(previous[h], acc[h], shared.keep[h], shared.add[h]);
    }
  }
  __syncthreads();  // the denominators of a token without keys were written by other threads
  float2 total[kGroupHeads];
#pragma unroll
  for (int h = 0; h < kGroupHeads; ++h) {
    total[h] = total_keys == 0 ? make_float2(0.0f, 0.0f) : y[h * kHeadPairs];
  }
  write_group_output(args, t, first_head, bad_range, shared.total_denominator, total);
}

// The split path's first kernel: one block per (token, 16 heads, chunk), the chunk's state to
// args.chunk_states[(t * groups + group) * max_chunks + chunk]. Chunks past the token's keys
// write nothing (the combine kernel reads only the token's own chunks).
__global__ void __launch_bounds__(kGroupThreads, 2)
    sink_attention_chunk_kernel(AttentionArgs args) {
  extern __shared__ float4 shared_quads[];
  GroupShared& shared = *reinterpret_cast<GroupShared*>(shared_quads);
  const int64_t groups = args.heads / kGroupHeads;
  const int64_t chunk = blockIdx.x % args.max_chunks;
  const int64_t token_group = blockIdx.x / args.max_chunks;
  const int64_t t = token_group / groups;
  const int64_t first_head = (token_group % groups) * kGroupHeads;
  const int tid = threadIdx.x;

  load_group(args, shared, t, first_head);
  __syncthreads();  // token_keys written
  const int64_t total_keys = shared.token_keys.total();
  const int64_t begin = chunk * kChunkKeys;
  if (begin >= total_keys) return;  // the whole block: total_keys is the same for every thread
  float2 acc[kGroupHeads];
  accumulate_chunk(args, shared, begin, min(total_keys, begin + kChunkKeys), acc);
  __syncthreads();  // the chunk's max and denominator are final
  ChunkState& state = args.chunk_states[blockIdx.x];
  if (tid < kGroupHeads) {
    state.max[tid] = shared.chunk_max[tid];
    state.denominator[tid] = shared.chunk_denominator[tid];
  }
#pragma unroll
  for (int h = 0; h < kGroupHeads; ++h) state.sum[h][tid] = acc[h];
}

// The split path's second kernel: one block per (token, head) merges the token's chunks in
// chunk order into the sink's state, with the one-block kernel's merge, and writes the output.
// Every thread computes its head's merge factors itself (the same bits in every thread): no
// barrier between chunks, and the next chunks' loads can be in flight during a merge.
__global__ void __launch_bounds__(kGroupThreads) sink_attention_combine_kernel(AttentionArgs args) {
  __shared__ TokenKeys token_keys;
  wait_for_prior_grids();
  allow_dependent_grids();
  const int64_t t = blockIdx.x / args.heads;
  const int64_t head = blockIdx.x % args.heads;
  const int64_t groups = args.heads / kGroupHeads;
  const int group_head = static_cast<int>(head % kGroupHeads);
  const int tid = threadIdx.x;
  if (tid == 0) resolve_token_keys(args, t, token_keys);
  __syncthreads();
  const bool bad_range = token_keys.bad_range != 0;
  const int64_t chunks = (token_keys.total() + kChunkKeys - 1) / kChunkKeys;
  const ChunkState* states =
      args.chunk_states + (t * groups + head / kGroupHeads) * args.max_chunks;

  float total_max = args.sinks[head];
  float total_denominator = 1.0f;  // exp(sink - total_max)
  float2 total = make_float2(0.0f, 0.0f);
#pragma unroll 4
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const ChunkState& state = states[chunk];
    float keep, add;
    merge_chunk_scales(total_max, total_denominator, state.max[group_head],
                       state.denominator[group_head], keep, add);
    total = merge_chunk_sum(total, state.sum[group_head][tid], keep, add);
  }
  const float inv = bad_range ? __int_as_float(0x7fc00000) : 1.0f / total_denominator;
  reinterpret_cast<float2*>(args.out.row(t) + head * kGroupHeadDim)[tid] =
      make_float2(total.x * inv, total.y * inv);
}

// ---- tensor-core head-group kernels -----------------------------------------------------------
//
// The head-group kernels' products on the tensor cores (mma.sync m16n8k16 bf16 -> f32): the 16
// heads of a block are the MMA's M. Scores S = Q K^T take the tile's keys as N and head_dim as K;
// the weighted sum O = P V takes head_dim as N and the tile's keys as K.
//
// Exact products from bf16 terms: an f32 value x is cut into hi = bf16(x), then bf16 of each
// exact remainder; three terms hold x exactly (8 + 8 + 8 significand bits), so every product of
// terms is exact and only the MMA's f32 accumulation rounds. Queries and probabilities always take
// three terms. Key rows (K = V) that are bf16-exact take one: in V4.1-Flash every cached row is
// (window rows e4m3 x a power of two: 4 significand bits; compressed rows e2m1 x an e4m3 scale:
// at most 6), and every pair with a second or third key term would add an exact zero. Rows that
// are not (the op takes any f32) take three terms and the pairs (i, j) with i + j <= 2: the pairs
// left out (term i is at most 2^-8i of its value) add at most about 2^-23 |q k| per product, the
// size of f32 rounding. A warp votes per operand block
// (8 keys x 32 columns for the scores, 16 keys x 32 columns for the sums) whether every value is
// bf16-exact, so the choice is a function of the token's own keys alone.
//
// Batch invariance, and the split path = the one-block kernel: the chunk code
// (accumulate_chunk_mma) is one function of the token's keys [begin, end); both MMA kernels run it
// per 64-key chunk and merge the chunks with the FMA kernels' merge (merge_chunk_scales,
// merge_chunk_sum), the split path through the FMA path's combine kernel (ChunkState's layout is
// the same). The MMA kernels' bits differ from the FMA kernels' (another summation order), never
// between the two MMA forms or with the call's token count.
//
// Work per 32-key tile (8 warps): warp w owns head_dim columns [64 w, 64 w + 64) in both products.
// Scores: the warp's 16 x 32 partial dot products over its 64 columns (its query terms stay in
// registers for the whole block), added over the 8 warps in warp order through shared memory.
// Weighted sum: the warp's 16 heads x 64 columns of the chunk's sum, from all 32 keys of the tile.

// false: every head-group call takes the FMA kernels above again (the path before the tensor-core
// kernels). DEEPINFER_ATTENTION_MMA=0 does the same at run time (a test takes either path in one
// process with ScopedSwitch).
RuntimeSwitch kUseAttentionMma{"DEEPINFER_ATTENTION_MMA", true};

constexpr int kMmaTerms = 3;  // bf16 terms of a query or probability value: exact
constexpr int kMmaWarpColumns = kGroupHeadDim / kGroupWarps;
constexpr int kMmaUpperHeads = 8;  // an MMA fragment's rows g and g + 8
// 512 floats are 2048 bytes, a whole number of 128-byte bank cycles: eight lanes reading one
// column of eight rows would meet in one bank. Four floats more move each row 4 banks on.
constexpr int kMmaKeyRowFloats = kGroupHeadDim + 4;
// Score and probability rows: 8 banks apart, so a fragment's 8 rows x 4 lanes' float2 do not meet.
constexpr int kMmaScoreRowFloats = kGroupKeys + 8;
static_assert(kMmaWarpColumns == 64, "a warp's columns are two 32-column chunks");
static_assert(kGroupHeads == 16 && kGroupKeys == 32, "one MMA's M; two 16-key K steps per tile");
static_assert(kMmaKeyRowFloats * sizeof(float) % 16 == 0, "cp.async rows of 16-byte pieces");

struct MmaShared {
  float keys[kGroupKeys][kMmaKeyRowFloats];  // the tile's rows; absent keys are zeros
  // Per warp: the scores' sums over its 64 columns.
  float partial_scores[kGroupWarps][kGroupHeads][kMmaScoreRowFloats];
  float probs[kGroupHeads][kMmaScoreRowFloats];  // exp(score - chunk max)
  // Each lane's smallest query term, A registers of MMA m of chunk c: read in the score step only,
  // so the weighted sum's registers need not hold it.
  uint4 query_smallest[kGroupWarps][2][2][32];
  float chunk_max[kGroupHeads];  // the current chunk's state, from -inf and 0
  float chunk_denominator[kGroupHeads];
  float rescale[kGroupHeads];    // exp(previous max - new max) of the last tile
  float total_max[kGroupHeads];  // the merged chunks and the sink (one-block kernel)
  float total_denominator[kGroupHeads];
  float keep[kGroupHeads];  // the last merge's factors for the total and for the chunk
  float add[kGroupHeads];
  const float* key_rows[kGroupKeys];
  TokenKeys token_keys;
};
constexpr size_t kMmaSharedBytes = sizeof(MmaShared);
// Two blocks per SM (__launch_bounds__ below): an H200 SM has 228 KiB, 1 KiB of it per block
// reserved.
static_assert(kMmaSharedBytes <= 113 * 1024, "two blocks of the MMA kernels per SM");

// Two floats -> bf16x2 (round to nearest even), `low` in bits 0-15 (the MMA's lower K element).
__device__ __forceinline__ uint32_t attention_bf16_pair(float low, float high) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}

// low and high as kTerms bf16x2 words, largest first: word t holds bf16 of what the words before
// it left over (each remainder exact in f32).
template <int kTerms>
__device__ __forceinline__ void attention_split_pair(float low, float high,
                                                     uint32_t (&terms)[kTerms]) {
#pragma unroll
  for (int t = 0; t < kTerms; ++t) {
    terms[t] = attention_bf16_pair(low, high);
    low = __fsub_rn(low, __uint_as_float(terms[t] << 16));
    high = __fsub_rn(high, __uint_as_float(terms[t] & 0xFFFF0000u));
  }
}

__device__ __forceinline__ bool bf16_exact(float4 v) {
  return ((__float_as_uint(v.x) | __float_as_uint(v.y) | __float_as_uint(v.z) |
           __float_as_uint(v.w)) &
          0xFFFFu) == 0;
}

__device__ __forceinline__ float float4_component(float4 v, int index) {
  return index == 0 ? v.x : (index == 1 ? v.y : (index == 2 ? v.z : v.w));
}

// d += the products of A's kMmaTerms terms and B's kKeyTerms terms whose term orders add up to at
// most 2, chained into d from the smallest pairs to the largest.
template <int kKeyTerms>
__device__ __forceinline__ void mma_term_pairs(const uint32_t (&a)[kMmaTerms][4],
                                               const uint32_t (&b)[kKeyTerms][2], float (&d)[4]) {
#pragma unroll
  for (int order = kMmaTerms - 1; order >= 0; --order) {
#pragma unroll
    for (int j = 0; j < kKeyTerms; ++j) {
      const int i = order - j;
      if (i >= 0) mma_bf16_m16n8k16(a[i], b[j][0], b[j][1], d);
    }
  }
}

// One score MMA pair's B terms: 4 consecutive columns of one key row, (0, 1) and (2, 3).
template <int kKeyTerms>
__device__ __forceinline__ void key_terms(float4 columns, uint32_t (&b)[kKeyTerms][2]) {
  uint32_t first[kKeyTerms];
  uint32_t second[kKeyTerms];
  attention_split_pair(columns.x, columns.y, first);
  attention_split_pair(columns.z, columns.w, second);
#pragma unroll
  for (int t = 0; t < kKeyTerms; ++t) {
    b[t][0] = first[t];
    b[t][1] = second[t];
  }
}

// A warp's query terms but the smallest, kept in registers for the whole block: [32-column chunk
// c][MMA m of the chunk][term][A register]; the smallest go to shared.query_smallest. Within a
// chunk lane quad q holds columns [8q, 8q + 8): MMA 0 takes [8q, 8q + 4), MMA 1 [8q + 4, 8q + 8)
// (any K order works when A and B agree; this one reads 16 bytes at a time).
using QueryTerms = uint32_t[2][2][kMmaTerms - 1][4];

// Each thread reads back only the query_smallest entries it wrote: no barrier needed.
__device__ __forceinline__ void load_query_terms(const AttentionArgs& args, MmaShared& shared,
                                                 int64_t t, int64_t first_head, QueryTerms& terms) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const float* lower = args.q.row(t) + (first_head + (lane >> 2)) * kGroupHeadDim +
                       warp * kMmaWarpColumns + 8 * (lane & 3);
  const float* upper = lower + kMmaUpperHeads * kGroupHeadDim;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const float4 row = *reinterpret_cast<const float4*>(lower + 32 * c + 4 * m);
      const float4 row8 = *reinterpret_cast<const float4*>(upper + 32 * c + 4 * m);
      uint32_t words[4][kMmaTerms];
      attention_split_pair(row.x, row.y, words[0]);
      attention_split_pair(row8.x, row8.y, words[1]);
      attention_split_pair(row.z, row.w, words[2]);
      attention_split_pair(row8.z, row8.w, words[3]);
#pragma unroll
      for (int term = 0; term < kMmaTerms - 1; ++term) {
#pragma unroll
        for (int r = 0; r < 4; ++r) terms[c][m][term][r] = words[r][term];
      }
      constexpr int kSmallest = kMmaTerms - 1;
      shared.query_smallest[warp][c][m][lane] = make_uint4(
          words[0][kSmallest], words[1][kSmallest], words[2][kSmallest], words[3][kSmallest]);
    }
  }
}

// The chunk sum's MMAs of one 16-key step for one group of four 8-column tiles: `values[k]` holds
// keys 2 quad, 2 quad + 1, 2 quad + 8, 2 quad + 9 of the step at columns 4 group + [0, 4), and
// tile e takes column e of each (so this lane's output is 8 consecutive columns: see
// accumulate_chunk_mma). Each tile's products start from zero and are added to acc once.
template <int kKeyTerms>
__device__ __forceinline__ void weighted_sum_mmas(const uint32_t (&probs)[kMmaTerms][4],
                                                  const float4 (&values)[4], float (&acc)[4][4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    uint32_t first[kKeyTerms];
    uint32_t second[kKeyTerms];
    attention_split_pair(float4_component(values[0], e), float4_component(values[1], e), first);
    attention_split_pair(float4_component(values[2], e), float4_component(values[3], e), second);
    uint32_t b[kKeyTerms][2];
#pragma unroll
    for (int t = 0; t < kKeyTerms; ++t) {
      b[t][0] = first[t];
      b[t][1] = second[t];
    }
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_term_pairs(probs, b, d);
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[e][i] = __fadd_rn(acc[e][i], d[i]);
  }
}

// Keys [begin, end) of the token (end - begin <= kChunkKeys) from a fresh state, as
// accumulate_chunk: on return chunk_max / chunk_denominator (shared, final after a __syncthreads)
// and `acc` hold the chunk's state. acc[c][e][i] is head `group` (i < 2) or group + 8 (i >= 2),
// column 64 warp + 32 c + 8 quad + 4 (i % 2) + e (group = lane / 4, quad = lane % 4). Starts and
// ends without a barrier of its own: the caller's shared reads of the previous chunk must be done.
__device__ __forceinline__ void accumulate_chunk_mma(const AttentionArgs& args, MmaShared& shared,
                                                     int64_t begin, int64_t end,
                                                     const QueryTerms& query,
                                                     float (&acc)[2][4][4]) {
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int group = lane >> 2;
  const int quad = lane & 3;
  const int64_t window_count = shared.token_keys.window_count;
  if (tid < kGroupHeads) {
    shared.chunk_max[tid] = -INFINITY;
    shared.chunk_denominator[tid] = 0.0f;
  }
#pragma unroll
  for (int c = 0; c < 2; ++c) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[c][e][i] = 0.0f;
    }
  }

  for (int64_t tile = begin; tile < end; tile += kGroupKeys) {
    if (tid < kGroupKeys) {
      const int64_t slot = tile + tid;
      const float* key = nullptr;
      if (slot < window_count) {
        key = shared.token_keys.window_row(slot);
      } else if (slot < end) {
        key = shared.token_keys.compressed_row(slot - window_count, args.error);
      }
      shared.key_rows[tid] = key;
    }
    __syncthreads();  // key_rows written; the last tile's weighted sum is done with `keys`

    // The tile straight into shared memory, every copy in flight at once.
    for (int i = tid; i < kGroupKeys * kRowQuads; i += kGroupThreads) {
      const int row = i / kRowQuads;
      const int column = (i % kRowQuads) * 4;
      float* to = &shared.keys[row][column];
      const float* from = shared.key_rows[row];
      if (from != nullptr) {
        copy_16_async(shared_address(to), from + column);
      } else {
        *reinterpret_cast<float4*>(to) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    commit_copies();
    wait_copies<0>();
    __syncthreads();

    // Partial scores over this warp's columns: 8-key tile j, keys 8 j + group of the B operand.
    uint32_t a[2][2][kMmaTerms][4];  // all query terms (copies of registers: no instructions)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int term = 0; term < kMmaTerms - 1; ++term) {
#pragma unroll
          for (int r = 0; r < 4; ++r) a[c][m][term][r] = query[c][m][term][r];
        }
        const uint4 smallest = shared.query_smallest[warp][c][m][lane];
        a[c][m][kMmaTerms - 1][0] = smallest.x;
        a[c][m][kMmaTerms - 1][1] = smallest.y;
        a[c][m][kMmaTerms - 1][2] = smallest.z;
        a[c][m][kMmaTerms - 1][3] = smallest.w;
      }
    }
#pragma unroll
    for (int j = 0; j < kGroupKeys / 8; ++j) {
      const float* key = &shared.keys[8 * j + group][warp * kMmaWarpColumns + 8 * quad];
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float4 first = *reinterpret_cast<const float4*>(key + 32 * c);
        const float4 second = *reinterpret_cast<const float4*>(key + 32 * c + 4);
        if (__all_sync(0xffffffffu, bf16_exact(first) && bf16_exact(second))) {
          uint32_t b[1][2];
          key_terms(first, b);
          mma_term_pairs(a[c][0], b, d);
          key_terms(second, b);
          mma_term_pairs(a[c][1], b, d);
        } else {
          uint32_t b[kMmaTerms][2];
          key_terms(first, b);
          mma_term_pairs(a[c][0], b, d);
          key_terms(second, b);
          mma_term_pairs(a[c][1], b, d);
        }
      }
      // d: heads group and group + 8, keys 8 j + 2 quad and + 1.
      *reinterpret_cast<float2*>(&shared.partial_scores[warp][group][8 * j + 2 * quad]) =
          make_float2(d[0], d[1]);
      *reinterpret_cast<float2*>(
          &shared.partial_scores[warp][group + kMmaUpperHeads][8 * j + 2 * quad]) =
          make_float2(d[2], d[3]);
    }
    __syncthreads();

    // The softmax step of accumulate_chunk: warp w updates heads 2w and 2w + 1, a lane per key.
    {
      const bool present = shared.key_rows[lane] != nullptr;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int head = 2 * warp + i;
        float dot = shared.partial_scores[0][head][lane];
#pragma unroll
        for (int w = 1; w < kGroupWarps; ++w) {
          dot = __fadd_rn(dot, shared.partial_scores[w][head][lane]);
        }
        const float score = present ? __fmul_rn(dot, args.scale) : -INFINITY;
        const float previous_max = shared.chunk_max[head];
        const float new_max = fmaxf(previous_max, deepinfer::cuda::warp_max(score));
        const float p = present ? expf(score - new_max) : 0.0f;
        const float tile_sum = deepinfer::cuda::warp_sum(p);
        shared.probs[head][lane] = p;
        __syncwarp();  // every lane has read chunk_max[head]
        if (lane == 0) {
          // A fresh chunk's max is -inf: exp(-inf - -inf) would be NaN; its sum is 0 anyway.
          const float rescale = previous_max == -INFINITY ? 0.0f : expf(previous_max - new_max);
          shared.rescale[head] = rescale;
          shared.chunk_denominator[head] =
              __fadd_rn(__fmul_rn(shared.chunk_denominator[head], rescale), tile_sum);
          shared.chunk_max[head] = new_max;
        }
      }
    }
    __syncthreads();

    {
      const float rescale = shared.rescale[group];
      const float rescale8 = shared.rescale[group + kMmaUpperHeads];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[c][e][0] = __fmul_rn(acc[c][e][0], rescale);
          acc[c][e][1] = __fmul_rn(acc[c][e][1], rescale);
          acc[c][e][2] = __fmul_rn(acc[c][e][2], rescale8);
          acc[c][e][3] = __fmul_rn(acc[c][e][3], rescale8);
        }
      }
      // Two 16-key steps; in step s lane quad's K slots are keys 16 s + 2 quad, + 1, + 8, + 9.
      // Not unrolled: the two steps' operands at once would spill (the query terms, the sums).
#pragma unroll 1
      for (int s = 0; s < 2; ++s) {
        const int key = 16 * s + 2 * quad;
        uint32_t probs[kMmaTerms][4];
        {
          uint32_t words[4][kMmaTerms];
          // A registers: heads group / group + 8 x keys (key, + 1), then (key + 8, + 9).
          const float2 low = *reinterpret_cast<const float2*>(&shared.probs[group][key]);
          const float2 low8 =
              *reinterpret_cast<const float2*>(&shared.probs[group + kMmaUpperHeads][key]);
          const float2 high = *reinterpret_cast<const float2*>(&shared.probs[group][key + 8]);
          const float2 high8 =
              *reinterpret_cast<const float2*>(&shared.probs[group + kMmaUpperHeads][key + 8]);
          attention_split_pair(low.x, low.y, words[0]);
          attention_split_pair(low8.x, low8.y, words[1]);
          attention_split_pair(high.x, high.y, words[2]);
          attention_split_pair(high8.x, high8.y, words[3]);
#pragma unroll
          for (int term = 0; term < kMmaTerms; ++term) {
#pragma unroll
            for (int r = 0; r < 4; ++r) probs[term][r] = words[r][term];
          }
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float* value = &shared.keys[key][warp * kMmaWarpColumns + 32 * c + 4 * group];
          const float4 values[4] = {*reinterpret_cast<const float4*>(value),
                                    *reinterpret_cast<const float4*>(value + kMmaKeyRowFloats),
                                    *reinterpret_cast<const float4*>(value + 8 * kMmaKeyRowFloats),
                                    *reinterpret_cast<const float4*>(value + 9 * kMmaKeyRowFloats)};
          if (__all_sync(0xffffffffu, bf16_exact(values[0]) && bf16_exact(values[1]) &&
                                          bf16_exact(values[2]) && bf16_exact(values[3]))) {
            weighted_sum_mmas<1>(probs, values, acc[c]);
          } else {
            weighted_sum_mmas<kMmaTerms>(probs, values, acc[c]);
          }
        }
      }
    }
  }
}

// The one-block tensor-core kernel: one block per (token, 16 heads) walks all of the token's
// chunks, merging each as sink_attention_head_group_kernel does.
__global__ void __launch_bounds__(kGroupThreads, 2) sink_attention_mma_kernel(AttentionArgs args) {
  extern __shared__ float4 shared_quads[];
  MmaShared& shared = *reinterpret_cast<MmaShared*>(shared_quads);
  const int64_t groups = args.heads / kGroupHeads;
  const int64_t t = blockIdx.x / groups;
  if (args.redo_tokens != nullptr && args.redo_tokens[t] == 0) return;  // the whole block
  const int64_t first_head = (blockIdx.x % groups) * kGroupHeads;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int group = lane >> 2;

  if (tid == 0) resolve_token_keys(args, t, shared.token_keys);
  if (tid < kGroupHeads) {
    shared.total_max[tid] = args.sinks[first_head + tid];
    shared.total_denominator[tid] = 1.0f;  // exp(sink - total_max)
  }
  QueryTerms query;
  load_query_terms(args, shared, t, first_head, query);
  __syncthreads();  // token_keys written
  const bool bad_range = shared.token_keys.bad_range != 0;
  const int64_t total_keys = shared.token_keys.total();

  // The merged sums wait in this thread's own elements of the output row between chunks, as in
  // the FMA kernel (registers would spill: the query terms and the chunk's sums fill them).
  float* const y_row = args.out.row(t) + (first_head + group) * kGroupHeadDim +
                       (tid >> 5) * kMmaWarpColumns + 8 * (lane & 3);
  // Head group + 8 h, columns 32 c + 4 half + [0, 4) of this thread's.
  const auto y = [&](int h, int c, int half) {
    return reinterpret_cast<float4*>(y_row + h * kMmaUpperHeads * kGroupHeadDim + 32 * c +
                                     4 * half);
  };
  for (int64_t begin = 0; begin < total_keys; begin += kChunkKeys) {
    float acc[2][4][4];
    accumulate_chunk_mma(args, shared, begin, min(total_keys, begin + kChunkKeys), query, acc);
    __syncthreads();  // the chunk's max and denominator are final
    if (tid < kGroupHeads) {
      merge_chunk_scales(shared.total_max[tid], shared.total_denominator[tid],
                         shared.chunk_max[tid], shared.chunk_denominator[tid], shared.keep[tid],
                         shared.add[tid]);
    }
    __syncthreads();  // keep and add written
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float keep = shared.keep[group + h * kMmaUpperHeads];
      const float add = shared.add[group + h * kMmaUpperHeads];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float4 total = begin == 0 ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : *y(h, c, half);
          const int i = 2 * h + half;
          // The combine kernel's per-element merge, in pairs of elements as it reads them.
          const float2 low = merge_chunk_sum(make_float2(total.x, total.y),
                                             make_float2(acc[c][0][i], acc[c][1][i]), keep, add);
          const float2 high = merge_chunk_sum(make_float2(total.z, total.w),
                                              make_float2(acc[c][2][i], acc[c][3][i]), keep, add);
          *y(h, c, half) = make_float4(low.x, low.y, high.x, high.y);
        }
      }
    }
  }
  __syncthreads();  // the denominators of a token without keys were written by other threads
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = bad_range ? __int_as_float(0x7fc00000)
                                : 1.0f / shared.total_denominator[group + h * kMmaUpperHeads];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float4 total = total_keys == 0 ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : *y(h, c, half);
        *y(h, c, half) = make_float4(total.x * inv, total.y * inv, total.z * inv, total.w * inv);
      }
    }
  }
}

// The split path's first kernel on the tensor cores: one block per (token, 16 heads, chunk), the
// chunk's state to args.chunk_states as sink_attention_chunk_kernel leaves it (the combine kernel
// then merges the chunks).
__global__ void __launch_bounds__(kGroupThreads, 2)
    sink_attention_mma_chunk_kernel(AttentionArgs args) {
  extern __shared__ float4 shared_quads[];
  MmaShared& shared = *reinterpret_cast<MmaShared*>(shared_quads);
  wait_for_prior_grids();
  allow_dependent_grids();
  const int64_t groups = args.heads / kGroupHeads;
  const int64_t chunk = blockIdx.x % args.max_chunks;
  const int64_t token_group = blockIdx.x / args.max_chunks;
  const int64_t t = token_group / groups;
  const int64_t first_head = (token_group % groups) * kGroupHeads;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int group = lane >> 2;

  if (tid == 0) resolve_token_keys(args, t, shared.token_keys);
  __syncthreads();  // token_keys written
  const int64_t total_keys = shared.token_keys.total();
  const int64_t begin = chunk * kChunkKeys;
  if (begin >= total_keys) return;  // the whole block: total_keys is the same for every thread
  QueryTerms query;
  load_query_terms(args, shared, t, first_head, query);
  float acc[2][4][4];
  accumulate_chunk_mma(args, shared, begin, min(total_keys, begin + kChunkKeys), query, acc);
  __syncthreads();  // the chunk's max and denominator are final
  ChunkState& state = args.chunk_states[blockIdx.x];
  if (tid < kGroupHeads) {
    state.max[tid] = shared.chunk_max[tid];
    state.denominator[tid] = shared.chunk_denominator[tid];
  }
  const int column = (tid >> 5) * kMmaWarpColumns + 8 * (lane & 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* sum = reinterpret_cast<float*>(state.sum[group + h * kMmaUpperHeads]) + column;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = 2 * h + half;
        *reinterpret_cast<float4*>(sum + 32 * c + 4 * half) =
            make_float4(acc[c][0][i], acc[c][1][i], acc[c][2][i], acc[c][3][i]);
      }
    }
  }
}

// ---- the prefill kernel (batch invariance off) ---------------------------------------------

#include "ops/cuda/attention_prefill.cuh"
#include "ops/cuda/attention_prefill_wgmma.cuh"

bool aligned_rows(const void* data, int64_t stride_elements) {
  return aligned_to(data, 16) && stride_elements % 4 == 0;
}

// The head-group kernel's shapes and alignment (`key_rows_aligned`: every key row the call can
// read); DEEPINFER_ATTENTION_HEAD_GROUPS=0 turns it off (ScopedSwitch in one process: tests and
// benches time both kernels).
bool head_group_kernel_fits(const AttentionArgs& args, bool key_rows_aligned) {
  if (!kUseHeadGroupKernel.enabled()) return false;
  return args.head_dim == kGroupHeadDim && args.heads % kGroupHeads == 0 &&
         aligned_rows(args.q.data, args.q.stride) && aligned_rows(args.out.data, args.out.stride) &&
         key_rows_aligned;
}

// The checks and fields both forms share: q, out, sink, scale, error word.
AttentionArgs common_args(const TensorView& q, const TensorView& sink, float scale,
                          const TensorView& out) {
  DI_CHECK(q.rank() == 3, "attention q must be [T, H, Dh]: ", q.to_string());
  AttentionArgs args{};
  args.heads = q.size(1);
  args.head_dim = q.size(2);
  DI_CHECK(args.head_dim <= kMaxHeadDim, "attention head_dim ", args.head_dim, " exceeds ",
           kMaxHeadDim);
  args.q = deepinfer::cuda::device_rows<const float>(q, "attention q");
  args.out = deepinfer::cuda::device_rows<float>(out, "attention output");
  args.sinks = deepinfer::cuda::device_flat<const float>(sink, "attention sink");
  DI_CHECK(args.out.rows == q.size(0) && args.out.cols == args.heads * args.head_dim,
           "attention output ", out.to_string());
  DI_CHECK(sink.numel() == args.heads, "attention sink ", sink.to_string());
  args.scale = scale;
  args.error = deepinfer::cuda::kernel_error_word();
  return args;
}

// Whether a head-group call takes the split path. DEEPINFER_ATTENTION_SPLIT=0: never (the
// one-block kernel: the path before split-KV); =1: always (tests and benches force it to check
// both paths give the same bits); otherwise when the one-block kernel would leave SMs idle.
// ScopedSetting flips it in one process.
bool split_keys_chosen(int64_t one_block_blocks, int64_t max_chunks) {
  const int split_setting = kSplitKeys.value();
  if (split_setting == kSplitKeysNever) return false;
  const size_t scratch = static_cast<size_t>(one_block_blocks * max_chunks) * sizeof(ChunkState);
  if (max_chunks < 1 || scratch > kMaxSplitScratchBytes ||
      one_block_blocks * max_chunks > INT32_MAX) {
    return false;
  }
  if (split_setting == kSplitKeysAlways) return true;
  const int64_t sms = deepinfer::cuda::multiprocessor_count();
  // One chunk per token: nothing to split.
  return max_chunks > 1 && one_block_blocks < kSplitBelowBlocksPerSm * sms;
}

void set_group_shared_bytes() {
  static const bool configured = [] {
    for (const void* kernel : {reinterpret_cast<const void*>(sink_attention_head_group_kernel),
                               reinterpret_cast<const void*>(sink_attention_chunk_kernel)}) {
      DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kGroupSharedBytes)));
    }
    for (const void* kernel : {reinterpret_cast<const void*>(sink_attention_mma_kernel),
                               reinterpret_cast<const void*>(sink_attention_mma_chunk_kernel)}) {
      DI_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kMmaSharedBytes)));
    }
    return true;
  }();
  (void)configured;
}

// Whether head-group calls take the tensor-core kernels (kUseAttentionMma unless
// DEEPINFER_ATTENTION_MMA=0; ScopedSwitch flips it in one process).
bool attention_mma_chosen() {
  return kUseAttentionMma.enabled();
}

// Whether a head-group call takes the prefill kernel (attention_prefill.cuh): batch invariance
// off, 64 heads (one cluster of 4 head groups a token) and DEEPINFER_ATTENTION_PREFILL_MIN_TOKENS
// not 0. Calls of at least that many tokens (prefill; decode at b256 by default) take it, smaller
// ones (decode) from DEEPINFER_ATTENTION_PREFILL_DECODE tokens (0: never; below it the head-group
// kernels, the path before): prefill_chunks picks the form. With batch invariance on, never: the
// path and bits are the head-group kernels'.
bool prefill_kernel_chosen(const AttentionArgs& args, int64_t tokens) {
  if (ops::batch_invariant()) return false;
  const int min_tokens = prefill::kMinTokens.value();
  if (min_tokens <= 0 || args.heads != prefill::kClusterBlocks * kGroupHeads) return false;
  const int decode_from = prefill::kDecodeFromTokens.value();
  return tokens >= min_tokens || (decode_from > 0 && tokens >= decode_from);
}

// The prefill kernel's split form: chunks a token by the call's tokens, fitted to the H200's
// figures (docs/BENCHMARKS.md, "Batch invariance off: the prefill kernel's split form"; V4.1
// decode, 20 key tiles a token): about kPrefillSplitClusters clusters in all below
// kPrefillSplitBelowTokens tokens, at least two chunks a token there and at least
// kPrefillMinChunkTiles key tiles a chunk (a chunk's fixed costs: the token's keys resolved, the
// queries converted, the first tile's load not overlapped, its state written and merged, 128 KiB a
// chunk and token). That gives b8 5 chunks (0.0356 ms; the best measured, 7, 0.0327), b16 3
// (0.0579, the best), b64 2 (0.1616; 3: 0.1599); whole tokens from kPrefillSplitBelowTokens, where
// splitting measured slower (b128: 0.245 ms whole, 0.266 in 2 chunks; b256: 0.422 and 0.526).
constexpr int64_t kPrefillSplitClusters = 48;
constexpr int64_t kPrefillSplitBelowTokens = 96;
constexpr int64_t kPrefillMinChunkTiles = 3;

// Chunks a token for the prefill kernel: DEEPINFER_ATTENTION_PREFILL_CHUNKS when set; else 1 (the
// whole-token kernel) from DEEPINFER_ATTENTION_PREFILL_MIN_TOKENS or kPrefillSplitBelowTokens
// tokens; below, the split form's heuristic for a call of at most `max_tiles` tiles a token.
int64_t prefill_chunks(int64_t tokens, int64_t max_tiles) {
  const int forced = prefill::kChunks.value();
  if (forced > 0) return forced;
  if (tokens >= prefill::kMinTokens.value() || tokens >= kPrefillSplitBelowTokens) return 1;
  const int64_t wanted = std::max<int64_t>(2, (kPrefillSplitClusters + tokens - 1) / tokens);
  return std::max<int64_t>(1, std::min(wanted, max_tiles / kPrefillMinChunkTiles));
}

// Whether a prefill-kernel call takes the wgmma kernel (attention_prefill_wgmma.cuh, whole tokens)
// instead of the cluster kernel, whole-token or split: from DEEPINFER_ATTENTION_WGMMA tokens (0:
// never), one term only (exact products stay on the cluster kernel), and not with
// DEEPINFER_ATTENTION_PREFILL_CHUNKS forcing the split form (more than one chunk), on a device
// with wgmma (sm_90a; elsewhere the cluster kernel).
bool wgmma_prefill_chosen(bool exact, int64_t tokens) {
  const int from = prefill_wgmma::kFromTokens.value();
  return !exact && from > 0 && tokens >= from && prefill::kChunks.value() <= 1 &&
         deepinfer::cuda::device_has_wgmma();
}

// The prefill kernel (whole tokens, or its split form and the merge), then the one-block
// tensor-core kernel for the tokens it flagged (key rows that are not bf16-exact): that kernel's
// blocks for other tokens return at once. `max_keys`: no token has more keys.
void launch_prefill(AttentionArgs args, int64_t tokens, int64_t max_keys) {
  using Kernel = void (*)(AttentionArgs);
  // [split form][one bf16 term a query and probability value, exact products (three terms)].
  static constexpr Kernel kKernels[2][2] = {{prefill::sink_attention_prefill_kernel<1, false>,
                                             prefill::sink_attention_prefill_kernel<3, false>},
                                            {prefill::sink_attention_prefill_kernel<1, true>,
                                             prefill::sink_attention_prefill_kernel<3, true>}};
  static const bool configured = [] {
    for (const auto& form : kKernels) {
      for (const Kernel kernel : form) {
        DI_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(prefill::kSharedBytes)));
      }
    }
    return true;
  }();
  (void)configured;
  const bool exact = prefill::kExactProducts.enabled();
  const int variant = exact ? 1 : 0;
  const int64_t max_tiles = std::max<int64_t>(1, (max_keys + prefill::kKeys - 1) / prefill::kKeys);
  int64_t chunks = std::min(prefill_chunks(tokens, max_tiles), max_tiles);
  const int64_t chunk_tiles = (max_tiles + chunks - 1) / chunks;
  chunks = (max_tiles + chunk_tiles - 1) / chunk_tiles;  // no chunk past every token's keys
  const size_t scratch_bytes =
      static_cast<size_t>(tokens * prefill::kClusterBlocks * chunks) * sizeof(ChunkState);
  const bool wgmma = wgmma_prefill_chosen(exact, tokens);
  const bool split = !wgmma && chunks > 1 && scratch_bytes <= kMaxSplitScratchBytes &&
                     tokens * chunks * prefill::kClusterBlocks <= INT32_MAX;
  const int64_t blocks = tokens * prefill::kClusterBlocks;
  DI_CHECK(blocks <= INT32_MAX, "attention: ", tokens, " tokens exceed one launch");
  deepinfer::cuda::StreamBuffer redo(static_cast<size_t>(tokens) * sizeof(int));
  DI_CUDA_CHECK(cudaMemsetAsync(redo.as<int>(), 0, static_cast<size_t>(tokens) * sizeof(int),
                                current_stream()));
  args.redo_tokens = redo.as<int>();
  std::optional<deepinfer::cuda::StreamBuffer> scratch;
  if (wgmma) {
    static const bool wgmma_configured = [] {
      for (const Kernel kernel : {prefill_wgmma::sink_attention_wgmma_kernel<false>,
                                  prefill_wgmma::sink_attention_wgmma_kernel<true>}) {
        DI_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(prefill_wgmma::kSharedBytes)));
      }
      return true;
    }();
    (void)wgmma_configured;
    const Kernel kernel = prefill_wgmma::kPrefetch.enabled()
                              ? prefill_wgmma::sink_attention_wgmma_kernel<true>
                              : prefill_wgmma::sink_attention_wgmma_kernel<false>;
    kernel<<<static_cast<unsigned>(tokens), prefill_wgmma::kThreads, prefill_wgmma::kSharedBytes,
             current_stream()>>>(args);
    DI_CUDA_LAUNCHED(sink_attention_wgmma_kernel);
  } else if (split) {
    scratch.emplace(scratch_bytes);
    args.chunk_states = scratch->as<ChunkState>();
    args.max_chunks = chunks;
    args.chunk_tiles = chunk_tiles;
    kKernels[1][variant]<<<static_cast<unsigned>(blocks * chunks), prefill::kThreads,
                           prefill::kSharedBytes, current_stream()>>>(args);
    DI_CUDA_LAUNCHED(sink_attention_prefill_kernel);
    DI_CHECK(tokens * args.heads <= INT32_MAX, "attention: ", tokens, " tokens exceed one launch");
    const Kernel merge = exact ? prefill::sink_attention_prefill_merge_kernel<false>
                               : prefill::sink_attention_prefill_merge_kernel<true>;
    merge<<<static_cast<unsigned>(tokens * args.heads), prefill::kThreads, 0, current_stream()>>>(
        args);
    DI_CUDA_LAUNCHED(sink_attention_prefill_merge_kernel);
  } else {
    kKernels[0][variant]<<<static_cast<unsigned>(blocks), prefill::kThreads, prefill::kSharedBytes,
                           current_stream()>>>(args);
    DI_CUDA_LAUNCHED(sink_attention_prefill_kernel);
  }
  sink_attention_mma_kernel<<<static_cast<unsigned>(blocks), kGroupThreads, kMmaSharedBytes,
                              current_stream()>>>(args);
  DI_CUDA_LAUNCHED(sink_attention_mma_kernel);
}

// `max_keys`: no token of the call has more keys (window and selected entries together).
void launch_attention(AttentionArgs args, int64_t tokens, bool key_rows_aligned, int64_t max_keys) {
  if (tokens * args.heads == 0) return;
  if (head_group_kernel_fits(args, key_rows_aligned)) {
    set_group_shared_bytes();
    const int64_t blocks = tokens * (args.heads / kGroupHeads);
    DI_CHECK(blocks <= INT32_MAX, "attention: ", tokens, " tokens exceed one launch");
    const int64_t max_chunks = (max_keys + kChunkKeys - 1) / kChunkKeys;
    const bool mma = attention_mma_chosen();
    if (mma && prefill_kernel_chosen(args, tokens)) {
      launch_prefill(args, tokens, max_keys);
      return;
    }
    if (split_keys_chosen(blocks, max_chunks)) {
      deepinfer::cuda::StreamBuffer scratch(static_cast<size_t>(blocks * max_chunks) *
                                            sizeof(ChunkState));
      args.chunk_states = scratch.as<ChunkState>();
      args.max_chunks = max_chunks;
      if (mma) {
        launch_dependent(sink_attention_mma_chunk_kernel,
                         static_cast<unsigned>(blocks * max_chunks), kGroupThreads, kMmaSharedBytes,
                         current_stream(), args);
      } else {
        sink_attention_chunk_kernel<<<static_cast<unsigned>(blocks * max_chunks), kGroupThreads,
                                      kGroupSharedBytes, current_stream()>>>(args);
        DI_CUDA_LAUNCHED(sink_attention_chunk_kernel);
      }
      launch_dependent(sink_attention_combine_kernel, static_cast<unsigned>(tokens * args.heads),
                       kGroupThreads, 0, current_stream(), args);
      return;
    }
    if (mma) {
      sink_attention_mma_kernel<<<static_cast<unsigned>(blocks), kGroupThreads, kMmaSharedBytes,
                                  current_stream()>>>(args);
      DI_CUDA_LAUNCHED(sink_attention_mma_kernel);
      return;
    }
    sink_attention_head_group_kernel<<<static_cast<unsigned>(blocks), kGroupThreads,
                                       kGroupSharedBytes, current_stream()>>>(args);
    DI_CUDA_LAUNCHED(sink_attention_head_group_kernel);
    return;
  }
  DI_CHECK(tokens * args.heads <= INT32_MAX, "attention: ", tokens, " tokens exceed one launch");
  sink_attention_kernel<<<static_cast<unsigned>(tokens * args.heads), kThreads,
                          static_cast<size_t>(args.head_dim) * sizeof(float),
                          deepinfer::cuda::current_stream()>>>(args);
  DI_CUDA_LAUNCHED(sink_attention_kernel);
}

bool batched_path_on() {
  return kUseBatchedAttention.enabled();
}

// The per-request path (kUseBatchedAttention off): each request's window rows gathered into
// one matrix with copies, then the single-matrix form on its tokens.
void attention_per_request(const TensorView& q, const TensorView& new_kv,
                           std::span<const AttentionRequest> requests, int64_t window,
                           const TensorView& sink, float scale, const TensorView& out) {
  const int64_t head_dim = q.size(2);
  for (const AttentionRequest& request : requests) {
    if (request.count == 0) continue;
    const int64_t base = std::max<int64_t>(0, request.start - (window - 1));
    const int64_t rows = request.start + request.count - base;
    deepinfer::cuda::StreamBuffer rows_buffer(static_cast<size_t>(rows * head_dim) * sizeof(float));
    const TensorView window_rows =
        TensorView::contiguous(rows_buffer.as<float>(), DType::kF32, {rows, head_dim}, q.device());
    if (request.start > base) {
      const TensorView& ring = request.window_ring;
      DI_CHECK(ring.rank() == 2 && ring.size(0) >= request.start - base, "window ring ",
               ring.to_string(), " cannot hold the ", request.start - base, " positions before ",
               request.start);
      for_each_ring_run(ring.size(0), base, request.start - base,
                        [&](int64_t slot, int64_t row, int64_t n) {
                          copy(ring.narrow(0, slot, n), window_rows.narrow(0, row, n));
                        });
    }
    copy(new_kv.narrow(0, request.offset, request.count),
         window_rows.narrow(0, request.start - base, request.count));
    std::vector<int32_t> ranges(static_cast<size_t>(2 * request.count));
    for (int64_t t = 0; t < request.count; ++t) {
      const int64_t position = request.start + t;
      ranges[static_cast<size_t>(2 * t)] =
          static_cast<int32_t>(std::max<int64_t>(0, position - window + 1) - base);
      ranges[static_cast<size_t>(2 * t + 1)] = static_cast<int32_t>(position + 1 - base);
    }
    deepinfer::cuda::StreamBuffer range_buffer(ranges.size() * sizeof(int32_t));
    int32_t* device_ranges = deepinfer::cuda::upload(range_buffer, ranges.data(), ranges.size());
    sink_attention(
        q.narrow(0, request.offset, request.count), window_rows,
        TensorView::contiguous(device_ranges, DType::kI32, {request.count, 2}, q.device()),
        request.compressed_kv, request.selected, sink, scale,
        out.narrow(0, request.offset, request.count));
  }
}

// The batched call's table: per request its rows and views, per token its request (checked:
// the requests tile the tokens), uploaded in one copy.
struct RequestTable {
  std::vector<DeviceRequest> requests;
  std::vector<int32_t> token_request;
  bool key_rows_aligned = true;
  int64_t max_selected = 0;  // the most selected entries of a token
};

RequestTable build_request_table(std::span<const AttentionRequest> requests, int64_t tokens,
                                 int64_t head_dim, int64_t window) {
  RequestTable table;
  table.requests.resize(requests.size());
  table.token_request.assign(static_cast<size_t>(tokens), -1);
  for (size_t r = 0; r < requests.size(); ++r) {
    const AttentionRequest& request = requests[r];
    DI_CHECK(request.offset >= 0 && request.count >= 0 &&
                 request.offset + request.count <= tokens && request.start >= 0,
             "attention request ", r, ": rows [", request.offset, ", +", request.count,
             ") at position ", request.start, " outside ", tokens, " tokens");
    DeviceRequest& entry = table.requests[r];
    entry = DeviceRequest{};
    entry.offset = request.offset;
    entry.count = request.count;
    entry.start = request.start;
    if (request.window_ring.numel() > 0) {
      const auto ring = deepinfer::cuda::device_rows<float>(request.window_ring, "window ring");
      DI_CHECK(ring.cols == head_dim, "window ring ", request.window_ring.to_string());
      entry.ring = ring.data;
      entry.ring_stride = ring.stride;
      entry.ring_capacity = ring.rows;
      table.key_rows_aligned &= aligned_rows(ring.data, ring.stride);
    }
    const int64_t needed = std::min(request.start, window - 1);
    DI_CHECK(entry.ring_capacity >= needed, "window ring ", request.window_ring.to_string(),
             " cannot hold the ", needed, " positions before ", request.start);
    if (request.selected.numel() > 0) {
      const auto selected =
          deepinfer::cuda::device_rows<const int32_t>(request.selected, "compressed indices");
      DI_CHECK(selected.rows == request.count, "compressed indices ", request.selected.to_string());
      entry.selected = selected.data;
      entry.selected_stride = selected.stride;
      entry.selected_cols = selected.cols;
      table.max_selected = std::max(table.max_selected, selected.cols);
      const auto compressed =
          deepinfer::cuda::device_rows<const float>(request.compressed_kv, "compressed kv");
      DI_CHECK(compressed.rows == 0 || compressed.cols == head_dim, "compressed kv ",
               request.compressed_kv.to_string());
      entry.compressed = compressed.data;
      entry.compressed_stride = compressed.stride;
      entry.compressed_rows = compressed.rows;
      if (compressed.rows > 0) {
        table.key_rows_aligned &= aligned_rows(compressed.data, compressed.stride);
      }
    }
    for (int64_t t = request.offset; t < request.offset + request.count; ++t) {
      int32_t& owner = table.token_request[static_cast<size_t>(t)];
      DI_CHECK(owner < 0, "attention token ", t, " is in two requests");
      owner = static_cast<int32_t>(r);
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    DI_CHECK(table.token_request[static_cast<size_t>(t)] >= 0, "attention token ", t,
             " is in no request");
  }
  return table;
}

// The table's bytes on the device: the requests, then the token map.
struct UploadedTable {
  deepinfer::cuda::StreamBuffer buffer;
  const DeviceRequest* requests;
  const int32_t* token_request;
  explicit UploadedTable(const RequestTable& table)
      : buffer(table.requests.size() * sizeof(DeviceRequest) +
               table.token_request.size() * sizeof(int32_t)) {
    static_assert(sizeof(DeviceRequest) % alignof(int32_t) == 0);
    std::vector<unsigned char> bytes(table.requests.size() * sizeof(DeviceRequest) +
                                     table.token_request.size() * sizeof(int32_t));
    const size_t request_bytes = table.requests.size() * sizeof(DeviceRequest);
    if (request_bytes > 0) std::memcpy(bytes.data(), table.requests.data(), request_bytes);
    if (!table.token_request.empty()) {
      std::memcpy(bytes.data() + request_bytes, table.token_request.data(),
                  table.token_request.size() * sizeof(int32_t));
    }
    unsigned char* device = nullptr;
    if (!bytes.empty()) device = deepinfer::cuda::upload(buffer, bytes.data(), bytes.size());
    requests = reinterpret_cast<const DeviceRequest*>(device);
    token_request =
        device != nullptr ? reinterpret_cast<const int32_t*>(device + request_bytes) : nullptr;
  }
};

// One block per new row: the rows of the last `capacity` positions of each request go to its
// ring's slots.
constexpr int kRingThreads = 128;

__global__ void __launch_bounds__(kRingThreads)
    write_window_rings_kernel(DeviceRows<const float> fresh, const DeviceRequest* requests,
                              const int32_t* token_request) {
  wait_for_prior_grids();
  allow_dependent_grids();
  const int64_t t = blockIdx.x;
  if (token_request[t] < 0) return;  // a row no request claims is not written (as on the CPU)
  const DeviceRequest& request = requests[token_request[t]];
  const int64_t position = request.start + t - request.offset;
  if (position < request.start + request.count - request.ring_capacity) return;
  float* slot = request.ring + (position % request.ring_capacity) * request.ring_stride;
  const float* row = fresh.row(t);
  for (int64_t d = threadIdx.x; d < fresh.cols; d += kRingThreads) slot[d] = row[d];
}

}  // namespace

void sink_attention(const TensorView& q, const TensorView& window_kv,
                    const TensorView& window_range, const TensorView& compressed_kv,
                    const TensorView& compressed_idx, const TensorView& sink, float scale,
                    const TensorView& out) {
  AttentionArgs args = common_args(q, sink, scale, out);
  const int64_t tokens = q.size(0);
  args.window = deepinfer::cuda::device_rows<const float>(window_kv, "window kv");
  args.ranges = deepinfer::cuda::device_rows<const int32_t>(window_range, "window range");
  DI_CHECK(args.window.rows == 0 || args.window.cols == args.head_dim, "window kv ",
           window_kv.to_string());
  DI_CHECK(args.ranges.rows == tokens && args.ranges.cols == 2, "window range ",
           window_range.to_string());
  if (compressed_idx.numel() > 0) {
    args.compressed = deepinfer::cuda::device_rows<const float>(compressed_kv, "compressed kv");
    args.selected =
        deepinfer::cuda::device_rows<const int32_t>(compressed_idx, "compressed indices");
    DI_CHECK(args.selected.rows == tokens, "compressed indices ", compressed_idx.to_string());
    DI_CHECK(args.compressed.rows == 0 || args.compressed.cols == args.head_dim, "compressed kv ",
             compressed_kv.to_string());
  }
  const bool key_rows_aligned =
      (args.window.rows == 0 || aligned_rows(args.window.data, args.window.stride)) &&
      (args.compressed.rows == 0 || aligned_rows(args.compressed.data, args.compressed.stride));
  // A token's window keys are a range of the window rows.
  launch_attention(args, tokens, key_rows_aligned, args.window.rows + args.selected.cols);
}

void sink_attention_batch(const TensorView& q, const TensorView& new_kv,
                          std::span<const AttentionRequest> requests, int64_t window,
                          const TensorView& sink, float scale, const TensorView& out) {
  AttentionArgs args = common_args(q, sink, scale, out);
  const int64_t tokens = q.size(0);
  DI_CHECK(window >= 1, "attention window ", window);
  args.fresh = deepinfer::cuda::device_rows<const float>(new_kv, "attention new kv");
  DI_CHECK(args.fresh.rows == tokens && (tokens == 0 || args.fresh.cols == args.head_dim),
           "attention new kv ", new_kv.to_string());
  const RequestTable table = build_request_table(requests, tokens, args.head_dim, window);
  if (tokens == 0) return;
  if (!batched_path_on()) {
    attention_per_request(q, new_kv, requests, window, sink, scale, out);
    return;
  }
  const UploadedTable uploaded(table);
  args.requests = uploaded.requests;
  args.token_request = uploaded.token_request;
  args.window_size = window;
  launch_attention(args, tokens,
                   table.key_rows_aligned && aligned_rows(args.fresh.data, args.fresh.stride),
                   window + table.max_selected);
}

void write_window_rings(const TensorView& new_kv, std::span<const AttentionRequest> requests) {
  const auto fresh = deepinfer::cuda::device_rows<const float>(new_kv, "window new kv");
  const int64_t tokens = fresh.rows;
  for (const AttentionRequest& request : requests) {
    DI_CHECK(
        request.count == 0 || (request.window_ring.rank() == 2 && request.window_ring.size(0) > 0 &&
                               request.window_ring.size(1) == fresh.cols),
        "window ring ", request.window_ring.to_string(), " for rows ", new_kv.to_string());
  }
  const RequestTable table = build_request_table(requests, tokens, fresh.cols, 1);
  if (tokens == 0) return;
  if (!batched_path_on()) {
    for (const AttentionRequest& request : requests) {
      const TensorView& ring = request.window_ring;
      const int64_t end = request.start + request.count;
      const int64_t first = std::max(request.start, end - ring.size(0));
      for_each_ring_run(ring.size(0), first, end - first,
                        [&](int64_t slot, int64_t row, int64_t n) {
                          copy(new_kv.narrow(0, request.offset + first - request.start + row, n),
                               ring.narrow(0, slot, n));
                        });
    }
    return;
  }
  const UploadedTable uploaded(table);
  DI_CHECK(tokens <= INT32_MAX, "write_window_rings: ", tokens, " rows exceed one launch");
  launch_dependent(write_window_rings_kernel, static_cast<unsigned>(tokens), kRingThreads, 0,
                   current_stream(), fresh, uploaded.requests, uploaded.token_request);
}

}  // namespace deepinfer::ops::cuda
