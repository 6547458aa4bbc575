// V4.1-Flash layer GEMMs on the GPU, next to the rooflines measured in the same run.
//
//   cuda_layer_bench [json_path]      (default: $OUT/layer_bench.json, else ./layer_bench.json)
//
// 1. Rooflines: HBM bandwidth (a streaming read kernel, a copy kernel, cudaMemcpy D2D) and the
//    dense tensor-core peaks (cuBLASLt 8192^3 e4m3 x e4m3 -> bf16 and bf16 x bf16 -> bf16).
// 2. Every linear of one layer at decode batch 1, 16, 64, 256 and prefill 8192: our
//    ops::cuda::linear, the model's op (weights in their storage format, the released activation
//    quantizer for FP8 roles, which it runs on linear_fp8_dense.cu's tensor-core kernels, with
//    linear_fp8_mma, their path before, as a second row at batch 1 and 8192; BF16 roles on
//    the BF16 tensor-core path of linear_bf16_mma.cu, with the FMA tile kernel they ran on before
//    as a second row) against cuBLASLt on the same shapes (FP8 with a per-tensor scale for FP8
//    roles — cuBLASLt has no 32x32 block scales on SM90 — and BF16 for BF16 roles). Next to
//    them, the model's op with batch invariance off (ScopedBatchInvariance(false): the cuBLASLt
//    bf16 path of linear_cublaslt.cu from DEEPINFER_CUBLASLT_MIN_ROWS rows) and that path forced
//    at every batch (and, for BF16 roles, its stacked-terms form).
// 3. The routed experts (384 x 2304, top 6): our grouped FP8 x FP4 GEMM against a per-expert
//    loop of cuBLASLt calls (BF16-dequantized weights, the nearest SM90 cuBLASLt has to FP4,
//    and FP8 per-tensor weights), both GEMMs (w1|w3 then w2) of the routed MoE.
// Times are medians over rounds of CUDA-event-timed calls after warm-up; weights rotate over
// enough copies (or routings) that each round reads more than the L2 holds.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/batch_invariance.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/fp8_mma.cuh"
#include "ops/cuda/linear.cuh"
#include "ops/cuda/linear_bf16_mma.h"
#include "ops/cuda/linear_cublaslt.h"
#include "ops/cuda/linear_fp8_dense.h"
#include "ops/cuda/moe_grouped_gemm.h"
#include "ops/cuda/runtime_switch.h"
#include "roofline.cuh"

namespace deepinfer::bench {
namespace {

namespace rt = deepinfer::cuda;
using ops::ActivationQuant;
using ops::LinearWeight;

#define BENCH_CUBLAS_CHECK(expression)                                                             \
  do {                                                                                             \
    if (const cublasStatus_t bench_status = (expression); bench_status != CUBLAS_STATUS_SUCCESS) { \
      DI_THROW("cuBLASLt error ", static_cast<int>(bench_status), " in ", #expression);            \
    }                                                                                              \
  } while (false)

// ---- the V4.1-Flash widths (docs/CONFIG.md) -------------------------------------------------

constexpr int64_t kHidden = 5120;
constexpr int64_t kHeads = 64;
constexpr int64_t kHeadDim = 512;
constexpr int64_t kQLora = 1280;
constexpr int64_t kOGroups = 8;
constexpr int64_t kOLora = 1024;
constexpr int64_t kExperts = 384;
constexpr int64_t kVocab = 129280;
constexpr int64_t kMoeInter = 2304;
constexpr int kTopK = 6;
constexpr int64_t kIndexHeads = 32;
constexpr int64_t kIndexDim = 128;
// LAYER_BENCH_BATCHES (comma-separated) replaces them, e.g. "64,128,256,512,8192".
const std::vector<int64_t> kBatches = [] {
  std::vector<int64_t> batches = {1, 16, 64, 256, 8192};
  if (const char* list = std::getenv("LAYER_BENCH_BATCHES"); list != nullptr && *list != '\0') {
    batches.clear();
    for (const char* p = list; *p != '\0';) {
      char* end = nullptr;
      const long long value = std::strtoll(p, &end, 10);
      DI_CHECK(end != p && value > 0 && (*end == ',' || *end == '\0'),
               "LAYER_BENCH_BATCHES must list positive integers separated by commas: ", list);
      batches.push_back(value);
      p = *end == ',' ? end + 1 : end;
    }
  }
  return batches;
}();

// The routed experts' batches: kBatches, or LAYER_BENCH_MOE_BATCHES (comma-separated, e.g.
// "8192" for a quick prefill comparison).
std::vector<int64_t> moe_batches() {
  const char* chosen = std::getenv("LAYER_BENCH_MOE_BATCHES");
  if (chosen == nullptr || *chosen == '\0') return kBatches;
  std::vector<int64_t> batches;
  for (const char* at = chosen; *at != '\0';) {
    char* end = nullptr;
    const long long batch = std::strtoll(at, &end, 10);
    DI_CHECK(end != at && batch > 0 && (*end == ',' || *end == '\0'),
             "LAYER_BENCH_MOE_BATCHES=", chosen,
             ": expected positive integers separated by commas");
    batches.push_back(batch);
    at = *end == ',' ? end + 1 : end;
  }
  return batches;
}

// ---- random device data ------------------------------------------------------------------------

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

enum class Fill : int {
  kAnyByte,  // packed fp4: every code
  kE4m3,     // e4m3 of magnitude 2^-3..2^3 (no NaN, no huge products)
  kUe8m0,    // scales 2^-10..2^-6
  kBf16,     // bf16 of magnitude 2^-8..2^0
  kF32,      // uniform [-1, 1)
};

__global__ void fill_kernel(uint8_t* data, size_t bytes, uint64_t seed, Fill fill) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;; i += stride) {
    const uint64_t h = mix(seed * 0x100000001B3ull + i);
    switch (fill) {
      case Fill::kAnyByte:
        if (i >= bytes) return;
        data[i] = static_cast<uint8_t>(h);
        break;
      case Fill::kE4m3:
        if (i >= bytes) return;
        data[i] = static_cast<uint8_t>((h & 0x80) | ((4 + (h >> 8) % 6) << 3) | ((h >> 16) & 7));
        break;
      case Fill::kUe8m0:
        if (i >= bytes) return;
        data[i] = static_cast<uint8_t>(117 + (h >> 8) % 5);
        break;
      case Fill::kBf16:
        if (i >= bytes / 2) return;
        reinterpret_cast<uint16_t*>(data)[i] =
            static_cast<uint16_t>((h & 0x8000) | ((119 + (h >> 16) % 9) << 7) | ((h >> 32) & 0x7F));
        break;
      case Fill::kF32:
        if (i >= bytes / 4) return;
        reinterpret_cast<float*>(data)[i] = static_cast<float>(h >> 40) * 0x1p-23f - 1.0f;
        break;
    }
  }
}

void fill(const TensorView& view, Fill kind, uint64_t seed) {
  fill_kernel<<<4096, 256>>>(static_cast<uint8_t*>(view.raw_data()), view.nbytes(), seed, kind);
  DI_CUDA_CHECK(cudaGetLastError());
}

Tensor device_tensor(DType dtype, Shape shape, Fill kind, uint64_t seed) {
  Tensor t = Tensor::empty(dtype, shape, rt::device_allocator());
  fill(t.view(), kind, seed);
  return t;
}

// ---- timing -------------------------------------------------------------------------------------

// Median milliseconds per call: one warm-up call, then rounds of `inner` calls between two
// events, `inner` sized so a round lasts about 2 ms.
double time_ms(const std::function<void(int)>& call) {
  cudaEvent_t start, stop;
  DI_CUDA_CHECK(cudaEventCreate(&start));
  DI_CUDA_CHECK(cudaEventCreate(&stop));
  int counter = 0;
  call(counter++);
  DI_CUDA_CHECK(cudaEventRecord(start));
  call(counter++);
  DI_CUDA_CHECK(cudaEventRecord(stop));
  DI_CUDA_CHECK(cudaEventSynchronize(stop));
  float first = 0;
  DI_CUDA_CHECK(cudaEventElapsedTime(&first, start, stop));
  const int inner = std::clamp(static_cast<int>(2.0 / std::max(first, 1e-4f)), 1, 200);
  // LAYER_BENCH_ROUND_MS: the milliseconds of rounds per measurement (default 400; less for a
  // quicker, noisier run).
  static const double total_ms = [] {
    const char* value = std::getenv("LAYER_BENCH_ROUND_MS");
    return value != nullptr && std::atof(value) > 0 ? std::atof(value) : 400.0;
  }();
  const int rounds =
      std::clamp(static_cast<int>(total_ms / (std::max(first, 1e-4f) * inner)), 3, 25);
  std::vector<double> per_call;
  for (int r = 0; r < rounds; ++r) {
    DI_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < inner; ++i) call(counter++);
    DI_CUDA_CHECK(cudaEventRecord(stop));
    DI_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DI_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    per_call.push_back(ms / inner);
  }
  DI_CUDA_CHECK(cudaGetLastError());
  DI_CUDA_CHECK(cudaEventDestroy(start));
  DI_CUDA_CHECK(cudaEventDestroy(stop));
  std::nth_element(per_call.begin(), per_call.begin() + per_call.size() / 2, per_call.end());
  return per_call[per_call.size() / 2];
}

