// Engram conditional memory: the table row gather (fp8 rows dequantized with their per-32
// scales) and the gated write into the hyper-connection streams.
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::ops::cuda {
namespace {

constexpr int kThreads = 256;

struct GatherArgs {
  const uint8_t* table;
  DType dtype;
  int64_t rows;
  int64_t dim;
  const uint8_t* scale;  // fp8: [rows, dim / block]
  int64_t scale_cols;
  int64_t block;
  const void* ids;
  bool ids64;
  int64_t tokens;
  int64_t columns;
  DeviceRows<float> out;
  int* error;
};

__global__ void engram_gather_kernel(GatherArgs args) {
  wait_for_prior_grids();
  allow_dependent_grids();
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t per_token = args.columns * args.dim;
  if (index >= args.tokens * per_token) return;
  const int64_t t = index / per_token;
  const int64_t c = (index % per_token) / args.dim;
  const int64_t d = index % args.dim;
  const int64_t flat = t * args.columns + c;
  const int64_t id = args.ids64 ? static_cast<const int64_t*>(args.ids)[flat]
                                : static_cast<const int32_t*>(args.ids)[flat];
  float value;
  if (id < 0 || id >= args.rows) {
    if (d == 0) deepinfer::cuda::record_error(args.error, deepinfer::cuda::kEngramIdOutOfBounds);
    value = __int_as_float(0x7fc00000);
  } else if (args.dtype == DType::kF32) {
    value = reinterpret_cast<const float*>(args.table)[id * args.dim + d];
  } else if (args.dtype == DType::kBF16) {
    value = deepinfer::cuda::bf16_to_float(
        reinterpret_cast<const uint16_t*>(args.table)[id * args.dim + d]);
  } else {
    value = deepinfer::cuda::e4m3_to_float(args.table[id * args.dim + d]) *
            deepinfer::cuda::e8m0_to_float(args.scale[id * args.scale_cols + d / args.block]);
  }
  args.out.row(t)[c * args.dim + d] = value;
}

// One block per (row, stream): three block reductions, then the gated add. Each thread writes
// only channels it read, so out may alias x.
__global__ void engram_mix_kernel(DeviceRows<const float> x, DeviceRows<const float> key,
                                  DeviceRows<const float> value, DeviceRows<const float> qk,
                                  int64_t hc, int64_t dim, float eps, DeviceRows<float> out) {
  __shared__ float scratch[32];
  wait_for_prior_grids();
  allow_dependent_grids();
  const int64_t m = blockIdx.x / hc;
  const int64_t s = blockIdx.x % hc;
  const float* hs = x.row(m) + s * dim;
  const float* ks = key.row(m) + s * dim;
  const float* ws = qk.row(s);
  float h_partial = 0.0f, k_partial = 0.0f, dot_partial = 0.0f;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    h_partial += hs[d] * hs[d];
    k_partial += ks[d] * ks[d];
    dot_partial += hs[d] * ws[d] * ks[d];
  }
  const float h_ms = deepinfer::cuda::block_sum(h_partial, scratch) / static_cast<float>(dim);
  const float k_ms = deepinfer::cuda::block_sum(k_partial, scratch) / static_cast<float>(dim);
  float dot = deepinfer::cuda::block_sum(dot_partial, scratch);
  const float rstd = (1.0f / sqrtf(h_ms + eps)) * (1.0f / sqrtf(k_ms + eps));
  dot = dot * rstd * (1.0f / sqrtf(static_cast<float>(dim)));
  const float root = sqrtf(fmaxf(fabsf(dot), 1e-6f));
  const float gate = 1.0f / (1.0f + expf(-copysignf(root, dot)));
  float* ys = out.row(m) + s * dim;
  const float* v = value.row(m);
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) ys[d] = hs[d] + gate * v[d];
}

}  // namespace

void engram_gather(const TensorView& table, const TensorView& scale, const TensorView& ids,
                   const TensorView& out) {
  DI_CHECK(table.rank() == 2 && table.is_contiguous() && table.device().is_cuda(), "engram table ",
           table.to_string());
  DI_CHECK(ids.rank() == 2 && ids.is_contiguous() && ids.device().is_cuda(), "engram ids ",
           ids.to_string());
  DI_CHECK(ids.dtype() == DType::kI32 || ids.dtype() == DType::kI64, "engram ids must be i32/i64");
  GatherArgs args{};
  args.table = static_cast<const uint8_t*>(table.raw_data());
  args.dtype = table.dtype();
  args.rows = table.size(0);
  args.dim = table.size(1);
  args.tokens = ids.size(0);
  args.columns = ids.size(1);
  args.ids = ids.raw_data();
  args.ids64 = ids.dtype() == DType::kI64;
  args.out = device_rows<float>(out, "engram gather output");
  DI_CHECK(args.out.rows == args.tokens && args.out.cols == args.columns * args.dim,
           "engram gather output ", out.to_string());
  switch (table.dtype()) {
    case DType::kF32:
    case DType::kBF16:
      break;
    case DType::kF8E4M3:
      DI_CHECK(scale.rank() == 2 && scale.size(0) == args.rows && scale.dtype() == DType::kF8E8M0 &&
                   scale.device().is_cuda() && scale.is_contiguous() && scale.size(1) > 0 &&
                   args.dim % scale.size(1) == 0,
               "engram scale ", scale.to_string(), " for table ", table.to_string());
      args.scale = static_cast<const uint8_t*>(scale.raw_data());
      args.scale_cols = scale.size(1);
      args.block = args.dim / scale.size(1);
      break;
    default:
      DI_THROW("engram tables of dtype ", dtype_name(table.dtype()), " are not supported");
  }
  args.error = deepinfer::cuda::kernel_error_word();
  const int64_t total = args.tokens * args.columns * args.dim;
  if (total == 0) return;
  launch_dependent(engram_gather_kernel, blocks_for(total, kThreads), kThreads, 0, current_stream(),
                   args);
}

void engram_mix(const TensorView& x, const TensorView& key, const TensorView& value,
                const TensorView& qk, float eps, const TensorView& out) {
  DI_CHECK(x.rank() == 3, "engram streams must be [M, hc, D]: ", x.to_string());
  const int64_t hc = x.size(1);
  const int64_t dim = x.size(2);
  const auto h = device_rows<const float>(x, "engram streams");
  const auto k = device_rows<const float>(key, "engram key");
  const auto v = device_rows<const float>(value, "engram value");
  const auto w = device_rows<const float>(qk, "engram qk weight");
  const auto o = device_rows<float>(out, "engram output");
  DI_CHECK(k.rows == h.rows && k.cols == hc * dim && v.rows == h.rows && v.cols == dim &&
               w.rows == hc && w.cols == dim && o.rows == h.rows && o.cols == hc * dim,
           "engram_mix shapes");
  if (h.rows * hc == 0) return;
  launch_dependent(engram_mix_kernel, static_cast<unsigned>(h.rows * hc), kThreads, 0,
                   current_stream(), h, k, v, w, hc, dim, eps, o);
}

}  // namespace deepinfer::ops::cuda
