// The batch-variant path of ops::cuda::linear / linear_grouped (linear_cublaslt.cu: cuBLASLt bf16
// GEMMs on the quantized operands) against the CPU reference (ops::linear / linear_grouped on host
// views), at every released dense role's shape and at odd shapes (M off the tiles, K a multiple of
// 32 but not of 128, N off 16), on strided input rows into a column slice of a NaN-filled output
// (every element written, nothing outside). Also: the dispatch takes the path only with batch
// invariance off and from DEEPINFER_CUBLASLT_MIN_ROWS rows (with invariance on, the bits are the
// invariant kernels' whatever the threshold); the path is deterministic (two calls, same bits);
// calls it does not fit fall back; under a graph recording it runs on staging that fits; an fp8
// weight's bf16 copy (LinearWeight::bf16_copy) gives the same bits as dequantizing on every call;
// an fp8 weight without activation quantization (the grouped wo_a as released) gives the bits of
// its bf16 dequantization as a bf16 weight. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "gpu_support.h"
#include "ops/batch_invariance.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/linear_bf16_mma.h"
#include "ops/cuda/linear_cublaslt.h"
#include "ops/cuda/linear_fp8_dense.h"
#include "ops/cuda/runtime_switch.h"
#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

namespace rt = deepinfer::cuda;
using testing::random_bytes;
using testing::random_e4m3;
using testing::same_bits;

// Every product is exact (each 32-block's in f32, the dequantized operands' in bf16): the order of
// the FP32 additions is all that differs from the reference. The BF16 roles' default two
// activation terms drop at most 2^-18 |x| an element, about an FP32 reordering's worth, so the
// same bound holds (linear_cublaslt.cu, DEEPINFER_CUBLASLT_BF16_TERMS).
constexpr double kTolerance = testing::kExactProductsTolerance;
using testing::kColumnOffset;
using testing::kExtraColumns;

// kFp8: the FP8 roles (fp8 weight, kFp8PerBlock32). kBf16: the BF16 roles on a bf16 weight;
// kFp8Weight: the same role (kNone) on an fp8 weight, read as its exact bf16 dequantization.
enum class Kind { kFp8, kBf16, kFp8Weight };

struct Case {
  std::string name;
  Kind kind = Kind::kFp8;
  int64_t n = 0;  // all groups' output columns
  int64_t k = 0;  // one group's input columns
  int64_t groups = 1;
  int64_t rows = 0;
  Tensor x;  // host f32 [rows, groups k + kExtraColumns]
  Tensor weight;
  Tensor scale;  // fp8 weights only
  Tensor device_x, device_weight, device_scale;
  std::vector<int64_t> sample;  // rows checked against the reference
  Tensor want;                  // host f32 [sample.size(), n]

  int64_t in_cols() const { return groups * k; }
  bool fp8_weight() const { return kind != Kind::kBf16; }
  ActivationQuant quant() const {
    return kind == Kind::kFp8 ? ActivationQuant::kFp8PerBlock32 : ActivationQuant::kNone;
  }
  LinearWeight host_linear_weight() const {
    return {weight.view(), fp8_weight() ? scale.view() : TensorView()};
  }
  LinearWeight device_linear_weight() const {
    return {device_weight.view(), fp8_weight() ? device_scale.view() : TensorView()};
  }
};

// c.sample and c.want: the rows of `sample` below c.rows (every row when empty) through the CPU
// reference.
void set_reference(Case& c, std::vector<int64_t> sample) {
  const int64_t rows = c.rows;
  const int64_t n = c.n;
  const int64_t groups = c.groups;
  const int64_t width = c.in_cols() + kExtraColumns;
  if (sample.empty()) {
    for (int64_t r = 0; r < rows; ++r) sample.push_back(r);
  }
  for (int64_t r : sample) {
    if (r < rows) c.sample.push_back(r);
  }
  const auto count = static_cast<int64_t>(c.sample.size());
  Tensor gathered = Tensor::empty(DType::kF32, {count, c.in_cols()});
  for (int64_t i = 0; i < count; ++i) {
    const float* row = c.x.data<float>() + c.sample[i] * width + kColumnOffset;
    std::copy(row, row + c.in_cols(), gathered.data<float>() + i * c.in_cols());
  }
  c.want = Tensor::empty(DType::kF32, {count, n});
  if (groups > 1) {
    linear_grouped(gathered.view(), c.host_linear_weight(), groups, c.want.view());
  } else {
    linear(gathered.view(), c.host_linear_weight(), c.want.view(), c.quant());
  }
}

