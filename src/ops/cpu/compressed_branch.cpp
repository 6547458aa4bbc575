// The CSA2 compressed branch: the compressor's gated pooling, the indexer's scores, and the
// two-level top-k selection.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/dtype_convert.h"
#include "ops/cpu/numerics.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/rows.h"
#include "ops/ops.h"

namespace deepinfer::ops::cpu {
namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kKeyBlock = 32;  // channels a key scale covers

// A key cache as byte rows (packed fp4 strides count values: a row's bytes are half of them).
struct KeyRows {
  uint8_t* codes = nullptr;
  uint8_t* scales = nullptr;
  int64_t code_stride = 0;  // bytes
  int64_t scale_stride = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  uint8_t* code_row(int64_t j) const { return codes + j * code_stride; }
  uint8_t* scale_row(int64_t j) const { return scales + j * scale_stride; }
};

KeyRows key_rows(const IndexerKeys& keys, const char* what) {
  const TensorView& codes = keys.codes;
  const TensorView& scales = keys.scales;
  DI_CHECK(codes.device().is_cpu() && scales.device().is_cpu(), what, " is not in host memory");
  DI_CHECK(codes.dtype() == DType::kF4E2M1x2 && scales.dtype() == DType::kF8E8M0 &&
               codes.rank() == 2 && scales.rank() == 2 && scales.size(0) == codes.size(0) &&
               codes.size(1) % kKeyBlock == 0 && scales.size(1) == codes.size(1) / kKeyBlock &&
               (scales.size(1) == 1 || scales.stride(1) == 1),
           what, ": codes ", codes.to_string(), " and scales ", scales.to_string(),
           " are not fp4 keys with a scale per ", kKeyBlock, " channels");
  return {static_cast<uint8_t*>(codes.raw_data()),
          static_cast<uint8_t*>(scales.raw_data()),
          codes.stride(0) / 2,
          scales.stride(0),
          codes.size(0),
          codes.size(1)};
}

// One key as f32: exactly the values fake_quant_fp4 left in the f32 rows this cache replaced.
void dequantize_key(const KeyRows& keys, int64_t j, float* out) {
  const uint8_t* codes = keys.code_row(j);
  const uint8_t* scales = keys.scale_row(j);
  for (int64_t c = 0; c < keys.dim; c += 2) {
    const float scale = cpu::e8m0_to_float(scales[c / kKeyBlock]);
    const uint8_t pair = codes[c / 2];
    out[c] = cpu::e2m1_to_float(pair & 0xF) * scale;
    out[c + 1] = cpu::e2m1_to_float(pair >> 4) * scale;
  }
}

// fake_quant_fp4(x, 32, kUe8m0)'s rounding of one row, kept as codes and scale codes. A block
// with a NaN gets the NaN scale (every channel NaN; fake_quant leaves NaN only where it was --
// either way the scores it enters are NaN).
void quantize_key(const float* x, int64_t dim, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b < dim / kKeyBlock; ++b) {
    const float* v = x + b * kKeyBlock;
    float amax = 0.0f;
    bool nan = false;
    for (int64_t k = 0; k < kKeyBlock; ++k) {
      amax = std::max(amax, std::fabs(v[k]));
      nan = nan || std::isnan(v[k]);
    }
    const uint8_t scale_code =
        nan ? uint8_t{0xFF} : e8m0_pow2_ceil(std::max(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
    scales[b] = scale_code;
    const float scale = cpu::e8m0_to_float(scale_code);
    if (scale_code == 0xFF) {  // the NaN scale: zero codes (as the CUDA writer stores them)
      std::fill_n(codes + b * kKeyBlock / 2, kKeyBlock / 2, uint8_t{0});
      continue;
    }
    for (int64_t k = 0; k < kKeyBlock; k += 2) {
      const uint8_t low = float_to_e2m1(cpu::round_to_e2m1(std::clamp(v[k] / scale, -6.0f, 6.0f)));
      const uint8_t high =
          float_to_e2m1(cpu::round_to_e2m1(std::clamp(v[k + 1] / scale, -6.0f, 6.0f)));
      codes[(b * kKeyBlock + k) / 2] = static_cast<uint8_t>(low | (high << 4));
    }
  }
}
}  // namespace

void write_indexer_keys(const TensorView& keys, std::span<const IndexerKeyWrite> writes) {
  const cpu::Rows<float> x = cpu::as_rows<float>(keys, "indexer keys to cache");
  for (size_t w = 0; w < writes.size(); ++w) {
    const IndexerKeyWrite& write = writes[w];
    if (write.count == 0) continue;
    const KeyRows cache = key_rows(write.cache, "indexer key cache");
    check_indexer_key_write(w, write, cache.rows, cache.dim, x.rows, x.cols, keys);
    for (int64_t i = 0; i < write.count; ++i) {
      quantize_key(x.row(write.offset + i), x.cols, cache.code_row(write.start + i),
                   cache.scale_row(write.start + i));
    }
  }
}

void compress_pool(const TensorView& kv, const TensorView& gate, int ratio, const TensorView& out) {
  const cpu::Rows<float> k = cpu::as_rows<float>(kv, "compressor kv");
  const cpu::Rows<float> g = cpu::as_rows<float>(gate, "compressor gate");
  const cpu::Rows<float> o = cpu::as_rows<float>(out, "compressor output");
  DI_CHECK(ratio > 0 && k.rows == g.rows && k.cols == g.cols && k.rows == o.rows * ratio &&
               o.cols == k.cols,
           "compress_pool shapes kv ", kv.to_string(), " gate ", gate.to_string(), " out ",
           out.to_string(), " ratio ", ratio);
  cpu::parallel_for(o.rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t group = begin; group < end; ++group) {
      float* y = o.row(group);
      for (int64_t c = 0; c < o.cols; ++c) {
        float max_gate = kNegInf;
        for (int j = 0; j < ratio; ++j) max_gate = std::max(max_gate, g.row(group * ratio + j)[c]);
        float denominator = 0.0f;
        for (int j = 0; j < ratio; ++j)
          denominator += std::exp(g.row(group * ratio + j)[c] - max_gate);
        float sum = 0.0f;
        for (int j = 0; j < ratio; ++j) {
          const float weight = std::exp(g.row(group * ratio + j)[c] - max_gate) / denominator;
          sum += k.row(group * ratio + j)[c] * weight;
        }
        y[c] = sum;
      }
    }
  });
}