// ---- results --------------------------------------------------------------------------------

struct Roofline {
  double read_gbps = 0;  // the decode bandwidth ceiling
  double copy_gbps = 0;
  double memcpy_gbps = 0;
  double fp8_tflops = 0;
  double bf16_tflops = 0;
};

struct Record {
  std::string section, name, impl;
  int64_t batch = 0;
  double ms = 0, bytes = 0, flops = 0;
  double floor_ms = 0;  // max(bytes / HBM, flops / peak)
  std::string bound;
};

std::vector<Record> g_records;

void report(const Roofline& roof, const std::string& section, const std::string& name,
            const std::string& impl, int64_t batch, double ms, double bytes, double flops,
            double peak_tflops) {
  Record r;
  r.section = section;
  r.name = name;
  r.impl = impl;
  r.batch = batch;
  r.ms = ms;
  r.bytes = bytes;
  r.flops = flops;
  const double memory_ms = bytes / (roof.read_gbps * 1e9) * 1e3;
  const double compute_ms = peak_tflops > 0 ? flops / (peak_tflops * 1e12) * 1e3 : 0;
  r.floor_ms = std::max(memory_ms, compute_ms);
  r.bound = memory_ms >= compute_ms ? "HBM" : "tensor";
  std::printf("%-8s %-22s %-16s %6lld %10.4f ms %8.0f GB/s %8.1f TFLOP/s %6.1f%% of %s floor\n",
              section.c_str(), name.c_str(), impl.c_str(), static_cast<long long>(batch), ms,
              bytes / ms * 1e-6, flops / ms * 1e-9, 100.0 * r.floor_ms / ms, r.bound.c_str());
  std::fflush(stdout);
  g_records.push_back(r);
}

