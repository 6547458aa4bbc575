// embedding, rmsnorm, rope, softmax and the fake quantizers of the model's caches.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "ops/cpu/numerics.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/rows.h"
#include "ops/ops.h"

namespace deepinfer::ops::cpu {
namespace {

using cpu::Rows;

// Element i of an f32 or bf16 vector.
float vector_value(const TensorView& v, int64_t i) {
  if (v.dtype() == DType::kF32) return v.data<float>()[i];
  return cpu::bf16_to_float(v.data<BFloat16>()[i].bits);
}

void check_parameter_vector(const TensorView& v, int64_t length, const char* what) {
  DI_CHECK(v.rank() == 1 && v.size(0) == length && v.is_contiguous() && v.device().is_cpu(), what,
           " must be a contiguous vector of ", length, ", got ", v.to_string());
  DI_CHECK(v.dtype() == DType::kF32 || v.dtype() == DType::kBF16, what, " must be f32 or bf16");
}

}  // namespace

void embedding(const TensorView& table, std::span<const int32_t> ids, const TensorView& out) {
  DI_CHECK(table.rank() == 2 && table.is_contiguous(), "embedding table ", table.to_string());
  const Rows<float> o = cpu::as_rows<float>(out, "embedding output");
  const int64_t vocab = table.size(0);
  const int64_t dim = table.size(1);
  DI_CHECK(o.rows == static_cast<int64_t>(ids.size()) && o.cols == dim, "embedding output shape ",
           out.to_string());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      DI_THROW("token id ", ids[i], " at position ", i, " is outside the vocabulary [0, ", vocab,
               ")");
    }
  }
  cpu::parallel_for(o.rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      float* y = o.row(m);
      const int64_t base = ids[static_cast<size_t>(m)] * dim;
      if (table.dtype() == DType::kF32) {
        std::copy_n(table.data<float>() + base, dim, y);
      } else if (table.dtype() == DType::kBF16) {
        const BFloat16* row = table.data<BFloat16>() + base;
        for (int64_t d = 0; d < dim; ++d) y[d] = cpu::bf16_to_float(row[d].bits);
      } else {
        DI_THROW("embedding tables of dtype ", dtype_name(table.dtype()), " are not supported");
      }
    }
  });
}

void rmsnorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  const Rows<float> in = cpu::as_rows<float>(x, "rmsnorm input");
  const Rows<float> o = cpu::as_rows<float>(out, "rmsnorm output");
  DI_CHECK(in.rows == o.rows && in.cols == o.cols, "rmsnorm shapes ", x.to_string(), " -> ",
           out.to_string());
  const bool weighted = weight.numel() > 0;
  if (weighted) check_parameter_vector(weight, in.cols, "rmsnorm weight");
  cpu::parallel_for(in.rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const float* a = in.row(m);
      float* y = o.row(m);
      const float mean_square = cpu::dot(a, a, in.cols) / static_cast<float>(in.cols);
      const float inv = 1.0f / std::sqrt(mean_square + eps);
      for (int64_t d = 0; d < in.cols; ++d) {
        const float normed = a[d] * inv;
        y[d] = weighted ? normed * vector_value(weight, d) : normed;
      }
    }
  });
}

RopeTable make_rope_table(int rope_dim, double theta, const YarnParams& yarn) {
  DI_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rope_dim must be positive and even: ", rope_dim);
  RopeTable table;
  table.rope_dim = rope_dim;
  const int pairs = rope_dim / 2;
  std::vector<double> freq(static_cast<size_t>(pairs));
  for (int i = 0; i < pairs; ++i) {
    // The reference computes these in f32: round the base frequency the same way.
    freq[static_cast<size_t>(i)] = static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(static_cast<float>(2 * i) /
                                                  static_cast<float>(rope_dim))));
  }
  if (yarn.original_max_position > 0) {
    // The dimension whose wavelength completes `rotations` turns over the original context.
    auto corrected_dim = [&](double rotations) {
      return rope_dim * std::log(yarn.original_max_position / (rotations * 2 * std::numbers::pi)) /
             (2 * std::log(theta));
    };
    const double low = std::max(std::floor(corrected_dim(yarn.beta_fast)), 0.0);
    const double high = std::min(std::ceil(corrected_dim(yarn.beta_slow)), rope_dim - 1.0);
    for (int i = 0; i < pairs; ++i) {
      const double ramp = std::clamp((i - low) / std::max(high - low, 1e-3), 0.0, 1.0);
      const double f = freq[static_cast<size_t>(i)];
      freq[static_cast<size_t>(i)] = f / yarn.factor * ramp + f * (1.0 - ramp);
    }
  }
  table.inv_freq.resize(static_cast<size_t>(pairs));
  for (int i = 0; i < pairs; ++i) {
    table.inv_freq[static_cast<size_t>(i)] = static_cast<float>(freq[static_cast<size_t>(i)]);
  }
  return table;
}

