#include "model/deepseek_v41/config.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"

namespace deepinfer::deepseek_v41 {
namespace {

using json = nlohmann::json;

// The released schedule; HF uses it (and the released sources) only when the config does not
// spell the schedule out.
std::vector<int64_t> released_compress_ratios() {
  std::vector<int64_t> ratios{0, 0};
  ratios.insert(ratios.end(), 18, 2);
  ratios.insert(ratios.end(), 20, 1);
  return ratios;
}
const std::vector<int64_t> kReleasedKvSources{2, 8, 14, 20};
const std::vector<int64_t> kReleasedIndexSources{2, 8, 14, 20, 24, 28, 32, 36};

bool contains(const std::vector<int64_t>& values, int64_t value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

std::string list_text(const std::vector<int64_t>& values) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << ']';
  return out.str();
}

std::string json_type_name(const json& value) {
  if (value.is_boolean()) return "bool";
  if (value.is_number_integer()) return "int";
  if (value.is_number_float()) return "float";
  return value.type_name();
}

// Reads the fields of one JSON object with the types HF's @strict dataclass enforces, and
// remembers which keys it consumed so the rest can be kept as extra keys.
class FieldReader {
 public:
  FieldReader(const json& object, std::string where) : object_(object), where_(std::move(where)) {
    if (!object_.is_object())
      DI_THROW(where_, ": expected a JSON object, got ", json_type_name(object_));
  }

  const std::string& where() const { return where_; }

  // Present and not null.
  const json* find(const std::string& key) {
    consumed_.insert(key);
    auto it = object_.find(key);
    if (it == object_.end()) return nullptr;
    return &*it;
  }
  bool has(const std::string& key) const { return object_.contains(key); }

  void read_int(const std::string& key, int64_t& out) {
    if (const json* value = find(key)) out = as_int(key, *value);
  }
  void read_optional_int(const std::string& key, std::optional<int64_t>& out) {
    if (const json* value = find(key)) {
      out = value->is_null() ? std::nullopt : std::optional<int64_t>(as_int(key, *value));
    }
  }
  // HF's `float` fields reject JSON integers (Python ints), as @strict does.
  void read_float(const std::string& key, double& out) {
    if (const json* value = find(key)) {
      if (!value->is_number_float()) fail_type(key, "float", *value);
      out = value->get<double>();
    }
  }
  // `float | int` fields (the rope bases).
  void read_number(const std::string& key, double& out) {
    if (const json* value = find(key)) {
      if (!value->is_number()) fail_type(key, "float or int", *value);
      out = value->get<double>();
    }
  }
  void read_bool(const std::string& key, bool& out) {
    if (const json* value = find(key)) {
      if (!value->is_boolean()) fail_type(key, "bool", *value);
      out = value->get<bool>();
    }
  }
  void read_string(const std::string& key, std::string& out) {
    if (const json* value = find(key)) {
      if (!value->is_string()) fail_type(key, "str", *value);
      out = value->get<std::string>();
    }
  }
  // `list[int] | None`: returns nullopt for absent or null.
  std::optional<std::vector<int64_t>> read_int_list(const std::string& key) {
    const json* value = find(key);
    if (value == nullptr || value->is_null()) return std::nullopt;
    if (!value->is_array()) fail_type(key, "list[int] or null", *value);
    std::vector<int64_t> out;
    for (size_t i = 0; i < value->size(); ++i) {
      const json& item = (*value)[i];
      if (!item.is_number_integer()) {
        DI_THROW(where_, ": field `", key, "` item ", i, " must be an int, got ",
                 json_type_name(item), " ", item.dump());
      }
      out.push_back(item.get<int64_t>());
    }
    return out;
  }
  // `dict | None`.
  const json* read_object(const std::string& key) {
    const json* value = find(key);
    if (value == nullptr || value->is_null()) return nullptr;
    if (!value->is_object()) fail_type(key, "dict or null", *value);
    return value;
  }

  int64_t as_int(const std::string& key, const json& value) const {
    if (!value.is_number_integer()) fail_type(key, "int", value);
    return value.get<int64_t>();
  }

  [[noreturn]] void fail_type(const std::string& key, const char* expected,
                              const json& value) const {
    DI_THROW(where_, ": field `", key, "` must be ", expected, ", got ", json_type_name(value), " ",
             value.dump());
  }

  std::map<std::string, std::string> unconsumed() const {
    std::map<std::string, std::string> rest;
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!consumed_.contains(it.key())) rest.emplace(it.key(), it.value().dump());
    }
    return rest;
  }

 private:
  const json& object_;
  std::string where_;
  std::set<std::string> consumed_;
};

RopeParameters parse_rope(const json& object, const std::string& where) {
  RopeParameters rope;
  for (auto it = object.begin(); it != object.end(); ++it) {
    const std::string& key = it.key();
    const json& value = it.value();
    auto number = [&]() -> double {
      if (!value.is_number()) {
        DI_THROW(where, ": `", key, "` must be a number, got ", json_type_name(value), " ",
                 value.dump());
      }
      return value.get<double>();
    };
    if (key == "rope_type") {
      if (!value.is_string()) DI_THROW(where, ": `rope_type` must be a string, got ", value.dump());
      rope.rope_type = value.get<std::string>();
    } else if (key == "rope_theta") {
      rope.rope_theta = number();
    } else if (key == "partial_rotary_factor") {
      rope.partial_rotary_factor = number();
    } else if (key == "factor") {
      rope.factor = number();
    } else if (key == "beta_fast") {
      rope.beta_fast = number();
    } else if (key == "beta_slow") {
      rope.beta_slow = number();
    } else if (key == "attention_factor") {
      rope.attention_factor = number();
    } else if (key == "mscale") {
      rope.mscale = number();
    } else if (key == "mscale_all_dim") {
      rope.mscale_all_dim = number();
    } else if (key == "original_max_position_embeddings") {
      if (!value.is_number_integer()) {
        DI_THROW(where, ": `original_max_position_embeddings` must be an int, got ", value.dump());
      }
      rope.original_max_position_embeddings = value.get<int64_t>();
    } else {
      rope.other_keys.emplace(key, value.dump());
    }
  }
  return rope;
}