void write_json(const std::string& path, const Roofline& roof) {
  FILE* f = std::fopen(path.c_str(), "w");
  DI_CHECK(f != nullptr, "cannot write ", path);
  cudaDeviceProp prop{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::fprintf(f,
               "{\"gpu\": \"%s\", \"sms\": %d, \"roofline\": {\"read_gbps\": %.1f, "
               "\"copy_gbps\": %.1f, \"memcpy_d2d_gbps\": %.1f, \"fp8_tflops\": %.1f, "
               "\"bf16_tflops\": %.1f},\n \"records\": [\n",
               prop.name, prop.multiProcessorCount, roof.read_gbps, roof.copy_gbps,
               roof.memcpy_gbps, roof.fp8_tflops, roof.bf16_tflops);
  for (size_t i = 0; i < g_records.size(); ++i) {
    const Record& r = g_records[i];
    std::fprintf(f,
                 "  {\"section\": \"%s\", \"name\": \"%s\", \"impl\": \"%s\", \"batch\": %lld, "
                 "\"ms\": %.6f, \"bytes\": %.0f, \"flops\": %.0f, \"floor_ms\": %.6f, "
                 "\"bound\": \"%s\"}%s\n",
                 r.section.c_str(), r.name.c_str(), r.impl.c_str(), static_cast<long long>(r.batch),
                 r.ms, r.bytes, r.flops, r.floor_ms, r.bound.c_str(),
                 i + 1 < g_records.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

// ---- cuBLASLt ---------------------------------------------------------------------------------

enum class LtType { kFp8, kBf16 };

size_t lt_bytes(LtType type) {
  return type == LtType::kFp8 ? 1 : 2;
}

// D[M, N] (row-major, bf16) = X[M, K] . W[N, K]^T, optionally `batch` times with strides: the
// column-major view is D^T = W . X^T with W transposed ("TN", what FP8 requires).
class LtGemm {
 public:
  LtGemm(cublasLtHandle_t handle, LtType type, int64_t m, int64_t n, int64_t k, int64_t ldx,
         int64_t ldd, int batch = 1, int64_t x_batch_stride = 0, int64_t w_batch_stride = 0,
         int64_t d_batch_stride = 0)
      : handle_(handle) {
    const cudaDataType_t ab = type == LtType::kFp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    BENCH_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    BENCH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA,
                                                      &transpose, sizeof(transpose)));
    BENCH_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
    if (type == LtType::kFp8) {
      // Per-tensor scales of 1 (SM90 cuBLASLt has no 32x32 block scales).
      DI_CUDA_CHECK(cudaMalloc(&one_, sizeof(float)));
      const float value = 1.0f;
      DI_CUDA_CHECK(cudaMemcpy(one_, &value, sizeof(float), cudaMemcpyHostToDevice));
      for (auto attribute :
           {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER}) {
        BENCH_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, attribute, &one_, sizeof(one_)));
      }
    }
    BENCH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&w_, ab, k, n, k));
    BENCH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&x_, ab, k, m, ldx));
    BENCH_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d_, CUDA_R_16BF, n, m, ldd));
    if (batch > 1) {
      const int32_t count = batch;
      for (auto [layout, stride] : {std::pair{w_, w_batch_stride}, std::pair{x_, x_batch_stride},
                                    std::pair{d_, d_batch_stride}}) {
        BENCH_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
        BENCH_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
      }
    }
    cublasLtMatmulPreference_t preference;
    BENCH_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const uint64_t workspace = kWorkspaceBytes;
    BENCH_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, w_, x_, d_, d_,
                                                                 preference, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(preference);
    ok_ = status == CUBLAS_STATUS_SUCCESS && found > 0;
    algo_ = result.algo;
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(w_);
    cublasLtMatrixLayoutDestroy(x_);
    cublasLtMatrixLayoutDestroy(d_);
    cublasLtMatmulDescDestroy(desc_);
    if (one_ != nullptr) cudaFree(one_);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  bool ok() const { return ok_; }

  void run(const void* weight, const void* x, void* d, void* workspace) const {
    const float alpha = 1.0f, beta = 0.0f;
    BENCH_CUBLAS_CHECK(cublasLtMatmul(handle_, desc_, &alpha, weight, w_, x, x_, &beta, d, d_, d,
                                      d_, &algo_, workspace, kWorkspaceBytes, nullptr));
  }

  static constexpr size_t kWorkspaceBytes = 64ull << 20;

 private:
  cublasLtHandle_t handle_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t w_ = nullptr, x_ = nullptr, d_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  float* one_ = nullptr;
  bool ok_ = false;
};

// ---- rooflines -----------------------------------------------------------------------------

__global__ void copy_kernel(const uint4* in, uint4* out, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    __stcs(out + i, __ldcs(in + i));
  }
}

Roofline measure_roofline(cublasLtHandle_t handle, void* workspace) {
  Roofline roof;
  cudaDeviceProp prop{};
  DI_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int grid = prop.multiProcessorCount * 8;
  constexpr size_t kBytes = 4ull << 30;
  Tensor a = device_tensor(DType::kI8, {static_cast<int64_t>(kBytes)}, Fill::kAnyByte, 1);
  Tensor b = device_tensor(DType::kI8, {static_cast<int64_t>(kBytes)}, Fill::kAnyByte, 2);
  unsigned* sink = nullptr;
  DI_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  const auto* a16 = static_cast<const uint4*>(a.view().raw_data());
  auto* b16 = static_cast<uint4*>(b.view().raw_data());
  const unsigned read_blocks = hbm_read_blocks();  // == grid
  double ms = time_ms([&](int) { launch_hbm_read(a16, kBytes, sink, read_blocks); });
  roof.read_gbps = kBytes / ms * 1e-6;
  ms = time_ms([&](int) { copy_kernel<<<grid, 512>>>(a16, b16, kBytes / 32); });
  roof.copy_gbps = kBytes / ms * 1e-6;  // half read, half written
  ms = time_ms(
      [&](int) { DI_CUDA_CHECK(cudaMemcpyAsync(b16, a16, kBytes / 2, cudaMemcpyDeviceToDevice)); });
  roof.memcpy_gbps = kBytes / ms * 1e-6;
  DI_CUDA_CHECK(cudaFree(sink));

  constexpr int64_t kSide = 8192;
  const double flops = 2.0 * kSide * kSide * kSide;
  for (LtType type : {LtType::kFp8, LtType::kBf16}) {
    const DType dtype = type == LtType::kFp8 ? DType::kF8E4M3 : DType::kBF16;
    const Fill fill_kind = type == LtType::kFp8 ? Fill::kE4m3 : Fill::kBf16;
    Tensor x = device_tensor(dtype, {kSide, kSide}, fill_kind, 3);
    Tensor w = device_tensor(dtype, {kSide, kSide}, fill_kind, 4);
    Tensor d = Tensor::empty(DType::kBF16, {kSide, kSide}, rt::device_allocator());
    LtGemm gemm(handle, type, kSide, kSide, kSide, kSide, kSide);
    DI_CHECK(gemm.ok(), "cuBLASLt has no algorithm for the roofline GEMM");
    ms = time_ms([&](int) {
      gemm.run(w.view().raw_data(), x.view().raw_data(), d.view().raw_data(), workspace);
    });
    (type == LtType::kFp8 ? roof.fp8_tflops : roof.bf16_tflops) = flops / ms * 1e-9;
  }
  std::printf(
      "roofline: HBM read %.0f GB/s, copy %.0f GB/s (read+write), cudaMemcpy D2D %.0f "
      "GB/s; cuBLASLt 8192^3 FP8 %.0f TFLOP/s, BF16 %.0f TFLOP/s\n",
      roof.read_gbps, roof.copy_gbps, roof.memcpy_gbps, roof.fp8_tflops, roof.bf16_tflops);
  return roof;
}

// ---- the dense linears of one layer ---------------------------------------------------------

struct Role {
  const char* name;
  int64_t in, out;
  bool fp8;        // FP8 e4m3 32x32 block-scaled (else BF16)
  int groups = 1;  // wo_a: 8 groups, each [out, in] on its own column slice of the input
  // Batches above this are skipped (the LM head runs on decode batches only: prefill takes the
  // last token's logits).
  int64_t max_batch = INT64_MAX;
  // Measured only when this environment variable is 1 (the LM head is no per-layer GEMM, so
  // report.py's per-layer sums must not see it by default).
  const char* only_with = nullptr;
};

