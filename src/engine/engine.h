// The engine loop: requests in, scheduler plans a step, the executor runs the model and the
// sampler on it, results update the requests. With async scheduling the executor runs step N
// on a worker thread while the scheduler plans step N+1 (see docs/ENGINE.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/engine_args.h"
#include "deepinfer/outputs.h"
#include "deepinfer/sampling_params.h"
#include "engine/model_runner.h"

namespace deepinfer::engine {

struct EngineStats {
  int64_t steps = 0;
  int64_t preemptions = 0;
  int64_t scheduled_tokens = 0;
  int32_t max_running = 0;
};

class Engine {
 public:
  // `args` must be resolved (EngineArgs::resolved()).
  Engine(const EngineArgs& args, std::unique_ptr<ModelRunner> runner);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Invalid requests are accepted and finish at once with an error; they
  // never affect the others. Returns the request id.
  std::string add_request(std::vector<int32_t> prompt, const SamplingParams& params,
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
  // Forgets a finished request.
  void release(const std::string& request_id);

  const EngineStats& stats() const;
  int64_t free_state_tokens() const;
  int64_t state_capacity_tokens() const;
  int32_t free_state_slots() const;
  int32_t num_state_slots() const;
  int64_t max_model_len() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::engine