json rope_to_json(const RopeParameters& rope) {
  json out = json::object();
  out["rope_type"] = rope.rope_type;
  out["rope_theta"] = rope.rope_theta;
  if (rope.partial_rotary_factor) out["partial_rotary_factor"] = *rope.partial_rotary_factor;
  if (rope.factor) out["factor"] = *rope.factor;
  if (rope.beta_fast) out["beta_fast"] = *rope.beta_fast;
  if (rope.beta_slow) out["beta_slow"] = *rope.beta_slow;
  if (rope.attention_factor) out["attention_factor"] = *rope.attention_factor;
  if (rope.mscale) out["mscale"] = *rope.mscale;
  if (rope.mscale_all_dim) out["mscale_all_dim"] = *rope.mscale_all_dim;
  if (rope.original_max_position_embeddings) {
    out["original_max_position_embeddings"] = *rope.original_max_position_embeddings;
  }
  for (const auto& [key, text] : rope.other_keys) out[key] = json::parse(text);
  return out;
}

// HF validate_rope: the per-type validators raise for missing required keys (KeyError).
void validate_rope(const RopeParameters& rope, const std::string& where) {
  if (rope.rope_type == "yarn") {
    if (!rope.factor) DI_THROW(where, ": yarn rope needs `factor`");
    if (!rope.original_max_position_embeddings) {
      DI_THROW(where, ": yarn rope needs `original_max_position_embeddings`");
    }
  } else if (rope.rope_type != "default") {
    // HF accepts other types at config time; deepinfer implements the two V4.1 uses.
    DI_THROW(where, ": `rope_type` \"", rope.rope_type,
             "\" is not supported (deepinfer implements \"default\" and \"yarn\")");
  }
  if (rope.rope_theta <= 0) DI_THROW(where, ": `rope_theta` must be > 0, got ", rope.rope_theta);
  if (rope.factor && *rope.factor < 1.0)
    DI_THROW(where, ": yarn `factor` must be >= 1, got ", *rope.factor);
  if (rope.original_max_position_embeddings && *rope.original_max_position_embeddings <= 0) {
    DI_THROW(where, ": `original_max_position_embeddings` must be > 0");
  }
}

// HF DeepseekV41TextConfig.__post_init__, step by step.
void derive_schedules(DeepseekV41TextConfig& c, std::optional<std::vector<int64_t>> ratios_in,
                      std::optional<std::vector<int64_t>> kv_in,
                      std::optional<std::vector<int64_t>> index_in,
                      std::optional<int64_t> candidate_in,
                      std::optional<std::vector<int64_t>> dspark_in, const std::string& where) {
  const int64_t n = c.num_hidden_layers;
  const int64_t n_nextn = c.num_nextn_predict_layers;
  // n == 0 runs through like HF (which rejects it as "`kv_source_layer_ids` out of range");
  // what slips through is caught by validate_for_model.
  if (n < 0) DI_THROW(where, ": `num_hidden_layers` must be >= 1, got ", n);
  if (n_nextn < 0) DI_THROW(where, ": `num_nextn_predict_layers` must be >= 0, got ", n_nextn);
  const std::vector<int64_t> released = released_compress_ratios();

  std::vector<int64_t> ratios;
  if (ratios_in) {
    ratios = *ratios_in;
  } else if (n == static_cast<int64_t>(released.size())) {
    ratios = released;
  } else {
    // The released pattern scaled to n layers: 2 sliding-only, a ratio-2 block, a ratio-1 block.
    const int64_t n_slide = std::min<int64_t>(2, n);
    const int64_t n_enc = std::max<int64_t>(0, (n - n_slide + 1) / 2);
    ratios.assign(n_slide, 0);
    ratios.insert(ratios.end(), n_enc, 2);
    ratios.insert(ratios.end(), std::max<int64_t>(0, n - n_slide - n_enc), 1);
  }
  const auto given = static_cast<int64_t>(ratios.size());
  if (given < n) {
    DI_THROW(where, ": `compress_ratios` needs at least `num_hidden_layers` (", n,
             ") entries, got ", given);
  }
  if (given > n + n_nextn) {
    DI_THROW(where, ": `compress_ratios` has ", given,
             " entries but the model has `num_hidden_layers + num_nextn_predict_layers` = ",
             n + n_nextn, " layers");
  }
  ratios.resize(n + n_nextn, 0);  // the draft layers are sliding-window only
  for (int64_t i = 0; i < n + n_nextn; ++i) {
    if (ratios[i] < 0)
      DI_THROW(where, ": `compress_ratios[", i, "]` must be >= 0, got ", ratios[i]);
  }
  c.compress_ratios = ratios;
  const std::vector<int64_t> backbone(ratios.begin(), ratios.begin() + n);

  if (kv_in) {
    c.kv_source_layer_ids = *kv_in;
  } else if (n <= static_cast<int64_t>(released.size()) &&
             std::equal(backbone.begin(), backbone.end(), released.begin())) {
    c.kv_source_layer_ids = kReleasedKvSources;
  } else {
    // The first layer of each same-ratio run publishes for its group.
    c.kv_source_layer_ids.clear();
    for (int64_t i = 0; i < n; ++i) {
      if (backbone[i] > 0 && (i == 0 || backbone[i - 1] != backbone[i]))
        c.kv_source_layer_ids.push_back(i);
    }
  }
  if (index_in) {
    c.index_source_layer_ids = *index_in;
  } else {
    c.index_source_layer_ids =
        c.kv_source_layer_ids == kReleasedKvSources ? kReleasedIndexSources : c.kv_source_layer_ids;
  }
  if (dspark_in) {
    c.dspark_target_layer_ids = *dspark_in;
  } else {
    // The last three layers that are not KV sources.
    std::vector<int64_t> candidates;
    for (int64_t i = 0; i < n; ++i) {
      if (!contains(c.kv_source_layer_ids, i)) candidates.push_back(i);
    }
    const size_t keep = std::min<size_t>(3, candidates.size());
    c.dspark_target_layer_ids.assign(candidates.end() - static_cast<std::ptrdiff_t>(keep),
                                     candidates.end());
  }

  const auto& kv = c.kv_source_layer_ids;
  const auto& index = c.index_source_layer_ids;
  for (int64_t id : kv) {
    if (id < 0 || id >= n) {
      DI_THROW(where, ": `kv_source_layer_ids` out of range [0, ", n, "): ", list_text(kv));
    }
  }
  for (int64_t id : kv) {
    if (backbone[id] == 0) {
      DI_THROW(where, ": `kv_source_layer_ids` ", list_text(kv),
               " must have `compress_ratios[i] > 0` (layer ", id, " has ratio 0)");
    }
  }
  for (int64_t id : index) {
    // HF dies with a bare IndexError here; name the field instead.
    if (id < 0 || id >= n) {
      DI_THROW(where, ": `index_source_layer_ids` out of range [0, ", n, "): ", list_text(index));
    }
  }
  for (int64_t id : index) {
    if (backbone[id] == 0) {
      DI_THROW(where, ": `index_source_layer_ids` ", list_text(index),
               " must have `compress_ratios[i] > 0` (layer ", id, " has ratio 0)");
    }
  }
  for (int64_t id : index) {
    const bool has_earlier_source =
        std::any_of(kv.begin(), kv.end(), [&](int64_t source) { return source < id; });
    if (!contains(kv, id) && !has_earlier_source) {
      DI_THROW(where, ": `index_source_layer_ids` ", list_text(index),
               " each need a `kv_source_layer_ids` entry ",
               "before them to publish the shared indexer keys (layer ", id, " has none)");
    }
  }
  c.candidate_source_layer_id = candidate_in ? *candidate_in : (kv.empty() ? -1 : kv.back());
  if (c.candidate_source_layer_id >= 0 && !contains(index, c.candidate_source_layer_id)) {
    DI_THROW(where, ": `candidate_source_layer_id` (", c.candidate_source_layer_id,
             ") must be in `index_source_layer_ids` ", list_text(index));
  }
  for (int64_t i = 0; i < n; ++i) {
    const bool has_source =
        std::any_of(kv.begin(), kv.end(), [&](int64_t source) { return source <= i; });
    if (backbone[i] > 0 && !has_source) {
      DI_THROW(
          where,
          ": every layer with `compress_ratios[i] > 0` needs a `kv_source_layer_ids` entry at or ",
          "before it (layer ", i, " has none)");
    }
  }
  c.layer_types.assign(n, LayerType::kSlidingAttention);
  for (int64_t id : kv) c.layer_types[id] = LayerType::kSharedCompressedAttention;
}

