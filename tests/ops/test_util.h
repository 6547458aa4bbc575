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
