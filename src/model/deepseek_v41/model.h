// The DeepSeek-V4.1 text forward, written once against src/ops.
//
// One call runs a ragged, token-major batch: any number of requests, each contributing the
// next tokens of its own sequence at its own position (a whole prompt, a chunk of one, or one
// decode token). Everything a request carries between calls lives in its RequestState; the
// model itself is stateless between calls apart from reusable scratch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/engram_hash.h"
#include "model/deepseek_v41/parameters.h"
#include "model/deepseek_v41/state.h"
#include "ops/ops.h"

namespace deepinfer::deepseek_v41 {

struct ForwardWorkspace;  // reusable scratch of the forward (forward.cpp)

// Which numerics the linear layers use. Both keep the quantization that is part of the model
// (FP8 window KV, FP4 compressed KV and indexer q/k).
enum class Numerics {
  kDense,     // f32 activations into (dequantized) weights, as HF DeepseekV41ForCausalLM
  kReleased,  // FP8 (ue8m0 per 32) activations into the FP8 / FP4 weight roles, as DeepSeek's
              // reference inference code runs the released checkpoint
};

struct ForwardRequest {
  RequestState* state = nullptr;
  std::span<const int32_t> tokens;  // placed at positions state->length(), +1, ...
};

class Model {
 public:
  // `parameters` must outlive the model. `engram` is required when the config has engram
  // layers (it carries the tokenizer-derived token map).
  Model(const DeepseekV41TextConfig& config, const ModelParameters& parameters, Numerics numerics,
        std::shared_ptr<const EngramHasher> engram = nullptr);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const DeepseekV41TextConfig& config() const { return config_; }
  // Where the parameters live; the forward runs there, and request states must live there too
  // (ops::allocator_for(device()) allocates them).
  Device device() const { return parameters_.embed.device(); }

  // Called after every decoder layer with the hc streams [tokens, hc_mult, hidden] f32 of the
  // whole batch (token-major, as in forward). For layer-by-layer comparisons with the oracles
  // (docs/GOLDEN.md); empty = none.
  using LayerObserver = std::function<void(int64_t layer, const TensorView& streams)>;
  void set_layer_observer(LayerObserver observer) { observer_ = std::move(observer); }

  // Whether decode steps (at most cuda_graph_max_tokens) on a GPU record the parts of a step whose
  // kernels and arguments repeat as CUDA graphs and replay them (docs/CUDA.md, "CUDA graphs for
  // decode"); the logits are the same bits either way. On unless DEEPINFER_CUDA_GRAPHS=0;
  // the recordings of the 8 most recently used token counts are kept; turning it off drops
  // them.
  void set_cuda_graphs(bool enabled);
  bool cuda_graphs() const { return cuda_graphs_; }
  // The largest step (tokens) that records: 256 unless DEEPINFER_CUDA_GRAPH_MAX_TOKENS (1 to
  // kLargestCudaGraphMaxTokens) says otherwise. Larger steps hold more graph memory a recording
  // (their segments' scratch); with batch invariance off their dense GEMMs record as cuBLASLt
  // calls (docs/CUDA.md, "CUDA graphs for decode").
  static constexpr int64_t kLargestCudaGraphMaxTokens = 4096;
  void set_cuda_graph_max_tokens(int64_t tokens);
  int64_t cuda_graph_max_tokens() const { return cuda_graph_max_tokens_; }

  // Runs every request's tokens and writes their logits, request after request, into
  // `logits` [total tokens, vocab] f32; then advances each state by its token count. A
  // request with no tokens is skipped. Throws Error (and changes no state) when a state would
  // overflow its max_tokens or a token id is out of range.
  //
  // On a GPU model the whole step is queued on the current stream with one upload of the
  // step's metadata and no wait, except that host `logits` are copied back and waited for
  // (which also reports kernel-detected index errors); device `logits` are left in flight.
  // The layer observer then receives device views.
  void forward(std::span<const ForwardRequest> requests, const TensorView& logits);
  // The same step, with the LM head only for `logit_rows` (indices into the step's token-major
  // rows, any order, repeats allowed): `logits` [logit_rows.size(), vocab] receives them in that
  // order, equal bit for bit to those rows of the full call. What a sampler needs (one row per
  // request) without the vocab x hidden GEMM for every prefill token.
  void forward(std::span<const ForwardRequest> requests, std::span<const int32_t> logit_rows,
               const TensorView& logits);

 private:
  void forward_impl(std::span<const ForwardRequest> requests,
                    std::span<const int32_t> const* logit_rows, const TensorView& logits);

  const DeepseekV41TextConfig config_;
  const ModelParameters& parameters_;
  Numerics numerics_;
  std::shared_ptr<const EngramHasher> engram_;
  ops::RopeTable rope_main_;
  ops::RopeTable rope_compress_;
  std::vector<std::vector<ops::ExpertWeights>> expert_weights_;  // per layer, for moe_experts
  std::unique_ptr<ForwardWorkspace> workspace_;
  bool cuda_graphs_ = false;
  int64_t cuda_graph_max_tokens_ = 256;
  LayerObserver observer_;
};

// Runs every prompt to its end as one ragged batch per step, `chunk` tokens per request per
// step (0 = each whole prompt in one step, 1 = token-by-token decode), each request in a fresh
// state. Returns every position's logits [total tokens, vocab], request after request: the
// docs/GOLDEN.md logits layout.
std::vector<float> run_prompts(Model& model, const std::vector<std::vector<int32_t>>& prompts,
                               int64_t chunk);

}  // namespace deepinfer::deepseek_v41
