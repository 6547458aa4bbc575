// ops::cuda::linear's batch-variant path (linear_cublaslt.h): the dense roles as cuBLASLt BF16 x
// BF16 -> FP32 GEMMs on the quantized operands of the invariant kernels. Two independent choices
// make a call: where the bf16 weight comes from (a bf16 weight itself, or an fp8 one's exact
// dequantization: its bf16 copy or staged on every call) and what the activation becomes (the
// FP8 roles' per-32 quantization as one bf16 term, or the BF16 roles' f32 activation as bf16
// terms), so an fp8 weight without activation quantization (the grouped wo_a as released) runs as
// a BF16 role on the same operands as its dense bf16 form.
//
// Why BF16 GEMMs and not FP8 ones: SM90 cuBLASLt has no 32x32 block scales, so an FP8 GEMM would
// need a per-tensor scale, i.e. different operands. Every operand here is exactly representable
// in bf16 instead: an e4m3 weight times its power-of-two block scale (4 significand bits), the
// released quantizer's e4m3-times-2^s activations, and the three bf16 terms of an f32 activation
// (8 + 8 + 8 significand bits). bf16 x bf16 products are exact in FP32, so the results equal the
// invariant kernels' up to the order of FP32 additions (the BF16 roles take two of the three terms
// by default: DEEPINFER_CUBLASLT_BF16_TERMS below says what that costs).
#include "ops/cuda/linear_cublaslt.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/batch_invariance.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/linear.cuh"
#include "ops/cuda/runtime_switch.h"

#define DI_CUBLASLT_CHECK(expression)                                                            \
  do {                                                                                           \
    if (const cublasStatus_t di_cublas_status = (expression);                                    \
        di_cublas_status != CUBLAS_STATUS_SUCCESS) {                                             \
      DI_THROW("cuBLASLt error in ", #expression, ": ", cublasLtGetStatusName(di_cublas_status), \
               " (", cublasLtGetStatusString(di_cublas_status), ")");                            \
    }                                                                                            \
  } while (false)

