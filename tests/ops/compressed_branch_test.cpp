#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/dtype_convert.h"
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

// Codes and scales decoded by core's converters (not the op's own decoder).
std::vector<float> decoded_keys(const testing::HostKeyCache& cache) {
  const int64_t rows = cache.codes.view().size(0);
  const int64_t dim = cache.codes.view().size(1);
  std::vector<float> values(static_cast<size_t>(rows * dim));
  const auto* codes = cache.codes.data<Float4E2M1x2>();
  const auto* scales = cache.scales.data<Float8E8M0>();
  for (int64_t j = 0; j < rows; ++j) {
    for (int64_t c = 0; c < dim; ++c) {
      const uint8_t pair = codes[j * dim / 2 + c / 2].bits;
      values[static_cast<size_t>(j * dim + c)] = e2m1_to_float(c % 2 ? pair >> 4 : pair & 0xF) *
                                                 e8m0_to_float(scales[j * dim / 32 + c / 32].bits);
    }
  }
  return values;
}

TEST(CompressedBranchTest, IndexerKeysStoreTheFp4FakeQuantBitForBit) {
  const int64_t dim = 64;
  const int64_t rows = 12;
  std::vector<float> x = random_values(static_cast<size_t>(rows * dim), 30);
  // Blocks of every regime: all zero, amax under the 6 * 2^-126 floor, huge, tiny
  // subnormal-scale values, exact e2m1 ties (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 times 2^-2 with a
  // block max of 6 * 2^-2 = 1.5), mixed signs and -0.
  std::fill_n(x.begin(), 32, 0.0f);
  for (int64_t c = 32; c < 64; ++c)
    x[static_cast<size_t>(c)] = (c % 2 ? -1.0f : 1.0f) * 0x1p-127f * c;
  for (int64_t c = 64; c < 96; ++c) x[static_cast<size_t>(c)] *= 1e30f;
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f, -2.5f, -5.0f, -0.0f};
  for (int64_t c = 96; c < 128; ++c) {
    x[static_cast<size_t>(c)] = ties[c % 11] * 0.25f;
  }
  x[127] = 6.0f * 0.25f;
  std::vector<float> want = x;
  fake_quant_fp4(view_of(want, {rows, dim}), 32, Fp4ScaleFormat::kUe8m0);

  // Two caches, each request's rows written at an offset; the rest stays zero.
  testing::HostKeyCache first{Tensor::zeros(DType::kF4E2M1x2, {20, dim}),
                              Tensor::zeros(DType::kF8E8M0, {20, dim / 32})};
  testing::HostKeyCache second{Tensor::zeros(DType::kF4E2M1x2, {8, dim}),
                               Tensor::zeros(DType::kF8E8M0, {8, dim / 32})};
  const std::vector<IndexerKeyWrite> writes = {{first.keys(), 0, 7, 10}, {second.keys(), 7, 5, 3}};
  write_indexer_keys(view_of(x, {rows, dim}), writes);
  const std::vector<float> got_first = decoded_keys(first);
  const std::vector<float> got_second = decoded_keys(second);
  for (int64_t j = 0; j < rows; ++j) {
    const std::vector<float>& got = j < 7 ? got_first : got_second;
    const int64_t slot = j < 7 ? 10 + j : 3 + (j - 7);
    for (int64_t c = 0; c < dim; ++c) {
      const float g = got[static_cast<size_t>(slot * dim + c)];
      const float w = want[static_cast<size_t>(j * dim + c)];
      EXPECT_EQ(0, std::memcmp(&g, &w, sizeof(float)))
          << "key " << j << " channel " << c << ": stored " << g << ", fake_quant " << w;
    }
  }
  for (int64_t slot : {0, 9, 17}) {
    for (int64_t c = 0; c < dim; ++c)
      EXPECT_EQ(got_first[static_cast<size_t>(slot * dim + c)], 0.0f);
  }

  // Writes outside the keys or the cache, and a cache of another width, are refused.
  const auto refused = [&](IndexerKeyWrite write) {
    EXPECT_ANY_THROW(write_indexer_keys(view_of(x, {rows, dim}), {&write, 1}));
  };
  refused({first.keys(), 10, 3, 0});  // rows [10, 13) of 12
  refused({first.keys(), 0, 3, 18});  // cache rows [18, 21) of 20
  refused({first.keys(), -1, 1, 0});
  testing::HostKeyCache narrow{Tensor::zeros(DType::kF4E2M1x2, {4, 16}),
                               Tensor::zeros(DType::kF8E8M0, {4, 1})};
  refused({narrow.keys(), 0, 1, 0});
}

TEST(CompressedBranchTest, IndexerScoresAreWeightedReluDotsOverVisibleKeys) {
  const int64_t t = 3, h = 4, d = 32, n = 6;
  auto q = random_values(t * h * d, 3);
  const testing::HostKeyCache cache = testing::host_key_cache(random_values(n * d, 4), n, d);
  const std::vector<float> k = decoded_keys(cache);
  auto w = random_values(t * h, 5);
  std::vector<int32_t> visible = {0, 2, 6};
  std::vector<float> out(t * n);
  indexer_scores(view_of(q, {t, h, d}), cache.keys(), view_of(w, {t, h}), view_of(visible, {t}),
                 0.5f, view_of(out, {t, n}));
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
  int64_t heads = 4, dim = 32, width = 13;
  std::vector<int64_t> counts = {3, 2, 1, 0, 2};
  std::vector<int64_t> entries = {7, 0, 10, 5, 12};
  std::vector<int64_t> offsets = {5, 0, 2, 8, 3};
  int64_t tokens = 8;
  std::vector<float> q, w;
  testing::HostKeyCache key_cache;
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
    key_cache =
        testing::host_key_cache(random_values(static_cast<size_t>(total * dim), 22), total, dim);
  }
  IndexerKeys keys(size_t r) {
    if (entries[r] == 0) return IndexerKeys{};
    return key_cache.keys().narrow(key_offsets[r], entries[r]);
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