// Shape facts the model needs that HF only discovers when it builds the modules.
void validate_for_model(const DeepseekV41TextConfig& c, const std::string& where) {
  auto positive = [&](const char* name, int64_t value) {
    if (value <= 0) DI_THROW(where, ": `", name, "` must be > 0, got ", value);
  };
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("num_attention_heads", c.num_attention_heads);
  positive("head_dim", c.head_dim);
  positive("q_lora_rank", c.q_lora_rank);
  positive("o_groups", c.o_groups);
  positive("o_lora_rank", c.o_lora_rank);
  positive("sliding_window", c.sliding_window);
  positive("moe_intermediate_size", c.moe_intermediate_size);
  positive("n_routed_experts", c.n_routed_experts);
  positive("num_experts_per_tok", c.num_experts_per_tok);
  positive("hc_mult", c.hc_mult);
  positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  positive("max_position_embeddings", c.max_position_embeddings);
  if (c.qk_rope_head_dim <= 0 || c.qk_rope_head_dim % 2 != 0 || c.qk_rope_head_dim > c.head_dim) {
    DI_THROW(where, ": `qk_rope_head_dim` must be even and in (0, head_dim=", c.head_dim, "], got ",
             c.qk_rope_head_dim);
  }
  if (c.num_key_value_heads != 1) {
    DI_THROW(where, ": `num_key_value_heads` must be 1 (V4.1 shares one K=V latent), got ",
             c.num_key_value_heads);
  }
  if ((c.num_attention_heads * c.head_dim) % c.o_groups != 0 ||
      c.num_attention_heads % c.o_groups != 0) {
    DI_THROW(where, ": `num_attention_heads` (", c.num_attention_heads,
             ") must split evenly into `o_groups` (", c.o_groups, ")");
  }
  if (c.num_experts_per_tok > c.n_routed_experts) {
    DI_THROW(where, ": `num_experts_per_tok` (", c.num_experts_per_tok,
             ") exceeds `n_routed_experts` (", c.n_routed_experts, ")");
  }
  if (c.n_shared_experts != 1) {
    DI_THROW(where, ": `n_shared_experts` must be 1 (the reference MoE has exactly one), got ",
             c.n_shared_experts);
  }
  if (c.scoring_func != "sqrtsoftplus" && c.scoring_func != "softmax" &&
      c.scoring_func != "sigmoid") {
    DI_THROW(where, ": `scoring_func` must be sqrtsoftplus, softmax or sigmoid, got \"",
             c.scoring_func, "\"");
  }
  if (c.hidden_act != "silu")
    DI_THROW(where, ": `hidden_act` must be \"silu\", got \"", c.hidden_act, "\"");
  if (c.gate_temp <= 0) DI_THROW(where, ": `gate_temp` must be > 0, got ", c.gate_temp);
  if (c.swiglu_limit < 0) DI_THROW(where, ": `swiglu_limit` must be >= 0, got ", c.swiglu_limit);
  if (c.rms_norm_eps < 0 || c.hc_eps < 0)
    DI_THROW(where, ": `rms_norm_eps` and `hc_eps` must be >= 0");
  const bool any_compressed =
      std::any_of(c.compress_ratios.begin(), c.compress_ratios.begin() + c.num_hidden_layers,
                  [](int64_t ratio) { return ratio > 0; });
  if (any_compressed) {
    positive("index_n_heads", c.index_n_heads);
    positive("index_head_dim", c.index_head_dim);
    positive("index_topk", c.index_topk);
    if (c.index_head_dim < c.qk_rope_head_dim) {
      DI_THROW(where, ": `index_head_dim` (", c.index_head_dim,
               ") must hold the rope tail `qk_rope_head_dim` (", c.qk_rope_head_dim, ")");
    }
    // The keys are fp4 with a scale per 32 channels (MODEL.md 5.2), and the key cache stores
    // them so (ops::IndexerKeys): a dim the blocks do not tile has no such format.
    if (c.index_head_dim % 32 != 0 || c.index_head_dim > 1024) {
      DI_THROW(where, ": `index_head_dim` must be a multiple of 32 up to 1024 (the indexer keys' ",
               "fp4 blocks), got ", c.index_head_dim);
    }
    if (c.candidate_source_layer_id >= 0) {
      positive("candidate_topk_blocks", c.candidate_topk_blocks);
      positive("candidate_block_size", c.candidate_block_size);
    }
  }
  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) {
    const int64_t id = c.engram_layer_ids[i];
    if (id < 0 || id >= c.num_hidden_layers) {
      DI_THROW(where, ": `engram_layer_ids` out of range [0, ", c.num_hidden_layers,
               "): ", list_text(c.engram_layer_ids));
    }
    if (std::count(c.engram_layer_ids.begin(), c.engram_layer_ids.end(), id) > 1) {
      DI_THROW(where, ": `engram_layer_ids` lists layer ", id, " twice");
    }
  }
  if (!c.engram_layer_ids.empty()) {
    positive("engram_head_dim", c.engram_head_dim);
    positive("engram_n_heads", c.engram_n_heads);
    if (c.engram_max_ngram_size < 2) {
      DI_THROW(where, ": `engram_max_ngram_size` must be >= 2 (n-grams of sizes 2..N), got ",
               c.engram_max_ngram_size);
    }
    for (int64_t rows : c.engram_num_embeddings) {
      if (rows < 0)
        DI_THROW(where, ": `engram_num_embeddings` must be >= 0, got ",
                 list_text(c.engram_num_embeddings));
    }
  }
  for (int64_t id : c.dspark_target_layer_ids) {
    if (id < 0 || id >= c.num_hidden_layers) {
      DI_THROW(where, ": `dspark_target_layer_ids` out of range [0, ", c.num_hidden_layers,
               "): ", list_text(c.dspark_target_layer_ids));
    }
  }
  validate_rope(c.rope_main, where + ": rope_parameters.main");
  validate_rope(c.rope_compress, where + ": rope_parameters.compress");
}

