// sink_attention: shared-KV attention with a per-head sink over a window range and a list of
// selected compressed entries. One block per (token, head); each warp scores one key at a time
// (a warp-wide dot product over head_dim), and the block folds a chunk of keys into the output
// with an online softmax whose running maximum starts at the sink logit.
// Part 2: all heads of a token in one block (K = V is shared by every head), tensor-core QK^T
// and PV, the fp8/fp4 caches read directly.
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
  sink_attention_kernel<<<static_cast<unsigned>(tokens * args.heads), kThreads,
                          static_cast<size_t>(args.head_dim) * sizeof(float),
                          deepinfer::cuda::current_stream()>>>(args);
  DI_CUDA_LAUNCHED(sink_attention_kernel);
}

}  // namespace deepinfer::ops::cuda
