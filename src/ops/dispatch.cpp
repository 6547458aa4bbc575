// The public op layer: each function runs the backend of its first tensor argument's device.
#include <unistd.h>

#include <exception>
#include <fstream>
#include <string>

#include "core/error.h"
#include "ops/concurrent_branch.h"
#include "ops/ops.h"
#ifdef DEEPINFER_HAS_CUDA
#include "ops/cuda/branch_streams.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#endif

namespace deepinfer::ops {
namespace {

// True for a CUDA view (and only in a CUDA build); a CUDA view without the backend is an error.
bool on_gpu(const TensorView& view) {
  if (!view.device().is_cuda()) return false;
#ifndef DEEPINFER_HAS_CUDA
  DI_THROW("a tensor is on ", view.device().to_string(),
           " but this deepinfer was built without the CUDA backend (-DDEEPINFER_CUDA=ON)");
#endif
  return true;
}

}  // namespace

#ifdef DEEPINFER_HAS_CUDA
#define DI_DISPATCH(view, call) (on_gpu(view) ? cuda::call : cpu::call)
#else
#define DI_DISPATCH(view, call) (on_gpu(view), cpu::call)
#endif

void linear(const TensorView& x, const LinearWeight& weight, const TensorView& out,
            ActivationQuant activation_quant) {
  DI_DISPATCH(x, linear(x, weight, out, activation_quant));
}

void linear_pair(const TensorView& x, const LinearWeight& first, const TensorView& first_out,
                 const LinearWeight& second, const TensorView& second_out,
                 ActivationQuant activation_quant) {
  DI_DISPATCH(x, linear_pair(x, first, first_out, second, second_out, activation_quant));
}

void linear_grouped(const TensorView& x, const LinearWeight& weight, int64_t groups,
                    const TensorView& out) {
  DI_DISPATCH(x, linear_grouped(x, weight, groups, out));
}

int64_t scale_block_edge(int64_t extent, int64_t blocks) {
  if (blocks <= 0) return 0;
  for (int64_t edge : {32, 128, 64, 16}) {
    if ((extent + edge - 1) / edge == blocks) return edge;
  }
  for (int64_t edge = 1; edge <= extent; ++edge) {
    if ((extent + edge - 1) / edge == blocks) return edge;
  }
  return 0;
}

bool linear_grouped_supports(const LinearWeight& weight, int64_t groups) {
  return cpu::linear_grouped_supports(weight, groups);  // shapes only: host logic for every backend
}

void dequantize_weight(const LinearWeight& weight, const TensorView& out) {
  DI_DISPATCH(weight.weight, dequantize_weight(weight, out));
}

void embedding(const TensorView& table, std::span<const int32_t> ids, const TensorView& out) {
  DI_DISPATCH(table, embedding(table, ids, out));
}

void rmsnorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  DI_DISPATCH(x, rmsnorm(x, weight, eps, out));
}

RopeTable make_rope_table(int rope_dim, double theta, const YarnParams& yarn) {
  return cpu::make_rope_table(rope_dim, theta, yarn);  // host math for every backend
}

void rope(const TensorView& x, const TensorView& positions, const RopeTable& table, bool inverse) {
  DI_DISPATCH(x, rope(x, positions, table, inverse));
}

void softmax_rows(const TensorView& x) {
  DI_DISPATCH(x, softmax_rows(x));
}

void fake_quant_fp8(const TensorView& x, int block) {
  DI_DISPATCH(x, fake_quant_fp8(x, block));
}

void fake_quant_fp4(const TensorView& x, int block, Fp4ScaleFormat scale_format) {
  DI_DISPATCH(x, fake_quant_fp4(x, block, scale_format));
}

void sink_attention(const TensorView& q, const TensorView& window_kv,
                    const TensorView& window_range, const TensorView& compressed_kv,
                    const TensorView& compressed_idx, const TensorView& sink, float scale,
                    const TensorView& out) {
  DI_DISPATCH(q, sink_attention(q, window_kv, window_range, compressed_kv, compressed_idx, sink,
                                scale, out));
}

