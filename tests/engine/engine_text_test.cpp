// Engine features that need a tokenizer, on the toy model over the first ids of the real
// DeepSeek tokenizer (models/default): detokenized text, stop strings (also spanning tokens),
// n > 1, skip_special_tokens, streaming deltas, structured outputs (checked with PCRE2, an
// independent matcher; std::regex trips GCC 12's -Wmaybe-uninitialized under ASan), per-request
// failures, and the async overlap of planning and masks with the forward. The oracle is
// reference.h's one-request loop with full decodes.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "deepinfer/llm.h"
#include "engine/engine.h"
#include "reference.h"

namespace deepinfer::engine {
namespace {

using testing::Expected;
using testing::ToyModel;
using testing::ToyRunner;

constexpr int64_t kVocab = 1024;  // the toy model speaks the tokenizer's first ids
constexpr int32_t kEos = 1;       // DeepSeek's <｜end▁of▁sentence｜>
constexpr int64_t kMaxLen = 128;

const std::string kModelDir = std::string(DEEPINFER_SOURCE_DIR) + "/models/default";

const tokenizer::Tokenizer& shared_tokenizer() {
  static const tokenizer::Tokenizer tokenizer = tokenizer::Tokenizer::from_dir(kModelDir);
  return tokenizer;
}

// PCRE2's verdict on `text` matching all of `pattern`.
bool pcre2_full_match(const std::string& pattern, const std::string& text) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), PCRE2_ZERO_TERMINATED,
                    PCRE2_ANCHORED | PCRE2_ENDANCHORED, &error, &offset, nullptr);
  EXPECT_NE(code, nullptr) << "PCRE2 rejects " << pattern;
  if (code == nullptr) return false;
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
  const int result = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0,
                                 match, nullptr);
  pcre2_match_data_free(match);
  pcre2_code_free(code);
  return result >= 0;
}

ToyModel toy_model() {
  return {kVocab, {kEos}, kMaxLen, &shared_tokenizer()};
}

EngineArgs small_args(bool async) {
  EngineArgs args;
  args.max_model_len = kMaxLen;
  args.max_num_seqs = 8;
  args.max_num_batched_tokens = 24;
  args.async_scheduling = async;
  return args;
}

std::unique_ptr<Engine> make_engine(const EngineArgs& args) {
  return std::make_unique<Engine>(
      args, std::make_unique<ToyRunner>(kVocab, std::vector{kEos}, 4096), shared_tokenizer());
}

