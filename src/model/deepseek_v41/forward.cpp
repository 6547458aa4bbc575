// The forward pass (docs/MODEL.md has the math with its sources; "State layout and forward"
// there describes the data flow implemented here).
//
// Shape of one call: N tokens from R requests, token-major. Everything per token (projections,
// norms, mHC, MoE) runs over all N rows at once; everything that reads a request's history
// (window attention, compressor groups, indexer, engram n-grams) runs per request on its rows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "model/deepseek_v41/model.h"

namespace deepinfer::deepseek_v41 {

// Grow-only scratch: after the largest step has been seen, a forward allocates nothing here.
struct ForwardWorkspace {
  std::vector<float> streams, collapsed, sublayer_out;
  std::vector<float> pre, post, comb, next_pre;
  std::vector<float> qr, q, kv, attn_out, grouped;
  std::vector<float> comp_kv, comp_gate, gathered_kv, gathered_gate, latent, keys;
  std::vector<float> index_q, index_w, scores;
  std::vector<float> window_rows;
  std::vector<int32_t> window_ranges;
  std::vector<float> moe_gate, moe_up, moe_rows, moe_out, shared_out, route_weights;
  std::vector<int32_t> route_experts;
  std::vector<float> engram_rows, engram_kv;
  std::vector<int64_t> engram_ids, engram_layer_ids;
  std::vector<int32_t> positions, ids;
  std::vector<int32_t> group_positions;
  std::vector<int32_t> visible;
  // Per request, per forward: the latest index source's selection and the candidate mask.
  std::vector<std::vector<int32_t>> selection;
  std::vector<int64_t> selection_width;
  std::vector<std::vector<int8_t>> candidates;
  std::vector<int64_t> candidates_width;
};

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

template <typename T>
T* grow(std::vector<T>& buffer, int64_t count) {
  if (buffer.size() < static_cast<size_t>(count)) buffer.resize(static_cast<size_t>(count));
  return buffer.data();
}

TensorView f32(float* data, Shape shape) {
  return TensorView::contiguous(data, DType::kF32, shape);
}
TensorView i32(int32_t* data, Shape shape) {
  return TensorView::contiguous(data, DType::kI32, shape);
}

ops::RopeTable rope_table_for(const RopeParameters& rope, const DeepseekV41TextConfig& config) {
  ops::YarnParams yarn;
  if (rope.rope_type == "yarn") {
    if (!rope.original_max_position_embeddings) {
      DI_THROW("yarn rope parameters need original_max_position_embeddings");
    }
    yarn.original_max_position = static_cast<double>(*rope.original_max_position_embeddings);
    yarn.factor = rope.factor.value_or(static_cast<double>(config.max_position_embeddings) /
                                       yarn.original_max_position);
    yarn.beta_fast = rope.yarn_beta_fast();
    yarn.beta_slow = rope.yarn_beta_slow();
    if (rope.attention_factor && *rope.attention_factor != 1.0) {
      DI_THROW("yarn attention_factor ", *rope.attention_factor,
               " is not supported (DeepSeek-V4.1 applies YaRN with attention factor 1)");
    }
  } else if (rope.rope_type != "default") {
    DI_THROW("rope_type '", rope.rope_type, "' is not supported (default or yarn)");
  }
  return ops::make_rope_table(static_cast<int>(config.qk_rope_head_dim), rope.rope_theta, yarn);
}

ops::ScoreFunction score_function(const std::string& name) {
  if (name == "softmax") return ops::ScoreFunction::kSoftmax;
  if (name == "sigmoid") return ops::ScoreFunction::kSigmoid;
  if (name == "sqrtsoftplus") return ops::ScoreFunction::kSqrtSoftplus;
  DI_THROW("scoring_func '", name, "' is not supported (softmax, sigmoid or sqrtsoftplus)");
}

struct RequestSpan {
  RequestState* state = nullptr;
  int64_t offset = 0;  // first row in the batch
  int64_t count = 0;   // new tokens
  int64_t start = 0;   // position of the first new token (= state length before the call)
  int64_t end() const { return start + count; }
};

// One forward call: the batch layout plus the layer-by-layer computation.
class ForwardPass {
 public:
  ForwardPass(const DeepseekV41TextConfig& config, const ModelParameters& parameters,
              Numerics numerics, const EngramHasher* engram, const ops::RopeTable& rope_main,
              const ops::RopeTable& rope_compress, ForwardWorkspace& ws,
              std::vector<RequestSpan> spans, int64_t tokens, const Model::LayerObserver& observer)
      : c_(config),
        p_(parameters),
        engram_(engram),
        rope_main_(rope_main),
        rope_compress_(rope_compress),
        ws_(ws),
        spans_(std::move(spans)),
        n_(tokens),
        dim_(config.hidden_size),
        hc_(config.hc_mult),
        quant_(numerics == Numerics::kReleased ? ops::ActivationQuant::kFp8PerBlock32
                                               : ops::ActivationQuant::kNone),
        observer_(observer) {}

