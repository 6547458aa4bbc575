// The CUDA sampler against the CPU reference sampler (itself checked against independent
// oracles in sampler_test.cpp): the same rows, logits, histories, masks and seeds must give the
// same token on both, the same errors in the same words, the same ranks and top-logprob ids,
// and log-probabilities within 2e-6 (the log-sum-exp is summed in a different order: double
// sums, rounded to float, can land one float ulp apart). Rows mix every parameter the CPU
// tests cover, at a tiny vocabulary and at DeepSeek-V4.1's 129280. Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "gpu_support.h"
#include "ops/cuda/cuda_runtime.h"
#include "sampling/cuda_sampler.h"
#include "sampling/sampler.h"

namespace deepinfer::sampling {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kDeepSeekVocab = 129280;
constexpr double kLogprobTolerance = 2e-6;

class CudaSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override { DEEPINFER_SKIP_WITHOUT_GPU(); }
};

// Everything a SamplerRow points to, owned.
struct RowData {
  SamplingParams params;
  uint64_t seed = 0;
  uint32_t sample_index = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  std::vector<uint32_t> mask;
  std::vector<int32_t> eos;

  SamplerRow row() const { return {&params, seed, sample_index, prompt, output, mask, eos}; }
};

// Logits with features that stress the boundaries: coarse-grid ties (so top_k thresholds and
// the sort meet equal values), a few -inf, and a spread that decides how many tokens survive.
std::vector<float> random_logits(int64_t vocab, std::mt19937_64& rng, float spread, bool ties) {
  std::normal_distribution<float> normal(0.0f, spread);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& v : logits) {
    v = normal(rng);
    if (ties) v = std::round(v * 4.0f) / 4.0f;
    if (unit(rng) < 0.01f) v = kNegInf;
  }
  return logits;
}

std::vector<int32_t> random_ids(int64_t vocab, size_t count, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(count);
  for (int32_t& t : ids) t = id(rng);
  return ids;
}

// A row from a combination index: every filter, penalty, ban, mask and logprob option appears
// across consecutive indices, in many pairings.
RowData make_row(int64_t vocab, int combination, std::mt19937_64& rng) {
  RowData d;
  SamplingParams& p = d.params;
  const float temperatures[] = {0.0f, 1.0f, 0.7f, 1.6f, 0.05f};
  const int top_ks[] = {0, 1, 7, 50, 2047, 2049, 5000, -1};
  const float top_ps[] = {1.0f, 0.9f, 0.5f, 0.999f, 0.05f};
  const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.3f};
  p.temperature = temperatures[combination % 5];
  p.top_k = top_ks[(combination / 5) % 8];
  p.top_p = top_ps[(combination / 3) % 5];
  p.min_p = min_ps[(combination / 7) % 4];
  d.seed = rng();
  d.sample_index = static_cast<uint32_t>(combination % 3);
  d.prompt = random_ids(vocab, 1 + static_cast<size_t>(combination % 40), rng);
  d.output = random_ids(vocab, static_cast<size_t>(combination % 13), rng);
  if (!d.output.empty()) d.output.push_back(d.output.front());  // a repeated output token
  if (combination % 4 == 1) {
    p.repetition_penalty = 1.3f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
  } else if (combination % 4 == 2) {
    p.repetition_penalty = 0.8f;
    p.frequency_penalty = -0.7f;
  } else if (combination % 4 == 3) {
    p.presence_penalty = 1.5f;
  }
  d.eos = {static_cast<int32_t>(vocab - 1), 0};
  if (combination % 6 == 0) {
    p.min_tokens = 20;
    p.max_tokens = 30;
    p.stop_token_ids = random_ids(vocab, 3, rng);
    p.ignore_eos = combination % 12 == 0;
  }
  if (combination % 5 == 3) {
    d.mask.assign(static_cast<size_t>((vocab + 31) / 32), 0u);
    std::uniform_int_distribution<uint32_t> bits;
    for (uint32_t& w : d.mask) w = bits(rng) & bits(rng);  // about a quarter allowed
    d.mask[0] |= 1u;
  }
  const int logprobs[] = {-1, 0, 5, 20, -1, 3};
  if (logprobs[combination % 6] >= 0) p.logprobs = logprobs[combination % 6];
  return d;
}

struct Comparison {
  int rows = 0;
  int sampled = 0;
  int errors = 0;
};

