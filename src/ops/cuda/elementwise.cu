// embedding, rmsnorm, rope, softmax and the fake quantizers of the model's caches.
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_ops.h"

namespace deepinfer::ops::cuda {
namespace {

constexpr int kThreads = 256;

// An f32 or bf16 parameter vector in device memory (null data: absent, reads as 1).
struct ParameterVector {
  const void* data = nullptr;
  bool bf16 = false;
  __device__ float operator[](int64_t i) const {
    if (data == nullptr) return 1.0f;
    return bf16 ? deepinfer::cuda::bf16_to_float(static_cast<const uint16_t*>(data)[i])
                : static_cast<const float*>(data)[i];
  }
};

ParameterVector parameter_vector(const TensorView& v, int64_t length, const char* what) {
  if (v.numel() == 0) return {};
  DI_CHECK(v.rank() == 1 && v.size(0) == length && v.is_contiguous() && v.device().is_cuda(), what,
           " must be a contiguous device vector of ", length, ", got ", v.to_string());
  DI_CHECK(v.dtype() == DType::kF32 || v.dtype() == DType::kBF16, what, " must be f32 or bf16");
  return ParameterVector{v.raw_data(), v.dtype() == DType::kBF16};
}

__global__ void embedding_kernel(ParameterVector table, int64_t dim, const int32_t* ids,
                                 DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= out.rows * dim) return;
  const int64_t m = index / dim;
  const int64_t d = index % dim;
  out.row(m)[d] = table[static_cast<int64_t>(ids[m]) * dim + d];
}

// One block per row; each thread writes only elements it read, so out may alias x.
__global__ void rmsnorm_kernel(DeviceRows<const float> x, ParameterVector weight, float eps,
                               DeviceRows<float> out) {
  __shared__ float scratch[32];
  const float* a = x.row(blockIdx.x);
  float partial = 0.0f;
  // Unrolled so a thread's loads are in flight together (a decode row is one block: its time is
  // load latency); the sum keeps its order.
#pragma unroll 4
  for (int64_t d = threadIdx.x; d < x.cols; d += blockDim.x) partial += a[d] * a[d];
  const float mean_square =
      deepinfer::cuda::block_sum(partial, scratch) / static_cast<float>(x.cols);
  const float inv = 1.0f / sqrtf(mean_square + eps);
  float* y = out.row(blockIdx.x);
#pragma unroll 4
  for (int64_t d = threadIdx.x; d < x.cols; d += blockDim.x) y[d] = a[d] * inv * weight[d];
}

// The same block reduction as rmsnorm_kernel (thread t sums the squares of columns t, t + 256, ...
// in column order, then block_sum over the 256 threads), so the bits are the same; but every
// load of the row and the weight is issued before the first add, and the row stays in registers
// for the output. The loop above, with its run-time trip count, waits for one group of loads
// after another: at decode the row is one block, and that chain of memory latencies is its time.
// Launched as a dependent (launch_dependent): the weight, which no kernel writes, is loaded while
// the kernel before still runs; the row only after it.
template <int kPerThread>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_registers_kernel(DeviceRows<const float> x, ParameterVector weight, float eps,
                             DeviceRows<float> out) {
  __shared__ float scratch[32];
  float weights[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t d = threadIdx.x + static_cast<int64_t>(i) * kThreads;
    weights[i] = d < x.cols ? weight[d] : 0.0f;
  }
  wait_for_prior_grids();
  allow_dependent_grids();
  const float* a = x.row(blockIdx.x);
  float values[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t d = threadIdx.x + static_cast<int64_t>(i) * kThreads;
    values[i] = d < x.cols ? a[d] : 0.0f;
  }
  float partial = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    if (threadIdx.x + static_cast<int64_t>(i) * kThreads < x.cols) partial += values[i] * values[i];
  }
  const float mean_square =
      deepinfer::cuda::block_sum(partial, scratch) / static_cast<float>(x.cols);
  const float inv = 1.0f / sqrtf(mean_square + eps);
  float* y = out.row(blockIdx.x);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int64_t d = threadIdx.x + static_cast<int64_t>(i) * kThreads;
    if (d < x.cols) y[d] = values[i] * inv * weights[i];
  }
}

// false (or DEEPINFER_RMSNORM_REGISTERS=0): rmsnorm_kernel for every width.
RuntimeSwitch kRmsnormRegisters{"DEEPINFER_RMSNORM_REGISTERS", true};

