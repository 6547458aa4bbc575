// The one-request oracle of the engine tests: a plain loop that recomputes the toy model's
// logits from the whole prefix for every token and calls the sampler, then applies the stop
// rules the simple way — EOS / stop tokens, max_tokens, max_model_len, and stop strings by
// decoding ALL tokens so far with Tokenizer::decode (not the engine's streaming detokenizer)
// and searching the whole text. It shares only the toy model, the sampler and the tokenizer
// with the engine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "deepinfer/outputs.h"
#include "deepinfer/sampling_params.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"
#include "toy_runner.h"

namespace deepinfer::engine::testing {

struct Expected {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  std::string text;
  std::optional<std::string> stop_reason;
};

struct ToyModel {
  int64_t vocab = 0;
  std::vector<int32_t> eos;
  int64_t max_model_len = 0;
  const tokenizer::Tokenizer* tokenizer = nullptr;  // text and stop strings when set
};

inline Expected reference(const ToyModel& model, const std::vector<int32_t>& prompt,
                          const SamplingParams& params, uint32_t sample_index = 0) {
  sampling::Sampler sampler;
  Expected out;
  std::vector<float> logits(static_cast<size_t>(model.vocab));
  const auto decode = [&](size_t count) {
    return model.tokenizer->decode(std::span(out.tokens).first(count), params.skip_special_tokens);
  };
  while (true) {
    uint64_t hash = 0;
    for (int32_t t : prompt) hash = toy_extend(hash, t);
    for (int32_t t : out.tokens) hash = toy_extend(hash, t);
    toy_logits(hash, logits);
    sampling::SamplerRow row;
    row.params = &params;
    row.seed = *params.seq_seed;
    row.sample_index = sample_index;
    row.prompt_token_ids = prompt;
    row.output_token_ids = out.tokens;
    row.eos_token_ids = model.eos;
    const auto sampled = sampler.sample(logits, model.vocab, std::span(&row, 1));
    EXPECT_TRUE(sampled[0].ok()) << sampled[0].error;
    const int32_t token = sampled[0].token_id;
    out.tokens.push_back(token);
    const auto length = static_cast<int64_t>(out.tokens.size());
    const bool eos = !params.ignore_eos &&
                     std::find(model.eos.begin(), model.eos.end(), token) != model.eos.end();
    const bool stop_token = std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                                      token) != params.stop_token_ids.end();
    if (eos || stop_token) {
      if (stop_token && !eos) out.stop_reason = std::to_string(token);
      // The stop token's own text is not part of the output.
      if (model.tokenizer) out.text = decode(out.tokens.size() - 1);
      out.reason = FinishReason::kStop;
      return out;
    }
    if (model.tokenizer) {
      out.text = decode(out.tokens.size());
      if (length > params.min_tokens) {
        std::optional<size_t> first;
        for (const auto& stop : params.stop) {
          const size_t at = out.text.find(stop);
          if (at != std::string::npos && (!first || at < *first)) {
            first = at;
            out.stop_reason = stop;
          }
        }
        if (first) {
          out.text.resize(*first);
          out.reason = FinishReason::kStop;
          return out;
        }
      }
    }
    if ((params.max_tokens && length >= *params.max_tokens) ||
        static_cast<int64_t>(prompt.size()) + length >= model.max_model_len) {
      out.reason = FinishReason::kLength;
      return out;
    }
  }
}

}  // namespace deepinfer::engine::testing