void sink_attention_batch(const TensorView& q, const TensorView& new_kv,
                          std::span<const AttentionRequest> requests, int64_t window,
                          const TensorView& sink, float scale, const TensorView& out) {
  DI_DISPATCH(q, sink_attention_batch(q, new_kv, requests, window, sink, scale, out));
}

void write_window_rings(const TensorView& new_kv, std::span<const AttentionRequest> requests) {
  DI_DISPATCH(new_kv, write_window_rings(new_kv, requests));
}

void compress_pool(const TensorView& kv, const TensorView& gate, int ratio, const TensorView& out) {
  DI_DISPATCH(kv, compress_pool(kv, gate, ratio, out));
}

void write_indexer_keys(const TensorView& keys, std::span<const IndexerKeyWrite> writes) {
  DI_DISPATCH(keys, write_indexer_keys(keys, writes));
}

void check_indexer_key_write(size_t index, const IndexerKeyWrite& write, int64_t cache_rows,
                             int64_t cache_dim, int64_t key_rows, int64_t key_dim,
                             const TensorView& keys) {
  DI_CHECK(cache_dim == key_dim, "indexer key cache of ", cache_dim, " channels for keys ",
           keys.to_string());
  DI_CHECK(write.offset >= 0 && write.count > 0 && write.offset + write.count <= key_rows,
           "indexer key write ", index, ": rows [", write.offset, ", +", write.count, ") outside ",
           key_rows, " keys");
  DI_CHECK(write.start >= 0 && write.start + write.count <= cache_rows, "indexer key write ", index,
           ": cache rows [", write.start, ", +", write.count, ") outside its ", cache_rows);
}

void indexer_scores(const TensorView& q, const IndexerKeys& keys, const TensorView& weights,
                    const TensorView& visible, float scale, const TensorView& out) {
  DI_DISPATCH(q, indexer_scores(q, keys, weights, visible, scale, out));
}

void indexer_scores_batch(const TensorView& q, std::span<const IndexerRequest> requests,
                          const TensorView& weights, const TensorView& visible, float scale,
                          const TensorView& out) {
  DI_DISPATCH(q, indexer_scores_batch(q, requests, weights, visible, scale, out));
}

void candidate_blocks(const TensorView& scores, const TensorView& visible, int topk_blocks,
                      int block_size, const TensorView& mask_out) {
  DI_DISPATCH(scores, candidate_blocks(scores, visible, topk_blocks, block_size, mask_out));
}

void mask_scores(const TensorView& scores, const TensorView& mask) {
  DI_DISPATCH(scores, mask_scores(scores, mask));
}

void topk_indices(const TensorView& scores, int k, const TensorView& idx_out) {
  DI_DISPATCH(scores, topk_indices(scores, k, idx_out));
}

void hc_mixes(const TensorView& x, const TensorView& fn, const TensorView& scale,
              const TensorView& base, const HcParams& params, const TensorView& pre,
              const TensorView& post, const TensorView& comb) {
  DI_DISPATCH(x, hc_mixes(x, fn, scale, base, params, pre, post, comb));
}

void hc_collapse(const TensorView& x, const TensorView& pre, const TensorView& out) {
  DI_DISPATCH(x, hc_collapse(x, pre, out));
}

void hc_expand(const TensorView& y, const TensorView& residual, const TensorView& post,
               const TensorView& comb, const TensorView& out) {
  DI_DISPATCH(y, hc_expand(y, residual, post, comb, out));
}

void route(const TensorView& x, const TensorView& gate, const TensorView& bias,
           const RouterParams& params, const TensorView& weights_out,
           const TensorView& experts_out) {
  DI_DISPATCH(x, route(x, gate, bias, params, weights_out, experts_out));
}