// Launches rmsnorm_registers_kernel with the smallest instance that holds a row; false for rows
// wider than the largest (8192 columns), which take rmsnorm_kernel.
bool launch_rmsnorm_registers(DeviceRows<const float> in, ParameterVector w, float eps,
                              DeviceRows<float> o) {
  if (!kRmsnormRegisters.enabled()) return false;
  const int64_t per_thread = (in.cols + kThreads - 1) / kThreads;
  const dim3 grid(static_cast<unsigned>(in.rows));
  const auto launch = [&](auto kernel) {
    launch_dependent(kernel, grid, kThreads, 0, current_stream(), in, w, eps, o);
  };
  if (per_thread <= 2) {
    launch(rmsnorm_registers_kernel<2>);
  } else if (per_thread <= 4) {
    launch(rmsnorm_registers_kernel<4>);
  } else if (per_thread <= 8) {
    launch(rmsnorm_registers_kernel<8>);
  } else if (per_thread <= 16) {
    launch(rmsnorm_registers_kernel<16>);
  } else if (per_thread <= 20) {  // hidden 5120
    launch(rmsnorm_registers_kernel<20>);
  } else if (per_thread <= 32) {
    launch(rmsnorm_registers_kernel<32>);
  } else {
    return false;
  }
  return true;
}

// One thread per (row, pair, kRopeHeads heads); every head of the row turns by the same angle
// (a decode row's 64 heads in one thread's loop were a chain of dependent loads and stores).
// Launched as a dependent (launch_dependent): the frequency table (resident, written by no kernel)
// is read before the wait for the kernel before, the positions and rows after it.
constexpr int64_t kRopeHeads = 8;

__global__ void rope_kernel(DeviceRows<float> x, int64_t head_dim, int64_t heads, int rope_dim,
                            const int32_t* positions, const float* inv_freq, bool inverse) {
  const int pairs = rope_dim / 2;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = index < x.rows * pairs;
  const int64_t m = index / pairs;
  const int i = static_cast<int>(index % pairs);
  const float frequency = active ? inv_freq[i] : 0.0f;
  wait_for_prior_grids();
  allow_dependent_grids();
  if (!active) return;
  const int64_t first_head = static_cast<int64_t>(blockIdx.y) * kRopeHeads;
  const int64_t last_head = deepinfer::cuda::min64(heads, first_head + kRopeHeads);
  // As the reference: the f32 angle, its cosine and sine in double, rounded to f32.
  const float angle = static_cast<float>(positions[m]) * frequency;
  const float c = static_cast<float>(cos(static_cast<double>(angle)));
  const float s0 = static_cast<float>(sin(static_cast<double>(angle)));
  const float s = inverse ? -s0 : s0;
#pragma unroll 4
  for (int64_t h = first_head; h < last_head; ++h) {
    float* pair = x.row(m) + h * head_dim + (head_dim - rope_dim) + 2 * i;
    const float even = pair[0];
    const float odd = pair[1];
    pair[0] = even * c - odd * s;
    pair[1] = even * s + odd * c;
  }
}

__global__ void softmax_kernel(DeviceRows<float> x) {
  __shared__ float scratch[32];
  float* v = x.row(blockIdx.x);
  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < x.cols; j += blockDim.x) local_max = fmaxf(local_max, v[j]);
  const float max_value = deepinfer::cuda::block_max(local_max, scratch);
  float partial = 0.0f;
  for (int64_t j = threadIdx.x; j < x.cols; j += blockDim.x) {
    v[j] = expf(v[j] - max_value);
    partial += v[j];
  }
  const float sum = deepinfer::cuda::block_sum(partial, scratch);
  for (int64_t j = threadIdx.x; j < x.cols; j += blockDim.x) v[j] /= sum;
}

// One warp per block of `block` values.
__global__ void fake_quant_fp8_kernel(DeviceRows<float> x, int block, int64_t blocks_per_row) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (warp >= x.rows * blocks_per_row) return;
  float* v = x.row(warp / blocks_per_row) + (warp % blocks_per_row) * block;
  deepinfer::cuda::warp_fake_quant_fp8_block(v, v, block);
}

__global__ void fake_quant_fp4_kernel(DeviceRows<float> x, int block, int64_t blocks_per_row,
                                      bool e4m3_scale) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (warp >= x.rows * blocks_per_row) return;
  const int lane = threadIdx.x & 31;
  float* v = x.row(warp / blocks_per_row) + (warp % blocks_per_row) * block;
  float amax = 0.0f;
  for (int k = lane; k < block; k += 32) amax = fmaxf(amax, fabsf(v[k]));
  amax = deepinfer::cuda::warp_max(amax);
  const float scale =
      e4m3_scale ? deepinfer::cuda::round_to_e4m3(fmaxf(amax, 6.0f * 0x1p-9f) / 6.0f)
                 : deepinfer::cuda::pow2_ceil(fmaxf(amax, 6.0f * 0x1p-126f) * (1.0f / 6.0f));
  for (int k = lane; k < block; k += 32) {
    v[k] = deepinfer::cuda::round_to_e2m1(fminf(fmaxf(v[k] / scale, -6.0f), 6.0f)) * scale;
  }
}

}  // namespace

