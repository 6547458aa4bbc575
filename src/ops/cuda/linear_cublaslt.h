// The batch-variant path of ops::cuda::linear and linear_grouped (CUDA only): with batch
// invariance off (ops::batch_invariant() false) and at least DEEPINFER_CUBLASLT_MIN_ROWS rows, the
// dense roles run as cuBLASLt BF16 x BF16 -> FP32 GEMMs on the same quantized operands the
// invariant kernels multiply, so only the summation order differs (and, at two terms, the
// activation's third term):
//  - FP8 roles (kFp8PerBlock32, e4m3 weight with ue8m0 block scales): the weight dequantized to
//    bf16 (e4m3 x 2^s is exact in bf16), the activation quantized per 32 exactly as
//    quantize_activation does and stored as bf16 (exact), one GEMM.
//  - BF16 roles (kNone, f32 activation; a bf16 weight, or an fp8 one dequantized to bf16 as for
//    the FP8 roles, the same operands as its dense bf16 form): the activation as bf16 terms (hi =
//    bf16(x), then bf16 of each exact remainder, as linear_bf16_mma's terms): two by default
//    (within 2^-18 |x| an element), three (x exactly) with DEEPINFER_CUBLASLT_BF16_TERMS=3; one
//    GEMM per term accumulating into the output (hi, then + mid, then + lo; beta = 1).
// Every product is exact and every sum is FP32; which sums, in which order, depends on the
// algorithm cuBLASLt picks for the shape, i.e. on the number of rows (no batch invariance).
// The path keeps one cuBLASLt handle per device, one 32 MiB cuBLASLt workspace and grow-only
// staging buffers (the dequantized weight, the bf16 activations) per (device, stream), and the
// heuristic's algorithm per GEMM shape: no per-call allocation and no host synchronization
// (a buffer's growth waits for its stream once, before freeing the smaller one).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/ops.h"

namespace deepinfer::ops::cuda {

// Whether ops::cuda::linear / linear_grouped (and hc_mixes, for its FP32 GEMM) should try the
// path for a call of `rows` rows:
// batch invariance is off and DEEPINFER_CUBLASLT_MIN_ROWS (a RuntimeSetting; 0 = never) is at
// most `rows`. Also while the current stream records a CUDA graph: the call then runs on the path
// when its staging is already large enough (the model's recorded segments run eagerly first at the
// same token count), and a buffer a recording used is never freed (linear_cublaslt.cu,
// GrowOnlyBuffer), so a replay runs the eager step's kernels on memory that stays valid.
bool linear_cublaslt_selected(int64_t rows);

// The row threshold in effect (DEEPINFER_CUBLASLT_MIN_ROWS, or the test's ScopedSetting).
int linear_cublaslt_min_rows();

// Runs out = x . W^T on the path and returns true, or returns false having launched nothing when
// the call does not fit it: a weight other than fp8 e4m3 with ue8m0 block scales (under
// kFp8PerBlock32 or kNone) or bf16 under kNone; K (per group) not a multiple of 32; input or
// output rows not 16-byte aligned (data and row stride); no cuBLASLt algorithm for the shape; or
// a recording stream whose staging would have to grow. With groups > 1 (linear_grouped's
// semantics, kNone, bf16 or fp8 weights): group g multiplies columns [g K, (g + 1) K) of x by
// weight rows [g N / groups, (g + 1) N / groups) into the same output columns, all groups in one
// strided-batched GEMM per term (an fp8 weight dequantized whole, its groups whole scale blocks:
// ops::linear_grouped_supports). Shapes must match (Error otherwise).
bool try_linear_cublaslt(const TensorView& x, const LinearWeight& weight, const TensorView& out,
                         ActivationQuant activation_quant, int64_t groups = 1);

// try_linear_cublaslt that throws an Error when the call does not fit (tests and benches force
// the path at any row count with it).
void linear_cublaslt(const TensorView& x, const LinearWeight& weight, const TensorView& out,
                     ActivationQuant activation_quant, int64_t groups = 1);

// out = the fp8 weight as bf16 [out, in] (ops::dequantize_weight's bf16 form on the GPU: the
// kernel the path runs on every call for a weight without a bf16_copy).
void dequantize_fp8_weight_bf16(const LinearWeight& weight, const TensorView& out);

// out[r, :n] = x[r, :k] . w[:n, :k]^T for r < rows, all f32 (row strides in elements), as one
// cuBLASLt GEMM with CUBLAS_COMPUTE_32F (FP32 products and sums, no TF32): the batch-variant path
// of callers whose operands are f32 matrices (hc_mixes). Returns false having launched nothing
// when cuBLASLt has no algorithm for the shape, or while the current stream records a graph
// before any eager call on it reserved cuBLASLt's workspace.
bool try_gemm_f32_cublaslt(const float* x, int64_t x_stride, int64_t rows, const float* w,
                           int64_t w_stride, int64_t n, int64_t k, float* out, int64_t out_stride);

}  // namespace deepinfer::ops::cuda