namespace deepinfer::ops::cuda {
namespace {

using deepinfer::cuda::StreamHandle;

// DEEPINFER_CUBLASLT_MIN_ROWS: calls with at least this many rows take the path when batch
// invariance is off (0: never). Measured on the H200
// (docs/BENCHMARKS.md, "Batch invariance off"): at 16 rows the invariant kernels are up to 2.5x
// faster (the path dequantizes an FP8 weight to bf16 on every call), at 64 rows the path ties
// (wkv, wq_b, indexer wq_b) or wins (up to 5x, wo_a), from 128 rows it wins for every role.
deepinfer::cuda::RuntimeSetting kCublasLtMinRows{"DEEPINFER_CUBLASLT_MIN_ROWS", 65, 0, 1 << 30};

// DEEPINFER_CUBLASLT_BF16_STACKED_MAX_ROWS: BF16 calls of at most this many rows (0: none) run
// their activation terms as one GEMM of terms x M rows into staging, then add the row blocks in
// term order (hi + mid, then + lo), instead of one GEMM a term accumulating into the output: the
// weight is read once instead of once a term, at the price of staging terms x M N floats and one
// more pass. Measured (H200, docs/BENCHMARKS.md, "Batch invariance off"): stacked is up to 2x
// faster at 64-256 rows (the GEMMs there are bound by reading the weight), the three GEMMs up to 8%
// faster from 1024 rows (wo_a).
deepinfer::cuda::RuntimeSetting kBf16StackedMaxRows{"DEEPINFER_CUBLASLT_BF16_STACKED_MAX_ROWS", 512,
                                                    0, 1 << 30};

// cuBLASLt's own scratch per (device, stream): the heuristic may only pick algorithms that fit.
constexpr size_t kCublasWorkspaceBytes = 32ull << 20;
// The bf16 activations of one GEMM call: larger calls run in row chunks (wo_a's 8 x 4096 columns
// at three terms are 192 KiB a row, so 8192 rows would stage 1.5 GiB).
constexpr size_t kActivationBudgetBytes = 256ull << 20;
constexpr int64_t kChunkRowMultiple = 128;  // chunk edges on the GEMMs' tile edges
constexpr int kThreads = 256;
constexpr int kValuesPerThread = 8;       // two float4 in, one 16-byte word of bf16 out per term
constexpr int kExactActivationTerms = 3;  // bf16 terms of an f32 activation that hold it exactly

// DEEPINFER_CUBLASLT_BF16_TERMS: the bf16 terms of an f32 activation the BF16 roles multiply (2
// or 3). Three hold x exactly (every product exact, only the FP32 summation order differs from the
// CPU). Two drop the third term, at most 2^-18 |x| an element (hi = bf16(x) leaves <= 2^-9 |x|,
// its bf16 leaves <= 2^-9 of that): about what an FP32 sum over K of a few thousand products
// already differs by between two orders, so the results stay within the exact-product tests'
// bound (kExactProductsTolerance, 2e-5 of the output's scale; measured 2.4e-6 .. 3.5e-6 on the
// V4.1 shapes, docs/BENCHMARKS.md), for two thirds of the GEMM work: the BF16 roles are where the
// path is compute bound (the LM head at 256 rows is three 0.45 ms GEMMs, wo_a in prefill three
// 0.7 ms ones). One term (peers' bf16 activations, 2^-9 |x|) is outside that bound: not offered.
deepinfer::cuda::RuntimeSetting kBf16ActivationTerms{"DEEPINFER_CUBLASLT_BF16_TERMS", 2, 2,
                                                     kExactActivationTerms};

// ---- kernels ---------------------------------------------------------------------------------

// Two floats -> bf16x2 (round to nearest even; exact for every value staged here), `low` in
// bits 0-15 (the lower address).
__device__ __forceinline__ uint32_t pack_bf16x2(float low, float high) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}

__device__ __forceinline__ void load_eight(const float* source, float (&v)[kValuesPerThread]) {
  const float4 first = reinterpret_cast<const float4*>(source)[0];
  const float4 second = reinterpret_cast<const float4*>(source)[1];
  v[0] = first.x;
  v[1] = first.y;
  v[2] = first.z;
  v[3] = first.w;
  v[4] = second.x;
  v[5] = second.y;
  v[6] = second.z;
  v[7] = second.w;
}

// The released activation quantizer (quantize_activation_kernel's warp_fake_quant_fp8_block:
// e4m3 of v / s times s, s the ue8m0 scale of the 32-block's amax) on rows [first_row, first_row
// + rows) of x, written as bf16 [rows, x.cols] (the values are e4m3 x 2^s: exact). x.cols % 32 ==
// 0; four consecutive threads hold one 32-block (8 values each) and share its amax through two
// shuffles. The amax is a max over the same 32 values, so the scale and every value equal the
// reference's bit for bit.
__global__ void __launch_bounds__(kThreads)
    quantize_activation_bf16_kernel(DeviceRows<const float> x, int64_t first_row, uint32_t words,
                                    uint4* out) {
  // 32-bit index math (the host checks words < 2^31): a 64-bit division costs more than the rest.
  const auto words_per_row = static_cast<uint32_t>(x.cols / kValuesPerThread);
  const uint32_t index = blockIdx.x * blockDim.x + threadIdx.x;
  // Threads past the end still shuffle (their whole quad is past it: words is a multiple of 4),
  // so every lane of the warp reaches the shuffles.
  const bool active = index < words;
  float v[kValuesPerThread] = {};
  if (active) {
    const uint32_t m = index / words_per_row;
    const uint32_t word = index - m * words_per_row;
    load_eight(x.row(first_row + m) + word * kValuesPerThread, v);
  }
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kValuesPerThread; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  if (!active) return;
  const float scale = deepinfer::cuda::fp8_block_scale(amax);
  float q[kValuesPerThread];
#pragma unroll
  for (int i = 0; i < kValuesPerThread; ++i) q[i] = deepinfer::cuda::fp8_fake_quant(v[i], scale);
  out[index] = make_uint4(pack_bf16x2(q[0], q[1]), pack_bf16x2(q[2], q[3]), pack_bf16x2(q[4], q[5]),
                          pack_bf16x2(q[6], q[7]));
}

// Rows [first_row, first_row + rows) of f32 x as kTerms bf16 planes [rows, x.cols], `plane_words`
// 16-byte words apart: term 0 = bf16(x), term t = bf16 of what terms 0..t-1 left (each remainder
// exact in f32), linear_bf16_mma's split_pair. At three terms their sum is x exactly unless a
// remainder underflows bf16's range.
template <int kTerms>
__global__ void __launch_bounds__(kThreads)
    split_activation_terms_kernel(DeviceRows<const float> x, int64_t first_row, uint32_t words,
                                  uint4* out, int64_t plane_words) {
  const auto words_per_row = static_cast<uint32_t>(x.cols / kValuesPerThread);
  const uint32_t index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index >= words) return;
  const uint32_t m = index / words_per_row;
  const uint32_t word = index - m * words_per_row;
  float v[kValuesPerThread];
  load_eight(x.row(first_row + m) + word * kValuesPerThread, v);
  uint32_t pairs[kTerms][kValuesPerThread / 2];
#pragma unroll
  for (int t = 0; t < kTerms; ++t) {
#pragma unroll
    for (int p = 0; p < kValuesPerThread / 2; ++p) {
      const uint32_t packed = pack_bf16x2(v[2 * p], v[2 * p + 1]);
      pairs[t][p] = packed;
      v[2 * p] -= __uint_as_float(packed << 16);
      v[2 * p + 1] -= __uint_as_float(packed & 0xFFFF0000u);
    }
  }
#pragma unroll
  for (int t = 0; t < kTerms; ++t) {
    out[t * plane_words + index] = make_uint4(pairs[t][0], pairs[t][1], pairs[t][2], pairs[t][3]);
  }
}