void embedding(const TensorView& table, std::span<const int32_t> ids, const TensorView& out) {
  DI_CHECK(table.rank() == 2 && table.is_contiguous() && table.device().is_cuda(),
           "embedding table ", table.to_string());
  if (table.dtype() != DType::kF32 && table.dtype() != DType::kBF16) {
    DI_THROW("embedding tables of dtype ", dtype_name(table.dtype()), " are not supported");
  }
  const DeviceRows<float> o = device_rows<float>(out, "embedding output");
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
  if (o.rows * dim == 0) return;
  StreamBuffer device_ids(ids.size_bytes());
  const int32_t* id_data = deepinfer::cuda::upload(device_ids, ids.data(), ids.size());
  const ParameterVector rows{table.raw_data(), table.dtype() == DType::kBF16};
  embedding_kernel<<<blocks_for(o.rows * dim, kThreads), kThreads, 0, current_stream()>>>(
      rows, dim, id_data, o);
  DI_CUDA_LAUNCHED(embedding_kernel);
}

void rmsnorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) {
  const auto in = device_rows<const float>(x, "rmsnorm input");
  const DeviceRows<float> o = device_rows<float>(out, "rmsnorm output");
  DI_CHECK(in.rows == o.rows && in.cols == o.cols, "rmsnorm shapes ", x.to_string(), " -> ",
           out.to_string());
  const ParameterVector w = parameter_vector(weight, in.cols, "rmsnorm weight");
  if (in.rows == 0) return;
  if (launch_rmsnorm_registers(in, w, eps, o)) return;
  rmsnorm_kernel<<<static_cast<unsigned>(in.rows), kThreads, 0, current_stream()>>>(in, w, eps, o);
  DI_CUDA_LAUNCHED(rmsnorm_kernel);
}

void rope(const TensorView& x, const TensorView& positions, const RopeTable& table, bool inverse) {
  const DeviceRows<float> rows = device_rows<float>(x, "rope input");
  DI_CHECK(positions.numel() == rows.rows, "rope: ", positions.to_string(), " positions for ",
           x.to_string());
  const int64_t head_dim = x.size(-1);
  const int64_t heads = rows.cols / head_dim;
  DI_CHECK(table.rope_dim <= head_dim, "rope_dim ", table.rope_dim, " exceeds head_dim ", head_dim);
  DI_CHECK(static_cast<int>(table.inv_freq.size()) * 2 == table.rope_dim, "rope table of ",
           table.inv_freq.size(), " frequencies for rope_dim ", table.rope_dim);
  const int pairs = table.rope_dim / 2;
  if (rows.rows == 0 || pairs == 0) return;
  const int32_t* pos = deepinfer::cuda::device_flat<const int32_t>(positions, "rope positions");
  const auto* freq = static_cast<const float*>(
      deepinfer::cuda::resident_copy(table.inv_freq.data(), table.inv_freq.size() * sizeof(float)));
  const int64_t head_blocks = (heads + kRopeHeads - 1) / kRopeHeads;
  DI_CHECK(head_blocks <= 65535, "rope: ", heads, " heads exceed one launch");
  launch_dependent(
      rope_kernel,
      dim3(blocks_for(rows.rows * pairs, kThreads), static_cast<unsigned>(head_blocks)), kThreads,
      0, current_stream(), rows, head_dim, heads, table.rope_dim, pos, freq, inverse);
}

void softmax_rows(const TensorView& x) {
  const DeviceRows<float> rows = device_rows<float>(x, "softmax input");
  if (rows.rows == 0 || rows.cols == 0) return;
  softmax_kernel<<<static_cast<unsigned>(rows.rows), kThreads, 0, current_stream()>>>(rows);
  DI_CUDA_LAUNCHED(softmax_kernel);
}

void fake_quant_fp8(const TensorView& x, int block) {
  const DeviceRows<float> rows = device_rows<float>(x, "fake_quant_fp8 input");
  DI_CHECK(block > 0, "fp8 block ", block);
  if (x.size(-1) % block != 0) return;  // unblockable shapes stay unquantized, as on the CPU
  const int64_t blocks_per_row = rows.cols / block;
  if (rows.rows * blocks_per_row == 0) return;
  fake_quant_fp8_kernel<<<blocks_for(rows.rows * blocks_per_row * 32, kThreads), kThreads, 0,
                          current_stream()>>>(rows, block, blocks_per_row);
  DI_CUDA_LAUNCHED(fake_quant_fp8_kernel);
}

void fake_quant_fp4(const TensorView& x, int block, Fp4ScaleFormat scale_format) {
  const DeviceRows<float> rows = device_rows<float>(x, "fake_quant_fp4 input");
  DI_CHECK(block > 0, "fp4 block ", block);
  if (x.size(-1) % block != 0) return;
  const int64_t blocks_per_row = rows.cols / block;
  if (rows.rows * blocks_per_row == 0) return;
  fake_quant_fp4_kernel<<<blocks_for(rows.rows * blocks_per_row * 32, kThreads), kThreads, 0,
                          current_stream()>>>(rows, block, blocks_per_row,
                                              scale_format == Fp4ScaleFormat::kE4m3);
  DI_CUDA_LAUNCHED(fake_quant_fp4_kernel);
}

}  // namespace deepinfer::ops::cuda
