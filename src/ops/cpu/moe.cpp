// MoE routing (score function, selection bias, renormalization) and the clamped SwiGLU.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops/cpu/numerics.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/rows.h"
#include "ops/ops.h"

namespace deepinfer::ops::cpu {

void route(const TensorView& x, const TensorView& gate, const TensorView& bias,
           const RouterParams& params, const TensorView& weights_out,
           const TensorView& experts_out) {
  const cpu::Rows<float> in = cpu::as_rows<float>(x, "router input");
  const int64_t experts = gate.size(0);
  const int k = params.top_k;
  const cpu::Rows<float> w = cpu::as_rows<float>(weights_out, "router weights");
  const cpu::Rows<int32_t> e = cpu::as_rows<int32_t>(experts_out, "router experts");
  DI_CHECK(k >= 1 && k <= experts && w.rows == in.rows && w.cols == k && e.rows == in.rows &&
               e.cols == k,
           "route shapes");
  const bool has_bias = bias.numel() > 0;
  const float* b = has_bias ? cpu::as_flat<float>(bias, "router bias") : nullptr;
  DI_CHECK(!has_bias || bias.numel() == experts, "router bias ", bias.to_string());

  std::vector<float> logits(static_cast<size_t>(in.rows * experts));
  cpu::linear(x, LinearWeight{gate, TensorView()},
              TensorView::contiguous(logits.data(), DType::kF32, {in.rows, experts}));
  cpu::parallel_for(in.rows, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(experts));
    std::vector<float> biased(static_cast<size_t>(experts));
    std::vector<int32_t> order(static_cast<size_t>(experts));
    for (int64_t m = begin; m < end; ++m) {
      const float* row = logits.data() + m * experts;
      for (int64_t i = 0; i < experts; ++i) scores[i] = row[i] / params.temperature;
      switch (params.score_function) {
        case ScoreFunction::kSoftmax: {
          const float max_value = *std::max_element(scores.begin(), scores.end());
          float sum = 0.0f;
          for (float& s : scores) {
            s = std::exp(s - max_value);
            sum += s;
          }
          for (float& s : scores) s /= sum;
          break;
        }
        case ScoreFunction::kSigmoid:
          for (float& s : scores) s = 1.0f / (1.0f + std::exp(-s));
          break;
        case ScoreFunction::kSqrtSoftplus:
          // softplus(v) = log1p(exp(v)), written to stay finite for large v (torch switches to
          // the identity above 20).
          for (float& s : scores) s = std::sqrt(s > 20.0f ? s : std::log1p(std::exp(s)));
          break;
      }
      for (int64_t i = 0; i < experts; ++i) biased[i] = scores[i] + (has_bias ? b[i] : 0.0f);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t c) {
        return biased[a] > biased[c] || (biased[a] == biased[c] && a < c);
      });
      float sum = 0.0f;
      for (int i = 0; i < k; ++i) sum += scores[order[i]];
      for (int i = 0; i < k; ++i) {
        float weight = scores[order[i]];
        if (params.normalize && k > 1) weight /= sum + 1e-20f;
        w.row(m)[i] = weight * params.routed_scale;
        e.row(m)[i] = order[i];
      }
    }
  });
}

void swiglu(const TensorView& gate, const TensorView& up, float limit, const TensorView& row_weight,
            const TensorView& out) {
  const cpu::Rows<float> g = cpu::as_rows<float>(gate, "swiglu gate");
  const cpu::Rows<float> u = cpu::as_rows<float>(up, "swiglu up");
  const cpu::Rows<float> o = cpu::as_rows<float>(out, "swiglu output");
  DI_CHECK(g.rows == u.rows && g.cols == u.cols && o.rows == g.rows && o.cols == g.cols,
           "swiglu shapes");
  const bool weighted = row_weight.numel() > 0;
  const float* rw = weighted ? cpu::as_flat<float>(row_weight, "swiglu row weights") : nullptr;
  cpu::parallel_for(g.rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      for (int64_t i = 0; i < g.cols; ++i) {
        float a = g.row(m)[i];
        float b = u.row(m)[i];
        if (limit > 0) {
          b = std::clamp(b, -limit, limit);
          a = std::min(a, limit);
        }
        float y = a / (1.0f + std::exp(-a)) * b;
        if (weighted) y = rw[m] * y;
        o.row(m)[i] = y;
      }
    }
  });
}