void launch_split_activation_terms(int terms, DeviceRows<const float> x, int64_t first_row,
                                   uint32_t words, uint4* out, int64_t plane_words,
                                   StreamHandle stream) {
  const unsigned blocks = blocks_for(words, kThreads);
  if (terms == 2) {
    split_activation_terms_kernel<2>
        <<<blocks, kThreads, 0, stream>>>(x, first_row, words, out, plane_words);
  } else {
    split_activation_terms_kernel<kExactActivationTerms>
        <<<blocks, kThreads, 0, stream>>>(x, first_row, words, out, plane_words);
  }
  DI_CUDA_LAUNCHED(split_activation_terms_kernel);
}

// out[r][c] = (products[r][c] + products[rows + r][c]) (+ products[2 rows + r][c]): the stacked
// GEMM's `terms` term blocks [terms rows, cols] (contiguous) added in term order.
__global__ void __launch_bounds__(kThreads)
    sum_term_products_kernel(const float* products, int64_t rows, int terms,
                             DeviceRows<float> out) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= rows * out.cols) return;
  const int64_t r = index / out.cols;
  const int64_t c = index % out.cols;
  const int64_t plane = rows * out.cols;
  float sum = products[index] + products[plane + index];
  if (terms == kExactActivationTerms) sum += products[2 * plane + index];
  out.row(r)[c] = sum;
}

// The fp8 weight as bf16 [w.out, w.in]: e4m3 x its block's ue8m0 scale, exact in f32 (a power of
// two) and in bf16 (4 significand bits) for every scale a checkpoint uses (values below 2^-133,
// bf16's smallest subnormal, would round: scale codes under 2^-124). 8 weights a thread, one
// scale (block_in % 8 == 0), `words` = w.out * w.in / 8 < 2^31 (checked by the host).
__global__ void __launch_bounds__(kThreads)
    dequantize_fp8_weight_bf16_kernel(DeviceWeight w, uint32_t words, uint4* out) {
  const auto words_per_row = static_cast<uint32_t>(w.in / kValuesPerThread);
  const uint32_t index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index >= words) return;
  const uint32_t n = index / words_per_row;
  const uint32_t k0 = (index - n * words_per_row) * kValuesPerThread;
  const uint2 codes = *reinterpret_cast<const uint2*>(w.bytes + n * w.row_bytes + k0);
  const float scale = deepinfer::cuda::e8m0_to_float(
      w.scale[(n / static_cast<uint32_t>(w.block_out)) * static_cast<uint32_t>(w.scale_cols) +
              k0 / static_cast<uint32_t>(w.block_in)]);
  uint32_t packed[kValuesPerThread / 2];
#pragma unroll
  for (int p = 0; p < kValuesPerThread / 2; ++p) {
    const float2 pair =
        deepinfer::cuda::e4m3x2_to_float2((p < 2 ? codes.x : codes.y) >> (16 * (p % 2)));
    packed[p] = pack_bf16x2(pair.x * scale, pair.y * scale);
  }
  out[index] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

void launch_dequantize_fp8_weight_bf16(const DeviceWeight& w, void* out, StreamHandle stream) {
  const int64_t words = w.out * w.in / kValuesPerThread;
  dequantize_fp8_weight_bf16_kernel<<<blocks_for(words, kThreads), kThreads, 0, stream>>>(
      w, static_cast<uint32_t>(words), static_cast<uint4*>(out));
  DI_CUDA_LAUNCHED(dequantize_fp8_weight_bf16_kernel);
}

// ---- per-device and per-stream state --------------------------------------------------------

bool stream_is_capturing(StreamHandle stream);