  void run(const TensorView& logits);

 private:
  TensorView streams() { return f32(ws_.streams.data(), {n_, hc_, dim_}); }
  std::span<const int32_t> positions(int64_t offset, int64_t count) const {
    return {ws_.positions.data() + offset, static_cast<size_t>(count)};
  }
  void engram_hashes();
  void engram_layer(int64_t layer, int64_t engram_index);
  void attention(int64_t layer, const TensorView& x, const TensorView& out);
  void compressor(int64_t layer, const TensorView& x);
  void publish_compressed(int64_t layer, const RequestSpan& span, float* latent, int64_t groups,
                          int64_t first_group);
  void indexer(int64_t layer, const TensorView& x, const float* qr);
  void moe(int64_t layer, const TensorView& x, const TensorView& out);

  const DeepseekV41TextConfig& c_;
  const ModelParameters& p_;
  const EngramHasher* engram_;
  const ops::RopeTable& rope_main_;
  const ops::RopeTable& rope_compress_;
  ForwardWorkspace& ws_;
  std::vector<RequestSpan> spans_;
  const int64_t n_;
  const int64_t dim_;
  const int64_t hc_;
  const ops::ActivationQuant quant_;
  const Model::LayerObserver& observer_;
};

void ForwardPass::run(const TensorView& logits) {
  const float eps = static_cast<float>(c_.rms_norm_eps);
  // Embedding, replicated into hc identical streams; the first pre mix is one-hot on stream 0.
  float* x = grow(ws_.collapsed, n_ * dim_);
  ops::embedding(p_.embed, {ws_.ids.data(), static_cast<size_t>(n_)}, f32(x, {n_, dim_}));
  float* h = grow(ws_.streams, n_ * hc_ * dim_);
  for (int64_t t = 0; t < n_; ++t) {
    for (int64_t k = 0; k < hc_; ++k) std::copy_n(x + t * dim_, dim_, h + (t * hc_ + k) * dim_);
  }
  float* pre_mix = grow(ws_.next_pre, n_ * hc_);
  std::fill_n(pre_mix, n_ * hc_, 0.0f);
  for (int64_t t = 0; t < n_; ++t) pre_mix[t * hc_] = 1.0f;
  if (engram_ != nullptr) engram_hashes();

  const ops::HcParams hc_params{static_cast<int>(hc_), static_cast<int>(c_.hc_sinkhorn_iters),
                                static_cast<float>(c_.hc_eps), eps};
  float* pre = grow(ws_.pre, n_ * hc_);
  float* post = grow(ws_.post, n_ * hc_);
  float* comb = grow(ws_.comb, n_ * hc_ * hc_);
  float* y = grow(ws_.sublayer_out, n_ * dim_);
  const TensorView streams_flat = f32(h, {n_, hc_ * dim_});
  const TensorView pre_view = f32(pre, {n_, hc_});
  const TensorView post_view = f32(post, {n_, hc_});
  const TensorView comb_view = f32(comb, {n_, hc_, hc_});
  const TensorView x_view = f32(x, {n_, dim_});
  const TensorView y_view = f32(y, {n_, dim_});
  const TensorView pre_mix_view = f32(pre_mix, {n_, hc_});

  for (int64_t layer = 0; layer < c_.num_hidden_layers; ++layer) {
    const LayerParameters& lp = p_.layers[static_cast<size_t>(layer)];
    const int64_t engram_index = c_.engram_index(layer);
    if (engram_index >= 0) engram_layer(layer, engram_index);

    // Attention site: mixes from the streams; input collapsed with the previous site's pre.
    ops::hc_mixes(streams_flat, lp.hc_attn_fn, lp.hc_attn_scale, lp.hc_attn_base, hc_params,
                  pre_view, post_view, comb_view);
    ops::hc_collapse(streams(), pre_mix_view, x_view);
    ops::rmsnorm(x_view, lp.attn_norm, eps, x_view);
    attention(layer, x_view, y_view);
    ops::hc_expand(y_view, streams(), post_view, comb_view, streams());
    // This site's pre mix feeds the FFN site.
    std::copy_n(pre, n_ * hc_, pre_mix);

    ops::hc_mixes(streams_flat, lp.hc_ffn_fn, lp.hc_ffn_scale, lp.hc_ffn_base, hc_params, pre_view,
                  post_view, comb_view);
    ops::hc_collapse(streams(), pre_mix_view, x_view);
    ops::rmsnorm(x_view, lp.ffn_norm, eps, x_view);
    moe(layer, x_view, y_view);
    ops::hc_expand(y_view, streams(), post_view, comb_view, streams());
    std::copy_n(pre, n_ * hc_, pre_mix);
    if (observer_) observer_(layer, streams());
  }
  // Final collapse with the last site's pre mix, norm, head.
  ops::hc_collapse(streams(), pre_mix_view, x_view);
  ops::rmsnorm(x_view, p_.norm, eps, x_view);
  ops::linear(x_view, p_.head, logits);
}

// ---- engram -----------------------------------------------------------------------------------

void ForwardPass::engram_hashes() {
  const int64_t window = engram_->max_ngram();
  const int64_t per_token = engram_->layers() * engram_->columns();
  int64_t* ids = grow(ws_.engram_ids, n_ * per_token);
  std::vector<int32_t> lookback(static_cast<size_t>(window));
  for (const RequestSpan& span : spans_) {
    int32_t* history = span.state->engram_history();
    const int64_t capacity = span.state->history_capacity();
    auto compressed_at = [&](int64_t position) -> int32_t {
      if (position < 0) return -1;
      if (position >= span.start) {
        return engram_->compressed_id(
            ws_.ids[static_cast<size_t>(span.offset + position - span.start)]);
      }
      return history[position % capacity];
    };
    for (int64_t t = 0; t < span.count; ++t) {
      const int64_t position = span.start + t;
      for (int64_t s = 0; s < window; ++s)
        lookback[static_cast<size_t>(s)] = compressed_at(position - s);
      engram_->hash(lookback,
                    {ids + (span.offset + t) * per_token, static_cast<size_t>(per_token)});
    }
    for (int64_t position = std::max(span.start, span.end() - capacity); position < span.end();
         ++position) {
      history[position % capacity] = compressed_at(position);
    }
  }
}

void ForwardPass::engram_layer(int64_t layer, int64_t engram_index) {
  const EngramParameters& ep = *p_.layers[static_cast<size_t>(layer)].engram;
  const int64_t columns = engram_->columns();
  const int64_t per_token = engram_->layers() * columns;
  const int64_t row_dim = ep.table.size(1);
  int64_t* layer_ids = grow(ws_.engram_layer_ids, n_ * columns);
  for (int64_t t = 0; t < n_; ++t) {
    std::copy_n(ws_.engram_ids.data() + t * per_token + engram_index * columns, columns,
                layer_ids + t * columns);
  }
  float* rows = grow(ws_.engram_rows, n_ * columns * row_dim);
  ops::engram_gather(ep.table, ep.table_scale,
                     TensorView::contiguous(layer_ids, DType::kI64, {n_, columns}),
                     f32(rows, {n_, columns * row_dim}));
  float* kv = grow(ws_.engram_kv, n_ * (hc_ + 1) * dim_);
  const TensorView kv_view = f32(kv, {n_, (hc_ + 1) * dim_});
  ops::linear(f32(rows, {n_, columns * row_dim}), ep.wkv, kv_view, quant_);
  ops::engram_mix(streams(), kv_view.narrow(1, 0, hc_ * dim_), kv_view.narrow(1, hc_ * dim_, dim_),
                  ep.qk, static_cast<float>(c_.rms_norm_eps), streams());
}

// ---- attention --------------------------------------------------------------------------------

void ForwardPass::attention(int64_t layer, const TensorView& x, const TensorView& out) {
  const AttentionParameters& ap = p_.layers[static_cast<size_t>(layer)].attn;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const int64_t heads = c_.num_attention_heads;
  const int64_t head_dim = c_.head_dim;
  const int64_t ratio = c_.compress_ratio(layer);
  const ops::RopeTable& rope = ratio > 0 ? rope_compress_ : rope_main_;
  const std::span<const int32_t> all_positions = positions(0, n_);

  // Low-rank query and the shared K=V latent.
  float* qr = grow(ws_.qr, n_ * c_.q_lora_rank);
  const TensorView qr_view = f32(qr, {n_, c_.q_lora_rank});
  ops::linear(x, ap.wq_a, qr_view, quant_);
  ops::rmsnorm(qr_view, ap.q_norm, eps, qr_view);
  float* q = grow(ws_.q, n_ * heads * head_dim);
  const TensorView q_view = f32(q, {n_, heads, head_dim});
  ops::linear(qr_view, ap.wq_b, f32(q, {n_, heads * head_dim}), quant_);
  ops::rope(q_view, all_positions, rope, false);
  float* kv = grow(ws_.kv, n_ * head_dim);
  const TensorView kv_view = f32(kv, {n_, head_dim});
  ops::linear(x, ap.wkv, kv_view, quant_);
  ops::rmsnorm(kv_view, ap.kv_norm, eps, kv_view);
  ops::rope(kv_view, all_positions, rope, false);
  ops::fake_quant_fp8(kv_view, 32);

  // The compressed branch: the source publishes this call's complete groups into the state;
  // index sources select per query; layers in between reuse both.
  int64_t kv_source = -1;
  if (ratio > 0) {
    kv_source = c_.kv_source_of(layer);
    if (c_.is_kv_source(layer)) compressor(layer, x);
    if (c_.is_index_source(layer)) indexer(layer, x, qr);
  }
  const int64_t index_source = ratio > 0 ? c_.index_source_of(layer) : -1;
  if (index_source >= 0 && index_source < kv_source) {
    DI_THROW("layer ", layer, " reads the compressed KV of source ", kv_source,
             " but the top-k of index source ", index_source,
             ", which scores another source's keys; such schedules are not supported");
  }

  // Attention per request over [window rows] + [selected compressed rows].
  float* attn = grow(ws_.attn_out, n_ * heads * head_dim);
  const int64_t window = c_.sliding_window;
  for (size_t r = 0; r < spans_.size(); ++r) {
    const RequestSpan& span = spans_[r];
    const TensorView& ring = span.state->window(layer);
    const int64_t capacity = span.state->window_capacity();
    const int64_t base = std::max<int64_t>(0, span.start - (window - 1));
    const int64_t rows = span.end() - base;
    float* window_rows = grow(ws_.window_rows, rows * head_dim);
    for (int64_t position = base; position < span.end(); ++position) {
      const float* source = position < span.start
                                ? ring.data<float>() + (position % capacity) * head_dim
                                : kv + (span.offset + position - span.start) * head_dim;
      std::copy_n(source, head_dim, window_rows + (position - base) * head_dim);
    }
    int32_t* ranges = grow(ws_.window_ranges, span.count * 2);
    for (int64_t t = 0; t < span.count; ++t) {
      const int64_t position = span.start + t;
      ranges[2 * t] = static_cast<int32_t>(std::max<int64_t>(0, position - window + 1) - base);
      ranges[2 * t + 1] = static_cast<int32_t>(position + 1 - base);
    }
    TensorView compressed_rows;
    TensorView selected;
    if (index_source >= 0 && ws_.selection_width[r] > 0) {
      const int64_t groups = span.end() / c_.compress_ratio(kv_source);
      compressed_rows = span.state->compressed_kv(kv_source).narrow(0, 0, groups);
      selected = i32(ws_.selection[r].data(), {span.count, ws_.selection_width[r]});
    }
    ops::sink_attention(TensorView::contiguous(q + span.offset * heads * head_dim, DType::kF32,
                                               {span.count, heads, head_dim}),
                        f32(window_rows, {rows, head_dim}), i32(ranges, {span.count, 2}),
                        compressed_rows, selected, ap.attn_sink,
                        1.0f / std::sqrt(static_cast<float>(head_dim)),
                        TensorView::contiguous(attn + span.offset * heads * head_dim, DType::kF32,
                                               {span.count, heads, head_dim}));
  }
  // Only now the new window rows go into the rings (earlier queries of a long chunk needed the
  // rows the ring would have overwritten).
  for (const RequestSpan& span : spans_) {
    const TensorView& ring = span.state->window(layer);
    const int64_t capacity = span.state->window_capacity();
    for (int64_t position = std::max(span.start, span.end() - capacity); position < span.end();
         ++position) {
      std::copy_n(kv + (span.offset + position - span.start) * head_dim, head_dim,
                  ring.data<float>() + (position % capacity) * head_dim);
    }
  }

  // Remove the query's rotation from the output, then the grouped low-rank projection.
  const TensorView attn_view = f32(attn, {n_, heads, head_dim});
  ops::rope(attn_view, all_positions, rope, true);
  const int64_t groups = c_.o_groups;
  const int64_t group_in = heads * head_dim / groups;
  float* grouped = grow(ws_.grouped, n_ * groups * c_.o_lora_rank);
  const TensorView attn_flat = f32(attn, {n_, heads * head_dim});
  const TensorView grouped_view = f32(grouped, {n_, groups * c_.o_lora_rank});
  for (int64_t g = 0; g < groups; ++g) {
    const ops::LinearWeight block{ap.wo_a.weight.narrow(0, g * c_.o_lora_rank, c_.o_lora_rank),
                                  TensorView()};
    ops::linear(attn_flat.narrow(1, g * group_in, group_in), block,
                grouped_view.narrow(1, g * c_.o_lora_rank, c_.o_lora_rank));
  }
  ops::linear(grouped_view, ap.wo_b, out, quant_);
}

void ForwardPass::compressor(int64_t layer, const TensorView& x) {
  const AttentionParameters& ap = p_.layers[static_cast<size_t>(layer)].attn;
  const int64_t head_dim = c_.head_dim;
  const int64_t ratio = c_.compress_ratio(layer);
  const float eps = static_cast<float>(c_.rms_norm_eps);
  float* kv = grow(ws_.comp_kv, n_ * head_dim);
  ops::linear(x, ap.compressor_wkv, f32(kv, {n_, head_dim}));
  if (ratio == 1) {
    // Every token is its own group: a plain projection, normed.
    ops::rmsnorm(f32(kv, {n_, head_dim}), ap.compressor_norm, eps, f32(kv, {n_, head_dim}));
    for (const RequestSpan& span : spans_) {
      publish_compressed(layer, span, kv + span.offset * head_dim, span.count, span.start);
    }
    return;
  }
  float* gate = grow(ws_.comp_gate, n_ * head_dim);
  ops::linear(x, ap.compressor_wgate, f32(gate, {n_, head_dim}));
  for (const RequestSpan& span : spans_) {
    RequestState& state = *span.state;
    const int64_t pending = state.pending_capacity(layer);
    const TensorView& pending_kv = state.pending_kv(layer);
    const TensorView& pending_gate = state.pending_gate(layer);
    const int64_t first_group = span.start / ratio;
    const int64_t groups = span.end() / ratio - first_group;
    if (groups > 0) {
      // The r rows of each completing group: older ones from the pending ring, the rest from
      // this call.
      float* gathered_kv = grow(ws_.gathered_kv, groups * ratio * head_dim);
      float* gathered_gate = grow(ws_.gathered_gate, groups * ratio * head_dim);
      for (int64_t i = 0; i < groups * ratio; ++i) {
        const int64_t position = first_group * ratio + i;
        const bool old = position < span.start;
        const int64_t row = old ? position % pending : span.offset + position - span.start;
        std::copy_n(old ? pending_kv.data<float>() + row * head_dim : kv + row * head_dim, head_dim,
                    gathered_kv + i * head_dim);
        std::copy_n(old ? pending_gate.data<float>() + row * head_dim : gate + row * head_dim,
                    head_dim, gathered_gate + i * head_dim);
      }
      float* latent = grow(ws_.latent, groups * head_dim);
      ops::compress_pool(f32(gathered_kv, {groups * ratio, head_dim}),
                         f32(gathered_gate, {groups * ratio, head_dim}), static_cast<int>(ratio),
                         f32(latent, {groups, head_dim}));
      ops::rmsnorm(f32(latent, {groups, head_dim}), ap.compressor_norm, eps,
                   f32(latent, {groups, head_dim}));
      publish_compressed(layer, span, latent, groups, first_group);
    }
    for (int64_t position = std::max(span.start, span.end() - pending); position < span.end();
         ++position) {
      const int64_t row = span.offset + position - span.start;
      std::copy_n(kv + row * head_dim, head_dim,
                  pending_kv.data<float>() + (position % pending) * head_dim);
      std::copy_n(gate + row * head_dim, head_dim,
                  pending_gate.data<float>() + (position % pending) * head_dim);
    }
  }
}

// Turns pre-RoPE latents of groups [first_group, first_group + groups) into indexer keys (when
// the source runs an indexer) and compressed KV entries, both in the request's state.
void ForwardPass::publish_compressed(int64_t layer, const RequestSpan& span, float* latent,
                                     int64_t groups, int64_t first_group) {
  if (groups == 0) return;
  const AttentionParameters& ap = p_.layers[static_cast<size_t>(layer)].attn;
  const int64_t head_dim = c_.head_dim;
  const int64_t ratio = c_.compress_ratio(layer);
  RequestState& state = *span.state;
  if (first_group + groups > state.max_groups(layer)) {
    DI_THROW("compressed cache of layer ", layer, " is full (", state.max_groups(layer),
             " groups)");
  }
  // A latent stands for its group's first token.
  int32_t* group_positions = grow(ws_.group_positions, groups);
  for (int64_t i = 0; i < groups; ++i) {
    group_positions[i] = static_cast<int32_t>((first_group + i) * ratio);
  }
  const std::span<const int32_t> gp(group_positions, static_cast<size_t>(groups));
  if (c_.is_index_source(layer)) {
    const int64_t index_dim = c_.index_head_dim;
    float* keys = state.index_keys(layer).data<float>() + first_group * index_dim;
    // Uses a private copy so the latent stays pre-RoPE for the KV entry below.
    float* latent_copy = grow(ws_.keys, groups * head_dim);
    std::copy_n(latent, groups * head_dim, latent_copy);
    const TensorView key_view = f32(keys, {groups, index_dim});
    ops::linear(f32(latent_copy, {groups, head_dim}), ap.indexer_wk, key_view);
    ops::rmsnorm(key_view, ap.indexer_k_norm, static_cast<float>(c_.rms_norm_eps), key_view);
    ops::rope(key_view, gp, rope_compress_, false);
    ops::fake_quant_fp4(key_view, 32, ops::Fp4ScaleFormat::kUe8m0);
  }
  float* entries = state.compressed_kv(layer).data<float>() + first_group * head_dim;
  std::copy_n(latent, groups * head_dim, entries);
  const TensorView entry_view = f32(entries, {groups, head_dim});
  ops::rope(entry_view, gp, rope_compress_, false);
  ops::fake_quant_fp4(entry_view, 16, ops::Fp4ScaleFormat::kE4m3);
}

void ForwardPass::indexer(int64_t layer, const TensorView& x, const float* qr) {
  const AttentionParameters& ap = p_.layers[static_cast<size_t>(layer)].attn;
  const int64_t heads = c_.index_n_heads;
  const int64_t index_dim = c_.index_head_dim;
  const int64_t ratio = c_.compress_ratio(layer);
  const int64_t kv_source = c_.kv_source_of(layer);
  if (!c_.is_index_source(kv_source)) {
    DI_THROW("index source ", layer, " reads the keys of KV source ", kv_source,
             ", which runs no indexer and so has no keys; such schedules are not supported");
  }
  float* q = grow(ws_.index_q, n_ * heads * index_dim);
  const TensorView q_view = f32(q, {n_, heads, index_dim});
  ops::linear(f32(const_cast<float*>(qr), {n_, c_.q_lora_rank}), ap.indexer_wq_b,
              f32(q, {n_, heads * index_dim}), quant_);
  ops::rope(q_view, positions(0, n_), rope_compress_, false);
  ops::fake_quant_fp4(q_view, 32, ops::Fp4ScaleFormat::kUe8m0);
  float* w = grow(ws_.index_w, n_ * heads);
  const TensorView w_view = f32(w, {n_, heads});
  ops::linear(x, ap.indexer_weights_proj, w_view);
  const float heads_scale = 1.0f / std::sqrt(static_cast<float>(heads));
  for (int64_t i = 0; i < n_ * heads; ++i) w[i] *= heads_scale;

  const bool candidate_source = c_.is_candidate_source(layer);
  const bool uses_candidates = c_.uses_candidates(layer);
  for (size_t r = 0; r < spans_.size(); ++r) {
    const RequestSpan& span = spans_[r];
    const int64_t entries = span.end() / c_.compress_ratio(kv_source);
    ws_.selection_width[r] = 0;
    if (entries == 0) continue;
    int32_t* visible = grow(ws_.visible, span.count);
    for (int64_t t = 0; t < span.count; ++t) {
      visible[t] = static_cast<int32_t>((span.start + t + 1) / ratio);
    }
    float* scores = grow(ws_.scores, span.count * entries);
    const TensorView scores_view = f32(scores, {span.count, entries});
    ops::indexer_scores(TensorView::contiguous(q + span.offset * heads * index_dim, DType::kF32,
                                               {span.count, heads, index_dim}),
                        span.state->index_keys(kv_source).narrow(0, 0, entries),
                        f32(w + span.offset * heads, {span.count, heads}),
                        i32(visible, {span.count}), 1.0f / std::sqrt(static_cast<float>(index_dim)),
                        scores_view);
    if (candidate_source) {
      std::vector<int8_t>& mask = ws_.candidates[r];
      mask.resize(static_cast<size_t>(span.count * entries));
      ops::candidate_blocks(scores_view, i32(visible, {span.count}),
                            static_cast<int>(c_.candidate_topk_blocks),
                            static_cast<int>(c_.candidate_block_size),
                            TensorView::contiguous(mask.data(), DType::kI8, {span.count, entries}));
      ws_.candidates_width[r] = entries;
    } else if (uses_candidates && ws_.candidates_width[r] > 0) {
      if (ws_.candidates_width[r] != entries) {
        DI_THROW("index source ", layer, " scores ", entries,
                 " entries but the candidate mask covers ", ws_.candidates_width[r]);
      }
      ops::mask_scores(scores_view, TensorView::contiguous(ws_.candidates[r].data(), DType::kI8,
                                                           {span.count, entries}));
    }
    const int64_t k = std::min<int64_t>(c_.index_topk, entries);
    std::vector<int32_t>& selection = ws_.selection[r];
    selection.resize(static_cast<size_t>(span.count * k));
    ops::topk_indices(scores_view, static_cast<int>(k), i32(selection.data(), {span.count, k}));
    ws_.selection_width[r] = k;
  }
}

// ---- MoE --------------------------------------------------------------------------------------

void ForwardPass::moe(int64_t layer, const TensorView& x, const TensorView& out) {
  const LayerParameters& lp = p_.layers[static_cast<size_t>(layer)];
  const int64_t k = c_.num_experts_per_tok;
  const int64_t experts = c_.n_routed_experts;
  const int64_t inter = c_.moe_intermediate_size;
  const float limit = static_cast<float>(c_.swiglu_limit);
  float* weights = grow(ws_.route_weights, n_ * k);
  int32_t* chosen = grow(ws_.route_experts, n_ * k);
  const ops::RouterParams router{score_function(c_.scoring_func), static_cast<float>(c_.gate_temp),
                                 static_cast<int>(k), c_.norm_topk_prob,
                                 static_cast<float>(c_.routed_scaling_factor)};
  ops::route(x, lp.gate_weight, lp.gate_bias, router, f32(weights, {n_, k}), i32(chosen, {n_, k}));

  // Each expert runs once on the rows routed to it (row results do not depend on the group).
  float* expert_out = grow(ws_.moe_out, n_ * k * dim_);  // per (token, slot)
  float* rows = grow(ws_.moe_rows, n_ * dim_);
  float* gate = grow(ws_.moe_gate, n_ * inter);
  float* up = grow(ws_.moe_up, n_ * inter);
  std::vector<int64_t> members;  // token * k + slot, ascending tokens
  std::vector<float> member_weights;
  for (int64_t e = 0; e < experts; ++e) {
    members.clear();
    member_weights.clear();
    for (int64_t i = 0; i < n_ * k; ++i) {
      if (chosen[i] == e) {
        members.push_back(i);
        member_weights.push_back(weights[i]);
      }
    }
    if (members.empty()) continue;
    const int64_t m = static_cast<int64_t>(members.size());
    for (int64_t j = 0; j < m; ++j) {
      std::copy_n(x.data<float>() + (members[static_cast<size_t>(j)] / k) * x.stride(0), dim_,
                  rows + j * dim_);
    }
    const ExpertParameters& ex = lp.experts[static_cast<size_t>(e)];
    ops::linear(f32(rows, {m, dim_}), ex.w1, f32(gate, {m, inter}), quant_);
    ops::linear(f32(rows, {m, dim_}), ex.w3, f32(up, {m, inter}), quant_);
    ops::swiglu(f32(gate, {m, inter}), f32(up, {m, inter}), limit, f32(member_weights.data(), {m}),
                f32(gate, {m, inter}));
    float* result = grow(ws_.shared_out, m * dim_);
    ops::linear(f32(gate, {m, inter}), ex.w2, f32(result, {m, dim_}), quant_);
    for (int64_t j = 0; j < m; ++j) {
      std::copy_n(result + j * dim_, dim_, expert_out + members[static_cast<size_t>(j)] * dim_);
    }
  }
  // The shared expert on every token.
  ops::linear(x, lp.shared_expert.w1, f32(gate, {n_, inter}), quant_);
  ops::linear(x, lp.shared_expert.w3, f32(up, {n_, inter}), quant_);
  ops::swiglu(f32(gate, {n_, inter}), f32(up, {n_, inter}), limit, TensorView(),
              f32(gate, {n_, inter}));
  float* shared = grow(ws_.shared_out, n_ * dim_);
  ops::linear(f32(gate, {n_, inter}), lp.shared_expert.w2, f32(shared, {n_, dim_}), quant_);
  // Combine in HF's order: routed experts by ascending expert id, then the shared expert.
  float* y = out.data<float>();
  for (int64_t t = 0; t < n_; ++t) {
    int64_t order[64];
    DI_CHECK(k <= 64, "num_experts_per_tok ", k, " too large");
    for (int64_t s = 0; s < k; ++s) order[s] = s;
    std::sort(order, order + k,
              [&](int64_t a, int64_t b) { return chosen[t * k + a] < chosen[t * k + b]; });
    float* row = y + t * out.stride(0);
    std::fill_n(row, dim_, 0.0f);
    for (int64_t s = 0; s < k; ++s) {
      const float* contribution = expert_out + (t * k + order[s]) * dim_;
      for (int64_t d = 0; d < dim_; ++d) row[d] += contribution[d];
    }
    for (int64_t d = 0; d < dim_; ++d) row[d] += shared[t * dim_ + d];
  }
}

}  // namespace

