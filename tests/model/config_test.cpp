// The config parser against HF transformers' DeepseekV41TextConfig / DeepseekV41Config: every
// case of tests/data/configs/oracle/config_oracle.json (written by
// scripts/model/dump_config_oracle.py, which runs HF's own class) must derive the same fields,
// or be rejected with an error naming the same field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "model/deepseek_v41/config.h"

namespace deepinfer::deepseek_v41 {
namespace {

using json = nlohmann::json;

const std::filesystem::path kConfigDir =
    std::filesystem::path(DEEPINFER_SOURCE_DIR) / "tests/data/configs";

json read_json(const std::filesystem::path& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file.good()) << path;
  return json::parse(file);
}

// The fields of DeepseekV41TextConfig itself; HF's dump also carries PreTrainedConfig
// bookkeeping (architectures, dtype, id2label, ...), which is not model configuration.
bool is_v41_text_field(const std::string& key) {
  static const json ours = text_config_to_json(DeepseekV41TextConfig{});
  return ours.contains(key) && key != "model_type";
}

void expect_same_text(const json& hf, const DeepseekV41TextConfig& parsed,
                      const std::string& name) {
  const json ours = text_config_to_json(parsed);
  int compared = 0;
  for (auto it = hf.begin(); it != hf.end(); ++it) {
    if (!is_v41_text_field(it.key())) continue;
    ++compared;
    EXPECT_EQ(ours.at(it.key()), it.value()) << name << ": field " << it.key();
  }
  // Every one of our fields exists in HF's class (catches a field we invented or misspelled).
  for (auto it = ours.begin(); it != ours.end(); ++it) {
    if (it.key() != "model_type") {
      EXPECT_TRUE(hf.contains(it.key())) << name << ": HF has no field " << it.key();
    }
  }
  EXPECT_GE(compared, 60) << name;
}

// Cases HF accepts at config time that deepinfer rejects, with the field our error names: HF
// would only fail when it builds the rotary embedding; we implement "default" and "yarn".
const std::map<std::string, std::string> kStricterThanHf{
    {"rope_unknown_type_accepted", "rope_type"}};

TEST(DeepseekV41Config, MatchesHfOracleOnEveryCase) {
  const json cases = read_json(kConfigDir / "oracle/config_oracle.json");
  ASSERT_GE(cases.size(), 50u);
  int accepted = 0;
  int rejected = 0;
  for (const json& item : cases) {
    const std::string name = item.at("name");
    const json& expect = item.at("expect");
    const bool composite = item.at("kind") == "composite";
    SCOPED_TRACE(name);
    if (auto stricter = kStricterThanHf.find(name); stricter != kStricterThanHf.end()) {
      try {
        parse_text_config(item.at("input"), name);
        ADD_FAILURE() << name << ": expected deepinfer to reject it";
      } catch (const Error& error) {
        EXPECT_NE(std::string(error.what()).find(stricter->second), std::string::npos)
            << error.what();
      }
      continue;
    }
    if (expect.at("ok").get<bool>()) {
      ++accepted;
      DeepseekV41Config config;
      try {
        if (composite) {
          config = parse_config(item.at("input"), name);
        } else {
          config.text = parse_text_config(item.at("input"), name);
        }
      } catch (const Error& error) {
        ADD_FAILURE() << name << ": rejected a config HF accepts: " << error.what();
        continue;
      }
      expect_same_text(expect.at("text"), config.text, name);
      if (composite) {
        EXPECT_EQ(config.image_token_id, expect.at("image_token_id").get<int64_t>());
        EXPECT_EQ(config.vision.has_value(), !expect.at("vision").is_null());
        if (config.vision) {
          EXPECT_EQ(config.vision->hidden_size, expect["vision"]["hidden_size"].get<int64_t>());
          EXPECT_EQ(config.vision->num_hidden_layers,
                    expect["vision"]["num_hidden_layers"].get<int64_t>());
          EXPECT_EQ(config.vision->min_pixels, expect["vision"]["min_pixels"].get<int64_t>());
        }
        const json& quantization = expect.at("quantization_config");
        ASSERT_EQ(config.quantization_config.has_value(), !quantization.is_null());
        // Propagated into the text config, which the model is built from.
        ASSERT_EQ(config.text.quantization_config.has_value(), !quantization.is_null());
        if (!quantization.is_null()) {
          EXPECT_EQ(config.text.quantization_config->quant_method, quantization["quant_method"]);
          EXPECT_EQ(json(config.text.quantization_config->weight_block_size),
                    quantization["weight_block_size"]);
          EXPECT_EQ(config.text.quantization_config->scale_fmt, quantization["scale_fmt"]);
          EXPECT_EQ(config.text.quantization_config->expert_dtype, quantization["expert_dtype"]);
        }
      }
    } else {
      ++rejected;
      const std::string field = item.at("field");
      try {
        if (composite) {
          parse_config(item.at("input"), name);
        } else {
          parse_text_config(item.at("input"), name);
        }
        ADD_FAILURE() << name << ": accepted a config HF rejects (" << expect.at("error") << ")";
      } catch (const Error& error) {
        EXPECT_NE(std::string(error.what()).find(field), std::string::npos)
            << name << ": error does not name `" << field << "`: " << error.what();
      }
    }
  }
  EXPECT_GE(accepted, 30);
  EXPECT_GE(rejected, 20);
}

TEST(DeepseekV41Config, ReleasedFlashSchedule) {
  const DeepseekV41Config config = load_config(kConfigDir / "deepseek_v41_flash_config.json");
  const DeepseekV41TextConfig& text = config.text;
  ASSERT_EQ(text.num_hidden_layers, 40);
  // The released schedule written out independently of the parser: [0,0] + [2]*18 + [1]*20 + 3
  // draft zeros.
  std::vector<int64_t> ratios;
  for (int layer = 0; layer < 43; ++layer)
    ratios.push_back(layer < 2 ? 0 : layer < 20 ? 2 : layer < 40 ? 1 : 0);
  EXPECT_EQ(text.compress_ratios, ratios);
  EXPECT_EQ(text.kv_source_layer_ids, (std::vector<int64_t>{2, 8, 14, 20}));
  EXPECT_EQ(text.index_source_layer_ids, (std::vector<int64_t>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(text.candidate_source_layer_id, 20);
  EXPECT_EQ(text.dspark_target_layer_ids, (std::vector<int64_t>{37, 38, 39}));
  EXPECT_EQ(text.engram_layer_ids, (std::vector<int64_t>{1, 14}));
  EXPECT_EQ(text.engram_num_embeddings, (std::vector<int64_t>{384006168, 384016682}));
  // Per-layer roles (notes §0): layer 20 is the ratio-1 source, 24..36 reindex inside its
  // candidates.
  EXPECT_EQ(text.kv_source_of(7), 2);
  EXPECT_EQ(text.kv_source_of(19), 14);
  EXPECT_EQ(text.kv_source_of(39), 20);
  EXPECT_EQ(text.kv_source_of(1), -1);
  EXPECT_EQ(text.index_source_of(27), 24);
  EXPECT_TRUE(text.uses_candidates(24));
  EXPECT_FALSE(text.uses_candidates(20));
  EXPECT_FALSE(text.uses_candidates(21));  // not an index source
  EXPECT_EQ(text.engram_index(14), 1);
  EXPECT_EQ(text.hc_mix_rows(), 24);
  EXPECT_EQ(text.engram_hash_columns(), 24);
  EXPECT_EQ(text.layer_types[20], LayerType::kSharedCompressedAttention);
  EXPECT_EQ(text.layer_types[21], LayerType::kSlidingAttention);
  // YaRN only on the compress rope, without mscale.
  EXPECT_EQ(text.rope_main.rope_type, "default");
  EXPECT_EQ(text.rope_main.rope_theta, 10000.0);
  EXPECT_EQ(text.rope_for_layer(0).rope_type, "default");
  EXPECT_EQ(text.rope_for_layer(2).rope_type, "yarn");
  EXPECT_EQ(text.rope_compress.rope_theta, 160000.0);
  EXPECT_EQ(text.rope_compress.factor, 16.0);
  EXPECT_EQ(text.rope_compress.original_max_position_embeddings, 65536);
  EXPECT_EQ(text.rope_compress.attention_factor, 1.0);
  // quantization_config from the top level reaches the text config.
  ASSERT_TRUE(text.quantization_config.has_value());
  EXPECT_TRUE(text.quantization_config->fp4_experts());
  EXPECT_TRUE(text.quantization_config->ue8m0_scales());
  EXPECT_EQ(text.quantization_config->weight_block_size, (std::vector<int64_t>{32, 32}));
  // The released text_config spells the pad key `engram_pad_token_id`: HF keeps it as an extra
  // attribute and uses its own default engram_pad_id (both 2).
  EXPECT_EQ(text.engram_pad_id, 2);
  EXPECT_EQ(text.extra_keys.count("engram_pad_token_id"), 1u);
  ASSERT_TRUE(config.vision.has_value());
  EXPECT_EQ(config.vision->num_hidden_layers, 32);
  EXPECT_EQ(config.dtype, "bfloat16");
  EXPECT_EQ(config.bos_token_id, 0);
  EXPECT_EQ(config.pad_token_id, 2);
}

TEST(DeepseekV41Config, RoundTripsThroughConfigJson) {
  const DeepseekV41Config config = load_config(kConfigDir / "deepseek_v41_flash_config.json");
  const DeepseekV41Config again = parse_config(config_to_json(config), "round trip");
  EXPECT_EQ(text_config_to_json(again.text), text_config_to_json(config.text));
  EXPECT_EQ(again.quantization_config->expert_dtype, "fp4");
}

TEST(DeepseekV41Config, TinyTestConfigsParse) {
  int parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kConfigDir)) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(load_config(entry.path()));
    ++parsed;
  }
  EXPECT_GE(parsed, 1);
}

