#include <gtest/gtest.h>

#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

using testing::random_values;
using testing::view_of;

TEST(AttentionTest, SinkAttentionMatchesNaiveSoftmaxOverSelectedKeys) {
  const int64_t t = 3, h = 2, d = 16, nw = 6, nc = 5, kc = 3;
  auto q = random_values(t * h * d, 1);
  auto window = random_values(nw * d, 2);
  auto compressed = random_values(nc * d, 3);
  auto sink = random_values(h, 4);
  std::vector<int32_t> ranges = {0, 1, 1, 4, 2, 6};
  std::vector<int32_t> idx = {-1, -1, -1, 0, 3, -1, 1, 2, 4};
  std::vector<float> out(t * h * d);
  const float scale = 0.25f;
  sink_attention(view_of(q, {t, h, d}), view_of(window, {nw, d}), view_of(ranges, {t, 2}),
                 view_of(compressed, {nc, d}), view_of(idx, {t, kc}), view_of(sink, {h}), scale,
                 view_of(out, {t, h, d}));
  std::vector<double> want(out.size());
  for (int64_t i = 0; i < t; ++i) {
    std::vector<const float*> keys;
    for (int j = ranges[i * 2]; j < ranges[i * 2 + 1]; ++j) keys.push_back(&window[j * d]);
    for (int s = 0; s < kc; ++s) {
      if (idx[i * kc + s] >= 0) keys.push_back(&compressed[idx[i * kc + s] * d]);
    }
    for (int64_t head = 0; head < h; ++head) {
      std::vector<double> logits;
      for (auto* k : keys) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(q[(i * h + head) * d + c]) * k[c];
        logits.push_back(dot * scale);
      }
      double z = std::exp(double(sink[head]));
      for (double l : logits) z += std::exp(l);
      for (int c = 0; c < d; ++c) {
        double acc = 0;
        for (size_t j = 0; j < keys.size(); ++j) acc += std::exp(logits[j]) / z * keys[j][c];
        want[(i * h + head) * d + c] = acc;
      }
    }
  }
  EXPECT_LT(testing::max_relative_error(out, want), 1e-6);
}

TEST(AttentionTest, QueryWithNoKeysGivesZeros) {
  const int64_t d = 8;
  auto q = random_values(d, 5);
  auto window = random_values(d, 6);
  std::vector<float> sink = {0.5f};
  std::vector<int32_t> ranges = {0, 0};
  std::vector<float> out(d, 1.0f);
  sink_attention(view_of(q, {1, 1, d}), view_of(window, {1, d}), view_of(ranges, {1, 2}),
                 TensorView(), TensorView(), view_of(sink, {1}), 1.0f, view_of(out, {1, 1, d}));
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace deepinfer::ops
