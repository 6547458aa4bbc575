// The sampler against independent oracles: the post-filter distribution computed here from
// the definitions (long double, O(V^2) rank counting rather than sorting), hand-derived
// penalty values, and batch/order/thread invariance of every row.
#include "sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "sampling/penalties.h"
#include "sampling/token_filters.h"

namespace deepinfer::sampling {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------------------
// Oracle: P(token) after temperature, min_p, top_k, top_p, straight from the definitions.
// `logits` are the processed logits (mask, min_tokens and penalties already applied).
std::vector<long double> oracle_distribution(const std::vector<float>& logits,
                                             const SamplingParams& params) {
  const size_t vocab = logits.size();
  std::vector<float> scaled(vocab);
  for (size_t t = 0; t < vocab; ++t) scaled[t] = logits[t] / params.temperature;
  const float max_scaled = *std::max_element(scaled.begin(), scaled.end());
  std::vector<long double> p(vocab, 0.0L);
  long double z = 0.0L;
  for (size_t t = 0; t < vocab; ++t) {
    p[t] = std::exp(static_cast<long double>(scaled[t]) - max_scaled);
    z += p[t];
  }
  for (auto& v : p) v /= z;
  const long double p_max = *std::max_element(p.begin(), p.end());

  std::vector<bool> keep(vocab);
  for (size_t t = 0; t < vocab; ++t) keep[t] = p[t] > 0.0L && p[t] >= params.min_p * p_max;

  if (params.top_k > 0) {
    std::vector<bool> keep_k(vocab, false);
    for (size_t t = 0; t < vocab; ++t) {
      if (!keep[t]) continue;
      int greater = 0;
      for (size_t u = 0; u < vocab; ++u) greater += keep[u] && scaled[u] > scaled[t] ? 1 : 0;
      keep_k[t] = greater < params.top_k;
    }
    keep = keep_k;
  }

  if (params.top_p < 1.0f) {
    long double kept_mass = 0.0L;
    for (size_t t = 0; t < vocab; ++t) kept_mass += keep[t] ? p[t] : 0.0L;
    std::vector<bool> keep_p(vocab, false);
    for (size_t t = 0; t < vocab; ++t) {
      if (!keep[t]) continue;
      // Mass of the kept tokens strictly before t in (probability desc, id asc) order.
      long double before = 0.0L;
      for (size_t u = 0; u < vocab; ++u) {
        const bool u_first = scaled[u] > scaled[t] || (scaled[u] == scaled[t] && u < t);
        if (keep[u] && u_first) before += p[u] / kept_mass;
      }
      keep_p[t] = before < params.top_p;
    }
    keep = keep_p;
  }

  long double kept = 0.0L;
  for (size_t t = 0; t < vocab; ++t) kept += keep[t] ? p[t] : 0.0L;
  std::vector<long double> result(vocab, 0.0L);
  for (size_t t = 0; t < vocab; ++t) result[t] = keep[t] ? p[t] / kept : 0.0L;
  return result;
}

// Upper 1e-6 tail of chi-square with `df` degrees of freedom (Wilson-Hilferty).
double chi_square_critical(int df) {
  const double z = 4.753;  // standard normal 1 - 1e-6 quantile
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Pearson's statistic of `counts` against `expected`; +inf when a token the model of the
// distribution forbids was drawn.
double chi_square(const std::vector<int>& counts, const std::vector<long double>& expected,
                  int draws, int* degrees_of_freedom) {
  const auto cells =
      std::count_if(expected.begin(), expected.end(), [](long double e) { return e > 0.0L; });
  *degrees_of_freedom = std::max(static_cast<int>(cells) - 1, 1);
  double statistic = 0.0;
  for (size_t t = 0; t < counts.size(); ++t) {
    const double e = static_cast<double>(expected[t]) * draws;
    if (expected[t] == 0.0L) {
      if (counts[t] > 0) return std::numeric_limits<double>::infinity();
      continue;
    }
    statistic += (counts[t] - e) * (counts[t] - e) / e;
  }
  return statistic;
}

std::vector<float> random_logits(size_t vocab, uint32_t seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> logits(vocab);
  for (auto& v : logits) v = normal(rng);
  return logits;
}

SamplerRow make_row(const SamplingParams& params, uint64_t seed) {
  SamplerRow row;
  row.params = &params;
  row.seed = seed;
  return row;
}

// Draws one token per seed 0..draws-1 from the same logits row, in one batch.
std::vector<int> draw_counts(const std::vector<float>& logits, const SamplingParams& params,
                             int draws, std::span<const uint32_t> mask = {}) {
  const size_t vocab = logits.size();
  std::vector<float> batch(vocab * static_cast<size_t>(draws));
  std::vector<SamplerRow> rows;
  for (int i = 0; i < draws; ++i) {
    std::copy(logits.begin(), logits.end(), batch.begin() + static_cast<std::ptrdiff_t>(i * vocab));
    rows.push_back(make_row(params, static_cast<uint64_t>(i) + 1u));
    rows.back().allowed_token_bitmask = mask;
  }
  ThreadPool pool(2);
  Sampler sampler({.pool = &pool});
  const auto results = sampler.sample(batch, static_cast<int64_t>(vocab), rows);
  std::vector<int> counts(vocab, 0);
  for (const auto& result : results) {
    EXPECT_TRUE(result.ok()) << result.error;
    if (result.ok()) ++counts[static_cast<size_t>(result.token_id)];
  }
  return counts;
}

// ---------------------------------------------------------------------------------------
// Filters keep exactly the oracle's token sets, with the oracle's probabilities.

TEST(TokenFilters, KeepExactlyTheOracleSet) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  FilterScratch scratch;
  CandidateDistribution distribution;
  int cases_with_filtering = 0;
  for (int c = 0; c < 300; ++c) {
    const size_t vocab = 1 + static_cast<size_t>(rng() % 64);
    std::vector<float> logits = random_logits(vocab, static_cast<uint32_t>(c + 100));
    // Some ties and forbidden tokens.
    for (size_t t = 0; t + 3 < vocab; t += 5) logits[t + 1] = logits[t];
    for (size_t t = 2; t + 1 < vocab; t += 9) logits[t] = kNegInf;
    if (std::all_of(logits.begin(), logits.end(), [](float v) { return v == kNegInf; })) continue;
    SamplingParams params;
    params.temperature = 0.25f + 2.0f * unit(rng);
    params.top_k = (c % 3 == 0) ? 0 : 1 + static_cast<int32_t>(rng() % 20);
    params.top_p = (c % 4 == 0) ? 1.0f : 0.05f + 0.9f * unit(rng);
    params.min_p = (c % 5 < 2) ? 0.0f : 0.3f * unit(rng);

    build_candidate_distribution(logits, params, distribution, scratch);
    const auto expected = oracle_distribution(logits, params);

    std::set<int32_t> got(distribution.token_ids.begin(), distribution.token_ids.end());
    std::set<int32_t> want;
    for (size_t t = 0; t < vocab; ++t) {
      if (expected[t] > 0.0L) want.insert(static_cast<int32_t>(t));
    }
    ASSERT_EQ(got, want) << "case " << c << " top_k=" << params.top_k << " top_p=" << params.top_p
                         << " min_p=" << params.min_p;
    ASSERT_EQ(got.size(), distribution.token_ids.size()) << "duplicates in case " << c;
    cases_with_filtering += want.size() < vocab ? 1 : 0;
    for (size_t j = 0; j < distribution.size(); ++j) {
      const auto t = static_cast<size_t>(distribution.token_ids[j]);
      EXPECT_NEAR(distribution.weights[j] / distribution.total, static_cast<double>(expected[t]),
                  1e-12);
      if (j > 0) {  // sorted: most likely first, equal values by lower id
        const auto prev = static_cast<size_t>(distribution.token_ids[j - 1]);
        EXPECT_TRUE(logits[prev] > logits[t] || (logits[prev] == logits[t] && prev < t));
      }
    }
  }
  EXPECT_GT(cases_with_filtering, 200);  // the cases exercised the filters
}

TEST(TokenFilters, HandPickedBoundaries) {
  FilterScratch scratch;
  CandidateDistribution d;
  const auto ids = [&](const std::vector<float>& logits, const SamplingParams& params) {
    build_candidate_distribution(logits, params, d, scratch);
    return d.token_ids;
  };
  // probabilities 0.4, 0.3, 0.2, 0.1 (log of them): top_p 0.7 keeps two (0.4 < 0.7 <= 0.7),
  // 0.71 keeps three; top_k 2 keeps two; ties at the k-th value are all kept.
  const std::vector<float> logits = {std::log(0.1f), std::log(0.4f), std::log(0.2f),
                                     std::log(0.3f)};
  SamplingParams p;
  p.top_p = 0.69f;
  EXPECT_EQ(ids(logits, p), (std::vector<int32_t>{1, 3}));
  p.top_p = 0.71f;
  EXPECT_EQ(ids(logits, p), (std::vector<int32_t>{1, 3, 2}));
  p = {};
  p.top_k = 2;
  EXPECT_EQ(ids(logits, p), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(ids({1.0f, 2.0f, 2.0f, 2.0f, 0.0f}, p), (std::vector<int32_t>{1, 2, 3}));
  p = {};
  p.min_p = 0.49f;  // keeps p >= 0.196
  EXPECT_EQ(ids(logits, p), (std::vector<int32_t>{1, 3, 2}));
  p.min_p = 0.51f;
  EXPECT_EQ(ids(logits, p), (std::vector<int32_t>{1, 3}));
  p = {};
  p.top_p = 1e-6f;  // always keeps the most likely token
  EXPECT_EQ(ids(logits, p), (std::vector<int32_t>{1}));
}

// ---------------------------------------------------------------------------------------
// Sampled frequencies follow the oracle's distribution, and would not follow a wrong one.

struct FrequencyCase {
  const char* name;
  SamplingParams params;
  std::vector<SamplingParams> wrong;  // plausible mistakes the test must be able to reject
};

TEST(Sampler, FrequenciesMatchOracleDistribution) {
  const std::vector<float> logits = {1.2f, 0.3f, -0.4f, 2.0f, 0.9f,  -1.5f,
                                     0.0f, 1.6f, -0.8f, 0.5f, -2.5f, 1.0f};
  const auto with = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    return p;
  };
  const std::vector<FrequencyCase> cases = {
      {"temperature",
       with([](SamplingParams& p) { p.temperature = 0.7f; }),
       {with([](SamplingParams& p) { p.temperature = 1.0f; })}},
      {"top_k",
       with([](SamplingParams& p) { p.top_k = 4; }),
       {with([](SamplingParams& p) { p.top_k = 5; }),
        with([](SamplingParams& p) { p.top_k = 3; })}},
      {"top_p",
       with([](SamplingParams& p) { p.top_p = 0.6f; }),
       {with([](SamplingParams& p) { p.top_p = 1.0f; }),
        with([](SamplingParams& p) { p.top_p = 0.45f; })}},
      {"min_p",
       with([](SamplingParams& p) { p.min_p = 0.3f; }),
       {with([](SamplingParams& p) { p.min_p = 0.0f; }),
        with([](SamplingParams& p) { p.min_p = 0.5f; })}},
      {"combined",
       with([](SamplingParams& p) {
         p.temperature = 1.3f;
         p.top_k = 8;
         p.top_p = 0.85f;
         p.min_p = 0.1f;
       }),
       {with([](SamplingParams& p) {
          p.temperature = 1.3f;
          p.top_k = 8;
          p.min_p = 0.1f;
        }),
        with([](SamplingParams& p) {
          p.temperature = 1.3f;
          p.top_p = 0.85f;
          p.min_p = 0.1f;
        })}},
  };
  constexpr int kDraws = 20000;
  for (const auto& c : cases) {
    const auto counts = draw_counts(logits, c.params, kDraws);
    int df = 0;
    const double statistic = chi_square(counts, oracle_distribution(logits, c.params), kDraws, &df);
    EXPECT_LT(statistic, chi_square_critical(df)) << c.name;
    std::printf("%-12s chi2 = %8.2f (df %d, 1e-6 tail %.1f)\n", c.name, statistic, df,
                chi_square_critical(df));
    for (const auto& wrong : c.wrong) {
      int wrong_df = 0;
      const double wrong_statistic =
          chi_square(counts, oracle_distribution(logits, wrong), kDraws, &wrong_df);
      EXPECT_GT(wrong_statistic, chi_square_critical(wrong_df)) << c.name << " (power)";
    }
  }
}

// ---------------------------------------------------------------------------------------
// Greedy.

TEST(Sampler, GreedyPicksArgmaxWithTiesToLowestId) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_k = 1;  // irrelevant under greedy
  Sampler sampler;
  const std::vector<float> logits = {1.0f, 5.0f, 3.0f, 5.0f, 5.0f, kNegInf};
  std::vector<SamplerRow> rows = {make_row(params, 1)};
  EXPECT_EQ(sampler.sample(logits, 6, rows)[0].token_id, 1);
  const std::vector<uint32_t> mask = {0b011100u};  // tokens 2, 3, 4
  rows[0].allowed_token_bitmask = mask;
  EXPECT_EQ(sampler.sample(logits, 6, rows)[0].token_id, 3);
  // Temperatures below 1e-5 are greedy too; the seed does not matter.
  params.temperature = 5e-6f;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    rows[0].seed = seed;
    EXPECT_EQ(sampler.sample(logits, 6, rows)[0].token_id, 3);
  }
}

