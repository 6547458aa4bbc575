// The forward pass (docs/MODEL.md has the math with its sources; "State layout and forward"
// there describes the data flow implemented here).
//
// Shape of one call: N tokens from R requests, token-major. Everything per token (projections,
// norms, mHC, MoE) runs over all N rows at once, and so do the attention (each token reads its
// own request's window ring and compressed rows through a per-request table) and the indexer's
// scores (each token against its own request's keys); what else reads a request's history
// (compressor groups, engram n-grams) runs per request on its rows.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "model/deepseek_v41/model.h"
#include "ops/concurrent_branch.h"

namespace deepinfer::deepseek_v41 {

namespace {

// One grow-only scratch buffer on the model's device: after the largest step has been seen,
// taking a view allocates nothing.
class Scratch {
 public:
  TensorView take(Allocator& allocator, DType dtype, Shape shape) {
    int64_t count = 1;
    for (int64_t size : shape.span()) count *= size;
    const size_t bytes = std::max<size_t>(dtype_storage_bytes(dtype, count), 1);
    if (bytes > capacity_) {
      storage_ = Tensor::empty(DType::kI8, {static_cast<int64_t>(bytes)}, allocator);
      capacity_ = bytes;
    }
    return TensorView::contiguous(storage_.view().raw_data(), dtype, shape, allocator.device());
  }
  size_t capacity() const { return capacity_; }

 private:
  Tensor storage_;
  size_t capacity_ = 0;
};

}  // namespace

// The forward's scratch, on the model's device, plus the host side of the step's metadata.
struct ForwardWorkspace {
  Scratch streams, collapsed, sublayer_out;
  Scratch pre, post, comb, next_pre;
  Scratch qr, q, kv, attn_out, grouped;
  Scratch comp_kv, comp_gate, gathered_kv, gathered_gate, latent, comp_keys, comp_entries;
  Scratch index_q, index_w, scores;
  Scratch moe_gate, moe_up, shared_out, route_weights, route_experts;
  Scratch engram_rows, engram_kv;
  Scratch head_rows, logits;
  // The step's metadata (engram ids, positions, visible counts), built on the host in
  // `staging` and uploaded once per step into `metadata` (on the host it is used in place).
  std::vector<int64_t> staging;
  Scratch metadata;
  std::vector<int32_t> positions, ids;
  // The latest index source's selection [N, k] and the candidate source's mask [N, entries],
  // for all rows of the step (the mask empty until a candidate source ran this step); per
  // request, views of its selection rows (empty while it has no compressed entries).
  Scratch selection, candidates;
  TensorView candidate_mask;
  std::vector<TensorView> selection_view;
  // Per request, refilled per layer: what the batched attention reads and writes.
  std::vector<ops::AttentionRequest> attention_requests;
  // Per request, refilled per index layer: its rows and keys for indexer_scores_batch.
  std::vector<ops::IndexerRequest> indexer_requests;
  std::vector<ops::IndexerKeyWrite> key_writes;
  // Per request, refilled per compressor layer: its pending rings for write_window_rings.
  std::vector<ops::AttentionRequest> pending_ring_writes;
  // Per request, per compressor layer: its completing groups' rows of the step's latents, and
  // the same rows aimed at its compressed caches (write_window_rings scatters them).
  std::vector<ops::AttentionRequest> completing_groups, cache_writes;
  // Recorded segments of small steps (Model::set_cuda_graphs), by (segment, tokens): the first
  // sighting runs eagerly (one-time setup calls, scratch growth), the second records. They hold
  // the addresses of the scratch above: `generation` counts moves of a scratch the segments
  // use, and the segments recorded under another generation are dropped.
  struct RecordedSegment {
    int sightings = 0;
    std::unique_ptr<ops::RecordedOps> ops;
  };
  std::map<std::pair<int64_t, int64_t>, RecordedSegment> segments;
  // The token counts that have segments, most recently used first: at most
  // kMaxRecordedTokenCounts of them keep recordings, so their graph memory stays bounded while
  // an engine's batch size wanders.
  std::vector<int64_t> recorded_token_counts;
  uint64_t generation = 0;
  uint64_t segments_generation = 0;
};

namespace {

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

// false: steps never record CUDA graphs, whatever DEEPINFER_CUDA_GRAPHS or set_cuda_graphs say.
constexpr bool kCudaGraphs = true;

// On by default (measured on the H200: docs/CUDA.md, "CUDA graphs for decode");
// DEEPINFER_CUDA_GRAPHS=0 turns them off. Any other value than 0 or 1 is an error, not a guess.
bool graphs_requested_by_environment() {
  const char* setting = std::getenv("DEEPINFER_CUDA_GRAPHS");
  if (setting == nullptr || *setting == '\0') return true;
  const std::string_view value(setting);
  if (value == "1") return true;
  if (value == "0") return false;
  DI_THROW("DEEPINFER_CUDA_GRAPHS='", value, "' is not valid (0 or 1)");
}

ops::ScoreFunction score_function(const std::string& name) {
  if (name == "softmax") return ops::ScoreFunction::kSoftmax;
  if (name == "sigmoid") return ops::ScoreFunction::kSigmoid;
  if (name == "sqrtsoftplus") return ops::ScoreFunction::kSqrtSoftplus;
  DI_THROW("scoring_func '", name, "' is not supported (softmax, sigmoid or sqrtsoftplus)");
}

// false: the indexer scores every request with its own indexer_scores call (after a -inf fill
// of the step's score matrix when the requests' entry counts differ), the path before
// indexer_scores_batch scored all of them in one call.
constexpr bool kBatchedIndexerScores = true;

// Steps of at most this many tokens record their repeating segments as CUDA graphs when the
// model's graphs are on (decode; a prefill's launches are not what bounds it):
// Model::set_cuda_graph_max_tokens, else DEEPINFER_CUDA_GRAPH_MAX_TOKENS, else the default.
// 256: the H200's b256 decode step of the 7-layer bench model took 22.54 ms recorded against
// 23.11 eager at 4k context (docs/BENCHMARKS.md, 2026-12-03 13:41 call), for 134 MB of graph
// memory a recorded token count.
constexpr int64_t kDefaultMaxRecordedTokens = 256;
int64_t max_recorded_tokens_from_environment() {
  const char* setting = std::getenv("DEEPINFER_CUDA_GRAPH_MAX_TOKENS");
  if (setting == nullptr || *setting == '\0') return kDefaultMaxRecordedTokens;
  const std::string_view text(setting);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 1 ||
      value > Model::kLargestCudaGraphMaxTokens) {
    DI_THROW("DEEPINFER_CUDA_GRAPH_MAX_TOKENS='", text, "' is not valid (a token count, 1 to ",
             Model::kLargestCudaGraphMaxTokens, ")");
  }
  return value;
}

// Token counts whose recorded segments are kept; recording one more drops the least recently
// used count's segments. Each recording holds the graph memory of its segment's scratch (a few
// MB at 64 tokens, 134 MB at 256 on the V4.1-width bench model), so this bounds it.
constexpr size_t kMaxRecordedTokenCounts = 8;

struct RequestSpan {
  RequestState* state = nullptr;
  int64_t offset = 0;  // first row in the batch
  int64_t count = 0;   // new tokens
  int64_t start = 0;   // position of the first new token (= state length before the call)
  int64_t end() const { return start + count; }
};

// dst [count, D] = the ring rows of positions [first, first + count).
void read_ring(const TensorView& ring, int64_t first, const TensorView& dst) {
  ops::for_each_ring_run(ring.size(0), first, dst.size(0),
                         [&](int64_t slot, int64_t row, int64_t n) {
                           ops::copy(ring.narrow(0, slot, n), dst.narrow(0, row, n));
                         });
}

// The ring rows of positions [first, first + count) = src [count, D].
void write_ring(const TensorView& src, const TensorView& ring, int64_t first) {
  ops::for_each_ring_run(ring.size(0), first, src.size(0),
                         [&](int64_t slot, int64_t row, int64_t n) {
                           ops::copy(src.narrow(0, row, n), ring.narrow(0, slot, n));
                         });
}

// One forward call: the batch layout plus the layer-by-layer computation.
class ForwardPass {
 public:
  ForwardPass(const DeepseekV41TextConfig& config, const ModelParameters& parameters,
              const std::vector<std::vector<ops::ExpertWeights>>& expert_weights, Numerics numerics,
              const EngramHasher* engram, const ops::RopeTable& rope_main,
              const ops::RopeTable& rope_compress, ForwardWorkspace& ws,
              std::vector<RequestSpan> spans, int64_t tokens, const Model::LayerObserver& observer,
              int64_t max_recorded_tokens)
      : c_(config),
        p_(parameters),
        expert_weights_(expert_weights),
        engram_(engram),
        rope_main_(rope_main),
        rope_compress_(rope_compress),
        ws_(ws),
        allocator_(ops::allocator_for(parameters.embed.device())),
        spans_(std::move(spans)),
        n_(tokens),
        dim_(config.hidden_size),
        hc_(config.hc_mult),
        quant_(numerics == Numerics::kReleased ? ops::ActivationQuant::kFp8PerBlock32
                                               : ops::ActivationQuant::kNone),
        observer_(observer),
        recorder_(tokens <= max_recorded_tokens ? ops::op_recorder(parameters.embed.device())
                                                : nullptr) {}

