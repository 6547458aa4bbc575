// One request as the engine tracks it: inputs, generated tokens and scheduling counters.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/outputs.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer::engine {

enum class RequestStatus { kWaiting, kRunning, kFinished };

struct Request {
  std::string id;
  int64_t arrival_order = 0;  // admission and preemption priority: lower is older
  std::vector<int32_t> prompt;
  SamplingParams params;
  uint64_t seed = 0;  // resolved: params.seq_seed or derived from the engine seed

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