// ---------------------------------------------------------------------------------------
// Penalties.

TEST(Penalties, HandDerivedValues) {
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.frequency_penalty = 0.25f;
  params.presence_penalty = 0.5f;
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f, kNegInf};
  const std::vector<int32_t> prompt = {0, 1, 0, 6};
  const std::vector<int32_t> output = {1, 2, 2, 5};
  TokenHistoryScratch scratch;
  apply_penalties(logits, params, prompt, output, scratch);
  // t0 prompt only: 2/2. t1 prompt+output once: -1*2 - 0.25 - 0.5. t2 output twice:
  // 0.5/2 - 0.5 - 0.5. t3, t4 unseen. t5 output once, logit 0 is multiplied: 0 - 0.75.
  // t6 stays -inf.
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -2.75f, -0.75f, 3.0f, -2.0f, -0.75f, kNegInf}));
  EXPECT_TRUE(std::all_of(scratch.output_counts.begin(), scratch.output_counts.end(),
                          [](int32_t v) { return v == 0; }));
  EXPECT_TRUE(
      std::all_of(scratch.seen.begin(), scratch.seen.end(), [](uint8_t v) { return v == 0; }));

  // Presence and frequency ignore the prompt; negative values encourage.
  params = {};
  params.presence_penalty = 1.0f;
  params.frequency_penalty = -1.0f;
  logits = {1.0f, 1.0f, 1.0f};
  const std::vector<int32_t> prompt2 = {0, 0};
  const std::vector<int32_t> output2 = {2, 2, 2};
  apply_penalties(logits, params, prompt2, output2, scratch);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, 1.0f, 1.0f - 1.0f + 3.0f}));
}

