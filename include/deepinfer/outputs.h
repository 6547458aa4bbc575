// What the engine returns per request (vLLM-like).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace deepinfer {

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
};

// Per output position: the sampled token's log-probability and the top-k alternatives.
struct PositionLogprobs {
  TokenLogprob sampled;
  std::vector<TokenLogprob> top;
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };

struct CompletionOutput {
  int32_t index = 0;
  std::string text;
  std::vector<int32_t> token_ids;
  FinishReason finish_reason = FinishReason::kNone;
  // The stop string or stop token that ended generation, when finish_reason is kStop.
  std::optional<std::string> stop_reason;
  std::optional<std::vector<PositionLogprobs>> logprobs;
};

struct RequestTimings {
  double arrival_s = 0;      // seconds on the engine's steady clock
  double first_token_s = 0;  // time to first token = first_token_s - arrival_s
  double finished_s = 0;
  int32_t num_preemptions = 0;
};

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  std::vector<CompletionOutput> outputs;
  bool finished = false;
  // Set when the request failed validation or execution; the other requests are unaffected.
  std::optional<std::string> error;
  RequestTimings timings;
};

const char* finish_reason_name(FinishReason reason);

}  // namespace deepinfer