const std::vector<Role> kRoles = {
    {"wq_a", kHidden, kQLora, true},
    {"wkv", kHidden, kHeadDim, true},
    {"wq_b", kQLora, kHeads* kHeadDim, true},
    {"wo_a (8 groups)", kHeads* kHeadDim / kOGroups, kOLora, false, kOGroups},
    {"wo_b", kOGroups* kOLora, kHidden, true},
    {"gate", kHidden, kExperts, false},
    {"shared w1|w3", kHidden, 2 * kMoeInter, true},
    {"shared w2", kMoeInter, kHidden, true},
    {"indexer wq_b", kQLora, kIndexHeads* kIndexDim, true},
    {"compressor wkv|wgate", kHidden, 2 * kHeadDim, false},
    {"LM head", kHidden, kVocab, false, 1, 256, "LAYER_BENCH_LM_HEAD"},
};

// Enough copies of a weight that one round of calls reads more than the L2 holds.
int copies_for(size_t bytes) {
  return static_cast<int>(
      std::clamp<size_t>((256ull << 20) / std::max<size_t>(bytes, 1) + 1, 1, 64));
}

void bench_dense(const Roofline& roof, cublasLtHandle_t handle, void* workspace) {
  // LAYER_BENCH_SKIP_FMA=1: no FMA comparison rows for the BF16 roles (they take seconds at 8192).
  const char* skip_fma_env = std::getenv("LAYER_BENCH_SKIP_FMA");
  const bool skip_fma = skip_fma_env != nullptr && std::string(skip_fma_env) == "1";
  // LAYER_BENCH_FP8_BEFORE=0: no linear_fp8_mma comparison rows for the FP8 roles.
  const char* fp8_before_env = std::getenv("LAYER_BENCH_FP8_BEFORE");
  const bool skip_fp8_before = fp8_before_env != nullptr && std::string(fp8_before_env) == "0";
  for (const Role& role : kRoles) {
    if (role.only_with != nullptr) {
      const char* wanted = std::getenv(role.only_with);
      if (wanted == nullptr || std::string(wanted) != "1") continue;
    }
    const int64_t in = role.in, out = role.out, groups = role.groups;
    const double weight_elems = static_cast<double>(groups * out * in);
    // Ours: the storage format (fp8 + ue8m0 32x32 scales, or bf16).
    std::vector<Tensor> weights, scales;
    const double scale_bytes = role.fp8 ? groups * ((out + 31) / 32) * ((in + 31) / 32) : 0;
    const size_t our_weight_bytes =
        static_cast<size_t>(weight_elems * (role.fp8 ? 1 : 2) + scale_bytes);
    const int copies = copies_for(our_weight_bytes);
    for (int c = 0; c < copies; ++c) {
      weights.push_back(device_tensor(role.fp8 ? DType::kF8E4M3 : DType::kBF16, {groups * out, in},
                                      role.fp8 ? Fill::kE4m3 : Fill::kBf16, 100 + c));
      if (role.fp8) {
        scales.push_back(device_tensor(DType::kF8E8M0, {groups * ((out + 31) / 32), (in + 31) / 32},
                                       Fill::kUe8m0, 200 + c));
      }
    }
    const LtType lt_type = role.fp8 ? LtType::kFp8 : LtType::kBf16;
    std::vector<Tensor> lt_weights;
    for (int c = 0; c < copies_for(static_cast<size_t>(weight_elems * lt_bytes(lt_type))); ++c) {
      lt_weights.push_back(device_tensor(role.fp8 ? DType::kF8E4M3 : DType::kBF16,
                                         {groups * out, in}, role.fp8 ? Fill::kE4m3 : Fill::kBf16,
                                         300 + c));
    }
    const double peak = role.fp8 ? roof.fp8_tflops : roof.bf16_tflops;
    for (int64_t m : kBatches) {
      if (m > role.max_batch) continue;
      const double flops = 2.0 * m * weight_elems;
      Tensor x = device_tensor(DType::kF32, {m, groups * in}, Fill::kF32, 7);
      Tensor y = Tensor::empty(DType::kF32, {m, groups * out}, rt::device_allocator());
      const ActivationQuant quant =
          role.fp8 ? ActivationQuant::kFp8PerBlock32 : ActivationQuant::kNone;
      const double ms_ours = time_ms([&](int call) {
        const int c = call % copies;
        for (int64_t g = 0; g < groups; ++g) {
          const TensorView w = weights[c].view().narrow(0, g * out, out);
          const TensorView s = role.fp8 ? scales[c].view() : TensorView();
          ops::cuda::linear(x.view().narrow(1, g * in, in), LinearWeight{w, s},
                            y.view().narrow(1, g * out, out), quant);
        }
      });
      const double our_bytes = our_weight_bytes + 4.0 * m * groups * (in + out);
      // Which kernel ops::cuda::linear picked (a function of the weight and input layout only).
      const auto in_rows = [&](int64_t g) {
        return rt::device_rows<const float>(x.view().narrow(1, g * in, in), "bench input");
      };
      const auto out_rows = [&](int64_t g) {
        return rt::device_rows<float>(y.view().narrow(1, g * out, out), "bench output");
      };
      const bool bf16_mma =
          !role.fp8 &&
          ops::cuda::bf16_mma_supports(
              ops::cuda::describe(LinearWeight{weights[0].view().narrow(0, 0, out), TensorView()}),
              in_rows(0));
      const bool fp8_dense =
          role.fp8 && ops::cuda::linear_fp8_dense_supports(
                          LinearWeight{weights[0].view().narrow(0, 0, out), scales[0].view()});
      report(roof, "dense", role.name,
             role.fp8 ? (fp8_dense ? "ours (linear: fp8 dense)" : "ours (linear: mma)")
                      : (bf16_mma ? "ours (linear: bf16 mma)" : "ours (linear: FMA)"),
             m, ms_ours, our_bytes, flops, peak);
      {
        // The model's op with batch invariance off (wo_a through linear_grouped, as the model
        // calls it): the cuBLASLt path from DEEPINFER_CUBLASLT_MIN_ROWS rows, the line above
        // below it.
        const ops::ScopedBatchInvariance variant(false);
        const auto model_op = [&](int call) {
          const int c = call % copies;
          const LinearWeight w{weights[c].view(), role.fp8 ? scales[c].view() : TensorView()};
          if (groups > 1) {
            ops::cuda::linear_grouped(x.view(), w, groups, y.view());
          } else {
            ops::cuda::linear(x.view(), w, y.view(), quant);
          }
        };
        report(roof, "dense", role.name, "ours (invariance off)", m, time_ms(model_op), our_bytes,
               flops, peak);
      }
      // The cuBLASLt path forced at every batch (where the threshold is chosen), and for the BF16
      // roles its stacked-terms form (one GEMM of terms x M rows, then the blocks added) and the
      // exact three activation terms (the default is two).
      const auto forced_path = [&](int call) {
        const int c = call % copies;
        ops::cuda::linear_cublaslt(
            x.view(), LinearWeight{weights[c].view(), role.fp8 ? scales[c].view() : TensorView()},
            y.view(), quant, groups);
      };
      report(roof, "dense", role.name, "ours (cuBLASLt path)", m, time_ms(forced_path), our_bytes,
             flops, peak);
      if (!role.fp8) {
        const rt::ScopedSetting stacked{"DEEPINFER_CUBLASLT_BF16_STACKED_MAX_ROWS", 1 << 30};
        report(roof, "dense", role.name, "ours (cuBLASLt, stacked)", m, time_ms(forced_path),
               our_bytes, flops, peak);
      }
      if (!role.fp8) {
        const rt::ScopedSetting exact_terms{"DEEPINFER_CUBLASLT_BF16_TERMS", 3};
        report(roof, "dense", role.name, "ours (cuBLASLt, 3 terms)", m, time_ms(forced_path),
               our_bytes, flops, peak);
      }
      if (fp8_dense && !skip_fp8_before && (m == kBatches.front() || m == kBatches.back())) {
        // The grouped kernel the FP8 roles ran on before linear_fp8_dense (linear_fp8_mma), at
        // the first and last batch only (the slow one costs GPU seconds at every batch).
        const double ms_before = time_ms([&](int call) {
          const int c = call % copies;
          ops::cuda::linear_fp8_mma(x.view(), LinearWeight{weights[c].view(), scales[c].view()},
                                    y.view());
        });
        report(roof, "dense", role.name, "ours (fp8 mma, before)", m, ms_before, our_bytes, flops,
               peak);
      }
      if (bf16_mma && !skip_fma) {
        // The FMA tile kernel the BF16 roles ran on before (part 1's path), for comparison.
        const double ms_fma = time_ms([&](int call) {
          const int c = call % copies;
          for (int64_t g = 0; g < groups; ++g) {
            const ops::cuda::DeviceWeight w = ops::cuda::describe(
                LinearWeight{weights[c].view().narrow(0, g * out, out), TensorView()});
            ops::cuda::launch_linear(in_rows(g), w, out_rows(g));
          }
        });
        report(roof, "dense", role.name, "ours (FMA)", m, ms_fma, our_bytes, flops, peak);
      }
      if (bf16_mma) {
        // The same path with the other activation term count (2: a third fewer MMAs, x kept to
        // about 2^-16; 3: exact), to weigh speed against accuracy.
        const int other_terms = ops::cuda::linear_bf16_mma_activation_terms() == 3 ? 2 : 3;
        const double ms_other = time_ms([&](int call) {
          const int c = call % copies;
          for (int64_t g = 0; g < groups; ++g) {
            ops::cuda::linear_bf16_mma(
                x.view().narrow(1, g * in, in),
                LinearWeight{weights[c].view().narrow(0, g * out, out), TensorView()},
                y.view().narrow(1, g * out, out), other_terms);
          }
        });
        report(roof, "dense", role.name,
               "ours (bf16 mma, " + std::to_string(other_terms) + " terms)", m, ms_other, our_bytes,
               flops, peak);
      }

      const DType lt_dtype = role.fp8 ? DType::kF8E4M3 : DType::kBF16;
      Tensor lx =
          device_tensor(lt_dtype, {m, groups * in}, role.fp8 ? Fill::kE4m3 : Fill::kBf16, 8);
      Tensor ly = Tensor::empty(DType::kBF16, {m, groups * out}, rt::device_allocator());
      LtGemm gemm(handle, lt_type, m, out, in, groups * in, groups * out, static_cast<int>(groups),
                  in, out * in, out);
      const char* lt_name = role.fp8 ? "cuBLASLt FP8" : "cuBLASLt BF16";
      if (!gemm.ok()) {
        std::printf("dense    %-22s %-16s %6lld  no cuBLASLt algorithm\n", role.name, lt_name,
                    static_cast<long long>(m));
        continue;
      }
      const double ms_lt = time_ms([&](int call) {
        gemm.run(lt_weights[call % lt_weights.size()].view().raw_data(), lx.view().raw_data(),
                 ly.view().raw_data(), workspace);
      });
      report(roof, "dense", role.name, lt_name, m, ms_lt,
             weight_elems * lt_bytes(lt_type) + m * groups * (in * lt_bytes(lt_type) + 2.0 * out),
             flops, peak);
    }
  }
}

