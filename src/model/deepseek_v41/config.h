// DeepSeek-V4.1 config.json -> typed config, with the defaults, derived layer schedules and
// rejections of HF transformers' DeepseekV41TextConfig / DeepseekV41Config
// (huggingface/transformers src/transformers/models/deepseek_v41/configuration_deepseek_v41.py),
// plus the checks deepinfer needs to build the model (docs/CONFIG.md lists every field and rule).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace deepinfer::deepseek_v41 {

// HF's `layer_types`: only KV-source layers own a compressor cache; every layer keeps a window.
enum class LayerType : uint8_t { kSlidingAttention, kSharedCompressedAttention };
std::string_view layer_type_name(LayerType type);

// One rope table: `main` (pure sliding-window layers) or `compress` (layers with ratio > 0).
struct RopeParameters {
  std::string rope_type = "default";  // "default" or "yarn"
  double rope_theta = 10000.0;
  std::optional<double> partial_rotary_factor;
  // YaRN (compress rope of the released model only).
  std::optional<double> factor;
  std::optional<double> beta_fast;
  std::optional<double> beta_slow;
  std::optional<double> attention_factor;  // HF defaults it to 1.0: the mscale is NOT applied
  std::optional<int64_t> original_max_position_embeddings;
  std::optional<double> mscale;
  std::optional<double> mscale_all_dim;
  // Any other key, as JSON text (e.g. the legacy "type" key, which HF keeps but ignores).
  std::map<std::string, std::string> other_keys;

  double yarn_beta_fast() const { return beta_fast.value_or(32.0); }
  double yarn_beta_slow() const { return beta_slow.value_or(1.0); }
};

// The checkpoint's `quantization_config` (released: fp8, dynamic activations, 32x32 blocks,
// ue8m0 scales, fp4 routed experts).
struct QuantizationConfig {
  std::string quant_method;                // "fp8"
  std::string activation_scheme;           // "dynamic" ("" when absent)
  std::vector<int64_t> weight_block_size;  // [32, 32]; empty when absent
  std::string scale_fmt;                   // "ue8m0", or "" (fp32 scales)
  std::string expert_dtype;                // "fp4", or "" (routed experts like dense fp8)
  std::string fmt;                         // V4 spelling of the fp8 format ("e4m3"); optional

  bool fp4_experts() const { return expert_dtype == "fp4"; }
  bool ue8m0_scales() const { return scale_fmt == "ue8m0"; }
};

struct DeepseekV41TextConfig {
  // --- attention / rope ---
  int64_t vocab_size = 129280;
  int64_t hidden_size = 5120;
  int64_t num_hidden_layers = 40;
  int64_t num_attention_heads = 64;
  int64_t num_key_value_heads = 1;
  int64_t head_dim = 512;
  int64_t q_lora_rank = 1280;
  int64_t qk_rope_head_dim = 64;
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  int64_t max_position_embeddings = 1048576;
  bool attention_bias = false;
  double attention_dropout = 0.0;
  // --- sliding window + CSA2 ---
  int64_t sliding_window = 128;
  int64_t candidate_topk_blocks = 2048;
  int64_t candidate_block_size = 8;
  int64_t index_n_heads = 32;
  int64_t index_head_dim = 128;
  int64_t index_topk = 512;
  // --- grouped low-rank output projection ---
  int64_t o_groups = 8;
  int64_t o_lora_rank = 1024;
  // --- MoE ---
  int64_t moe_intermediate_size = 2304;
  int64_t n_routed_experts = 384;
  int64_t n_shared_experts = 1;
  int64_t num_experts_per_tok = 6;
  std::string scoring_func = "sqrtsoftplus";  // sqrtsoftplus | softmax | sigmoid
  double gate_temp = 1.0;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.5;
  std::string topk_method = "noaux_tc";
  double swiglu_limit = 10.0;
  // --- hyper-connections ---
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1.0e-6;
  // --- engram ---
  std::vector<int64_t> engram_layer_ids;  // derived: [] when absent
  int64_t engram_vocab_size = 16000000;
  std::vector<int64_t> engram_num_embeddings;  // derived: zeros when absent
  int64_t engram_max_ngram_size = 4;
  int64_t engram_n_heads = 8;
  int64_t engram_head_dim = 256;
  int64_t engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 99092;
  // --- DSpark ---
  int64_t num_nextn_predict_layers = 3;
  int64_t dspark_block_size = 5;
  int64_t dspark_noise_token_id = 128799;
  int64_t dspark_markov_rank = 256;
  int64_t dspark_n_routed_experts = 128;
  int64_t dspark_num_experts_per_tok = 3;
  // --- misc ---
  std::string hidden_act = "silu";
  double initializer_range = 0.02;
  double rms_norm_eps = 1.0e-20;
  bool use_cache = true;
  bool tie_word_embeddings = false;
  std::optional<int64_t> pad_token_id;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids{1};  // empty: null
  bool eos_token_id_is_list = false;
  bool output_router_logits = false;
  double router_aux_loss_coef = 0.001;
  double router_jitter_noise = 0.0;

