// The engine on a tiny random DeepSeek-V4.1 model: batched, chunked, preempted and async
// generation must give each request exactly the tokens of a plain one-request loop (prefill,
// then one decode token per forward) on its own Model and RequestState; on the CPU and, where
// one is usable, on the GPU (model, states and oracle all on the device).
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "../model/random_model.h"
#include "deepinfer/llm.h"
#include "engine/deepseek_runner.h"
#include "gpu_support.h"
#include "ops/ops.h"
#include "sampling/sampler.h"

namespace deepinfer::engine {
namespace {

namespace v41 = deepseek_v41;

struct TinyModel {
  v41::DeepseekV41TextConfig config = v41::testing::tiny_config();
  std::shared_ptr<v41::EngramHasher> hasher = v41::testing::tiny_hasher(config, 5);
  std::unique_ptr<v41::ModelParameters> parameters =
      v41::testing::random_parameters(config, 17, v41::testing::WeightFormat::kDense);
  std::unique_ptr<v41::ModelParameters> on_gpu;

  const v41::ModelParameters& parameters_on(Device device) {
    if (device.is_cpu()) return *parameters;
    if (!on_gpu) on_gpu = v41::copy_parameters(*parameters, ops::allocator_for(device));
    return *on_gpu;
  }
};

std::vector<int32_t> alone(TinyModel& tiny, Device device, const std::vector<int32_t>& prompt,
                           const SamplingParams& params) {
  v41::Model model(tiny.config, tiny.parameters_on(device), v41::Numerics::kDense, tiny.hasher);
  v41::RequestState state(tiny.config, v41::StateLimits{256, 0}, ops::allocator_for(device));
  sampling::Sampler sampler;
  const int64_t vocab = tiny.config.vocab_size;
  std::vector<int32_t> eos;
  for (int64_t id : tiny.config.eos_token_ids) eos.push_back(static_cast<int32_t>(id));
  std::vector<int32_t> output;
  std::vector<int32_t> next = prompt;
  while (true) {
    std::vector<float> logits(next.size() * static_cast<size_t>(vocab));
    v41::ForwardRequest request{&state, next};
    model.forward(std::span(&request, 1),
                  TensorView::contiguous(logits.data(), DType::kF32,
                                         {static_cast<int64_t>(next.size()), vocab}));
    sampling::SamplerRow row;
    row.params = &params;
    row.seed = *params.seq_seed;
    row.prompt_token_ids = prompt;
    row.output_token_ids = output;
    row.eos_token_ids = eos;
    const auto last = std::span<const float>(logits).last(static_cast<size_t>(vocab));
    const auto sampled = sampler.sample(last, vocab, std::span(&row, 1));
    output.push_back(sampled.at(0).token_id);
    const bool is_eos = std::find(eos.begin(), eos.end(), output.back()) != eos.end();
    if ((is_eos && !params.ignore_eos) ||
        static_cast<int32_t>(output.size()) >= *params.max_tokens) {
      return output;
    }
    next = {output.back()};
  }
}

class DeepseekEngine : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda()) {
      DEEPINFER_SKIP_WITHOUT_GPU();
    }
  }
};

TEST_P(DeepseekEngine, BatchedChunkedPreemptedAsyncMatchesAlone) {
  const Device device = GetParam();
  TinyModel tiny;
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 8; ++i) {
    std::vector<int32_t> prompt(static_cast<size_t>(1 + rng() % 14));
    for (auto& t : prompt) t = static_cast<int32_t>(3 + rng() % 290);
    prompts.push_back(prompt);
    SamplingParams p;
    p.temperature = i % 2 ? 0.0f : 0.8f;
    p.seq_seed = rng();
    p.max_tokens = 1 + static_cast<int32_t>(rng() % 7);
    params.push_back(p);
  }
  for (bool async : {true, false}) {
    for (int64_t pool_tokens : {int64_t{0}, int64_t{40}}) {
      EngineArgs args;
      args.max_model_len = 32;
      args.max_num_seqs = 4;
      args.max_num_batched_tokens = 9;
      args.async_scheduling = async;
      auto runner = std::make_unique<DeepseekRunner>(tiny.config, tiny.parameters_on(device),
                                                     v41::Numerics::kDense, tiny.hasher);
      args.state_pool_bytes = pool_tokens * runner->state_bytes_per_token();
      LLM llm(args, std::move(runner));
      const auto outputs = llm.generate(prompts, params);
      for (size_t i = 0; i < prompts.size(); ++i) {
        ASSERT_FALSE(outputs[i].error) << *outputs[i].error;
        EXPECT_EQ(outputs[i].outputs[0].token_ids, alone(tiny, device, prompts[i], params[i]))
            << "request " << i << " async " << async << " pool " << pool_tokens;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, DeepseekEngine, ::testing::Values(Device::cpu(), Device::cuda(0)),
                         [](const ::testing::TestParamInfo<Device>& param) {
                           return param.param.is_cpu() ? std::string("cpu") : std::string("cuda");
                         });

}  // namespace
}  // namespace deepinfer::engine
