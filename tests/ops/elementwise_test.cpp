#include <gtest/gtest.h>

#include <complex>
#include <numbers>

#include "ops/concurrent_branch.h"
#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

using testing::random_values;
using testing::view_of;

double e4m3_value(int code) {
  const int sign = (code & 0x80) ? -1 : 1;
  const int e = (code >> 3) & 15;
  const int m = code & 7;
  if (e == 0) return sign * (m / 8.0) * std::pow(2.0, -6);
  return sign * (1.0 + m / 8.0) * std::pow(2.0, e - 7);
}

// Exhaustive nearest value on a grid of (value, code) pairs; ties to the even code.
double nearest_on_grid(double x, const std::vector<std::pair<double, int>>& grid) {
  double best = 0, best_distance = INFINITY;
  int best_code = 0;
  for (auto [v, code] : grid) {
    const double d = std::abs(v - x);
    if (d < best_distance || (d == best_distance && code % 2 == 0 && best_code % 2 == 1)) {
      best = v;
      best_distance = d;
      best_code = code;
    }
  }
  return best;
}

std::vector<std::pair<double, int>> e4m3_grid() {
  std::vector<std::pair<double, int>> grid;
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) != 0x7F) grid.push_back({e4m3_value(code), code});
  }
  return grid;
}

std::vector<std::pair<double, int>> e2m1_grid() {
  const double magnitudes[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  std::vector<std::pair<double, int>> grid;
  for (int code = 0; code < 16; ++code)
    grid.push_back({((code & 8) ? -1 : 1) * magnitudes[code & 7], code});
  return grid;
}

TEST(ElementwiseTest, RmsNormMatchesNaive) {
  const int64_t m = 4, d = 37;
  auto x = random_values(m * d, 1);
  auto w = random_values(d, 2);
  std::vector<float> y(m * d);
  rmsnorm(view_of(x, {m, d}), view_of(w, {d}), 1e-6f, view_of(y, {m, d}));
  std::vector<double> want(m * d);
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += double(x[i * d + j]) * x[i * d + j];
    const double inv = 1.0 / std::sqrt(ss / d + 1e-6);
    for (int64_t j = 0; j < d; ++j) want[i * d + j] = x[i * d + j] * inv * w[j];
  }
  EXPECT_LT(testing::max_relative_error(y, want), 2e-6);
  // Unweighted, in place.
  rmsnorm(view_of(x, {m, d}), TensorView(), 1e-6f, view_of(x, {m, d}));
  for (int64_t j = 0; j < d; ++j) want[j] /= w[j];
  std::vector<float> first(x.begin(), x.begin() + d);
  std::vector<double> want_first(want.begin(), want.begin() + d);
  EXPECT_LT(testing::max_relative_error(first, want_first), 2e-6);
}

TEST(ElementwiseTest, RopeRotatesAdjacentPairsOfTheTailAndInverseUndoesIt) {
  const int64_t m = 3, h = 2, d = 12;
  const int rope_dim = 8;
  auto x = random_values(m * h * d, 3);
  auto original = x;
  std::vector<int32_t> positions = {0, 7, 1000};
  const RopeTable table = make_rope_table(rope_dim, 10000.0);
  const TensorView position_view = TensorView::contiguous(positions.data(), DType::kI32, {m});
  rope(view_of(x, {m, h, d}), position_view, table, false);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t head = 0; head < h; ++head) {
      const float* before = original.data() + (i * h + head) * d;
      const float* after = x.data() + (i * h + head) * d;
      for (int c = 0; c < d - rope_dim; ++c) EXPECT_EQ(after[c], before[c]);
      for (int p = 0; p < rope_dim / 2; ++p) {
        const double freq = std::pow(10000.0, -2.0 * p / rope_dim);
        const std::complex<double> z(before[d - rope_dim + 2 * p],
                                     before[d - rope_dim + 2 * p + 1]);
        const std::complex<double> r = z * std::polar(1.0, positions[i] * freq);
        EXPECT_NEAR(after[d - rope_dim + 2 * p], r.real(), 2e-4);
        EXPECT_NEAR(after[d - rope_dim + 2 * p + 1], r.imag(), 2e-4);
      }
    }
  }
  rope(view_of(x, {m, h, d}), position_view, table, true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], original[i], 1e-5);
}

