// The forward's data movement and small elementwise helpers (copy, fill, scale, add) on the GPU.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::ops::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void fill_kernel(DeviceRows<float> x, float value) {
  wait_for_prior_grids();
  allow_dependent_grids();
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= x.rows * x.cols) return;
  x.row(index / x.cols)[index % x.cols] = value;
}

__global__ void scale_kernel(DeviceRows<const float> x, float factor, DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= x.rows * x.cols) return;
  const int64_t r = index / x.cols;
  const int64_t c = index % x.cols;
  out.row(r)[c] = x.row(r)[c] * factor;
}

__global__ void add_kernel(DeviceRows<const float> x, DeviceRows<const float> y,
                           DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= x.rows * x.cols) return;
  const int64_t r = index / x.cols;
  const int64_t c = index % x.cols;
  out.row(r)[c] = __fadd_rn(x.row(r)[c], y.row(r)[c]);
}

}  // namespace

void copy(const TensorView& src, const TensorView& dst) {
  deepinfer::cuda::copy(src, dst);
}

void fill(const TensorView& x, float value) {
  const auto rows = device_rows<float>(x, "fill target");
  if (rows.rows * rows.cols == 0) return;
  launch_dependent(fill_kernel, blocks_for(rows.rows * rows.cols, kThreads), kThreads, 0,
                   current_stream(), rows, value);
}

void scale(const TensorView& x, float factor, const TensorView& out) {
  const auto in = device_rows<const float>(x, "scale input");
  const auto o = device_rows<float>(out, "scale output");
  DI_CHECK(in.rows == o.rows && in.cols == o.cols, "scale shapes ", x.to_string(), " -> ",
           out.to_string());
  if (in.rows * in.cols == 0) return;
  scale_kernel<<<blocks_for(in.rows * in.cols, kThreads), kThreads, 0, current_stream()>>>(
      in, factor, o);
  DI_CUDA_LAUNCHED(scale_kernel);
}

void add(const TensorView& x, const TensorView& y, const TensorView& out) {
  const auto a = device_rows<const float>(x, "add input");
  const auto b = device_rows<const float>(y, "add input");
  const auto o = device_rows<float>(out, "add output");
  DI_CHECK(a.rows == b.rows && a.cols == b.cols && o.rows == a.rows && o.cols == a.cols,
           "add shapes ", x.to_string(), " + ", y.to_string(), " -> ", out.to_string());
  if (a.rows * a.cols == 0) return;
  add_kernel<<<blocks_for(a.rows * a.cols, kThreads), kThreads, 0, current_stream()>>>(a, b, o);
  DI_CUDA_LAUNCHED(add_kernel);
}

}  // namespace deepinfer::ops::cuda