// A case with its reference on `sample` rows (every row when empty and rows are few).
Case make_case(std::string name, Kind kind, int64_t n, int64_t k, int64_t groups, int64_t rows,
               uint32_t seed, std::vector<int64_t> sample = {}) {
  Case c;
  c.name = std::move(name);
  c.kind = kind;
  c.n = n;
  c.k = k;
  c.groups = groups;
  c.rows = rows;
  const int64_t width = c.in_cols() + kExtraColumns;
  c.x = Tensor::empty(DType::kF32, {rows, width});
  const std::vector<float> values =
      testing::random_values(static_cast<size_t>(c.x.numel()), seed, 2.0f);
  std::copy(values.begin(), values.end(), c.x.data<float>());
  if (c.fp8_weight()) {
    c.weight = random_e4m3({n, k}, seed + 1);
    // ue8m0 codes near 2^-8: realistic weight magnitudes.
    c.scale = random_bytes(DType::kF8E8M0, {(n + 31) / 32, (k + 31) / 32}, seed + 2, 117, 121);
    c.device_scale = rt::to_device(c.scale.view());
  } else {
    // bf16 weights: random f32 values rounded to bf16 by truncating their bits (exact bf16).
    c.weight = Tensor::empty(DType::kBF16, {n, k});
    const std::vector<float> w =
        testing::random_values(static_cast<size_t>(n * k), seed + 1, 0.05f);
    auto* bits = static_cast<uint16_t*>(c.weight.view().raw_data());
    for (size_t i = 0; i < w.size(); ++i) {
      uint32_t word = 0;
      std::memcpy(&word, &w[i], sizeof(word));
      bits[i] = static_cast<uint16_t>(word >> 16);
    }
  }
  c.device_x = rt::to_device(c.x.view());
  c.device_weight = rt::to_device(c.weight.view());
  set_reference(c, std::move(sample));
  return c;
}

// The case as a bf16 weight: the fp8 weight's exact bf16 dequantization, the same input, rows and
// reference rows (its reference computed again on the bf16 weight: the same bits on the CPU).
Case bf16_twin(const Case& c) {
  Case twin;
  twin.name = c.name + " as bf16";
  twin.kind = Kind::kBf16;
  twin.n = c.n;
  twin.k = c.k;
  twin.groups = c.groups;
  twin.rows = c.rows;
  twin.x = Tensor::empty(DType::kF32, c.x.shape());
  std::memcpy(twin.x.view().raw_data(), c.x.view().raw_data(), c.x.view().nbytes());
  twin.weight = Tensor::empty(DType::kBF16, {c.n, c.k});
  dequantize_weight(c.host_linear_weight(), twin.weight.view());
  twin.device_x = rt::to_device(twin.x.view());
  twin.device_weight = rt::to_device(twin.weight.view());
  set_reference(twin, c.sample);
  return twin;
}

// How run_gpu calls the GPU: the model's op (ops::cuda::linear / linear_grouped under the
// current policy), linear_cublaslt forced, or the invariant kernel the op runs with batch
// invariance on (linear_fp8_dense / linear_bf16_mma; grouped: linear_bf16_mma per group; an fp8
// weight without activation quantization: linear_bf16_mma on its bf16 dequantization, whose bits
// the op promises).
enum class Path { kModelOp, kCublasLt, kInvariantKernel };

