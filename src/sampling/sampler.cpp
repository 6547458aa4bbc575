#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "sampling/penalties.h"
#include "sampling/philox.h"
#include "sampling/token_filters.h"

namespace deepinfer::sampling {

struct SamplerWorkspace {
  std::vector<float> logits;
  std::vector<int32_t> token_order;
  TokenHistoryScratch history;
  FilterScratch filters;
  CandidateDistribution candidates;
};

namespace {

bool is_allowed(std::span<const uint32_t> bitmask, size_t token) {
  return bitmask.empty() || ((bitmask[token / 32] >> (token % 32)) & 1u) != 0;
}

void check_token_ids(std::span<const int32_t> ids, int64_t vocab_size, std::string_view what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      DI_THROW(what, "[", i, "] = ", ids[i], " is outside the vocabulary [0, ", vocab_size, ")");
    }
  }
}

// log(sum(exp(logits))) over the finite logits, summed in id order in double.
double log_sum_exp(std::span<const float> logits) {
  float max_logit = -INFINITY;
  for (const float value : logits) max_logit = std::max(max_logit, value);
  double sum = 0.0;
  for (const float value : logits) sum += std::exp(static_cast<double>(value) - max_logit);
  return static_cast<double>(max_logit) + std::log(sum);
}

// The `count` largest finite logits, most likely first, ties by lower id.
void top_logprobs(std::span<const float> logits, double lse, size_t count,
                  std::vector<int32_t>& order, std::vector<TokenLogprob>& out) {
  order.clear();
  for (size_t t = 0; t < logits.size(); ++t) {
    if (logits[t] != -INFINITY) order.push_back(static_cast<int32_t>(t));
  }
  count = std::min(count, order.size());
  const auto more_likely = [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(count), order.end(),
                    more_likely);
  out.clear();
  for (size_t i = 0; i < count; ++i) {
    const int32_t token = order[i];
    out.push_back({token, static_cast<float>(logits[static_cast<size_t>(token)] - lse),
                   static_cast<int64_t>(i + 1)});
  }
}

int32_t argmax_lowest_id(std::span<const float> logits) {
  size_t best = 0;
  for (size_t t = 1; t < logits.size(); ++t) {
    if (logits[t] > logits[best]) best = t;
  }
  return static_cast<int32_t>(best);
}

void sample_row(std::span<const float> row_logits, const SamplerRow& row, SamplerWorkspace& ws,
                SampledToken& result);

}  // namespace

Sampler::Sampler(SamplerOptions options) : options_(options) {
  const int workspaces = options_.pool != nullptr ? options_.pool->num_threads() : 1;
  for (int i = 0; i < workspaces; ++i) workspaces_.push_back(std::make_unique<SamplerWorkspace>());
}

Sampler::~Sampler() = default;

std::vector<SampledToken> Sampler::sample(std::span<const float> logits, int64_t vocab_size,
                                          std::span<const SamplerRow> rows) {
  std::vector<SampledToken> results(rows.size());
  sample(logits, vocab_size, rows, results);
  return results;
}

void Sampler::sample(std::span<const float> logits, int64_t vocab_size,
                     std::span<const SamplerRow> rows, std::span<SampledToken> results) {
  DI_CHECK(vocab_size > 0);
  DI_CHECK(logits.size() == rows.size() * static_cast<size_t>(vocab_size), "logits hold ",
           logits.size(), " values for ", rows.size(), " rows of ", vocab_size);
  DI_CHECK(results.size() == rows.size());
  const auto vocab = static_cast<size_t>(vocab_size);

  const auto run_chunk = [&](size_t begin, size_t end, SamplerWorkspace& ws) {
    for (size_t r = begin; r < end; ++r) {
      results[r] = SampledToken{};
      try {
        sample_row(logits.subspan(r * vocab, vocab), rows[r], ws, results[r]);
      } catch (const Error& error) {
        results[r] = SampledToken{};
        results[r].error = error.what();
      }
    }
  };

  if (options_.pool == nullptr || rows.size() <= 1) {
    run_chunk(0, rows.size(), *workspaces_[0]);
    return;
  }
  // One chunk per workspace: chunk c only ever touches workspaces_[c], and which thread runs
  // a chunk never changes what its rows compute.
  const size_t chunks = std::min(workspaces_.size(), rows.size());
  const auto grain = static_cast<int64_t>((rows.size() + chunks - 1) / chunks);
  options_.pool->parallel_for(0, static_cast<int64_t>(rows.size()), grain,
                              [&](int64_t begin, int64_t end) {
                                run_chunk(static_cast<size_t>(begin), static_cast<size_t>(end),
                                          *workspaces_[static_cast<size_t>(begin / grain)]);
                              });
}

