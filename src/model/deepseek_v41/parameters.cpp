#include "model/deepseek_v41/parameters.h"

#include <cstring>

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
  Tensor tensor = Tensor::empty(DType::kF32, {weight.out_features(), weight.in_features()});
  ops::dequantize_weight(weight, tensor.view());
  owned.push_back(std::move(tensor));
  return ops::LinearWeight{owned.back().view(), TensorView()};
}

}  // namespace deepinfer::deepseek_v41
