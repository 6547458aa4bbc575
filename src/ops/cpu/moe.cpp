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

}  // namespace deepinfer::ops::cpu
