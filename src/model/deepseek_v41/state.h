// The per-request state of a DeepSeek-V4.1 forward, owned by the runtime; the model reads and
// writes it through views. One RequestState holds everything a request's next token depends on:
//
//  - a window ring per layer: the FP8-fake-quantized, post-RoPE K=V rows of the last
//    `window + max_rollback` positions, slot = position % capacity;
//  - per KV-source layer: the compressed KV rows (one per complete group, FP4-fake-quantized,
//    post-RoPE), the indexer keys (when the source runs an indexer; stored as the release's fp4
//    codes and ue8m0 scales, ops::IndexerKeys), and a ring of the
//    compressor's pre-pool kv / gate rows for the last `ratio + max_rollback` positions (ratio > 1
//    only) -- the partial group is read from it;
//  - the engram history: compressed token ids of the last `max_ngram + max_rollback` positions.
//
// Everything is sized at construction (max_tokens, max_rollback) and nothing is allocated
// afterwards. `length()` is the only counter: every other quantity (groups emitted, the partial
// group, which ring slot holds what) is a function of it. That is what makes rollback free:
// forgetting the last k tokens is `length -= k`, and the rings are sized so the rows the shorter
// state needs are still there (entries past the new length are never read and get overwritten).
#pragma once

#include <cstdint>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "model/deepseek_v41/config.h"
#include "ops/ops.h"

namespace deepinfer::deepseek_v41 {

struct StateLimits {
  int64_t max_tokens = 4096;  // longest sequence the state can hold
  int64_t max_rollback = 0;   // most tokens rollback() may forget at once
};

class RequestState {
 public:
  // `allocator` decides where the tensors live: the model's device (ops::allocator_for). The
  // engram history stays on the host (the hashing runs there).
  RequestState(const DeepseekV41TextConfig& config, StateLimits limits,
               Allocator& allocator = host_allocator());

  // Positions whose effects are in the state (the next token goes to position length()).
  int64_t length() const { return length_; }
  const StateLimits& limits() const { return limits_; }

  // Bytes a state with these limits holds on its device: what the constructor allocates (all
  // but the few-int engram history, on the host), computed without allocating.
  static int64_t bytes(const DeepseekV41TextConfig& config, StateLimits limits);

  // Forgets the last `count` tokens. Throws Error when count exceeds max_rollback or length().
  void rollback(int64_t count);
  // Back to an empty sequence (nothing is freed).
  void reset() { length_ = 0; }

  // ---- views for the model ----
  // The window ring of `layer`: [window_capacity, head_dim] f32.
  const TensorView& window(int64_t layer) const {
    return windows_[static_cast<size_t>(layer)].view();
  }
  int64_t window_capacity() const { return window_capacity_; }

  // Per KV-source layer (throws InternalError for other layers).
  const TensorView& compressed_kv(int64_t source_layer) const;  // [max_groups, head_dim]
  ops::IndexerKeys index_keys(int64_t source_layer) const;      // max_groups keys
  const TensorView& pending_kv(int64_t source_layer) const;     // [pending_capacity, head_dim]
  const TensorView& pending_gate(int64_t source_layer) const;   // [pending_capacity, head_dim]
  int64_t pending_capacity(int64_t source_layer) const;
  int64_t max_groups(int64_t source_layer) const;

  // Compressed token ids by position % history_capacity().
  int32_t* engram_history() { return engram_history_.data(); }
  const int32_t* engram_history() const { return engram_history_.data(); }
  int64_t history_capacity() const { return static_cast<int64_t>(engram_history_.size()); }

  // Called by the model once a forward has written `count` new positions.
  void advance(int64_t count);

 private:
  struct SourceState {
    int64_t layer = -1;
    int64_t ratio = 0;
    Tensor compressed_kv;
    Tensor index_key_codes;   // [max_groups, index_head_dim] packed fp4
    Tensor index_key_scales;  // [max_groups, index_head_dim / 32] ue8m0
    Tensor pending_kv;
    Tensor pending_gate;
  };
  const SourceState& source(int64_t layer) const;

  StateLimits limits_;
  int64_t length_ = 0;
  int64_t window_capacity_ = 0;
  std::vector<Tensor> windows_;
  std::vector<SourceState> sources_;
  std::vector<int32_t> engram_history_;
};

}  // namespace deepinfer::deepseek_v41