// Device memory that only grows. Growth waits for the stream that uses the buffer (work queued
// before may still read the old one) and then frees it: a one-time host wait per new largest
// shape, never on a call that fits. While the stream records a CUDA graph nothing may grow (a
// capture cannot wait for its stream): reserve returns null and the caller falls back. A buffer a
// recording used is never freed: the graph's kernels hold its address for as long as the graph
// lives, so growth after that retires the old buffer instead (and grows at least twofold, which
// bounds the retired ones to the current capacity).
class GrowOnlyBuffer {
 public:
  GrowOnlyBuffer() = default;
  GrowOnlyBuffer(const GrowOnlyBuffer&) = delete;
  GrowOnlyBuffer& operator=(const GrowOnlyBuffer&) = delete;
  ~GrowOnlyBuffer() = default;  // kept for the process's life (see Staging)

  void* reserve(size_t bytes, StreamHandle stream) {
    const bool capturing = stream_is_capturing(stream);
    if (bytes <= capacity_) {
      recorded_ = recorded_ || capturing;
      return data_;
    }
    if (capturing) return nullptr;
    size_t least = bytes;
    if (data_ != nullptr && recorded_) {
      retired_.push_back(data_);
      least = std::max(bytes, 2 * capacity_);
    } else if (data_ != nullptr) {
      DI_CUDA_CHECK(cudaStreamSynchronize(stream));
      DI_CUDA_CHECK(cudaFree(data_));
    }
    data_ = nullptr;
    capacity_ = 0;
    recorded_ = false;
    constexpr size_t kGranule = 2ull << 20;  // fewer regrowths for slowly growing row counts
    const size_t rounded = (least + kGranule - 1) / kGranule * kGranule;
    DI_CUDA_CHECK(cudaMalloc(&data_, rounded));
    capacity_ = rounded;
    return data_;
  }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
  bool recorded_ = false;       // a graph recorded a call that used data_
  std::vector<void*> retired_;  // smaller buffers recordings used: never freed
};

// What one stream's calls stage: kept per (device, stream) so that two streams never share a
// buffer (cuBLASLt asks the same of its workspace). Kept for the process's life.
struct Staging {
  GrowOnlyBuffer cublas_workspace;  // kCublasWorkspaceBytes, reserved on first use
  GrowOnlyBuffer weight;            // an fp8 weight dequantized to bf16 (without a bf16 copy)
  GrowOnlyBuffer activation;        // the bf16 activation (FP8) or its terms (BF16)
  GrowOnlyBuffer term_products;     // the stacked BF16 GEMM's [terms M, N] f32 results
};

// A GEMM D = op(A) op(B) in cuBLASLt's column-major terms: out^T [n, m] (ld_d) = W [n, k] (A,
// column-major k x n, transposed) times x^T [k, m] (B, column-major k x m, ld_b), `batch` times
// with the given element strides, bf16 x bf16 -> f32, FP32 compute. Alignments are of the
// pointers the calls will pass (the heuristic must exclude algorithms that need more).
struct GemmShape {
  int device = 0;
  cudaDataType_t operands = CUDA_R_16BF;  // A's and B's type (D is f32)
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t ld_a = 0;  // 0: k (a contiguous weight)
  int64_t ld_b = 0, ld_d = 0;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;
  int64_t align_a = 0, align_b = 0, align_d = 0;
  auto key() const {
    return std::tie(device, operands, m, n, k, batch, ld_a, ld_b, ld_d, stride_a, stride_b,
                    stride_d, align_a, align_b, align_d);
  }
  bool operator<(const GemmShape& other) const { return key() < other.key(); }
};

