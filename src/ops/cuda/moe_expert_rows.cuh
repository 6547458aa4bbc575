// Where the routed experts' activation quantizers read their values: shared by the released
// per-32 quantizer (moe_grouped_gemm.cu) and the per-128 one of the wgmma prefill tile
// (moe_prefill_wgmma.cu), so both quantize the same floats.
#pragma once

#include <cstdint>

#include "ops/cuda/common.cuh"

namespace deepinfer::ops::cuda {

// Row p of the gathered input is row sorted_token[p] of x (row p itself without sorted_token);
// the intermediate is swiglu(gate, up) times the row's routing weight, computed as
// ops::cuda::swiglu computes it (moe.cu's swiglu_kernel: clamp, silu, product, row weight), so
// the codes equal those of quantizing that op's output. Rows from *placed on (left over by bad
// expert ids) are read by no GEMM and skipped; a null `placed` means every row.
struct ExpertRowsSource {
  deepinfer::cuda::DeviceRows<const float> x;
  const int32_t* sorted_token = nullptr;
  const float* gate = nullptr;  // [rows, cols] dense
  const float* up = nullptr;
  const float* sorted_weight = nullptr;
  float swiglu_limit = 0.0f;
  const int32_t* placed = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

template <bool kSwiglu>
__device__ __forceinline__ float expert_row_value(const ExpertRowsSource& source, int64_t row,
                                                  int64_t k) {
  if constexpr (kSwiglu) {
    float a = source.gate[row * source.cols + k];
    float b = source.up[row * source.cols + k];
    const float limit = source.swiglu_limit;
    if (limit > 0) {
      b = fminf(fmaxf(b, -limit), limit);
      a = fminf(a, limit);
    }
    const float y = a / (1.0f + expf(-a)) * b;
    return source.sorted_weight[row] * y;
  } else {
    const int64_t from = source.sorted_token != nullptr ? source.sorted_token[row] : row;
    return source.x.row(from)[k];
  }
}

// expert_row_value of K k .. k + 3 (k % 4 == 0, 16-byte aligned rows): the same expression an
// element, so the same bits, from float4 loads.
template <bool kSwiglu>
__device__ __forceinline__ float4 expert_row_values4(const ExpertRowsSource& source, int64_t row,
                                                     int64_t k) {
  if constexpr (kSwiglu) {
    const float4 gate = *reinterpret_cast<const float4*>(source.gate + row * source.cols + k);
    const float4 up = *reinterpret_cast<const float4*>(source.up + row * source.cols + k);
    const float weight = source.sorted_weight[row];
    const float limit = source.swiglu_limit;
    const auto one = [&](float a, float b) {
      if (limit > 0) {
        b = fminf(fmaxf(b, -limit), limit);
        a = fminf(a, limit);
      }
      const float y = a / (1.0f + expf(-a)) * b;
      return weight * y;
    };
    return make_float4(one(gate.x, up.x), one(gate.y, up.y), one(gate.z, up.z), one(gate.w, up.w));
  } else {
    const int64_t from = source.sorted_token != nullptr ? source.sorted_token[row] : row;
    return *reinterpret_cast<const float4*>(source.x.row(from) + k);
  }
}

// Whether expert_row_values4 may read `source` (float4 rows).
inline bool expert_rows_float4(const ExpertRowsSource& source) {
  if (source.cols % 4 != 0) return false;
  if (source.gate != nullptr || source.up != nullptr) {
    return aligned_to(source.gate, 16) && aligned_to(source.up, 16);
  }
  return aligned_to(source.x.data, 16) && source.x.stride % 4 == 0;
}

}  // namespace deepinfer::ops::cuda
