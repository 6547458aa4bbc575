// Scheduler and state manager on their own: budgets, decode-first order, caps, preemption
// order and exact pool accounting, checked against hand-derived plans.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/scheduler.h"
#include "engine/state_manager.h"

namespace deepinfer::engine {
namespace {

std::unique_ptr<Request> make_request(int64_t order, size_t prompt_len) {
  auto request = std::make_unique<Request>();
  request->id = std::to_string(order);
  request->arrival_order = order;
  request->prompt.assign(prompt_len, 1);
  request->params.max_tokens = 100;
  return request;
}

// Marks a plan as executed, appending `token` for every sampling chunk.
void complete(StepPlan& plan) {
  for (auto& chunk : plan.chunks) {
    chunk.request->num_computed += chunk.num_tokens;
    if (chunk.samples) {
      chunk.request->sample_in_flight = false;
      chunk.request->output.push_back(2);
    }
  }
}

TEST(Scheduler, DecodeFirstThenChunkedPrefillUnderBudget) {
  StateManager states(4, 100, 400);
  Scheduler scheduler({4, 10, 100}, states);
  auto a = make_request(0, 3);
  auto b = make_request(1, 25);
  scheduler.add(a.get());
  scheduler.add(b.get());

  auto plan = scheduler.schedule();  // a: whole prompt (3), b: first 7
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].request, a.get());
  EXPECT_EQ(plan.chunks[0].num_tokens, 3);
  EXPECT_TRUE(plan.chunks[0].samples);
  EXPECT_EQ(plan.chunks[1].num_tokens, 7);
  EXPECT_FALSE(plan.chunks[1].samples);
  EXPECT_TRUE(plan.chunks[1].fresh_slot);
  complete(plan);

  plan = scheduler.schedule();  // a decodes first (1), b gets the remaining 9
  ASSERT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(plan.chunks[0].request, a.get());
  EXPECT_EQ(plan.chunks[0].num_tokens, 1);
  EXPECT_EQ(plan.chunks[0].start, 3);
  EXPECT_EQ(plan.chunks[1].start, 7);
  EXPECT_EQ(plan.chunks[1].num_tokens, 9);
  EXPECT_EQ(plan.num_tokens(), 10);
  EXPECT_EQ(states.free_tokens(), 400 - 4 - 16);
  complete(plan);
}

TEST(Scheduler, CapsRunningRequests) {
  StateManager states(8, 100, 800);
  Scheduler scheduler({2, 100, 100}, states);
  std::vector<std::unique_ptr<Request>> requests;
  for (int i = 0; i < 5; ++i) {
    requests.push_back(make_request(i, 4));
    scheduler.add(requests.back().get());
  }
  auto plan = scheduler.schedule();
  EXPECT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(scheduler.running().size(), 2u);
  EXPECT_EQ(scheduler.waiting().size(), 3u);
}

TEST(Scheduler, PreemptsNewestAndAccountsExactly) {
  StateManager states(3, 20, 20);
  Scheduler scheduler({3, 100, 20}, states);
  auto a = make_request(0, 8);
  auto b = make_request(1, 8);
  auto c = make_request(2, 3);
  for (auto* r : {a.get(), b.get(), c.get()}) scheduler.add(r);
  auto plan = scheduler.schedule();  // 8 + 8 + 3 = 19 of 20
  ASSERT_EQ(plan.chunks.size(), 3u);
  EXPECT_EQ(states.free_tokens(), 1);
  complete(plan);
  // Next: a needs 9 (ok: 1 free), b needs 9 -> c (newest) is preempted.
  plan = scheduler.schedule();
  ASSERT_EQ(plan.preempted.size(), 1u);
  EXPECT_EQ(plan.preempted[0], c.get());
  EXPECT_EQ(c->num_computed, 0);
  EXPECT_EQ(c->timings.num_preemptions, 1);
  EXPECT_EQ(c->slot, -1);
  EXPECT_EQ(plan.chunks.size(), 2u);
  EXPECT_EQ(states.free_tokens(), 20 - 18);
  EXPECT_EQ(scheduler.waiting().front(), c.get());
  complete(plan);
  for (auto* r : {a.get(), b.get(), c.get()}) scheduler.remove(r);
  EXPECT_EQ(states.free_tokens(), 20);
  EXPECT_EQ(states.free_slots(), 3);
}

}  // namespace
}  // namespace deepinfer::engine
