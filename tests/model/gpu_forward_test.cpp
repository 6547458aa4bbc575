// The forward on the GPU against the CPU backend: the tiny random models (every mechanism of
// the forward: sliding-only layers, ratio-2 and ratio-1 compressed groups, candidate and
// re-indexing layers, engram, hc 2) with their weights copied to the device by
// copy_parameters, in prefill, chunked and decode modes over a ragged batch, both numerics.
// Also: batch invariance holds on the GPU bit for bit, and with it off (the large GEMMs on other
// kernels) the logits still agree with the CPU's. Skips without a usable GPU (and in a
// build without the CUDA backend).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "gpu_support.h"
#include "model/deepseek_v41/model.h"
#include "ops/batch_invariance.h"
#include "ops/cuda/runtime_switch.h"
#include "ops/ops.h"
#include "random_model.h"

namespace deepinfer::deepseek_v41 {
namespace {

using testing::WeightFormat;

std::vector<int32_t> random_tokens(int64_t count, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % vocab);
  return tokens;
}

struct Models {
  DeepseekV41TextConfig config;
  std::shared_ptr<EngramHasher> hasher;
  std::unique_ptr<ModelParameters> host_parameters, device_parameters;
  std::unique_ptr<Model> cpu, gpu;

  Models(WeightFormat format, Numerics numerics) : config(testing::tiny_config()) {
    if (!config.engram_layer_ids.empty()) hasher = testing::tiny_hasher(config, 1);
    host_parameters = testing::random_parameters(config, 1, format);
    device_parameters = copy_parameters(*host_parameters, ops::allocator_for(Device::cuda(0)));
    cpu = std::make_unique<Model>(config, *host_parameters, numerics, hasher);
    gpu = std::make_unique<Model>(config, *device_parameters, numerics, hasher);
  }
};

// max |gpu - cpu| / max |cpu|, and the rows whose argmax differs although the CPU's top-two
// margin exceeds `tolerance` * max |cpu|.
struct Comparison {
  double relative = 0;
  int64_t argmax_mismatches = 0;
};

Comparison compare(const std::vector<float>& cpu, const std::vector<float>& gpu, int64_t vocab,
                   double tolerance) {
  Comparison result;
  double scale = 0, worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(cpu[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(gpu[i]) - cpu[i]));
  }
  result.relative = worst / std::max(scale, 1e-30);
  for (size_t row = 0; row * vocab < cpu.size(); ++row) {
    const float* a = cpu.data() + row * vocab;
    const float* b = gpu.data() + row * vocab;
    const int64_t best_a = std::max_element(a, a + vocab) - a;
    const int64_t best_b = std::max_element(b, b + vocab) - b;
    float second = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) {
      if (v != best_a) second = std::max(second, a[v]);
    }
    if (best_a != best_b && a[best_a] - second > tolerance * scale) ++result.argmax_mismatches;
  }
  return result;
}

class GpuForwardTest : public ::testing::TestWithParam<std::tuple<WeightFormat, Numerics>> {
 protected:
  void SetUp() override { DEEPINFER_SKIP_WITHOUT_GPU(); }
};