TEST(Sampler, PenaltiesMoveGreedyButNotRawLogprobs) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.repetition_penalty = 1.1f;
  params.logprobs = 1;
  const std::vector<float> logits = {3.0f, 2.9f};
  const std::vector<int32_t> prompt = {0};
  SamplerRow row = make_row(params, 0);
  row.prompt_token_ids = prompt;
  Sampler sampler;
  const auto result = sampler.sample(logits, 2, std::span(&row, 1))[0];
  ASSERT_TRUE(result.ok()) << result.error;
  EXPECT_EQ(result.token_id, 1);  // 3 / 1.1 < 2.9
  // Raw: log_softmax of (3, 2.9), unaffected by the penalty.
  const long double lse = std::log(std::exp(3.0L) + std::exp(static_cast<long double>(2.9f)));
  ASSERT_TRUE(result.sampled_logprob.has_value());
  EXPECT_NEAR(result.sampled_logprob->logprob, static_cast<double>(2.9f - lse), 1e-6);
  EXPECT_EQ(result.sampled_logprob->rank, 2);
  ASSERT_EQ(result.top_logprobs.size(), 1u);
  EXPECT_EQ(result.top_logprobs[0].token_id, 0);
  EXPECT_NEAR(result.top_logprobs[0].logprob, static_cast<double>(3.0L - lse), 1e-6);
}