// Rows [first, first + count) on the GPU into a column slice of a NaN-filled matrix twice as
// wide: the other half must stay NaN and every element of the slice must be written.
// bf16_copy: the weight's LinearWeight::bf16_copy (empty: none).
Tensor run_gpu(const Case& c, int64_t first, int64_t count, Path path,
               const TensorView& bf16_copy = TensorView()) {
  Tensor wide = Tensor::empty(DType::kF32, {count, 2 * c.n}, rt::device_allocator());
  rt::fill_bytes(wide.view(), 0xFF);
  const TensorView out = wide.view().narrow(1, c.n, c.n);
  const TensorView x =
      c.device_x.view().narrow(0, first, count).narrow(1, kColumnOffset, c.in_cols());
  LinearWeight w = c.device_linear_weight();
  w.bf16_copy = bf16_copy;
  switch (path) {
    case Path::kModelOp:
      if (c.groups > 1) {
        cuda::linear_grouped(x, w, c.groups, out);
      } else {
        cuda::linear(x, w, out, c.quant());
      }
      break;
    case Path::kCublasLt:
      cuda::linear_cublaslt(x, w, out, c.quant(), c.groups);
      break;
    case Path::kInvariantKernel:
      if (c.kind == Kind::kFp8) {
        cuda::linear_fp8_dense(x, w, out);
      } else {
        Tensor dequantized;
        TensorView bf16_weight = c.device_weight.view();
        if (c.kind == Kind::kFp8Weight) {
          dequantized = Tensor::empty(DType::kBF16, {c.n, c.k}, rt::device_allocator());
          cuda::dequantize_weight(c.device_linear_weight(), dequantized.view());
          bf16_weight = dequantized.view();
        }
        const int64_t group_out = c.n / c.groups;
        for (int64_t g = 0; g < c.groups; ++g) {
          cuda::linear_bf16_mma(x.narrow(1, g * c.k, c.k),
                                LinearWeight{bf16_weight.narrow(0, g * group_out, group_out), {}},
                                out.narrow(1, g * group_out, group_out));
        }
        rt::synchronize();  // before `dequantized` is freed
      }
      break;
  }
  rt::synchronize();
  return testing::output_between_guards(rt::to_host(wide.view()), count, c.n, c.name);
}

// Worst |got - want| over the sampled rows in [first, first + count), over their max |want|.
double sample_error(const Case& c, const Tensor& got, int64_t first, int64_t count) {
  return testing::sampled_rows_error(c.sample, c.want, c.n, got, first, count);
}

class LinearCublasLtTest : public ::testing::Test {
 protected:
  void SetUp() override { DEEPINFER_SKIP_WITHOUT_GPU(); }
};

