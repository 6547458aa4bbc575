// linear and dequantize_weight. Weights stay in their storage format in device memory and are
// dequantized while a tile is staged in shared memory; each output element accumulates K in
// ascending order inside one thread, so a row's result never depends on how many rows are in
// the call (batch invariance). FP8 weights with FP8 activations (linear_fp8_dense.cu, else
// linear_fp8_mma) and BF16 weights without activation quantization (linear_bf16_mma.cu) of
// aligned shapes run on the tensor cores instead.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "ops/batch_invariance.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/linear.cuh"
#include "ops/cuda/linear_cublaslt.h"
#include "ops/cuda/linear_fp8_dense.h"
#include "ops/cuda/moe_grouped_gemm.h"

namespace deepinfer::ops::cuda {
namespace {

using deepinfer::cuda::DeviceRows;

// decode_cluster_ranks' switch and limits (linear.cuh).
RuntimeSwitch kDecodeClusterK{"DEEPINFER_DECODE_CLUSTER_K", true};
RuntimeSetting kDecodeClusterBlocksPerSm{"DEEPINFER_DECODE_CLUSTER_BLOCKS_PER_SM", 4, 1, 64};
RuntimeSetting kDecodeClusterMinSliceBytes{"DEEPINFER_DECODE_CLUSTER_MIN_SLICE_BYTES", 256, 1,
                                           1 << 30};
constexpr int kMaxDecodeClusterRanks = 8;  // the portable cluster size
// decode_pdl_enabled's and dependent_launch_enabled's switches (common.cuh). The small kernels'
// dependent launches: before the decode tiles and the indexer read activations through L2
// (ld.global.cg) the GPU goldens' decode mode differed from prefill in 5 of 8 fixtures (H100,
// 2026-12-07, not reproducibly); after it they matched in three rounds of every fixture, and a
// b1 step took 2.96 ms against 3.10 off in the same call (docs/BENCHMARKS.md, thirteenth session).
RuntimeSwitch kDecodePdl{"DEEPINFER_DECODE_PDL", true};
RuntimeSwitch kDependentLaunch{"DEEPINFER_DEPENDENT_LAUNCH", true};

}  // namespace

bool decode_pdl_enabled() {
  return kDecodePdl.enabled();
}

bool dependent_launch_enabled() {
  return kDecodePdl.enabled() && kDependentLaunch.enabled();
}

bool dependent_launch_selected(const void* kernel) {
  static const char* const only = std::getenv("DEEPINFER_DEPENDENT_LAUNCH_ONLY");
  if (only == nullptr) return true;
  const char* name = nullptr;
  if (cudaFuncGetName(&name, kernel) != cudaSuccess || name == nullptr) return false;
  const std::string_view names(only);
  size_t start = 0;
  while (start <= names.size()) {
    const size_t comma = std::min(names.find(',', start), names.size());
    const std::string piece(names.substr(start, comma - start));
    if (!piece.empty() && std::strstr(name, piece.c_str()) != nullptr) return true;
    start = comma + 1;
  }
  return false;
}

int decode_cluster_ranks(int64_t blocks, int64_t k_units, int slices, int64_t unit_bytes) {
  if (ops::batch_invariant() || !kDecodeClusterK.enabled()) return 1;
  const int64_t target = static_cast<int64_t>(kDecodeClusterBlocksPerSm.value()) *
                         deepinfer::cuda::multiprocessor_count();
  int best = 1;
  for (int ranks = 2; ranks <= kMaxDecodeClusterRanks; ++ranks) {
    const int64_t cut = static_cast<int64_t>(slices) * ranks;
    if (k_units % cut != 0 || k_units / cut * unit_bytes < kDecodeClusterMinSliceBytes.value() ||
        blocks * ranks > target) {
      continue;
    }
    best = ranks;
  }
  return best;
}

DeviceWeight describe(const LinearWeight& weight) {
  const TensorView& w = weight.weight;
  DI_CHECK(w.rank() == 2 && w.device().is_cuda() && w.is_contiguous(),
           "linear weight must be a contiguous device matrix: ", w.to_string());
  DeviceWeight d;
  d.out = w.size(0);
  d.in = w.size(1);
  d.bytes = static_cast<const uint8_t*>(w.raw_data());
  d.row_bytes = static_cast<int64_t>(dtype_storage_bytes(w.dtype(), d.in));
  switch (w.dtype()) {
    case DType::kF32:
      d.kind = WeightKind::kF32;
      return d;
    case DType::kBF16:
      d.kind = WeightKind::kBF16;
      return d;
    case DType::kF8E4M3:
    case DType::kF4E2M1x2:
      break;
    default:
      DI_THROW("linear weights of dtype ", dtype_name(w.dtype()), " are not supported");
  }
  const TensorView& s = weight.scale;
  if (s.numel() == 0 || s.rank() != 2 || s.dtype() != DType::kF8E8M0 || !s.is_contiguous() ||
      !s.device().is_cuda()) {
    DI_THROW("a ", dtype_name(w.dtype()), " linear weight ", w.to_string(),
             " needs a contiguous 2-D ue8m0 device scale, got ", s.to_string());
  }
  d.scale = static_cast<const uint8_t*>(s.raw_data());
  d.scale_cols = s.size(1);
  if (w.dtype() == DType::kF4E2M1x2) {
    if (s.size(0) != d.out || d.in % s.size(1) != 0) {
      DI_THROW("fp4 weight ", w.to_string(), " has scale ", s.to_string(),
               "; expected [out, in / block]");
    }
    d.kind = WeightKind::kF4;
    d.block_out = 1;
    d.block_in = d.in / s.size(1);
    return d;
  }
  d.kind = WeightKind::kF8;
  d.block_out = scale_block_edge(d.out, s.size(0));
  d.block_in = scale_block_edge(d.in, s.size(1));
  if (d.block_out == 0 || d.block_in == 0) {
    DI_THROW("fp8 weight ", w.to_string(), " has scale grid ", s.to_string(),
             " that matches no block shape");
  }
  return d;
}

namespace {

// n < out and k < in, both far below 2^31 (checked by describe's callers' shapes): the scale
// index uses 32-bit divisions, a few instructions instead of a 64-bit division's subroutine.
__device__ __forceinline__ float weight_value(const DeviceWeight& w, int64_t n, int64_t k) {
  const uint8_t* row = w.bytes + n * w.row_bytes;
  const auto block_index = [](int64_t i, int64_t edge) {
    return static_cast<int64_t>(static_cast<uint32_t>(i) / static_cast<uint32_t>(edge));
  };
  switch (w.kind) {
    case WeightKind::kF32:
      return reinterpret_cast<const float*>(row)[k];
    case WeightKind::kBF16:
      return deepinfer::cuda::bf16_to_float(reinterpret_cast<const uint16_t*>(row)[k]);
    case WeightKind::kF8:
      return deepinfer::cuda::e4m3_to_float(row[k]) *
             deepinfer::cuda::e8m0_to_float(
                 w.scale[block_index(n, w.block_out) * w.scale_cols + block_index(k, w.block_in)]);
    case WeightKind::kF4: {
      const uint8_t byte = row[k >> 1];
      const uint8_t code = (k & 1) ? (byte >> 4) : (byte & 0xF);
      return deepinfer::cuda::e2m1_to_float(code) *
             deepinfer::cuda::e8m0_to_float(w.scale[n * w.scale_cols + block_index(k, w.block_in)]);
    }
  }
  return 0.0f;
}

constexpr int kTileK = 32;
constexpr int kGemmThreads = 256;

// A tile shape of linear_kernel: kTileM rows x kTileN outputs per block, kOutM x kOutN outputs
// per thread. Every shape computes each output as the same ascending FMA chain over K, so the
// launch may pick one by row count without changing any result (batch invariance holds).
template <int kTileMValue, int kTileNValue, int kOutMValue, int kOutNValue>
struct TileShape {
  static constexpr int kTileM = kTileMValue;
  static constexpr int kTileN = kTileNValue;
  static constexpr int kOutM = kOutMValue;
  static constexpr int kOutN = kOutNValue;
  static_assert((kTileM / kOutM) * (kTileN / kOutN) == kGemmThreads);
};
// Many rows: 64 x 64 tiles, 4 x 4 outputs a thread (register reuse of each staged value).
using WideTile = TileShape<64, 64, 4, 4>;
// Decode (at most 16 rows): 16 x 16 tiles, one output a thread, so an N-wide output gets N / 16
// blocks instead of N / 64 (wq_a at batch 1: 80 blocks on 132 SMs instead of 20).
using NarrowTile = TileShape<16, 16, 1, 1>;

template <typename Tile>
__global__ void __launch_bounds__(kGemmThreads)
    linear_kernel(DeviceRows<const float> x, DeviceWeight w, DeviceRows<float> out,
                  GemmGroups groups) {
  constexpr int kTileM = Tile::kTileM;
  constexpr int kTileN = Tile::kTileN;
  constexpr int kOutM = Tile::kOutM;
  constexpr int kOutN = Tile::kOutN;
  constexpr int kThreadsN = kTileN / kOutN;
  __shared__ float x_tile[kTileK][kTileM + 4];
  __shared__ float w_tile[kTileK][kTileN + 4];
  int64_t row_begin = 0;
  int64_t row_end = x.rows;
  if (groups.offsets != nullptr) {
    row_begin = groups.offsets[blockIdx.z];
    row_end = groups.offsets[blockIdx.z + 1];
    w = groups.weights[blockIdx.z];
  }
  const int64_t m0 = row_begin + static_cast<int64_t>(blockIdx.y) * kTileM;
  if (m0 >= row_end) return;  // the whole block: no thread reaches a barrier
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int tx = threadIdx.x % kThreadsN;
  const int ty = threadIdx.x / kThreadsN;
  float acc[kOutM][kOutN] = {};
  for (int64_t k0 = 0; k0 < w.in; k0 += kTileK) {
    for (int idx = threadIdx.x; idx < kTileM * kTileK; idx += kGemmThreads) {
      const int r = idx / kTileK;
      const int kk = idx % kTileK;
      const int64_t m = m0 + r;
      const int64_t k = k0 + kk;
      x_tile[kk][r] = (m < row_end && k < w.in) ? x.row(m)[k] : 0.0f;
    }
    for (int idx = threadIdx.x; idx < kTileN * kTileK; idx += kGemmThreads) {
      const int r = idx / kTileK;
      const int kk = idx % kTileK;
      const int64_t n = n0 + r;
      const int64_t k = k0 + kk;
      w_tile[kk][r] = (n < w.out && k < w.in) ? weight_value(w, n, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTileK; ++kk) {
      float a[kOutM], b[kOutN];
#pragma unroll
      for (int i = 0; i < kOutM; ++i) a[i] = x_tile[kk][ty * kOutM + i];
#pragma unroll
      for (int j = 0; j < kOutN; ++j) b[j] = w_tile[kk][tx * kOutN + j];
#pragma unroll
      for (int i = 0; i < kOutM; ++i) {
#pragma unroll
        for (int j = 0; j < kOutN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kOutM; ++i) {
    const int64_t m = m0 + ty * kOutM + i;
    if (m >= row_end) continue;
#pragma unroll
    for (int j = 0; j < kOutN; ++j) {
      const int64_t n = n0 + tx * kOutN + j;
      if (n < out.cols) out.row(m)[n] = acc[i][j];
    }
  }
}

template <typename Tile>
void launch_tiles(DeviceRows<const float> x, const DeviceWeight& shape, DeviceRows<float> out,
                  const GemmGroups& groups, int64_t rows) {
  const bool grouped = groups.offsets != nullptr;
  const dim3 grid(deepinfer::cuda::blocks_for(shape.out, Tile::kTileN),
                  deepinfer::cuda::blocks_for(rows, Tile::kTileM),
                  grouped ? static_cast<unsigned>(groups.count) : 1u);
  DI_CHECK(grid.y <= 65535 && grid.z <= 65535, "linear: ", rows, " rows or ", groups.count,
           " groups exceed one launch");
  linear_kernel<Tile>
      <<<grid, kGemmThreads, 0, deepinfer::cuda::current_stream()>>>(x, shape, out, groups);
  DI_CUDA_LAUNCHED(linear_kernel);
}

// The released numerics' activation quantizer: blocks of 32 along each row, a short last block
// where the row length is not a multiple of 32. One warp per block.
__global__ void quantize_activation_kernel(DeviceRows<const float> x, float* out,
                                           int64_t blocks_per_row) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (warp >= x.rows * blocks_per_row) return;
  const int64_t m = warp / blocks_per_row;
  const int64_t start = (warp % blocks_per_row) * 32;
  const int64_t length = deepinfer::cuda::min64(32, x.cols - start);
  deepinfer::cuda::warp_fake_quant_fp8_block(x.row(m) + start, out + m * x.cols + start, length);
}

__global__ void dequantize_kernel(DeviceWeight w, DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= w.out * w.in) return;
  const int64_t n = index / w.in;
  const int64_t k = index % w.in;
  out.row(n)[k] = weight_value(w, n, k);
}

}  // namespace

void dequantize_weight(const LinearWeight& weight, const TensorView& out) {
  if (out.dtype() == DType::kBF16) {
    if (weight.weight.dtype() == DType::kBF16) {
      DI_CHECK(out.shape() == weight.weight.shape() && out.is_contiguous() &&
                   weight.weight.is_contiguous(),
               "dequantize_weight output ", out.to_string(), " for weight ",
               weight.weight.to_string());
      DI_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), weight.weight.raw_data(), out.nbytes(),
                                    cudaMemcpyDeviceToDevice, deepinfer::cuda::current_stream()));
      return;
    }
    dequantize_fp8_weight_bf16(weight, out);
    return;
  }
  const DeviceWeight w = describe(weight);
  const DeviceRows<float> o = deepinfer::cuda::device_rows<float>(out, "dequantize_weight output");
  DI_CHECK(o.rows == w.out && o.cols == w.in, "dequantize_weight output shape ", out.to_string(),
           " for weight ", weight.weight.to_string());
  if (w.out * w.in == 0) return;
  constexpr int kThreads = 256;
  dequantize_kernel<<<deepinfer::cuda::blocks_for(w.out * w.in, kThreads), kThreads, 0,
                      deepinfer::cuda::current_stream()>>>(w, o);
  DI_CUDA_LAUNCHED(dequantize_kernel);
}

