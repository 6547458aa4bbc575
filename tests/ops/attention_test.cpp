#include <gtest/gtest.h>

#include <cstring>

#include "attention_batch_case.h"
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

// ---- the batched form -------------------------------------------------------------------------

using attention_cases::AttentionBatch;
using attention_cases::RequestSpec;

// Window 8: a first chunk, a decode token whose window wraps its ring, a chunk longer than the
// window (its early queries read the ring, later ones only this call's rows), a chunk whose
// ring slots wrap with the ring exactly as long as the window, a short history; rows not in
// request order.
AttentionBatch tiny_batch() {
  return attention_cases::make_batch(
      {{0, 5, 10, 0}, {13, 1, 10, 3}, {7, 12, 9, 4}, {25, 3, 8, 2}, {3, 2, 8, 0}}, {2, 0, 4, 1, 3},
      2, 16, 8, 7);
}

Tensor run_batch(const AttentionBatch& b) {
  Tensor out = Tensor::empty(DType::kF32, {b.tokens, b.heads, b.head_dim});
  const std::vector<AttentionRequest> requests = attention_cases::request_views(b, b.host);
  sink_attention_batch(b.host.q, b.host.new_kv, requests, b.window, b.host.sink, b.scale, out);
  return out;
}

void expect_same_bits(const TensorView& want, const TensorView& got, int64_t got_first_row = 0) {
  const int64_t row = want.numel() / want.size(0);
  ASSERT_EQ(std::memcmp(want.data<float>(), got.data<float>() + got_first_row * row,
                        static_cast<size_t>(want.numel()) * sizeof(float)),
            0);
}

TEST(AttentionTest, BatchEqualsTheGatheredWindowBitForBit) {
  const AttentionBatch b = tiny_batch();
  expect_same_bits(attention_cases::gathered_reference(b), run_batch(b));
}

TEST(AttentionTest, BatchTokensDoNotDependOnTheOtherRequests) {
  const AttentionBatch b = tiny_batch();
  const Tensor all = run_batch(b);
  for (size_t r = 0; r < b.specs.size(); ++r) {
    expect_same_bits(run_batch(attention_cases::only_request(b, r)), all, b.offsets[r]);
  }
}

TEST(AttentionTest, WriteWindowRingsPutsTheLastPositionsAtTheirSlots) {
  const AttentionBatch b = tiny_batch();
  std::vector<Tensor> before;
  for (const Tensor& ring : b.host.rings) before.push_back(attention_cases::clone_rows(ring));
  write_window_rings(b.host.new_kv, attention_cases::request_views(b, b.host));
  const int64_t d = b.head_dim;
  for (size_t r = 0; r < b.specs.size(); ++r) {
    const RequestSpec& spec = b.specs[r];
    const int64_t end = spec.start + spec.count;
    for (int64_t slot = 0; slot < spec.capacity; ++slot) {
      // The newest position at this slot among the new ones, if any.
      int64_t position = -1;
      for (int64_t p = spec.start; p < end; ++p) {
        if (p % spec.capacity == slot) position = p;
      }
      const float* want =
          position >= 0 ? b.host.new_kv.data<float>() + (b.offsets[r] + position - spec.start) * d
                        : before[r].data<float>() + slot * d;
      EXPECT_EQ(std::memcmp(b.host.rings[r].data<float>() + slot * d, want, d * sizeof(float)), 0)
          << "request " << r << " slot " << slot;
    }
  }
}

TEST(AttentionTest, BatchRejectsUncoveredTokensAndShortRings) {
  const AttentionBatch b = tiny_batch();
  Tensor out = Tensor::empty(DType::kF32, {b.tokens, b.heads, b.head_dim});
  std::vector<AttentionRequest> requests = attention_cases::request_views(b, b.host);
  std::vector<AttentionRequest> missing(requests.begin(), requests.end() - 1);
  EXPECT_ANY_THROW(
      sink_attention_batch(b.host.q, b.host.new_kv, missing, b.window, b.host.sink, b.scale, out));
  std::vector<AttentionRequest> twice = requests;
  twice.push_back(requests[0]);
  EXPECT_ANY_THROW(
      sink_attention_batch(b.host.q, b.host.new_kv, twice, b.window, b.host.sink, b.scale, out));
  // Request 1 (position 13) needs 7 ring rows.
  std::vector<AttentionRequest> short_ring = requests;
  short_ring[1].window_ring = b.host.rings[1].view().narrow(0, 0, 6);
  EXPECT_ANY_THROW(sink_attention_batch(b.host.q, b.host.new_kv, short_ring, b.window, b.host.sink,
                                        b.scale, out));
}

}  // namespace
}  // namespace deepinfer::ops