// ---------------------------------------------------------------------------------------
// Logprobs.

TEST(Sampler, LogprobsAreRawLogSoftmaxOverAllowedTokens) {
  const size_t vocab = 70;
  std::vector<float> logits = random_logits(vocab, 3);
  logits[10] = logits[11];  // a tie inside the top list, likely
  std::vector<uint32_t> mask(3, 0xffffffffu);
  mask[0] &= ~(1u << 5);  // forbid token 5
  SamplingParams params;
  params.temperature = 0.6f;
  params.top_k = 10;
  params.presence_penalty = 1.0f;
  params.logprobs = 6;
  const std::vector<int32_t> output = {1, 2, 3};
  Sampler sampler;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SamplerRow row = make_row(params, seed);
    row.allowed_token_bitmask = mask;
    row.output_token_ids = output;
    const auto result = sampler.sample(logits, static_cast<int64_t>(vocab), std::span(&row, 1))[0];
    ASSERT_TRUE(result.ok()) << result.error;
    // Oracle: log_softmax over the allowed tokens of the unprocessed logits.
    long double z = 0.0L;
    for (size_t t = 0; t < vocab; ++t)
      z += t == 5 ? 0.0L : std::exp(static_cast<long double>(logits[t]));
    const auto logprob = [&](size_t t) { return static_cast<double>(logits[t] - std::log(z)); };
    std::vector<size_t> order;
    for (size_t t = 0; t < vocab; ++t) {
      if (t != 5) order.push_back(t);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    ASSERT_EQ(result.top_logprobs.size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(result.top_logprobs[i].token_id, static_cast<int32_t>(order[i]));
      EXPECT_NEAR(result.top_logprobs[i].logprob, logprob(order[i]), 1e-5);
      EXPECT_EQ(result.top_logprobs[i].rank, static_cast<int64_t>(i + 1));
    }
    const auto chosen = static_cast<size_t>(result.token_id);
    ASSERT_TRUE(result.sampled_logprob.has_value());
    EXPECT_NE(chosen, 5u);
    EXPECT_NEAR(result.sampled_logprob->logprob, logprob(chosen), 1e-5);
    int64_t rank = 0;
    for (size_t t = 0; t < vocab; ++t) rank += (t != 5 && logits[t] >= logits[chosen]) ? 1 : 0;
    EXPECT_EQ(result.sampled_logprob->rank, rank);
  }
}

