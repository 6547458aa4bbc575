// The logits processors that change which token greedy decoding picks: min_tokens (bans the
// stop tokens while the output is too short) and the repetition / presence / frequency
// penalties. They run on the masked logits, before temperature, in vLLM's order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deepinfer/sampling_params.h"

namespace deepinfer::sampling {

// Per-thread scratch of vocabulary size, left all-zero after every call so that a step costs
// O(history) rather than O(vocab) to clear.
struct TokenHistoryScratch {
  std::vector<int32_t> output_counts;
  std::vector<uint8_t> seen;
  void reserve_vocab(int64_t vocab_size);
};

// While fewer than params.min_tokens tokens have been generated, sets to -inf the logits of
// params.stop_token_ids and, unless params.ignore_eos, of `eos_token_ids`.
// Ids outside the vocabulary are skipped here; the sampler reports them per row beforehand.
void apply_min_tokens_ban(std::span<float> logits, const SamplingParams& params,
                          size_t output_length, std::span<const int32_t> eos_token_ids);

// In place, in this order (vLLM's apply_penalties):
//  1. repetition: every distinct token in prompt ∪ output: logit > 0 ? logit / r : logit * r.
//  2. frequency:  logit -= frequency_penalty * (occurrences in output).
//  3. presence:   logit -= presence_penalty if the token occurs in output.
// Prompt tokens count only for the repetition penalty. -inf stays -inf. All ids must be in
// [0, logits.size()).
void apply_penalties(std::span<float> logits, const SamplingParams& params,
                     std::span<const int32_t> prompt_token_ids,
                     std::span<const int32_t> output_token_ids, TokenHistoryScratch& scratch);

bool has_penalties(const SamplingParams& params);

}  // namespace deepinfer::sampling
