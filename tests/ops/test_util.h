// Helpers shared by the op tests: seeded random tensors and element access.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace deepinfer::ops::testing {

// The dense GPU linears whose every product is exact (the FP8 tiles, cuBLASLt over exactly
// dequantized operands) against the CPU reference: the worst |got - want| over the largest |want|
// of the checked rows; only the order of the FP32 additions differs.
constexpr double kExactProductsTolerance = 2e-5;

// A named weight shape [n, k].
struct WeightShape {
  const char* name;
  int64_t n = 0;
  int64_t k = 0;
};

// The released checkpoint's dense FP8 roles (docs/MODEL.md): attention's wq_a, wkv, wq_b, wo_b,
// the shared expert's w1 | w3 (as one pair) and w2, the indexer's wq_b.
inline const std::vector<WeightShape>& released_fp8_roles() {
  static const std::vector<WeightShape> roles = {
      {"wq_a", 1280, 5120},        {"wkv", 512, 5120},           {"wq_b", 32768, 1280},
      {"wo_b", 5120, 8192},        {"shared w1|w3", 4608, 5120}, {"shared w2", 5120, 2304},
      {"indexer wq_b", 4096, 1280}};
  return roles;
}

// The GPU linear tests' strided inputs: rows k wide inside rows of k + kExtraColumns floats,
// starting kColumnOffset in.
constexpr int64_t kExtraColumns = 64;
constexpr int64_t kColumnOffset = 32;

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

// A host f32 tensor of N(0, 1) values.
inline Tensor random_f32(Shape shape, uint32_t seed) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  const std::vector<float> values = random_values(static_cast<size_t>(t.numel()), seed);
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

// The same bytes (and so the same bits, NaN payloads included).
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.view().nbytes() == b.view().nbytes() &&
         std::memcmp(a.view().raw_data(), b.view().raw_data(), a.view().nbytes()) == 0;
}

// Worst |got - want| over max |want| of f32 tensors; a NaN must meet a NaN (rows a kernel must
// leave unwritten), a NaN on one side only is infinite.
inline double worst_error_matching_nans(const Tensor& want, const Tensor& got) {
  const float* w = want.data<float>();
  const float* g = got.data<float>();
  double scale = 1e-30;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (!std::isnan(w[i])) scale = std::max(scale, std::abs(static_cast<double>(w[i])));
  }
  double worst = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::isnan(w[i]) || std::isnan(g[i])) {
      if (std::isnan(w[i]) != std::isnan(g[i])) return INFINITY;
      continue;
    }
    worst = std::max(worst, std::abs(static_cast<double>(g[i]) - w[i]) / scale);
  }
  return worst;
}

// A GPU linear's output written into columns [n, 2n) of a NaN-filled host copy `guarded`
// [rows, 2n]: expects columns [0, n) untouched (still NaN) and every output element written
// (finite), naming `what`; returns the output [rows, n].
inline Tensor output_between_guards(const Tensor& guarded, int64_t rows, int64_t n,
                                    const std::string& what) {
  Tensor got = Tensor::empty(DType::kF32, {rows, n});
  int64_t outside = 0;
  int64_t unwritten = 0;
  for (int64_t m = 0; m < rows; ++m) {
    const float* row = guarded.data<float>() + m * 2 * n;
    for (int64_t c = 0; c < n; ++c) {
      outside += std::isnan(row[c]) ? 0 : 1;
      unwritten += std::isfinite(row[n + c]) ? 0 : 1;
    }
    std::copy(row + n, row + 2 * n, got.data<float>() + m * n);
  }
  EXPECT_EQ(outside, 0) << what << ", " << rows << " rows: elements written outside the output";
  EXPECT_EQ(unwritten, 0) << what << ", " << rows << " rows: output elements not written";
  return got;
}

// Worst |got - want| over the sampled rows in [first, first + count), over their max |want|:
// want [sample.size(), n] holds the reference's rows `sample`; got [count, n] starts at row
// `first`. A non-finite element of got is infinite.
inline double sampled_rows_error(const std::vector<int64_t>& sample, const Tensor& want, int64_t n,
                                 const Tensor& got, int64_t first, int64_t count) {
  double scale = 1e-30;
  double worst = 0.0;
  for (size_t i = 0; i < sample.size(); ++i) {
    const int64_t row = sample[i];
    if (row < first || row >= first + count) continue;
    const float* w = want.data<float>() + static_cast<int64_t>(i) * n;
    for (int64_t c = 0; c < n; ++c) scale = std::max(scale, std::abs(double{w[c]}));
  }
  for (size_t i = 0; i < sample.size(); ++i) {
    const int64_t row = sample[i];
    if (row < first || row >= first + count) continue;
    const float* w = want.data<float>() + static_cast<int64_t>(i) * n;
    const float* g = got.data<float>() + (row - first) * n;
    for (int64_t c = 0; c < n; ++c) {
      if (!std::isfinite(g[c])) return INFINITY;
      worst = std::max(worst, std::abs(static_cast<double>(g[c]) - w[c]) / scale);
    }
  }
  return worst;
}

// A host indexer key cache (ops::IndexerKeys) of `rows` keys of `dim` channels holding the
// fp4 quantization of `values` [rows, dim] (write_indexer_keys, the model's own writer).
struct HostKeyCache {
  Tensor codes;
  Tensor scales;
  IndexerKeys keys() const { return {codes.view(), scales.view()}; }
};

inline HostKeyCache host_key_cache(std::vector<float> values, int64_t rows, int64_t dim) {
  HostKeyCache cache{Tensor::zeros(DType::kF4E2M1x2, {rows, dim}),
                     Tensor::zeros(DType::kF8E8M0, {rows, dim / 32})};
  if (rows == 0) return cache;
  const IndexerKeyWrite write{cache.keys(), 0, rows, 0};
  write_indexer_keys(TensorView::contiguous(values.data(), DType::kF32, {rows, dim}), {&write, 1});
  return cache;
}

}  // namespace deepinfer::ops::testing
