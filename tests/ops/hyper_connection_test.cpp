#include <gtest/gtest.h>

#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

using testing::random_values;
using testing::view_of;

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

TEST(HyperConnectionTest, MixesMatchNaiveSinkhornProjection) {
  const int hc = 3;
  const int64_t m = 2, d = 7, mix = (2 + hc) * hc;
  auto x = random_values(m * hc * d, 1);
  auto fn = random_values(mix * hc * d, 2, 0.5f);
  std::vector<float> scale = {0.7f, 1.3f, 2.0f};
  auto base = random_values(mix, 3);
  HcParams params{hc, 5, 1e-6f, 1e-6f};
  std::vector<float> pre(m * hc), post(m * hc), comb(m * hc * hc);
  hc_mixes(view_of(x, {m, hc * d}), view_of(fn, {mix, hc * d}), view_of(scale, {3}),
           view_of(base, {mix}), params, view_of(pre, {m, hc}), view_of(post, {m, hc}),
           view_of(comb, {m, hc, hc}));
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0;
    for (int64_t c = 0; c < hc * d; ++c) ss += double(x[i * hc * d + c]) * x[i * hc * d + c];
    const double inv = 1.0 / std::sqrt(ss / (hc * d) + 1e-6);
    std::vector<double> mixes(mix);
    for (int64_t r = 0; r < mix; ++r) {
      double acc = 0;
      for (int64_t c = 0; c < hc * d; ++c)
        acc += double(fn[r * hc * d + c]) * x[i * hc * d + c] * inv;
      mixes[r] = acc;
    }
    double c[3][3];
    for (int j = 0; j < hc; ++j) {
      EXPECT_NEAR(pre[i * hc + j], sigmoid(mixes[j] * 0.7 + base[j]) + 1e-6, 1e-5);
      EXPECT_NEAR(post[i * hc + j], 2 * sigmoid(mixes[hc + j] * 1.3 + base[hc + j]), 1e-5);
      double z = 0;
      for (int k = 0; k < hc; ++k)
        z += std::exp(mixes[2 * hc + j * hc + k] * 2.0 + base[2 * hc + j * hc + k]);
      for (int k = 0; k < hc; ++k) {
        c[j][k] = std::exp(mixes[2 * hc + j * hc + k] * 2.0 + base[2 * hc + j * hc + k]) / z + 1e-6;
      }
    }
    auto cols = [&] {
      for (int k = 0; k < hc; ++k) {
        double s = 0;
        for (int j = 0; j < hc; ++j) s += c[j][k];
        for (int j = 0; j < hc; ++j) c[j][k] /= s + 1e-6;
      }
    };
    auto rows = [&] {
      for (int j = 0; j < hc; ++j) {
        double s = 0;
        for (int k = 0; k < hc; ++k) s += c[j][k];
        for (int k = 0; k < hc; ++k) c[j][k] /= s + 1e-6;
      }
    };
    cols();
    for (int it = 0; it < 4; ++it) {
      rows();
      cols();
    }
    for (int j = 0; j < hc; ++j) {
      for (int k = 0; k < hc; ++k) EXPECT_NEAR(comb[i * hc * hc + j * hc + k], c[j][k], 1e-5);
    }
  }
}

TEST(HyperConnectionTest, CollapseAndExpandMatchNaive) {
  const int64_t m = 2, hc = 4, d = 5;
  auto x = random_values(m * hc * d, 4);
  auto pre = random_values(m * hc, 5);
  auto y = random_values(m * d, 6);
  auto post = random_values(m * hc, 7);
  auto comb = random_values(m * hc * hc, 8);
  std::vector<float> collapsed(m * d), expanded(m * hc * d);
  hc_collapse(view_of(x, {m, hc, d}), view_of(pre, {m, hc}), view_of(collapsed, {m, d}));
  hc_expand(view_of(y, {m, d}), view_of(x, {m, hc, d}), view_of(post, {m, hc}),
            view_of(comb, {m, hc, hc}), view_of(expanded, {m, hc, d}));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < d; ++c) {
      double s = 0;
      for (int64_t j = 0; j < hc; ++j) s += double(pre[i * hc + j]) * x[(i * hc + j) * d + c];
      EXPECT_NEAR(collapsed[i * d + c], s, 1e-5);
      for (int64_t k = 0; k < hc; ++k) {
        double e = double(post[i * hc + k]) * y[i * d + c];
        for (int64_t j = 0; j < hc; ++j)
          e += double(comb[i * hc * hc + j * hc + k]) * x[(i * hc + j) * d + c];
        EXPECT_NEAR(expanded[(i * hc + k) * d + c], e, 1e-5);
      }
    }
  }
  // In place gives the same result.
  hc_expand(view_of(y, {m, d}), view_of(x, {m, hc, d}), view_of(post, {m, hc}),
            view_of(comb, {m, hc, hc}), view_of(x, {m, hc, d}));
  EXPECT_EQ(x, expanded);
}

}  // namespace
}  // namespace deepinfer::ops