// ---- routed experts ------------------------------------------------------------------------

// The routed experts with batch invariance off (ops::batch_invariant() false): at prefill the
// wgmma tile (moe_prefill_wgmma.h), folding once per 128 of K (the default) or, for comparison,
// per 32-block (its first version); decode batches (fewer than 16 rows per expert) take the
// wgmma decode tile at every row count (DEEPINFER_MOE_WGMMA_DECODE unset; from 64 rows before the
// lean3 step), or for comparison the mma.sync decode tile (0) or the wgmma decode tile (2).
struct NonInvariantRun {
  const char* impl;
  int fold;         // DEEPINFER_MOE_WGMMA_FOLD
  bool register_a;  // DEEPINFER_MOE_WGMMA_REGISTER_A (fold 128: the weights in A registers)
  bool software_quantizer = false;  // DEEPINFER_MOE_QUANT_HW_CVT=0
  int wgmma_decode = -1;            // DEEPINFER_MOE_WGMMA_DECODE (-1: by rows, the default)
  int tiles = -1;  // DEEPINFER_MOE_WGMMA_TILES (-1: the default; 0: the 128 / 32 token tiles)
};
// The defaults, then the paths they replaced or choose between (the register tile's token tiles:
// the 128 / 32 tiles, or sized tiles up to 128, 144 or 160 tokens, DEEPINFER_MOE_WGMMA_TILES).
// Measured and removed on 2026-12-02: the decode tile's lean step (lean3 faster at every batch),
// lean3 with one barrier a slot, with the selector shift on the FMA pipe, and with a slot's codes
// in one load. Measured and decided (rows removed, figures in docs/BENCHMARKS.md):
// the software quantizer, fold per 32, the prefill tiles at decode, decode slots of 1 and 4 K
// steps. The register tile's row-wide weight scales, its step before the lean rewrite and the
// decode tile's first step were measured and removed from the code (2026-12-02).
constexpr NonInvariantRun kNonInvariantRuns[] = {
    {.impl = "ours, inv. off", .fold = 128, .register_a = true},
    {.impl = "ours, off, smem weights", .fold = 128, .register_a = false},
    {.impl = "ours, off, decode mma.sync", .fold = 128, .register_a = true, .wgmma_decode = 0},
    {.impl = "ours, off, decode wgmma", .fold = 128, .register_a = true, .wgmma_decode = 2},
    {.impl = "ours, off, tiles 128/32", .fold = 128, .register_a = true, .tiles = 0},
    {.impl = "ours, off, sized to 128", .fold = 128, .register_a = true, .tiles = 128},
    {.impl = "ours, off, sized to 144", .fold = 128, .register_a = true, .tiles = 144},
    {.impl = "ours, off, sized to 160", .fold = 128, .register_a = true, .tiles = 160}};