void check_row_inputs(const SamplerRow& row, int64_t vocab_size) {
  DI_CHECK(row.params != nullptr, "SamplerRow.params must be set");
  const SamplingParams& params = *row.params;
  params.validate();
  const auto mask_words = static_cast<size_t>((vocab_size + 31) / 32);
  if (!row.allowed_token_bitmask.empty() && row.allowed_token_bitmask.size() != mask_words) {
    DI_THROW("grammar bitmask has ", row.allowed_token_bitmask.size(), " words, expected ",
             mask_words, " for a vocabulary of ", vocab_size);
  }
  if (has_penalties(params)) {
    check_token_ids(row.prompt_token_ids, vocab_size, "prompt token ids");
    check_token_ids(row.output_token_ids, vocab_size, "output token ids");
  }
}

std::string non_finite_logit_message(float value, size_t token) {
  return concat("model logits are ", value, " at token ", token, "; cannot sample");
}

std::string grammar_allows_nothing_message(size_t position) {
  return concat("the structured-output grammar allows no token at output position ", position);
}

std::string allowed_all_negative_infinity_message(size_t position) {
  return concat("every token allowed at output position ", position,
                " has logit -inf; cannot sample");
}

std::string nothing_sampleable_message(size_t position, size_t allowed_by_grammar,
                                       int64_t min_tokens) {
  return concat("no token can be sampled at output position ", position, ": the grammar allows ",
                allowed_by_grammar, " token(s) with a finite logit and min_tokens = ", min_tokens,
                " bans the stop/EOS tokens among them (or a penalty overflowed them to -inf)");
}

namespace {

void sample_row(std::span<const float> row_logits, const SamplerRow& row, SamplerWorkspace& ws,
                SampledToken& result) {
  check_row_inputs(row, static_cast<int64_t>(row_logits.size()));
  const SamplingParams& params = *row.params;
  const size_t vocab = row_logits.size();
  const size_t position = row.output_token_ids.size();

  // 1. Copy with the grammar mask applied; reject logits no distribution can come from.
  std::vector<float>& logits = ws.logits;
  logits.resize(vocab);
  size_t allowed_by_grammar = 0;
  size_t candidates = 0;
  for (size_t t = 0; t < vocab; ++t) {
    const float value = row_logits[t];
    if (std::isnan(value) || value == INFINITY) throw Error(non_finite_logit_message(value, t));
    const bool allowed = is_allowed(row.allowed_token_bitmask, t);
    allowed_by_grammar += allowed ? 1 : 0;
    logits[t] = allowed ? value : -INFINITY;
    candidates += logits[t] > -INFINITY ? 1 : 0;
  }
  if (allowed_by_grammar == 0) throw Error(grammar_allows_nothing_message(position));
  if (candidates == 0) throw Error(allowed_all_negative_infinity_message(position));

  // 2. Raw log-probabilities (vLLM's default logprobs mode): before penalties/temperature.
  double lse = 0.0;
  if (params.logprobs) {
    lse = log_sum_exp(logits);
    top_logprobs(logits, lse, static_cast<size_t>(*params.logprobs), ws.token_order,
                 result.top_logprobs);
  }
  // Keep the raw value of every token for the sampled token's log-probability and rank.
  const auto raw_logit = [&](size_t t) {
    return is_allowed(row.allowed_token_bitmask, t) ? row_logits[t] : -INFINITY;
  };

  // 3-4. Processors that move the argmax.
  apply_min_tokens_ban(logits, params, row.output_token_ids.size(), row.eos_token_ids);
  if (has_penalties(params)) {
    apply_penalties(logits, params, row.prompt_token_ids, row.output_token_ids, ws.history);
  }
  if (std::none_of(logits.begin(), logits.end(), [](float v) { return v > -INFINITY; })) {
    throw Error(nothing_sampleable_message(position, allowed_by_grammar, params.min_tokens));
  }

  // 5. Pick.
  if (params.is_greedy()) {
    result.token_id = argmax_lowest_id(logits);
  } else {
    build_candidate_distribution(logits, params, ws.candidates, ws.filters);
    const double uniform = token_uniform(row.seed, position, row.sample_index);
    result.token_id = ws.candidates.token_ids[pick_by_inverse_cdf(ws.candidates, uniform)];
  }

  if (params.logprobs) {
    const float chosen = raw_logit(static_cast<size_t>(result.token_id));
    int64_t rank = 0;
    for (size_t t = 0; t < vocab; ++t) rank += raw_logit(t) >= chosen ? 1 : 0;
    result.sampled_logprob = TokenLogprob{result.token_id, static_cast<float>(chosen - lse), rank};
  }
}

}  // namespace
}  // namespace deepinfer::sampling