// Samples `rows` on both backends and compares them; `logits` is [rows, vocab].
Comparison compare_backends(const std::vector<float>& logits, int64_t vocab,
                            const std::vector<RowData>& data) {
  std::vector<SamplerRow> rows;
  for (const RowData& d : data) rows.push_back(d.row());
  Sampler cpu;
  const std::vector<SampledToken> want = cpu.sample(logits, vocab, rows);

  Tensor host = Tensor::empty(DType::kF32, {static_cast<int64_t>(data.size()), vocab});
  std::memcpy(host.data<float>(), logits.data(), logits.size() * sizeof(float));
  const Tensor device = cuda::to_device(host);
  CudaSampler gpu;
  std::vector<SampledToken> got(rows.size());
  gpu.launch(device, rows);
  gpu.wait(got);
  const Tensor device_tokens = cuda::to_host(gpu.device_token_ids());

  Comparison c;
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i) + " vocab " + std::to_string(vocab) + " params " +
                 sampling_params_to_json(data[i].params));
    ++c.rows;
    EXPECT_EQ(got[i].error, want[i].error);
    EXPECT_EQ(got[i].token_id, want[i].token_id);
    EXPECT_EQ(device_tokens.data<int32_t>()[i], want[i].ok() ? want[i].token_id : -1);
    if (!want[i].ok()) {
      ++c.errors;
      continue;
    }
    ++c.sampled;
    EXPECT_EQ(got[i].sampled_logprob.has_value(), want[i].sampled_logprob.has_value());
    if (want[i].sampled_logprob && got[i].sampled_logprob) {
      EXPECT_EQ(got[i].sampled_logprob->token_id, want[i].sampled_logprob->token_id);
      EXPECT_EQ(got[i].sampled_logprob->rank, want[i].sampled_logprob->rank);
      EXPECT_NEAR(got[i].sampled_logprob->logprob, want[i].sampled_logprob->logprob,
                  kLogprobTolerance);
    }
    EXPECT_EQ(got[i].top_logprobs.size(), want[i].top_logprobs.size());
    for (size_t k = 0; k < std::min(got[i].top_logprobs.size(), want[i].top_logprobs.size()); ++k) {
      EXPECT_EQ(got[i].top_logprobs[k].token_id, want[i].top_logprobs[k].token_id) << k;
      EXPECT_EQ(got[i].top_logprobs[k].rank, want[i].top_logprobs[k].rank);
      EXPECT_NEAR(got[i].top_logprobs[k].logprob, want[i].top_logprobs[k].logprob,
                  kLogprobTolerance);
    }
  }
  return c;
}

