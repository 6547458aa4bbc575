// The forward's mode invariance: whole-prompt prefill, chunked prefill at arbitrary boundaries
// and token-by-token decode give the same logits (1e-5 relative), for several requests batched
// together at different positions, in both numerics; a request's logits do not depend on what
// else is in the batch; rollback restores the exact state.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "model/deepseek_v41/model.h"
#include "random_model.h"

namespace deepinfer::deepseek_v41 {
namespace {

using testing::WeightFormat;

struct Fixture {
  DeepseekV41TextConfig config;
  std::shared_ptr<EngramHasher> hasher;
  std::unique_ptr<ModelParameters> parameters;
  std::unique_ptr<Model> model;

  Fixture(const std::string& overrides, WeightFormat format, Numerics numerics, uint32_t seed = 1)
      : config(testing::tiny_config(overrides)) {
    if (!config.engram_layer_ids.empty()) hasher = testing::tiny_hasher(config, seed);
    parameters = testing::random_parameters(config, seed, format);
    model = std::make_unique<Model>(config, *parameters, numerics, hasher);
  }
  StateLimits limits() const { return {256, 8}; }
};

std::vector<int32_t> random_tokens(int64_t count, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  return tokens;
}

// Runs each prompt through `schedule(prompt index, step)` -> chunk length (0 = done), batching
// all requests that still have tokens in each step. Returns every position's logits per prompt.
std::vector<std::vector<float>> run(Fixture& f, const std::vector<std::vector<int32_t>>& prompts,
                                    const std::function<int64_t(size_t, int64_t)>& chunk) {
  const int64_t vocab = f.config.vocab_size;
  std::vector<std::unique_ptr<RequestState>> states;
  std::vector<std::vector<float>> logits(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    states.push_back(std::make_unique<RequestState>(f.config, f.limits()));
    logits[i].resize(prompts[i].size() * static_cast<size_t>(vocab));
  }
  for (int64_t step = 0;; ++step) {
    std::vector<ForwardRequest> requests;
    std::vector<size_t> which;
    int64_t total = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t done = states[i]->length();
      const int64_t left = static_cast<int64_t>(prompts[i].size()) - done;
      if (left == 0) continue;
      const int64_t count = std::min(left, std::max<int64_t>(1, chunk(i, step)));
      requests.push_back({states[i].get(), {prompts[i].data() + done, static_cast<size_t>(count)}});
      which.push_back(i);
      total += count;
    }
    if (requests.empty()) break;
    std::vector<float> out(static_cast<size_t>(total * vocab));
    std::vector<int64_t> starts;
    for (auto& r : requests) starts.push_back(r.state->length());
    f.model->forward(requests, TensorView::contiguous(out.data(), DType::kF32, {total, vocab}));
    int64_t row = 0;
    for (size_t j = 0; j < requests.size(); ++j) {
      for (size_t t = 0; t < requests[j].tokens.size(); ++t, ++row) {
        std::copy_n(out.data() + row * vocab, vocab,
                    logits[which[j]].data() + (starts[j] + static_cast<int64_t>(t)) * vocab);
      }
    }
  }
  return logits;
}

double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, worst = 0;
  for (float v : b) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  return worst / scale;
}

class ModeInvarianceTest : public ::testing::TestWithParam<std::tuple<WeightFormat, Numerics>> {};

TEST_P(ModeInvarianceTest, PrefillChunkedAndDecodeAgree) {
  const auto [format, numerics] = GetParam();
  Fixture f("{}", format, numerics);
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(41, f.config.vocab_size, 7),
                                                     random_tokens(23, f.config.vocab_size, 8),
                                                     random_tokens(30, f.config.vocab_size, 9)};
  const auto prefill = run(f, prompts, [](size_t, int64_t) { return 1 << 20; });
  const auto decode = run(f, prompts, [](size_t, int64_t) { return 1; });
  // Chunk lengths that land mid compress-group, mid candidate block and across the window.
  const auto chunked = run(f, prompts, [](size_t i, int64_t step) {
    static const int64_t lengths[] = {5, 3, 1, 7, 2, 9, 4};
    return lengths[(step + static_cast<int64_t>(i)) % 7];
  });
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_LT(max_relative_difference(decode[i], prefill[i]), 1e-5) << "prompt " << i;
    EXPECT_LT(max_relative_difference(chunked[i], prefill[i]), 1e-5) << "prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Numerics, ModeInvarianceTest,
    ::testing::Values(std::make_tuple(WeightFormat::kDense, Numerics::kDense),
                      std::make_tuple(WeightFormat::kReleased, Numerics::kDense),
                      std::make_tuple(WeightFormat::kReleased, Numerics::kReleased)));

