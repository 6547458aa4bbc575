#include "model/deepseek_v41/weights.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "core/error.h"

namespace deepinfer::deepseek_v41 {
namespace {

constexpr int64_t kFp4ScaleGroup = 32;  // one ue8m0 scale per 32 elements along K (§C.4)
constexpr int64_t kEngramScaleGroup = 32;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

// Builds the table for one layout. The released names are the checkpoint-native ones; the HF
// layout renames the four prefixes of §C.5 and stores everything dequantized.
class TableBuilder {
 public:
  TableBuilder(const DeepseekV41TextConfig& config, WeightLayout layout)
      : c_(config), layout_(layout) {
    if (layout_ == WeightLayout::kReleased && config.quantization_config) {
      const QuantizationConfig& q = *config.quantization_config;
      block_rows_ = q.weight_block_size.at(0);
      block_cols_ = q.weight_block_size.at(1);
      // Without ue8m0 the fp8 scales are f32 (V4-Flash-Base style).
      scale_dtype_ = q.ue8m0_scales() ? DType::kF8E8M0 : DType::kF32;
      quantized_ = true;
      fp4_experts_ = q.fp4_experts();
    }
  }

  std::vector<WeightSpec> build() {
    const int64_t d = c_.hidden_size;
    plain(top("embed.weight", "model.embed.weight"), {c_.vocab_size, d}, DType::kBF16, -1,
          WeightInit::kNormal, {DType::kF32});
    if (!c_.tie_word_embeddings) {
      plain(top("head.weight", "lm_head.weight"), {c_.vocab_size, d}, DType::kBF16, -1,
            WeightInit::kNormal);
    }
    plain(top("norm.weight", "model.norm.weight"), {d}, DType::kBF16, -1, WeightInit::kOnes);
    for (int64_t layer = 0; layer < c_.num_hidden_layers; ++layer) add_layer(layer);
    return std::move(table_);
  }

 private:
  std::string top(const char* released, const char* hf) const {
    return layout_ == WeightLayout::kReleased ? released : hf;
  }
  std::string layer_prefix(int64_t layer) const {
    return (layout_ == WeightLayout::kReleased ? "layers." : "model.layers.") +
           std::to_string(layer) + ".";
  }

  void plain(const std::string& name, std::vector<int64_t> shape, DType dtype, int64_t layer,
             WeightInit init, std::vector<DType> alternatives = {}) {
    WeightSpec spec;
    spec.name = name;
    spec.logical_shape = shape;
    spec.shape = std::move(shape);
    // The HF layout saves every non-fp32-kept parameter in the model dtype.
    spec.dtype = (layout_ == WeightLayout::kHfDense && dtype != DType::kF32) ? DType::kBF16 : dtype;
    spec.alternative_dtypes = std::move(alternatives);
    spec.role = WeightRole::kPlain;
    spec.layer = layer;
    spec.init = init;
    table_.push_back(std::move(spec));
  }

  // A dense linear [out, in]: fp8 with a block scale in the released layout, bf16 otherwise.
  void linear(const std::string& name, int64_t out, int64_t in, int64_t layer) {
    if (!quantized_) {
      plain(name + ".weight", {out, in}, DType::kBF16, layer, WeightInit::kNormal);
      return;
    }
    WeightSpec weight;
    weight.name = name + ".weight";
    weight.shape = weight.logical_shape = {out, in};
    weight.dtype = DType::kF8E4M3;
    weight.role = WeightRole::kFp8Block;
    weight.block_rows = block_rows_;
    weight.block_cols = block_cols_;
    weight.scale_name = name + ".scale";
    weight.layer = layer;
    WeightSpec scale;
    scale.name = name + ".scale";
    scale.shape = scale.logical_shape = {ceil_div(out, block_rows_), ceil_div(in, block_cols_)};
    scale.dtype = scale_dtype_;
    scale.role = WeightRole::kFp8BlockScale;
    scale.scale_of = weight.name;
    scale.layer = layer;
    scale.init = WeightInit::kOnes;
    table_.push_back(std::move(weight));
    table_.push_back(std::move(scale));
  }