// ---------------------------------------------------------------------------------------
// Grammar mask and min_tokens.

TEST(Sampler, NeverSamplesMaskedTokensAndKeepsTheirRatios) {
  const size_t vocab = 100;
  const std::vector<float> logits = random_logits(vocab, 11, 1.0f);
  const std::vector<size_t> allowed = {3, 17, 31, 32, 64, 98, 99};
  std::vector<uint32_t> mask(4, 0u);
  for (const size_t t : allowed) mask[t / 32] |= 1u << (t % 32);
  mask[3] |= 0xfffffff0u;  // bits past the vocabulary (100..127) mean nothing
  SamplingParams params;
  params.temperature = 1.0f;
  constexpr int kDraws = 10000;
  const auto counts = draw_counts(logits, params, kDraws, mask);
  std::vector<float> masked(vocab, kNegInf);
  for (const size_t t : allowed) masked[t] = logits[t];
  int df = 0;
  const double statistic = chi_square(counts, oracle_distribution(masked, params), kDraws, &df);
  EXPECT_LT(statistic, chi_square_critical(df));  // +inf if a masked token were drawn
  EXPECT_EQ(df, static_cast<int>(allowed.size()) - 1);
}

TEST(Sampler, RowErrorsStayInTheirRow) {
  const size_t vocab = 40;
  const std::vector<float> one_row = random_logits(vocab, 5);
  std::vector<float> logits;
  for (int r = 0; r < 5; ++r) logits.insert(logits.end(), one_row.begin(), one_row.end());
  logits[4 * vocab + 7] = std::numeric_limits<float>::quiet_NaN();
  SamplingParams good;
  SamplingParams bad_params;
  bad_params.top_p = 0.0f;
  SamplingParams only_eos;
  only_eos.min_tokens = 2;
  const std::vector<uint32_t> no_token = {0u, 0u};
  const std::vector<uint32_t> eos_only = {1u << 9, 0u};
  const std::vector<int32_t> eos = {9};
  std::vector<SamplerRow> rows(5, make_row(good, 1));
  rows[0].allowed_token_bitmask = no_token;
  rows[1].params = &bad_params;
  rows[2].params = &only_eos;
  rows[2].allowed_token_bitmask = eos_only;
  rows[2].eos_token_ids = eos;
  // rows[3] is healthy, rows[4] has a NaN logit.
  ThreadPool pool(2);
  Sampler sampler({.pool = &pool});
  const auto results = sampler.sample(logits, static_cast<int64_t>(vocab), rows);
  EXPECT_NE(results[0].error.find("grammar allows no token"), std::string::npos)
      << results[0].error;
  EXPECT_NE(results[1].error.find("top_p must be in (0, 1], got 0"), std::string::npos)
      << results[1].error;
  EXPECT_NE(results[2].error.find("min_tokens = 2"), std::string::npos) << results[2].error;
  EXPECT_TRUE(results[3].ok()) << results[3].error;
  EXPECT_GE(results[3].token_id, 0);
  EXPECT_NE(results[4].error.find("nan at token 7"), std::string::npos) << results[4].error;

  // A mask of the wrong size and history ids outside the vocabulary are row errors too.
  const std::vector<uint32_t> short_mask = {1u};
  SamplingParams penalised;
  penalised.frequency_penalty = 0.5f;
  const std::vector<int32_t> bad_history = {3, 40};
  std::vector<SamplerRow> more = {make_row(good, 1), make_row(penalised, 1)};
  more[0].allowed_token_bitmask = short_mask;
  more[1].output_token_ids = bad_history;
  const auto more_results =
      sampler.sample(std::span(logits).first(2 * vocab), static_cast<int64_t>(vocab), more);
  EXPECT_NE(more_results[0].error.find("bitmask has 1 words, expected 2"), std::string::npos)
      << more_results[0].error;
  EXPECT_NE(more_results[1].error.find("output token ids[1] = 40 is outside"), std::string::npos)
      << more_results[1].error;
}