TEST(ForwardTest, ARequestsLogitsDoNotDependOnTheRestOfTheBatch) {
  Fixture f("{}", WeightFormat::kDense, Numerics::kDense);
  const auto a = random_tokens(19, f.config.vocab_size, 11);
  const auto b = random_tokens(33, f.config.vocab_size, 12);
  const auto alone = run(f, {a}, [](size_t, int64_t) { return 1 << 20; });
  const auto together = run(f, {b, a}, [](size_t, int64_t) { return 1 << 20; });
  EXPECT_EQ(alone[0], together[1]);  // bit-identical: batch invariance
}

TEST(ForwardTest, RequestsAtDifferentPositionsInOneStepEqualEachAlone) {
  // One step holding a long request's decode token and a new request's first tokens: their
  // compressed entries differ (ratio 2: 20 groups against 0 or 1; ratio 1: 41 against 1 or 3,
  // fewer than index_topk), so the step's shared score matrix is ragged and the short request's
  // selections are padded. Each request's logits must be exactly its logits alone.
  for (const Numerics numerics : {Numerics::kDense, Numerics::kReleased}) {
    Fixture f("{}", WeightFormat::kReleased, numerics);
    const int64_t vocab = f.config.vocab_size;
    const auto history = random_tokens(40, vocab, 31);
    const auto next = random_tokens(1, vocab, 32);
    for (const int64_t fresh_count : {1, 3}) {
      const auto fresh = random_tokens(fresh_count, vocab, 33);
      auto step = [&](bool with_long, bool with_fresh) {
        RequestState long_state(f.config, f.limits());
        RequestState fresh_state(f.config, f.limits());
        std::vector<float> ignored(history.size() * static_cast<size_t>(vocab));
        const ForwardRequest prefill{&long_state, history};
        f.model->forward({&prefill, 1},
                         TensorView::contiguous(ignored.data(), DType::kF32,
                                                {static_cast<int64_t>(history.size()), vocab}));
        std::vector<ForwardRequest> requests;
        if (with_long) requests.push_back({&long_state, next});
        if (with_fresh) requests.push_back({&fresh_state, fresh});
        const int64_t rows = (with_long ? 1 : 0) + (with_fresh ? fresh_count : 0);
        std::vector<float> logits(static_cast<size_t>(rows * vocab));
        f.model->forward(requests,
                         TensorView::contiguous(logits.data(), DType::kF32, {rows, vocab}));
        return logits;
      };
      const auto both = step(true, true);
      const auto long_alone = step(true, false);
      const auto fresh_alone = step(false, true);
      EXPECT_TRUE(std::equal(long_alone.begin(), long_alone.end(), both.begin()))
          << "long request, fresh request of " << fresh_count;
      EXPECT_TRUE(std::equal(fresh_alone.begin(), fresh_alone.end(),
                             both.begin() + static_cast<int64_t>(vocab)))
          << "fresh request of " << fresh_count;
    }
  }
}