  // --- derived schedules (always filled after parsing) ---
  // num_hidden_layers + num_nextn_predict_layers entries; draft layers are 0 unless given.
  std::vector<int64_t> compress_ratios;
  std::vector<int64_t> kv_source_layer_ids;
  std::vector<int64_t> index_source_layer_ids;
  int64_t candidate_source_layer_id = -1;  // < 0: two-level top-k off
  std::vector<int64_t> dspark_target_layer_ids;
  std::vector<LayerType> layer_types;  // num_hidden_layers entries
  RopeParameters rope_main;
  RopeParameters rope_compress;
  std::optional<std::string> rope_scaling_json;  // as given, for round trips

  // The checkpoint's quantization, propagated from the composite top level.
  std::optional<QuantizationConfig> quantization_config;
  // Keys HF keeps as plain attributes (unknown to the class), as JSON text.
  std::map<std::string, std::string> extra_keys;

  // --- per-layer queries (layer in [0, num_hidden_layers)) ---
  int64_t compress_ratio(int64_t layer) const;
  bool is_kv_source(int64_t layer) const;
  bool is_index_source(int64_t layer) const;
  bool is_candidate_source(int64_t layer) const { return layer == candidate_source_layer_id; }
  // Index sources after the candidate source score inside its candidate blocks.
  bool uses_candidates(int64_t layer) const;
  // The KV source whose compressed cache a layer with ratio > 0 reads: the nearest at or
  // before it. -1 for ratio-0 layers.
  int64_t kv_source_of(int64_t layer) const;
  // The index source whose top-k a layer with ratio > 0 reuses: the nearest at or before it,
  // -1 if none (HF then masks every compressed entry off).
  int64_t index_source_of(int64_t layer) const;
  // Position of `layer` in engram_layer_ids, or -1.
  int64_t engram_index(int64_t layer) const;
  const RopeParameters& rope_for_layer(int64_t layer) const;

  int64_t hc_mix_rows() const { return (2 + hc_mult) * hc_mult; }
  int64_t engram_hash_columns() const { return (engram_max_ngram_size - 1) * engram_n_heads; }
  int64_t total_layers() const { return num_hidden_layers + num_nextn_predict_layers; }
};

struct DeepseekV41VisionConfig {
  int64_t hidden_size = 1024;
  int64_t intermediate_size = 2816;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 16;
  int64_t patch_size = 14;
  int64_t downsample_ratio = 3;
  double rope_theta = 10000.0;
  int64_t max_image_tokens = 1024;
  int64_t min_pixels = 295936;
  std::optional<int64_t> max_wh_ratio;
};

// The composite config of the released checkpoint (or a flat text config wrapped in one).
struct DeepseekV41Config {
  DeepseekV41TextConfig text;
  std::optional<DeepseekV41VisionConfig> vision;  // HF leaves it None when absent
  int64_t image_token_id = 129264;
  bool tie_word_embeddings = false;
  std::optional<QuantizationConfig> quantization_config;
  std::vector<std::string> architectures;
  std::string model_type = "deepseek_v41";
  std::string dtype;  // "bfloat16" in the release; "" when absent
  // Top-level special tokens of the composite (HF keeps them on the composite, not the text).
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;
  std::optional<int64_t> pad_token_id;
};

// Parses a text config object (HF DeepseekV41TextConfig(**object)). `where` names the source
// in errors (e.g. "config.json: text_config"). Throws Error naming the field.
DeepseekV41TextConfig parse_text_config(const nlohmann::json& object, std::string_view where);

// Parses a whole config.json object: composite (text_config / vision_config /
// quantization_config), a composite whose text fields sit at the top level, or a flat
// `deepseek_v41_text` config. The top-level quantization_config is propagated into `text`.
DeepseekV41Config parse_config(const nlohmann::json& object, std::string_view where);

// Reads and parses a config.json file (or a directory holding one).
DeepseekV41Config load_config(const std::filesystem::path& path);

// HF's view of the text config (the fields of DeepseekV41TextConfig.to_dict()): what the
// oracle test compares, and what make-checkpoint writes.
nlohmann::json text_config_to_json(const DeepseekV41TextConfig& config);
// The composite config.json of a checkpoint with this config.
nlohmann::json config_to_json(const DeepseekV41Config& config);

}  // namespace deepinfer::deepseek_v41
