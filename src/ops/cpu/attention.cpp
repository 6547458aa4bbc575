// sink_attention: shared-KV attention with a per-head sink over a window range and a list of
// selected compressed entries; the batched form reads each request's window from its ring.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/numerics.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/rows.h"
#include "ops/ops.h"

namespace deepinfer::ops::cpu {

namespace {

// The attention arithmetic shared by both forms: per (token, head), max-first softmax from the
// sink over the gathered keys.
template <typename Gather>
void attend(const cpu::Rows<float>& qr, const cpu::Rows<float>& o, const float* sinks,
            int64_t tokens, int64_t heads, int64_t head_dim, float scale, const Gather& gather) {
  cpu::parallel_for(tokens * heads, 4, [&](int64_t begin, int64_t end) {
    static thread_local std::vector<const float*> keys;
    static thread_local std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / heads;
      const int64_t h = item % heads;
      keys.clear();
      gather(t, keys);
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

// A request's views as rows, checked once per call.
struct RequestRows {
  cpu::Rows<float> ring;
  cpu::Rows<float> compressed;
  cpu::Rows<int32_t> selected;  // rows == 0: no compressed keys
  int64_t offset = 0;
  int64_t start = 0;
};

}  // namespace

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

  attend(qr, o, sinks, tokens, heads, head_dim, scale,
         [&](int64_t t, std::vector<const float*>& keys) {
           const int32_t lo = ranges.row(t)[0];
           const int32_t hi = ranges.row(t)[1];
           DI_CHECK(lo >= 0 && hi <= window.rows && lo <= hi, "window range [", lo, ", ", hi,
                    ") outside ", window.rows, " rows");
           for (int32_t j = lo; j < hi; ++j) keys.push_back(window.row(j));
           if (!has_compressed) return;
           for (int64_t s = 0; s < selected.cols; ++s) {
             const int32_t j = selected.row(t)[s];
             if (j < 0) continue;
             DI_CHECK(j < compressed.rows, "compressed index ", j, " >= ", compressed.rows);
             keys.push_back(compressed.row(j));
           }
         });
}

void sink_attention_batch(const TensorView& q, const TensorView& new_kv,
                          std::span<const AttentionRequest> requests, int64_t window,
                          const TensorView& sink, float scale, const TensorView& out) {
  DI_CHECK(q.rank() == 3, "attention q must be [T, H, Dh]: ", q.to_string());
  const int64_t tokens = q.size(0);
  const int64_t heads = q.size(1);
  const int64_t head_dim = q.size(2);
  const cpu::Rows<float> qr = cpu::as_rows<float>(q, "attention q");
  const cpu::Rows<float> o = cpu::as_rows<float>(out, "attention output");
  const cpu::Rows<float> fresh = cpu::as_rows<float>(new_kv, "attention new kv");
  const float* sinks = cpu::as_flat<float>(sink, "attention sink");
  DI_CHECK(o.rows == tokens && o.cols == heads * head_dim, "attention output ", out.to_string());
  DI_CHECK(fresh.rows == tokens && (tokens == 0 || fresh.cols == head_dim), "attention new kv ",
           new_kv.to_string());
  DI_CHECK(sink.numel() == heads, "attention sink ", sink.to_string());
  DI_CHECK(window >= 1, "attention window ", window);

  // Per token: its request; every token covered exactly once.
  std::vector<RequestRows> rows(requests.size());
  std::vector<int32_t> token_request(static_cast<size_t>(tokens), -1);
  for (size_t r = 0; r < requests.size(); ++r) {
    const AttentionRequest& request = requests[r];
    DI_CHECK(request.offset >= 0 && request.count >= 0 &&
                 request.offset + request.count <= tokens && request.start >= 0,
             "attention request ", r, ": rows [", request.offset, ", +", request.count,
             ") at position ", request.start, " outside ", tokens, " tokens");
    RequestRows& rr = rows[r];
    rr.offset = request.offset;
    rr.start = request.start;
    if (request.start > 0) {  // a request's first call reads nothing from its ring
      rr.ring = cpu::as_rows<float>(request.window_ring, "window ring");
      DI_CHECK(rr.ring.cols == head_dim && rr.ring.rows >= std::min(request.start, window - 1) &&
                   rr.ring.rows > 0,
               "window ring ", request.window_ring.to_string(), " cannot hold the ",
               std::min(request.start, window - 1), " positions before ", request.start);
    }
    if (request.selected.numel() > 0) {
      rr.compressed = cpu::as_rows<float>(request.compressed_kv, "compressed kv");
      rr.selected = cpu::as_rows<int32_t>(request.selected, "compressed indices");
      DI_CHECK(rr.selected.rows == request.count, "compressed indices ",
               request.selected.to_string());
      DI_CHECK(rr.compressed.rows == 0 || rr.compressed.cols == head_dim, "compressed kv ",
               request.compressed_kv.to_string());
    }
    for (int64_t t = request.offset; t < request.offset + request.count; ++t) {
      DI_CHECK(token_request[static_cast<size_t>(t)] < 0, "attention token ", t,
               " is in two requests");
      token_request[static_cast<size_t>(t)] = static_cast<int32_t>(r);
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    DI_CHECK(token_request[static_cast<size_t>(t)] >= 0, "attention token ", t,
             " is in no request");
  }

  attend(qr, o, sinks, tokens, heads, head_dim, scale,
         [&](int64_t t, std::vector<const float*>& keys) {
           const RequestRows& rr = rows[static_cast<size_t>(token_request[static_cast<size_t>(t)])];
           const int64_t position = rr.start + t - rr.offset;
           for (int64_t p = std::max<int64_t>(0, position - window + 1); p <= position; ++p) {
             // Positions before the request's start are in its ring; later ones are this
             // call's rows (token t holds `position`, so p is t - (position - p)).
             keys.push_back(p < rr.start ? rr.ring.row(p % rr.ring.rows)
                                         : fresh.row(t - (position - p)));
           }
           for (int64_t s = 0; s < rr.selected.cols * (rr.selected.rows > 0); ++s) {
             const int32_t j = rr.selected.row(t - rr.offset)[s];
             if (j < 0) continue;
             DI_CHECK(j < rr.compressed.rows, "compressed index ", j, " >= ", rr.compressed.rows);
             keys.push_back(rr.compressed.row(j));
           }
         });
}

void write_window_rings(const TensorView& new_kv, std::span<const AttentionRequest> requests) {
  const cpu::Rows<float> fresh = cpu::as_rows<float>(new_kv, "window new kv");
  for (const AttentionRequest& request : requests) {
    if (request.count == 0) continue;
    const cpu::Rows<float> ring = cpu::as_rows<float>(request.window_ring, "window ring");
    DI_CHECK(ring.rows > 0 && ring.cols == fresh.cols, "window ring ",
             request.window_ring.to_string(), " for rows ", new_kv.to_string());
    DI_CHECK(request.offset >= 0 && request.offset + request.count <= fresh.rows,
             "window request rows [", request.offset, ", +", request.count, ") outside ",
             fresh.rows);
    const int64_t end = request.start + request.count;
    for (int64_t p = std::max(request.start, end - ring.rows); p < end; ++p) {
      std::copy_n(fresh.row(request.offset + p - request.start), fresh.cols,
                  ring.row(p % ring.rows));
    }
  }
}

}  // namespace deepinfer::ops::cpu