TEST(Sampler, MinTokensBansStopAndEosUntilReached) {
  const std::vector<float> logits = {0.0f, 0.5f, 9.0f, 0.2f, 8.0f, 0.1f};
  const std::vector<int32_t> eos = {2};
  SamplingParams params;
  params.min_tokens = 3;
  params.stop_token_ids = {4};
  const std::vector<int32_t> two = {0, 1};
  const std::vector<int32_t> three = {0, 1, 3};
  Sampler sampler;
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    SamplerRow row = make_row(params, seed);
    row.eos_token_ids = eos;
    row.output_token_ids = two;
    const auto result = sampler.sample(logits, 6, std::span(&row, 1))[0];
    ASSERT_TRUE(result.ok()) << result.error;
    seen.insert(result.token_id);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 3, 5}));
  params.temperature = 0.0f;
  SamplerRow row = make_row(params, 0);
  row.eos_token_ids = eos;
  row.output_token_ids = two;
  EXPECT_EQ(sampler.sample(logits, 6, std::span(&row, 1))[0].token_id, 1);
  row.output_token_ids = three;  // reached: EOS is allowed again
  EXPECT_EQ(sampler.sample(logits, 6, std::span(&row, 1))[0].token_id, 2);
  params.ignore_eos = true;  // EOS is then an ordinary token, not banned
  row.output_token_ids = two;
  EXPECT_EQ(sampler.sample(logits, 6, std::span(&row, 1))[0].token_id, 2);
}