void indexer_scores(const TensorView& q, const IndexerKeys& keys, const TensorView& weights,
                    const TensorView& visible, float scale, const TensorView& out) {
  DI_CHECK(q.rank() == 3, "indexer q must be [T, Hi, Di]: ", q.to_string());
  const int64_t tokens = q.size(0);
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  const cpu::Rows<float> qr = cpu::as_rows<float>(q, "indexer q");
  const int64_t entries = keys.rows();
  const cpu::Rows<float> w = cpu::as_rows<float>(weights, "indexer weights");
  const int32_t* vis = cpu::as_flat<int32_t>(visible, "indexer visible counts");
  const cpu::Rows<float> o = cpu::as_rows<float>(out, "indexer scores");
  std::vector<float> key_values;
  if (entries > 0) {
    const KeyRows k = key_rows(keys, "indexer keys");
    DI_CHECK(k.dim == dim, "indexer keys of ", k.dim, " channels for q ", q.to_string());
    key_values.resize(static_cast<size_t>(entries * dim));
    for (int64_t j = 0; j < entries; ++j) dequantize_key(k, j, key_values.data() + j * dim);
  }
  DI_CHECK(w.rows == tokens && w.cols == heads, "indexer weights ", weights.to_string());
  DI_CHECK(o.rows == tokens && o.cols == entries, "indexer scores ", out.to_string());
  DI_CHECK(visible.numel() == tokens, "indexer visible ", visible.to_string());
  cpu::parallel_for(tokens, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t limit = std::min<int64_t>(vis[t], entries);
      float* y = o.row(t);
      for (int64_t j = 0; j < entries; ++j) {
        if (j >= limit) {
          y[j] = kNegInf;
          continue;
        }
        float sum = 0.0f;
        for (int64_t h = 0; h < heads; ++h) {
          const float s = cpu::dot(qr.row(t) + h * dim, key_values.data() + j * dim, dim);
          sum += std::max(s, 0.0f) * scale * w.row(t)[h];
        }
        y[j] = sum;
      }
    }
  });
}