// One shape's descriptors and the heuristic's algorithm (found false: cuBLASLt has none; kept
// too, so the heuristic is asked once per shape).
class GemmPlan {
 public:
  GemmPlan(cublasLtHandle_t handle, const GemmShape& s) {
    DI_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    DI_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                                     sizeof(transpose)));
    DI_CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
    DI_CUBLASLT_CHECK(
        cublasLtMatrixLayoutCreate(&a_, s.operands, s.k, s.n, s.ld_a != 0 ? s.ld_a : s.k));
    DI_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&b_, s.operands, s.k, s.m, s.ld_b));
    DI_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&d_, CUDA_R_32F, s.n, s.m, s.ld_d));
    if (s.batch > 1) {
      const auto count = static_cast<int32_t>(s.batch);
      for (auto [layout, stride] :
           {std::pair{a_, s.stride_a}, std::pair{b_, s.stride_b}, std::pair{d_, s.stride_d}}) {
        DI_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(
            layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
        DI_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(
            layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
      }
    }
    cublasLtMatmulPreference_t preference = nullptr;
    DI_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t workspace = kCublasWorkspaceBytes;
    const auto align_a = static_cast<uint32_t>(s.align_a);
    const auto align_b = static_cast<uint32_t>(s.align_b);
    const auto align_d = static_cast<uint32_t>(s.align_d);
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
    for (auto [attribute, value] :
         {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a},
          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b},
          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d},
          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d}}) {
      if (status == CUBLAS_STATUS_SUCCESS) {
        status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, value, sizeof(*value));
      }
    }
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatmulAlgoGetHeuristic(handle, desc_, a_, b_, d_, d_, preference, 1, &result,
                                              &found);
    }
    cublasLtMatmulPreferenceDestroy(preference);
    found_ = status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    algo_ = result.algo;
  }
  ~GemmPlan() {
    cublasLtMatrixLayoutDestroy(a_);
    cublasLtMatrixLayoutDestroy(b_);
    cublasLtMatrixLayoutDestroy(d_);
    cublasLtMatmulDescDestroy(desc_);
  }
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  bool found() const { return found_; }

  // d = a . b (+ d when accumulate), on `stream`.
  void run(cublasLtHandle_t handle, const void* a, const void* b, float* d, bool accumulate,
           void* workspace, StreamHandle stream) const {
    const float alpha = 1.0f;
    const float beta = accumulate ? 1.0f : 0.0f;
    DI_CUBLASLT_CHECK(cublasLtMatmul(handle, desc_, &alpha, a, a_, b, b_, &beta, d, d_, d, d_,
                                     &algo_, workspace, kCublasWorkspaceBytes, stream));
  }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  bool found_ = false;
};

// Plans kept per shape. Prefill row counts vary per step, so the cache is bounded: past
// kMaxPlans it starts over (a call holds its plans by shared_ptr, so clearing is safe while
// another thread runs one).
constexpr size_t kMaxPlans = 1024;

class CublasLtState {
 public:
  static CublasLtState& instance() {
    static CublasLtState* state = new CublasLtState();  // never destroyed: outlives every call
    return *state;
  }

  cublasLtHandle_t handle(int device) {
    std::lock_guard lock(mutex_);
    return handle_locked(device);
  }

  Staging& staging(int device, StreamHandle stream) {
    std::lock_guard lock(mutex_);
    std::unique_ptr<Staging>& entry = staging_[{device, stream}];
    if (entry == nullptr) entry = std::make_unique<Staging>();
    return *entry;
  }

  std::shared_ptr<const GemmPlan> plan(const GemmShape& shape) {
    std::lock_guard lock(mutex_);
    const auto found = plans_.find(shape);
    if (found != plans_.end()) return found->second;
    if (plans_.size() >= kMaxPlans) plans_.clear();
    auto plan = std::make_shared<const GemmPlan>(handle_locked(shape.device), shape);
    plans_.emplace(shape, plan);
    return plan;
  }

 private:
  cublasLtHandle_t handle_locked(int device) {
    cublasLtHandle_t& handle = handles_[device];
    if (handle == nullptr) DI_CUBLASLT_CHECK(cublasLtCreate(&handle));
    return handle;
  }

  std::mutex mutex_;
  std::map<int, cublasLtHandle_t> handles_;  // one per device, never destroyed
  std::map<std::pair<int, StreamHandle>, std::unique_ptr<Staging>> staging_;
  std::map<GemmShape, std::shared_ptr<const GemmPlan>> plans_;
};

// The largest power of two dividing every value (bytes), at most 256 (cuBLASLt's default).
int64_t common_alignment(std::initializer_list<int64_t> values) {
  uint64_t bits = 256;
  for (int64_t v : values) bits |= static_cast<uint64_t>(v);
  return static_cast<int64_t>(bits & (~bits + 1));
}

int64_t address(const void* pointer) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(pointer));
}