TEST(ForwardTest, SelectedLogitRowsEqualThoseRowsOfTheFullLogits) {
  // Released numerics: the head runs on the same linear either way, so the rows must be the
  // full call's bit for bit, in the order asked (repeats allowed).
  Fixture f("{}", WeightFormat::kReleased, Numerics::kReleased);
  const int64_t vocab = f.config.vocab_size;
  const auto a = random_tokens(17, vocab, 21);
  const auto b = random_tokens(9, vocab, 22);
  const int64_t total = 26;
  auto step = [&](const std::function<void(std::span<const ForwardRequest>)>& call) {
    RequestState sa(f.config, f.limits());
    RequestState sb(f.config, f.limits());
    const ForwardRequest requests[] = {{&sa, a}, {&sb, b}};
    call(requests);
  };
  std::vector<float> full(static_cast<size_t>(total * vocab));
  step([&](std::span<const ForwardRequest> requests) {
    f.model->forward(requests, TensorView::contiguous(full.data(), DType::kF32, {total, vocab}));
  });
  const std::vector<int32_t> rows = {25, 16, 0, 16};
  std::vector<float> selected(rows.size() * static_cast<size_t>(vocab));
  step([&](std::span<const ForwardRequest> requests) {
    f.model->forward(requests, rows,
                     TensorView::contiguous(selected.data(), DType::kF32,
                                            {static_cast<int64_t>(rows.size()), vocab}));
  });
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto first = full.begin() + rows[i] * vocab;
    EXPECT_TRUE(
        std::equal(first, first + vocab, selected.begin() + static_cast<int64_t>(i) * vocab))
        << "row " << rows[i];
  }
  // A row outside the step is refused before anything runs.
  const std::vector<int32_t> bad = {26};
  std::vector<float> one(static_cast<size_t>(vocab));
  RequestState state(f.config, f.limits());
  const ForwardRequest request{&state, a};
  EXPECT_THROW(f.model->forward({&request, 1}, bad,
                                TensorView::contiguous(one.data(), DType::kF32, {1, vocab})),
               Error);
  EXPECT_EQ(state.length(), 0);
}

TEST(ForwardTest, RollbackRestoresTheStateExactly) {
  Fixture f("{}", WeightFormat::kDense, Numerics::kDense);
  const int64_t vocab = f.config.vocab_size;
  const auto prompt = random_tokens(21, vocab, 13);
  const auto rejected = random_tokens(6, vocab, 14);
  const auto accepted = random_tokens(5, vocab, 15);
  auto logits_for = [&](RequestState& state, const std::vector<int32_t>& tokens) {
    std::vector<float> out(tokens.size() * static_cast<size_t>(vocab));
    ForwardRequest request{&state, tokens};
    f.model->forward({&request, 1},
                     TensorView::contiguous(out.data(), DType::kF32,
                                            {static_cast<int64_t>(tokens.size()), vocab}));
    return out;
  };
  RequestState speculative(f.config, f.limits());
  logits_for(speculative, prompt);
  logits_for(speculative, rejected);  // a verify pass whose drafts are all rejected
  speculative.rollback(static_cast<int64_t>(rejected.size()));
  EXPECT_EQ(speculative.length(), 21);
  const auto after_rollback = logits_for(speculative, accepted);

  RequestState plain(f.config, f.limits());
  logits_for(plain, prompt);
  const auto expected = logits_for(plain, accepted);
  EXPECT_EQ(after_rollback, expected);
  EXPECT_THROW(plain.rollback(9), Error);  // beyond max_rollback
}

TEST(ForwardTest, StateBytesAreWhatTheStateAllocates) {
  Fixture f("{}", WeightFormat::kDense, Numerics::kDense);
  for (const StateLimits limits : {StateLimits{256, 8}, StateLimits{37, 0}, StateLimits{1, 3}}) {
    const RequestState state(f.config, limits);
    int64_t allocated = 0;
    for (int64_t layer = 0; layer < f.config.num_hidden_layers; ++layer) {
      allocated += static_cast<int64_t>(state.window(layer).nbytes());
    }
    for (int64_t layer : f.config.kv_source_layer_ids) {
      allocated += static_cast<int64_t>(
          state.compressed_kv(layer).nbytes() + state.index_keys(layer).nbytes() +
          state.pending_kv(layer).nbytes() + state.pending_gate(layer).nbytes());
    }
    EXPECT_EQ(RequestState::bytes(f.config, limits), allocated) << limits.max_tokens;
  }
}