// ---------------------------------------------------------------------------------------
// Determinism: a row's result depends only on the row.

struct Request {
  SamplingParams params;
  std::vector<float> logits;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  std::vector<uint32_t> mask;
  std::vector<int32_t> eos;
  uint64_t seed = 0;
  uint32_t sample_index = 0;
};

std::vector<Request> make_requests(size_t vocab, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<Request> requests(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    Request& r = requests[static_cast<size_t>(i)];
    r.logits = random_logits(vocab, rng());
    r.params.temperature = (i % 6 == 0) ? 0.0f : 0.3f + 1.5f * unit(rng);
    r.params.top_k = (i % 3 == 0) ? 0 : 1 + static_cast<int32_t>(rng() % 100);
    r.params.top_p = (i % 4 == 0) ? 1.0f : 0.5f + 0.5f * unit(rng);
    r.params.min_p = (i % 5 == 0) ? 0.05f : 0.0f;
    r.params.repetition_penalty = (i % 2 == 0) ? 1.2f : 1.0f;
    r.params.frequency_penalty = (i % 7 == 0) ? 0.4f : 0.0f;
    r.params.logprobs = (i % 2 == 1) ? std::optional<int32_t>(4) : std::nullopt;
    r.params.min_tokens = (i % 8 == 0) ? 5 : 0;
    for (int k = 0; k < 20; ++k) r.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    for (int k = 0; k < i % 9; ++k) r.output.push_back(static_cast<int32_t>(rng() % vocab));
    if (i % 4 == 3) {
      r.mask.assign((vocab + 31) / 32, 0u);
      for (auto& word : r.mask) word = static_cast<uint32_t>(rng()) | 1u;
    }
    r.eos = {static_cast<int32_t>(i % vocab)};
    r.seed = (i % 5 == 1) ? 77u : rng();  // some requests share a seed
    r.sample_index = static_cast<uint32_t>(i % 3);
  }
  return requests;
}

std::vector<SampledToken> run_batch(const std::vector<Request>& requests,
                                    const std::vector<size_t>& order, size_t vocab, int threads) {
  std::vector<float> logits;
  std::vector<SamplerRow> rows;
  for (const size_t i : order) {
    const Request& r = requests[i];
    logits.insert(logits.end(), r.logits.begin(), r.logits.end());
    SamplerRow row;
    row.params = &r.params;
    row.seed = r.seed;
    row.sample_index = r.sample_index;
    row.prompt_token_ids = r.prompt;
    row.output_token_ids = r.output;
    row.allowed_token_bitmask = r.mask;
    row.eos_token_ids = r.eos;
    rows.push_back(row);
  }
  // threads == 0: no pool, every row on the calling thread.
  std::unique_ptr<ThreadPool> pool = threads > 0 ? std::make_unique<ThreadPool>(threads) : nullptr;
  Sampler sampler({.pool = pool.get()});
  return sampler.sample(logits, static_cast<int64_t>(vocab), rows);
}