  // `logit_rows` null: logits of every token row; else only of those rows, in that order.
  void run(const TensorView& logits, std::span<const int32_t> const* logit_rows);

 private:
  TensorView take(Scratch& scratch, DType dtype, Shape shape) {
    const size_t capacity = scratch.capacity();
    TensorView view = scratch.take(allocator_, dtype, shape);
    if (scratch.capacity() != capacity && !eager_only(scratch)) ++ws_.generation;
    return view;
  }
  // Scratch that only the ops between recorded segments use: its moves keep the recordings.
  // (The indexer's scores grow every `ratio` tokens of context.)
  bool eager_only(const Scratch& scratch) const {
    for (const Scratch* eager :
         {&ws_.gathered_kv, &ws_.gathered_gate, &ws_.latent, &ws_.comp_keys, &ws_.comp_entries,
          &ws_.scores, &ws_.selection, &ws_.candidates, &ws_.head_rows, &ws_.logits}) {
      if (&scratch == eager) return true;
    }
    return false;
  }
  // Runs `body` as recorded segment `id` of this step's token count when the step records, else
  // eagerly. The body may only queue ops whose kernels and arguments are functions of the token
  // count (the scratch it takes has sizes fixed by it; per-step values come from the metadata).
  template <typename Body>
  void segment(int64_t id, Body&& body);
  TensorView f32(Scratch& scratch, Shape shape) { return take(scratch, DType::kF32, shape); }
  void prepare_metadata();
  void engram_hashes(int64_t* ids);
  void engram_layer(int64_t layer, int64_t engram_index);
  // The attention in three parts: the projections of q and the K=V row (recordable), the
  // compressed branch, the batched attention and the ring writes (host tables per step: eager),
  // the output projections (recordable).
  void attention_projections(int64_t layer, const TensorView& x);
  void compressed_projections(int64_t layer, const TensorView& x);
  void attention_core(int64_t layer);
  void attention_output(int64_t layer, const TensorView& out);
  void compressor(int64_t layer);
  // Per request with completing groups: its rows [offset, offset + count) of the step's
  // latents are its groups [start, start + count).
  void publish_compressed(int64_t layer, const TensorView& latents,
                          const TensorView& group_positions,
                          std::span<const ops::AttentionRequest> groups);
  void indexer(int64_t layer);
  void moe(int64_t layer, const TensorView& x, const TensorView& out);

