// A batched attention call's inputs (ops::sink_attention_batch) for the op tests: requests at
// different positions, each with its own window ring (random rows in every slot, so a wrong
// slot reads a wrong value), its own compressed rows and selection; and the reference the
// batched op must equal bit for bit on the CPU: per request, the window rows gathered into one
// matrix (the forward's path before the batched op) and the single-matrix sink_attention.
// Key rows can be made bf16-exact, as the model's are (round_keys_to_bf16).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace deepinfer::ops::attention_cases {

struct RequestSpec {
  int64_t start = 0;     // position of the first new token
  int64_t count = 0;     // new tokens
  int64_t capacity = 0;  // ring rows
  int64_t selected = 0;  // compressed entries per token; 0: no compressed keys
};

struct BatchTensors {
  Tensor q, new_kv, sink;
  std::vector<Tensor> rings, compressed, selected;  // per request; selected may be empty
};

struct AttentionBatch {
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t window = 0;
  float scale = 1.0f;
  std::vector<RequestSpec> specs;
  std::vector<int64_t> offsets;  // per request: its first row in the call
  BatchTensors host;
};

inline Tensor random_f32(Shape shape, std::mt19937& rng, float scale) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = uniform(rng);
  return t;
}

// `row_order`: the order in which the requests' rows follow each other in the call (a
// permutation of the request indices), so the rows need not be in request order. Compressed
// selections hold a few -1 holes, and every third token of a request with compressed keys has
// none at all (all -1).
inline AttentionBatch make_batch(std::vector<RequestSpec> specs, std::vector<int> row_order,
                                 int64_t heads, int64_t head_dim, int64_t window, uint32_t seed) {
  AttentionBatch b;
  b.specs = std::move(specs);
  b.heads = heads;
  b.head_dim = head_dim;
  b.window = window;
  b.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  b.offsets.assign(b.specs.size(), 0);
  for (int r : row_order) {
    b.offsets[static_cast<size_t>(r)] = b.tokens;
    b.tokens += b.specs[static_cast<size_t>(r)].count;
  }
  std::mt19937 rng(seed);
  b.host.q = random_f32({b.tokens, heads, head_dim}, rng, 1.0f);
  b.host.new_kv = random_f32({b.tokens, head_dim}, rng, 0.5f);
  b.host.sink = random_f32({heads}, rng, 2.0f);
  for (const RequestSpec& spec : b.specs) {
    b.host.rings.push_back(random_f32({spec.capacity, head_dim}, rng, 0.5f));
    const int64_t compressed_rows = (spec.start + spec.count) / 4 + 3;
    b.host.compressed.push_back(random_f32({compressed_rows, head_dim}, rng, 0.5f));
    if (spec.selected == 0) {
      b.host.selected.emplace_back();
      continue;
    }
    Tensor selected = Tensor::empty(DType::kI32, {spec.count, spec.selected});
    for (int64_t t = 0; t < spec.count; ++t) {
      for (int64_t k = 0; k < spec.selected; ++k) {
        int32_t j = static_cast<int32_t>(rng() % static_cast<uint32_t>(compressed_rows));
        if (t % 3 == 2 || k % 7 == 6) j = -1;
        selected.data<int32_t>()[t * spec.selected + k] = j;
      }
    }
    b.host.selected.push_back(std::move(selected));
  }
  return b;
}

// x rounded to the nearest bf16 (ties to even), as an f32.
inline float round_to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;  // finite values only
  std::memcpy(&x, &bits, sizeof(bits));
  return x;
}

// Which key values are bf16-exact: none (f32 rows, the op's general case), all (the model's FP8
// window and FP4 compressed rows are), or a mix: the first half of every row's columns, and the
// second half of even rows only, so some operand blocks of a tile are exact and others not.
enum class KeyValues { kF32, kBf16, kMixed };

// Rounds an [rows, cols] f32 tensor's values to bf16 as `values` says.
inline void round_keys_to_bf16(Tensor& rows, KeyValues values) {
  if (values == KeyValues::kF32 || rows.numel() == 0) return;
  const int64_t cols = rows.view().size(1);
  float* data = rows.data<float>();
  for (int64_t r = 0; r < rows.view().size(0); ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      if (values == KeyValues::kBf16 || c < cols / 2 || r % 2 == 0) {
        data[r * cols + c] = round_to_bf16(data[r * cols + c]);
      }
    }
  }
}

// Every key row of the batch (rings, new rows, compressed rows) rounded as `values` says.
inline void round_batch_keys(AttentionBatch& b, KeyValues values) {
  round_keys_to_bf16(b.host.new_kv, values);
  for (Tensor& ring : b.host.rings) round_keys_to_bf16(ring, values);
  for (Tensor& compressed : b.host.compressed) round_keys_to_bf16(compressed, values);
}