void expect_same(const SampledToken& a, const SampledToken& b, const std::string& where) {
  EXPECT_EQ(a.token_id, b.token_id) << where;
  EXPECT_EQ(a.error, b.error) << where;
  ASSERT_EQ(a.sampled_logprob.has_value(), b.sampled_logprob.has_value()) << where;
  if (a.sampled_logprob) {
    EXPECT_EQ(a.sampled_logprob->logprob, b.sampled_logprob->logprob) << where;  // bitwise
    EXPECT_EQ(a.sampled_logprob->rank, b.sampled_logprob->rank) << where;
  }
  ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size()) << where;
  for (size_t i = 0; i < a.top_logprobs.size(); ++i) {
    EXPECT_EQ(a.top_logprobs[i].token_id, b.top_logprobs[i].token_id) << where;
    EXPECT_EQ(a.top_logprobs[i].logprob, b.top_logprobs[i].logprob) << where;
  }
}

TEST(Sampler, RowResultIndependentOfBatchOrderAndThreads) {
  const size_t vocab = 3000;
  const auto requests = make_requests(vocab, 40, 2024);
  const auto fillers = make_requests(vocab, 25, 99);

  std::vector<SampledToken> alone;
  for (size_t i = 0; i < requests.size(); ++i) {
    alone.push_back(run_batch(requests, {i}, vocab, 0)[0]);
    ASSERT_TRUE(alone.back().ok()) << alone.back().error;
  }
  std::set<int32_t> distinct;
  for (const auto& a : alone) distinct.insert(a.token_id);
  EXPECT_GT(distinct.size(), 20u);  // the requests really differ

  std::vector<size_t> in_order(requests.size());
  for (size_t i = 0; i < in_order.size(); ++i) in_order[i] = i;
  std::vector<size_t> reversed(in_order.rbegin(), in_order.rend());
  std::vector<size_t> shuffled = in_order;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(5));

  for (const int threads : {0, 1, 2, 3, 8}) {
    for (const auto* order : {&in_order, &reversed, &shuffled}) {
      const auto results = run_batch(requests, *order, vocab, threads);
      for (size_t k = 0; k < order->size(); ++k) {
        expect_same(
            results[k], alone[(*order)[k]],
            "request " + std::to_string((*order)[k]) + " threads " + std::to_string(threads));
      }
    }
  }

  // Mixed with other requests, interleaved.
  std::vector<Request> mixed;
  std::vector<size_t> where;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i < fillers.size()) mixed.push_back(fillers[i]);
    where.push_back(mixed.size());
    mixed.push_back(requests[i]);
  }
  std::vector<size_t> mixed_order(mixed.size());
  for (size_t i = 0; i < mixed_order.size(); ++i) mixed_order[i] = i;
  const auto results = run_batch(mixed, mixed_order, vocab, 4);
  for (size_t i = 0; i < requests.size(); ++i) {
    expect_same(results[where[i]], alone[i], "mixed request " + std::to_string(i));
  }
}

TEST(Sampler, DrawsDependOnSeedPositionAndSampleIndex) {
  const std::vector<float> flat(64, 0.0f);
  SamplingParams params;
  Sampler sampler;
  const auto draw = [&](uint64_t seed, size_t position, uint32_t sample_index) {
    std::vector<int32_t> output(position, 0);
    SamplerRow row = make_row(params, seed);
    row.output_token_ids = output;
    row.sample_index = sample_index;
    return sampler.sample(flat, 64, std::span(&row, 1))[0].token_id;
  };
  std::set<int32_t> by_position, by_seed, by_index;
  for (uint32_t k = 0; k < 40; ++k) {
    by_position.insert(draw(1, k, 0));
    by_seed.insert(draw(k, 3, 0));
    by_index.insert(draw(1, 3, k));
    EXPECT_EQ(draw(k, k, k), draw(k, k, k));
  }
  // 40 draws from 64 equally likely tokens: far more than 10 distinct unless a key is ignored.
  EXPECT_GT(by_position.size(), 10u);
  EXPECT_GT(by_seed.size(), 10u);
  EXPECT_GT(by_index.size(), 10u);
}

}  // namespace
}  // namespace deepinfer::sampling
