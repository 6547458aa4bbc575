// Tiny random DeepSeek-V4.1 models for the forward tests: a config parsed from JSON (so every
// derived field is HF's) and parameters drawn from a seeded normal distribution.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/engram_hash.h"
#include "model/deepseek_v41/parameters.h"

namespace deepinfer::deepseek_v41::testing {

// A small config covering every mechanism: sliding-only layers, a ratio-2 group (source +
// reuse), a ratio-1 group with a candidate source and a re-indexing layer, engram on layer 1,
// hc_mult 2. `overrides` is a JSON object merged over it.
// The text config is tests/data/configs/tiny_forward_text.json; tiny_config_json returns it as
// JSON, `overrides` merged.
nlohmann::json tiny_config_json(const std::string& overrides = "{}");
DeepseekV41TextConfig tiny_config(const std::string& overrides = "{}");

// The engram hasher for a tiny config: a random token map onto
// engram_compressed_vocab_size ids (every id used).
std::shared_ptr<EngramHasher> tiny_hasher(DeepseekV41TextConfig& config, uint32_t seed);

enum class WeightFormat {
  kDense,     // every tensor f32
  kReleased,  // the released checkpoint's formats: fp8 32x32 dense roles, fp4 routed experts,
              // fp8 engram table, bf16 norms/embeddings
};

// Random parameters for `config` (engram table rows from the config).
std::unique_ptr<ModelParameters> random_parameters(const DeepseekV41TextConfig& config,
                                                   uint32_t seed, WeightFormat format);

}  // namespace deepinfer::deepseek_v41::testing
