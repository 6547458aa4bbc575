#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

using testing::random_values;
using testing::view_of;

// Independent decoders, written from the format definitions.
double e4m3_value(uint8_t bits) {
  const int sign = (bits & 0x80) ? -1 : 1;
  const int e = (bits >> 3) & 15;
  const int m = bits & 7;
  if (e == 0) return sign * (m / 8.0) * std::pow(2.0, -6);
  return sign * (1.0 + m / 8.0) * std::pow(2.0, e - 7);
}
double e2m1_value(uint8_t code) {
  static const double magnitudes[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return ((code & 8) ? -1 : 1) * magnitudes[code & 7];
}

// Nearest e4m3 value by exhaustive search; ties go to the even code.
double nearest_e4m3(double x) {
  double best = 0.0;
  int best_code = 0;
  double best_distance = INFINITY;
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;  // NaN
    const double v = e4m3_value(static_cast<uint8_t>(code));
    const double distance = std::abs(v - x);
    if (distance < best_distance ||
        (distance == best_distance && (code & 1) == 0 && (best_code & 1) == 1)) {
      best = v;
      best_code = code;
      best_distance = distance;
    }
  }
  return best;
}

std::vector<double> naive_linear(const std::vector<float>& x, const std::vector<double>& w,
                                 int64_t m, int64_t k, int64_t n) {
  std::vector<double> y(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t c = 0; c < k; ++c) sum += double(x[i * k + c]) * w[j * k + c];
      y[i * n + j] = sum;
    }
  }
  return y;
}

TEST(LinearTest, F32AndBf16WeightsMatchNaiveProduct) {
  const int64_t m = 5, k = 70, n = 9;
  auto x = random_values(m * k, 1);
  auto w = random_values(n * k, 2);
  std::vector<double> wd(w.begin(), w.end());
  std::vector<float> y(m * n);
  linear(view_of(x, {m, k}), LinearWeight{view_of(w, {n, k}), TensorView()}, view_of(y, {m, n}));
  EXPECT_LT(testing::max_relative_error(y, naive_linear(x, wd, m, k, n)), 1e-6);

  std::vector<BFloat16> wb(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &w[i], 4);
    wb[i].bits = static_cast<uint16_t>(bits >> 16);
    const uint32_t back = static_cast<uint32_t>(wb[i].bits) << 16;
    float value;
    std::memcpy(&value, &back, 4);
    wd[i] = value;
  }
  linear(view_of(x, {m, k}),
         LinearWeight{TensorView::contiguous(wb.data(), DType::kBF16, {n, k}), TensorView()},
         view_of(y, {m, n}));
  EXPECT_LT(testing::max_relative_error(y, naive_linear(x, wd, m, k, n)), 1e-6);
}