// time_ms of `call` with batch invariance off and the run's tile.
double time_non_invariant(const NonInvariantRun& run, const std::function<void(int)>& call) {
  const ops::ScopedBatchInvariance off(false);
  const rt::ScopedSetting fold("DEEPINFER_MOE_WGMMA_FOLD", run.fold);
  const rt::ScopedSwitch register_a("DEEPINFER_MOE_WGMMA_REGISTER_A", run.register_a);
  const rt::ScopedSwitch quantizer("DEEPINFER_MOE_QUANT_HW_CVT", !run.software_quantizer);
  const rt::ScopedSetting decode("DEEPINFER_MOE_WGMMA_DECODE", run.wgmma_decode);
  const int tiles =
      run.tiles >= 0 ? run.tiles : rt::RuntimeSetting::find("DEEPINFER_MOE_WGMMA_TILES").value();
  const rt::ScopedSetting tile_sizes("DEEPINFER_MOE_WGMMA_TILES", tiles);
  return time_ms(call);
}

// One routing of `batch` tokens: top-6 distinct experts per token, uniform.
struct Routing {
  std::vector<int32_t> counts;   // per expert
  std::vector<int32_t> offsets;  // E + 1
  Tensor device_offsets;
  Tensor device_chosen;  // [batch, top_k] i32: the experts of each token (moe_experts' input)
  int64_t active = 0;
};

Routing make_routing(int64_t batch, uint32_t seed) {
  Routing r;
  r.counts.assign(kExperts, 0);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, kExperts - 1);
  Tensor all_chosen = Tensor::empty(DType::kI32, {batch, kTopK});
  for (int64_t t = 0; t < batch; ++t) {
    std::vector<int> chosen;
    while (static_cast<int>(chosen.size()) < kTopK) {
      const int e = pick(rng);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int e : chosen) ++r.counts[e];
    std::copy(chosen.begin(), chosen.end(), all_chosen.data<int32_t>() + t * kTopK);
  }
  r.device_chosen = rt::to_device(all_chosen.view());
  r.offsets.push_back(0);
  for (int32_t c : r.counts) {
    r.offsets.push_back(r.offsets.back() + c);
    r.active += c > 0;
  }
  Tensor host = Tensor::empty(DType::kI32, {kExperts + 1});
  std::copy(r.offsets.begin(), r.offsets.end(), host.data<int32_t>());
  r.device_offsets = rt::to_device(host.view());
  return r;
}

// The model's whole routed MoE op (ops::cuda::moe_experts, released numerics: device sort by
// expert, gather, the grouped FP8 x FP4 GEMM for w1, w3 and w2, SwiGLU, combine), each expert's
// weights a separate view as the model holds them.
void bench_moe_op(const Roofline& roof) {
  Tensor w13 =
      device_tensor(DType::kF4E2M1x2, {2 * kExperts * kMoeInter, kHidden}, Fill::kAnyByte, 21);
  Tensor s13 =
      device_tensor(DType::kF8E8M0, {2 * kExperts * kMoeInter, kHidden / 32}, Fill::kUe8m0, 22);
  Tensor w2 = device_tensor(DType::kF4E2M1x2, {kExperts * kHidden, kMoeInter}, Fill::kAnyByte, 23);
  Tensor s2 = device_tensor(DType::kF8E8M0, {kExperts * kHidden, kMoeInter / 32}, Fill::kUe8m0, 24);
  std::vector<ops::ExpertWeights> experts(kExperts);
  for (int64_t e = 0; e < kExperts; ++e) {
    const auto rows = [](const Tensor& t, int64_t first, int64_t count) {
      return t.view().narrow(0, first, count);
    };
    ops::ExpertWeights& w = experts[static_cast<size_t>(e)];
    w.w1 = {rows(w13, 2 * e * kMoeInter, kMoeInter), rows(s13, 2 * e * kMoeInter, kMoeInter)};
    w.w3 = {rows(w13, (2 * e + 1) * kMoeInter, kMoeInter),
            rows(s13, (2 * e + 1) * kMoeInter, kMoeInter)};
    w.w2 = {rows(w2, e * kHidden, kHidden), rows(s2, e * kHidden, kHidden)};
  }
  const double expert_bytes = 3.0 * kMoeInter * kHidden * (0.5 + 1.0 / 32);
  constexpr int kRoutings = 8;
  for (int64_t batch : moe_batches()) {
    std::vector<Routing> routings;
    for (int i = 0; i < kRoutings; ++i) routings.push_back(make_routing(batch, 1000 + i));
    double active = 0;
    for (const Routing& r : routings) active += r.active;
    active /= kRoutings;
    Tensor x = device_tensor(DType::kF32, {batch, kHidden}, Fill::kF32, 25);
    Tensor weights = device_tensor(DType::kF32, {batch, kTopK}, Fill::kF32, 26);
    Tensor y = Tensor::empty(DType::kF32, {batch, kHidden}, rt::device_allocator());
    const auto op = [&](int call) {
      ops::cuda::moe_experts(x.view(), routings[call % kRoutings].device_chosen.view(),
                             weights.view(), experts, 10.0f, ActivationQuant::kFp8PerBlock32,
                             y.view());
    };
    const double ms = time_ms(op);
    const double rows = static_cast<double>(batch * kTopK);
    const double op_bytes = active * expert_bytes + rows * 4.0 * (2 * kHidden + 3 * kMoeInter);
    const double op_flops = 2.0 * rows * 3 * kMoeInter * kHidden;
    report(roof, "moe", "routed moe_experts op", "ours (model op)", batch, ms, op_bytes, op_flops,
           roof.fp8_tflops);
    for (const NonInvariantRun& run : kNonInvariantRuns) {
      report(roof, "moe", "routed moe_experts op", run.impl, batch, time_non_invariant(run, op),
             op_bytes, op_flops, roof.fp8_tflops);
    }
  }
}