struct Case {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

// 64 requests: lengths 1-40; greedy, top-k, top-p, min-p, penalties; stop strings, stop
// tokens, min_tokens, ignore_eos; n = 1..3; logprobs; special tokens kept or skipped.
std::vector<Case> mixed_cases(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  const std::vector<std::string> stops = {"e", "th", "in", " a", "s", "an", "."};
  std::vector<Case> cases;
  for (int i = 0; i < count; ++i) {
    Case c;
    const int length = 1 + static_cast<int>(rng() % 40);
    for (int t = 0; t < length; ++t) c.prompt.push_back(static_cast<int32_t>(rng() % kVocab));
    c.params.seq_seed = rng();
    c.params.max_tokens = 1 + static_cast<int32_t>(rng() % 24);
    switch (i % 6) {
      case 0:
        c.params.temperature = 0.0f;
        c.params.stop = {stops[rng() % stops.size()]};
        break;
      case 1:
        c.params.temperature = 0.9f;
        c.params.top_k = 10;
        c.params.n = 2;
        c.params.stop = {stops[rng() % stops.size()], stops[rng() % stops.size()]};
        break;
      case 2:
        c.params.temperature = 1.3f;
        c.params.top_p = 0.8f;
        c.params.stop_token_ids = {7, 11};
        c.params.min_tokens = std::min(2, *c.params.max_tokens);
        break;
      case 3:
        c.params.temperature = 0.7f;
        c.params.ignore_eos = true;
        c.params.repetition_penalty = 1.2f;
        c.params.logprobs = 2;
        c.params.n = 3;
        break;
      case 4:
        c.params.temperature = 1.0f;
        c.params.min_p = 0.1f;
        c.params.presence_penalty = 0.5f;
        c.params.skip_special_tokens = false;
        break;
      default:
        c.params.temperature = 0.8f;
        c.params.frequency_penalty = 0.3f;
        c.params.stop = {stops[rng() % stops.size()]};
        break;
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

void expect_matches_reference(const std::vector<Case>& cases,
                              const std::vector<RequestOutput>& outputs) {
  ASSERT_EQ(outputs.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(outputs[i].finished) << i;
    ASSERT_FALSE(outputs[i].error) << *outputs[i].error;
    ASSERT_EQ(outputs[i].outputs.size(), static_cast<size_t>(cases[i].params.n)) << i;
    for (int32_t j = 0; j < cases[i].params.n; ++j) {
      const Expected want = testing::reference(toy_model(), cases[i].prompt, cases[i].params,
                                               static_cast<uint32_t>(j));
      const CompletionOutput& got = outputs[i].outputs[static_cast<size_t>(j)];
      EXPECT_EQ(got.index, j);
      EXPECT_EQ(got.token_ids, want.tokens) << "request " << i << "." << j;
      EXPECT_EQ(got.finish_reason, want.reason) << "request " << i << "." << j;
      EXPECT_EQ(got.text, want.text) << "request " << i << "." << j;
      EXPECT_EQ(got.stop_reason, want.stop_reason) << "request " << i << "." << j;
      if (cases[i].params.logprobs) {
        ASSERT_TRUE(got.logprobs);
        EXPECT_EQ(got.logprobs->size(), want.tokens.size());
      }
    }
  }
}

std::vector<RequestOutput> run_all(Engine& engine, const std::vector<Case>& cases) {
  std::vector<std::string> ids;
  for (const auto& c : cases) ids.push_back(engine.add_request(c.prompt, c.params));
  engine.run_to_completion();
  std::vector<RequestOutput> outputs;
  for (const auto& id : ids) outputs.push_back(engine.output(id));
  return outputs;
}

class TextModes : public ::testing::TestWithParam<bool> {};

TEST_P(TextModes, SixtyFourMixedRequestsMatchEachAlone) {
  const auto cases = mixed_cases(64, 2024);
  auto engine = make_engine(small_args(GetParam()));
  const auto outputs = run_all(*engine, cases);
  expect_matches_reference(cases, outputs);
  EXPECT_GT(engine->stats().max_running, 1);
  EXPECT_EQ(engine->free_state_tokens(), engine->state_capacity_tokens());
  // The workload really exercised stop strings and n > 1.
  int stopped_by_string = 0;
  for (const auto& out : outputs) {
    for (const auto& completion : out.outputs) {
      if (completion.stop_reason && completion.stop_reason->size() <= 2 &&
          !std::isdigit(static_cast<unsigned char>((*completion.stop_reason)[0]))) {
        ++stopped_by_string;
      }
    }
  }
  EXPECT_GT(stopped_by_string, 3);
}

TEST_P(TextModes, PreemptionUnderTinyPoolGivesSameOutputs) {
  const auto cases = mixed_cases(24, 31);
  EngineArgs args = small_args(GetParam());
  args.state_pool_bytes = 8 * 150;  // 150 tokens for 8 slots of up to 128
  auto engine = make_engine(args);
  const auto outputs = run_all(*engine, cases);
  EXPECT_GT(engine->stats().preemptions, 0);
  expect_matches_reference(cases, outputs);
  EXPECT_EQ(engine->free_state_tokens(), engine->state_capacity_tokens());
}

INSTANTIATE_TEST_SUITE_P(AsyncOnOff, TextModes, ::testing::Bool());

// One engine, several rounds of add / run / release (what LLM::generate does): the plan made
// during a round's last step must not survive the released requests (it did once, and the
// next round reused their memory and ids).
TEST(EngineText, RepeatedRoundsOnOneEngineMatchTheReference) {
  auto cases = mixed_cases(8, 404);
  for (size_t i = 0; i < cases.size(); i += 3) {
    cases[i].params.so_args = StructuredOutputArgs{"regex", "[a-z ]{1,12}"};
    cases[i].params.stop.clear();
  }
  auto engine = make_engine(small_args(true));
  for (int round = 0; round < 3; ++round) {
    std::vector<std::string> ids;
    for (size_t i = 0; i < cases.size(); ++i) {
      ids.push_back(engine->add_request(cases[i].prompt, cases[i].params, std::to_string(i)));
    }
    engine->run_to_completion();
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto out = engine->output(ids[i]);
      ASSERT_FALSE(out.error) << round << ": " << *out.error;
      if (!cases[i].params.so_args) {
        const Expected want = testing::reference(toy_model(), cases[i].prompt, cases[i].params);
        EXPECT_EQ(out.outputs[0].token_ids, want.tokens) << round << " " << i;
      }
      engine->release(ids[i]);
    }
    EXPECT_EQ(engine->free_state_tokens(), engine->state_capacity_tokens());
  }
}

TEST(EngineText, IdenticalAcrossRunsAndModes) {
  const auto cases = mixed_cases(32, 5);
  std::vector<std::vector<std::string>> first;
  for (bool async : {true, false, true}) {
    auto engine = make_engine(small_args(async));
    std::vector<std::vector<std::string>> texts;
    for (const auto& out : run_all(*engine, cases)) {
      std::vector<std::string> completions;
      for (const auto& c : out.outputs) completions.push_back(c.text);
      texts.push_back(completions);
    }
    if (first.empty()) {
      first = texts;
    } else {
      EXPECT_EQ(texts, first);
    }
  }
}

// Finds a stop string that straddles the boundary between two output tokens of an
// unconstrained run, then checks the engine stops exactly there and cuts the text before it.
TEST(EngineText, StopStringsSpanningTokens) {
  const ToyModel model = toy_model();
  int checked = 0;
  for (uint64_t seed = 1; seed < 40 && checked < 6; ++seed) {
    Case c;
    c.prompt = {static_cast<int32_t>(100 + seed), 200, 300};
    c.params.seq_seed = seed;
    c.params.temperature = 0.8f;
    c.params.max_tokens = 24;
    c.params.ignore_eos = true;
    const Expected free_run = testing::reference(model, c.prompt, c.params);
    // Boundary k: text of k tokens, then token k adds more; both sides ASCII letters/spaces.
    std::optional<std::string> stop;
    size_t cut = 0;
    for (size_t k = 2; k + 1 < free_run.tokens.size() && !stop; ++k) {
      const std::string before =
          shared_tokenizer().decode(std::span(free_run.tokens).first(k), true);
      const std::string after =
          shared_tokenizer().decode(std::span(free_run.tokens).first(k + 1), true);
      if (before.size() < 2 || after.size() < before.size() + 2) continue;
      const std::string candidate = after.substr(before.size() - 2, 4);
      const bool ascii = std::all_of(candidate.begin(), candidate.end(),
                                     [](char ch) { return ch >= 32 && ch < 127; });
      if (!ascii || after.find(candidate) != before.size() - 2) continue;
      stop = candidate;
      cut = before.size() - 2;
    }
    if (!stop) continue;
    c.params.stop = {*stop};
    auto engine = make_engine(small_args(seed % 2 == 0));
    const auto out = run_all(*engine, {c})[0];
    const Expected want = testing::reference(model, c.prompt, c.params);
    EXPECT_EQ(out.outputs[0].finish_reason, FinishReason::kStop);
    EXPECT_EQ(out.outputs[0].stop_reason, *stop);
    EXPECT_EQ(out.outputs[0].text, free_run.text.substr(0, cut));
    EXPECT_EQ(out.outputs[0].token_ids, want.tokens);
    EXPECT_EQ(out.outputs[0].text.find(*stop), std::string::npos);
    ++checked;
  }
  EXPECT_GE(checked, 3);
}

TEST(EngineText, StreamingDeltasAddUpToTheFinalOutputAndHoldBackStopStrings) {
  const auto cases = mixed_cases(12, 77);
  EngineArgs args = small_args(true);
  args.tokenizer = kModelDir;
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  for (const auto& c : cases) {
    prompts.emplace_back(c.prompt);
    params.push_back(c.params);
  }
  LLM whole(args, std::make_unique<ToyRunner>(kVocab, std::vector{kEos}, 4096));
  const auto expected = whole.generate(prompts, params);
  LLM streaming(args, std::make_unique<ToyRunner>(kVocab, std::vector{kEos}, 4096));
  std::vector<std::vector<CompletionOutput>> merged(cases.size());
  std::vector<int> finals(cases.size(), 0);
  auto stream = streaming.stream(prompts, params);
  int deltas = 0;
  while (auto batch = stream.next()) {
    for (const auto& delta : *batch) {
      const size_t i = std::stoul(delta.request_id);
      auto& into = merged[i];
      into.resize(static_cast<size_t>(cases[i].params.n));
      for (const auto& part : delta.outputs) {
        auto& completion = into[static_cast<size_t>(part.index)];
        completion.text += part.text;
        // Text already delivered can never contain a stop string.
        for (const auto& stop : cases[i].params.stop) {
          EXPECT_EQ(completion.text.find(stop), std::string::npos) << i;
        }
        completion.token_ids.insert(completion.token_ids.end(), part.token_ids.begin(),
                                    part.token_ids.end());
        completion.finish_reason = part.finish_reason;
        ++deltas;
      }
      finals[i] += delta.finished ? 1 : 0;
    }
  }
  EXPECT_GT(deltas, static_cast<int>(cases.size()) * 2);  // tokens arrived in pieces
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(finals[i], 1) << i;
    ASSERT_EQ(merged[i].size(), expected[i].outputs.size());
    for (size_t j = 0; j < merged[i].size(); ++j) {
      EXPECT_EQ(merged[i][j].text, expected[i].outputs[j].text) << i;
      EXPECT_EQ(merged[i][j].token_ids, expected[i].outputs[j].token_ids) << i;
      EXPECT_EQ(merged[i][j].finish_reason, expected[i].outputs[j].finish_reason) << i;
    }
  }
}

TEST(EngineText, RegexConstrainedOutputsMatchPcre2) {
  const std::string pattern = "[a-z]{1,6}( [a-z]{1,6}){0,2}\\.";
  auto engine = make_engine(small_args(true));
  std::vector<std::string> ids;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    SamplingParams params;
    params.seq_seed = seed;
    params.temperature = seed == 0 ? 0.0f : 1.0f;
    params.max_tokens = 64;
    params.so_args = StructuredOutputArgs{"regex", pattern};
    ids.push_back(engine->add_request({static_cast<int32_t>(50 + seed), 60}, params));
  }
  engine->run_to_completion();
  for (const auto& id : ids) {
    const auto out = engine->output(id);
    ASSERT_FALSE(out.error) << *out.error;
    // The language is finite, so the grammar must have forced EOS before max_tokens.
    EXPECT_EQ(out.outputs[0].finish_reason, FinishReason::kStop) << id;
    EXPECT_TRUE(pcre2_full_match(pattern, out.outputs[0].text))
        << '"' << out.outputs[0].text << '"';
  }
}

TEST(EngineText, BadRequestsFailAloneWithClearErrors) {
  EngineArgs args = small_args(true);
  args.tokenizer = kModelDir;
  LLM llm(args, std::make_unique<ToyRunner>(kVocab, std::vector{kEos}, 4096));
  SamplingParams good;
  good.seq_seed = 3;
  good.max_tokens = 6;
  const auto with_so = [&](std::string type, std::string schema) {
    SamplingParams p = good;
    p.so_args = StructuredOutputArgs{std::move(type), std::move(schema)};
    return p;
  };
  SamplingParams nan_top_p = good;
  nan_top_p.top_p = std::numeric_limits<float>::quiet_NaN();
  SamplingParams negative_penalty = good;
  negative_penalty.repetition_penalty = -1.0f;
  SamplingParams too_many = good;
  too_many.n = 100000;
  const Conversation unknown_role = {{"wizard", "hello"}};
  struct Bad {
    Prompt prompt;
    SamplingParams params;
    std::string needle;
  };
  const std::vector<Bad> bad = {
      {std::vector<int32_t>{}, good, "prompt is empty"},
      {std::vector<int32_t>(kMaxLen + 5, 40), good, "max_model_len"},
      {std::vector<int32_t>{5, 6}, nan_top_p, "top_p"},
      {std::vector<int32_t>{5, 6}, negative_penalty, "repetition_penalty"},
      {std::vector<int32_t>{5, 6}, too_many, "n must be <= 256"},
      {std::vector<int32_t>{5, 6}, with_so("yaml", "a: b"), "schema_type"},
      {std::vector<int32_t>{5, 6}, with_so("json", "{\"type\": "), "so_args"},
      {std::vector<int32_t>{5, 6}, with_so("regex", "(ab"), "so_args"},
      {unknown_role, good, "wizard"},
  };
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  for (const auto& b : bad) {
    prompts.push_back(std::vector<int32_t>{7, 8, 9});
    params.push_back(good);
    prompts.push_back(b.prompt);
    params.push_back(b.params);
  }
  const auto outputs = llm.generate(prompts, params);
  const Expected want = testing::reference(toy_model(), {7, 8, 9}, good);
  for (size_t i = 0; i < bad.size(); ++i) {
    const auto& ok = outputs[2 * i];
    ASSERT_FALSE(ok.error) << *ok.error;
    EXPECT_EQ(ok.outputs[0].token_ids, want.tokens);
    const auto& failed = outputs[2 * i + 1];
    ASSERT_TRUE(failed.error) << i;
    EXPECT_NE(failed.error->find(bad[i].needle), std::string::npos) << *failed.error;
    EXPECT_EQ(failed.outputs.at(0).finish_reason, FinishReason::kError);
  }
}

// The toy model with a hook after each forward (sees the step index and the logits).
class HookedRunner final : public ModelRunner {
 public:
  HookedRunner(int64_t vocab, std::function<void(int64_t step, std::span<float> logits)> hook)
      : toy_(vocab, {kEos}, 4096), hook_(std::move(hook)) {}
  int64_t vocab_size() const override { return toy_.vocab_size(); }
  std::vector<int32_t> eos_token_ids() const override { return toy_.eos_token_ids(); }
  int64_t max_model_len() const override { return toy_.max_model_len(); }
  int64_t state_bytes_per_token() const override { return toy_.state_bytes_per_token(); }
  void allocate_slots(int32_t slots, int64_t tokens, int64_t step_tokens) override {
    toy_.allocate_slots(slots, tokens, step_tokens);
  }
  void reset_slot(int32_t slot) override { toy_.reset_slot(slot); }
  void forward(std::span<const SlotTokens> batch, std::span<const int64_t> rows,
               std::span<float> logits) override {
    toy_.forward(batch, rows, logits);
    hook_(step_, logits);
  }
  int64_t step_ = -1;

