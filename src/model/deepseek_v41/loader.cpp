#include "model/deepseek_v41/loader.h"

#include <cstdlib>
#include <map>
#include <string_view>

#include "core/error.h"
#include "core/logging.h"
#include "io/safetensors_checkpoint.h"

namespace deepinfer::deepseek_v41 {
namespace {

class ParameterReader {
 public:
  ParameterReader(const DeepseekV41TextConfig& config, WeightLayout layout,
                  const std::function<TensorView(const std::string&)>& lookup,
                  ModelParameters& parameters)
      : layout_(layout), lookup_(lookup), p_(parameters) {
    for (WeightSpec& spec : build_weight_table(config, layout)) {
      const std::string name = spec.name;
      specs_.emplace(name, std::move(spec));
    }
  }

  // The checkpoint name of a tensor given its released (checkpoint-native) name.
  std::string name_of(const std::string& native) const {
    if (layout_ == WeightLayout::kReleased) return native;
    if (native == "head.weight") return "lm_head.weight";
    return "model." + native;
  }

  const WeightSpec& spec(const std::string& native) const {
    const auto it = specs_.find(name_of(native));
    if (it == specs_.end()) DI_THROW("the weight table has no tensor ", name_of(native));
    return it->second;
  }

  TensorView plain(const std::string& native) { return lookup_(spec(native).name); }
  TensorView f32(const std::string& native) { return p_.own_f32(plain(native)); }

  // A linear weight with its scale, by the weight's native name (".weight" included).
  ops::LinearWeight linear(const std::string& native) {
    const WeightSpec& s = spec(native);
    TensorView weight = lookup_(s.name);
    switch (s.role) {
      case WeightRole::kPlain:
        return {weight, TensorView()};
      case WeightRole::kFp8Block:
        return {weight, lookup_(s.scale_name)};
      case WeightRole::kFp4Packed:
        return {weight.dtype() == DType::kF4E2M1x2 ? weight : weight.reinterpret(DType::kF4E2M1x2),
                lookup_(s.scale_name)};
      default:
        DI_THROW("tensor ", s.name, " has role ", weight_role_name(s.role),
                 ", not a linear weight");
    }
  }

 private:
  WeightLayout layout_;
  const std::function<TensorView(const std::string&)>& lookup_;
  ModelParameters& p_;
  std::map<std::string, WeightSpec> specs_;
};

}  // namespace

bool fp8_wo_a_requested() {
  const char* setting = std::getenv("DEEPINFER_WO_A_FP8");
  if (setting == nullptr || std::string_view(setting) == "0") return false;
  if (std::string_view(setting) == "1") return true;
  DI_THROW("DEEPINFER_WO_A_FP8='", setting, "' is not valid (0 or 1)");
}

bool keeps_wo_a_as_stored(const ops::LinearWeight& wo_a, int64_t groups) {
  return fp8_wo_a_requested() && wo_a.weight.dtype() == DType::kF8E4M3 &&
         ops::linear_grouped_supports(wo_a, groups);
}

std::unique_ptr<ModelParameters> build_parameters(
    const DeepseekV41TextConfig& c, WeightLayout layout,
    const std::function<TensorView(const std::string& name)>& lookup) {
  auto parameters = std::make_unique<ModelParameters>();
  ModelParameters& p = *parameters;
  ParameterReader read(c, layout, lookup, p);
  p.embed = read.plain("embed.weight");
  p.norm = read.plain("norm.weight");
  p.head = read.linear("head.weight");
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string prefix = "layers." + std::to_string(layer) + ".";
    LayerParameters lp;
    lp.attn_norm = read.plain(prefix + "attn_norm.weight");
    lp.ffn_norm = read.plain(prefix + "ffn_norm.weight");
    lp.hc_attn_fn = read.f32(prefix + "hc_attn_fn");
    lp.hc_attn_base = read.f32(prefix + "hc_attn_base");
    lp.hc_attn_scale = read.f32(prefix + "hc_attn_scale");
    lp.hc_ffn_fn = read.f32(prefix + "hc_ffn_fn");
    lp.hc_ffn_base = read.f32(prefix + "hc_ffn_base");
    lp.hc_ffn_scale = read.f32(prefix + "hc_ffn_scale");

    AttentionParameters& a = lp.attn;
    const std::string attn = prefix + "attn.";
    a.wq_a = read.linear(attn + "wq_a.weight");
    a.q_norm = read.plain(attn + "q_norm.weight");
    a.wq_b = read.linear(attn + "wq_b.weight");
    a.wkv = read.linear(attn + "wkv.weight");
    a.kv_norm = read.plain(attn + "kv_norm.weight");
    // Both references run wo_a as bf16 with an unquantized activation (DeepSeek's convert.py
    // dequantizes it). An e4m3 value times a power-of-two scale is exact in bf16, so the FP8
    // weight under ActivationQuant::kNone multiplies the same values at half the bytes
    // (keeps_wo_a_as_stored); else dequantized (bf16 checkpoints, test shapes, the default).
    const ops::LinearWeight wo_a = read.linear(attn + "wo_a.weight");
    a.wo_a = keeps_wo_a_as_stored(wo_a, c.o_groups) ? wo_a : p.own_dense(wo_a);
    a.wo_b = read.linear(attn + "wo_b.weight");
    a.attn_sink = read.f32(attn + "attn_sink");
    if (c.is_kv_source(layer)) {
      a.compressor_wkv = read.linear(attn + "compressor.wkv.weight");
      if (c.compress_ratio(layer) > 1)
        a.compressor_wgate = read.linear(attn + "compressor.wgate.weight");
      a.compressor_norm = read.plain(attn + "compressor.norm.weight");
      if (c.is_index_source(layer)) {
        a.indexer_wk = read.linear(attn + "indexer.wk.weight");
        a.indexer_k_norm = read.plain(attn + "indexer.k_norm.weight");
      }
    }
    if (c.is_index_source(layer)) {
      a.indexer_wq_b = read.linear(attn + "indexer.wq_b.weight");
      a.indexer_weights_proj = read.linear(attn + "indexer.weights_proj.weight");
    }

    const std::string ffn = prefix + "ffn.";
    lp.gate_weight = read.plain(ffn + "gate.weight");
    lp.gate_bias = read.f32(ffn + "gate.bias");
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      const std::string expert = ffn + "experts." + std::to_string(e) + ".";
      lp.experts.push_back({read.linear(expert + "w1.weight"), read.linear(expert + "w2.weight"),
                            read.linear(expert + "w3.weight")});
    }
    lp.shared_expert = {read.linear(ffn + "shared_experts.w1.weight"),
                        read.linear(ffn + "shared_experts.w2.weight"),
                        read.linear(ffn + "shared_experts.w3.weight")};

