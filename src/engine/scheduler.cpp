#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer::engine {

int64_t StepPlan::num_tokens() const {
  int64_t total = 0;
  for (const auto& chunk : chunks) total += chunk.num_tokens;
  return total;
}

Scheduler::Scheduler(SchedulerLimits limits, StateManager& states)
    : limits_(limits), states_(states) {}

void Scheduler::add(Request* request) {
  request->status = RequestStatus::kWaiting;
  auto position = std::find_if(waiting_.begin(), waiting_.end(), [&](const Request* other) {
    return other->arrival_order > request->arrival_order;
  });
  waiting_.insert(position, request);
}

void Scheduler::remove(Request* request) {
  DI_CHECK(!request->in_flight, "remove of a request in flight: ", request->id);
  std::erase(running_, request);
  std::erase(waiting_, request);
  states_.release(*request);
}

bool Scheduler::done_generating(const Request& request) const {
  const auto outputs =
      static_cast<int64_t>(request.output.size()) + (request.sample_in_flight ? 1 : 0);
  if (request.params.max_tokens && outputs >= *request.params.max_tokens) return true;
  return request.known_length() >= limits_.max_model_len;
}

void Scheduler::preempt(Request* victim, StepPlan& plan) {
  std::erase(running_, victim);
  states_.release(*victim);
  victim->num_computed = 0;
  victim->num_scheduled = 0;
  victim->timings.num_preemptions += 1;
  add(victim);
  plan.preempted.push_back(victim);
}

// Grows `request`'s reservation to `length` by preempting the newest running requests that
// are newer than it and not in flight (dropping their chunks from this plan). False when even
// that is not enough.
bool Scheduler::make_room(Request& request, int64_t length, StepPlan& plan, int64_t& budget) {
  while (!states_.reserve(request, length)) {
    Request* victim = nullptr;
    for (Request* other : running_) {
      if (other == &request || other->in_flight || other->arrival_order < request.arrival_order) {
        continue;
      }
      if (victim == nullptr || other->arrival_order > victim->arrival_order) victim = other;
    }
    if (victim == nullptr) return false;
    for (auto it = plan.chunks.begin(); it != plan.chunks.end(); ++it) {
      if (it->request != victim) continue;
      budget += it->num_tokens;
      plan.chunks.erase(it);
      break;
    }
    preempt(victim, plan);
  }
  return true;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int64_t budget = limits_.max_num_batched_tokens;

  auto plan_running = [&](bool decode_pass) {
    const std::vector<Request*> snapshot = running_;
    for (Request* request : snapshot) {
      if (budget <= 0) break;
      if (request->status != RequestStatus::kRunning || done_generating(*request)) continue;
      const int64_t needed = request->known_length() - request->num_scheduled;
      if (needed <= 0 || (needed == 1) != decode_pass) continue;
      const int64_t take = std::min(needed, budget);
      if (!make_room(*request, request->num_scheduled + take, plan, budget)) {
        // Everything that could give way is older or in flight: this request gives way.
        if (!request->in_flight) preempt(request, plan);
        continue;
      }
      plan.chunks.push_back(
          {request, request->num_scheduled, static_cast<int32_t>(take), take == needed, false});
      budget -= take;
    }
  };
  plan_running(true);
  plan_running(false);

  // Admit waiting requests, oldest first, unless this step had to preempt.
  while (plan.preempted.empty() && budget > 0 && !waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < limits_.max_num_seqs) {
    Request* request = waiting_.front();
    if (!states_.acquire_slot(*request)) break;
    const int64_t needed = request->known_length() - request->num_scheduled;
    const int64_t take = std::min(needed, budget);
    if (!states_.reserve(*request, take)) {
      states_.release(*request);
      break;
    }
    waiting_.pop_front();
    request->status = RequestStatus::kRunning;
    running_.push_back(request);
    plan.chunks.push_back({request, 0, static_cast<int32_t>(take), take == needed, true});
    budget -= take;
  }

  for (auto& chunk : plan.chunks) {
    chunk.request->num_scheduled += chunk.num_tokens;
    if (chunk.samples) chunk.request->sample_in_flight = true;
  }
  return plan;
}

}  // namespace deepinfer::engine
