// Engram conditional memory: the table row gather (fp8 rows dequantized with their per-32
// scales) and the gated write into the hyper-connection streams.
#include <algorithm>
#include <cmath>

#include "ops/cpu/numerics.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/rows.h"
#include "ops/ops.h"

namespace deepinfer::ops::cpu {

void engram_gather(const TensorView& table, const TensorView& scale, const TensorView& ids,
                   const TensorView& out) {
  DI_CHECK(table.rank() == 2 && table.is_contiguous(), "engram table ", table.to_string());
  DI_CHECK(ids.rank() == 2 && ids.is_contiguous(), "engram ids ", ids.to_string());
  const int64_t rows = table.size(0);
  const int64_t dim = table.size(1);
  const int64_t tokens = ids.size(0);
  const int64_t columns = ids.size(1);
  const cpu::Rows<float> o = cpu::as_rows<float>(out, "engram gather output");
  DI_CHECK(o.rows == tokens && o.cols == columns * dim, "engram gather output ", out.to_string());
  const bool fp8 = table.dtype() == DType::kF8E4M3;
  int64_t block = 0;
  if (fp8) {
    DI_CHECK(scale.rank() == 2 && scale.size(0) == rows && scale.dtype() == DType::kF8E8M0 &&
                 dim % scale.size(1) == 0,
             "engram scale ", scale.to_string(), " for table ", table.to_string());
    block = dim / scale.size(1);
  }
  auto id_at = [&](int64_t flat) -> int64_t {
    if (ids.dtype() == DType::kI64) return ids.data<int64_t>()[flat];
    return ids.data<int32_t>()[flat];
  };
  cpu::parallel_for(tokens, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t c = 0; c < columns; ++c) {
        const int64_t id = id_at(t * columns + c);
        DI_CHECK(id >= 0 && id < rows, "engram hash id ", id, " outside the table of ", rows,
                 " rows");
        float* y = o.row(t) + c * dim;
        switch (table.dtype()) {
          case DType::kF32:
            std::copy_n(table.data<float>() + id * dim, dim, y);
            break;
          case DType::kBF16: {
            const BFloat16* row = table.data<BFloat16>() + id * dim;
            for (int64_t d = 0; d < dim; ++d) y[d] = cpu::bf16_to_float(row[d].bits);
            break;
          }
          case DType::kF8E4M3: {
            const uint8_t* row = reinterpret_cast<const uint8_t*>(table.raw_data()) + id * dim;
            const uint8_t* scales =
                reinterpret_cast<const uint8_t*>(scale.raw_data()) + id * scale.size(1);
            for (int64_t d = 0; d < dim; ++d) {
              y[d] = cpu::e4m3_to_float(row[d]) * cpu::e8m0_to_float(scales[d / block]);
            }
            break;
          }
          default:
            DI_THROW("engram tables of dtype ", dtype_name(table.dtype()), " are not supported");
        }
      }
    }
  });
}

void engram_mix(const TensorView& x, const TensorView& key, const TensorView& value,
                const TensorView& qk, float eps, const TensorView& out) {
  DI_CHECK(x.rank() == 3, "engram streams must be [M, hc, D]: ", x.to_string());
  const int64_t hc = x.size(1);
  const int64_t dim = x.size(2);
  const cpu::Rows<float> h = cpu::as_rows<float>(x, "engram streams");
  const cpu::Rows<float> k = cpu::as_rows<float>(key, "engram key");
  const cpu::Rows<float> v = cpu::as_rows<float>(value, "engram value");
  const cpu::Rows<float> w = cpu::as_rows<float>(qk, "engram qk weight");
  const cpu::Rows<float> o = cpu::as_rows<float>(out, "engram output");
  DI_CHECK(k.rows == h.rows && k.cols == hc * dim && v.rows == h.rows && v.cols == dim &&
               w.rows == hc && w.cols == dim && o.rows == h.rows && o.cols == hc * dim,
           "engram_mix shapes");
  const float inv_sqrt_dim = 1.0f / std::sqrt(static_cast<float>(dim));
  cpu::parallel_for(h.rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      for (int64_t s = 0; s < hc; ++s) {
        const float* hs = h.row(m) + s * dim;
        const float* ks = k.row(m) + s * dim;
        const float* ws = w.row(s);
        const float h_ms = cpu::dot(hs, hs, dim) / static_cast<float>(dim);
        const float k_ms = cpu::dot(ks, ks, dim) / static_cast<float>(dim);
        const float rstd = (1.0f / std::sqrt(h_ms + eps)) * (1.0f / std::sqrt(k_ms + eps));
        float dot = 0.0f;
        for (int64_t d = 0; d < dim; ++d) dot += hs[d] * ws[d] * ks[d];
        dot = dot * rstd * inv_sqrt_dim;
        const float root = std::sqrt(std::max(std::fabs(dot), 1e-6f));
        const float gate = 1.0f / (1.0f + std::exp(-std::copysign(root, dot)));
        float* ys = o.row(m) + s * dim;
        for (int64_t d = 0; d < dim; ++d) ys[d] = hs[d] + gate * v.row(m)[d];
      }
    }
  });
}

}  // namespace deepinfer::ops::cpu