void indexer_scores_batch(const TensorView& q, std::span<const IndexerRequest> requests,
                          const TensorView& weights, const TensorView& visible, float scale,
                          const TensorView& out) {
  DI_CHECK(q.rank() == 3, "indexer q must be [T, Hi, Di]: ", q.to_string());
  const int64_t tokens = q.size(0);
  const cpu::Rows<float> o = cpu::as_rows<float>(out, "indexer scores");
  DI_CHECK(o.rows == tokens, "indexer scores ", out.to_string(), " for ", tokens, " tokens");
  std::vector<bool> covered(static_cast<size_t>(tokens), false);
  for (size_t r = 0; r < requests.size(); ++r) {
    const IndexerRequest& request = requests[r];
    DI_CHECK(request.offset >= 0 && request.count >= 0 && request.offset + request.count <= tokens,
             "indexer request ", r, ": rows [", request.offset, ", +", request.count, ") outside ",
             tokens, " tokens");
    const int64_t entries = request.keys.rows();
    DI_CHECK(entries <= o.cols, "indexer request ", r, " has ", entries,
             " keys, more than the score width ", o.cols);
    for (int64_t t = request.offset; t < request.offset + request.count; ++t) {
      DI_CHECK(!covered[static_cast<size_t>(t)], "indexer token ", t, " is in two requests");
      covered[static_cast<size_t>(t)] = true;
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    DI_CHECK(covered[static_cast<size_t>(t)], "indexer token ", t, " is in no request");
  }
  for (const IndexerRequest& request : requests) {
    if (request.count == 0) continue;
    const int64_t entries = request.keys.rows();
    const TensorView rows = out.narrow(0, request.offset, request.count);
    if (entries > 0) {
      cpu::indexer_scores(q.narrow(0, request.offset, request.count), request.keys,
                          weights.narrow(0, request.offset, request.count),
                          visible.narrow(0, request.offset, request.count), scale,
                          rows.narrow(1, 0, entries));
    }
    if (entries == o.cols) continue;
    for (int64_t t = 0; t < request.count; ++t) {
      std::fill(o.row(request.offset + t) + entries, o.row(request.offset + t) + o.cols, kNegInf);
    }
  }
}

void candidate_blocks(const TensorView& scores, const TensorView& visible, int topk_blocks,
                      int block_size, const TensorView& mask_out) {
  const cpu::Rows<float> s = cpu::as_rows<float>(scores, "candidate scores");
  const int32_t* vis = cpu::as_flat<int32_t>(visible, "candidate visible counts");
  const cpu::Rows<int8_t> m = cpu::as_rows<int8_t>(mask_out, "candidate mask");
  DI_CHECK(block_size > 0 && m.rows == s.rows && m.cols == s.cols, "candidate_blocks shapes");
  const int64_t width = s.cols;
  const int64_t blocks = (width + block_size - 1) / block_size;
  cpu::parallel_for(s.rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> block_score(static_cast<size_t>(blocks));
    std::vector<int64_t> order(static_cast<size_t>(blocks));
    for (int64_t t = begin; t < end; ++t) {
      const float* row = s.row(t);
      for (int64_t b = 0; b < blocks; ++b) {
        float best = kNegInf;
        for (int64_t j = b * block_size; j < std::min(width, (b + 1) * block_size); ++j) {
          best = std::max(best, row[j]);
        }
        block_score[static_cast<size_t>(b)] = best;
      }
      // The block holding the newest visible entry is only partly filled: pin it in.
      if (vis[t] > 0) {
        const int64_t last = (vis[t] - 1) / block_size;
        if (last < blocks)
          block_score[static_cast<size_t>(last)] = std::numeric_limits<float>::infinity();
      }
      std::iota(order.begin(), order.end(), 0);
      const int64_t keep = std::min<int64_t>(topk_blocks, blocks);
      std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                        [&](int64_t a, int64_t b) {
                          const float sa = block_score[static_cast<size_t>(a)];
                          const float sb = block_score[static_cast<size_t>(b)];
                          return sa > sb || (sa == sb && a < b);
                        });
      int8_t* mask = m.row(t);
      std::fill_n(mask, width, int8_t{0});
      for (int64_t i = 0; i < keep; ++i) {
        const int64_t b = order[static_cast<size_t>(i)];
        if (block_score[static_cast<size_t>(b)] == kNegInf) continue;
        for (int64_t j = b * block_size; j < std::min(width, (b + 1) * block_size); ++j)
          mask[j] = 1;
      }
    }
  });
}

void mask_scores(const TensorView& scores, const TensorView& mask) {
  const cpu::Rows<float> s = cpu::as_rows<float>(scores, "masked scores");
  const cpu::Rows<int8_t> m = cpu::as_rows<int8_t>(mask, "score mask");
  DI_CHECK(m.rows == s.rows && m.cols == s.cols, "mask_scores shapes");
  for (int64_t t = 0; t < s.rows; ++t) {
    for (int64_t j = 0; j < s.cols; ++j) {
      if (m.row(t)[j] == 0) s.row(t)[j] = kNegInf;
    }
  }
}

void topk_indices(const TensorView& scores, int k, const TensorView& idx_out) {
  const cpu::Rows<float> s = cpu::as_rows<float>(scores, "top-k scores");
  const cpu::Rows<int32_t> o = cpu::as_rows<int32_t>(idx_out, "top-k indices");
  DI_CHECK(o.rows == s.rows && o.cols == k, "topk_indices output ", idx_out.to_string());
  cpu::parallel_for(s.rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> order;
    for (int64_t t = begin; t < end; ++t) {
      const float* row = s.row(t);
      order.clear();
      for (int64_t j = 0; j < s.cols; ++j) {
        if (row[j] != kNegInf) order.push_back(static_cast<int32_t>(j));
      }
      const size_t keep = std::min(order.size(), static_cast<size_t>(k));
      std::partial_sort(
          order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
          [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep));
      int32_t* y = o.row(t);
      for (int i = 0; i < k; ++i)
        y[i] = static_cast<size_t>(i) < keep ? order[static_cast<size_t>(i)] : -1;
    }
  });
}

}  // namespace deepinfer::ops::cpu