QuantizationConfig parse_quantization(const json& object, const std::string& where) {
  FieldReader reader(object, where);
  QuantizationConfig q;
  reader.read_string("quant_method", q.quant_method);
  if (const json* value = reader.find("activation_scheme"); value && !value->is_null()) {
    reader.read_string("activation_scheme", q.activation_scheme);
  }
  if (auto block = reader.read_int_list("weight_block_size")) q.weight_block_size = *block;
  if (const json* value = reader.find("scale_fmt"); value && !value->is_null()) {
    reader.read_string("scale_fmt", q.scale_fmt);
  }
  if (const json* value = reader.find("expert_dtype"); value && !value->is_null()) {
    reader.read_string("expert_dtype", q.expert_dtype);
  }
  if (const json* value = reader.find("fmt"); value && !value->is_null())
    reader.read_string("fmt", q.fmt);

  if (q.quant_method != "fp8") {
    DI_THROW(where, ": `quant_method` \"", q.quant_method,
             "\" is not supported (deepinfer reads \"fp8\")");
  }
  if (!q.activation_scheme.empty() && q.activation_scheme != "dynamic") {
    DI_THROW(where, ": `activation_scheme` must be \"dynamic\", got \"", q.activation_scheme, "\"");
  }
  if (q.weight_block_size.size() != 2 || q.weight_block_size[0] <= 0 ||
      q.weight_block_size[1] <= 0) {
    DI_THROW(where, ": `weight_block_size` must be two positive ints, got ",
             list_text(q.weight_block_size));
  }
  if (!q.scale_fmt.empty() && q.scale_fmt != "ue8m0") {
    DI_THROW(where, ": `scale_fmt` must be \"ue8m0\" or absent, got \"", q.scale_fmt, "\"");
  }
  if (!q.expert_dtype.empty() && q.expert_dtype != "fp4" && q.expert_dtype != "fp8") {
    DI_THROW(where, ": `expert_dtype` must be \"fp4\", \"fp8\" or absent, got \"", q.expert_dtype,
             "\"");
  }
  if (q.expert_dtype == "fp8") q.expert_dtype.clear();
  if (!q.fmt.empty() && q.fmt != "e4m3")
    DI_THROW(where, ": `fmt` must be \"e4m3\", got \"", q.fmt, "\"");
  return q;
}

json quantization_to_json(const QuantizationConfig& q) {
  json out = {{"quant_method", q.quant_method}, {"weight_block_size", q.weight_block_size}};
  if (!q.activation_scheme.empty()) out["activation_scheme"] = q.activation_scheme;
  if (!q.scale_fmt.empty()) out["scale_fmt"] = q.scale_fmt;
  if (!q.expert_dtype.empty()) out["expert_dtype"] = q.expert_dtype;
  if (!q.fmt.empty()) out["fmt"] = q.fmt;
  return out;
}

