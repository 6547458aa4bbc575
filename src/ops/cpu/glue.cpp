// The forward's data movement and small elementwise helpers (copy, fill, scale, add) on the host.
#include <algorithm>
#include <cstring>

#include "ops/cpu/rows.h"
#include "ops/ops.h"

namespace deepinfer::ops::cpu {
namespace {

// A view as rows of bytes: the first dimension is the row, the rest dense (any dtype, packed
// fp4 included).
struct ByteRows {
  std::byte* data = nullptr;
  int64_t rows = 0;
  size_t row_bytes = 0;
  int64_t pitch = 0;  // bytes between row starts
};

ByteRows byte_rows(const TensorView& view, const char* what) {
  DI_CHECK(view.device().is_cpu(), what, " is not in host memory: ", view.to_string());
  ByteRows result;
  if (view.numel() == 0) return result;
  if (view.is_contiguous()) {
    result.data = static_cast<std::byte*>(view.raw_data());
    result.rows = 1;
    result.row_bytes = view.nbytes();
    result.pitch = static_cast<int64_t>(result.row_bytes);
    return result;
  }
  DI_CHECK(view.rank() >= 2, what, " must be contiguous or rows: ", view.to_string());
  int64_t expected_stride = 1;
  int64_t cols = 1;
  for (int d = view.rank() - 1; d >= 1; --d) {
    DI_CHECK(view.size(d) == 1 || view.stride(d) == expected_stride, what,
             " must be dense after its first dimension: ", view.to_string());
    expected_stride *= view.size(d);
    cols *= view.size(d);
  }
  result.data = static_cast<std::byte*>(view.raw_data());
  result.rows = view.size(0);
  result.row_bytes = dtype_storage_bytes(view.dtype(), cols);
  result.pitch = static_cast<int64_t>(dtype_storage_bytes(view.dtype(), view.stride(0)));
  return result;
}

}  // namespace

void copy(const TensorView& src, const TensorView& dst) {
  if (src.dtype() != dst.dtype() || !(src.shape() == dst.shape())) {
    DI_THROW("copy needs equal dtype and shape: ", src.to_string(), " -> ", dst.to_string());
  }
  if (src.numel() == 0) return;
  const ByteRows from = byte_rows(src, "copy source");
  const ByteRows to = byte_rows(dst, "copy destination");
  // One side may be a single contiguous run: walk the other side's rows.
  const int64_t rows = std::max(from.rows, to.rows);
  const size_t row_bytes = std::min(from.row_bytes, to.row_bytes);
  DI_CHECK(static_cast<size_t>(rows) * row_bytes == dtype_storage_bytes(src.dtype(), src.numel()),
           "copy layouts disagree: ", src.to_string(), " -> ", dst.to_string());
  const int64_t from_pitch = from.rows == 1 ? static_cast<int64_t>(row_bytes) : from.pitch;
  const int64_t to_pitch = to.rows == 1 ? static_cast<int64_t>(row_bytes) : to.pitch;
  for (int64_t r = 0; r < rows; ++r) {
    std::memmove(to.data + r * to_pitch, from.data + r * from_pitch, row_bytes);
  }
}

void fill(const TensorView& x, float value) {
  const Rows<float> rows = as_rows<float>(x, "fill target");
  for (int64_t r = 0; r < rows.rows; ++r) std::fill_n(rows.row(r), rows.cols, value);
}

void scale(const TensorView& x, float factor, const TensorView& out) {
  const Rows<float> in = as_rows<float>(x, "scale input");
  const Rows<float> o = as_rows<float>(out, "scale output");
  DI_CHECK(in.rows == o.rows && in.cols == o.cols, "scale shapes ", x.to_string(), " -> ",
           out.to_string());
  for (int64_t r = 0; r < in.rows; ++r) {
    for (int64_t c = 0; c < in.cols; ++c) o.row(r)[c] = in.row(r)[c] * factor;
  }
}

void add(const TensorView& x, const TensorView& y, const TensorView& out) {
  const Rows<float> a = as_rows<float>(x, "add input");
  const Rows<float> b = as_rows<float>(y, "add input");
  const Rows<float> o = as_rows<float>(out, "add output");
  DI_CHECK(a.rows == b.rows && a.cols == b.cols && o.rows == a.rows && o.cols == a.cols,
           "add shapes ", x.to_string(), " + ", y.to_string(), " -> ", out.to_string());
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t c = 0; c < a.cols; ++c) o.row(r)[c] = a.row(r)[c] + b.row(r)[c];
  }
}

}  // namespace deepinfer::ops::cpu