    if (c.engram_index(layer) >= 0) {
      EngramParameters ep;
      const std::string engram = prefix + "engram.";
      ep.table = read.plain(engram + "embed.weight");
      // HF keeps the scale as a parameter but uses it only when the table is fp8.
      if (ep.table.dtype() == DType::kF8E4M3) ep.table_scale = read.plain(engram + "embed.scale");
      ep.wkv = read.linear(engram + "wkv.weight");
      const TensorView q = read.f32(engram + "q_weight");
      const TensorView k = read.f32(engram + "k_weight");
      Tensor qk = Tensor::empty(DType::kF32, q.shape());
      for (int64_t i = 0; i < q.numel(); ++i)
        qk.data<float>()[i] = q.data<float>()[i] * k.data<float>()[i];
      p.owned.push_back(std::move(qk));
      ep.qk = p.owned.back().view();
      lp.engram = ep;
    }
    p.layers.push_back(std::move(lp));
  }
  return parameters;
}

LoadedModel::LoadedModel() = default;
LoadedModel::~LoadedModel() = default;
LoadedModel::LoadedModel(LoadedModel&&) noexcept = default;
LoadedModel& LoadedModel::operator=(LoadedModel&&) noexcept = default;

LoadedModel load_model(const std::filesystem::path& directory) {
  LoadedModel model;
  model.config = load_config(directory);
  model.checkpoint =
      std::make_unique<SafetensorsCheckpoint>(SafetensorsCheckpoint::open(directory));
  std::vector<CheckpointTensorInfo> infos;
  for (const SafetensorsTensor* tensor : model.checkpoint->tensors()) {
    infos.push_back({tensor->name, tensor->dtype, tensor->shape});
  }
  const std::optional<WeightLayout> layout = detect_weight_layout(infos);
  model.layout = layout.value_or(WeightLayout::kReleased);
  const std::vector<WeightSpec> table = build_weight_table(model.config.text, model.layout);
  validate_checkpoint_tensors(table, infos, model.layout, directory.string());
  const SafetensorsCheckpoint& checkpoint = *model.checkpoint;
  model.parameters =
      build_parameters(model.config.text, model.layout,
                       [&](const std::string& name) { return checkpoint.at(name).view(); });
  DI_LOG_INFO("loaded ", directory.string(), " (", weight_layout_name(model.layout), " layout, ",
              model.config.text.num_hidden_layers, " layers)");
  return model;
}

}  // namespace deepinfer::deepseek_v41