TEST(ElementwiseTest, YarnTableKeepsHighFrequenciesAndDividesLowOnes) {
  const int rope_dim = 64;
  const double theta = 160000.0;
  YarnParams yarn{16.0, 65536.0, 32.0, 1.0};
  const RopeTable plain = make_rope_table(rope_dim, theta);
  const RopeTable scaled = make_rope_table(rope_dim, theta, yarn);
  // Independent formula: ramp between floor/ceil of the correction dims.
  auto corr = [&](double rot) {
    return rope_dim * std::log(65536.0 / (rot * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  const double low = std::max(0.0, std::floor(corr(32.0)));
  const double high = std::min(rope_dim - 1.0, std::ceil(corr(1.0)));
  for (int i = 0; i < rope_dim / 2; ++i) {
    const double f = std::pow(theta, -2.0 * i / rope_dim);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double want = f * (1 - ramp) + f / 16.0 * ramp;
    EXPECT_NEAR(scaled.inv_freq[i], want, want * 1e-6) << i;
    EXPECT_NEAR(plain.inv_freq[i], f, f * 1e-6) << i;
  }
  EXPECT_EQ(scaled.inv_freq[0], plain.inv_freq[0]);
  EXPECT_NEAR(scaled.inv_freq[31], plain.inv_freq[31] / 16.0, plain.inv_freq[31] * 1e-6);
}

TEST(ElementwiseTest, Fp8FakeQuantMatchesExhaustiveNearestValue) {
  const int64_t m = 6, d = 64;
  auto x = random_values(m * d, 4, 5.0f);
  x[3] = 0.0f;
  x[70] = 1e-9f;  // far below the block's scale: flushes to zero or a subnormal
  auto original = x;
  fake_quant_fp8(view_of(x, {m, d}));
  const auto grid = e4m3_grid();
  for (int64_t b = 0; b < m * d / 32; ++b) {
    double amax = 1e-4;
    for (int c = 0; c < 32; ++c) amax = std::max(amax, double(std::abs(original[b * 32 + c])));
    const double scale = std::pow(2.0, std::ceil(std::log2(amax / 448.0)));
    for (int c = 0; c < 32; ++c) {
      const double want = nearest_on_grid(original[b * 32 + c] / scale, grid) * scale;
      ASSERT_EQ(x[b * 32 + c], static_cast<float>(want)) << b << "," << c;
    }
  }
  // A row length that is not a multiple of the block is left untouched.
  auto odd = random_values(10, 5);
  auto odd_copy = odd;
  fake_quant_fp8(view_of(odd, {1, 10}));
  EXPECT_EQ(odd, odd_copy);
}

TEST(ElementwiseTest, Fp4FakeQuantMatchesExhaustiveNearestValueForBothScaleFormats) {
  const int64_t m = 4, d = 64;
  const auto grid = e2m1_grid();
  const auto scale_grid = e4m3_grid();
  for (Fp4ScaleFormat format : {Fp4ScaleFormat::kUe8m0, Fp4ScaleFormat::kE4m3}) {
    const int block = format == Fp4ScaleFormat::kUe8m0 ? 32 : 16;
    auto x = random_values(m * d, 6, 2.0f);
    // Values on the exact tie points of the e2m1 grid exercise round-half-even.
    for (int i = 0; i < 8; ++i) x[i] = 0.25f * (2 * i + 1) * (i % 2 ? 1.0f : -1.0f);
    auto original = x;
    fake_quant_fp4(view_of(x, {m, d}), block, format);
    for (int64_t b = 0; b < m * d / block; ++b) {
      double amax = 0;
      for (int c = 0; c < block; ++c)
        amax = std::max(amax, double(std::abs(original[b * block + c])));
      double scale;
      if (format == Fp4ScaleFormat::kUe8m0) {
        scale = std::pow(2.0, std::ceil(std::log2(std::max(amax, 6 * std::pow(2.0, -126)) / 6.0)));
      } else {
        scale = nearest_on_grid(std::max(amax, 6 * std::pow(2.0, -9)) / 6.0, scale_grid);
      }
      for (int c = 0; c < block; ++c) {
        const double q = std::clamp(
            double(static_cast<float>(original[b * block + c] / static_cast<float>(scale))), -6.0,
            6.0);
        const double want = nearest_on_grid(q, grid) * scale;
        ASSERT_EQ(x[b * block + c], static_cast<float>(want)) << b << "," << c;
      }
    }
  }
}

TEST(ElementwiseTest, EmbeddingGathersRowsAndRejectsBadIds) {
  auto table = random_values(5 * 3, 7);
  std::vector<float> out(2 * 3);
  std::vector<int32_t> ids = {4, 1};
  embedding(view_of(table, {5, 3}), ids, view_of(out, {2, 3}));
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(out[c], table[4 * 3 + c]);
    EXPECT_EQ(out[3 + c], table[1 * 3 + c]);
  }
  std::vector<int32_t> bad = {5, 0};
  EXPECT_THROW(embedding(view_of(table, {5, 3}), bad, view_of(out, {2, 3})), Error);
}

TEST(ElementwiseTest, SoftmaxRowsSumToOne) {
  auto x = random_values(3 * 9, 8, 4.0f);
  auto original = x;
  softmax_rows(view_of(x, {3, 9}));
  for (int i = 0; i < 3; ++i) {
    double z = 0;
    for (int j = 0; j < 9; ++j) z += std::exp(double(original[i * 9 + j]));
    for (int j = 0; j < 9; ++j)
      EXPECT_NEAR(x[i * 9 + j], std::exp(double(original[i * 9 + j])) / z, 1e-6);
  }
}

// On the CPU a branch runs its ops in place, in the order they are queued: the branch's op sees
// the write before it, the op after join() sees the branch's, and a second branch may open
// once the first is joined (or out of scope).
TEST(ConcurrentBranchTest, CpuRunsTheBranchInPlace) {
  Tensor x = Tensor::empty(DType::kF32, {4});
  Tensor doubled = Tensor::empty(DType::kF32, {4});
  for (int64_t i = 0; i < 4; ++i) x.data<float>()[i] = static_cast<float>(i + 1);
  scale(x.view(), 3.0f, x.view());
  ConcurrentBranch branch(x.device());
  branch.run([&] { add(x.view(), x.view(), doubled.view()); });
  branch.join();
  add(doubled.view(), x.view(), x.view());
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(x.data<float>()[i], 9.0f * static_cast<float>(i + 1));
  { ConcurrentBranch unjoined(x.device()); }
  ConcurrentBranch again(x.device());
  again.join();
}

}  // namespace
}  // namespace deepinfer::ops
