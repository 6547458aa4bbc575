// CPU reference sampler: one token per logits row, from per-row parameters, history and
// grammar mask. Each row is computed alone, with fixed-order arithmetic and a random number
// keyed by (seed, output position, completion index), so a row's token and log-probabilities
// are bit-identical whatever else is in the batch, in which order, on how many threads.
//
// Per row, in order (vLLM v1's order):
//   1. grammar bitmask: disallowed tokens -> -inf;
//   2. raw log-probabilities (log_softmax of 1.), if requested;
//   3. min_tokens: ban stop tokens while the output is too short;
//   4. penalties: repetition, frequency, presence;
//   5. temperature < 1e-5: argmax (ties -> lowest id); otherwise temperature, min_p, top_k,
//      top_p, then inverse-CDF sampling with a Philox uniform (see token_filters.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deepinfer/sampling_params.h"

namespace deepinfer {
class ThreadPool;
}

namespace deepinfer::sampling {

struct SamplerRow {
  const SamplingParams* params = nullptr;  // must be set
  // The request's resolved seed (seq_seed, or one the engine chose for it).
  uint64_t seed = 0;
  // Which of the request's n completions this row continues.
  uint32_t sample_index = 0;
  std::span<const int32_t> prompt_token_ids;
  // Tokens this completion has generated so far; its length is the output position drawn.
  std::span<const int32_t> output_token_ids;
  // Structured-output mask, bit t of word t/32 set = token t allowed; exactly
  // ceil(vocab/32) words. Empty: no constraint.
  std::span<const uint32_t> allowed_token_bitmask;
  // The model's end-of-sequence ids (banned by min_tokens unless ignore_eos).
  std::span<const int32_t> eos_token_ids;
};

struct TokenLogprob {
  int32_t token_id = -1;
  float logprob = 0.0f;
  // For the sampled token: how many tokens have a log-probability >= its own (vLLM's rank,
  // 1 = most likely). In top_logprobs: the 1-based position in that list.
  int64_t rank = 0;
};

struct SampledToken {
  int32_t token_id = -1;
  // Set when params.logprobs is set: the sampled token's raw log-probability.
  std::optional<TokenLogprob> sampled_logprob;
  // The params.logprobs most likely tokens of the raw distribution (most likely first, ties
  // by lower id); tokens the grammar forbids (-inf) are left out.
  std::vector<TokenLogprob> top_logprobs;
  // Non-empty when this row could not be sampled (invalid params or history, NaN logits, no
  // allowed token); the engine fails that request alone with this message.
  std::string error;

  bool ok() const { return error.empty(); }
};

struct SamplerOptions {
  // Rows are cut into pool->num_threads() contiguous chunks run on the pool; nullptr runs
  // every row on the calling thread. The pool must outlive the Sampler.
  ThreadPool* pool = nullptr;
};

struct SamplerWorkspace;  // per-thread scratch, defined in sampler.cpp

class Sampler {
 public:
  explicit Sampler(SamplerOptions options = {});
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // `logits` is row-major [rows.size(), vocab_size] float32; results has rows.size()
  // entries. Not reentrant: one call at a time per Sampler (it reuses its scratch buffers).
  void sample(std::span<const float> logits, int64_t vocab_size, std::span<const SamplerRow> rows,
              std::span<SampledToken> results);

  std::vector<SampledToken> sample(std::span<const float> logits, int64_t vocab_size,
                                   std::span<const SamplerRow> rows);

 private:
  SamplerOptions options_;
  std::vector<std::unique_ptr<SamplerWorkspace>> workspaces_;
};

// What every sampler backend checks and reports in the same words (the CUDA sampler shares
// them so that a row fails identically on either backend).
// Checks what can be checked before reading the logits: params.validate(), the bitmask's size,
// and (when a penalty is set) that the history ids lie in [0, vocab_size). Throws Error.
void check_row_inputs(const SamplerRow& row, int64_t vocab_size);
std::string non_finite_logit_message(float value, size_t token);
std::string grammar_allows_nothing_message(size_t position);
std::string allowed_all_negative_infinity_message(size_t position);
std::string nothing_sampleable_message(size_t position, size_t allowed_by_grammar,
                                       int64_t min_tokens);

}  // namespace deepinfer::sampling