TEST(LinearTest, Fp8BlockScaledWeightMatchesNaiveDequantizedProduct) {
  const int64_t m = 3, k = 80, n = 40;  // partial blocks in both directions
  auto x = random_values(m * k, 3);
  std::mt19937 rng(4);
  std::vector<uint8_t> q(n * k);
  for (auto& b : q) {
    do b = static_cast<uint8_t>(rng());
    while ((b & 0x7F) == 0x7F);
  }
  const int64_t sr = 2, sc = 3;
  std::vector<uint8_t> s(sr * sc);
  for (auto& b : s) b = static_cast<uint8_t>(120 + rng() % 10);
  std::vector<double> wd(n * k);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < k; ++c) {
      wd[i * k + c] = e4m3_value(q[i * k + c]) * std::pow(2.0, s[(i / 32) * sc + c / 32] - 127);
    }
  }
  LinearWeight weight{TensorView::contiguous(q.data(), DType::kF8E4M3, {n, k}),
                      TensorView::contiguous(s.data(), DType::kF8E8M0, {sr, sc})};
  std::vector<float> y(m * n);
  linear(view_of(x, {m, k}), weight, view_of(y, {m, n}));
  EXPECT_LT(testing::max_relative_error(y, naive_linear(x, wd, m, k, n)), 1e-6);

  std::vector<float> dense(n * k);
  dequantize_weight(weight, view_of(dense, {n, k}));
  for (size_t i = 0; i < dense.size(); ++i) ASSERT_EQ(dense[i], wd[i]) << i;

  // The bf16 form (LinearWeight::bf16_copy's source): every value exact, so bf16 of the value.
  std::vector<uint16_t> halves(n * k);
  dequantize_weight(weight, TensorView::contiguous(halves.data(), DType::kBF16, {n, k}));
  for (size_t i = 0; i < halves.size(); ++i) {
    uint32_t bits = static_cast<uint32_t>(halves[i]) << 16;
    float value;
    std::memcpy(&value, &bits, sizeof(value));
    ASSERT_EQ(value, wd[i]) << i;
  }
  // A scale that puts values below bf16's range: an error naming the value, not a rounding.
  std::vector<uint8_t> tiny_scales(s.size(), 1);  // 2^-126: e4m3 subnormals land below 2^-133
  LinearWeight tiny{weight.weight,
                    TensorView::contiguous(tiny_scales.data(), DType::kF8E8M0, {sr, sc})};
  EXPECT_THROW(dequantize_weight(tiny, TensorView::contiguous(halves.data(), DType::kBF16, {n, k})),
               Error);
  // f32 weights have no bf16 form.
  std::vector<float> f32_weight(n * k, 1.0f);
  EXPECT_THROW(dequantize_weight(LinearWeight{view_of(f32_weight, {n, k}), TensorView()},
                                 TensorView::contiguous(halves.data(), DType::kBF16, {n, k})),
               Error);
}

TEST(LinearTest, Fp4WeightWithActivationQuantMatchesNaive) {
  const int64_t m = 4, k = 64, n = 6;
  auto x = random_values(m * k, 5, 3.0f);
  std::mt19937 rng(6);
  std::vector<uint8_t> packed(n * k / 2);
  for (auto& b : packed) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> s(n * k / 32);
  for (auto& b : s) b = static_cast<uint8_t>(124 + rng() % 6);
  std::vector<double> wd(n * k);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t byte = packed[(i * k + c) / 2];
      const uint8_t code = (c % 2 == 0) ? (byte & 15) : (byte >> 4);
      wd[i * k + c] = e2m1_value(code) * std::pow(2.0, s[i * (k / 32) + c / 32] - 127);
    }
  }
  // The activation the released GEMM sees: per 32, scale 2^ceil(log2(amax/448)).
  std::vector<float> xq(x.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < k / 32; ++b) {
      double amax = 1e-4;
      for (int c = 0; c < 32; ++c) amax = std::max(amax, double(std::abs(x[i * k + b * 32 + c])));
      const double scale = std::pow(2.0, std::ceil(std::log2(amax / 448.0)));
      for (int c = 0; c < 32; ++c) {
        xq[i * k + b * 32 + c] =
            static_cast<float>(nearest_e4m3(x[i * k + b * 32 + c] / scale) * scale);
      }
    }
  }
  LinearWeight weight{TensorView::contiguous(packed.data(), DType::kF4E2M1x2, {n, k}),
                      TensorView::contiguous(s.data(), DType::kF8E8M0, {n, k / 32})};
  std::vector<float> y(m * n);
  linear(view_of(x, {m, k}), weight, view_of(y, {m, n}), ActivationQuant::kFp8PerBlock32);
  EXPECT_LT(testing::max_relative_error(y, naive_linear(xq, wd, m, k, n)), 1e-6);
}

TEST(LinearTest, RowResultsDoNotDependOnBatch) {
  const int64_t m = 37, k = 129, n = 23;
  auto x = random_values(m * k, 7);
  auto w = random_values(n * k, 8);
  std::vector<float> batched(m * n);
  linear(view_of(x, {m, k}), LinearWeight{view_of(w, {n, k}), TensorView()},
         view_of(batched, {m, n}));
  for (int64_t i = 0; i < m; i += 5) {
    std::vector<float> row(x.begin() + i * k, x.begin() + (i + 1) * k);
    std::vector<float> alone(n);
    linear(view_of(row, {1, k}), LinearWeight{view_of(w, {n, k}), TensorView()},
           view_of(alone, {1, n}));
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(alone[j], batched[i * n + j]) << i << "," << j;
  }
}