 private:
  ToyRunner toy_;
  std::function<void(int64_t, std::span<float>)> hook_;
};

// Model rows past the tokenizer (vocabulary padding, as the default model's 129280 rows over
// 128815 tokens) are never sampled, even when they hold the largest logits.
TEST(EngineText, PaddedVocabularyRowsAreNeverSampled) {
  const int32_t real = shared_tokenizer().vocab_size();
  const int64_t padded = real + 40;
  auto runner = std::make_unique<HookedRunner>(padded, [&](int64_t, std::span<float> logits) {
    for (size_t row = 0; row < logits.size() / static_cast<size_t>(padded); ++row) {
      for (int64_t id = real; id < padded; ++id) {
        logits[row * static_cast<size_t>(padded) + static_cast<size_t>(id)] = 50.0f;
      }
    }
  });
  Engine engine(small_args(true), std::move(runner), shared_tokenizer());
  std::vector<std::string> ids;
  for (uint64_t seed = 0; seed < 3; ++seed) {
    SamplingParams params;
    params.seq_seed = seed;
    params.temperature = seed == 0 ? 0.0f : 1.5f;
    params.max_tokens = 6;
    params.logprobs = 3;
    ids.push_back(engine.add_request({5, 6, 7}, params));
  }
  engine.run_to_completion();
  for (const auto& id : ids) {
    const auto out = engine.output(id);
    ASSERT_FALSE(out.error) << *out.error;
    ASSERT_EQ(out.outputs[0].token_ids.size(), 6u);
    for (int32_t token : out.outputs[0].token_ids) EXPECT_LT(token, real);
    for (const auto& position : *out.outputs[0].logprobs) {
      for (const auto& top : position.top) EXPECT_LT(top.token_id, real);
    }
  }
}

// The async loop plans step N+1 and computes step N's grammar masks while step N's forward
// runs: a runner whose forward for step N does not return until the engine thread has
// reported both proves it (a sync loop would wait forever; the wait gives up after 20 s).
TEST(EngineText, AsyncPlanningAndMasksOverlapTheForward) {
  std::mutex mutex;
  std::condition_variable changed;
  std::set<std::pair<StepEvent, int64_t>> seen;
  std::vector<std::pair<StepEvent, int64_t>> order;
  bool timed_out = false;
  HookedRunner* runner = nullptr;
  auto blocking = std::make_unique<HookedRunner>(kVocab, [&](int64_t step, std::span<float>) {
    std::unique_lock lock(mutex);
    const bool done = changed.wait_for(lock, std::chrono::seconds(20), [&] {
      return seen.count({StepEvent::kPlanned, step + 1}) &&
             seen.count({StepEvent::kMasksReady, step});
    });
    timed_out = timed_out || !done;
    order.push_back({StepEvent::kForwardEnd, step});
  });
  runner = blocking.get();
  Engine engine(small_args(true), std::move(blocking), shared_tokenizer());
  engine.set_step_observer([&](StepEvent event, int64_t index) {
    std::lock_guard lock(mutex);
    if (event == StepEvent::kForwardBegin) runner->step_ = index;
    if (event == StepEvent::kForwardEnd) return;  // recorded by the runner
    seen.insert({event, index});
    order.push_back({event, index});
    changed.notify_all();
  });
  SamplingParams params;
  params.seq_seed = 9;
  params.max_tokens = 8;
  params.so_args = StructuredOutputArgs{"regex", "[a-z ]{1,20}"};
  engine.add_request({10, 20, 30}, params);
  params.so_args.reset();
  engine.add_request({11, 21}, params);
  engine.run_to_completion();
  EXPECT_FALSE(timed_out);
  int64_t forwards = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i].first != StepEvent::kForwardEnd) continue;
    ++forwards;
    const int64_t step = order[i].second;
    // Both happened before this forward returned.
    const auto before = [&](StepEvent event, int64_t index) {
      return std::find(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(i),
                       std::pair{event, index}) != order.begin() + static_cast<std::ptrdiff_t>(i);
    };
    EXPECT_TRUE(before(StepEvent::kPlanned, step + 1)) << step;
    EXPECT_TRUE(before(StepEvent::kMasksReady, step)) << step;
  }
  EXPECT_GE(forwards, 8);
}

}  // namespace
}  // namespace deepinfer::engine