  // A routed expert's linear [out, in]: packed fp4 with 1x32 ue8m0 scales when expert_dtype is
  // fp4, else like the dense linears.
  void expert_linear(const std::string& name, int64_t out, int64_t in, int64_t layer) {
    if (!quantized_ || !fp4_experts_) {
      linear(name, out, in, layer);
      return;
    }
    if (in % kFp4ScaleGroup != 0) {
      DI_THROW("config: routed-expert input dim ", in, " of ", name,
               " must be a multiple of 32 for fp4 experts (one ue8m0 scale per 32 elements)");
    }
    WeightSpec weight;
    weight.name = name + ".weight";
    weight.shape = {out, in / 2};
    weight.logical_shape = {out, in};
    weight.dtype = DType::kI8;
    weight.role = WeightRole::kFp4Packed;
    weight.block_rows = 1;
    weight.block_cols = kFp4ScaleGroup;
    weight.scale_name = name + ".scale";
    weight.layer = layer;
    WeightSpec scale;
    scale.name = name + ".scale";
    scale.shape = scale.logical_shape = {out, in / kFp4ScaleGroup};
    scale.dtype = DType::kF8E8M0;
    scale.role = WeightRole::kFp4Scale;
    scale.scale_of = weight.name;
    scale.layer = layer;
    scale.init = WeightInit::kOnes;
    table_.push_back(std::move(weight));
    table_.push_back(std::move(scale));
  }

  void add_layer(int64_t layer) {
    const std::string p = layer_prefix(layer);
    const int64_t d = c_.hidden_size;
    const int64_t heads = c_.num_attention_heads;
    const int64_t hd = c_.head_dim;
    const int64_t mix = c_.hc_mix_rows();

    plain(p + "attn_norm.weight", {d}, DType::kBF16, layer, WeightInit::kOnes);
    plain(p + "ffn_norm.weight", {d}, DType::kBF16, layer, WeightInit::kOnes);
    for (const char* site : {"attn", "ffn"}) {
      plain(p + "hc_" + site + "_fn", {mix, c_.hc_mult * d}, DType::kF32, layer,
            WeightInit::kNormal);
      plain(p + "hc_" + site + "_base", {mix}, DType::kF32, layer, WeightInit::kZeros);
      plain(p + "hc_" + site + "_scale", {3}, DType::kF32, layer, WeightInit::kOnes);
    }

    // Attention: low-rank q, one shared K=V latent, grouped low-rank output, per-head sink.
    linear(p + "attn.wq_a", c_.q_lora_rank, d, layer);
    plain(p + "attn.q_norm.weight", {c_.q_lora_rank}, DType::kBF16, layer, WeightInit::kOnes);
    linear(p + "attn.wq_b", heads * hd, c_.q_lora_rank, layer);
    linear(p + "attn.wkv", hd, d, layer);
    plain(p + "attn.kv_norm.weight", {hd}, DType::kBF16, layer, WeightInit::kOnes);
    linear(p + "attn.wo_a", c_.o_groups * c_.o_lora_rank, heads * hd / c_.o_groups, layer);
    linear(p + "attn.wo_b", d, c_.o_groups * c_.o_lora_rank, layer);
    plain(p + "attn.attn_sink", {heads}, DType::kF32, layer, WeightInit::kZeros);

    const int64_t ratio = c_.compress_ratio(layer);
    if (c_.is_kv_source(layer)) {
      // BF16 in the checkpoint; run in fp32 above ratio 1. No wgate at ratio 1 (no pooling).
      plain(p + "attn.compressor.wkv.weight", {hd, d}, DType::kBF16, layer, WeightInit::kNormal);
      if (ratio > 1)
        plain(p + "attn.compressor.wgate.weight", {hd, d}, DType::kBF16, layer,
              WeightInit::kNormal);
      plain(p + "attn.compressor.norm.weight", {hd}, DType::kBF16, layer, WeightInit::kOnes);
    }
    if (c_.is_index_source(layer)) {
      linear(p + "attn.indexer.wq_b", c_.index_n_heads * c_.index_head_dim, c_.q_lora_rank, layer);
      plain(p + "attn.indexer.weights_proj.weight", {c_.index_n_heads, d}, DType::kBF16, layer,
            WeightInit::kNormal);
      if (c_.is_kv_source(layer)) {  // key owners only
        plain(p + "attn.indexer.wk.weight", {c_.index_head_dim, hd}, DType::kBF16, layer,
              WeightInit::kNormal);
        plain(p + "attn.indexer.k_norm.weight", {c_.index_head_dim}, DType::kBF16, layer,
              WeightInit::kOnes);
      }
    }

    // MoE: gate (+ selection bias, + the image-token bias), routed experts, one shared expert.
    const int64_t experts = c_.n_routed_experts;
    const int64_t inter = c_.moe_intermediate_size;
    plain(p + "ffn.gate.weight", {experts, d}, DType::kBF16, layer, WeightInit::kNormal,
          {DType::kF32});
    plain(p + "ffn.gate.bias", {experts}, DType::kF32, layer, WeightInit::kZeros);
    plain(p + "ffn.gate.bias_vl", {experts}, DType::kF32, layer, WeightInit::kZeros);
    for (int64_t e = 0; e < experts; ++e) {
      const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
      expert_linear(ep + "w1", inter, d, layer);
      expert_linear(ep + "w2", d, inter, layer);
      expert_linear(ep + "w3", inter, d, layer);
    }
    linear(p + "ffn.shared_experts.w1", inter, d, layer);
    linear(p + "ffn.shared_experts.w2", d, inter, layer);
    linear(p + "ffn.shared_experts.w3", inter, d, layer);

    if (const int64_t slot = c_.engram_index(layer); slot >= 0) add_engram(p, layer, slot);
  }

