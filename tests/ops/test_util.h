// Helpers shared by the op tests: seeded random tensors and element access.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/tensor.h"

namespace deepinfer::ops::testing {

inline std::vector<float> random_values(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

inline TensorView view_of(std::vector<float>& values, Shape shape) {
  return TensorView::contiguous(values.data(), DType::kF32, shape);
}

inline TensorView view_of(std::vector<int32_t>& values, Shape shape) {
  return TensorView::contiguous(values.data(), DType::kI32, shape);
}

inline TensorView view_of(std::vector<int8_t>& values, Shape shape) {
  return TensorView::contiguous(values.data(), DType::kI8, shape);
}

// A host tensor of uniformly random bytes in [lo, hi] (packed or quantized storage codes).
inline Tensor random_bytes(DType dtype, Shape shape, uint32_t seed, int lo, int hi) {
  Tensor t = Tensor::empty(dtype, shape);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(lo, hi);
  auto* bytes = static_cast<uint8_t*>(t.view().raw_data());
  for (size_t i = 0; i < t.view().nbytes(); ++i) bytes[i] = static_cast<uint8_t>(byte(rng));
  return t;
}

// Random e4m3 bytes without the NaN codes (S.1111.111).
inline Tensor random_e4m3(Shape shape, uint32_t seed) {
  Tensor t = random_bytes(DType::kF8E4M3, shape, seed, 0, 255);
  auto* bytes = static_cast<uint8_t*>(t.view().raw_data());
  for (size_t i = 0; i < t.view().nbytes(); ++i) {
    if ((bytes[i] & 0x7F) == 0x7F) bytes[i] ^= 1;
  }
  return t;
}

// Relative closeness on a scale set by the expected magnitude.
inline double max_relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1e-30;
  for (double w : want) scale = std::max(scale, std::abs(w));
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]) / scale);
  }
  return worst;
}

}  // namespace deepinfer::ops::testing