void rope(const TensorView& x, const TensorView& positions_view, const RopeTable& table,
          bool inverse) {
  const Rows<float> rows = cpu::as_rows<float>(x, "rope input");
  DI_CHECK(positions_view.numel() == rows.rows, "rope: ", positions_view.to_string(),
           " positions for ", x.to_string());
  const int32_t* positions = cpu::as_flat<int32_t>(positions_view, "rope positions");
  const int64_t head_dim = x.size(-1);
  const int64_t heads = rows.cols / head_dim;
  const int rope_dim = table.rope_dim;
  DI_CHECK(rope_dim <= head_dim, "rope_dim ", rope_dim, " exceeds head_dim ", head_dim);
  const int pairs = rope_dim / 2;
  cpu::parallel_for(rows.rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      const float position = static_cast<float>(positions[m]);
      for (int i = 0; i < pairs; ++i) {
        // The angle is rounded to f32 as the reference does (f32 position times f32 frequency).
        const float angle = position * table.inv_freq[static_cast<size_t>(i)];
        const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
        const float s0 = static_cast<float>(std::sin(static_cast<double>(angle)));
        const float s = inverse ? -s0 : s0;
        for (int64_t h = 0; h < heads; ++h) {
          float* pair = rows.row(m) + h * head_dim + (head_dim - rope_dim) + 2 * i;
          const float even = pair[0];
          const float odd = pair[1];
          pair[0] = even * c - odd * s;
          pair[1] = even * s + odd * c;
        }
      }
    }
  });
}

void softmax_rows(const TensorView& x) {
  const Rows<float> rows = cpu::as_rows<float>(x, "softmax input");
  cpu::parallel_for(rows.rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      float* v = rows.row(m);
      float max_value = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < rows.cols; ++j) max_value = std::max(max_value, v[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j < rows.cols; ++j) {
        v[j] = std::exp(v[j] - max_value);
        sum += v[j];
      }
      for (int64_t j = 0; j < rows.cols; ++j) v[j] /= sum;
    }
  });
}

void fake_quant_fp8(const TensorView& x, int block) {
  const Rows<float> rows = cpu::as_rows<float>(x, "fake_quant_fp8 input");
  const int64_t n = x.size(-1);
  if (n % block != 0) return;  // unblockable shapes stay unquantized (tiny test configs)
  const int64_t blocks_per_row = rows.cols / block;
  cpu::parallel_for(rows.rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      for (int64_t b = 0; b < blocks_per_row; ++b) {
        float* v = rows.row(m) + b * block;
        float amax = 0.0f;
        for (int k = 0; k < block; ++k) amax = std::max(amax, std::fabs(v[k]));
        const float scale = cpu::pow2_ceil(std::max(amax, 1e-4f) * (1.0f / 448.0f));
        for (int k = 0; k < block; ++k) {
          v[k] = cpu::round_to_e4m3(std::clamp(v[k] / scale, -448.0f, 448.0f)) * scale;
        }
      }
    }
  });
}

void fake_quant_fp4(const TensorView& x, int block, Fp4ScaleFormat scale_format) {
  const Rows<float> rows = cpu::as_rows<float>(x, "fake_quant_fp4 input");
  const int64_t n = x.size(-1);
  if (n % block != 0) return;  // unblockable shapes stay unquantized (tiny test configs)
  const int64_t blocks_per_row = rows.cols / block;
  cpu::parallel_for(rows.rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      for (int64_t b = 0; b < blocks_per_row; ++b) {
        float* v = rows.row(m) + b * block;
        float amax = 0.0f;
        for (int k = 0; k < block; ++k) amax = std::max(amax, std::fabs(v[k]));
        float scale;
        if (scale_format == Fp4ScaleFormat::kE4m3) {
          scale = cpu::round_to_e4m3(std::max(amax, 6.0f * 0x1p-9f) / 6.0f);
        } else {
          scale = cpu::pow2_ceil(std::max(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
        }
        for (int k = 0; k < block; ++k) {
          v[k] = cpu::round_to_e2m1(std::clamp(v[k] / scale, -6.0f, 6.0f)) * scale;
        }
      }
    }
  });
}

}  // namespace deepinfer::ops::cpu