  const DeepseekV41TextConfig& c_;
  const ModelParameters& p_;
  const std::vector<std::vector<ops::ExpertWeights>>& expert_weights_;
  const EngramHasher* engram_;
  const ops::RopeTable& rope_main_;
  const ops::RopeTable& rope_compress_;
  ForwardWorkspace& ws_;
  Allocator& allocator_;
  std::vector<RequestSpan> spans_;
  const int64_t n_;
  const int64_t dim_;
  const int64_t hc_;
  const ops::ActivationQuant quant_;
  const Model::LayerObserver& observer_;
  // Non-null when this step records its repeating segments (docs/CUDA.md, "CUDA graphs for
  // decode").
  ops::OpRecorder* const recorder_;
  // Views of the uploaded metadata.
  TensorView token_ids_;                                 // i32 [N, 1], when recording
  TensorView engram_ids_;                                // i64 [engram layers, N, columns]
  TensorView positions_;                                 // i32 [N]
  std::vector<std::pair<int64_t, TensorView>> visible_;  // per index-source ratio: i32 [N]
  // Per KV-source ratio > 1: the positions of the groups each request completes in this call
  // (a group's latent stands for its first token), request after request, and each request's
  // first entry.
  struct GroupPositions {
    int64_t ratio = 0;
    TensorView positions;
    std::vector<int64_t> offsets;
  };
  std::vector<GroupPositions> group_positions_;
  TensorView streams_;  // [N, hc, D]
};

// Builds every index the step's ops read on the device, once, and uploads it in one copy.
void ForwardPass::prepare_metadata() {
  const int64_t engram_words = engram_ != nullptr ? engram_->layers() * n_ * engram_->columns() : 0;
  std::vector<int64_t> ratios;  // of index sources
  group_positions_.clear();
  for (int64_t layer = 0; layer < c_.num_hidden_layers; ++layer) {
    const int64_t ratio = c_.compress_ratio(layer);
    if (ratio > 0 && c_.is_index_source(layer) &&
        std::find(ratios.begin(), ratios.end(), ratio) == ratios.end()) {
      ratios.push_back(ratio);
    }
    if (ratio > 1 && c_.is_kv_source(layer) &&
        std::none_of(group_positions_.begin(), group_positions_.end(),
                     [&](const GroupPositions& g) { return g.ratio == ratio; })) {
      GroupPositions groups;
      groups.ratio = ratio;
      int64_t total = 0;
      for (const RequestSpan& span : spans_) {
        groups.offsets.push_back(total);
        total += span.end() / ratio - span.start / ratio;
      }
      groups.offsets.push_back(total);
      group_positions_.push_back(std::move(groups));
    }
  }
  // i32 layout: positions [N], visible [N] per index ratio, the token ids [N] when the step
  // records (its embedding gathers rows by device ids: ops::embedding uploads its own), then the
  // group positions of each KV ratio. Everything the recorded segments read lies before the
  // group positions, whose length changes from step to step.
  int64_t i32_count = n_ + n_ * static_cast<int64_t>(ratios.size());
  const int64_t ids_start = i32_count;
  if (recorder_ != nullptr) i32_count += n_;
  std::vector<int64_t> group_starts;
  for (const GroupPositions& groups : group_positions_) {
    group_starts.push_back(i32_count);
    i32_count += groups.offsets.back();
  }
  const int64_t words = engram_words + (i32_count + 1) / 2;
  if (ws_.staging.size() < static_cast<size_t>(words))
    ws_.staging.resize(static_cast<size_t>(words));
  int64_t* host_ids = ws_.staging.data();
  auto* host_i32 = reinterpret_cast<int32_t*>(ws_.staging.data() + engram_words);
  if (engram_ != nullptr) engram_hashes(host_ids);
  std::copy_n(ws_.positions.data(), n_, host_i32);
  for (size_t i = 0; i < ratios.size(); ++i) {
    int32_t* visible = host_i32 + n_ + n_ * static_cast<int64_t>(i);
    for (int64_t t = 0; t < n_; ++t) {
      visible[t] = static_cast<int32_t>((ws_.positions[static_cast<size_t>(t)] + 1) / ratios[i]);
    }
  }
  for (size_t g = 0; g < group_positions_.size(); ++g) {
    const int64_t ratio = group_positions_[g].ratio;
    int32_t* out = host_i32 + group_starts[g];
    for (const RequestSpan& span : spans_) {
      for (int64_t group = span.start / ratio; group < span.end() / ratio; ++group) {
        *out++ = static_cast<int32_t>(group * ratio);
      }
    }
  }
  if (recorder_ != nullptr) std::copy_n(ws_.ids.data(), n_, host_i32 + ids_start);

  const TensorView staged = TensorView::contiguous(ws_.staging.data(), DType::kI64, {words});
  TensorView uploaded = staged;
  if (allocator_.device().is_cuda()) {
    // A step completes at most one group per token and KV ratio: sized for that, the metadata
    // (which recorded segments read) does not move between steps of one token count.
    const int64_t most_i32 = ids_start + n_ + n_ * static_cast<int64_t>(group_positions_.size());
    const int64_t most_words = recorder_ == nullptr ? words : engram_words + (most_i32 + 1) / 2;
    uploaded = take(ws_.metadata, DType::kI64, {std::max(words, most_words)}).narrow(0, 0, words);
    ops::copy(staged, uploaded);
  }
  auto* base_i64 = static_cast<int64_t*>(uploaded.raw_data());
  auto* base_i32 = reinterpret_cast<int32_t*>(base_i64 + engram_words);
  const Device device = uploaded.device();
  if (engram_ != nullptr) {
    engram_ids_ = TensorView::contiguous(base_i64, DType::kI64,
                                         {engram_->layers(), n_, engram_->columns()}, device);
  }
  positions_ = TensorView::contiguous(base_i32, DType::kI32, {n_}, device);
  visible_.clear();
  for (size_t i = 0; i < ratios.size(); ++i) {
    visible_.emplace_back(
        ratios[i], TensorView::contiguous(base_i32 + n_ + n_ * static_cast<int64_t>(i), DType::kI32,
                                          {n_}, device));
  }
  for (size_t g = 0; g < group_positions_.size(); ++g) {
    group_positions_[g].positions = TensorView::contiguous(
        base_i32 + group_starts[g], DType::kI32, {group_positions_[g].offsets.back()}, device);
  }
  if (recorder_ != nullptr) {
    token_ids_ = TensorView::contiguous(base_i32 + ids_start, DType::kI32, {n_, 1}, device);
  }
}

template <typename Body>
void ForwardPass::segment(int64_t id, Body&& body) {
  if (recorder_ == nullptr) {
    body();
    return;
  }
  if (ws_.segments_generation != ws_.generation) {
    ws_.segments.clear();
    ws_.recorded_token_counts.clear();
    ws_.segments_generation = ws_.generation;
  }
  std::vector<int64_t>& counts = ws_.recorded_token_counts;
  if (counts.empty() || counts.front() != n_) {
    const auto seen = std::find(counts.begin(), counts.end(), n_);
    if (seen != counts.end()) {
      std::rotate(counts.begin(), seen, seen + 1);
    } else {
      if (counts.size() == kMaxRecordedTokenCounts) {
        const int64_t evicted = counts.back();
        counts.pop_back();
        std::erase_if(ws_.segments,
                      [evicted](const auto& kv) { return kv.first.second == evicted; });
      }
      counts.insert(counts.begin(), n_);
    }
  }
  ForwardWorkspace::RecordedSegment& entry = ws_.segments[{id, n_}];
  if (entry.ops) {
    entry.ops->replay();
    return;
  }
  if (entry.sightings++ == 0) {
    body();
    return;
  }
  const uint64_t generation = ws_.generation;
  recorder_->begin();
  try {
    body();
  } catch (...) {
    recorder_->abandon();
    throw;
  }
  std::unique_ptr<ops::RecordedOps> recorded = recorder_->end();
  // Recording runs nothing: the segment's work is the replay. Its scratch was sized by the
  // eager first sighting of the same token count, so nothing may have moved while recording.
  DI_CHECK(ws_.generation == generation, "a scratch buffer moved while segment ", id,
           " was recorded");
  recorded->replay();
  entry.ops = std::move(recorded);
}

void ForwardPass::run(const TensorView& logits, std::span<const int32_t> const* logit_rows) {
  const float eps = static_cast<float>(c_.rms_norm_eps);
  // The whole step (metadata upload included) on a stream that can be recorded.
  struct StepScope {
    ops::OpRecorder* recorder;
    explicit StepScope(ops::OpRecorder* r) : recorder(r) {
      if (recorder != nullptr) recorder->begin_step();
    }
    ~StepScope() {
      if (recorder != nullptr) recorder->end_step();
    }
    StepScope(const StepScope&) = delete;
    StepScope& operator=(const StepScope&) = delete;
  } step_scope(recorder_);
  prepare_metadata();
  // Embedding, replicated into hc identical streams; the first pre mix is one-hot on stream 0.
  const TensorView x_view = f32(ws_.collapsed, {n_, dim_});
  streams_ = f32(ws_.streams, {n_, hc_, dim_});
  const TensorView pre_mix_view = f32(ws_.next_pre, {n_, hc_});
  // Recorded with layer 0's first segment: one graph launch fewer at the start of a step, where
  // the GPU waits on the host's launches.
  const auto embed = [&] {
    if (recorder_ != nullptr) {
      // The same rows as ops::embedding (an exact copy of each f32 / bf16 row), from device ids.
      ops::engram_gather(p_.embed, TensorView(), token_ids_, x_view);
    } else {
      ops::embedding(p_.embed, {ws_.ids.data(), static_cast<size_t>(n_)}, x_view);
    }
    for (int64_t k = 0; k < hc_; ++k) ops::copy(x_view, streams_.select(1, k));
    ops::fill(pre_mix_view, 0.0f);
    ops::fill(pre_mix_view.narrow(1, 0, 1), 1.0f);
  };
  if (c_.num_hidden_layers == 0) segment(0, embed);

  const ops::HcParams hc_params{static_cast<int>(hc_), static_cast<int>(c_.hc_sinkhorn_iters),
                                static_cast<float>(c_.hc_eps), eps};
  const TensorView streams_flat = streams_.view({n_, hc_ * dim_});
  const TensorView pre_view = f32(ws_.pre, {n_, hc_});
  const TensorView post_view = f32(ws_.post, {n_, hc_});
  const TensorView comb_view = f32(ws_.comb, {n_, hc_, hc_});
  const TensorView y_view = f32(ws_.sublayer_out, {n_, dim_});

  for (int64_t layer = 0; layer < c_.num_hidden_layers; ++layer) {
    const LayerParameters& lp = p_.layers[static_cast<size_t>(layer)];
    const int64_t engram_index = c_.engram_index(layer);
    segment(1 + 2 * layer, [&] {
      if (layer == 0) embed();
      if (engram_index >= 0) engram_layer(layer, engram_index);
      // Attention site: mixes from the streams; input collapsed with the previous site's pre.
      ops::hc_mixes(streams_flat, lp.hc_attn_fn, lp.hc_attn_scale, lp.hc_attn_base, hc_params,
                    pre_view, post_view, comb_view);
      ops::hc_collapse(streams_, pre_mix_view, x_view);
      ops::rmsnorm(x_view, lp.attn_norm, eps, x_view);
      attention_projections(layer, x_view);
    });
    attention_core(layer);
    segment(2 + 2 * layer, [&] {
      attention_output(layer, y_view);
      ops::hc_expand(y_view, streams_, post_view, comb_view, streams_);
      // This site's pre mix feeds the FFN site.
      ops::copy(pre_view, pre_mix_view);

      ops::hc_mixes(streams_flat, lp.hc_ffn_fn, lp.hc_ffn_scale, lp.hc_ffn_base, hc_params,
                    pre_view, post_view, comb_view);
      ops::hc_collapse(streams_, pre_mix_view, x_view);
      ops::rmsnorm(x_view, lp.ffn_norm, eps, x_view);
      moe(layer, x_view, y_view);
      ops::hc_expand(y_view, streams_, post_view, comb_view, streams_);
      ops::copy(pre_view, pre_mix_view);
    });
    if (observer_) observer_(layer, streams_);
  }
  // Final collapse with the last site's pre mix, norm, head.
  ops::hc_collapse(streams_, pre_mix_view, x_view);
  ops::rmsnorm(x_view, p_.norm, eps, x_view);
  // The LM head is the widest GEMM of a step (vocab x hidden): a prefill that samples one row
  // per request computes only those rows. A row's logits do not depend on the other rows (the
  // head is one linear, batch invariant), so selected rows equal the full result's bit for bit.
  TensorView head_input = x_view;
  if (logit_rows != nullptr) {
    head_input = f32(ws_.head_rows, {static_cast<int64_t>(logit_rows->size()), dim_});
    if (head_input.size(0) > 0) ops::embedding(x_view, *logit_rows, head_input);
  }
  if (head_input.size(0) == 0) return;
  if (logits.device() == x_view.device()) {
    ops::linear(head_input, p_.head, logits);
    return;
  }
  // Logits wanted on another device (a host buffer for a device model): the step's one wait.
  const TensorView device_logits = f32(ws_.logits, {head_input.size(0), logits.size(1)});
  ops::linear(head_input, p_.head, device_logits);
  ops::copy(device_logits, logits);
  ops::synchronize(x_view.device());
}

// ---- engram -----------------------------------------------------------------------------------

// Hashes on the host (the token ids are host data) into ids [engram layers, N, columns].
void ForwardPass::engram_hashes(int64_t* ids) {
  const int64_t window = engram_->max_ngram();
  const int64_t columns = engram_->columns();
  const int64_t per_token = engram_->layers() * columns;
  std::vector<int32_t> lookback(static_cast<size_t>(window));
  std::vector<int64_t> token_ids(static_cast<size_t>(per_token));
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
      engram_->hash(lookback, token_ids);
      for (int64_t layer = 0; layer < engram_->layers(); ++layer) {
        std::copy_n(token_ids.data() + layer * columns, columns,
                    ids + (layer * n_ + span.offset + t) * columns);
      }
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
  const int64_t row_dim = ep.table.size(1);
  const TensorView rows = f32(ws_.engram_rows, {n_, columns * row_dim});
  ops::engram_gather(ep.table, ep.table_scale, engram_ids_.select(0, engram_index), rows);
  const TensorView kv_view = f32(ws_.engram_kv, {n_, (hc_ + 1) * dim_});
  ops::linear(rows, ep.wkv, kv_view, quant_);
  ops::engram_mix(streams_, kv_view.narrow(1, 0, hc_ * dim_), kv_view.narrow(1, hc_ * dim_, dim_),
                  ep.qk, static_cast<float>(c_.rms_norm_eps), streams_);
}

// ---- attention --------------------------------------------------------------------------------

void ForwardPass::attention_projections(int64_t layer, const TensorView& x) {
  const AttentionParameters& ap = p_.layers[static_cast<size_t>(layer)].attn;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const int64_t heads = c_.num_attention_heads;
  const int64_t head_dim = c_.head_dim;
  const ops::RopeTable& rope = c_.compress_ratio(layer) > 0 ? rope_compress_ : rope_main_;

  // Low-rank query and the shared K=V latent (one input: one launch at decode).
  const TensorView qr_view = f32(ws_.qr, {n_, c_.q_lora_rank});
  const TensorView kv_view = f32(ws_.kv, {n_, head_dim});
  ops::linear_pair(x, ap.wq_a, qr_view, ap.wkv, kv_view, quant_);
  ops::rmsnorm(qr_view, ap.q_norm, eps, qr_view);
  const TensorView q_view = f32(ws_.q, {n_, heads, head_dim});
  // The K=V row's norm, rope and rounding and the compressed branch's projections (of x and the
  // normed qr) beside the query's wq_b: each chain only reads the other's inputs.
  ops::ConcurrentBranch beside_query(x.device());
  beside_query.run([&] {
    ops::rmsnorm(kv_view, ap.kv_norm, eps, kv_view);
    ops::rope(kv_view, positions_, rope, false);
    ops::fake_quant_fp8(kv_view, 32);
    compressed_projections(layer, x);
  });
  ops::linear(qr_view, ap.wq_b, q_view.view({n_, heads * head_dim}), quant_);
  ops::rope(q_view, positions_, rope, false);
  beside_query.join();
}

// The compressed branch's per-token projections: the compressor's kv and gate rows and the
// indexer's q and head weights (recordable; compressor() and indexer() read them back).
void ForwardPass::compressed_projections(int64_t layer, const TensorView& x) {
  const int64_t ratio = c_.compress_ratio(layer);
  if (ratio == 0) return;
  const AttentionParameters& ap = p_.layers[static_cast<size_t>(layer)].attn;
  if (c_.is_kv_source(layer)) {
    ops::linear(x, ap.compressor_wkv, f32(ws_.comp_kv, {n_, c_.head_dim}));
    if (ratio > 1) ops::linear(x, ap.compressor_wgate, f32(ws_.comp_gate, {n_, c_.head_dim}));
  }
  if (c_.is_index_source(layer)) {
    const int64_t heads = c_.index_n_heads;
    const int64_t index_dim = c_.index_head_dim;
    const TensorView qr = f32(ws_.qr, {n_, c_.q_lora_rank});
    const TensorView q_view = f32(ws_.index_q, {n_, heads, index_dim});
    ops::linear(qr, ap.indexer_wq_b, q_view.view({n_, heads * index_dim}), quant_);
    ops::rope(q_view, positions_, rope_compress_, false);
    ops::fake_quant_fp4(q_view, 32, ops::Fp4ScaleFormat::kUe8m0);
    const TensorView w_view = f32(ws_.index_w, {n_, heads});
    ops::linear(x, ap.indexer_weights_proj, w_view);
    ops::scale(w_view, 1.0f / std::sqrt(static_cast<float>(heads)), w_view);
  }
}

void ForwardPass::attention_core(int64_t layer) {
  const AttentionParameters& ap = p_.layers[static_cast<size_t>(layer)].attn;
  const int64_t heads = c_.num_attention_heads;
  const int64_t head_dim = c_.head_dim;
  const int64_t ratio = c_.compress_ratio(layer);
  // The projections' results (the same scratch views they were written to).
  const TensorView q_view = f32(ws_.q, {n_, heads, head_dim});
  const TensorView kv_view = f32(ws_.kv, {n_, head_dim});

  // The compressed branch: the source publishes this call's complete groups into the state;
  // index sources select per query; layers in between reuse both.
  int64_t kv_source = -1;
  if (ratio > 0) {
    kv_source = c_.kv_source_of(layer);
    if (c_.is_kv_source(layer)) compressor(layer);
    if (c_.is_index_source(layer)) indexer(layer);
  }
  const int64_t index_source = ratio > 0 ? c_.index_source_of(layer) : -1;
  if (index_source >= 0 && index_source < kv_source) {
    DI_THROW("layer ", layer, " reads the compressed KV of source ", kv_source,
             " but the top-k of index source ", index_source,
             ", which scores another source's keys; such schedules are not supported");
  }

  // Attention of every request in one call over [window positions] + [selected compressed
  // rows]: window positions before a request's first new token come from its ring, the rest
  // from this call's kv rows.
  const TensorView attn_view = f32(ws_.attn_out, {n_, heads, head_dim});
  std::vector<ops::AttentionRequest>& requests = ws_.attention_requests;
  requests.resize(spans_.size());
  for (size_t r = 0; r < spans_.size(); ++r) {
    const RequestSpan& span = spans_[r];
    ops::AttentionRequest& request = requests[r];
    request = ops::AttentionRequest{};
    request.window_ring = span.state->window(layer);
    request.offset = span.offset;
    request.count = span.count;
    request.start = span.start;
    if (index_source >= 0 && ws_.selection_view[r].numel() > 0) {
      const int64_t groups = span.end() / c_.compress_ratio(kv_source);
      request.compressed_kv = span.state->compressed_kv(kv_source).narrow(0, 0, groups);
      request.selected = ws_.selection_view[r];
    }
  }
  ops::sink_attention_batch(q_view, kv_view, requests, c_.sliding_window, ap.attn_sink,
                            1.0f / std::sqrt(static_cast<float>(head_dim)), attn_view);
  // Only now the new window rows go into the rings (earlier queries of a long chunk needed the
  // rows the ring would have overwritten).
  ops::write_window_rings(kv_view, requests);
}

void ForwardPass::attention_output(int64_t layer, const TensorView& out) {
  const AttentionParameters& ap = p_.layers[static_cast<size_t>(layer)].attn;
  const int64_t heads = c_.num_attention_heads;
  const int64_t head_dim = c_.head_dim;
  const ops::RopeTable& rope = c_.compress_ratio(layer) > 0 ? rope_compress_ : rope_main_;
  const TensorView attn_view = f32(ws_.attn_out, {n_, heads, head_dim});

  // Remove the query's rotation from the output, then the grouped low-rank projection.
  ops::rope(attn_view, positions_, rope, true);
  const int64_t groups = c_.o_groups;
  const TensorView attn_flat = attn_view.view({n_, heads * head_dim});
  const TensorView grouped_view = f32(ws_.grouped, {n_, groups * c_.o_lora_rank});
  // Group g's heads meet weight rows [g * o_lora_rank, (g + 1) * o_lora_rank): the per-group
  // linears' bits, in one launch on the GPU at decode.
  ops::linear_grouped(attn_flat, ap.wo_a, groups, grouped_view);
  ops::linear(grouped_view, ap.wo_b, out, quant_);
}

void ForwardPass::compressor(int64_t layer) {
  const AttentionParameters& ap = p_.layers[static_cast<size_t>(layer)].attn;
  const int64_t head_dim = c_.head_dim;
  const int64_t ratio = c_.compress_ratio(layer);
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const TensorView kv = f32(ws_.comp_kv, {n_, head_dim});  // compressed_projections'
  std::vector<ops::AttentionRequest>& completing = ws_.completing_groups;
  completing.assign(spans_.size(), ops::AttentionRequest{});
  if (ratio == 1) {
    // Every token is its own group: a plain projection, normed.
    ops::rmsnorm(kv, ap.compressor_norm, eps, kv);
    for (size_t r = 0; r < spans_.size(); ++r) {
      completing[r].offset = spans_[r].offset;
      completing[r].count = spans_[r].count;
      completing[r].start = spans_[r].start;
    }
    publish_compressed(layer, kv, positions_, completing);
    return;
  }
  const TensorView gate = f32(ws_.comp_gate, {n_, head_dim});  // compressed_projections'
  const GroupPositions* group_positions = nullptr;
  for (const GroupPositions& groups : group_positions_) {
    if (groups.ratio == ratio) group_positions = &groups;
  }
  DI_CHECK(group_positions != nullptr, "no group positions for ratio ", ratio);
  // The r rows of every completing group of the step, request after request (the order of the
  // group positions): older ones from the request's pending ring, the rest from this call. Then
  // one pooling and one norm over all of them.
  const int64_t total_groups = group_positions->offsets.back();
  if (total_groups > 0) {
    const TensorView gathered_kv = f32(ws_.gathered_kv, {total_groups * ratio, head_dim});
    const TensorView gathered_gate = f32(ws_.gathered_gate, {total_groups * ratio, head_dim});
    for (size_t r = 0; r < spans_.size(); ++r) {
      const RequestSpan& span = spans_[r];
      const int64_t first_group = span.start / ratio;
      const int64_t groups = span.end() / ratio - first_group;
      if (groups == 0) continue;
      const int64_t first = first_group * ratio;
      const int64_t old_rows = span.start - first;
      const int64_t new_rows = groups * ratio - old_rows;
      const int64_t row = group_positions->offsets[r] * ratio;
      read_ring(span.state->pending_kv(layer), first, gathered_kv.narrow(0, row, old_rows));
      read_ring(span.state->pending_gate(layer), first, gathered_gate.narrow(0, row, old_rows));
      ops::copy(kv.narrow(0, span.offset, new_rows),
                gathered_kv.narrow(0, row + old_rows, new_rows));
      ops::copy(gate.narrow(0, span.offset, new_rows),
                gathered_gate.narrow(0, row + old_rows, new_rows));
      completing[r].offset = group_positions->offsets[r];
      completing[r].count = groups;
      completing[r].start = first_group;
    }
    const TensorView latent = f32(ws_.latent, {total_groups, head_dim});
    ops::compress_pool(gathered_kv, gathered_gate, static_cast<int>(ratio), latent);
    ops::rmsnorm(latent, ap.compressor_norm, eps, latent);
    publish_compressed(layer, latent, group_positions->positions, completing);
  }
  // Then every request's new rows into its pending rings, one call per ring kind (each request's
  // groups above read the rows these overwrite). false: the per-request copies of before.
  constexpr bool kBatchedPendingWrites = true;
  if (!kBatchedPendingWrites) {
    for (const RequestSpan& span : spans_) {
      const TensorView& pending_kv = span.state->pending_kv(layer);
      const int64_t first = std::max(span.start, span.end() - pending_kv.size(0));
      const int64_t count = span.end() - first;
      write_ring(kv.narrow(0, span.offset + first - span.start, count), pending_kv, first);
      write_ring(gate.narrow(0, span.offset + first - span.start, count),
                 span.state->pending_gate(layer), first);
    }
    return;
  }
  std::vector<ops::AttentionRequest>& rings = ws_.pending_ring_writes;
  rings.resize(spans_.size());
  for (size_t r = 0; r < spans_.size(); ++r) {
    rings[r] = ops::AttentionRequest{};
    rings[r].window_ring = spans_[r].state->pending_kv(layer);
    rings[r].offset = spans_[r].offset;
    rings[r].count = spans_[r].count;
    rings[r].start = spans_[r].start;
  }
  ops::write_window_rings(kv, rings);
  for (size_t r = 0; r < spans_.size(); ++r) {
    rings[r].window_ring = spans_[r].state->pending_gate(layer);
  }
  ops::write_window_rings(gate, rings);
}

// Turns the step's pre-RoPE latents [G, head_dim] into indexer keys (when the source runs an
// indexer) and compressed KV entries, each op once over all G rows, then scatters every
// request's rows into its state at their group index (the caches never wrap: a group's slot is
// its index, checked against max_groups).
void ForwardPass::publish_compressed(int64_t layer, const TensorView& latents,
                                     const TensorView& group_positions,
                                     std::span<const ops::AttentionRequest> groups) {
  const int64_t total = latents.size(0);
  if (total == 0) return;
  const AttentionParameters& ap = p_.layers[static_cast<size_t>(layer)].attn;
  std::vector<ops::AttentionRequest>& targets = ws_.cache_writes;
  targets.assign(groups.begin(), groups.end());
  for (size_t r = 0; r < spans_.size(); ++r) {
    const RequestState& state = *spans_[r].state;
    if (targets[r].count == 0) continue;
    if (targets[r].start + targets[r].count > state.max_groups(layer)) {
      DI_THROW("compressed cache of layer ", layer, " is full (", state.max_groups(layer),
               " groups)");
    }
  }
  // A latent stands for its group's first token: its position, from the step's metadata.
  if (c_.is_index_source(layer)) {
    const TensorView keys = f32(ws_.comp_keys, {total, c_.index_head_dim});
    ops::linear(latents, ap.indexer_wk, keys);
    ops::rmsnorm(keys, ap.indexer_k_norm, static_cast<float>(c_.rms_norm_eps), keys);
    ops::rope(keys, group_positions, rope_compress_, false);
    // The fp4 ue8m0/32 fake-quant of the keys (MODEL.md 5.2), stored as its codes and scales.
    std::vector<ops::IndexerKeyWrite>& key_writes = ws_.key_writes;
    key_writes.clear();
    for (size_t r = 0; r < spans_.size(); ++r) {
      if (targets[r].count == 0) continue;
      key_writes.push_back({spans_[r].state->index_keys(layer), targets[r].offset, targets[r].count,
                            targets[r].start});
    }
    ops::write_indexer_keys(keys, key_writes);
  }
  const TensorView entries = f32(ws_.comp_entries, {total, c_.head_dim});
  ops::copy(latents, entries);
  ops::rope(entries, group_positions, rope_compress_, false);
  ops::fake_quant_fp4(entries, 16, ops::Fp4ScaleFormat::kE4m3);
  for (size_t r = 0; r < spans_.size(); ++r) {
    targets[r].window_ring = spans_[r].state->compressed_kv(layer);
  }
  ops::write_window_rings(entries, targets);
}

void ForwardPass::indexer(int64_t layer) {
  const int64_t heads = c_.index_n_heads;
  const int64_t index_dim = c_.index_head_dim;
  const int64_t ratio = c_.compress_ratio(layer);
  const int64_t kv_source = c_.kv_source_of(layer);
  if (!c_.is_index_source(kv_source)) {
    DI_THROW("index source ", layer, " reads the keys of KV source ", kv_source,
             ", which runs no indexer and so has no keys; such schedules are not supported");
  }
  // compressed_projections' q and head weights.
  const TensorView q_view = f32(ws_.index_q, {n_, heads, index_dim});
  const TensorView w_view = f32(ws_.index_w, {n_, heads});
  TensorView visible_all;
  for (const auto& [visible_ratio, view] : visible_) {
    if (visible_ratio == ratio) visible_all = view;
  }

  const bool candidate_source = c_.is_candidate_source(layer);
  const bool uses_candidates = c_.uses_candidates(layer);
  // One score matrix [N, most entries] for the whole step, so candidate selection and top-k run
  // once over all rows (one block per row) instead of once per request. A request's columns past
  // its own entries hold -inf, which both selections never keep: its rows select exactly what a
  // matrix of its own width would, padded with -1 up to the common k (attention skips -1).
  int64_t most_entries = 0;
  bool ragged = false;
  for (const RequestSpan& span : spans_) {
    const int64_t entries = span.end() / c_.compress_ratio(kv_source);
    ragged = ragged || (most_entries > 0 && entries != most_entries);
    most_entries = std::max(most_entries, entries);
  }
  for (size_t r = 0; r < spans_.size(); ++r) ws_.selection_view[r] = TensorView();
  if (most_entries == 0) return;
  const TensorView scores_view = f32(ws_.scores, {n_, most_entries});
  const float score_scale = 1.0f / std::sqrt(static_cast<float>(index_dim));
  if (kBatchedIndexerScores) {
    // One call for the step; it writes the -inf past each request's entries itself.
    std::vector<ops::IndexerRequest>& requests = ws_.indexer_requests;
    requests.clear();
    for (const RequestSpan& span : spans_) {
      const int64_t entries = span.end() / c_.compress_ratio(kv_source);
      requests.push_back(
          {entries > 0 ? span.state->index_keys(kv_source).narrow(0, entries) : ops::IndexerKeys{},
           span.offset, span.count});
    }
    ops::indexer_scores_batch(q_view, requests, w_view, visible_all, score_scale, scores_view);
  } else {
    if (ragged) ops::fill(scores_view, -std::numeric_limits<float>::infinity());
    for (const RequestSpan& span : spans_) {
      const int64_t entries = span.end() / c_.compress_ratio(kv_source);
      if (entries == 0) continue;
      ops::indexer_scores(q_view.narrow(0, span.offset, span.count),
                          span.state->index_keys(kv_source).narrow(0, entries),
                          w_view.narrow(0, span.offset, span.count),
                          visible_all.narrow(0, span.offset, span.count), score_scale,
                          scores_view.narrow(0, span.offset, span.count).narrow(1, 0, entries));
    }
  }
  if (candidate_source) {
    ws_.candidate_mask = take(ws_.candidates, DType::kI8, {n_, most_entries});
    ops::candidate_blocks(scores_view, visible_all, static_cast<int>(c_.candidate_topk_blocks),
                          static_cast<int>(c_.candidate_block_size), ws_.candidate_mask);
  } else if (uses_candidates && ws_.candidate_mask.numel() > 0) {
    if (ws_.candidate_mask.size(1) != most_entries) {
      DI_THROW("index source ", layer, " scores ", most_entries,
               " entries but the candidate mask covers ", ws_.candidate_mask.size(1));
    }
    ops::mask_scores(scores_view, ws_.candidate_mask);
  }
  const int64_t k = std::min<int64_t>(c_.index_topk, most_entries);
  const TensorView selection = take(ws_.selection, DType::kI32, {n_, k});
  ops::topk_indices(scores_view, static_cast<int>(k), selection);
  for (size_t r = 0; r < spans_.size(); ++r) {
    const RequestSpan& span = spans_[r];
    if (span.end() / c_.compress_ratio(kv_source) == 0) continue;
    ws_.selection_view[r] = selection.narrow(0, span.offset, span.count);
  }
}

// ---- MoE --------------------------------------------------------------------------------------

void ForwardPass::moe(int64_t layer, const TensorView& x, const TensorView& out) {
  const LayerParameters& lp = p_.layers[static_cast<size_t>(layer)];
  const int64_t k = c_.num_experts_per_tok;
  const int64_t inter = c_.moe_intermediate_size;
  const float limit = static_cast<float>(c_.swiglu_limit);
  const TensorView weights = f32(ws_.route_weights, {n_, k});
  const TensorView chosen = take(ws_.route_experts, DType::kI32, {n_, k});
  const ops::RouterParams router{score_function(c_.scoring_func), static_cast<float>(c_.gate_temp),
                                 static_cast<int>(k), c_.norm_topk_prob,
                                 static_cast<float>(c_.routed_scaling_factor)};
  // The shared expert on every token beside the routed ones (both only read x), added after
  // them (HF's order).
  const TensorView gate = f32(ws_.moe_gate, {n_, inter});
  const TensorView up = f32(ws_.moe_up, {n_, inter});
  const TensorView shared = f32(ws_.shared_out, {n_, dim_});
  ops::ConcurrentBranch shared_expert(x.device());
  shared_expert.run([&] {
    ops::linear_pair(x, lp.shared_expert.w1, gate, lp.shared_expert.w3, up, quant_);
    ops::swiglu(gate, up, limit, TensorView(), gate);
    ops::linear(gate, lp.shared_expert.w2, shared, quant_);
  });
  ops::route(x, lp.gate_weight, lp.gate_bias, router, weights, chosen);
  ops::moe_experts(x, chosen, weights, expert_weights_[static_cast<size_t>(layer)], limit, quant_,
                   out);
  shared_expert.join();
  ops::add(out, shared, out);
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
      workspace_(std::make_unique<ForwardWorkspace>()),
      cuda_graphs_(kCudaGraphs && graphs_requested_by_environment()),
      cuda_graph_max_tokens_(max_recorded_tokens_from_environment()) {
  if (!config.engram_layer_ids.empty() && engram_ == nullptr) {
    DI_THROW("the config has engram layers ", config.engram_layer_ids.size(),
             " but no engram hasher (token map) was given");
  }
  if (static_cast<int64_t>(parameters.layers.size()) != config.num_hidden_layers) {
    DI_THROW("parameters hold ", parameters.layers.size(), " layers, the config ",
             config.num_hidden_layers);
  }
  score_function(config.scoring_func);  // validate early
  const Device device = parameters.embed.device();
  expert_weights_.resize(parameters.layers.size());
  for (size_t layer = 0; layer < parameters.layers.size(); ++layer) {
    for (const ExpertParameters& expert : parameters.layers[layer].experts) {
      if (expert.w1.weight.device() != device) {
        DI_THROW("layer ", layer, " has expert weights on ", expert.w1.weight.device().to_string(),
                 " but the embedding is on ", device.to_string(),
                 ": all parameters must be on one device");
      }
      expert_weights_[layer].push_back({expert.w1, expert.w3, expert.w2});
    }
  }
  if (config.n_shared_experts != 1) {
    DI_THROW("n_shared_experts ", config.n_shared_experts, " is not supported (exactly 1)");
  }
}

Model::~Model() = default;

void Model::set_cuda_graphs(bool enabled) {
  cuda_graphs_ = kCudaGraphs && enabled;
  if (!cuda_graphs_) {
    workspace_->segments.clear();
    workspace_->recorded_token_counts.clear();
  }
}

void Model::set_cuda_graph_max_tokens(int64_t tokens) {
  if (tokens < 1 || tokens > kLargestCudaGraphMaxTokens) {
    DI_THROW("the CUDA graph token limit ", tokens, " is not in 1..", kLargestCudaGraphMaxTokens);
  }
  cuda_graph_max_tokens_ = tokens;
}

void Model::forward(std::span<const ForwardRequest> requests, const TensorView& logits) {
  forward_impl(requests, nullptr, logits);
}

void Model::forward(std::span<const ForwardRequest> requests, std::span<const int32_t> logit_rows,
                    const TensorView& logits) {
  forward_impl(requests, &logit_rows, logits);
}

void Model::forward_impl(std::span<const ForwardRequest> requests,
                         std::span<const int32_t> const* logit_rows, const TensorView& logits) {
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
  const int64_t logit_count =
      logit_rows == nullptr ? tokens : static_cast<int64_t>(logit_rows->size());
  if (logits.rank() != 2 || logits.size(0) != logit_count || logits.size(1) != config_.vocab_size) {
    DI_THROW("logits output must be [", logit_count, ", ", config_.vocab_size, "], got ",
             logits.to_string());
  }
  if (logit_rows != nullptr) {
    for (const int32_t row : *logit_rows) {
      if (row < 0 || row >= tokens) {
        DI_THROW("logits row ", row, " is outside the step's ", tokens, " tokens");
      }
    }
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
  // Grow only: a Scratch dropped and re-made would free and reallocate device memory.
  ws.selection_view.assign(spans.size(), TensorView());
  ws.candidate_mask = TensorView();

  ForwardPass pass(config_, parameters_, expert_weights_, numerics_, engram_.get(), rope_main_,
                   rope_compress_, ws, spans, tokens, observer_,
                   cuda_graphs_ ? cuda_graph_max_tokens_ : 0);
  pass.run(logits, logit_rows);
  for (const RequestSpan& span : spans) span.state->advance(span.count);
}

}  // namespace deepinfer::deepseek_v41
