#include "model/deepseek_v41/parameters.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <string_view>
#include <tuple>

namespace deepinfer::deepseek_v41 {

TensorView ModelParameters::own_f32(const TensorView& view) {
  if (!view.is_contiguous()) DI_THROW("parameter ", view.to_string(), " is not contiguous");
  Tensor tensor = Tensor::empty(DType::kF32, view.shape());
  float* out = tensor.data<float>();
  const int64_t count = view.numel();
  switch (view.dtype()) {
    case DType::kF32:
      std::memcpy(out, view.raw_data(), static_cast<size_t>(count) * sizeof(float));
      break;
    case DType::kBF16: {
      const auto* bits = static_cast<const uint16_t*>(view.raw_data());
      for (int64_t i = 0; i < count; ++i) {
        const uint32_t wide = static_cast<uint32_t>(bits[i]) << 16;
        std::memcpy(&out[i], &wide, sizeof(float));
      }
      break;
    }
    default:
      DI_THROW("parameter ", view.to_string(), " must be f32 or bf16");
  }
  owned.push_back(std::move(tensor));
  return owned.back().view();
}

ops::LinearWeight ModelParameters::own_dense(const ops::LinearWeight& weight) {
  Tensor dense = Tensor::empty(DType::kF32, {weight.out_features(), weight.in_features()});
  ops::dequantize_weight(weight, dense.view());
  // An e4m3 value times a power-of-two scale has at most 4 significant bits, so FP8 weights
  // dequantize exactly into bf16: half the bytes of f32, and the GPU's BF16 tensor-core path.
  // Kept f32 only if some value would round (not for released FP8 weights).
  const auto* bits = static_cast<const uint32_t*>(dense.view().raw_data());
  const int64_t count = dense.numel();
  bool bf16_exact = true;
  for (int64_t i = 0; i < count && bf16_exact; ++i) bf16_exact = (bits[i] & 0xFFFFu) == 0;
  if (bf16_exact) {
    Tensor narrow = Tensor::empty(DType::kBF16, dense.shape());
    auto* out = static_cast<uint16_t*>(narrow.view().raw_data());
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<uint16_t>(bits[i] >> 16);
    dense = std::move(narrow);
  }
  owned.push_back(std::move(dense));
  return ops::LinearWeight{owned.back().view(), TensorView()};
}

void for_each_view(ModelParameters& parameters, const std::function<void(TensorView&)>& fn) {
  const auto linear = [&](ops::LinearWeight& weight) {
    fn(weight.weight);
    fn(weight.scale);
    fn(weight.bf16_copy);
  };
  const auto expert = [&](ExpertParameters& e) {
    linear(e.w1);
    linear(e.w2);
    linear(e.w3);
  };
  fn(parameters.embed);
  fn(parameters.norm);
  linear(parameters.head);
  for (LayerParameters& layer : parameters.layers) {
    for (TensorView* view :
         {&layer.attn_norm, &layer.ffn_norm, &layer.hc_attn_fn, &layer.hc_attn_base,
          &layer.hc_attn_scale, &layer.hc_ffn_fn, &layer.hc_ffn_base, &layer.hc_ffn_scale,
          &layer.gate_weight, &layer.gate_bias}) {
      fn(*view);
    }
    AttentionParameters& attn = layer.attn;
    for (ops::LinearWeight* weight :
         {&attn.wq_a, &attn.wq_b, &attn.wkv, &attn.wo_a, &attn.wo_b, &attn.compressor_wkv,
          &attn.compressor_wgate, &attn.indexer_wq_b, &attn.indexer_weights_proj,
          &attn.indexer_wk}) {
      linear(*weight);
    }
    for (TensorView* view : {&attn.q_norm, &attn.kv_norm, &attn.attn_sink, &attn.compressor_norm,
                             &attn.indexer_k_norm}) {
      fn(*view);
    }
    for (ExpertParameters& e : layer.experts) expert(e);
    expert(layer.shared_expert);
    if (layer.engram) {
      fn(layer.engram->table);
      fn(layer.engram->table_scale);
      linear(layer.engram->wkv);
      fn(layer.engram->qk);
    }
  }
}

void for_each_dense_linear(ModelParameters& parameters,
                           const std::function<void(ops::LinearWeight&)>& fn) {
  fn(parameters.head);
  for (LayerParameters& layer : parameters.layers) {
    AttentionParameters& attn = layer.attn;
    for (ops::LinearWeight* weight :
         {&attn.wq_a, &attn.wq_b, &attn.wkv, &attn.wo_a, &attn.wo_b, &attn.compressor_wkv,
          &attn.compressor_wgate, &attn.indexer_wq_b, &attn.indexer_weights_proj, &attn.indexer_wk,
          &layer.shared_expert.w1, &layer.shared_expert.w2, &layer.shared_expert.w3}) {
      fn(*weight);
    }
    if (layer.engram) fn(layer.engram->wkv);
  }
}

bool bf16_copies_requested() {
  const char* setting = std::getenv("DEEPINFER_BF16_WEIGHT_COPIES");
  if (setting == nullptr || std::string_view(setting) == "0") return false;
  if (std::string_view(setting) == "1") return true;
  DI_THROW("DEEPINFER_BF16_WEIGHT_COPIES='", setting, "' is not valid (0 or 1)");
}

size_t add_bf16_copies(ModelParameters& parameters, Allocator& allocator) {
  size_t bytes = 0;
  // Views naming one tensor share its copy.
  std::map<const void*, TensorView> copies;
  for_each_dense_linear(parameters, [&](ops::LinearWeight& weight) {
    if (weight.weight.dtype() != DType::kF8E4M3 || weight.weight.numel() == 0 ||
        weight.bf16_copy.numel() != 0) {
      return;
    }
    if (auto found = copies.find(weight.weight.raw_data()); found != copies.end()) {
      weight.bf16_copy = found->second;
      return;
    }
    Tensor copy = Tensor::empty(DType::kBF16, weight.weight.shape(), allocator);
    ops::dequantize_weight(weight, copy.view());
    bytes += copy.view().nbytes();
    parameters.owned.push_back(std::move(copy));
    weight.bf16_copy = parameters.owned.back().view();
    copies.emplace(weight.weight.raw_data(), weight.bf16_copy);
  });
  ops::synchronize(allocator.device());
  return bytes;
}

std::unique_ptr<ModelParameters> copy_parameters(const ModelParameters& source,
                                                 Allocator& allocator) {
  auto result = std::make_unique<ModelParameters>();
  result->embed = source.embed;
  result->layers = source.layers;
  result->norm = source.norm;
  result->head = source.head;
  // The same tensor named by several views is copied once.
  using Key = std::tuple<const void*, DType, std::vector<int64_t>, std::vector<int64_t>>;
  std::map<Key, TensorView> copies;
  for_each_view(*result, [&](TensorView& view) {
    if (view.numel() == 0) {
      view = TensorView();
      return;
    }
    const Key key{view.raw_data(), view.dtype(),
                  std::vector<int64_t>(view.shape().span().begin(), view.shape().span().end()),
                  std::vector<int64_t>(view.strides().span().begin(), view.strides().span().end())};
    if (auto found = copies.find(key); found != copies.end()) {
      view = found->second;
      return;
    }
    Tensor tensor = Tensor::empty(view.dtype(), view.shape(), allocator);
    ops::copy(view, tensor.view());
    result->owned.push_back(std::move(tensor));
    copies.emplace(key, result->owned.back().view());
    view = result->owned.back().view();
  });
  ops::synchronize(allocator.device());
  return result;
}

}  // namespace deepinfer::deepseek_v41
