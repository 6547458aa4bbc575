#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

using testing::random_values;
using testing::view_of;

TEST(MoeTest, RoutingSelectsByBiasedScoreAndWeighsByRawScore) {
  const int64_t m = 4, d = 6, e = 8;
  const int k = 3;
  auto x = random_values(m * d, 1);
  auto gate = random_values(e * d, 2);
  auto bias = random_values(e, 3, 0.3f);
  for (ScoreFunction fn :
       {ScoreFunction::kSoftmax, ScoreFunction::kSigmoid, ScoreFunction::kSqrtSoftplus}) {
    RouterParams params{fn, 0.8f, k, true, 1.5f};
    std::vector<float> weights(m * k);
    std::vector<int32_t> experts(m * k);
    route(view_of(x, {m, d}), view_of(gate, {e, d}), view_of(bias, {e}), params,
          view_of(weights, {m, k}), view_of(experts, {m, k}));
    for (int64_t i = 0; i < m; ++i) {
      std::vector<double> s(e);
      for (int64_t j = 0; j < e; ++j) {
        double l = 0;
        for (int c = 0; c < d; ++c) l += double(x[i * d + c]) * gate[j * d + c];
        s[j] = l / 0.8;
      }
      if (fn == ScoreFunction::kSoftmax) {
        double z = 0;
        for (double v : s) z += std::exp(v);
        for (double& v : s) v = std::exp(v) / z;
      } else if (fn == ScoreFunction::kSigmoid) {
        for (double& v : s) v = 1 / (1 + std::exp(-v));
      } else {
        for (double& v : s) v = std::sqrt(std::log1p(std::exp(v)));
      }
      std::vector<int> order(e);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(),
                [&](int a, int b) { return s[a] + bias[a] > s[b] + bias[b]; });
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += s[order[j]];
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(experts[i * k + j], order[j]);
        EXPECT_NEAR(weights[i * k + j], s[order[j]] / sum * 1.5, 1e-5);
      }
    }
  }
}

TEST(MoeTest, SwigluClampsUpBothSidesAndGateFromAbove) {
  std::vector<float> gate = {-20.0f, 0.5f, 30.0f};
  std::vector<float> up = {-30.0f, 2.0f, 30.0f};
  std::vector<float> row_weight = {0.5f};
  std::vector<float> out(3);
  swiglu(view_of(gate, {1, 3}), view_of(up, {1, 3}), 10.0f, view_of(row_weight, {1}),
         view_of(out, {1, 3}));
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  EXPECT_NEAR(out[0], 0.5 * silu(-20.0) * -10.0, 1e-6);
  EXPECT_NEAR(out[1], 0.5 * silu(0.5) * 2.0, 1e-6);
  EXPECT_NEAR(out[2], 0.5 * silu(10.0) * 10.0, 1e-5);
}

TEST(EngramTest, GatherDequantizesFp8RowsWithPerBlockScales) {
  const int64_t rows = 5, dim = 64;
  std::vector<uint8_t> table(rows * dim);
  std::vector<uint8_t> scale(rows * 2);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<uint8_t>((i * 37) % 0x7E);
  for (size_t i = 0; i < scale.size(); ++i) scale[i] = static_cast<uint8_t>(125 + i % 4);
  std::vector<int32_t> ids = {3, 0, 4, 3};
  std::vector<float> out(2 * 2 * dim);
  engram_gather(TensorView::contiguous(table.data(), DType::kF8E4M3, {rows, dim}),
                TensorView::contiguous(scale.data(), DType::kF8E8M0, {rows, 2}),
                view_of(ids, {2, 2}), view_of(out, {2, 2 * dim}));
  for (int t = 0; t < 4; ++t) {
    for (int c = 0; c < dim; ++c) {
      const uint8_t b = table[ids[t] * dim + c];
      const int e = (b >> 3) & 15, mant = b & 7;
      const double v =
          e == 0 ? mant / 8.0 * std::pow(2.0, -6) : (1 + mant / 8.0) * std::pow(2.0, e - 7);
      const double want = v * std::pow(2.0, scale[ids[t] * 2 + c / 32] - 127);
      ASSERT_EQ(out[t * dim + c], static_cast<float>(want));
    }
  }
}

TEST(EngramTest, MixIsTheSignedSqrtSigmoidGatedValue) {
  const int64_t m = 2, hc = 2, d = 6;
  auto x = random_values(m * hc * d, 4);
  auto key = random_values(m * hc * d, 5);
  auto value = random_values(m * d, 6);
  auto qk = random_values(hc * d, 7);
  std::vector<float> out(m * hc * d);
  engram_mix(view_of(x, {m, hc, d}), view_of(key, {m, hc, d}), view_of(value, {m, d}),
             view_of(qk, {hc, d}), 1e-20f, view_of(out, {m, hc, d}));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t s = 0; s < hc; ++s) {
      const float* h = &x[(i * hc + s) * d];
      const float* k = &key[(i * hc + s) * d];
      double hh = 0, kk = 0, dot = 0;
      for (int c = 0; c < d; ++c) {
        hh += double(h[c]) * h[c];
        kk += double(k[c]) * k[c];
        dot += double(h[c]) * qk[s * d + c] * k[c];
      }
      dot = dot / std::sqrt(hh / d) / std::sqrt(kk / d) / std::sqrt(double(d));
      const double g =
          1 / (1 + std::exp(-std::copysign(std::sqrt(std::max(std::abs(dot), 1e-6)), dot)));
      for (int c = 0; c < d; ++c)
        EXPECT_NEAR(out[(i * hc + s) * d + c], h[c] + g * value[i * d + c], 1e-5);
    }
  }
}

}  // namespace
}  // namespace deepinfer::ops
