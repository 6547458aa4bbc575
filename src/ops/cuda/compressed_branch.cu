// The CSA2 compressed branch: the compressor's gated pooling, the indexer's scores, and the
// two-level top-k selection. Both selections use one exact per-row top-k: a radix select finds
// the k-th largest key, then one ordered pass keeps everything above it and the lowest-index
// ties at it, which is the CPU reference's "larger first, then lower index" order.
#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::ops::cuda {
namespace {

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

constexpr int kIndexerWarps = 8;

// One block per (token, 8 keys): the token's queries sit in shared memory, each warp scores
// one key against every head in head order.
__global__ void __launch_bounds__(kIndexerWarps * 32)
    indexer_scores_kernel(DeviceRows<const float> q, int64_t heads, int64_t dim,
                          DeviceRows<const float> keys, DeviceRows<const float> weights,
                          const int32_t* visible, float scale, DeviceRows<float> out) {
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
  const float* key = keys.row(j);
  float sum = 0.0f;
  for (int64_t h = 0; h < heads; ++h) {
    float partial = 0.0f;
    for (int64_t d = lane; d < dim; d += 32) partial += query[h * dim + d] * key[d];
    const float s = deepinfer::cuda::warp_sum(partial);
    sum += fmaxf(s, 0.0f) * scale * weights.row(t)[h];
  }
  if (lane == 0) out.row(t)[j] = sum;
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

void indexer_scores(const TensorView& q, const TensorView& keys, const TensorView& weights,
                    const TensorView& visible, float scale, const TensorView& out) {
  DI_CHECK(q.rank() == 3, "indexer q must be [T, Hi, Di]: ", q.to_string());
  const int64_t tokens = q.size(0);
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  const auto qr = device_rows<const float>(q, "indexer q");
  const auto k = device_rows<const float>(keys, "indexer keys");
  const auto w = device_rows<const float>(weights, "indexer weights");
  const int32_t* vis = deepinfer::cuda::device_flat<const int32_t>(visible, "indexer visible");
  const auto o = device_rows<float>(out, "indexer scores");
  DI_CHECK(k.rows == 0 || k.cols == dim, "indexer keys ", keys.to_string());
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
  topk_indices_kernel<<<static_cast<unsigned>(s.rows), kThreads, 0, current_stream()>>>(s, k, o);
  DI_CUDA_LAUNCHED(topk_indices_kernel);
}

}  // namespace deepinfer::ops::cuda
