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
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::ops::cuda {
namespace {

using deepinfer::cuda::DeviceRows;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxHeadDim = 1024;
constexpr int kDimsPerThread = kMaxHeadDim / kThreads;

struct AttentionArgs {
  DeviceRows<const float> q;  // [T, H*Dh]
  DeviceRows<const float> window;
  DeviceRows<const int32_t> ranges;
  DeviceRows<const float> compressed;
  DeviceRows<const int32_t> selected;  // rows == 0: no compressed keys
  const float* sinks;
  float scale;
  int64_t heads;
  int64_t head_dim;
  DeviceRows<float> out;
  int* error;
};

__global__ void __launch_bounds__(kThreads) sink_attention_kernel(AttentionArgs args) {
  extern __shared__ float query[];  // head_dim floats
  __shared__ float chunk_scores[kWarps];
  __shared__ const float* chunk_keys[kWarps];
  const int64_t t = blockIdx.x / args.heads;
  const int64_t h = blockIdx.x % args.heads;
  const int64_t dim = args.head_dim;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  for (int64_t d = threadIdx.x; d < dim; d += kThreads) query[d] = args.q.row(t)[h * dim + d];

  int32_t lo = args.ranges.row(t)[0];
  int32_t hi = args.ranges.row(t)[1];
  bool bad_range = lo < 0 || hi > args.window.rows || lo > hi;
  if (bad_range) {
    if (threadIdx.x == 0)
      deepinfer::cuda::record_error(args.error, deepinfer::cuda::kWindowRangeOutOfBounds);
    lo = hi = 0;
  }
  const int64_t window_count = hi - lo;
  const int64_t total = window_count + args.selected.cols * (args.selected.rows > 0);
  __syncthreads();

  float acc[kDimsPerThread];
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) acc[i] = 0.0f;
  float running_max = args.sinks[h];
  float denominator = 1.0f;  // exp(sink - running_max)

  for (int64_t chunk = 0; chunk < total; chunk += kWarps) {
    const int64_t slot = chunk + warp;
    const float* key = nullptr;
    if (slot < window_count) {
      key = args.window.row(lo + slot);
    } else if (slot < total) {
      const int32_t j = args.selected.row(t)[slot - window_count];
      if (j >= args.compressed.rows) {
        if (lane == 0) {
          deepinfer::cuda::record_error(args.error, deepinfer::cuda::kCompressedIndexOutOfBounds);
        }
      } else if (j >= 0) {
        key = args.compressed.row(j);
      }
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
constexpr bool kUseHeadGroupKernel = true;

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

struct GroupShared {
  float4 keys[kGroupKeys][kRowQuads];    // the tile's rows; absent keys are zeros
  float4 query[kGroupHeads][kRowQuads];  // the group's query rows
  float scores[kGroupHeads][kGroupKeys];
  float4 probs[kGroupKeys][kGroupHeads / 4];  // exp(score - running max), heads contiguous
  float running_max[kGroupHeads];
  float denominator[kGroupHeads];
  float rescale[kGroupHeads];  // exp(previous max - new max) of the last tile
  const float* key_rows[kGroupKeys];
};
constexpr size_t kGroupSharedBytes = sizeof(GroupShared);

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

__global__ void __launch_bounds__(kGroupThreads, 2)
    sink_attention_head_group_kernel(AttentionArgs args) {
  extern __shared__ float4 shared_quads[];
  GroupShared& shared = *reinterpret_cast<GroupShared*>(shared_quads);
  const int64_t groups = args.heads / kGroupHeads;
  const int64_t t = blockIdx.x / groups;
  const int64_t first_head = (blockIdx.x % groups) * kGroupHeads;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;

  const auto* q_quads = reinterpret_cast<const float4*>(args.q.row(t) + first_head * kGroupHeadDim);
  for (int i = tid; i < kGroupHeads * kRowQuads; i += kGroupThreads) {
    shared.query[i / kRowQuads][i % kRowQuads] = q_quads[i];
  }
  if (tid < kGroupHeads) {
    shared.running_max[tid] = args.sinks[first_head + tid];
    shared.denominator[tid] = 1.0f;  // exp(sink - running_max)
  }

  int32_t lo = args.ranges.row(t)[0];
  int32_t hi = args.ranges.row(t)[1];
  const bool bad_range = lo < 0 || hi > args.window.rows || lo > hi;
  if (bad_range) {
    if (tid == 0)
      deepinfer::cuda::record_error(args.error, deepinfer::cuda::kWindowRangeOutOfBounds);
    lo = hi = 0;
  }
  const int64_t window_count = hi - lo;
  const int64_t total = window_count + args.selected.cols * (args.selected.rows > 0);

  float2 acc[kGroupHeads];
#pragma unroll
  for (int h = 0; h < kGroupHeads; ++h) acc[h] = make_float2(0.0f, 0.0f);

  for (int64_t tile = 0; tile < total; tile += kGroupKeys) {
    // The tile's key rows, as the per-head kernel picks them (a bad compressed index is
    // recorded and skipped).
    if (tid < kGroupKeys) {
      const int64_t slot = tile + tid;
      const float* key = nullptr;
      if (slot < window_count) {
        key = args.window.row(lo + slot);
      } else if (slot < total) {
        const int32_t j = args.selected.row(t)[slot - window_count];
        if (j >= args.compressed.rows) {
          deepinfer::cuda::record_error(args.error, deepinfer::cuda::kCompressedIndexOutOfBounds);
        } else if (j >= 0) {
          key = args.compressed.row(j);
        }
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
            partial[i] * args.scale;
      }
    }
    __syncthreads();

    {
      const bool present = shared.key_rows[lane] != nullptr;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int head = 2 * warp + i;
        const float score = present ? shared.scores[head][lane] : -INFINITY;
        const float previous_max = shared.running_max[head];
        const float new_max = fmaxf(previous_max, deepinfer::cuda::warp_max(score));
        const float p = present ? expf(score - new_max) : 0.0f;
        const float tile_sum = deepinfer::cuda::warp_sum(p);
        reinterpret_cast<float*>(shared.probs[lane])[head] = p;
        __syncwarp();  // every lane has read running_max[head]
        if (lane == 0) {
          const float rescale = expf(previous_max - new_max);
          shared.rescale[head] = rescale;
          shared.denominator[head] = shared.denominator[head] * rescale + tile_sum;
          shared.running_max[head] = new_max;
        }
      }
    }
    __syncthreads();

#pragma unroll
    for (int quad = 0; quad < kGroupHeads / 4; ++quad) {
      const float4 r = reinterpret_cast<const float4*>(shared.rescale)[quad];
      acc[4 * quad + 0].x *= r.x;
      acc[4 * quad + 0].y *= r.x;
      acc[4 * quad + 1].x *= r.y;
      acc[4 * quad + 1].y *= r.y;
      acc[4 * quad + 2].x *= r.z;
      acc[4 * quad + 2].y *= r.z;
      acc[4 * quad + 3].x *= r.w;
      acc[4 * quad + 3].y *= r.w;
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
  __syncthreads();  // the denominators of a call without keys were written by other threads
  float* y = args.out.row(t) + first_head * kGroupHeadDim;
#pragma unroll
  for (int h = 0; h < kGroupHeads; ++h) {
    const float inv = bad_range ? __int_as_float(0x7fc00000) : 1.0f / shared.denominator[h];
    reinterpret_cast<float2*>(y + h * kGroupHeadDim)[tid] =
        make_float2(acc[h].x * inv, acc[h].y * inv);
  }
}

bool aligned_rows(const void* data, int64_t stride_elements) {
  return reinterpret_cast<uintptr_t>(data) % 16 == 0 && stride_elements % 4 == 0;
}

// The head-group kernel's shapes and alignment; DEEPINFER_ATTENTION_HEAD_GROUPS=0 turns it off
// (read at every call, so one process can time both kernels).
bool head_group_kernel_fits(const AttentionArgs& args) {
  if (!kUseHeadGroupKernel) return false;
  const char* setting = std::getenv("DEEPINFER_ATTENTION_HEAD_GROUPS");
  if (setting != nullptr && std::string_view(setting) == "0") return false;
  return args.head_dim == kGroupHeadDim && args.heads % kGroupHeads == 0 &&
         aligned_rows(args.q.data, args.q.stride) && aligned_rows(args.out.data, args.out.stride) &&
         (args.window.rows == 0 || aligned_rows(args.window.data, args.window.stride)) &&
         (args.compressed.rows == 0 || aligned_rows(args.compressed.data, args.compressed.stride));
}

}  // namespace

void sink_attention(const TensorView& q, const TensorView& window_kv,
                    const TensorView& window_range, const TensorView& compressed_kv,
                    const TensorView& compressed_idx, const TensorView& sink, float scale,
                    const TensorView& out) {
  DI_CHECK(q.rank() == 3, "attention q must be [T, H, Dh]: ", q.to_string());
  AttentionArgs args{};
  const int64_t tokens = q.size(0);
  args.heads = q.size(1);
  args.head_dim = q.size(2);
  DI_CHECK(args.head_dim <= kMaxHeadDim, "attention head_dim ", args.head_dim, " exceeds ",
           kMaxHeadDim);
  args.q = deepinfer::cuda::device_rows<const float>(q, "attention q");
  args.out = deepinfer::cuda::device_rows<float>(out, "attention output");
  args.window = deepinfer::cuda::device_rows<const float>(window_kv, "window kv");
  args.ranges = deepinfer::cuda::device_rows<const int32_t>(window_range, "window range");
  args.sinks = deepinfer::cuda::device_flat<const float>(sink, "attention sink");
  DI_CHECK(args.out.rows == tokens && args.out.cols == args.heads * args.head_dim,
           "attention output ", out.to_string());
  DI_CHECK(args.window.rows == 0 || args.window.cols == args.head_dim, "window kv ",
           window_kv.to_string());
  DI_CHECK(args.ranges.rows == tokens && args.ranges.cols == 2, "window range ",
           window_range.to_string());
  DI_CHECK(sink.numel() == args.heads, "attention sink ", sink.to_string());
  if (compressed_idx.numel() > 0) {
    args.compressed = deepinfer::cuda::device_rows<const float>(compressed_kv, "compressed kv");
    args.selected =
        deepinfer::cuda::device_rows<const int32_t>(compressed_idx, "compressed indices");
    DI_CHECK(args.selected.rows == tokens, "compressed indices ", compressed_idx.to_string());
    DI_CHECK(args.compressed.rows == 0 || args.compressed.cols == args.head_dim, "compressed kv ",
             compressed_kv.to_string());
  }
  args.scale = scale;
  args.error = deepinfer::cuda::kernel_error_word();
  if (tokens * args.heads == 0) return;
  if (head_group_kernel_fits(args)) {
    static const bool configured = [] {
      DI_CUDA_CHECK(cudaFuncSetAttribute(sink_attention_head_group_kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(kGroupSharedBytes)));
      return true;
    }();
    (void)configured;
    const int64_t blocks = tokens * (args.heads / kGroupHeads);
    DI_CHECK(blocks <= INT32_MAX, "attention: ", tokens, " tokens exceed one launch");
    sink_attention_head_group_kernel<<<static_cast<unsigned>(blocks), kGroupThreads,
                                       kGroupSharedBytes, current_stream()>>>(args);
    DI_CUDA_LAUNCHED(sink_attention_head_group_kernel);
    return;
  }
  sink_attention_kernel<<<static_cast<unsigned>(tokens * args.heads), kThreads,
                          static_cast<size_t>(args.head_dim) * sizeof(float),
                          deepinfer::cuda::current_stream()>>>(args);
  DI_CUDA_LAUNCHED(sink_attention_kernel);
}

}  // namespace deepinfer::ops::cuda
