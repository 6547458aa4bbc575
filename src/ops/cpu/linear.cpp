// linear and dequantize_weight: every weight format dequantizes one row at a time into f32
// (exactly), and each output element is one fixed-order dot product.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/cpu/numerics.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/rows.h"
#include "ops/ops.h"

namespace deepinfer::ops::cpu {
namespace {

using cpu::Rows;

struct WeightLayout {
  DType dtype;
  int64_t out = 0;
  int64_t in = 0;
  int64_t block_out = 0;  // f8: rows per scale block
  int64_t block_in = 0;   // f8/f4: columns per scale block
  const uint8_t* bytes = nullptr;
  int64_t row_bytes = 0;
  const uint8_t* scale = nullptr;
  int64_t scale_cols = 0;
};

WeightLayout describe(const LinearWeight& weight) {
  const TensorView& w = weight.weight;
  DI_CHECK(w.rank() == 2 && w.device().is_cpu() && w.is_contiguous(),
           "linear weight must be a contiguous host matrix: ", w.to_string());
  WeightLayout layout;
  layout.dtype = w.dtype();
  layout.out = w.size(0);
  layout.in = w.size(1);
  layout.bytes = static_cast<const uint8_t*>(w.raw_data());
  layout.row_bytes = static_cast<int64_t>(dtype_storage_bytes(w.dtype(), layout.in));
  switch (w.dtype()) {
    case DType::kF32:
    case DType::kBF16:
      return layout;
    case DType::kF8E4M3:
    case DType::kF4E2M1x2: {
      const TensorView& s = weight.scale;
      if (s.numel() == 0 || s.rank() != 2 || s.dtype() != DType::kF8E8M0 || !s.is_contiguous()) {
        DI_THROW("a ", dtype_name(w.dtype()), " linear weight ", w.to_string(),
                 " needs a contiguous 2-D ue8m0 scale, got ", s.to_string());
      }
      layout.scale = static_cast<const uint8_t*>(s.raw_data());
      layout.scale_cols = s.size(1);
      if (w.dtype() == DType::kF4E2M1x2) {
        if (s.size(0) != layout.out || layout.in % s.size(1) != 0) {
          DI_THROW("fp4 weight ", w.to_string(), " has scale ", s.to_string(),
                   "; expected [out, in / block]");
        }
        layout.block_out = 1;
        layout.block_in = layout.in / s.size(1);
      } else {
        layout.block_out = scale_block_edge(layout.out, s.size(0));
        layout.block_in = scale_block_edge(layout.in, s.size(1));
        if (layout.block_out == 0 || layout.block_in == 0) {
          DI_THROW("fp8 weight ", w.to_string(), " has scale grid ", s.to_string(),
                   " that matches no block shape");
        }
      }
      return layout;
    }
    default:
      DI_THROW("linear weights of dtype ", dtype_name(w.dtype()), " are not supported");
  }
}

// Row n of the weight as f32 into `row` (length in).
void dequantize_row(const WeightLayout& layout, int64_t n, float* row) {
  const uint8_t* bytes = layout.bytes + n * layout.row_bytes;
  switch (layout.dtype) {
    case DType::kF32:
      std::copy_n(reinterpret_cast<const float*>(bytes), layout.in, row);
      return;
    case DType::kBF16: {
      const auto* bits = reinterpret_cast<const uint16_t*>(bytes);
      for (int64_t k = 0; k < layout.in; ++k) row[k] = cpu::bf16_to_float(bits[k]);
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* scales = layout.scale + (n / layout.block_out) * layout.scale_cols;
      for (int64_t k = 0; k < layout.in; ++k) {
        row[k] = cpu::e4m3_to_float(bytes[k]) * cpu::e8m0_to_float(scales[k / layout.block_in]);
      }
      return;
    }
    case DType::kF4E2M1x2: {
      const uint8_t* scales = layout.scale + n * layout.scale_cols;
      for (int64_t k = 0; k < layout.in; ++k) {
        const uint8_t code = (k & 1) ? (bytes[k >> 1] >> 4) : (bytes[k >> 1] & 0xF);
        row[k] = cpu::e2m1_to_float(code) * cpu::e8m0_to_float(scales[k / layout.block_in]);
      }
      return;
    }
    default:
      DI_CHECK(false, "unreachable weight dtype");
  }
}

// The released path's activation quantizer: per 32 values, e4m3 times a ue8m0 scale. A row
// whose length is not a multiple of 32 ends with a short block.
void quantize_activation_fp8(const float* x, int64_t n, float* out) {
  constexpr int64_t kBlock = 32;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    float amax = 0.0f;
    for (int64_t k = start; k < end; ++k) amax = std::max(amax, std::fabs(x[k]));
    const float scale = cpu::pow2_ceil(std::max(amax, 1e-4f) * (1.0f / 448.0f));
    for (int64_t k = start; k < end; ++k) {
      const float q = std::clamp(x[k] / scale, -448.0f, 448.0f);
      out[k] = cpu::round_to_e4m3(q) * scale;
    }
  }
}

}  // namespace