DeepseekV41VisionConfig parse_vision(const json& object, const std::string& where) {
  FieldReader r(object, where);
  DeepseekV41VisionConfig v;
  r.read_int("hidden_size", v.hidden_size);
  r.read_int("intermediate_size", v.intermediate_size);
  r.read_int("num_hidden_layers", v.num_hidden_layers);
  r.read_int("num_attention_heads", v.num_attention_heads);
  r.read_int("patch_size", v.patch_size);
  r.read_int("downsample_ratio", v.downsample_ratio);
  r.read_number("rope_theta", v.rope_theta);
  r.read_int("max_image_tokens", v.max_image_tokens);
  r.read_int("min_pixels", v.min_pixels);
  r.read_optional_int("max_wh_ratio", v.max_wh_ratio);
  return v;
}

json vision_to_json(const DeepseekV41VisionConfig& v) {
  return {{"model_type", "deepseek_v41_vision"},
          {"hidden_size", v.hidden_size},
          {"intermediate_size", v.intermediate_size},
          {"num_hidden_layers", v.num_hidden_layers},
          {"num_attention_heads", v.num_attention_heads},
          {"patch_size", v.patch_size},
          {"downsample_ratio", v.downsample_ratio},
          {"rope_theta", v.rope_theta},
          {"max_image_tokens", v.max_image_tokens},
          {"min_pixels", v.min_pixels},
          {"max_wh_ratio", v.max_wh_ratio ? json(*v.max_wh_ratio) : json(nullptr)}};
}

// Keys of the text config that are PreTrainedConfig bookkeeping rather than model fields.
const std::set<std::string>& text_bookkeeping_keys() {
  static const std::set<std::string> keys{"model_type",
                                          "architectures",
                                          "transformers_version",
                                          "dtype",
                                          "torch_dtype",
                                          "output_hidden_states",
                                          "return_dict",
                                          "chunk_size_feed_forward",
                                          "is_encoder_decoder",
                                          "id2label",
                                          "label2id",
                                          "problem_type",
                                          "layer_types"};
  return keys;
}

// The names of DeepseekV41TextConfig's own fields: a composite config.json that carries any of
// them at the top level (and no text_config) is a flat text config in disguise.
const std::set<std::string>& text_field_names() {
  static const std::set<std::string> names = [] {
    std::set<std::string> out;
    const json defaults = text_config_to_json(DeepseekV41TextConfig{});
    for (auto it = defaults.begin(); it != defaults.end(); ++it) out.insert(it.key());
    out.erase("model_type");  // a class attribute in HF, not a field
    out.insert({"compress_ratios", "kv_source_layer_ids", "index_source_layer_ids",
                "candidate_source_layer_id", "dspark_target_layer_ids", "rope_scaling",
                "rope_parameters", "engram_layer_ids", "engram_num_embeddings", "layer_types"});
    return out;
  }();
  return names;
}

}  // namespace

std::string_view layer_type_name(LayerType type) {
  return type == LayerType::kSharedCompressedAttention ? "shared_compressed_attention"
                                                       : "sliding_attention";
}

int64_t DeepseekV41TextConfig::compress_ratio(int64_t layer) const {
  DI_CHECK(layer >= 0 && layer < static_cast<int64_t>(compress_ratios.size()), "layer ", layer);
  return compress_ratios[layer];
}
bool DeepseekV41TextConfig::is_kv_source(int64_t layer) const {
  return contains(kv_source_layer_ids, layer);
}
bool DeepseekV41TextConfig::is_index_source(int64_t layer) const {
  return contains(index_source_layer_ids, layer);
}
bool DeepseekV41TextConfig::uses_candidates(int64_t layer) const {
  return is_index_source(layer) && candidate_source_layer_id >= 0 &&
         candidate_source_layer_id < layer;
}
int64_t DeepseekV41TextConfig::kv_source_of(int64_t layer) const {
  if (compress_ratio(layer) == 0) return -1;
  int64_t best = -1;
  for (int64_t source : kv_source_layer_ids) {
    if (source <= layer) best = std::max(best, source);
  }
  return best;
}
int64_t DeepseekV41TextConfig::index_source_of(int64_t layer) const {
  if (compress_ratio(layer) == 0) return -1;
  int64_t best = -1;
  for (int64_t source : index_source_layer_ids) {
    if (source <= layer) best = std::max(best, source);
  }
  return best;
}
int64_t DeepseekV41TextConfig::engram_index(int64_t layer) const {
  auto it = std::find(engram_layer_ids.begin(), engram_layer_ids.end(), layer);
  return it == engram_layer_ids.end() ? -1 : static_cast<int64_t>(it - engram_layer_ids.begin());
}
const RopeParameters& DeepseekV41TextConfig::rope_for_layer(int64_t layer) const {
  return compress_ratio(layer) > 0 ? rope_compress : rope_main;
}