// One case: the forced path and the model's op with batch invariance off (threshold 1) against
// the reference and each other bit for bit (so the op did take the path, and the path is
// deterministic); with batch invariance on (threshold 1 still set) the op's bits are the invariant
// kernel's (V4.1 shapes, where that kernel takes the shape), and a row computed alone equals the
// same row of the full call.
void check_case(const Case& c, bool compare_invariant_kernel) {
  const Tensor forced = run_gpu(c, 0, c.rows, Path::kCublasLt);
  const double error = sample_error(c, forced, 0, c.rows);
  std::printf("%s [%ld x %ld%s], %ld rows: worst error %.3g of the output's scale\n",
              c.name.c_str(), static_cast<long>(c.n), static_cast<long>(c.k),
              c.groups > 1 ? (", " + std::to_string(c.groups) + " groups").c_str() : "",
              static_cast<long>(c.rows), error);
  EXPECT_LE(error, kTolerance) << c.name << ", " << c.rows << " rows";
  EXPECT_TRUE(same_bits(forced, run_gpu(c, 0, c.rows, Path::kCublasLt)))
      << c.name << ": two calls of the path differ";
  if (c.quant() == ActivationQuant::kNone) {
    // The stacked-terms form (one GEMM of terms x M rows, the blocks added in term order), at the
    // default two terms and at three (x exactly), which must take effect: other bits.
    for (const int terms : {2, 3}) {
      const rt::ScopedSetting term_count{"DEEPINFER_CUBLASLT_BF16_TERMS", terms};
      const Tensor separate = run_gpu(c, 0, c.rows, Path::kCublasLt);
      const double separate_error = sample_error(c, separate, 0, c.rows);
      const rt::ScopedSetting stacked{"DEEPINFER_CUBLASLT_BF16_STACKED_MAX_ROWS", 1 << 30};
      const double stacked_error =
          sample_error(c, run_gpu(c, 0, c.rows, Path::kCublasLt), 0, c.rows);
      std::printf("%s, %d terms: worst error %.3g, stacked %.3g\n", c.name.c_str(), terms,
                  separate_error, stacked_error);
      EXPECT_LE(separate_error, kTolerance) << c.name << ", " << c.rows << " rows, " << terms;
      EXPECT_LE(stacked_error, kTolerance)
          << c.name << ", " << c.rows << " rows, stacked, " << terms;
      if (terms == 3) {
        EXPECT_FALSE(same_bits(separate, forced))
            << c.name << ": DEEPINFER_CUBLASLT_BF16_TERMS=3 did not change the result";
      }
    }
  }
  if (c.fp8_weight()) {
    // The model's bf16 copy of the weight (DEEPINFER_BF16_WEIGHT_COPIES): the GPU's dequantized
    // bits are the CPU's (which checks every value is exact in bf16), and the path reading the
    // copy multiplies the same operands as the path dequantizing on every call: the same bits.
    Tensor copy = Tensor::empty(DType::kBF16, {c.n, c.k}, rt::device_allocator());
    cuda::dequantize_weight(c.device_linear_weight(), copy.view());
    Tensor host_copy = Tensor::empty(DType::kBF16, {c.n, c.k});
    dequantize_weight(LinearWeight{c.weight.view(), c.scale.view()}, host_copy.view());
    EXPECT_TRUE(same_bits(rt::to_host(copy.view()), host_copy))
        << c.name << ": the GPU's bf16 dequantization differs from the CPU's";
    EXPECT_TRUE(same_bits(forced, run_gpu(c, 0, c.rows, Path::kCublasLt, copy.view())))
        << c.name << ": the path reading the bf16 copy differs from the path dequantizing";
  }
  {
    const ScopedBatchInvariance off(false);
    const rt::ScopedSetting threshold{"DEEPINFER_CUBLASLT_MIN_ROWS", 1};
    EXPECT_TRUE(cuda::linear_cublaslt_selected(c.rows));
    EXPECT_TRUE(same_bits(forced, run_gpu(c, 0, c.rows, Path::kModelOp)))
        << c.name << ": the model's op with batch invariance off is not the cuBLASLt path";
  }
  {
    const ScopedBatchInvariance on(true);
    const rt::ScopedSetting threshold{"DEEPINFER_CUBLASLT_MIN_ROWS", 1};
    EXPECT_FALSE(cuda::linear_cublaslt_selected(c.rows));
    const Tensor invariant = run_gpu(c, 0, c.rows, Path::kModelOp);
    EXPECT_LE(sample_error(c, invariant, 0, c.rows), kTolerance) << c.name << ", invariant";
    if (compare_invariant_kernel) {
      EXPECT_TRUE(same_bits(invariant, run_gpu(c, 0, c.rows, Path::kInvariantKernel)))
          << c.name << ": with batch invariance on, the model's op is not the invariant kernel";
    }
    // Batch invariance: the last row alone has the full call's bits.
    const Tensor alone = run_gpu(c, c.rows - 1, 1, Path::kModelOp);
    EXPECT_EQ(std::memcmp(alone.data<float>(), invariant.data<float>() + (c.rows - 1) * c.n,
                          static_cast<size_t>(c.n) * sizeof(float)),
              0)
        << c.name << ": with batch invariance on, a row alone differs from the full call's";
  }
}

// Sampled rows of the real shapes (the reference costs N x K per row on the CPU).
const std::vector<int64_t> kSampleRows = {0, 1, 77, 128, 129, 255, 299, 1279, 1280, 1299};

TEST_F(LinearCublasLtTest, Fp8RolesV41Shapes) {
  uint32_t seed = 11;
  for (const testing::WeightShape& s : testing::released_fp8_roles()) {
    check_case(make_case(s.name, Kind::kFp8, s.n, s.k, 1, 300, seed, kSampleRows),
               /*compare_invariant_kernel=*/true);
    seed += 10;
  }
}