bool stream_is_capturing(StreamHandle stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; asking is refused only around a capture
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

int linear_cublaslt_min_rows() {
  return kCublasLtMinRows.value();
}

bool linear_cublaslt_selected(int64_t rows) {
  if (ops::batch_invariant()) return false;
  const int min_rows = kCublasLtMinRows.value();
  return min_rows > 0 && rows >= min_rows;
}

bool try_linear_cublaslt(const TensorView& x, const LinearWeight& weight, const TensorView& out,
                         ActivationQuant activation_quant, int64_t groups) {
  const DeviceWeight w = describe(weight);
  const DeviceRows<const float> in = device_rows<const float>(x, "linear input");
  const DeviceRows<float> o = device_rows<float>(out, "linear output");
  if (groups < 1 || w.out % groups != 0 || in.cols != groups * w.in || o.cols != w.out ||
      o.rows != in.rows) {
    DI_THROW("linear shapes do not match: x ", x.to_string(), ", weight ",
             weight.weight.to_string(), ", groups ", groups, ", out ", out.to_string());
  }
  // Group g reads rows [g N / groups, ...) of the whole weight's dequantization: the groups must
  // be whole scale blocks for that to be linear_grouped's per-group weights.
  if (groups > 1 && activation_quant == ActivationQuant::kNone && w.kind == WeightKind::kF8 &&
      !ops::linear_grouped_supports(weight, groups)) {
    DI_THROW("linear_grouped: ", groups, " groups of fp8 weight ", weight.weight.to_string(),
             " with scale ", weight.scale.to_string(), " are not whole scale blocks of ",
             w.block_out, " rows");
  }
  if (in.rows == 0 || w.out == 0) return true;
  // The kernels index 16-byte words with 32-bit math; FP8 scale blocks span whole words.
  constexpr int64_t kMaxWords = int64_t{1} << 31;
  // The GEMM's A is the weight as bf16: an fp8 weight's exact dequantization (its bf16 copy, or
  // staged on every call), or a bf16 weight itself.
  const bool dequantized_weight = w.kind == WeightKind::kF8;
  const bool weight_fits = dequantized_weight
                               ? aligned_to(w.bytes, 8) && w.block_in % kValuesPerThread == 0 &&
                                     w.out * w.in / kValuesPerThread < kMaxWords
                               : w.kind == WeightKind::kBF16 && aligned_to(w.bytes, 16);
  // The role, i.e. what B is: the FP8 roles' activation quantized per 32 (one bf16 term; fp8
  // weights only), the BF16 roles' f32 activation as bf16 terms (bf16 weights, and the grouped
  // fp8 wo_a, whose dense form is a bf16 weight). A dense fp8 weight without activation
  // quantization (the dense numerics' FP8 roles) stays on the other kernels: on this path its
  // two truncated terms moved the tiny model's logits 3.9e-5 from the CPU's against the 1e-5 the
  // dense numerics hold (model_gpu_forward_test, H100 2026-12-07 22:44).
  const bool fp8 =
      activation_quant == ActivationQuant::kFp8PerBlock32 && dequantized_weight && groups == 1;
  const bool bf16 =
      activation_quant == ActivationQuant::kNone && (!dequantized_weight || groups > 1);
  if (!weight_fits || (!fp8 && !bf16)) return false;
  // The model's exact bf16 copy of an fp8 weight, where it made one (cuBLASLt's A alignment below
  // is 256 bytes for dequantized weights: the copy's allocation must be too).
  const void* copy = nullptr;
  if (dequantized_weight && weight.bf16_copy.numel() != 0) {
    const TensorView& c = weight.bf16_copy;
    DI_CHECK(c.dtype() == DType::kBF16 && c.rank() == 2 && c.is_contiguous() &&
                 c.size(0) == w.out && c.size(1) == w.in && c.device() == weight.weight.device(),
             "bf16_copy ", c.to_string(), " does not match the weight ", weight.weight.to_string());
    if (aligned_to(c.raw_data(), 256)) copy = c.raw_data();
  }
  // 16-byte rows for the staging kernels' float4 loads and the GEMM's f32 output.
  if (w.in % 32 != 0 || !aligned_to(in.data, 16) || in.stride % 4 != 0 || !aligned_to(o.data, 16) ||
      o.stride % 4 != 0) {
    return false;
  }
  const StreamHandle stream = current_stream();

  int device = 0;
  DI_CUDA_CHECK(cudaGetDevice(&device));
  CublasLtState& state = CublasLtState::instance();
  const int terms = fp8 ? 1 : kBf16ActivationTerms.value();
  const int64_t group_out = w.out / groups;
  const int64_t k_total = in.cols;
  // Rows per GEMM call: all of them, or chunks of a multiple of 128 within the staging budget.
  const int64_t row_bytes = terms * k_total * 2;
  const int64_t budget_rows =
      std::max<int64_t>(kChunkRowMultiple, static_cast<int64_t>(kActivationBudgetBytes) /
                                               row_bytes / kChunkRowMultiple * kChunkRowMultiple);
  const int64_t chunk_rows = std::min(in.rows, budget_rows);
  if (chunk_rows * k_total / kValuesPerThread >= kMaxWords) return false;
  const int64_t plane_elements = chunk_rows * k_total;  // one term's bf16 values
  // The BF16 roles' stacked form (DEEPINFER_CUBLASLT_BF16_STACKED_MAX_ROWS): the term planes (all
  // rows in one chunk, contiguous) as one B of terms x M rows, one GEMM into staging, the row
  // blocks added in term order; only while the [terms M, N] f32 products fit the staging budget
  // too (the LM head's 129280 columns would stage 794 MB at 512 rows).
  const int64_t products_bytes = terms * in.rows * w.out * 4;
  const bool stacked = bf16 && in.rows <= kBf16StackedMaxRows.value() && in.rows == chunk_rows &&
                       products_bytes <= static_cast<int64_t>(kActivationBudgetBytes);

  GemmShape shape;
  shape.device = device;
  shape.n = group_out;
  shape.k = w.in;
  shape.batch = groups;
  shape.ld_b = k_total;
  shape.stride_a = group_out * w.in;
  shape.stride_b = w.in;
  shape.stride_d = group_out;
  constexpr int64_t bf16_bytes = 2;
  // A: the bf16 weight (ours, 256-aligned, where dequantized) at group rows. B: the staging
  // buffer (256-aligned) at term planes (stacked: one matrix) and group columns. D: out at chunk
  // rows and group columns, or (stacked) the products' staging at group columns.
  shape.align_a = common_alignment({dequantized_weight ? 256 : address(w.bytes),
                                    groups > 1 ? shape.stride_a * bf16_bytes : 256});
  shape.align_b = common_alignment({terms > 1 && !stacked ? plane_elements * bf16_bytes : 256,
                                    groups > 1 ? shape.stride_b * bf16_bytes : 256});
  std::shared_ptr<const GemmPlan> full, last;
  if (stacked) {
    shape.m = terms * in.rows;
    shape.ld_d = w.out;
    shape.align_d = common_alignment({256, groups > 1 ? shape.stride_d * 4 : 256});
    full = state.plan(shape);
  } else {
    shape.m = chunk_rows;
    shape.ld_d = o.stride;
    shape.align_d =
        common_alignment({address(o.data), in.rows > chunk_rows ? chunk_rows * o.stride * 4 : 256,
                          groups > 1 ? shape.stride_d * 4 : 256});
    full = state.plan(shape);
    if (in.rows % chunk_rows != 0) {
      shape.m = in.rows % chunk_rows;
      last = state.plan(shape);
    }
  }
  if (!full->found() || (last != nullptr && !last->found())) return false;

  const cublasLtHandle_t handle = state.handle(device);
  Staging& staging = state.staging(device, stream);
  void* cublas_workspace = staging.cublas_workspace.reserve(kCublasWorkspaceBytes, stream);
  auto* activation = static_cast<uint4*>(
      staging.activation.reserve(static_cast<size_t>(terms * plane_elements * bf16_bytes), stream));
  auto* products = stacked ? static_cast<float*>(staging.term_products.reserve(
                                 static_cast<size_t>(products_bytes), stream))
                           : nullptr;
  // Dequantized every call unless the model made a copy (ModelParameters::add_bf16_copies: a copy
  // per weight costs twice the fp8 weights' memory).
  const bool dequantize = dequantized_weight && copy == nullptr;
  void* dequantized =
      dequantize ? staging.weight.reserve(static_cast<size_t>(w.out * w.in * bf16_bytes), stream)
                 : nullptr;
  // Null: a graph is recording and the staging would have to grow (GrowOnlyBuffer).
  if (cublas_workspace == nullptr || activation == nullptr || (stacked && products == nullptr) ||
      (dequantize && dequantized == nullptr)) {
    return false;
  }
  const void* weight_bf16 = dequantized_weight ? (dequantize ? dequantized : copy) : w.bytes;
  if (dequantize) launch_dequantize_fp8_weight_bf16(w, dequantized, stream);
  if (stacked) {
    const int64_t words = in.rows * k_total / kValuesPerThread;
    launch_split_activation_terms(terms, in, 0, static_cast<uint32_t>(words), activation, words,
                                  stream);
    full->run(handle, weight_bf16, activation, products, /*accumulate=*/false, cublas_workspace,
              stream);
    sum_term_products_kernel<<<blocks_for(in.rows * w.out, kThreads), kThreads, 0, stream>>>(
        products, in.rows, terms, o);
    DI_CUDA_LAUNCHED(sum_term_products_kernel);
    return true;
  }
  for (int64_t first = 0; first < in.rows; first += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, in.rows - first);
    const int64_t words = rows * k_total / kValuesPerThread;
    if (fp8) {
      quantize_activation_bf16_kernel<<<blocks_for(words, kThreads), kThreads, 0, stream>>>(
          in, first, static_cast<uint32_t>(words), activation);
      DI_CUDA_LAUNCHED(quantize_activation_bf16_kernel);
    } else {
      launch_split_activation_terms(terms, in, first, static_cast<uint32_t>(words), activation,
                                    plane_elements / kValuesPerThread, stream);
    }
    const GemmPlan& plan = rows == chunk_rows ? *full : *last;
    // The terms largest first, each GEMM adding its products to what the ones before wrote
    // (hi, then + mid, then + lo): a fixed order for a given algorithm.
    for (int t = 0; t < terms; ++t) {
      plan.run(handle, weight_bf16, activation + t * plane_elements / kValuesPerThread,
               o.row(first), /*accumulate=*/t > 0, cublas_workspace, stream);
    }
  }
  return true;
}