TEST_P(GpuForwardTest, LogitsMatchTheCpuBackendInEveryModeAndPolicy) {
  const auto [format, numerics] = GetParam();
  Models models(format, numerics);
  const int64_t vocab = models.config.vocab_size;
  // Ragged: lengths cross the window, the ratio-2 groups and the candidate blocks.
  const std::vector<std::vector<int32_t>> prompts = {
      random_tokens(45, vocab, 1), random_tokens(7, vocab, 2), random_tokens(30, vocab, 3)};
  // Dense numerics: only summation order differs (each GPU linear is within 2e-5 of the CPU's,
  // docs/CUDA.md); measured 9.4e-7 on the H200, bound 1e-5 (issue 5's mode-agreement bar).
  // Released numerics quantize activations (fp8 per 32) and the caches (fp8 window, fp4
  // compressed entries and indexer keys): a value the backends compute a few ulp apart can
  // round to neighbouring codes and move logits by far more than rounding (docs/GOLDEN.md,
  // "Released numerics"). Measured 2.4e-7 here (no code flipped); the bound is the golden
  // rule's 1e-3, with the same argmax wherever the CPU's margin exceeds it.
  const bool released = numerics == Numerics::kReleased;
  const double tolerance = released ? 1e-3 : 1e-5;
  // Batch invariance off lets the GPU run calls of many rows on other kernels (cuBLASLt for the
  // dense bf16 / fp8 roles from DEEPINFER_CUBLASLT_MIN_ROWS = 65 rows: docs/CUDA.md, "Batch
  // invariance off"); the whole-prompt step (chunk 0) is 82 rows and takes it. The same bounds:
  // the products are the same quantized operands, only the sums' order differs. (The tiny
  // models' hidden size 32 is too small for the routed experts' wgmma tile, which moe_wgmma_test
  // checks at the V4.1 shapes.)
  for (const bool invariant : {true, false}) {
    const ops::ScopedBatchInvariance policy(invariant);
    for (int64_t chunk : {int64_t{0}, int64_t{5}, int64_t{1}}) {
      const std::vector<float> cpu = run_prompts(*models.cpu, prompts, chunk);
      const std::vector<float> gpu = run_prompts(*models.gpu, prompts, chunk);
      ASSERT_EQ(cpu.size(), gpu.size());
      const Comparison c = compare(cpu, gpu, vocab, tolerance);
      std::printf(
          "[ gpu      ] batch invariance %s, format %d numerics %d chunk %lld: max |gpu - cpu| / "
          "max |cpu| %.3g, argmax mismatches %lld\n",
          invariant ? "on" : "off", static_cast<int>(format), static_cast<int>(numerics),
          static_cast<long long>(chunk), c.relative, static_cast<long long>(c.argmax_mismatches));
      EXPECT_LE(c.relative, tolerance) << "chunk " << chunk << ", invariance " << invariant;
      EXPECT_EQ(c.argmax_mismatches, 0) << "chunk " << chunk << ", invariance " << invariant;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Numerics, GpuForwardTest,
    ::testing::Values(std::make_tuple(WeightFormat::kDense, Numerics::kDense),
                      std::make_tuple(WeightFormat::kReleased, Numerics::kDense),
                      std::make_tuple(WeightFormat::kReleased, Numerics::kReleased)));

TEST_F(GpuForwardTest, ARequestsLogitsDoNotDependOnTheRestOfTheBatch) {
  const ops::ScopedBatchInvariance invariant(true);
  Models models(WeightFormat::kReleased, Numerics::kReleased);
  const int64_t vocab = models.config.vocab_size;
  const auto a = random_tokens(19, vocab, 11);
  const auto b = random_tokens(33, vocab, 12);
  const std::vector<float> alone = run_prompts(*models.gpu, {a}, 0);
  const std::vector<float> together = run_prompts(*models.gpu, {b, a}, 0);
  const std::vector<float> a_in_batch(together.end() - static_cast<int64_t>(alone.size()),
                                      together.end());
  EXPECT_EQ(alone, a_in_batch);  // bit-identical
}

// Decode steps with CUDA graphs (Model::set_cuda_graphs) against the same steps without: the
// recorded segments replay the same kernels with the same arguments, so the logits must be the
// same bits. `batch` requests start at different lengths (a ragged prefill), so over 40 steps
// their ratio-2 groups complete on alternating steps, the window ring wraps, the indexer's width
// grows past index_topk and the candidate blocks fill; a rollback and redo (as
// cuda_model_bench steps) sits in the middle.
std::vector<float> decode_logits(Models& models, int64_t batch, bool graphs) {
  const DeepseekV41TextConfig& config = models.config;
  const int64_t vocab = config.vocab_size;
  constexpr int64_t kSteps = 40;
  models.gpu->set_cuda_graphs(graphs);
  std::vector<std::unique_ptr<RequestState>> states;
  std::vector<std::vector<int32_t>> prompts, continuations;
  for (int64_t r = 0; r < batch; ++r) {
    states.push_back(
        std::make_unique<RequestState>(config, StateLimits{/*max_tokens=*/128, /*max_rollback=*/1},
                                       ops::allocator_for(models.gpu->device())));
    prompts.push_back(random_tokens(3 + 5 * r % 40, vocab, static_cast<uint32_t>(100 + r)));
    continuations.push_back(random_tokens(kSteps, vocab, static_cast<uint32_t>(200 + r)));
  }
  std::vector<float> all;
  auto step = [&](const std::vector<ForwardRequest>& requests, int64_t rows) {
    Tensor logits = Tensor::empty(DType::kF32, {rows, vocab});
    models.gpu->forward(requests, logits.view());
    all.insert(all.end(), logits.data<float>(), logits.data<float>() + logits.numel());
  };
  std::vector<ForwardRequest> requests;
  int64_t prompt_tokens = 0;
  for (int64_t r = 0; r < batch; ++r) {
    requests.push_back({states[static_cast<size_t>(r)].get(), prompts[static_cast<size_t>(r)]});
    prompt_tokens += static_cast<int64_t>(prompts[static_cast<size_t>(r)].size());
  }
  step(requests, prompt_tokens);
  for (int64_t t = 0; t < kSteps; ++t) {
    requests.clear();
    for (int64_t r = 0; r < batch; ++r) {
      requests.push_back(
          {states[static_cast<size_t>(r)].get(),
           std::span<const int32_t>(continuations[static_cast<size_t>(r)].data() + t, 1)});
    }
    step(requests, batch);
    if (t == kSteps / 2) {
      for (const ForwardRequest& request : requests) request.state->rollback(1);
      step(requests, batch);
    }
  }
  return all;
}

// Logits whose bits differ (NaN included: == would call equal NaNs different).
size_t differing_bits(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++differing;
  }
  return differing;
}

class GpuGraphDecodeTest : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { DEEPINFER_SKIP_WITHOUT_GPU(); }
};