// linear_grouped on an fp8 block-scaled weight (the attention's wo_a as released): each group is
// linear on its weight rows and its share of the scale rows, with the activation unquantized, and
// the bits are those of the weight's exact bf16 dequantization (what the reference runs): both
// dequantize each row to the same f32 values before the same dot products.
TEST(LinearTest, GroupedFp8WeightHasItsBf16DequantizationsBits) {
  const int64_t m = 5, groups = 4, group_out = 64, k = 96, n = groups * group_out;
  const Tensor q = testing::random_e4m3({n, k}, 11);
  const Tensor s = testing::random_bytes(DType::kF8E8M0, {n / 32, k / 32}, 12, 118, 126);
  const Tensor x = testing::random_f32({m, groups * k}, 13);
  const LinearWeight fp8{q.view(), s.view()};
  ASSERT_TRUE(linear_grouped_supports(fp8, groups));
  Tensor got = Tensor::empty(DType::kF32, {m, n});
  linear_grouped(x.view(), fp8, groups, got.view());

  Tensor dense = Tensor::empty(DType::kBF16, {n, k});
  dequantize_weight(fp8, dense.view());
  Tensor want = Tensor::empty(DType::kF32, {m, n});
  linear_grouped(x.view(), LinearWeight{dense.view(), TensorView()}, groups, want.view());
  EXPECT_TRUE(testing::same_bits(got, want));

  // The documented per-group calls, one of them by hand: group 2's rows and scale rows.
  Tensor group = Tensor::empty(DType::kF32, {m, group_out});
  linear(x.view().narrow(1, 2 * k, k),
         LinearWeight{q.view().narrow(0, 2 * group_out, group_out),
                      s.view().narrow(0, 2 * group_out / 32, group_out / 32)},
         group.view());
  for (int64_t i = 0; i < m; ++i) {
    ASSERT_EQ(std::memcmp(group.data<float>() + i * group_out,
                          got.data<float>() + i * n + 2 * group_out, group_out * sizeof(float)),
              0)
        << "row " << i;
  }

  // Groups of 16 rows split 32-row scale blocks: no per-group scale rows exist. An error naming
  // the shapes, not a silent misread.
  EXPECT_FALSE(linear_grouped_supports(fp8, 16));
  Tensor x16 = testing::random_f32({m, 16 * k}, 14);
  EXPECT_THROW(linear_grouped(x16.view(), fp8, 16, got.view()), Error);
  // A scale only belongs to fp8 weights.
  EXPECT_FALSE(linear_grouped_supports(LinearWeight{dense.view(), s.view()}, groups));
  EXPECT_THROW(linear_grouped(x.view(), LinearWeight{dense.view(), s.view()}, groups, got.view()),
               Error);
  // The released wo_a: 8 groups of 1024 rows, 32 x 32 blocks (shapes only: views of one byte).
  uint8_t byte = 0;
  const TensorView released{&byte, 1, 0, DType::kF8E4M3, {8192, 4096}, {0, 0}};
  const TensorView released_scale{&byte, 1, 0, DType::kF8E8M0, {256, 128}, {0, 0}};
  EXPECT_TRUE(linear_grouped_supports(LinearWeight{released, released_scale}, 8));
}

TEST(LinearTest, MismatchedShapesAreRejected) {
  auto x = random_values(6, 9);
  auto w = random_values(6, 10);
  std::vector<float> y(4);
  EXPECT_THROW(linear(view_of(x, {2, 3}), LinearWeight{view_of(w, {3, 2}), TensorView()},
                      view_of(y, {2, 2})),
               Error);
}

}  // namespace
}  // namespace deepinfer::ops
