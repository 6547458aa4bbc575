// The engine loop: requests in, scheduler plans a step, the executor runs the model and the
// sampler on it, results update the requests. With async scheduling the executor runs step N
// on a worker thread while the scheduler plans step N+1 (see docs/ENGINE.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/engine_args.h"
#include "deepinfer/outputs.h"
#include "deepinfer/sampling_params.h"
#include "engine/model_runner.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::engine {

struct EngineStats {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t scheduled_tokens = 0;
  int32_t max_running = 0;
};

// Points of one step, reported in the order they happen on their thread (tests check the
// async overlap with them; nothing else depends on them).
enum class StepEvent {
  kPlanned,       // the scheduler finished planning step `index`
  kMasksReady,    // the structured-output masks of step `index` are computed
  kForwardBegin,  // the worker starts the forward of step `index`
  kForwardEnd,    // ... and finished it (sampling follows)
};
using StepObserver = std::function<void(StepEvent event, int64_t index)>;

class Engine {
 public:
  // `args` must be resolved (EngineArgs::resolved()). Without a tokenizer, requests with stop
  // strings or so_args fail (alone) and outputs have no text.
  Engine(const EngineArgs& args, std::unique_ptr<ModelRunner> runner,
         std::optional<tokenizer::Tokenizer> tokenizer = std::nullopt);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Invalid requests are accepted and finish at once with an error; they
  // never affect the others. Returns the request id.
  std::string add_request(std::vector<int32_t> prompt, const SamplingParams& params,
                          std::optional<std::string> request_id = std::nullopt);
  // Queues a request that already failed (its prompt could not be encoded, ...): it finishes
  // at once with `error`, as a validation failure does.
  std::string add_failed_request(std::vector<int32_t> prompt, const std::string& error,
                                 std::optional<std::string> request_id = std::nullopt);
  // Ends a waiting or running request with FinishReason::kAbort. False when unknown or done.
  bool abort(const std::string& request_id);

  // Runs one step (in async mode: executes the planned step while planning the next one).
  void step();
  bool has_unfinished() const;
  // Steps until every request is done.
  void run_to_completion();

  // Snapshot of a request (finished or not); throws Error for an unknown id.
  RequestOutput output(const std::string& request_id) const;
  // What a request produced since the previous delta (streaming): new token ids, text and
  // logprobs per completion, and the finish state once it is final. Text that could still turn
  // into a stop string is held back until the request finishes. nullopt when nothing is new.
  std::optional<RequestOutput> take_delta(const std::string& request_id);
  // Forgets a finished request.
  void release(const std::string& request_id);

  const EngineStats& stats() const;
  int64_t free_state_tokens() const;
  int64_t state_capacity_tokens() const;
  int32_t free_state_slots() const;
  int32_t num_state_slots() const;
  int64_t max_model_len() const;
  const std::optional<tokenizer::Tokenizer>& tokenizer() const;
  // Called on the engine thread (kPlanned, kMasksReady) and the worker (kForward*).
  void set_step_observer(StepObserver observer);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::engine
