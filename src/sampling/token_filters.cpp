#include "sampling/token_filters.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace deepinfer::sampling {

void build_candidate_distribution(std::span<const float> logits, const SamplingParams& params,
                                  CandidateDistribution& out, FilterScratch& scratch) {
  DI_CHECK(!params.is_greedy(), "greedy rows do not build a distribution");
  const size_t vocab = logits.size();
  std::vector<float>& scaled_logits = scratch.scaled_logits;
  scaled_logits.resize(vocab);
  float max_scaled = -INFINITY;
  for (size_t t = 0; t < vocab; ++t) {
    scaled_logits[t] = logits[t] / params.temperature;
    max_scaled = std::max(max_scaled, scaled_logits[t]);
  }
  DI_CHECK(std::isfinite(max_scaled), "no finite logit to sample from");

  // Candidates in id order; weights are recomputed after sorting (cheap, keeps one array).
  out.token_ids.clear();
  const auto min_weight = static_cast<double>(params.min_p);
  for (size_t t = 0; t < vocab; ++t) {
    const double weight = std::exp(static_cast<double>(scaled_logits[t]) - max_scaled);
    if (weight > 0.0 && weight >= min_weight) out.token_ids.push_back(static_cast<int32_t>(t));
  }

  const float* scaled = scaled_logits.data();
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < out.token_ids.size()) {
    // The k-th largest value is unique whatever the selection algorithm does with ties.
    std::vector<float>& candidate_values = scratch.candidate_values;
    candidate_values.resize(out.token_ids.size());
    for (size_t i = 0; i < out.token_ids.size(); ++i) {
      candidate_values[i] = scaled[out.token_ids[i]];
    }
    const auto kth = candidate_values.begin() + (params.top_k - 1);
    std::nth_element(candidate_values.begin(), kth, candidate_values.end(), std::greater<>());
    const float threshold = *kth;
    std::erase_if(out.token_ids, [&](int32_t t) { return scaled[t] < threshold; });
  }

  std::sort(out.token_ids.begin(), out.token_ids.end(), [scaled](int32_t a, int32_t b) {
    return scaled[a] > scaled[b] || (scaled[a] == scaled[b] && a < b);
  });

  out.weights.resize(out.token_ids.size());
  double total = 0.0;
  for (size_t j = 0; j < out.token_ids.size(); ++j) {
    out.weights[j] = std::exp(static_cast<double>(scaled[out.token_ids[j]]) - max_scaled);
    total += out.weights[j];
  }

  if (params.top_p < 1.0f) {
    const double mass = static_cast<double>(params.top_p) * total;
    double before = 0.0;
    size_t keep = 0;
    while (keep < out.weights.size() && before < mass) before += out.weights[keep++];
    out.token_ids.resize(keep);
    out.weights.resize(keep);
    total = 0.0;
    for (const double weight : out.weights) total += weight;
  }
  out.total = total;
  DI_CHECK(!out.token_ids.empty() && total > 0.0, "the most likely token must survive");
}

size_t pick_by_inverse_cdf(const CandidateDistribution& distribution, double uniform) {
  DI_CHECK(distribution.size() > 0);
  const double target = uniform * distribution.total;
  double running = 0.0;
  for (size_t j = 0; j < distribution.size(); ++j) {
    running += distribution.weights[j];
    if (target < running) return j;
  }
  // Only reachable when uniform * total rounds up to total.
  return distribution.size() - 1;
}

}  // namespace deepinfer::sampling
