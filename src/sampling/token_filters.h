// From processed logits to the distribution a random draw picks from: temperature, then
// min_p, top_k and top_p (vLLM's order). The result lists the surviving tokens from most to
// least likely, ties broken by the lower token id, with unnormalised weights: a total order
// that depends on nothing but this row, so the draw is batch invariant.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deepinfer/sampling_params.h"

namespace deepinfer::sampling {

struct CandidateDistribution {
  std::vector<int32_t> token_ids;  // most likely first; equal logits: lower id first
  std::vector<double> weights;     // exp(logit / T - max), same order, all > 0
  double total = 0.0;              // sum of weights, added in list order

  size_t size() const { return token_ids.size(); }
};

// Reused buffers (one per thread) so that a step allocates nothing once warm.
struct FilterScratch {
  std::vector<float> scaled_logits;
  std::vector<float> candidate_values;
};

// Definitions, with l_t = logits[t] / temperature (float) and w_t = exp(l_t - max_l) (double):
//  - candidates: tokens with w_t > 0 (so -inf logits never survive);
//  - min_p: keep w_t >= min_p (max w is 1, so this is p_t >= min_p * p_max);
//  - top_k (> 0): keep l_t >= the k-th largest l among the survivors (boundary ties kept);
//  - top_p (< 1): in the sorted order, keep token j while the weight before it is
//    < top_p * (total weight of the survivors): the smallest prefix with mass >= top_p.
// Needs temperature >= kGreedyTemperature and at least one finite logit.
void build_candidate_distribution(std::span<const float> logits, const SamplingParams& params,
                                  CandidateDistribution& out, FilterScratch& scratch);

// Index into `distribution` picked by `uniform` in [0, 1): the first j whose running weight
// sum exceeds uniform * total (inverse CDF over the sorted list).
size_t pick_by_inverse_cdf(const CandidateDistribution& distribution, double uniform);

}  // namespace deepinfer::sampling