Model::Model(const DeepseekV41TextConfig& config, const ModelParameters& parameters,
             Numerics numerics, std::shared_ptr<const EngramHasher> engram)
    : config_(config),
      parameters_(parameters),
      numerics_(numerics),
      engram_(std::move(engram)),
      rope_main_(rope_table_for(config.rope_main, config)),
      rope_compress_(rope_table_for(config.rope_compress, config)),
      workspace_(std::make_unique<ForwardWorkspace>()) {
  if (!config.engram_layer_ids.empty() && engram_ == nullptr) {
    DI_THROW("the config has engram layers ", config.engram_layer_ids.size(),
             " but no engram hasher (token map) was given");
  }
  if (static_cast<int64_t>(parameters.layers.size()) != config.num_hidden_layers) {
    DI_THROW("parameters hold ", parameters.layers.size(), " layers, the config ",
             config.num_hidden_layers);
  }
  score_function(config.scoring_func);  // validate early
  if (config.n_shared_experts != 1) {
    DI_THROW("n_shared_experts ", config.n_shared_experts, " is not supported (exactly 1)");
  }
}

Model::~Model() = default;

void Model::forward(std::span<const ForwardRequest> requests, const TensorView& logits) {
  ForwardWorkspace& ws = *workspace_;
  std::vector<RequestSpan> spans;
  int64_t tokens = 0;
  for (const ForwardRequest& request : requests) {
    DI_CHECK(request.state != nullptr, "forward request without a state");
    if (request.tokens.empty()) continue;
    RequestSpan span;
    span.state = request.state;
    span.offset = tokens;
    span.count = static_cast<int64_t>(request.tokens.size());
    span.start = request.state->length();
    if (span.end() > request.state->limits().max_tokens) {
      DI_THROW("request ", spans.size(), " would reach ", span.end(),
               " tokens, beyond its state's max_tokens ", request.state->limits().max_tokens);
    }
    for (const RequestSpan& other : spans) {
      if (other.state == span.state) DI_THROW("two requests of one forward share a state");
    }
    for (size_t i = 0; i < request.tokens.size(); ++i) {
      if (request.tokens[i] < 0 || request.tokens[i] >= config_.vocab_size) {
        DI_THROW("request ", spans.size(), " token ", i, " has id ", request.tokens[i],
                 " outside the vocabulary [0, ", config_.vocab_size, ")");
      }
    }
    tokens += span.count;
    spans.push_back(span);
  }
  if (logits.rank() != 2 || logits.size(0) != tokens || logits.size(1) != config_.vocab_size) {
    DI_THROW("logits output must be [", tokens, ", ", config_.vocab_size, "], got ",
             logits.to_string());
  }
  if (tokens == 0) return;
  ws.positions.resize(static_cast<size_t>(tokens));
  ws.ids.resize(static_cast<size_t>(tokens));
  size_t request_index = 0;
  for (const ForwardRequest& request : requests) {
    if (request.tokens.empty()) continue;
    const RequestSpan& span = spans[request_index++];
    for (int64_t t = 0; t < span.count; ++t) {
      ws.positions[static_cast<size_t>(span.offset + t)] = static_cast<int32_t>(span.start + t);
      ws.ids[static_cast<size_t>(span.offset + t)] = request.tokens[static_cast<size_t>(t)];
    }
  }
  ws.selection.resize(spans.size());
  ws.selection_width.assign(spans.size(), 0);
  ws.candidates.resize(spans.size());
  ws.candidates_width.assign(spans.size(), 0);

  ForwardPass pass(config_, parameters_, numerics_, engram_.get(), rope_main_, rope_compress_, ws,
                   spans, tokens, observer_);
  pass.run(logits);
  for (const RequestSpan& span : spans) span.state->advance(span.count);
}

}  // namespace deepinfer::deepseek_v41