// The decode tiles' weight stream without their arithmetic: blocks of 128 threads (4 an SM) walk
// (active expert, 64 weight rows) items and stream each item's rows through a cp.async ring in
// pieces of kPieceBytes a row (64: the wgmma decode tile's one-step slots; 128: its two-step
// ones, and the mma.sync decode tile's chunks; 256: four-step slots), waiting for each piece and
// meeting at a barrier, with kFence the tiles' fence.proxy.async after every wait. What the memory
// system gives that access pattern, for the GEMMs' rows to compare with.
template <int kPieceBytes, bool kFence>
__global__ void __launch_bounds__(128, 4)
    stream_rows_kernel(const uint8_t* weight, const int32_t* active, int active_count, int64_t n,
                       int64_t row_bytes, unsigned* sink) {
  constexpr int kSlotBytes = 64 * kPieceBytes;
  constexpr int kSlots = kPieceBytes == 64 ? 8 : kPieceBytes == 128 ? 6 : 3;
  constexpr int kChunksPerRow = kPieceBytes / 16;
  constexpr int kCopies = 64 * kChunksPerRow / 128;
  extern __shared__ __align__(128) uint8_t ring[];
  const int thread = static_cast<int>(threadIdx.x);
  const int64_t items_per_expert = n / 64;
  const int64_t items = active_count * items_per_expert;
  const int pieces = static_cast<int>(row_bytes / kPieceBytes);
  unsigned sum = 0;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const uint8_t* base =
        weight + (active[item / items_per_expert] * n + item % items_per_expert * 64) * row_bytes;
    const auto copy = [&](int piece) {
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int chunk = thread + 128 * i;
        ops::cuda::copy_16_async(
            ops::cuda::shared_address(ring + (piece % kSlots) * kSlotBytes + chunk * 16),
            base + (chunk / kChunksPerRow) * row_bytes + piece * kPieceBytes +
                (chunk % kChunksPerRow) * 16);
      }
    };
#pragma unroll
    for (int p = 0; p < kSlots - 1; ++p) {
      if (p < pieces) copy(p);
      ops::cuda::commit_copies();
    }
    for (int p = 0; p < pieces; ++p) {
      ops::cuda::wait_copies<kSlots - 2>();
      if constexpr (kFence) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
      if (p + kSlots - 1 < pieces) copy(p + kSlots - 1);
      ops::cuda::commit_copies();
      sum += *reinterpret_cast<const unsigned*>(ring + (p % kSlots) * kSlotBytes + thread * 4);
    }
    __syncthreads();
  }
  if (sum == 0x9E3779B9u) atomicAdd(sink, sum);  // keeps the reads
}

template <int kPieceBytes, bool kFence>
void launch_stream_rows(const uint8_t* weight, const int32_t* active, int active_count, int64_t n,
                        int64_t row_bytes, unsigned* sink) {
  constexpr int kSlots = kPieceBytes == 64 ? 8 : kPieceBytes == 128 ? 6 : 3;
  constexpr int kShared = kSlots * 64 * kPieceBytes;
  static const bool configured = [] {
    DI_CUDA_CHECK(cudaFuncSetAttribute(stream_rows_kernel<kPieceBytes, kFence>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kShared));
    return true;
  }();
  (void)configured;
  int sms = 0;
  DI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  stream_rows_kernel<kPieceBytes, kFence>
      <<<4 * sms, 128, kShared>>>(weight, active, active_count, n, row_bytes, sink);
  DI_CUDA_CHECK(cudaGetLastError());
}