  void add_engram(const std::string& p, int64_t layer, int64_t slot) {
    const int64_t rows = c_.engram_num_embeddings[slot];
    const int64_t dim = c_.engram_head_dim;
    if (dim % kEngramScaleGroup != 0) {
      DI_THROW("config: `engram_head_dim` (", dim,
               ") must be a multiple of 32 (one scale per 32 channels)");
    }
    if (rows <= 0) {
      DI_THROW("config: `engram_num_embeddings[", slot, "]` for engram layer ", layer,
               " must be > 0 to lay out its table, got ", rows);
    }
    WeightSpec table;
    table.name = p + "engram.embed.weight";
    table.shape = table.logical_shape = {rows, dim};
    table.dtype = quantized_ ? DType::kF8E4M3 : DType::kBF16;
    table.role = WeightRole::kEngramTable;
    table.block_rows = 1;
    table.block_cols = kEngramScaleGroup;
    table.scale_name = p + "engram.embed.scale";
    table.layer = layer;
    WeightSpec scale;
    scale.name = p + "engram.embed.scale";
    scale.shape = scale.logical_shape = {rows, dim / kEngramScaleGroup};
    scale.dtype = quantized_ ? DType::kF8E8M0 : DType::kBF16;
    scale.role = WeightRole::kEngramScale;
    scale.scale_of = table.name;
    scale.layer = layer;
    scale.init = WeightInit::kOnes;
    table_.push_back(std::move(table));
    table_.push_back(std::move(scale));
    // Keys for every hc stream first, then the shared value (§C.3).
    linear(p + "engram.wkv", c_.hidden_size * (c_.hc_mult + 1), c_.engram_hash_columns() * dim,
           layer);
    // Used only as the product q*k; BF16 per the header checker, F32 in HF's fixture (§D.6).
    plain(p + "engram.q_weight", {c_.hc_mult, c_.hidden_size}, DType::kBF16, layer,
          WeightInit::kOnes, {DType::kF32});
    plain(p + "engram.k_weight", {c_.hc_mult, c_.hidden_size}, DType::kBF16, layer,
          WeightInit::kOnes, {DType::kF32});
  }