bool try_gemm_f32_cublaslt(const float* x, int64_t x_stride, int64_t rows, const float* w,
                           int64_t w_stride, int64_t n, int64_t k, float* out, int64_t out_stride) {
  DI_CHECK(rows >= 0 && n >= 0 && k >= 0 && x_stride >= k && w_stride >= k && out_stride >= n,
           "gemm_f32_cublaslt: rows ", rows, ", n ", n, ", k ", k, ", strides ", x_stride, " / ",
           w_stride, " / ", out_stride);
  if (rows == 0 || n == 0) return true;
  const StreamHandle stream = current_stream();
  int device = 0;
  DI_CUDA_CHECK(cudaGetDevice(&device));
  GemmShape shape;
  shape.device = device;
  shape.operands = CUDA_R_32F;
  shape.m = rows;
  shape.n = n;
  shape.k = k;
  shape.ld_a = w_stride;
  shape.ld_b = x_stride;
  shape.ld_d = out_stride;
  constexpr int64_t f32_bytes = 4;
  shape.align_a = common_alignment({address(w), w_stride * f32_bytes});
  shape.align_b = common_alignment({address(x), x_stride * f32_bytes});
  shape.align_d = common_alignment({address(out), out_stride * f32_bytes});
  CublasLtState& state = CublasLtState::instance();
  const std::shared_ptr<const GemmPlan> plan = state.plan(shape);
  if (!plan->found()) return false;
  Staging& staging = state.staging(device, stream);
  void* cublas_workspace = staging.cublas_workspace.reserve(kCublasWorkspaceBytes, stream);
  if (cublas_workspace == nullptr) return false;  // recording, and the workspace not yet there
  plan->run(state.handle(device), w, x, out, /*accumulate=*/false, cublas_workspace, stream);
  return true;
}