void bench_moe(const Roofline& roof, cublasLtHandle_t handle, void* workspace) {
  struct Matrix {
    const char* name;
    int64_t n, k;
  };
  const Matrix matrices[] = {{"w1|w3", 2 * kMoeInter, kHidden}, {"w2", kHidden, kMoeInter}};
  constexpr int kRoutings = 8;  // rotated, so repeated calls do not find the experts in L2
  for (int64_t batch : moe_batches()) {
    std::vector<Routing> routings;
    for (int i = 0; i < kRoutings; ++i) routings.push_back(make_routing(batch, 1000 + i));
    const int64_t rows = batch * kTopK;
    double active = 0;
    for (const Routing& r : routings) active += r.active;
    active /= kRoutings;
    std::printf("moe batch %lld: %lld rows, %.1f active experts on average\n",
                static_cast<long long>(batch), static_cast<long long>(rows), active);
    double total_ours = 0, total_bf16 = 0, total_fp8 = 0, total_bytes_fp4 = 0, total_flops = 0;
    double total_non_invariant[std::size(kNonInvariantRuns)] = {};
    for (const Matrix& mat : matrices) {
      const double flops = 2.0 * rows * mat.n * mat.k;
      const double fp4_expert_bytes = mat.n * mat.k / 2.0 + mat.n * mat.k / 32.0;
      const double act_bytes = rows * (4.0 * mat.k + 4.0 * mat.n);
      // Ours.
      Tensor weight = device_tensor(DType::kF4E2M1x2, {kExperts, mat.n, mat.k}, Fill::kAnyByte, 11);
      Tensor scale = device_tensor(DType::kF8E8M0, {kExperts, mat.n, mat.k / 32}, Fill::kUe8m0, 12);
      Tensor x = device_tensor(DType::kF32, {rows, mat.k}, Fill::kF32, 13);
      Tensor y = Tensor::empty(DType::kF32, {rows, mat.n}, rt::device_allocator());
      const auto grouped = [&](int call) {
        ops::cuda::moe_grouped_gemm_fp4(x.view(), routings[call % kRoutings].device_offsets.view(),
                                        weight.view(), scale.view(), y.view());
      };
      const double ms_ours = time_ms(grouped);
      const std::string name = std::string("routed ") + mat.name;
      report(roof, "moe", name, "ours grouped", batch, ms_ours,
             active * fp4_expert_bytes + act_bytes, flops, roof.fp8_tflops);
      for (size_t i = 0; i < std::size(kNonInvariantRuns); ++i) {
        const double ms = time_non_invariant(kNonInvariantRuns[i], grouped);
        report(roof, "moe", name, kNonInvariantRuns[i].impl, batch, ms,
               active * fp4_expert_bytes + act_bytes, flops, roof.fp8_tflops);
        total_non_invariant[i] += ms;
      }
      {
        // The weight stream alone (stream_rows_kernel), over each routing's active experts.
        std::vector<Tensor> active_lists;
        std::vector<int> active_counts;
        for (const Routing& r : routings) {
          std::vector<int32_t> ids;
          for (int32_t e = 0; e < kExperts; ++e) {
            if (r.counts[e] > 0) ids.push_back(e);
          }
          active_counts.push_back(static_cast<int>(ids.size()));
          Tensor host = Tensor::empty(DType::kI32, {static_cast<int64_t>(ids.size())});
          std::copy(ids.begin(), ids.end(), host.data<int32_t>());
          active_lists.push_back(rt::to_device(host.view()));
        }
        unsigned* sink = nullptr;
        DI_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
        const auto* w = static_cast<const uint8_t*>(weight.view().raw_data());
        const auto stream_row = [&](const char* impl, int64_t piece, auto launch_one) {
          const double ms = time_ms([&](int call) {
            const int i = call % kRoutings;
            launch_one(w, static_cast<const int32_t*>(active_lists[i].view().raw_data()),
                       active_counts[i], mat.n, mat.k / 2, sink);
          });
          // Whole pieces only (w2's 1152-byte rows in 256-byte pieces: 1024 of them).
          const double bytes = active * mat.n * static_cast<double>(mat.k / 2 / piece * piece);
          report(roof, "moe", name, impl, batch, ms, bytes, 0, roof.fp8_tflops);
        };
        stream_row("stream 64 B/row", 64, launch_stream_rows<64, false>);
        stream_row("stream 64 B/row+fence", 64, launch_stream_rows<64, true>);
        stream_row("stream 128 B/row", 128, launch_stream_rows<128, false>);
        stream_row("stream 256 B/row", 256, launch_stream_rows<256, false>);
        DI_CUDA_CHECK(cudaFree(sink));
      }
      total_ours += ms_ours;
      total_bytes_fp4 += active * fp4_expert_bytes + act_bytes;
      total_flops += flops;
      weight = Tensor();
      scale = Tensor();
      // Per-expert cuBLASLt loops, one algorithm per distinct token count.
      for (LtType type : {LtType::kBf16, LtType::kFp8}) {
        const DType dtype = type == LtType::kFp8 ? DType::kF8E4M3 : DType::kBF16;
        const Fill fill_kind = type == LtType::kFp8 ? Fill::kE4m3 : Fill::kBf16;
        Tensor lw = device_tensor(dtype, {kExperts, mat.n, mat.k}, fill_kind, 14);
        Tensor lx = device_tensor(dtype, {rows, mat.k}, fill_kind, 15);
        Tensor ly = Tensor::empty(DType::kBF16, {rows, mat.n}, rt::device_allocator());
        std::map<int32_t, std::unique_ptr<LtGemm>> gemms;
        bool supported = true;
        for (const Routing& r : routings) {
          for (int32_t c : r.counts) {
            if (c > 0 && gemms.count(c) == 0) {
              gemms[c] = std::make_unique<LtGemm>(handle, type, c, mat.n, mat.k, mat.k, mat.n);
              supported = supported && gemms[c]->ok();
            }
          }
        }
        const bool fp8 = type == LtType::kFp8;
        if (!supported) {
          std::printf("moe      %-22s %-16s %6lld  no cuBLASLt algorithm for some count\n",
                      name.c_str(), fp8 ? "cuBLASLt FP8 loop" : "cuBLASLt BF16 loop",
                      static_cast<long long>(batch));
          continue;
        }
        const size_t elem = lt_bytes(type);
        const auto* w_base = static_cast<const uint8_t*>(lw.view().raw_data());
        const auto* x_base = static_cast<const uint8_t*>(lx.view().raw_data());
        auto* y_base = static_cast<uint8_t*>(ly.view().raw_data());
        const double ms = time_ms([&](int call) {
          const Routing& r = routings[call % kRoutings];
          for (int64_t e = 0; e < kExperts; ++e) {
            if (r.counts[e] == 0) continue;
            gemms[r.counts[e]]->run(w_base + e * mat.n * mat.k * elem,
                                    x_base + r.offsets[e] * mat.k * elem,
                                    y_base + r.offsets[e] * mat.n * 2, workspace);
          }
        });
        report(roof, "moe", name, fp8 ? "cuBLASLt FP8 loop" : "cuBLASLt BF16 loop", batch, ms,
               active * mat.n * mat.k * elem + rows * (mat.k * elem + 2.0 * mat.n), flops,
               fp8 ? roof.fp8_tflops : roof.bf16_tflops);
        (fp8 ? total_fp8 : total_bf16) += ms;
      }
    }
    report(roof, "moe", "routed total", "ours grouped", batch, total_ours, total_bytes_fp4,
           total_flops, roof.fp8_tflops);
    for (size_t i = 0; i < std::size(kNonInvariantRuns); ++i) {
      report(roof, "moe", "routed total", kNonInvariantRuns[i].impl, batch, total_non_invariant[i],
             total_bytes_fp4, total_flops, roof.fp8_tflops);
    }
    std::printf(
        "moe batch %lld: grouped %.4f ms, cuBLASLt BF16 loop %.4f ms (%.2fx), FP8 loop "
        "%.4f ms (%.2fx)\n",
        static_cast<long long>(batch), total_ours, total_bf16, total_bf16 / total_ours, total_fp8,
        total_fp8 / total_ours);
  }
}

int run(int argc, char** argv) {
  rt::require_supported_device(0);
  std::string json_path = "layer_bench.json";
  if (argc > 1) {
    json_path = argv[1];
  } else if (const char* out = std::getenv("OUT")) {
    json_path = std::string(out) + "/layer_bench.json";
  }
  cublasLtHandle_t handle;
  BENCH_CUBLAS_CHECK(cublasLtCreate(&handle));
  void* workspace = nullptr;
  DI_CUDA_CHECK(cudaMalloc(&workspace, LtGemm::kWorkspaceBytes));
  const Roofline roof = measure_roofline(handle, workspace);
  // "dense", "moe", or "moe_op" (the whole MoE op alone: a quick run under a profiler)
  const std::string only = std::getenv("LAYER_BENCH_ONLY") ? std::getenv("LAYER_BENCH_ONLY") : "";
  if (only.empty() || only == "dense") bench_dense(roof, handle, workspace);
  if (only.empty() || only == "moe" || only == "moe_op") bench_moe_op(roof);
  if (only.empty() || only == "moe") bench_moe(roof, handle, workspace);
  write_json(json_path, roof);
  std::printf("wrote %s\n", json_path.c_str());
  DI_CUDA_CHECK(cudaFree(workspace));
  cublasLtDestroy(handle);
  return 0;
}

}  // namespace
}  // namespace deepinfer::bench

int main(int argc, char** argv) {
  try {
    return deepinfer::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_layer_bench: %s\n", e.what());
    return 1;
  }
}