void linear(const TensorView& x, const LinearWeight& weight, const TensorView& out,
            ActivationQuant activation_quant) {
  const DeviceWeight w = describe(weight);
  DeviceRows<const float> in = deepinfer::cuda::device_rows<const float>(x, "linear input");
  const DeviceRows<float> o = deepinfer::cuda::device_rows<float>(out, "linear output");
  if (in.cols != w.in || o.cols != w.out || o.rows != in.rows) {
    DI_THROW("linear shapes do not match: x ", x.to_string(), ", weight ",
             weight.weight.to_string(), ", out ", out.to_string());
  }
  if (in.rows == 0 || w.out == 0) return;
  // Batch invariance off and enough rows: cuBLASLt on the same quantized operands
  // (linear_cublaslt.h); calls it does not take run the batch-invariant kernels below.
  if (linear_cublaslt_selected(in.rows) && try_linear_cublaslt(x, weight, out, activation_quant)) {
    return;
  }
  // The released FP8 roles: linear_fp8_dense.cu (K split at decode, shared-memory tile at
  // prefill) where it takes the weight, else linear_fp8_mma. false: always linear_fp8_mma.
  constexpr bool kUseFp8Dense = true;
  if (kUseFp8Dense && activation_quant == ActivationQuant::kFp8PerBlock32 &&
      linear_fp8_dense_supports(weight)) {
    linear_fp8_dense(x, weight, out);
    return;
  }
  if (activation_quant == ActivationQuant::kFp8PerBlock32 && fp8_mma_supports(w)) {
    linear_fp8_mma(x, weight, out);  // the released FP8 roles, on the tensor cores
    return;
  }
  if (activation_quant == ActivationQuant::kNone && bf16_mma_supports(w, in)) {
    launch_linear_bf16_mma(in, w, o);  // the BF16 roles (wo_a, gate, compressor), tensor cores
    return;
  }
  deepinfer::cuda::StreamBuffer quantized(activation_quant == ActivationQuant::kFp8PerBlock32
                                              ? static_cast<size_t>(in.rows * in.cols) *
                                                    sizeof(float)
                                              : 0);
  if (activation_quant == ActivationQuant::kFp8PerBlock32) {
    quantize_activation(in, quantized.as<float>());
    in = DeviceRows<const float>{quantized.as<float>(), in.rows, in.cols, in.cols};
  }
  launch_linear(in, w, o);
}

