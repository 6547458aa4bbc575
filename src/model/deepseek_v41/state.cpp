#include "model/deepseek_v41/state.h"

#include "core/error.h"
#include "ops/ops.h"

namespace deepinfer::deepseek_v41 {
namespace {

// Zero-filled on any device (entries past the length are never read; zeros keep runs
// reproducible).
Tensor zeroed(Shape shape, Allocator& allocator, DType dtype = DType::kF32) {
  if (allocator.device().is_cpu()) return Tensor::zeros(dtype, shape, allocator);
  Tensor tensor = Tensor::empty(dtype, shape, allocator);
  if (dtype == DType::kF32) {
    ops::fill(tensor.view(), 0.0f);
  } else {
    ops::copy(Tensor::zeros(dtype, shape).view(), tensor.view());
  }
  return tensor;
}

// The indexer key cache of `groups` keys (ops::IndexerKeys: e2m1 codes, a ue8m0 scale per 32).
int64_t key_code_bytes(const DeepseekV41TextConfig& config) {
  return config.index_head_dim / 2;  // packed fp4
}
int64_t key_scale_bytes(const DeepseekV41TextConfig& config) {
  return config.index_head_dim / 32;
}

}  // namespace

RequestState::RequestState(const DeepseekV41TextConfig& config, StateLimits limits,
                           Allocator& allocator)
    : limits_(limits) {
  if (limits.max_tokens <= 0 || limits.max_rollback < 0) {
    DI_THROW("request state limits must have max_tokens > 0 and max_rollback >= 0, got ",
             limits.max_tokens, " and ", limits.max_rollback);
  }
  window_capacity_ = config.sliding_window + limits.max_rollback;
  windows_.reserve(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    windows_.push_back(zeroed({window_capacity_, config.head_dim}, allocator));
  }
  for (int64_t layer : config.kv_source_layer_ids) {
    SourceState state;
    state.layer = layer;
    state.ratio = config.compress_ratio(layer);
    const int64_t groups = limits.max_tokens / state.ratio + 1;
    state.compressed_kv = zeroed({groups, config.head_dim}, allocator);
    if (config.is_index_source(layer)) {
      state.index_key_codes = zeroed({groups, config.index_head_dim}, allocator, DType::kF4E2M1x2);
      state.index_key_scales = zeroed({groups, key_scale_bytes(config)}, allocator, DType::kF8E8M0);
    }
    if (state.ratio > 1) {
      const int64_t pending = state.ratio + limits.max_rollback;
      state.pending_kv = zeroed({pending, config.head_dim}, allocator);
      state.pending_gate = zeroed({pending, config.head_dim}, allocator);
    }
    sources_.push_back(std::move(state));
  }
  if (!config.engram_layer_ids.empty()) {
    engram_history_.assign(static_cast<size_t>(config.engram_max_ngram_size + limits.max_rollback),
                           0);
  }
}

int64_t RequestState::bytes(const DeepseekV41TextConfig& config, StateLimits limits) {
  const int64_t f32 = static_cast<int64_t>(sizeof(float));
  int64_t total = config.num_hidden_layers * (config.sliding_window + limits.max_rollback) *
                  config.head_dim * f32;
  for (int64_t layer : config.kv_source_layer_ids) {
    const int64_t ratio = config.compress_ratio(layer);
    const int64_t groups = limits.max_tokens / ratio + 1;
    total += groups * config.head_dim * f32;
    if (config.is_index_source(layer)) {
      total += groups * (key_code_bytes(config) + key_scale_bytes(config));
    }
    if (ratio > 1) total += 2 * (ratio + limits.max_rollback) * config.head_dim * f32;
  }
  return total;
}

void RequestState::rollback(int64_t count) {
  if (count < 0 || count > limits_.max_rollback || count > length_) {
    DI_THROW("cannot roll back ", count, " tokens: the state holds ", length_,
             " and allows rolling back at most ", limits_.max_rollback);
  }
  length_ -= count;
}

void RequestState::advance(int64_t count) {
  DI_CHECK(count >= 0 && length_ + count <= limits_.max_tokens, "advance by ", count, " from ",
           length_);
  length_ += count;
}

const RequestState::SourceState& RequestState::source(int64_t layer) const {
  for (const SourceState& state : sources_) {
    if (state.layer == layer) return state;
  }
  DI_CHECK(false, "layer ", layer, " is not a KV source");
  return sources_.front();
}

const TensorView& RequestState::compressed_kv(int64_t source_layer) const {
  return source(source_layer).compressed_kv.view();
}
ops::IndexerKeys RequestState::index_keys(int64_t source_layer) const {
  const SourceState& state = source(source_layer);
  return {state.index_key_codes.view(), state.index_key_scales.view()};
}
const TensorView& RequestState::pending_kv(int64_t source_layer) const {
  return source(source_layer).pending_kv.view();
}
const TensorView& RequestState::pending_gate(int64_t source_layer) const {
  return source(source_layer).pending_gate.view();
}
int64_t RequestState::pending_capacity(int64_t source_layer) const {
  const SourceState& state = source(source_layer);
  return state.ratio > 1 ? state.pending_kv.shape()[0] : 0;
}
int64_t RequestState::max_groups(int64_t source_layer) const {
  return source(source_layer).compressed_kv.shape()[0];
}

}  // namespace deepinfer::deepseek_v41