TEST_F(LinearCublasLtTest, Bf16RolesV41Shapes) {
  check_case(make_case("gate", Kind::kBf16, 384, 5120, 1, 300, 101, kSampleRows), true);
  check_case(make_case("compressor wkv|wgate", Kind::kBf16, 1024, 5120, 1, 300, 111, kSampleRows),
             true);
}

// wo_a through linear_grouped: 8 groups of [1024, 4096] in one strided-batched GEMM per term.
// 1300 rows stage more than the 256 MiB budget at 3 terms, so the call runs in row chunks (1280 +
// 20: a second, smaller GEMM shape).
TEST_F(LinearCublasLtTest, WoAGroupedV41Shape) {
  check_case(make_case("wo_a (8 groups)", Kind::kBf16, 8 * 1024, 4096, 8, 1300, 121, kSampleRows),
             true);
}

// wo_a as released: the same grouped call on the fp8 weight without activation quantization,
// against the reference and, bit for bit, against the call on its bf16 dequantization (the GEMMs
// multiply identical operands): at the default two terms and at three, stacked (one chunk of all
// rows) and in row chunks, at 1300 rows and at 77.
TEST_F(LinearCublasLtTest, WoAGroupedFp8WeightV41Shape) {
  const Case c =
      make_case("wo_a fp8 (8 groups)", Kind::kFp8Weight, 8 * 1024, 4096, 8, 1300, 131, kSampleRows);
  check_case(c, /*compare_invariant_kernel=*/true);
  const Case twin = bf16_twin(c);
  EXPECT_TRUE(same_bits(c.want, twin.want)) << "the CPU's fp8 and bf16 references differ";
  for (const int terms : {2, 3}) {
    for (const int stacked_max_rows : {0, 1 << 30}) {
      const rt::ScopedSetting term_count{"DEEPINFER_CUBLASLT_BF16_TERMS", terms};
      const rt::ScopedSetting stacked{"DEEPINFER_CUBLASLT_BF16_STACKED_MAX_ROWS", stacked_max_rows};
      for (const int64_t rows : {c.rows, int64_t{77}}) {
        EXPECT_TRUE(same_bits(run_gpu(c, 0, rows, Path::kCublasLt),
                              run_gpu(twin, 0, rows, Path::kCublasLt)))
            << c.name << ", " << rows << " rows, " << terms << " terms, stacked max rows "
            << stacked_max_rows << ": the fp8 weight's bits differ from its bf16 dequantization's";
      }
    }
  }
}

// Odd shapes, every row against the reference: M off every tile (1, 3, 77, 130, 257), K a
// multiple of 32 but not of 128 (96, 160, 416), N off 16 (40, 72: a partial scale block row for
// FP8), small grouped calls (bf16, and fp8 without activation quantization: 32-row groups, the
// only fp8 weights this path takes without activation quantization).
TEST_F(LinearCublasLtTest, OddShapes) {
  struct Shape {
    Kind kind;
    int64_t n, k, groups, rows;
  };
  uint32_t seed = 201;
  for (const Shape& s :
       {Shape{Kind::kFp8, 40, 96, 1, 1}, Shape{Kind::kFp8, 72, 160, 1, 3},
        Shape{Kind::kFp8, 48, 416, 1, 77}, Shape{Kind::kFp8, 136, 224, 1, 257},
        Shape{Kind::kBf16, 40, 96, 1, 3}, Shape{Kind::kBf16, 72, 160, 1, 130},
        Shape{Kind::kBf16, 48, 416, 1, 257}, Shape{Kind::kBf16, 96, 96, 3, 77},
        Shape{Kind::kFp8Weight, 64, 160, 2, 130}, Shape{Kind::kFp8Weight, 96, 96, 3, 77}}) {
    const char* kind = s.kind == Kind::kFp8 ? "fp8" : s.kind == Kind::kBf16 ? "bf16" : "fp8 weight";
    const std::string name =
        std::string(kind) + " odd " + std::to_string(s.n) + " x " + std::to_string(s.k);
    check_case(make_case(name, s.kind, s.n, s.k, s.groups, s.rows, seed),
               /*compare_invariant_kernel=*/false);
    seed += 10;
  }
}