void dequantize_fp8_weight_bf16(const LinearWeight& weight, const TensorView& out) {
  const DeviceWeight w = describe(weight);
  DI_CHECK(out.dtype() == DType::kBF16 && out.rank() == 2 && out.is_contiguous() &&
               out.device() == weight.weight.device() && out.size(0) == w.out &&
               out.size(1) == w.in,
           "dequantize_fp8_weight_bf16: output ", out.to_string(), " for weight ",
           weight.weight.to_string());
  DI_CHECK(w.kind == WeightKind::kF8 && aligned_to(w.bytes, 8) && w.in % kValuesPerThread == 0 &&
               w.block_in % kValuesPerThread == 0 && aligned_to(out.raw_data(), 16) &&
               w.out * w.in / kValuesPerThread < (int64_t{1} << 31),
           "dequantize_fp8_weight_bf16 takes fp8 weights with 8-byte aligned rows and scale blocks "
           "of a multiple of 8 columns, not ",
           weight.weight.to_string());
  if (w.out * w.in == 0) return;
  launch_dequantize_fp8_weight_bf16(w, out.raw_data(), current_stream());
}

void linear_cublaslt(const TensorView& x, const LinearWeight& weight, const TensorView& out,
                     ActivationQuant activation_quant, int64_t groups) {
  if (!try_linear_cublaslt(x, weight, out, activation_quant, groups)) {
    DI_THROW("linear_cublaslt does not take x ", x.to_string(), ", weight ",
             weight.weight.to_string(), " (", dtype_name(weight.weight.dtype()), "), groups ",
             groups, ", out ", out.to_string(),
             ": it needs fp8 block-scaled weights (under kFp8PerBlock32 ungrouped, or without "
             "activation quantization) or bf16 weights without activation quantization, K % 32 == "
             "0, 16-byte aligned rows, staging that fits while recording a graph, and a cuBLASLt "
             "algorithm for the shape");
  }
}

}  // namespace deepinfer::ops::cuda
