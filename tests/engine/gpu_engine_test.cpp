// The engine on the GPU (accelerator nvidia) against the same engine on the CPU, the reference:
// greedy generations on the tiny models are identical token for token, through batching,
// chunked prefill, preemption and async scheduling. Skips where no usable GPU is present
// (every build runs the error check instead).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../model/random_model.h"
#include "deepinfer/llm.h"
#include "engine/deepseek_runner.h"
#include "gpu_support.h"
#include "model/deepseek_v41/parameters.h"
#include "ops/ops.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::engine {
namespace {

namespace v41 = deepseek_v41;

using testing::gpu_unavailable;
using testing::source_dir;

const tokenizer::Tokenizer& default_tokenizer() {
  static const tokenizer::Tokenizer tokenizer =
      tokenizer::Tokenizer::from_dir(source_dir() / "models" / "default");
  return tokenizer;
}

// Mixed prompt lengths (chunked under the step budget), more requests than slots, greedy.
struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
};

Workload greedy_workload(int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  Workload work;
  for (int i = 0; i < 7; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(1 + rng() % 30));
    for (auto& token : prompt) token = static_cast<int32_t>(3 + rng() % (vocab - 3));
    work.prompts.push_back(prompt);
    SamplingParams params;
    params.temperature = 0.0f;
    params.max_tokens = 4 + static_cast<int32_t>(rng() % 10);
    params.ignore_eos = true;  // every request runs its full length
    params.logprobs = 1;
    work.params.push_back(params);
  }
  return work;
}

EngineArgs small_args(Accelerator accelerator, bool async) {
  EngineArgs args;
  args.accelerator = accelerator;
  args.max_model_len = 64;
  args.max_num_seqs = 3;
  args.max_num_batched_tokens = 16;
  args.async_scheduling = async;
  return args;
}

std::vector<CompletionOutput> run(LLM& llm, const Workload& work) {
  std::vector<CompletionOutput> out;
  for (const RequestOutput& output : llm.generate(work.prompts, work.params)) {
    EXPECT_FALSE(output.error) << *output.error;
    if (output.error) return {};
    out.push_back(output.outputs.at(0));
  }
  return out;
}

// Tokens equal; the sampled tokens' log-probabilities equal within the golden rule's relative
// 1e-3 (docs/GOLDEN.md). Dense numerics differ only in summation order (~1e-5 per op,
// docs/CUDA.md); released numerics quantize activations and caches, and a value the backends
// compute a few ulp apart can round to a neighbouring fp8 / fp4 code and move a logit by far
// more (tiny_v41 on the H200: up to 5.2e-4 of |logprob| ~ 11).
void expect_same_generation(const std::vector<CompletionOutput>& gpu,
                            const std::vector<CompletionOutput>& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_FALSE(cpu[i].token_ids.empty()) << what;
    EXPECT_EQ(gpu[i].token_ids, cpu[i].token_ids) << what << ", request " << i;
    ASSERT_TRUE(gpu[i].logprobs && cpu[i].logprobs) << what;
    ASSERT_EQ(gpu[i].logprobs->size(), cpu[i].logprobs->size()) << what;
    for (size_t t = 0; t < cpu[i].logprobs->size(); ++t) {
      const float want = (*cpu[i].logprobs)[t].sampled.logprob;
      EXPECT_NEAR((*gpu[i].logprobs)[t].sampled.logprob, want, 1e-3 * std::max(1.0f, -want))
          << what << ", request " << i << " token " << t;
    }
  }
}

TEST(GpuEngine, NvidiaWithoutUsableGpuFailsNamingTheProblem) {
  const std::string why = gpu_unavailable();
  if (why.empty()) GTEST_SKIP() << "a usable GPU is present";
  EngineArgs args;
  args.accelerator = Accelerator::kNvidia;
  try {
    LLM llm(args);
    FAIL() << "an nvidia engine started without a usable GPU";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("DEEPINFER_ACCELERATOR=nvidia"), std::string::npos) << message;
  }
}

// The embedded default model (models/default, random weights of seed 0, released numerics)
// through LLM(args): what DEEPINFER_ACCELERATOR=nvidia runs.
TEST(GpuEngine, DefaultModelGreedyEqualsCpu) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Workload work = greedy_workload(128000, 1);
  LLM cpu(small_args(Accelerator::kCpu, true));
  const auto want = run(cpu, work);
  for (bool async : {true, false}) {
    LLM gpu(small_args(Accelerator::kNvidia, async));
    expect_same_generation(run(gpu, work), want, async ? "async" : "sync");
  }
}

// tests/data/configs/tiny_v41.json (the full config format, engram on the DeepSeek tokenizer)
// with random released-layout weights; a small state pool forces preemption.
TEST(GpuEngine, TinyV41GreedyEqualsCpu) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const auto config = source_dir() / "tests" / "data" / "configs" / "tiny_v41.json";
  const Workload work = greedy_workload(128000, 2);
  auto make = [&](Accelerator accelerator, int64_t pool_tokens) {
    auto runner = make_random_model_runner(config, 7, accelerator, &default_tokenizer());
    EngineArgs args = small_args(accelerator, true);
    args.state_pool_bytes = pool_tokens * runner->state_bytes_per_token();
    return std::make_unique<LLM>(args, std::move(runner));
  };
  const auto want = run(*make(Accelerator::kCpu, 0), work);
  expect_same_generation(run(*make(Accelerator::kNvidia, 0), work), want, "whole pool");
  expect_same_generation(run(*make(Accelerator::kNvidia, 70), work), want, "70-token pool");
}

// tests/data/configs/tiny_forward_text.json (every mechanism of the forward, vocab 300) in both
// weight formats and numerics.
TEST(GpuEngine, TinyForwardConfigGreedyEqualsCpu) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  for (const auto format :
       {v41::testing::WeightFormat::kDense, v41::testing::WeightFormat::kReleased}) {
    v41::DeepseekV41TextConfig config = v41::testing::tiny_config();
    const auto hasher = v41::testing::tiny_hasher(config, 5);
    const auto host = v41::testing::random_parameters(config, 17, format);
    const std::shared_ptr<const v41::ModelParameters> device =
        v41::copy_parameters(*host, ops::allocator_for(Device::cuda(0)));
    const auto numerics = format == v41::testing::WeightFormat::kDense ? v41::Numerics::kDense
                                                                       : v41::Numerics::kReleased;
    const Workload work = greedy_workload(static_cast<int32_t>(config.vocab_size), 3);
    const std::string what = format == v41::testing::WeightFormat::kDense ? "dense" : "released";
    LLM cpu(small_args(Accelerator::kCpu, true),
            std::make_unique<DeepseekRunner>(config, *host, numerics, hasher));
    LLM gpu(small_args(Accelerator::kNvidia, true),
            std::make_unique<DeepseekRunner>(config, *device, numerics, hasher, device));
    expect_same_generation(run(gpu, work), run(cpu, work), what);
  }
}

}  // namespace
}  // namespace deepinfer::engine
