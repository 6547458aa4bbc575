// Hyper-connection mixes (one projection of the normalized streams, Sinkhorn-projected comb),
// the collapse of the streams into one sublayer input, and the expansion back.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/numerics.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/rows.h"
#include "ops/ops.h"

namespace deepinfer::ops::cpu {
namespace {
float sigmoid(float v) {
  return 1.0f / (1.0f + std::exp(-v));
}
}  // namespace

void hc_mixes(const TensorView& x, const TensorView& fn, const TensorView& scale,
              const TensorView& base, const HcParams& params, const TensorView& pre,
              const TensorView& post, const TensorView& comb) {
  const int hc = params.hc;
  const int64_t mix_count = static_cast<int64_t>(2 + hc) * hc;
  const cpu::Rows<float> in = cpu::as_rows<float>(x, "hc streams");
  const cpu::Rows<float> f = cpu::as_rows<float>(fn, "hc fn");
  const float* sc = cpu::as_flat<float>(scale, "hc scale");
  const float* bs = cpu::as_flat<float>(base, "hc base");
  const cpu::Rows<float> pre_out = cpu::as_rows<float>(pre, "hc pre");
  const cpu::Rows<float> post_out = cpu::as_rows<float>(post, "hc post");
  const cpu::Rows<float> comb_out = cpu::as_rows<float>(comb, "hc comb");
  DI_CHECK(f.rows == mix_count && f.cols == in.cols, "hc fn ", fn.to_string(), " for streams ",
           x.to_string());
  DI_CHECK(scale.numel() == 3 && base.numel() == mix_count, "hc scale/base shapes");
  DI_CHECK(pre_out.rows == in.rows && pre_out.cols == hc && post_out.cols == hc &&
               comb_out.cols == hc * hc,
           "hc output shapes");
  const float eps = params.hc_eps;
  cpu::parallel_for(in.rows, 1, [&](int64_t begin, int64_t end) {
    static thread_local std::vector<float> normed;
    normed.resize(static_cast<size_t>(in.cols));
    float mixes[64 + 16];
    DI_CHECK(mix_count <= 80, "hc_mult ", hc, " too large");
    for (int64_t m = begin; m < end; ++m) {
      const float* a = in.row(m);
      const float mean_square = cpu::dot(a, a, in.cols) / static_cast<float>(in.cols);
      const float inv = 1.0f / std::sqrt(mean_square + params.norm_eps);
      for (int64_t d = 0; d < in.cols; ++d) normed[static_cast<size_t>(d)] = a[d] * inv;
      for (int64_t i = 0; i < mix_count; ++i) mixes[i] = cpu::dot(normed.data(), f.row(i), in.cols);

      float* p = pre_out.row(m);
      float* q = post_out.row(m);
      float* c = comb_out.row(m);
      for (int k = 0; k < hc; ++k) {
        p[k] = sigmoid(mixes[k] * sc[0] + bs[k]) + eps;
        q[k] = 2.0f * sigmoid(mixes[hc + k] * sc[1] + bs[hc + k]);
      }
      // comb[j][k]: softmax over k, then alternate column / row normalizations.
      for (int j = 0; j < hc; ++j) {
        float* row = c + j * hc;
        float max_logit = -INFINITY;
        for (int k = 0; k < hc; ++k) {
          row[k] = mixes[2 * hc + j * hc + k] * sc[2] + bs[2 * hc + j * hc + k];
          max_logit = std::max(max_logit, row[k]);
        }
        float sum = 0.0f;
        for (int k = 0; k < hc; ++k) {
          row[k] = std::exp(row[k] - max_logit);
          sum += row[k];
        }
        for (int k = 0; k < hc; ++k) row[k] = row[k] / sum + eps;
      }
      auto normalize_columns = [&] {
        for (int k = 0; k < hc; ++k) {
          float sum = 0.0f;
          for (int j = 0; j < hc; ++j) sum += c[j * hc + k];
          for (int j = 0; j < hc; ++j) c[j * hc + k] /= sum + eps;
        }
      };
      auto normalize_rows = [&] {
        for (int j = 0; j < hc; ++j) {
          float sum = 0.0f;
          for (int k = 0; k < hc; ++k) sum += c[j * hc + k];
          for (int k = 0; k < hc; ++k) c[j * hc + k] /= sum + eps;
        }
      };
      normalize_columns();
      for (int iteration = 0; iteration + 1 < params.sinkhorn_iters; ++iteration) {
        normalize_rows();
        normalize_columns();
      }
    }
  });
}

void hc_collapse(const TensorView& x, const TensorView& pre, const TensorView& out) {
  DI_CHECK(x.rank() == 3, "hc_collapse streams must be [M, hc, D]: ", x.to_string());
  const int64_t hc = x.size(1);
  const int64_t dim = x.size(2);
  const cpu::Rows<float> in = cpu::as_rows<float>(x, "hc streams");
  const cpu::Rows<float> p = cpu::as_rows<float>(pre, "hc pre");
  const cpu::Rows<float> o = cpu::as_rows<float>(out, "hc collapse output");
  DI_CHECK(p.rows == in.rows && p.cols == hc && o.rows == in.rows && o.cols == dim,
           "hc_collapse shapes");
  cpu::parallel_for(in.rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      float* y = o.row(m);
      const float* w = p.row(m);
      for (int64_t d = 0; d < dim; ++d) {
        float sum = 0.0f;
        for (int64_t j = 0; j < hc; ++j) sum += w[j] * in.row(m)[j * dim + d];
        y[d] = sum;
      }
    }
  });
}

void hc_expand(const TensorView& y, const TensorView& residual, const TensorView& post,
               const TensorView& comb, const TensorView& out) {
  DI_CHECK(residual.rank() == 3, "hc_expand residual must be [M, hc, D]");
  const int64_t hc = residual.size(1);
  const int64_t dim = residual.size(2);
  const cpu::Rows<float> in = cpu::as_rows<float>(y, "hc sublayer output");
  const cpu::Rows<float> r = cpu::as_rows<float>(residual, "hc residual");
  const cpu::Rows<float> q = cpu::as_rows<float>(post, "hc post");
  const cpu::Rows<float> c = cpu::as_rows<float>(comb, "hc comb");
  const cpu::Rows<float> o = cpu::as_rows<float>(out, "hc expand output");
  DI_CHECK(in.rows == r.rows && in.cols == dim && q.cols == hc && c.cols == hc * hc &&
               o.rows == r.rows && o.cols == hc * dim,
           "hc_expand shapes");
  cpu::parallel_for(r.rows, 4, [&](int64_t begin, int64_t end) {
    static thread_local std::vector<float> mixed;
    mixed.resize(static_cast<size_t>(hc * dim));
    for (int64_t m = begin; m < end; ++m) {
      const float* res = r.row(m);
      const float* weights = c.row(m);
      for (int64_t k = 0; k < hc; ++k) {
        for (int64_t d = 0; d < dim; ++d) {
          float sum = 0.0f;
          for (int64_t j = 0; j < hc; ++j) sum += weights[j * hc + k] * res[j * dim + d];
          mixed[static_cast<size_t>(k * dim + d)] = q.row(m)[k] * in.row(m)[d] + sum;
        }
      }
      std::copy(mixed.begin(), mixed.end(), o.row(m));
    }
  });
}

}  // namespace deepinfer::ops::cpu