DeepseekV41TextConfig parse_text_config(const json& object, std::string_view where_view) {
  const std::string where(where_view);
  FieldReader r(object, where);
  DeepseekV41TextConfig c;
  r.read_int("vocab_size", c.vocab_size);
  r.read_int("hidden_size", c.hidden_size);
  r.read_int("num_hidden_layers", c.num_hidden_layers);
  r.read_int("num_attention_heads", c.num_attention_heads);
  r.read_int("num_key_value_heads", c.num_key_value_heads);
  r.read_int("head_dim", c.head_dim);
  r.read_int("q_lora_rank", c.q_lora_rank);
  r.read_int("qk_rope_head_dim", c.qk_rope_head_dim);
  r.read_number("rope_theta", c.rope_theta);
  r.read_number("compress_rope_theta", c.compress_rope_theta);
  const json* rope_parameters = r.read_object("rope_parameters");
  const json* rope_scaling = r.read_object("rope_scaling");
  r.read_int("max_position_embeddings", c.max_position_embeddings);
  r.read_bool("attention_bias", c.attention_bias);
  r.read_float("attention_dropout", c.attention_dropout);
  r.read_int("sliding_window", c.sliding_window);
  auto ratios = r.read_int_list("compress_ratios");
  auto kv_sources = r.read_int_list("kv_source_layer_ids");
  auto index_sources = r.read_int_list("index_source_layer_ids");
  std::optional<int64_t> candidate;
  r.read_optional_int("candidate_source_layer_id", candidate);
  r.read_int("candidate_topk_blocks", c.candidate_topk_blocks);
  r.read_int("candidate_block_size", c.candidate_block_size);
  r.read_int("index_n_heads", c.index_n_heads);
  r.read_int("index_head_dim", c.index_head_dim);
  r.read_int("index_topk", c.index_topk);
  r.read_int("o_groups", c.o_groups);
  r.read_int("o_lora_rank", c.o_lora_rank);
  r.read_int("moe_intermediate_size", c.moe_intermediate_size);
  r.read_int("n_routed_experts", c.n_routed_experts);
  r.read_int("n_shared_experts", c.n_shared_experts);
  r.read_int("num_experts_per_tok", c.num_experts_per_tok);
  r.read_string("scoring_func", c.scoring_func);
  r.read_float("gate_temp", c.gate_temp);
  r.read_bool("norm_topk_prob", c.norm_topk_prob);
  r.read_float("routed_scaling_factor", c.routed_scaling_factor);
  r.read_string("topk_method", c.topk_method);
  r.read_float("swiglu_limit", c.swiglu_limit);
  r.read_int("hc_mult", c.hc_mult);
  r.read_int("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  r.read_float("hc_eps", c.hc_eps);
  auto engram_layers = r.read_int_list("engram_layer_ids");
  r.read_int("engram_vocab_size", c.engram_vocab_size);
  auto engram_rows = r.read_int_list("engram_num_embeddings");
  r.read_int("engram_max_ngram_size", c.engram_max_ngram_size);
  r.read_int("engram_n_heads", c.engram_n_heads);
  r.read_int("engram_head_dim", c.engram_head_dim);
  r.read_int("engram_pad_id", c.engram_pad_id);
  r.read_int("engram_compressed_vocab_size", c.engram_compressed_vocab_size);
  r.read_int("num_nextn_predict_layers", c.num_nextn_predict_layers);
  r.read_int("dspark_block_size", c.dspark_block_size);
  r.read_int("dspark_noise_token_id", c.dspark_noise_token_id);
  auto dspark_targets = r.read_int_list("dspark_target_layer_ids");
  r.read_int("dspark_markov_rank", c.dspark_markov_rank);
  r.read_int("dspark_n_routed_experts", c.dspark_n_routed_experts);
  r.read_int("dspark_num_experts_per_tok", c.dspark_num_experts_per_tok);
  r.read_string("hidden_act", c.hidden_act);
  r.read_float("initializer_range", c.initializer_range);
  r.read_float("rms_norm_eps", c.rms_norm_eps);
  r.read_bool("use_cache", c.use_cache);
  r.read_bool("tie_word_embeddings", c.tie_word_embeddings);
  r.read_optional_int("pad_token_id", c.pad_token_id);
  r.read_optional_int("bos_token_id", c.bos_token_id);
  if (const json* eos = r.find("eos_token_id")) {
    c.eos_token_ids.clear();
    c.eos_token_id_is_list = eos->is_array();
    if (eos->is_array()) {
      c.eos_token_ids = *r.read_int_list("eos_token_id");
    } else if (!eos->is_null()) {
      c.eos_token_ids.push_back(r.as_int("eos_token_id", *eos));
    }
  }
  r.read_bool("output_router_logits", c.output_router_logits);
  r.read_float("router_aux_loss_coef", c.router_aux_loss_coef);
  r.read_float("router_jitter_noise", c.router_jitter_noise);
  if (const json* quantization = r.read_object("quantization_config")) {
    c.quantization_config = parse_quantization(*quantization, where + ": quantization_config");
  }
  if (auto layer_types = r.find("layer_types"); layer_types && !layer_types->is_null()) {
    // HF recomputes layer_types from the sources; a saved copy is only checked for shape.
    if (!layer_types->is_array()) r.fail_type("layer_types", "list[str] or null", *layer_types);
  }
  for (const auto& key : text_bookkeeping_keys()) r.find(key);

  derive_schedules(c, ratios, kv_sources, index_sources, candidate, dspark_targets, where);

  c.engram_layer_ids = engram_layers.value_or(std::vector<int64_t>{});
  c.engram_num_embeddings =
      engram_rows.value_or(std::vector<int64_t>(c.engram_layer_ids.size(), 0));
  if (c.engram_num_embeddings.size() != c.engram_layer_ids.size()) {
    DI_THROW(where, ": `engram_num_embeddings` (len ", c.engram_num_embeddings.size(),
             ") must match `engram_layer_ids` (len ", c.engram_layer_ids.size(), ")");
  }

  // Rope: yarn only on the compressed branch (HF __post_init__). A nested main/compress dict is
  // kept as given (PreTrainedConfig fills a missing rope_theta from `rope_theta`); anything
  // else is rebuilt from rope_theta / compress_rope_theta / rope_scaling.
  if (rope_scaling) c.rope_scaling_json = rope_scaling->dump();
  const bool nested = rope_parameters && rope_parameters->contains("main") &&
                      (*rope_parameters)["main"].is_object() &&
                      rope_parameters->contains("compress") &&
                      (*rope_parameters)["compress"].is_object();
  if (nested) {
    c.rope_main = parse_rope((*rope_parameters)["main"], where + ": rope_parameters.main");
    c.rope_compress =
        parse_rope((*rope_parameters)["compress"], where + ": rope_parameters.compress");
    if (!(*rope_parameters)["main"].contains("rope_theta")) c.rope_main.rope_theta = c.rope_theta;
    if (!(*rope_parameters)["compress"].contains("rope_theta"))
      c.rope_compress.rope_theta = c.rope_theta;
  } else {
    if (rope_parameters) {
      DI_LOG_WARN(
          where,
          ": `rope_parameters` without both `main` and `compress` is ignored (as in HF); the ",
          "ropes come from `rope_theta`, `compress_rope_theta` and `rope_scaling`");
    }
    const double partial =
        static_cast<double>(c.qk_rope_head_dim) / static_cast<double>(c.head_dim);
    c.rope_main = RopeParameters{};
    c.rope_main.rope_theta = c.rope_theta;
    c.rope_main.partial_rotary_factor = partial;
    json compress = json::object();
    if (rope_scaling) {
      for (auto it = rope_scaling->begin(); it != rope_scaling->end(); ++it) {
        if (it.key() != "main" && it.key() != "compress") compress[it.key()] = it.value();
      }
    }
    compress["rope_theta"] = c.compress_rope_theta;
    compress["partial_rotary_factor"] = partial;
    if (!compress.contains("rope_type")) {
      if (compress.contains("type")) {
        DI_LOG_WARN(where,
                    ": `rope_scaling` uses the legacy key `type`; HF ignores it for V4.1 and runs ",
                    "the compress rope as \"default\" — so does deepinfer. Spell it `rope_type`.");
      }
      compress["rope_type"] = "default";
    }
    if (compress["rope_type"] == "yarn" && !compress.contains("attention_factor")) {
      compress["attention_factor"] = 1.0;
    }
    c.rope_compress = parse_rope(compress, where + ": rope_scaling");
  }

  c.extra_keys = r.unconsumed();
  for (const auto& [key, value] : c.extra_keys) {
    DI_LOG_DEBUG(where, ": keeping unknown key `", key, "` = ", value);
  }
  validate_for_model(c, where);
  return c;
}

DeepseekV41Config parse_config(const json& object, std::string_view where_view) {
  const std::string where(where_view);
  if (!object.is_object())
    DI_THROW(where, ": expected a JSON object, got ", json_type_name(object));
  DeepseekV41Config config;
  std::string model_type;
  if (auto it = object.find("model_type"); it != object.end()) {
    if (!it->is_string()) DI_THROW(where, ": `model_type` must be a string, got ", it->dump());
    model_type = it->get<std::string>();
  }
  if (model_type == "deepseek_v41_text") {
    // A flat text config.json (AutoConfig builds DeepseekV41TextConfig from it).
    config.model_type = model_type;
    config.text = parse_text_config(object, where);
    config.tie_word_embeddings = config.text.tie_word_embeddings;
    config.quantization_config = config.text.quantization_config;
    return config;
  }
  if (!model_type.empty() && model_type != "deepseek_v41") {
    DI_THROW(where, ": `model_type` is \"", model_type,
             "\", not a DeepSeek-V4.1 config (expected \"deepseek_v41\" or \"deepseek_v41_text\")");
  }

  FieldReader r(object, where);
  r.read_int("image_token_id", config.image_token_id);
  r.read_bool("tie_word_embeddings", config.tie_word_embeddings);
  if (const json* architectures = r.find("architectures");
      architectures && !architectures->is_null()) {
    if (!architectures->is_array())
      r.fail_type("architectures", "list[str] or null", *architectures);
    for (const json& name : *architectures) {
      if (!name.is_string()) r.fail_type("architectures", "list[str] or null", *architectures);
      config.architectures.push_back(name.get<std::string>());
    }
  }
  if (const json* dtype = r.find("dtype"); dtype && !dtype->is_null())
    r.read_string("dtype", config.dtype);
  if (config.dtype.empty()) {
    if (const json* dtype = r.find("torch_dtype"); dtype && dtype->is_string())
      config.dtype = dtype->get<std::string>();
  }
  r.read_optional_int("bos_token_id", config.bos_token_id);
  if (const json* eos = r.find("eos_token_id"); eos && eos->is_number_integer())
    config.eos_token_id = eos->get<int64_t>();
  r.read_optional_int("pad_token_id", config.pad_token_id);
  r.find("model_type");
  if (const json* quantization = r.read_object("quantization_config")) {
    config.quantization_config = parse_quantization(*quantization, where + ": quantization_config");
  }
  if (const json* vision = r.read_object("vision_config")) {
    config.vision = parse_vision(*vision, where + ": vision_config");
  }

  if (const json* text = r.read_object("text_config")) {
    config.text = parse_text_config(*text, where + ": text_config");
  } else {
    // No text_config: HF adopts top-level text fields (a flat config saved by a text model)
    // and forwards the composite's tie_word_embeddings; otherwise the released defaults.
    const json& all = object;
    json leftover = json::object();
    bool has_text_field = false;
    for (auto it = all.begin(); it != all.end(); ++it) {
      static const std::set<std::string> composite_fields{"text_config",
                                                          "vision_config",
                                                          "image_token_id",
                                                          "tie_word_embeddings",
                                                          "architectures",
                                                          "dtype",
                                                          "transformers_version",
                                                          "output_hidden_states",
                                                          "return_dict",
                                                          "chunk_size_feed_forward",
                                                          "is_encoder_decoder",
                                                          "id2label",
                                                          "label2id",
                                                          "problem_type"};
      if (composite_fields.contains(it.key())) continue;
      leftover[it.key()] = it.value();
      if (text_field_names().contains(it.key())) has_text_field = true;
    }
    if (has_text_field) {
      if (!leftover.contains("tie_word_embeddings"))
        leftover["tie_word_embeddings"] = config.tie_word_embeddings;
      config.text = parse_text_config(leftover, where);
    } else {
      config.text = parse_text_config(json::object(), where + ": text_config (defaults)");
    }
  }
  // The quantizer reads the composite level; the text model must see the same block, or the
  // fp8 weights would silently be taken as bf16.
  if (config.quantization_config) {
    config.text.quantization_config = config.quantization_config;
  } else if (config.text.quantization_config) {
    config.quantization_config = config.text.quantization_config;
  }
  return config;
}

DeepseekV41Config load_config(const std::filesystem::path& path_in) {
  std::filesystem::path path = path_in;
  if (std::filesystem::is_directory(path)) path /= "config.json";
  std::ifstream file(path, std::ios::binary);
  if (!file) DI_THROW(path.string(), ": cannot open the config file");
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  json object;
  try {
    object = json::parse(text);
  } catch (const json::exception& error) {
    DI_THROW(path.string(), ": not valid JSON: ", error.what());
  }
  return parse_config(object, path.string());
}

json text_config_to_json(const DeepseekV41TextConfig& c) {
  json out = json::object();
  out["model_type"] = "deepseek_v41_text";
  out["vocab_size"] = c.vocab_size;
  out["hidden_size"] = c.hidden_size;
  out["num_hidden_layers"] = c.num_hidden_layers;
  out["num_attention_heads"] = c.num_attention_heads;
  out["num_key_value_heads"] = c.num_key_value_heads;
  out["head_dim"] = c.head_dim;
  out["q_lora_rank"] = c.q_lora_rank;
  out["qk_rope_head_dim"] = c.qk_rope_head_dim;
  out["rope_theta"] = c.rope_theta;
  out["compress_rope_theta"] = c.compress_rope_theta;
  out["rope_parameters"] = {{"main", rope_to_json(c.rope_main)},
                            {"compress", rope_to_json(c.rope_compress)}};
  out["rope_scaling"] = c.rope_scaling_json ? json::parse(*c.rope_scaling_json) : json(nullptr);
  out["max_position_embeddings"] = c.max_position_embeddings;
  out["attention_bias"] = c.attention_bias;
  out["attention_dropout"] = c.attention_dropout;
  out["sliding_window"] = c.sliding_window;
  out["compress_ratios"] = c.compress_ratios;
  out["kv_source_layer_ids"] = c.kv_source_layer_ids;
  out["index_source_layer_ids"] = c.index_source_layer_ids;
  out["candidate_source_layer_id"] = c.candidate_source_layer_id;
  out["candidate_topk_blocks"] = c.candidate_topk_blocks;
  out["candidate_block_size"] = c.candidate_block_size;
  out["index_n_heads"] = c.index_n_heads;
  out["index_head_dim"] = c.index_head_dim;
  out["index_topk"] = c.index_topk;
  out["o_groups"] = c.o_groups;
  out["o_lora_rank"] = c.o_lora_rank;
  out["moe_intermediate_size"] = c.moe_intermediate_size;
  out["n_routed_experts"] = c.n_routed_experts;
  out["n_shared_experts"] = c.n_shared_experts;
  out["num_experts_per_tok"] = c.num_experts_per_tok;
  out["scoring_func"] = c.scoring_func;
  out["gate_temp"] = c.gate_temp;
  out["norm_topk_prob"] = c.norm_topk_prob;
  out["routed_scaling_factor"] = c.routed_scaling_factor;
  out["topk_method"] = c.topk_method;
  out["swiglu_limit"] = c.swiglu_limit;
  out["hc_mult"] = c.hc_mult;
  out["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  out["hc_eps"] = c.hc_eps;
  out["engram_layer_ids"] = c.engram_layer_ids;
  out["engram_vocab_size"] = c.engram_vocab_size;
  out["engram_num_embeddings"] = c.engram_num_embeddings;
  out["engram_max_ngram_size"] = c.engram_max_ngram_size;
  out["engram_n_heads"] = c.engram_n_heads;
  out["engram_head_dim"] = c.engram_head_dim;
  out["engram_pad_id"] = c.engram_pad_id;
  out["engram_compressed_vocab_size"] = c.engram_compressed_vocab_size;
  out["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  out["dspark_block_size"] = c.dspark_block_size;
  out["dspark_noise_token_id"] = c.dspark_noise_token_id;
  out["dspark_target_layer_ids"] = c.dspark_target_layer_ids;
  out["dspark_markov_rank"] = c.dspark_markov_rank;
  out["dspark_n_routed_experts"] = c.dspark_n_routed_experts;
  out["dspark_num_experts_per_tok"] = c.dspark_num_experts_per_tok;
  out["hidden_act"] = c.hidden_act;
  out["initializer_range"] = c.initializer_range;
  out["rms_norm_eps"] = c.rms_norm_eps;
  out["use_cache"] = c.use_cache;
  out["tie_word_embeddings"] = c.tie_word_embeddings;
  out["pad_token_id"] = c.pad_token_id ? json(*c.pad_token_id) : json(nullptr);
  out["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  if (c.eos_token_id_is_list) {
    out["eos_token_id"] = c.eos_token_ids;
  } else {
    out["eos_token_id"] = c.eos_token_ids.empty() ? json(nullptr) : json(c.eos_token_ids.front());
  }
  out["output_router_logits"] = c.output_router_logits;
  out["router_aux_loss_coef"] = c.router_aux_loss_coef;
  out["router_jitter_noise"] = c.router_jitter_noise;
  json layer_types = json::array();
  for (LayerType type : c.layer_types) layer_types.push_back(layer_type_name(type));
  out["layer_types"] = layer_types;
  return out;
}

json config_to_json(const DeepseekV41Config& config) {
  json out = json::object();
  out["architectures"] = config.architectures.empty() ? json::array({"DeepseekV41ForCausalLM"})
                                                      : json(config.architectures);
  out["model_type"] = "deepseek_v41";
  if (!config.dtype.empty()) out["dtype"] = config.dtype;
  if (config.bos_token_id) out["bos_token_id"] = *config.bos_token_id;
  if (config.eos_token_id) out["eos_token_id"] = *config.eos_token_id;
  if (config.pad_token_id) out["pad_token_id"] = *config.pad_token_id;
  out["image_token_id"] = config.image_token_id;
  out["tie_word_embeddings"] = config.tie_word_embeddings;
  if (config.quantization_config)
    out["quantization_config"] = quantization_to_json(*config.quantization_config);
  json text = text_config_to_json(config.text);
  text.erase("layer_types");  // derived; HF recomputes it
  out["text_config"] = text;
  if (config.vision) out["vision_config"] = vision_to_json(*config.vision);
  return out;
}

}  // namespace deepinfer::deepseek_v41