// decode_logits with graphs off, then on, then on again: the second graph run's segments replay
// the first one's recordings (same token counts, same scratch; only the request states are new).
// All three must be the same bits.
void expect_recorded_steps_equal_eager(Models& models, int64_t batch) {
  const std::vector<float> eager = decode_logits(models, batch, false);
  const std::vector<float> graphs = decode_logits(models, batch, true);
  ASSERT_EQ(eager.size(), graphs.size());
  EXPECT_EQ(differing_bits(eager, graphs), 0u) << "of " << eager.size() << " logits";
  const std::vector<float> replayed = decode_logits(models, batch, true);
  ASSERT_EQ(replayed.size(), graphs.size());
  EXPECT_EQ(differing_bits(replayed, graphs), 0u) << "of " << graphs.size() << " logits";
}

TEST_P(GpuGraphDecodeTest, GraphStepsEqualEagerStepsBitForBitSmallShapes) {
  Models models(WeightFormat::kReleased, Numerics::kReleased);
  expect_recorded_steps_equal_eager(models, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Batch, GpuGraphDecodeTest, ::testing::Values(int64_t{1}, int64_t{4}));

// Steps of more than 64 tokens (the recording limit until the cuBLASLt path could be recorded),
// recorded with batch invariance off: 80 rows take the cuBLASLt path (DEEPINFER_CUBLASLT_MIN_ROWS,
// 65), so the recordings hold cuBLASLt calls on the staging the eager first sightings grew, and the
// replays must give the eager steps' bits (a call that fell back to another kernel while
// recording would sum in another order).
TEST(GpuGraphDecode, StepsOfManyRowsRecordTheCublasLtPathBitForBit) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const ops::ScopedBatchInvariance variant(false);
  constexpr int64_t kBatch = 80;
  Models models(WeightFormat::kReleased, Numerics::kReleased);
  models.gpu->set_cuda_graph_max_tokens(128);
  expect_recorded_steps_equal_eager(models, kBatch);
}

// The decode step's concurrent branches (ops::ConcurrentBranch: the K=V row and the compressed
// projections beside the query's wq_b, the shared expert beside the routed experts) on a second
// stream against the same ops in place: the same ops on the same inputs, so the same bits, eager
// and recorded (a branch that read a buffer before the op writing it had run, or a join that let
// the next op start early, would show as other bits). 80 rows with batch invariance off put
// cuBLASLt (and its per-stream staging) on the branch's stream too.
void expect_branches_change_no_bit(int64_t batch) {
  Models models(WeightFormat::kReleased, Numerics::kReleased);
  models.gpu->set_cuda_graph_max_tokens(128);
  std::vector<float> in_place;
  {
    const deepinfer::cuda::ScopedSwitch branches("DEEPINFER_CONCURRENT_BRANCHES", false);
    in_place = decode_logits(models, batch, true);
  }
  const std::vector<float> branched_eager = decode_logits(models, batch, false);
  const std::vector<float> branched_recorded = decode_logits(models, batch, true);
  ASSERT_EQ(in_place.size(), branched_eager.size());
  ASSERT_EQ(in_place.size(), branched_recorded.size());
  EXPECT_EQ(differing_bits(in_place, branched_eager), 0u) << "of " << in_place.size();
  EXPECT_EQ(differing_bits(in_place, branched_recorded), 0u) << "of " << in_place.size();
}

