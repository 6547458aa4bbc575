// Continuous batching: each step takes every running request's decode token first, then
// prefill chunks (running requests first, then waiting ones in arrival order) until the token
// budget or the running cap is reached. When the state pool is full, the newest running
// request is preempted: its state is dropped and it is recomputed (prompt + output so far)
// when it is admitted again. A running request is never failed for lack of memory.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/request.h"
#include "engine/state_manager.h"

namespace deepinfer::engine {

struct ScheduledChunk {
  Request* request = nullptr;
  int64_t start = 0;        // first position computed
  int32_t num_tokens = 0;   // positions start .. start + num_tokens - 1
  bool samples = false;     // the chunk reaches the end of the known tokens: sample one
  bool fresh_slot = false;  // the slot must be reset before this chunk runs
};

struct StepPlan {
  int64_t index = 0;  // set by the engine: plans are numbered in the order they are made
  std::vector<ScheduledChunk> chunks;
  std::vector<Request*> preempted;
  int64_t num_tokens() const;
  bool empty() const { return chunks.empty(); }
};

struct SchedulerLimits {
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 4096;
};

class Scheduler {
 public:
  Scheduler(SchedulerLimits limits, StateManager& states);

  void add(Request* request);
  // Removes a waiting or running request (not in flight); frees its state.
  void remove(Request* request);

  // Plans the next step. Requests marked in_flight cannot be preempted (their state is in
  // use); when memory is needed and only in-flight requests could give it, they are skipped.
  StepPlan schedule();

  // A request whose last planned token is known to be its last: output reached max_tokens
  // or the model length once the in-flight sample lands.
  bool done_generating(const Request& request) const;

  const std::vector<Request*>& running() const { return running_; }
  const std::deque<Request*>& waiting() const { return waiting_; }
  bool has_unfinished() const { return !running_.empty() || !waiting_.empty(); }

 private:
  bool make_room(Request& request, int64_t length, StepPlan& plan, int64_t& budget);
  void preempt(Request* victim, StepPlan& plan);

  SchedulerLimits limits_;
  StateManager& states_;
  std::vector<Request*> running_;  // admission order
  std::deque<Request*> waiting_;   // arrival order
};

}  // namespace deepinfer::engine