void linear_pair(const TensorView& x, const LinearWeight& first, const TensorView& first_out,
                 const LinearWeight& second, const TensorView& second_out,
                 ActivationQuant activation_quant) {
  // Where linear would take linear_fp8_dense for both weights (not cuBLASLt), the pair form: the
  // same kernels' bits, one quantizer and, at decode, one launch.
  if (activation_quant == ActivationQuant::kFp8PerBlock32 && x.rank() == 2 &&
      !linear_cublaslt_selected(x.size(0)) && linear_fp8_dense_supports(first) &&
      linear_fp8_dense_supports(second)) {
    linear_fp8_dense_pair(x, first, first_out, second, second_out);
    return;
  }
  cuda::linear(x, first, first_out, activation_quant);
  cuda::linear(x, second, second_out, activation_quant);
}

void quantize_activation(DeviceRows<const float> x, float* out) {
  if (x.rows * x.cols == 0) return;
  const int64_t blocks_per_row = (x.cols + 31) / 32;
  constexpr int kThreads = 256;
  quantize_activation_kernel<<<deepinfer::cuda::blocks_for(x.rows * blocks_per_row * 32, kThreads),
                               kThreads, 0, deepinfer::cuda::current_stream()>>>(x, out,
                                                                                 blocks_per_row);
  DI_CUDA_LAUNCHED(quantize_activation_kernel);
}

void launch_linear(DeviceRows<const float> x, const DeviceWeight& shape, DeviceRows<float> out,
                   const GemmGroups& groups) {
  const bool grouped = groups.offsets != nullptr;
  const int64_t rows = grouped ? groups.max_rows : x.rows;
  if (rows == 0 || shape.out == 0 || (grouped && groups.count == 0)) return;
  if (rows <= NarrowTile::kTileM) {
    launch_tiles<NarrowTile>(x, shape, out, groups, rows);
  } else {
    launch_tiles<WideTile>(x, shape, out, groups, rows);
  }
}

}  // namespace deepinfer::ops::cuda