TEST(ForwardTest, BadInputsFailClearly) {
  Fixture f("{}", WeightFormat::kDense, Numerics::kDense);
  RequestState state(f.config, {16, 0});
  std::vector<int32_t> tokens = {1, 2, 300};
  std::vector<float> out(3 * 300);
  ForwardRequest request{&state, tokens};
  EXPECT_THROW(
      f.model->forward({&request, 1}, TensorView::contiguous(out.data(), DType::kF32, {3, 300})),
      Error);
  EXPECT_EQ(state.length(), 0);
  std::vector<int32_t> long_prompt(17, 1);
  std::vector<float> long_out(17 * 300);
  ForwardRequest too_long{&state, long_prompt};
  EXPECT_THROW(f.model->forward({&too_long, 1},
                                TensorView::contiguous(long_out.data(), DType::kF32, {17, 300})),
               Error);
}

// A tiny model built under one environment variable's values: the variable is unset before and
// after; `rejects(value)` expects the model's construction to fail with an Error naming the
// variable and the value.
class ModelUnderSetting {
 public:
  explicit ModelUnderSetting(const char* variable)
      : variable_(variable),
        config_(testing::tiny_config("{}")),
        hasher_(config_.engram_layer_ids.empty() ? nullptr : testing::tiny_hasher(config_, 1)),
        parameters_(testing::random_parameters(config_, 1, WeightFormat::kDense)) {
    unsetenv(variable_);
  }
  ~ModelUnderSetting() { unsetenv(variable_); }
  ModelUnderSetting(const ModelUnderSetting&) = delete;
  ModelUnderSetting& operator=(const ModelUnderSetting&) = delete;

  Model build(const char* value) const {
    setenv(variable_, value, 1);
    return Model(config_, *parameters_, Numerics::kDense, hasher_);
  }
  Model build_unset() const {
    unsetenv(variable_);
    return Model(config_, *parameters_, Numerics::kDense, hasher_);
  }
  void rejects(const char* value) const {
    try {
      build(value);
      ADD_FAILURE() << variable_ << "=" << value << " was accepted";
    } catch (const Error& error) {
      const std::string named = std::string(variable_) + "='" + value + "'";
      EXPECT_NE(std::string(error.what()).find(named), std::string::npos) << error.what();
    }
  }

 private:
  const char* variable_;
  DeepseekV41TextConfig config_;
  std::shared_ptr<EngramHasher> hasher_;
  std::unique_ptr<ModelParameters> parameters_;
};

// DEEPINFER_CUDA_GRAPHS takes 0 or 1 (unset: on); anything else fails the model's construction
// with an Error naming the variable, on every backend, instead of being read as on or off.
TEST(ForwardTest, CudaGraphsSettingMustBeZeroOrOne) {
  const ModelUnderSetting setting("DEEPINFER_CUDA_GRAPHS");
  EXPECT_TRUE(setting.build_unset().cuda_graphs());
  EXPECT_FALSE(setting.build("0").cuda_graphs());
  EXPECT_TRUE(setting.build("1").cuda_graphs());
  setting.rejects("yes");
}

// DEEPINFER_CUDA_GRAPH_MAX_TOKENS: a token count 1..Model::kLargestCudaGraphMaxTokens (unset or
// empty: 256); anything else fails the model's construction with an Error naming the variable.
// The setter checks the same range.
TEST(ForwardTest, CudaGraphMaxTokensSettingMustBeATokenCount) {
  const ModelUnderSetting setting("DEEPINFER_CUDA_GRAPH_MAX_TOKENS");
  EXPECT_EQ(setting.build_unset().cuda_graph_max_tokens(), 256);
  EXPECT_EQ(setting.build("").cuda_graph_max_tokens(), 256);
  EXPECT_EQ(setting.build("64").cuda_graph_max_tokens(), 64);
  EXPECT_EQ(setting.build("4096").cuda_graph_max_tokens(), 4096);
  for (const char* bad : {"0", "4097", "-1", "64k", " 64", "99999999999999999999"}) {
    setting.rejects(bad);
  }
  Model model = setting.build_unset();
  model.set_cuda_graph_max_tokens(1);
  EXPECT_EQ(model.cuda_graph_max_tokens(), 1);
  EXPECT_THROW(model.set_cuda_graph_max_tokens(0), Error);
  EXPECT_THROW(model.set_cuda_graph_max_tokens(Model::kLargestCudaGraphMaxTokens + 1), Error);
  EXPECT_EQ(model.cuda_graph_max_tokens(), 1);
}

}  // namespace
}  // namespace deepinfer::deepseek_v41
