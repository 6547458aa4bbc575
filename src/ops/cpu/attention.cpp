// sink_attention: shared-KV attention with a per-head sink over a window range and a list of
// selected compressed entries.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/numerics.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/rows.h"
#include "ops/ops.h"

namespace deepinfer::ops::cpu {

void sink_attention(const TensorView& q, const TensorView& window_kv,
                    const TensorView& window_range, const TensorView& compressed_kv,
                    const TensorView& compressed_idx, const TensorView& sink, float scale,
                    const TensorView& out) {
  DI_CHECK(q.rank() == 3, "attention q must be [T, H, Dh]: ", q.to_string());
  const int64_t tokens = q.size(0);
  const int64_t heads = q.size(1);
  const int64_t head_dim = q.size(2);
  const cpu::Rows<float> qr = cpu::as_rows<float>(q, "attention q");
  const cpu::Rows<float> o = cpu::as_rows<float>(out, "attention output");
  const cpu::Rows<float> window = cpu::as_rows<float>(window_kv, "window kv");
  const cpu::Rows<int32_t> ranges = cpu::as_rows<int32_t>(window_range, "window range");
  const float* sinks = cpu::as_flat<float>(sink, "attention sink");
  DI_CHECK(o.rows == tokens && o.cols == heads * head_dim, "attention output ", out.to_string());
  DI_CHECK(window.rows == 0 || window.cols == head_dim, "window kv ", window_kv.to_string());
  DI_CHECK(ranges.rows == tokens && ranges.cols == 2, "window range ", window_range.to_string());
  DI_CHECK(sink.numel() == heads, "attention sink ", sink.to_string());

  const bool has_compressed = compressed_idx.numel() > 0;
  cpu::Rows<float> compressed;
  cpu::Rows<int32_t> selected;
  if (has_compressed) {
    compressed = cpu::as_rows<float>(compressed_kv, "compressed kv");
    selected = cpu::as_rows<int32_t>(compressed_idx, "compressed indices");
    DI_CHECK(selected.rows == tokens, "compressed indices ", compressed_idx.to_string());
    DI_CHECK(compressed.rows == 0 || compressed.cols == head_dim, "compressed kv ",
             compressed_kv.to_string());
  }

  cpu::parallel_for(tokens * heads, 4, [&](int64_t begin, int64_t end) {
    static thread_local std::vector<const float*> keys;
    static thread_local std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / heads;
      const int64_t h = item % heads;
      // The keys this query sees, in a fixed order: window then compressed.
      keys.clear();
      const int32_t lo = ranges.row(t)[0];
      const int32_t hi = ranges.row(t)[1];
      DI_CHECK(lo >= 0 && hi <= window.rows && lo <= hi, "window range [", lo, ", ", hi,
               ") outside ", window.rows, " rows");
      for (int32_t j = lo; j < hi; ++j) keys.push_back(window.row(j));
      if (has_compressed) {
        for (int64_t s = 0; s < selected.cols; ++s) {
          const int32_t j = selected.row(t)[s];
          if (j < 0) continue;
          DI_CHECK(j < compressed.rows, "compressed index ", j, " >= ", compressed.rows);
          keys.push_back(compressed.row(j));
        }
      }
      const float* query = qr.row(t) + h * head_dim;
      float* y = o.row(t) + h * head_dim;
      const float sink_logit = sinks[h];
      float max_logit = sink_logit;
      scores.resize(keys.size());
      for (size_t j = 0; j < keys.size(); ++j) {
        scores[j] = cpu::dot(query, keys[j], head_dim) * scale;
        max_logit = std::max(max_logit, scores[j]);
      }
      float denominator = std::exp(sink_logit - max_logit);
      std::fill_n(y, head_dim, 0.0f);
      for (size_t j = 0; j < keys.size(); ++j) {
        const float p = std::exp(scores[j] - max_logit);
        denominator += p;
        const float* value = keys[j];
        for (int64_t d = 0; d < head_dim; ++d) y[d] += p * value[d];
      }
      const float inv = 1.0f / denominator;
      for (int64_t d = 0; d < head_dim; ++d) y[d] *= inv;
    }
  });
}

}  // namespace deepinfer::ops::cpu