void compare_random_batches(int64_t vocab, int batches, int rows_per_batch, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Comparison total;
  for (int b = 0; b < batches; ++b) {
    std::vector<RowData> data;
    std::vector<float> logits;
    for (int r = 0; r < rows_per_batch; ++r) {
      const int combination = b * rows_per_batch + r;
      data.push_back(make_row(vocab, combination, rng));
      // Spreads from flat (thousands of survivors) to peaked (a handful).
      const float spreads[] = {1.0f, 4.0f, 0.2f, 12.0f};
      const std::vector<float> row =
          random_logits(vocab, rng, spreads[combination % 4], combination % 3 != 2);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    const Comparison c = compare_backends(logits, vocab, data);
    total.rows += c.rows;
    total.sampled += c.sampled;
    total.errors += c.errors;
    if (::testing::Test::HasFailure()) break;
  }
  // The comparison must have sampled most rows (min_tokens bans and masks fail only a few).
  EXPECT_GT(total.sampled, total.rows * 3 / 4);
}

TEST_F(CudaSamplerTest, TinyVocabularyEveryCombination) {
  compare_random_batches(50, 20, 120, 1);
  compare_random_batches(300, 10, 120, 2);
}

TEST_F(CudaSamplerTest, DeepSeekVocabularyEveryCombination) {
  compare_random_batches(kDeepSeekVocab, 3, 120, 3);
}

// Many seeds on one row: the draw walks the same uniform over the same sorted weights.
TEST_F(CudaSamplerTest, ManySeedsSameRow) {
  for (const int64_t vocab : {int64_t{64}, kDeepSeekVocab}) {
    std::mt19937_64 rng(11);
    const std::vector<float> row = random_logits(vocab, rng, 2.0f, true);
    std::vector<RowData> data;
    std::vector<float> logits;
    for (int s = 0; s < 200; ++s) {
      RowData d;
      d.params.temperature = 0.9f;
      d.params.top_p = s % 2 == 0 ? 1.0f : 0.8f;
      d.params.top_k = s % 3 == 0 ? 100 : 0;
      d.seed = static_cast<uint64_t>(s) * 0x9E3779B97F4A7C15ull;
      d.output.assign(static_cast<size_t>(s % 5), 1);
      data.push_back(d);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    compare_backends(logits, vocab, data);
  }
}

// Flat rows make the sorted walk cross many chunks before top_p's mass is reached.
TEST_F(CudaSamplerTest, FlatDistributionsWalkManyChunks) {
  std::mt19937_64 rng(5);
  std::vector<RowData> data;
  std::vector<float> logits;
  for (int r = 0; r < 8; ++r) {
    RowData d;
    d.params.top_p = r % 2 == 0 ? 0.95f : 0.3f;
    d.params.top_k = r < 4 ? 0 : 20000;
    d.params.logprobs = r == 0 ? 5000 : 2;  // more than one chunk of top logprobs too
    d.seed = rng();
    data.push_back(d);
    std::uniform_real_distribution<float> flat(0.0f, 0.05f);
    for (int64_t t = 0; t < kDeepSeekVocab; ++t) logits.push_back(flat(rng));
  }
  compare_backends(logits, kDeepSeekVocab, data);
}

TEST_F(CudaSamplerTest, RowErrorsMatchTheCpu) {
  const int64_t vocab = 40;
  std::mt19937_64 rng(9);
  std::vector<RowData> data(9);
  std::vector<float> logits;
  for (int r = 0; r < 9; ++r) {
    const std::vector<float> row = random_logits(vocab, rng, 1.0f, false);
    logits.insert(logits.end(), row.begin(), row.end());
    data[r].seed = static_cast<uint64_t>(r);
  }
  const auto at = [&](int r, int t) -> float& {
    return logits[static_cast<size_t>(r * vocab + t)];
  };
  at(0, 7) = std::numeric_limits<float>::quiet_NaN();
  at(0, 9) = std::numeric_limits<float>::infinity();
  at(1, 3) = std::numeric_limits<float>::infinity();
  data[2].mask.assign(2, 0u);  // nothing allowed
  data[3].mask = {1u << 5, 0u};
  at(3, 5) = kNegInf;            // the one allowed token is -inf
  data[4].mask = {1u << 6, 0u};  // the one allowed token is banned by min_tokens
  data[4].params.min_tokens = 2;
  data[4].params.stop_token_ids = {6};
  data[5].params.top_p = 0.0f;  // invalid
  data[6].params.repetition_penalty = 1.2f;
  data[6].output = {int32_t(vocab)};  // outside the vocabulary
  data[7].mask.assign(3, ~0u);        // wrong size
  data[8].params.logprobs = 3;        // a healthy row among them
  const Comparison c = compare_backends(logits, vocab, data);
  EXPECT_EQ(c.errors, 8);
}

// Rows, logprobs and the device buffer after a second, smaller call reuse the scratch.
TEST_F(CudaSamplerTest, ReusedSamplerGivesTheSameRows) {
  const int64_t vocab = 1000;
  std::mt19937_64 rng(21);
  std::vector<RowData> data;
  std::vector<float> logits;
  for (int r = 0; r < 16; ++r) {
    data.push_back(make_row(vocab, r, rng));
    const std::vector<float> row = random_logits(vocab, rng, 3.0f, true);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  std::vector<SamplerRow> rows;
  for (const RowData& d : data) rows.push_back(d.row());
  Tensor host = Tensor::empty(DType::kF32, {16, vocab});
  std::memcpy(host.data<float>(), logits.data(), logits.size() * sizeof(float));
  const Tensor device = cuda::to_device(host);
  CudaSampler gpu;
  const std::vector<SampledToken> first = gpu.sample(device, rows);
  // The same rows again, alone and in reverse order, from the same sampler.
  for (int r = 15; r >= 0; --r) {
    const TensorView one(device.view().data<float>() + r * vocab, vocab * sizeof(float), 0,
                         DType::kF32, {1, vocab}, {vocab, 1}, Device::cuda(0));
    const std::vector<SampledToken> again = gpu.sample(one, std::span(rows).subspan(r, 1));
    EXPECT_EQ(again[0].token_id, first[r].token_id) << r;
    EXPECT_EQ(again[0].error, first[r].error) << r;
    if (first[r].sampled_logprob) {
      EXPECT_EQ(again[0].sampled_logprob->logprob, first[r].sampled_logprob->logprob) << r;
    }
  }
}

// The engine samples only the tokenizer's columns of a wider (padded) logits matrix: a view
// with a row stride larger than its width.
TEST_F(CudaSamplerTest, ColumnSliceOfWiderLogits) {
  const int64_t vocab = 500;
  const int64_t padded = 512;
  std::mt19937_64 rng(31);
  std::vector<RowData> data;
  std::vector<float> wide;
  std::vector<float> narrow;
  for (int r = 0; r < 12; ++r) {
    data.push_back(make_row(vocab, r, rng));
    const std::vector<float> row = random_logits(padded, rng, 2.0f, true);
    wide.insert(wide.end(), row.begin(), row.end());
    narrow.insert(narrow.end(), row.begin(), row.begin() + vocab);
  }
  std::vector<SamplerRow> rows;
  for (const RowData& d : data) rows.push_back(d.row());
  Sampler cpu;
  const std::vector<SampledToken> want = cpu.sample(narrow, vocab, rows);
  Tensor host = Tensor::empty(DType::kF32, {12, padded});
  std::memcpy(host.data<float>(), wide.data(), wide.size() * sizeof(float));
  const Tensor device = cuda::to_device(host);
  const TensorView slice(device.view().data<float>(), wide.size() * sizeof(float), 0, DType::kF32,
                         {12, vocab}, {padded, 1}, Device::cuda(0));
  CudaSampler gpu;
  const std::vector<SampledToken> got = gpu.sample(slice, rows);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(got[i].token_id, want[i].token_id) << i;
    EXPECT_EQ(got[i].error, want[i].error) << i;
  }
}

}  // namespace
}  // namespace deepinfer::sampling
