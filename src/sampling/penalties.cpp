#include "sampling/penalties.h"

#include <cmath>

#include "core/error.h"

namespace deepinfer::sampling {

void TokenHistoryScratch::reserve_vocab(int64_t vocab_size) {
  const auto size = static_cast<size_t>(vocab_size);
  if (output_counts.size() < size) output_counts.resize(size, 0);
  if (seen.size() < size) seen.resize(size, 0);
}

void apply_min_tokens_ban(std::span<float> logits, const SamplingParams& params,
                          size_t output_length, std::span<const int32_t> eos_token_ids) {
  if (output_length >= static_cast<size_t>(params.min_tokens)) return;
  const auto ban = [&](int32_t token) {
    if (token >= 0 && static_cast<size_t>(token) < logits.size()) {
      logits[static_cast<size_t>(token)] = -INFINITY;
    }
  };
  for (const int32_t token : params.stop_token_ids) ban(token);
  if (!params.ignore_eos) {
    for (const int32_t token : eos_token_ids) ban(token);
  }
}

bool has_penalties(const SamplingParams& params) {
  return params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f ||
         params.frequency_penalty != 0.0f;
}

void apply_penalties(std::span<float> logits, const SamplingParams& params,
                     std::span<const int32_t> prompt_token_ids,
                     std::span<const int32_t> output_token_ids, TokenHistoryScratch& scratch) {
  scratch.reserve_vocab(static_cast<int64_t>(logits.size()));
  const auto index = [&](int32_t token) {
    DI_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size(), "token id ", token,
             " outside the vocabulary of ", logits.size());
    return static_cast<size_t>(token);
  };

  const float repetition = params.repetition_penalty;
  if (repetition != 1.0f) {
    // `seen` marks a token once so that a token repeated in the history is penalised once.
    const auto penalise_once = [&](int32_t token) {
      const size_t t = index(token);
      if (scratch.seen[t] != 0) return;
      scratch.seen[t] = 1;
      logits[t] = logits[t] > 0.0f ? logits[t] / repetition : logits[t] * repetition;
    };
    for (const int32_t token : prompt_token_ids) penalise_once(token);
    for (const int32_t token : output_token_ids) penalise_once(token);
    for (const int32_t token : prompt_token_ids) scratch.seen[index(token)] = 0;
    for (const int32_t token : output_token_ids) scratch.seen[index(token)] = 0;
  }

  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    for (const int32_t token : output_token_ids) ++scratch.output_counts[index(token)];
    for (const int32_t token : output_token_ids) {
      const size_t t = index(token);
      const int32_t count = scratch.output_counts[t];
      if (count == 0) continue;  // already applied for an earlier occurrence
      logits[t] -= params.frequency_penalty * static_cast<float>(count);
      logits[t] -= params.presence_penalty;
      scratch.output_counts[t] = 0;
    }
  }
}

}  // namespace deepinfer::sampling