// The threshold: batch invariance off, fewer rows than DEEPINFER_CUBLASLT_MIN_ROWS (or 0) gives
// the invariant kernel's bits; from the threshold on, the path's.
TEST_F(LinearCublasLtTest, ThresholdAndPolicy) {
  const Case c = make_case("wq_a", Kind::kFp8, 1280, 5120, 1, 200, 301, {0, 199});
  const Tensor invariant = run_gpu(c, 0, c.rows, Path::kInvariantKernel);
  const Tensor forced = run_gpu(c, 0, c.rows, Path::kCublasLt);
  const ScopedBatchInvariance off(false);
  {
    const rt::ScopedSetting threshold{"DEEPINFER_CUBLASLT_MIN_ROWS", 201};
    EXPECT_FALSE(cuda::linear_cublaslt_selected(200));
    EXPECT_TRUE(same_bits(invariant, run_gpu(c, 0, c.rows, Path::kModelOp)));
  }
  {
    const rt::ScopedSetting threshold{"DEEPINFER_CUBLASLT_MIN_ROWS", 0};
    EXPECT_FALSE(cuda::linear_cublaslt_selected(1 << 20));
    EXPECT_TRUE(same_bits(invariant, run_gpu(c, 0, c.rows, Path::kModelOp)));
  }
  {
    const rt::ScopedSetting threshold{"DEEPINFER_CUBLASLT_MIN_ROWS", 200};
    EXPECT_TRUE(cuda::linear_cublaslt_selected(200));
    EXPECT_TRUE(same_bits(forced, run_gpu(c, 0, c.rows, Path::kModelOp)));
  }
  std::printf("default DEEPINFER_CUBLASLT_MIN_ROWS: %d\n", cuda::linear_cublaslt_min_rows());
}

// Calls the path does not take fall back (K % 32 != 0, f32 weights, a misaligned input), still
// matching the reference; linear_cublaslt refuses them with an Error.
TEST_F(LinearCublasLtTest, UnsupportedCallsFallBack) {
  const ScopedBatchInvariance off(false);
  const rt::ScopedSetting threshold{"DEEPINFER_CUBLASLT_MIN_ROWS", 1};
  {
    const Case c = make_case("bf16 k 40", Kind::kBf16, 48, 40, 1, 20, 401);
    EXPECT_LE(sample_error(c, run_gpu(c, 0, c.rows, Path::kModelOp), 0, c.rows), kTolerance);
    EXPECT_THROW(run_gpu(c, 0, c.rows, Path::kCublasLt), Error);
  }
  {
    const Case c = make_case("fp8 misaligned", Kind::kFp8, 64, 256, 1, 20, 411);
    // Input columns starting one float later: no longer 16-byte aligned.
    const TensorView x =
        c.device_x.view().narrow(0, 0, c.rows).narrow(1, kColumnOffset + 1, c.in_cols());
    Tensor out = Tensor::empty(DType::kF32, {c.rows, c.n}, rt::device_allocator());
    EXPECT_FALSE(cuda::try_linear_cublaslt(x, c.device_linear_weight(), out.view(), c.quant(), 1));
    EXPECT_THROW(cuda::linear_cublaslt(x, c.device_linear_weight(), out.view(), c.quant()), Error);
  }
  {
    // A dense fp8 weight without activation quantization (the dense numerics' FP8 roles) is not
    // this path's: its truncated activation terms exceed the dense numerics' bound end to end.
    const Tensor weight = rt::to_device(random_e4m3({64, 64}, 431).view());
    const Tensor scale = rt::to_device(random_bytes(DType::kF8E8M0, {2, 2}, 432, 117, 121).view());
    Tensor x = Tensor::empty(DType::kF32, {80, 64}, rt::device_allocator());
    rt::fill_bytes(x.view(), 0);
    Tensor out = Tensor::empty(DType::kF32, {80, 64}, rt::device_allocator());
    EXPECT_FALSE(cuda::try_linear_cublaslt(x.view(), LinearWeight{weight.view(), scale.view()},
                                           out.view(), ActivationQuant::kNone, 1));
  }
  {
    // Four groups of 16 rows of an fp8 weight with 32-row scale blocks: no group owns its scale
    // rows, so there is no linear_grouped to run. An Error, not a guess.
    const Tensor weight = rt::to_device(random_e4m3({64, 64}, 421).view());
    const Tensor scale = rt::to_device(random_bytes(DType::kF8E8M0, {2, 2}, 422, 117, 121).view());
    const LinearWeight w{weight.view(), scale.view()};
    EXPECT_FALSE(linear_grouped_supports(w, 4));
    Tensor x = Tensor::empty(DType::kF32, {20, 4 * 64}, rt::device_allocator());
    rt::fill_bytes(x.view(), 0);
    Tensor out = Tensor::empty(DType::kF32, {20, 64}, rt::device_allocator());
    EXPECT_THROW(cuda::try_linear_cublaslt(x.view(), w, out.view(), ActivationQuant::kNone, 4),
                 Error);
  }
}

