// Engine tests on the toy model: every request, however it is batched, chunked, preempted or
// overlapped, must produce exactly the tokens of a plain one-request-at-a-time loop that
// recomputes the whole prefix each token (the oracle below shares only the toy model and the
// sampler with the engine).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "reference.h"

namespace deepinfer::engine {
namespace {

using testing::ToyRunner;

constexpr int64_t kVocab = 48;
constexpr int32_t kEos = 3;
constexpr int64_t kMaxLen = 96;

using testing::Expected;

Expected reference(const std::vector<int32_t>& prompt, const SamplingParams& params,
                   int64_t max_model_len) {
  return testing::reference({kVocab, {kEos}, max_model_len, nullptr}, prompt, params);
}

struct Case {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

std::vector<Case> mixed_cases(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Case> cases;
  for (int i = 0; i < count; ++i) {
    Case c;
    const int length = 1 + static_cast<int>(rng() % 40);
    for (int t = 0; t < length; ++t) c.prompt.push_back(static_cast<int32_t>(rng() % kVocab));
    c.params.seq_seed = rng();
    c.params.max_tokens = 1 + static_cast<int32_t>(rng() % 24);
    switch (i % 4) {
      case 0:
        c.params.temperature = 0.0f;
        break;
      case 1:
        c.params.temperature = 0.9f;
        c.params.top_k = 10;
        break;
      case 2:
        c.params.temperature = 1.3f;
        c.params.top_p = 0.8f;
        c.params.stop_token_ids = {7, 11};
        c.params.min_tokens = 2;
        break;
      default:
        c.params.temperature = 0.7f;
        c.params.ignore_eos = true;
        c.params.repetition_penalty = 1.2f;
        c.params.logprobs = 2;
        break;
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

EngineArgs small_args(bool async) {
  EngineArgs args;
  args.max_model_len = kMaxLen;
  args.max_num_seqs = 6;
  args.max_num_batched_tokens = 20;
  args.async_scheduling = async;
  return args;
}

std::unique_ptr<Engine> make_engine(const EngineArgs& args) {
  return std::make_unique<Engine>(args,
                                  std::make_unique<ToyRunner>(kVocab, std::vector{kEos}, 4096));
}

std::vector<RequestOutput> run_all(Engine& engine, const std::vector<Case>& cases) {
  std::vector<std::string> ids;
  for (const auto& c : cases) ids.push_back(engine.add_request(c.prompt, c.params));
  engine.run_to_completion();
  std::vector<RequestOutput> outputs;
  for (const auto& id : ids) outputs.push_back(engine.output(id));
  return outputs;
}

void expect_matches_reference(const std::vector<Case>& cases,
                              const std::vector<RequestOutput>& outputs, int64_t max_len) {
  ASSERT_EQ(outputs.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Expected want = reference(cases[i].prompt, cases[i].params, max_len);
    ASSERT_TRUE(outputs[i].finished) << i;
    ASSERT_FALSE(outputs[i].error) << *outputs[i].error;
    EXPECT_EQ(outputs[i].outputs[0].token_ids, want.tokens) << "request " << i;
    EXPECT_EQ(outputs[i].outputs[0].finish_reason, want.reason) << "request " << i;
    if (cases[i].params.logprobs) {
      ASSERT_TRUE(outputs[i].outputs[0].logprobs);
      EXPECT_EQ(outputs[i].outputs[0].logprobs->size(), want.tokens.size());
    }
  }
}

class EngineModes : public ::testing::TestWithParam<bool> {};

TEST_P(EngineModes, MixedRequestsMatchOneAtATimeReference) {
  const auto cases = mixed_cases(48, 1234);
  auto engine = make_engine(small_args(GetParam()));
  const auto outputs = run_all(*engine, cases);
  expect_matches_reference(cases, outputs, kMaxLen);
  // Continuous batching actually batched, and the pool is whole again.
  EXPECT_GT(engine->stats().max_running, 1);
  EXPECT_EQ(engine->free_state_tokens(), engine->state_capacity_tokens());
  EXPECT_EQ(engine->free_state_slots(), engine->num_state_slots());
}

TEST_P(EngineModes, PreemptionUnderTinyPoolGivesSameOutputs) {
  const auto cases = mixed_cases(24, 99);
  EngineArgs args = small_args(GetParam());
  args.state_pool_bytes = 8 * 100;  // 100 tokens for 6 slots of up to 96
  auto engine = make_engine(args);
  EXPECT_EQ(engine->state_capacity_tokens(), 100);
  const auto outputs = run_all(*engine, cases);
  EXPECT_GT(engine->stats().preemptions, 0);
  expect_matches_reference(cases, outputs, kMaxLen);
  EXPECT_EQ(engine->free_state_tokens(), 100);
  EXPECT_EQ(engine->free_state_slots(), engine->num_state_slots());
}

TEST_P(EngineModes, BadRequestsFailAloneWithClearErrors) {
  auto cases = mixed_cases(8, 7);
  auto engine = make_engine(small_args(GetParam()));
  std::vector<std::string> good_ids;
  SamplingParams nan_temperature;
  nan_temperature.temperature = std::numeric_limits<float>::quiet_NaN();
  SamplingParams negative_top_p;
  negative_top_p.top_p = -0.5f;
  SamplingParams too_many_samples;
  too_many_samples.n = 100000;
  struct Bad {
    std::vector<int32_t> prompt;
    SamplingParams params;
    std::string needle;
  };
  std::vector<Bad> bad = {
      {{}, SamplingParams{}, "prompt is empty"},
      {std::vector<int32_t>(kMaxLen, 5), SamplingParams{}, "max_model_len"},
      {{1, 2, static_cast<int32_t>(kVocab)}, SamplingParams{}, "outside the vocabulary"},
      {{1, 2}, nan_temperature, "temperature"},
      {{1, 2}, negative_top_p, "top_p"},
      {{1, 2}, too_many_samples, "n must be <= 256"},
  };
  std::vector<std::string> bad_ids;
  for (size_t i = 0; i < cases.size(); ++i) {
    good_ids.push_back(engine->add_request(cases[i].prompt, cases[i].params));
    if (i < bad.size()) bad_ids.push_back(engine->add_request(bad[i].prompt, bad[i].params));
  }
  engine->run_to_completion();
  for (size_t i = 0; i < bad.size(); ++i) {
    const auto out = engine->output(bad_ids[i]);
    ASSERT_TRUE(out.error) << i;
    EXPECT_NE(out.error->find(bad[i].needle), std::string::npos) << *out.error;
    EXPECT_EQ(out.outputs[0].finish_reason, FinishReason::kError);
    EXPECT_TRUE(out.outputs[0].token_ids.empty());
  }
  std::vector<RequestOutput> good;
  for (const auto& id : good_ids) good.push_back(engine->output(id));
  expect_matches_reference(cases, good, kMaxLen);
  EXPECT_EQ(engine->free_state_tokens(), engine->state_capacity_tokens());
}

TEST_P(EngineModes, AbortMidGenerationLeavesOthersIntact) {
  auto cases = mixed_cases(4, 5);
  for (auto& c : cases) {
    c.params.max_tokens = 30;
    c.params.ignore_eos = true;
    c.params.stop_token_ids.clear();
  }
  auto engine = make_engine(small_args(GetParam()));
  std::vector<std::string> ids;
  for (const auto& c : cases) ids.push_back(engine->add_request(c.prompt, c.params));
  while (engine->output(ids[1]).outputs[0].token_ids.size() < 5) engine->step();
  EXPECT_TRUE(engine->abort(ids[1]));
  EXPECT_FALSE(engine->abort(ids[1]));
  engine->run_to_completion();
  const auto aborted = engine->output(ids[1]);
  EXPECT_EQ(aborted.outputs[0].finish_reason, FinishReason::kAbort);
  const auto want = reference(cases[1].prompt, cases[1].params, kMaxLen);
  const auto& got = aborted.outputs[0].token_ids;
  ASSERT_GE(got.size(), 5u);
  ASSERT_LT(got.size(), want.tokens.size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.tokens.begin()));
  for (size_t i : {0u, 2u, 3u}) {
    EXPECT_EQ(engine->output(ids[i]).outputs[0].token_ids,
              reference(cases[i].prompt, cases[i].params, kMaxLen).tokens);
  }
  EXPECT_EQ(engine->free_state_tokens(), engine->state_capacity_tokens());
}

INSTANTIATE_TEST_SUITE_P(AsyncOnOff, EngineModes, ::testing::Bool());

TEST(Engine, StateSlotsBeyondMemoryFractionFailNamingIt) {
  // 6 slots of kMaxLen tokens at the toy's 8 bytes a token cannot fit 1e-12 of any machine's
  // free memory; an explicit state_pool_bytes is the caller's choice and is not checked.
  EngineArgs args = small_args(false);
  args.memory_fraction = 1e-12f;
  try {
    make_engine(args);
    ADD_FAILURE() << "the engine accepted state slots larger than memory_fraction allows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("memory_fraction"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("max_num_seqs 6"), std::string::npos) << e.what();
  }
  args.state_pool_bytes = 8 * 100;
  EXPECT_NO_THROW(make_engine(args));
}

TEST(Engine, RunsAreIdenticalAcrossRunsAndAsyncModes) {
  const auto cases = mixed_cases(32, 77);
  std::vector<std::vector<int32_t>> first;
  for (bool async : {true, false, true}) {
    auto engine = make_engine(small_args(async));
    const auto outputs = run_all(*engine, cases);
    std::vector<std::vector<int32_t>> tokens;
    for (const auto& out : outputs) tokens.push_back(out.outputs[0].token_ids);
    if (first.empty()) {
      first = tokens;
    } else {
      EXPECT_EQ(tokens, first);
    }
  }
}

TEST(Engine, AsyncSchedulingEnvironmentSwitch) {
  ::setenv("DEEPINFER_ASYNC_SCHEDULING", "0", 1);
  EXPECT_FALSE(EngineArgs{}.resolved().async_scheduling);
  ::setenv("DEEPINFER_ASYNC_SCHEDULING", "maybe", 1);
  EXPECT_THROW((void)EngineArgs{}.resolved(), Error);
  ::unsetenv("DEEPINFER_ASYNC_SCHEDULING");
  EXPECT_TRUE(EngineArgs{}.resolved().async_scheduling);
}

}  // namespace
}  // namespace deepinfer::engine