// The same tensors through `copy` (e.g. to the device).
template <typename Copy>
BatchTensors copy_tensors(const BatchTensors& from, Copy&& copy) {
  BatchTensors to;
  to.q = copy(from.q.view());
  to.new_kv = copy(from.new_kv.view());
  to.sink = copy(from.sink.view());
  for (const Tensor& t : from.rings) to.rings.push_back(copy(t.view()));
  for (const Tensor& t : from.compressed) to.compressed.push_back(copy(t.view()));
  for (const Tensor& t : from.selected) {
    to.selected.push_back(t.numel() > 0 ? copy(t.view()) : Tensor());
  }
  return to;
}

// The op's request table over `tensors` (the host ones or a copy).
inline std::vector<AttentionRequest> request_views(const AttentionBatch& b,
                                                   const BatchTensors& tensors) {
  std::vector<AttentionRequest> requests;
  for (size_t r = 0; r < b.specs.size(); ++r) {
    AttentionRequest request;
    request.window_ring = tensors.rings[r].view();
    if (b.specs[r].selected > 0) {
      request.compressed_kv = tensors.compressed[r].view();
      request.selected = tensors.selected[r].view();
    }
    request.offset = b.offsets[r];
    request.count = b.specs[r].count;
    request.start = b.specs[r].start;
    requests.push_back(request);
  }
  return requests;
}

// A host copy of a host view's rows [first, first + count) (all rows: count < 0).
inline Tensor clone_rows(const TensorView& from, int64_t first = 0, int64_t count = -1) {
  const TensorView rows = count < 0 ? from : from.narrow(0, first, count);
  Tensor to = Tensor::empty(rows.dtype(), rows.shape());
  if (to.numel() > 0) ops::copy(rows, to);
  return to;
}

// Tokens of request r only, as a call of their own (rows from 0).
inline AttentionBatch only_request(const AttentionBatch& b, size_t r) {
  AttentionBatch one;
  one.heads = b.heads;
  one.head_dim = b.head_dim;
  one.window = b.window;
  one.scale = b.scale;
  one.specs = {b.specs[r]};
  one.offsets = {0};
  one.tokens = b.specs[r].count;
  one.host.q = clone_rows(b.host.q, b.offsets[r], one.tokens);
  one.host.new_kv = clone_rows(b.host.new_kv, b.offsets[r], one.tokens);
  one.host.sink = clone_rows(b.host.sink);
  one.host.rings.push_back(clone_rows(b.host.rings[r]));
  one.host.compressed.push_back(clone_rows(b.host.compressed[r]));
  one.host.selected.push_back(b.host.selected[r].numel() > 0 ? clone_rows(b.host.selected[r])
                                                             : Tensor());
  return one;
}

// The CPU reference through the single-matrix form: per request, window rows [base, end)
// gathered from its ring (positions before start) and the new rows, per-token ranges into them.
inline Tensor gathered_reference(const AttentionBatch& b) {
  Tensor out = Tensor::empty(DType::kF32, {b.tokens, b.heads, b.head_dim});
  const int64_t d = b.head_dim;
  for (size_t r = 0; r < b.specs.size(); ++r) {
    const RequestSpec& spec = b.specs[r];
    if (spec.count == 0) continue;
    const int64_t base = std::max<int64_t>(0, spec.start - (b.window - 1));
    const int64_t end = spec.start + spec.count;
    Tensor rows = Tensor::empty(DType::kF32, {end - base, d});
    for (int64_t p = base; p < end; ++p) {
      const float* from = p < spec.start
                              ? b.host.rings[r].data<float>() + (p % spec.capacity) * d
                              : b.host.new_kv.data<float>() + (b.offsets[r] + p - spec.start) * d;
      std::copy_n(from, d, rows.data<float>() + (p - base) * d);
    }
    Tensor ranges = Tensor::empty(DType::kI32, {spec.count, 2});
    for (int64_t t = 0; t < spec.count; ++t) {
      const int64_t p = spec.start + t;
      ranges.data<int32_t>()[2 * t] =
          static_cast<int32_t>(std::max<int64_t>(0, p - b.window + 1) - base);
      ranges.data<int32_t>()[2 * t + 1] = static_cast<int32_t>(p + 1 - base);
    }
    sink_attention(b.host.q.view().narrow(0, b.offsets[r], spec.count), rows, ranges,
                   spec.selected > 0 ? b.host.compressed[r].view() : TensorView(),
                   spec.selected > 0 ? b.host.selected[r].view() : TensorView(), b.host.sink,
                   b.scale, out.view().narrow(0, b.offsets[r], spec.count));
  }
  return out;
}

}  // namespace deepinfer::ops::attention_cases