  const DeepseekV41TextConfig& c_;
  WeightLayout layout_;
  bool quantized_ = false;
  bool fp4_experts_ = false;
  int64_t block_rows_ = 0;
  int64_t block_cols_ = 0;
  DType scale_dtype_ = DType::kF8E8M0;
  std::vector<WeightSpec> table_;
};

}  // namespace

std::string_view weight_layout_name(WeightLayout layout) {
  return layout == WeightLayout::kReleased ? "released" : "hf";
}

WeightLayout parse_weight_layout(std::string_view name) {
  if (name == "released") return WeightLayout::kReleased;
  if (name == "hf") return WeightLayout::kHfDense;
  DI_THROW("unknown checkpoint layout \"", name, "\" (expected \"released\" or \"hf\")");
}

std::string_view weight_role_name(WeightRole role) {
  switch (role) {
    case WeightRole::kPlain:
      return "plain";
    case WeightRole::kFp8Block:
      return "fp8_block";
    case WeightRole::kFp8BlockScale:
      return "fp8_block_scale";
    case WeightRole::kFp4Packed:
      return "fp4_packed";
    case WeightRole::kFp4Scale:
      return "fp4_scale";
    case WeightRole::kEngramTable:
      return "engram_table";
    case WeightRole::kEngramScale:
      return "engram_scale";
  }
  return "?";
}

bool WeightSpec::accepts(DType stored) const {
  return stored == dtype || std::find(alternative_dtypes.begin(), alternative_dtypes.end(),
                                      stored) != alternative_dtypes.end();
}

int64_t WeightSpec::element_count() const {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

std::vector<WeightSpec> build_weight_table(const DeepseekV41TextConfig& config,
                                           WeightLayout layout) {
  return TableBuilder(config, layout).build();
}

bool is_ignored_non_text_tensor(std::string_view name) {
  auto starts = [&](std::string_view prefix) { return name.substr(0, prefix.size()) == prefix; };
  if (starts("mtp.") || name.find(".mtp.") != std::string_view::npos) return true;
  if (starts("vision.") || starts("aligner.")) return true;
  return name == "image_start" || name == "image_end" || name == "image_newline";
}

std::string WeightTableMismatch::describe(size_t max_per_kind) const {
  std::ostringstream out;
  auto list = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    out << "\n  " << names.size() << ' ' << what << ':';
    for (size_t i = 0; i < names.size() && i < max_per_kind; ++i) out << "\n    " << names[i];
    if (names.size() > max_per_kind)
      out << "\n    ... and " << names.size() - max_per_kind << " more";
  };
  list("missing", missing);
  list("unexpected", unexpected);
  list("with the wrong shape", misshaped);
  list("with the wrong dtype", wrong_dtype);
  return out.str();
}

WeightTableMismatch compare_with_table(const std::vector<WeightSpec>& table,
                                       const std::vector<CheckpointTensorInfo>& tensors) {
  WeightTableMismatch result;
  std::map<std::string_view, const CheckpointTensorInfo*> by_name;
  for (const CheckpointTensorInfo& tensor : tensors) by_name.emplace(tensor.name, &tensor);
  std::map<std::string_view, const WeightSpec*> specs;
  for (const WeightSpec& spec : table) specs.emplace(spec.name, &spec);

  for (const WeightSpec& spec : table) {
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      result.missing.push_back(spec.name);
      continue;
    }
    const CheckpointTensorInfo& got = *it->second;
    if (got.shape != spec.shape) {
      result.misshaped.push_back(spec.name + ": expected " + shape_text(spec.shape) + ", got " +
                                 shape_text(got.shape));
    }
    if (!spec.accepts(got.dtype)) {
      result.wrong_dtype.push_back(spec.name + ": expected " +
                                   std::string(dtype_safetensors_name(spec.dtype)) + ", got " +
                                   std::string(dtype_safetensors_name(got.dtype)));
    }
  }
  for (const CheckpointTensorInfo& tensor : tensors) {
    if (specs.contains(tensor.name)) continue;
    if (is_ignored_non_text_tensor(tensor.name)) {
      ++result.ignored;
    } else {
      result.unexpected.push_back(tensor.name);
    }
  }
  std::sort(result.unexpected.begin(), result.unexpected.end());
  return result;
}

void validate_checkpoint_tensors(const std::vector<WeightSpec>& table,
                                 const std::vector<CheckpointTensorInfo>& tensors,
                                 WeightLayout layout, std::string_view where) {
  const WeightTableMismatch mismatch = compare_with_table(table, tensors);
  if (!mismatch.ok()) {
    DI_THROW(where, ": checkpoint does not match the DeepSeek-V4.1 ", weight_layout_name(layout),
             " layout for this config:", mismatch.describe());
  }
}

std::optional<WeightLayout> detect_weight_layout(const std::vector<CheckpointTensorInfo>& tensors) {
  bool released = false;
  bool hf = false;
  for (const CheckpointTensorInfo& tensor : tensors) {
    const std::string_view name = tensor.name;
    if (name.starts_with("model.") || name.starts_with("lm_head.")) hf = true;
    if (name.starts_with("layers.") || name == "embed.weight" || name == "head.weight")
      released = true;
  }
  if (released == hf) return std::nullopt;
  return released ? WeightLayout::kReleased : WeightLayout::kHfDense;
}

}  // namespace deepinfer::deepseek_v41
