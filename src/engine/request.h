// One sequence as the engine schedules it: inputs, generated tokens and scheduling counters.
// A request with n completions is n sequences sharing the prompt and seed, told apart by
// sample_index (their random streams differ).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/outputs.h"
#include "deepinfer/sampling_params.h"
#include "structured/grammar_matcher.h"
#include "tokenizer/streaming_detokenizer.h"

namespace deepinfer::engine {

enum class RequestStatus { kWaiting, kRunning, kFinished };

struct Request {
  std::string id;
  int64_t arrival_order = 0;  // admission and preemption priority: lower is older
  std::vector<int32_t> prompt;
  SamplingParams params;
  uint64_t seed = 0;          // resolved: params.seq_seed or derived from the engine seed
  uint32_t sample_index = 0;  // which of the request's n completions

  // ---- output text (when the engine has a tokenizer) ----
  std::optional<tokenizer::StreamingDetokenizer> detokenizer;
  std::string text;
  // Stop strings are matched in `text`; a suffix this long may still become one, so streaming
  // holds it back until the request finishes.
  size_t stop_holdback = 0;
  // ---- structured output ----
  std::unique_ptr<structured::GrammarMatcher> matcher;
  std::vector<uint32_t> allowed_mask;  // filled for the step that samples next
  std::string mask_error;
  // ---- streaming: what earlier deltas delivered ----
  size_t delivered_tokens = 0;
  size_t delivered_text = 0;
  bool delivered_final = false;

  std::vector<int32_t> output;
  std::vector<PositionLogprobs> logprobs;
  RequestStatus status = RequestStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<std::string> stop_reason;
  std::optional<std::string> error;

  // ---- scheduling ----
  int32_t slot = -1;
  // Tokens whose effects are in the slot's state (executed steps).
  int64_t num_computed = 0;
  // Tokens planned so far, including steps still in flight (>= num_computed).
  int64_t num_scheduled = 0;
  // A sample planned in a step still in flight: the token after it is not known yet.
  bool sample_in_flight = false;
  bool in_flight = false;  // part of the step executing now

  RequestTimings timings;

  int64_t known_length() const {
    return static_cast<int64_t>(prompt.size() + output.size()) + (sample_in_flight ? 1 : 0);
  }
  int32_t token_at(int64_t position) const {
    const auto prompt_len = static_cast<int64_t>(prompt.size());
    return position < prompt_len ? prompt[static_cast<size_t>(position)]
                                 : output[static_cast<size_t>(position - prompt_len)];
  }
  bool finished() const { return status == RequestStatus::kFinished; }
};

}  // namespace deepinfer::engine