// Inside a graph recording the path runs when the recording stream's staging already fits (the
// model's recorded segments run eagerly first at the same token count): the replay gives the
// eager call's bits, and still does after a larger eager call grew that staging (a buffer a
// recording used is retired, never freed; scripts/cuda/run_device_tests.sh runs this under
// compute-sanitizer memcheck, which reports a replay reading freed memory). A recorded call whose
// staging would have to grow falls back to the invariant kernel, with no error.
TEST_F(LinearCublasLtTest, RecordsOnStagingThatFits) {
  OpRecorder* recorder = op_recorder(Device::cuda(0));
  ASSERT_NE(recorder, nullptr);
  // Activation staging (bf16): 1.3 MB, 15 MB and 20 MB; the same weight (13 MB dequantized).
  const Case small = make_case("wq_a 130", Kind::kFp8, 1280, 5120, 1, 130, 501, {0});
  const Case larger = make_case("wq_a 1500", Kind::kFp8, 1280, 5120, 1, 1500, 502, {0});
  const Case largest = make_case("wq_a 2000", Kind::kFp8, 1280, 5120, 1, 2000, 503, {0});
  const Tensor largest_invariant = run_gpu(largest, 0, largest.rows, Path::kInvariantKernel);
  const ScopedBatchInvariance off(false);
  const rt::ScopedSetting threshold{"DEEPINFER_CUBLASLT_MIN_ROWS", 1};
  auto record = [&](const Case& c, const TensorView& out) {
    const TensorView x = c.device_x.view().narrow(1, kColumnOffset, c.in_cols());
    recorder->begin();
    cuda::linear(x, c.device_linear_weight(), out, c.quant());
    return recorder->end();
  };
  auto replay = [&](RecordedOps& recorded, const TensorView& out) {
    rt::fill_bytes(out, 0xFF);
    recorded.replay();
    rt::synchronize();
    return rt::to_host(out);
  };
  recorder->begin_step();  // the step stream, as the model's recorded steps run on
  const Tensor eager = run_gpu(small, 0, small.rows, Path::kModelOp);  // grows its staging
  EXPECT_LE(sample_error(small, eager, 0, small.rows), kTolerance);
  EXPECT_TRUE(same_bits(eager, run_gpu(small, 0, small.rows, Path::kCublasLt)));
  Tensor small_out = Tensor::empty(DType::kF32, {small.rows, small.n}, rt::device_allocator());
  const std::unique_ptr<RecordedOps> recorded = record(small, small_out.view());
  EXPECT_TRUE(same_bits(eager, replay(*recorded, small_out.view())));
  // Growth past the recorded buffer: the recording keeps reading its own.
  EXPECT_LE(sample_error(larger, run_gpu(larger, 0, larger.rows, Path::kModelOp), 0, larger.rows),
            kTolerance);
  EXPECT_TRUE(same_bits(eager, replay(*recorded, small_out.view())));
  // Staging that does not fit while recording: the invariant kernel is recorded instead.
  Tensor largest_out =
      Tensor::empty(DType::kF32, {largest.rows, largest.n}, rt::device_allocator());
  const std::unique_ptr<RecordedOps> fallback = record(largest, largest_out.view());
  EXPECT_TRUE(same_bits(largest_invariant, replay(*fallback, largest_out.view())));
  recorder->end_step();
}

}  // namespace
}  // namespace deepinfer::ops