void dequantize_weight(const LinearWeight& weight, const TensorView& out) {
  const WeightLayout layout = describe(weight);
  if (out.dtype() == DType::kBF16) {
    const DType stored = weight.weight.dtype();
    if (stored != DType::kBF16 && stored != DType::kF8E4M3) {
      DI_THROW("dequantize_weight to bf16 takes bf16 or fp8 weights, not ",
               weight.weight.to_string());
    }
    if (out.rank() != 2 || !out.is_contiguous() || out.size(0) != layout.out ||
        out.size(1) != layout.in) {
      DI_THROW("dequantize_weight output shape ", out.to_string(), " for weight ",
               weight.weight.to_string());
    }
    auto* halves = static_cast<uint16_t*>(out.raw_data());
    cpu::parallel_for(layout.out, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(layout.in));
      for (int64_t n = begin; n < end; ++n) {
        dequantize_row(layout, n, row.data());
        for (int64_t k = 0; k < layout.in; ++k) {
          uint32_t bits;
          std::memcpy(&bits, &row[static_cast<size_t>(k)], sizeof(bits));
          if ((bits & 0xFFFFu) != 0) {
            DI_THROW("dequantize_weight: ", weight.weight.to_string(), " row ", n, " column ", k,
                     " (", row[static_cast<size_t>(k)], ") is not exact in bf16");
          }
          halves[n * layout.in + k] = static_cast<uint16_t>(bits >> 16);
        }
      }
    });
    return;
  }
  const Rows<float> o = cpu::as_rows<float>(out, "dequantize_weight output");
  DI_CHECK(o.rows == layout.out && o.cols == layout.in, "dequantize_weight output shape ",
           out.to_string(), " for weight ", weight.weight.to_string());
  cpu::parallel_for(layout.out, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) dequantize_row(layout, n, o.row(n));
  });
}

void linear(const TensorView& x, const LinearWeight& weight, const TensorView& out,
            ActivationQuant activation_quant) {
  const WeightLayout layout = describe(weight);
  const Rows<float> in = cpu::as_rows<float>(x, "linear input");
  const Rows<float> o = cpu::as_rows<float>(out, "linear output");
  if (in.cols != layout.in || o.cols != layout.out || o.rows != in.rows) {
    DI_THROW("linear shapes do not match: x ", x.to_string(), ", weight ",
             weight.weight.to_string(), ", out ", out.to_string());
  }
  const int64_t rows = in.rows;
  if (rows == 0 || layout.out == 0) return;

  // The activation as the GEMM sees it (quantized once per row, not once per output).
  const float* activations = in.data;
  int64_t activation_stride = in.stride;
  // Grow-only scratch: no allocation once the largest step has been seen.
  static thread_local std::vector<float> quantized;
  if (activation_quant == ActivationQuant::kFp8PerBlock32) {
    if (quantized.size() < static_cast<size_t>(rows * layout.in)) {
      quantized.resize(static_cast<size_t>(rows * layout.in));
    }
    // The caller's buffer (inside the loop body `quantized` would name each worker's own).
    float* destination = quantized.data();
    cpu::parallel_for(rows, 4, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        quantize_activation_fp8(in.row(m), layout.in, destination + m * layout.in);
      }
    });
    activations = quantized.data();
    activation_stride = layout.in;
  }

  // Four weight rows at a time share each activation row load; each output is still its own
  // fixed-order dot product.
  constexpr int64_t kTile = 4;
  const int64_t tiles = (layout.out + kTile - 1) / kTile;
  cpu::parallel_for(tiles, 1, [&](int64_t tile_begin, int64_t tile_end) {
    const bool dense_f32 = layout.dtype == DType::kF32;
    static thread_local std::vector<float> buffer;
    if (!dense_f32 && buffer.size() < static_cast<size_t>(kTile * layout.in)) {
      buffer.resize(static_cast<size_t>(kTile * layout.in));
    }
    for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
      const int64_t n0 = tile * kTile;
      const int64_t count = std::min(kTile, layout.out - n0);
      const float* w[kTile];
      for (int64_t i = 0; i < count; ++i) {
        if (dense_f32) {
          w[i] = reinterpret_cast<const float*>(layout.bytes + (n0 + i) * layout.row_bytes);
        } else {
          dequantize_row(layout, n0 + i, buffer.data() + i * layout.in);
          w[i] = buffer.data() + i * layout.in;
        }
      }
      for (int64_t m = 0; m < rows; ++m) {
        const float* a = activations + m * activation_stride;
        float* y = o.row(m) + n0;
        for (int64_t i = 0; i < count; ++i) y[i] = cpu::dot(a, w[i], layout.in);
      }
    }
  });
}

