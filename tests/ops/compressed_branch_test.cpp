#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

using testing::random_values;
using testing::view_of;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

TEST(CompressedBranchTest, PoolIsAPerChannelSoftmaxWeightedSum) {
  const int ratio = 3;
  const int64_t groups = 2, d = 5;
  auto kv = random_values(groups * ratio * d, 1);
  auto gate = random_values(groups * ratio * d, 2, 3.0f);
  std::vector<float> out(groups * d);
  compress_pool(view_of(kv, {groups * ratio, d}), view_of(gate, {groups * ratio, d}), ratio,
                view_of(out, {groups, d}));
  std::vector<double> want(out.size());
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t c = 0; c < d; ++c) {
      double z = 0, acc = 0;
      for (int j = 0; j < ratio; ++j) z += std::exp(double(gate[(g * ratio + j) * d + c]));
      for (int j = 0; j < ratio; ++j) {
        acc += std::exp(double(gate[(g * ratio + j) * d + c])) / z * kv[(g * ratio + j) * d + c];
      }
      want[g * d + c] = acc;
    }
  }
  EXPECT_LT(testing::max_relative_error(out, want), 1e-6);
}

TEST(CompressedBranchTest, IndexerScoresAreWeightedReluDotsOverVisibleKeys) {
  const int64_t t = 3, h = 4, d = 8, n = 6;
  auto q = random_values(t * h * d, 3);
  auto k = random_values(n * d, 4);
  auto w = random_values(t * h, 5);
  std::vector<int32_t> visible = {0, 2, 6};
  std::vector<float> out(t * n);
  indexer_scores(view_of(q, {t, h, d}), view_of(k, {n, d}), view_of(w, {t, h}),
                 view_of(visible, {t}), 0.5f, view_of(out, {t, n}));
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (j >= visible[i]) {
        EXPECT_EQ(out[i * n + j], kNegInf);
        continue;
      }
      double want = 0;
      for (int64_t head = 0; head < h; ++head) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(q[(i * h + head) * d + c]) * k[j * d + c];
        want += std::max(dot, 0.0) * 0.5 * w[i * h + head];
      }
      EXPECT_NEAR(out[i * n + j], want, 1e-5);
    }
  }
}

TEST(CompressedBranchTest, TopkReturnsTheLargestFiniteEntriesAscending) {
  std::vector<float> scores = {0.1f,    5.0f, kNegInf, 3.0f,    4.0f,    -2.0f,  //
                               kNegInf, 1.0f, kNegInf, kNegInf, kNegInf, kNegInf};
  std::vector<int32_t> idx(2 * 3);
  topk_indices(view_of(scores, {2, 6}), 3, view_of(idx, {2, 3}));
  EXPECT_EQ(idx, (std::vector<int32_t>{1, 3, 4, 1, -1, -1}));
}

TEST(CompressedBranchTest, CandidateBlocksKeepBestBlocksAndPinTheNewest) {
  // 10 entries in blocks of 3: [0..2] [3..5] [6..8] [9]
  std::vector<float> scores = {9, 0, 0, 1, 1, 8, 0, 0, 0, kNegInf};
  std::vector<int32_t> visible = {9};  // newest visible entry 8 -> block 2 pinned
  std::vector<int8_t> mask(10);
  candidate_blocks(view_of(scores, {1, 10}), view_of(visible, {1}), 2, 3, view_of(mask, {1, 10}));
  EXPECT_EQ(mask, (std::vector<int8_t>{1, 1, 1, 0, 0, 0, 1, 1, 1, 0}));
  mask_scores(view_of(scores, {1, 10}), view_of(mask, {1, 10}));
  EXPECT_EQ(scores[5], kNegInf);
  EXPECT_EQ(scores[0], 9.0f);
}

TEST(CompressedBranchTest, CandidateBlocksNeverKeepUnreachableBlocks) {
  std::vector<float> scores = {kNegInf, kNegInf, kNegInf, kNegInf};
  std::vector<int32_t> visible = {0};
  std::vector<int8_t> mask(4);
  candidate_blocks(view_of(scores, {1, 4}), view_of(visible, {1}), 4, 2, view_of(mask, {1, 4}));
  EXPECT_EQ(mask, (std::vector<int8_t>{0, 0, 0, 0}));
}

}  // namespace
}  // namespace deepinfer::ops