void swiglu(const TensorView& gate, const TensorView& up, float limit, const TensorView& row_weight,
            const TensorView& out) {
  DI_DISPATCH(gate, swiglu(gate, up, limit, row_weight, out));
}

void engram_gather(const TensorView& table, const TensorView& scale, const TensorView& ids,
                   const TensorView& out) {
  DI_DISPATCH(table, engram_gather(table, scale, ids, out));
}

void engram_mix(const TensorView& x, const TensorView& key, const TensorView& value,
                const TensorView& qk, float eps, const TensorView& out) {
  DI_DISPATCH(x, engram_mix(x, key, value, qk, eps, out));
}

void copy(const TensorView& src, const TensorView& dst) {
  // Either side on the GPU makes it a CUDA copy (uploads and downloads included).
  DI_DISPATCH(on_gpu(src) ? src : dst, copy(src, dst));
}

void fill(const TensorView& x, float value) {
  DI_DISPATCH(x, fill(x, value));
}

void scale(const TensorView& x, float factor, const TensorView& out) {
  DI_DISPATCH(x, scale(x, factor, out));
}

void add(const TensorView& x, const TensorView& y, const TensorView& out) {
  DI_DISPATCH(x, add(x, y, out));
}

void moe_experts(const TensorView& x, const TensorView& experts, const TensorView& weights,
                 std::span<const ExpertWeights> expert_weights, float swiglu_limit,
                 ActivationQuant quant, const TensorView& out) {
  DI_DISPATCH(x, moe_experts(x, experts, weights, expert_weights, swiglu_limit, quant, out));
}

Allocator& allocator_for(Device device) {
  if (!device.is_cuda()) return host_allocator();
#ifdef DEEPINFER_HAS_CUDA
  return deepinfer::cuda::device_allocator(device.index);
#else
  DI_THROW("no allocator for ", device.to_string(),
           ": this deepinfer was built without the CUDA backend (-DDEEPINFER_CUDA=ON)");
#endif
}

int64_t free_memory(Device device) {
  if (device.is_cuda()) {
#ifdef DEEPINFER_HAS_CUDA
    return deepinfer::cuda::free_memory(device.index);
#else
    DI_THROW("no memory figures for ", device.to_string(),
             ": this deepinfer was built without the CUDA backend (-DDEEPINFER_CUDA=ON)");
#endif
  }
  // MemAvailable counts reclaimable caches, which free RAM alone does not.
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * sysconf(_SC_PAGESIZE);
}

void synchronize(Device device) {
  if (!device.is_cuda()) return;
#ifdef DEEPINFER_HAS_CUDA
  deepinfer::cuda::synchronize();
#else
  DI_THROW("cannot synchronize ", device.to_string(), ": built without the CUDA backend");
#endif
}

ConcurrentBranch::ConcurrentBranch(Device device) {
  if (!device.is_cuda()) return;
#ifdef DEEPINFER_HAS_CUDA
  if (!deepinfer::cuda::branches_enabled()) return;
  deepinfer::cuda::open_branch();
  open_ = true;
#else
  DI_THROW("cannot branch on ", device.to_string(), ": built without the CUDA backend");
#endif
}

ConcurrentBranch::~ConcurrentBranch() {
  if (!open_) return;
  try {
    join();
  } catch (const std::exception&) {
    // Unwinding from an op's error, or a failing device: the next synchronization reports it.
  }
}

void ConcurrentBranch::enter() {
#ifdef DEEPINFER_HAS_CUDA
  if (open_) deepinfer::cuda::enter_branch();
#endif
}

void ConcurrentBranch::leave() noexcept {
#ifdef DEEPINFER_HAS_CUDA
  if (open_) deepinfer::cuda::leave_branch();
#endif
}

void ConcurrentBranch::join() {
  if (!open_) return;
  open_ = false;
#ifdef DEEPINFER_HAS_CUDA
  deepinfer::cuda::join_branch();
#endif
}

#undef DI_DISPATCH

}  // namespace deepinfer::ops