// The reference is the per-group calls themselves, so the GPU's one launch is checked against
// exactly what the model ran before it.
void linear_pair(const TensorView& x, const LinearWeight& first, const TensorView& first_out,
                 const LinearWeight& second, const TensorView& second_out,
                 ActivationQuant activation_quant) {
  cpu::linear(x, first, first_out, activation_quant);
  cpu::linear(x, second, second_out, activation_quant);
}

bool linear_grouped_supports(const LinearWeight& weight, int64_t groups) {
  const TensorView& w = weight.weight;
  const TensorView& s = weight.scale;
  if (groups <= 0 || w.rank() != 2 || w.size(0) % groups != 0) return false;
  switch (w.dtype()) {
    case DType::kF32:
    case DType::kBF16:
      return s.numel() == 0;
    case DType::kF8E4M3:
      break;
    default:
      return false;
  }
  if (s.rank() != 2 || s.dtype() != DType::kF8E8M0) return false;
  const int64_t group_out = w.size(0) / groups;
  const int64_t block = scale_block_edge(w.size(0), s.size(0));
  if (block == 0 || scale_block_edge(w.size(1), s.size(1)) == 0 || group_out % block != 0) {
    return false;
  }
  // A group's own linear derives its block edge from its share of the scale rows again: it
  // must find the same edge, or a single block row (any edge then covers the whole group).
  const int64_t group_blocks = group_out / block;
  return group_blocks == 1 || scale_block_edge(group_out, group_blocks) == block;
}

void linear_grouped(const TensorView& x, const LinearWeight& weight, int64_t groups,
                    const TensorView& out) {
  if (groups <= 0 || weight.weight.rank() != 2 || x.rank() != 2 || out.rank() != 2 ||
      weight.out_features() % groups != 0 || x.size(1) != groups * weight.in_features() ||
      out.size(1) != weight.out_features()) {
    DI_THROW("linear_grouped shapes do not match: x ", x.to_string(), ", weight ",
             weight.weight.to_string(), ", groups ", groups, ", out ", out.to_string());
  }
  const WeightLayout layout = describe(weight);  // an fp8 weight's scale checked here
  const int64_t group_out = layout.out / groups;
  const int64_t group_in = layout.in;
  if (!cpu::linear_grouped_supports(weight, groups)) {
    DI_THROW("linear_grouped takes f32 or bf16 weights without a scale, or fp8 weights whose ",
             groups, " groups of ", group_out, " rows are each whole scale blocks; got weight ",
             weight.weight.to_string(), " with scale ", weight.scale.to_string(), " (",
             layout.block_out, "-row blocks)");
  }
  const bool scaled = layout.dtype == DType::kF8E4M3;
  const int64_t group_scale_rows = scaled ? group_out / layout.block_out : 0;
  for (int64_t g = 0; g < groups; ++g) {
    const LinearWeight group{
        weight.weight.narrow(0, g * group_out, group_out),
        scaled ? weight.scale.narrow(0, g * group_scale_rows, group_scale_rows) : TensorView()};
    cpu::linear(x.narrow(1, g * group_in, group_in), group, out.narrow(1, g * group_out, group_out),
                ActivationQuant::kNone);
  }
}

}  // namespace deepinfer::ops::cpu
