// Views as row-major matrices: the first dimension is the row, everything after it must be
// densely packed (so a row of [M, H, D] is H*D contiguous floats), rows may be strided.
#pragma once

#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace deepinfer::ops::cpu {

template <typename T>
struct Rows {
  T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements between row starts

  T* row(int64_t r) const { return data + r * stride; }
};

// Checks dtype, device and layout; `what` names the operand in the error.
template <typename T>
Rows<T> as_rows(const TensorView& view, const char* what) {
  DI_CHECK(view.device().is_cpu(), what, " is not in host memory");
  DI_CHECK(view.dtype() == DTypeOf<T>::value, what, " has dtype ", dtype_name(view.dtype()));
  DI_CHECK(view.rank() >= 1, what, " must have a row dimension");
  Rows<T> result;
  result.rows = view.size(0);
  result.cols = 1;
  int64_t expected_stride = 1;
  for (int d = view.rank() - 1; d >= 1; --d) {
    DI_CHECK(view.size(d) == 1 || view.stride(d) == expected_stride, what,
             " must be dense after its first dimension: ", view.to_string());
    expected_stride *= view.size(d);
    result.cols *= view.size(d);
  }
  result.stride = view.stride(0);
  result.data = result.rows * result.cols == 0 ? nullptr : view.data<T>();
  return result;
}

// A dense vector view (rank 1, or any dense shape) as a flat pointer.
template <typename T>
T* as_flat(const TensorView& view, const char* what) {
  DI_CHECK(view.device().is_cpu(), what, " is not in host memory");
  DI_CHECK(view.dtype() == DTypeOf<T>::value, what, " has dtype ", dtype_name(view.dtype()));
  DI_CHECK(view.is_contiguous(), what, " must be contiguous: ", view.to_string());
  return view.numel() == 0 ? nullptr : view.data<T>();
}

}  // namespace deepinfer::ops::cpu
