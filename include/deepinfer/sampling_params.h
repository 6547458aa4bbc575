// Per-request sampling parameters of the offline and server APIs (vLLM-like names and
// defaults). The engine validates them when a request arrives; a bad value fails only that
// request, with the message of the deepinfer::Error that validate() throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

// Structured-output constraint of one request. Compiled by src/structured into a matcher
// whose token bitmask the sampler applies before anything else.
struct StructuredOutputArgs {
  // "regex": `schema` is a PCRE-style regular expression the whole output must match.
  // "json":  `schema` is a JSON Schema (as JSON text); the output is one instance of it.
  // "ebnf":  `schema` is a grammar (GBNF-style EBNF, root rule `root`).
  // "any_json": any single JSON value; `schema` must be empty.
  std::string schema_type;
  std::string schema;

  bool operator==(const StructuredOutputArgs&) const = default;
};

struct SamplingParams {
  // Number of independent completions for the prompt; each draws its own random stream.
  int32_t n = 1;
  // Divides the logits. 0 (anything below 1e-5, as in vLLM) means greedy: argmax, ties to
  // the lowest token id. top_k, top_p and min_p then do not matter.
  float temperature = 1.0f;
  // Nucleus sampling: keep the smallest set of most likely tokens whose mass reaches top_p.
  // In (0, 1]; 1 keeps everything.
  float top_p = 1.0f;
  // Keep the tokens whose logit is at least the k-th largest (ties at the boundary are all
  // kept, as in vLLM). 0 or -1 turns it off.
  int32_t top_k = 0;
  // Drop tokens whose probability is below min_p times the largest probability. In [0, 1];
  // 0 turns it off.
  float min_p = 0.0f;
  // > 0. For every token seen in the prompt or the output so far, positive logits are
  // divided by it and the others multiplied by it (CTRL / HF / vLLM). 1 turns it off.
  float repetition_penalty = 1.0f;
  // In [-2, 2] (OpenAI). Subtracted once from the logit of every token that occurs in the
  // output so far (prompt tokens do not count).
  float presence_penalty = 0.0f;
  // In [-2, 2] (OpenAI). Subtracted per occurrence in the output so far.
  float frequency_penalty = 0.0f;
  // Most tokens to generate; nullopt means until the model's maximum length.
  std::optional<int32_t> max_tokens = 16;
  // EOS and stop_token_ids cannot be sampled before this many output tokens.
  int32_t min_tokens = 0;
  // Generation stops when the output text contains one of these (not included in the text).
  std::vector<std::string> stop;
  // Generation stops after one of these tokens.
  std::vector<int32_t> stop_token_ids;
  // Keep generating after EOS (EOS then is an ordinary token, also for min_tokens).
  bool ignore_eos = false;
  // Seed of this request's random stream. Draw i of completion j depends only on
  // (seq_seed, i, j), never on the batch, run order or threads. nullopt: the engine picks one.
  std::optional<uint64_t> seq_seed;
  // Number of top log-probabilities returned per output token, besides the sampled token's
  // own. nullopt: none. Log-probabilities are those of the raw model distribution (after the
  // structured-output mask, before penalties and temperature), as vLLM's default.
  std::optional<int32_t> logprobs;
  // Leave special tokens out of the detokenized text.
  bool skip_special_tokens = true;
  // Structured output; nullopt: unconstrained.
  std::optional<StructuredOutputArgs> so_args;

  // Throws deepinfer::Error naming the first invalid field and its value.
  void validate() const;
  bool is_greedy() const;

  bool operator==(const SamplingParams&) const = default;
};

// Greedy below this temperature (vLLM's _SAMPLING_EPS).
inline constexpr float kGreedyTemperature = 1e-5f;

// Parses a JSON object whose keys are the field names above (so_args as an object with
// "schema_type" and "schema"; "stop" as a string or an array of strings; a JSON Schema may be
// given as an object). Unknown keys, wrong types and invalid values throw deepinfer::Error
// naming the key. The result is validated.
SamplingParams sampling_params_from_json(std::string_view json_text);
// The inverse: every field, so that parsing it back gives an equal SamplingParams.
std::string sampling_params_to_json(const SamplingParams& params);

}  // namespace deepinfer
