#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
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

// A ragged step for indexer_scores_batch: per request its token count, key count and the rows
// it takes in the call (not in request order, so the table, not the order, places them).
struct IndexerBatchCase {
  int64_t heads = 4, dim = 8, width = 13;
  std::vector<int64_t> counts = {3, 2, 1, 0, 2};
  std::vector<int64_t> entries = {7, 0, 10, 5, 12};
  std::vector<int64_t> offsets = {5, 0, 2, 8, 3};
  int64_t tokens = 8;
  std::vector<float> q, keys_storage, w;
  std::vector<int32_t> visible = {2, 9, 10, 12, 1, 0, 9, 3};
  std::vector<int64_t> key_offsets;

  IndexerBatchCase() {
    q = random_values(static_cast<size_t>(tokens * heads * dim), 20);
    w = random_values(static_cast<size_t>(tokens * heads), 21);
    int64_t total = 0;
    for (int64_t e : entries) {
      key_offsets.push_back(total);
      total += e;
    }
    keys_storage = random_values(static_cast<size_t>(total * dim), 22);
  }
  TensorView keys(size_t r) {
    if (entries[r] == 0) return TensorView();
    return TensorView::contiguous(keys_storage.data() + key_offsets[r] * dim, DType::kF32,
                                  {entries[r], dim});
  }
  std::vector<IndexerRequest> requests() {
    std::vector<IndexerRequest> result;
    for (size_t r = 0; r < counts.size(); ++r) result.push_back({keys(r), offsets[r], counts[r]});
    return result;
  }
};

TEST(CompressedBranchTest, IndexerScoresBatchIsThePerRequestOpBitForBit) {
  IndexerBatchCase c;
  std::vector<float> out(static_cast<size_t>(c.tokens * c.width), 123.0f);
  const auto requests = c.requests();
  indexer_scores_batch(view_of(c.q, {c.tokens, c.heads, c.dim}), requests,
                       view_of(c.w, {c.tokens, c.heads}), view_of(c.visible, {c.tokens}), 0.25f,
                       view_of(out, {c.tokens, c.width}));
  for (size_t r = 0; r < requests.size(); ++r) {
    const int64_t offset = c.offsets[r], count = c.counts[r], entries = c.entries[r];
    std::vector<float> alone(static_cast<size_t>(count * std::max<int64_t>(entries, 1)));
    if (entries > 0 && count > 0) {
      indexer_scores(view_of(c.q, {c.tokens, c.heads, c.dim}).narrow(0, offset, count), c.keys(r),
                     view_of(c.w, {c.tokens, c.heads}).narrow(0, offset, count),
                     view_of(c.visible, {c.tokens}).narrow(0, offset, count), 0.25f,
                     view_of(alone, {count, entries}));
    }
    for (int64_t t = 0; t < count; ++t) {
      const float* row = out.data() + (offset + t) * c.width;
      for (int64_t j = 0; j < c.width; ++j) {
        if (j < entries) {
          const float want = alone[static_cast<size_t>(t * entries + j)];
          EXPECT_EQ(0, std::memcmp(&row[j], &want, sizeof(float)))
              << "request " << r << " token " << t << " key " << j;
          // Visible limits: the per-request op puts -inf at j >= visible.
          if (j >= c.visible[static_cast<size_t>(offset + t)]) {
            EXPECT_EQ(row[j], kNegInf);
          }
        } else {
          EXPECT_EQ(row[j], kNegInf) << "request " << r << " token " << t << " column " << j;
        }
      }
    }
  }
  // Token 0 (request 1, no keys) and token 7 (request 0, 3 of its 7 keys visible).
  for (int64_t j = 0; j < c.width; ++j) EXPECT_EQ(out[static_cast<size_t>(j)], kNegInf);
  EXPECT_NE(out[7 * c.width + 2], kNegInf);
  EXPECT_EQ(out[7 * c.width + 3], kNegInf);
}

TEST(CompressedBranchTest, IndexerScoresBatchChecksItsRequestTable) {
  IndexerBatchCase c;
  std::vector<float> out(static_cast<size_t>(c.tokens * c.width));
  auto call = [&](const std::vector<IndexerRequest>& requests, int64_t width) {
    indexer_scores_batch(view_of(c.q, {c.tokens, c.heads, c.dim}), requests,
                         view_of(c.w, {c.tokens, c.heads}), view_of(c.visible, {c.tokens}), 0.25f,
                         view_of(out, {c.tokens, width}));
  };
  auto requests = c.requests();
  EXPECT_NO_THROW(call(requests, c.width));
  EXPECT_ANY_THROW(call(requests, 11));  // request 4 has 12 keys
  auto out_of_range = requests;
  out_of_range[0].count = 4;  // rows [5, 9) of 8
  EXPECT_ANY_THROW(call(out_of_range, c.width));
  auto twice = requests;
  twice[2].offset = 3;  // row 3 claimed by requests 2 and 4, row 2 by none
  EXPECT_ANY_THROW(call(twice, c.width));
  auto missing = requests;
  missing.pop_back();  // rows 3, 4 in no request
  EXPECT_ANY_THROW(call(missing, c.width));
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