// Checks deepinfer adds on top of HF (HF accepts these at config time and fails, or computes
// garbage, when it builds the model): each names the field.
TEST(DeepseekV41Config, RejectsWhatTheModelCannotBuild) {
  const json base = {{"num_hidden_layers", 4}};
  const std::pair<json, std::string> cases[] = {
      {{{"qk_rope_head_dim", 7}}, "qk_rope_head_dim"},
      {{{"qk_rope_head_dim", 1024}}, "qk_rope_head_dim"},
      {{{"num_key_value_heads", 2}}, "num_key_value_heads"},
      {{{"num_attention_heads", 6}}, "o_groups"},
      {{{"num_experts_per_tok", 500}}, "num_experts_per_tok"},
      {{{"n_shared_experts", 2}}, "n_shared_experts"},
      {{{"scoring_func", "relu"}}, "scoring_func"},
      {{{"hidden_act", "gelu"}}, "hidden_act"},
      {{{"compress_ratios", {0, 2, -1, 1}}}, "compress_ratios"},
      {{{"engram_layer_ids", {1, 9}}}, "engram_layer_ids"},
      {{{"engram_layer_ids", {1, 1}}}, "engram_layer_ids"},
      {{{"dspark_target_layer_ids", {4}}}, "dspark_target_layer_ids"},
      {{{"rope_scaling", {{"rope_type", "ntk-by-parts"}, {"factor", 2.0}}}}, "rope_type"},
      {{{"sliding_window", 0}}, "sliding_window"},
      {{{"hidden_size", -5}}, "hidden_size"},
  };
  for (const auto& [patch, field] : cases) {
    json input = base;
    input.update(patch);
    try {
      parse_text_config(input, "case");
      ADD_FAILURE() << "accepted " << input.dump();
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(field), std::string::npos) << error.what();
    }
  }
}

TEST(DeepseekV41Config, RejectsUnsupportedQuantizationAndModelType) {
  json config = read_json(kConfigDir / "deepseek_v41_flash_config.json");
  config["quantization_config"]["quant_method"] = "gptq";
  EXPECT_THROW(parse_config(config, "q"), Error);
  config["quantization_config"]["quant_method"] = "fp8";
  config["quantization_config"]["weight_block_size"] = {32};
  EXPECT_THROW(parse_config(config, "q"), Error);
  config["quantization_config"]["weight_block_size"] = {32, 32};
  config["model_type"] = "deepseek_v4";
  try {
    parse_config(config, "q");
    ADD_FAILURE();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("model_type"), std::string::npos);
  }
  EXPECT_THROW(load_config(kConfigDir / "no_such_config.json"), Error);
}

}  // namespace
}  // namespace deepinfer::deepseek_v41