TEST(GpuConcurrentBranches, BranchedStepsEqualInPlaceStepsBitForBit) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  expect_branches_change_no_bit(4);
}

TEST(GpuConcurrentBranches, BranchedCublasLtStepsEqualInPlaceStepsBitForBit) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const ops::ScopedBatchInvariance variant(false);
  expect_branches_change_no_bit(80);
}

// An engine's decode batch wanders as requests join and finish: steps of 1..12 requests, each
// count seen twice in a row (eager, then recorded) and again in later rounds, so more token
// counts are recorded than the model keeps and the least recently used ones are dropped and
// recorded again. Graphs on must equal graphs off bit for bit throughout.
std::vector<float> wandering_batch_logits(Models& models, bool graphs) {
  const DeepseekV41TextConfig& config = models.config;
  const int64_t vocab = config.vocab_size;
  constexpr int64_t kRequests = 12;
  constexpr int64_t kRounds = 3;
  models.gpu->set_cuda_graphs(graphs);
  std::vector<std::unique_ptr<RequestState>> states;
  std::vector<std::vector<int32_t>> continuations;
  std::vector<float> all;
  auto step = [&](const std::vector<ForwardRequest>& requests, int64_t rows) {
    Tensor logits = Tensor::empty(DType::kF32, {rows, vocab});
    models.gpu->forward(requests, logits.view());
    all.insert(all.end(), logits.data<float>(), logits.data<float>() + logits.numel());
  };
  std::vector<std::vector<int32_t>> prompts;
  std::vector<ForwardRequest> requests;
  int64_t prompt_tokens = 0;
  for (int64_t r = 0; r < kRequests; ++r) {
    states.push_back(
        std::make_unique<RequestState>(config, StateLimits{/*max_tokens=*/256, /*max_rollback=*/1},
                                       ops::allocator_for(models.gpu->device())));
    prompts.push_back(random_tokens(2 + 3 * r, vocab, static_cast<uint32_t>(300 + r)));
    continuations.push_back(
        random_tokens(2 * kRounds * kRequests, vocab, static_cast<uint32_t>(400 + r)));
  }
  for (int64_t r = 0; r < kRequests; ++r) {
    requests.push_back({states[static_cast<size_t>(r)].get(), prompts[static_cast<size_t>(r)]});
    prompt_tokens += static_cast<int64_t>(prompts[static_cast<size_t>(r)].size());
  }
  step(requests, prompt_tokens);
  std::vector<int64_t> consumed(kRequests, 0);
  for (int64_t round = 0; round < kRounds; ++round) {
    for (int64_t count = 1; count <= kRequests; ++count) {
      // Alternate the direction so counts come back after others were recorded.
      const int64_t batch = round % 2 == 0 ? count : kRequests + 1 - count;
      for (int repeat = 0; repeat < 2; ++repeat) {
        requests.clear();
        for (int64_t r = 0; r < batch; ++r) {
          const auto index = static_cast<size_t>(r);
          requests.push_back(
              {states[index].get(),
               std::span<const int32_t>(continuations[index].data() + consumed[index], 1)});
          ++consumed[index];
        }
        step(requests, batch);
      }
    }
  }
  return all;
}

TEST(GpuGraphDecode, WanderingBatchSizeEvictsAndRerecordsBitForBit) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Models models(WeightFormat::kReleased, Numerics::kReleased);
  const std::vector<float> eager = wandering_batch_logits(models, false);
  const std::vector<float> graphs = wandering_batch_logits(models, true);
  ASSERT_EQ(eager.size(), graphs.size());
  EXPECT_EQ(differing_bits(eager, graphs), 0u) << "of " << eager.size() << " logits";
}

}  // namespace
}  // namespace deepinfer::deepseek_v41