// Each expert runs once on the rows routed to it (a row's result does not depend on the
// group), then every token sums its slots in ascending expert id.
void moe_experts(const TensorView& x, const TensorView& experts, const TensorView& weights,
                 std::span<const ExpertWeights> expert_weights, float swiglu_limit,
                 ActivationQuant quant, const TensorView& out) {
  const cpu::Rows<float> in = cpu::as_rows<float>(x, "moe input");
  const cpu::Rows<int32_t> chosen = cpu::as_rows<int32_t>(experts, "moe experts");
  const cpu::Rows<float> route_weights = cpu::as_rows<float>(weights, "moe weights");
  const cpu::Rows<float> y = cpu::as_rows<float>(out, "moe output");
  const int64_t n = in.rows;
  const int64_t dim = in.cols;
  const int64_t k = chosen.cols;
  DI_CHECK(chosen.rows == n && route_weights.rows == n && route_weights.cols == k && y.rows == n &&
               y.cols == dim,
           "moe_experts shapes: x ", x.to_string(), ", experts ", experts.to_string(), ", weights ",
           weights.to_string(), ", out ", out.to_string());
  DI_CHECK(k <= 64, "num_experts_per_tok ", k, " too large");
  if (n == 0) return;
  const int64_t expert_count = static_cast<int64_t>(expert_weights.size());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t s = 0; s < k; ++s) {
      const int32_t e = chosen.row(t)[s];
      if (e < 0 || e >= expert_count) {
        DI_THROW("moe_experts: token ", t, " slot ", s, " chose expert ", e, " of ", expert_count);
      }
    }
  }
  const int64_t inter = expert_count > 0 ? expert_weights[0].w1.out_features() : 0;
  // Grow-only per thread: after the largest call, nothing is allocated here.
  thread_local std::vector<float> expert_out, rows, gate, up, result, member_weights;
  thread_local std::vector<int64_t> members;  // token * k + slot, ascending tokens
  auto grow = [](std::vector<float>& buffer, int64_t count) {
    if (buffer.size() < static_cast<size_t>(count)) buffer.resize(static_cast<size_t>(count));
    return buffer.data();
  };
  auto f32 = [](float* data, Shape shape) {
    return TensorView::contiguous(data, DType::kF32, shape);
  };
  float* per_slot = grow(expert_out, n * k * dim);
  for (int64_t e = 0; e < expert_count; ++e) {
    members.clear();
    member_weights.clear();
    for (int64_t i = 0; i < n * k; ++i) {
      if (chosen.row(i / k)[i % k] == e) {
        members.push_back(i);
        member_weights.push_back(route_weights.row(i / k)[i % k]);
      }
    }
    if (members.empty()) continue;
    const int64_t m = static_cast<int64_t>(members.size());
    float* gathered = grow(rows, m * dim);
    for (int64_t j = 0; j < m; ++j) {
      std::copy_n(in.row(members[static_cast<size_t>(j)] / k), dim, gathered + j * dim);
    }
    const ExpertWeights& ex = expert_weights[static_cast<size_t>(e)];
    float* g = grow(gate, m * inter);
    float* u = grow(up, m * inter);
    cpu::linear(f32(gathered, {m, dim}), ex.w1, f32(g, {m, inter}), quant);
    cpu::linear(f32(gathered, {m, dim}), ex.w3, f32(u, {m, inter}), quant);
    cpu::swiglu(f32(g, {m, inter}), f32(u, {m, inter}), swiglu_limit,
                f32(member_weights.data(), {m}), f32(g, {m, inter}));
    float* r = grow(result, m * dim);
    cpu::linear(f32(g, {m, inter}), ex.w2, f32(r, {m, dim}), quant);
    for (int64_t j = 0; j < m; ++j) {
      std::copy_n(r + j * dim, dim, per_slot + members[static_cast<size_t>(j)] * dim);
    }
  }
  // HF's combine order: routed experts by ascending expert id.
  for (int64_t t = 0; t < n; ++t) {
    int64_t order[64];
    for (int64_t s = 0; s < k; ++s) order[s] = s;
    std::sort(order, order + k,
              [&](int64_t a, int64_t b) { return chosen.row(t)[a] < chosen.row(t)[b]; });
    float* row = y.row(t);
    std::fill_n(row, dim, 0.0f);
    for (int64_t s = 0; s < k; ++s) {
      const float* contribution = per_slot + (t * k + order[s]) * dim;
      for (int64_t d = 0; d < dim; ++d) row[d] += contribution[d];
    }
  }
}

}  // namespace deepinfer::ops::cpu
