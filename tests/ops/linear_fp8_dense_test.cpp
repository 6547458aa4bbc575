// The dense FP8 path of ops::cuda::linear (linear_fp8_dense) against the CPU reference (ops::linear
// on host views with the released activation quantizer) at every released FP8 role's shape: wq_a,
// wkv, wq_b, wo_b, the shared expert's w1 / w3 and w2, the indexer's wq_b. Each role runs at 1, 7,
// 16, 40 and 300 rows (two also at 520, where the prefill tile is picked) on strided input rows;
// a sample of rows is checked against the reference (it costs N x K per row on the CPU), every
// row bit for bit against the largest call, and every launch variant against kAuto. Outputs are
// fully written and nothing else. The decode tile (split_tile_kernel) is compared bit for bit with
// the register kernel before it (split_kernel) at decode row counts. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "gpu_support.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/linear_fp8_dense.h"
#include "ops/cuda/moe_grouped_gemm.h"
#include "ops/cuda/runtime_switch.h"
#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

namespace rt = deepinfer::cuda;
using cuda::Fp8DenseLaunch;
using testing::random_bytes;
using testing::random_e4m3;

// Every product is exact (each 32-block's in f32, the dequantized operands' in bf16): the order of
// the FP32 additions is all that differs from the reference.
constexpr double kTolerance = testing::kExactProductsTolerance;
using testing::kColumnOffset;
using testing::kExtraColumns;

// Rows checked against the CPU reference (those below a call's row count).
const std::vector<int64_t> kSampleRows = {0, 6, 15, 39, 150, 299, 519};

const char* launch_name(Fp8DenseLaunch launch) {
  switch (launch) {
    case Fp8DenseLaunch::kAuto:
      return "auto";
    case Fp8DenseLaunch::kTokens8:
      return "8-token split";
    case Fp8DenseLaunch::kTokens16:
      return "16-token split";
    case Fp8DenseLaunch::kTokens32:
      return "32-token split";
    case Fp8DenseLaunch::kPrefillTile:
      return "prefill tile";
  }
  return "?";
}

struct Role {
  std::string name;
  int64_t n = 0;
  int64_t k = 0;
  int64_t max_rows = 0;
  Tensor x;       // host f32 [max_rows, k + kExtraColumns]
  Tensor weight;  // host e4m3 [n, k]
  Tensor scale;   // host ue8m0 [ceil(n / 32), k / 32]
  Tensor device_x;
  Tensor device_weight;
  Tensor device_scale;
  std::vector<int64_t> sample;  // kSampleRows below max_rows
  Tensor want;                  // host f32 [sample.size(), n]: the reference's rows
};

Role make_role(std::string name, int64_t n, int64_t k, int64_t max_rows, uint32_t seed,
               bool with_reference = true) {
  Role r;
  r.name = std::move(name);
  r.n = n;
  r.k = k;
  r.max_rows = max_rows;
  r.x = Tensor::empty(DType::kF32, {max_rows, k + kExtraColumns});
  const std::vector<float> values =
      testing::random_values(static_cast<size_t>(r.x.numel()), seed, 2.0f);
  std::copy(values.begin(), values.end(), r.x.data<float>());
  r.weight = random_e4m3({n, k}, seed + 1);
  // ue8m0 codes near 2^-8: realistic weight magnitudes.
  r.scale = random_bytes(DType::kF8E8M0, {(n + 31) / 32, k / 32}, seed + 2, 117, 121);
  r.device_x = rt::to_device(r.x.view());
  r.device_weight = rt::to_device(r.weight.view());
  r.device_scale = rt::to_device(r.scale.view());
  if (!with_reference) return r;
  for (int64_t row : kSampleRows) {
    if (row < max_rows) r.sample.push_back(row);
  }
  // The reference on the sampled rows only (each row's result depends on that row alone).
  Tensor gathered = Tensor::empty(DType::kF32, {static_cast<int64_t>(r.sample.size()), k});
  for (size_t i = 0; i < r.sample.size(); ++i) {
    const float* row = r.x.data<float>() + r.sample[i] * (k + kExtraColumns) + kColumnOffset;
    std::copy(row, row + k, gathered.data<float>() + static_cast<int64_t>(i) * k);
  }
  r.want = Tensor::empty(DType::kF32, {static_cast<int64_t>(r.sample.size()), n});
  linear(gathered.view(), LinearWeight{r.weight.view(), r.scale.view()}, r.want.view(),
         ActivationQuant::kFp8PerBlock32);
  return r;
}

TensorView input_rows(const Role& r, int64_t first, int64_t count) {
  return r.device_x.view().narrow(0, first, count).narrow(1, kColumnOffset, r.k);
}

// How run_gpu calls the GPU: ops::cuda::linear (the model's op), linear_fp8_dense with a launch,
// or linear_fp8_mma (the path before).
enum class Path { kModelOp, kDense, kMma };

// Rows [first, first + count) on the GPU. The output is a column slice of a NaN-filled matrix
// twice as wide: the other half must stay NaN and every element of the slice must be written.
Tensor run_gpu(const Role& r, int64_t first, int64_t count, Path path,
               Fp8DenseLaunch launch = Fp8DenseLaunch::kAuto) {
  Tensor wide = Tensor::empty(DType::kF32, {count, 2 * r.n}, rt::device_allocator());
  rt::fill_bytes(wide.view(), 0xFF);
  const TensorView out = wide.view().narrow(1, r.n, r.n);
  const TensorView x = input_rows(r, first, count);
  const LinearWeight w{r.device_weight.view(), r.device_scale.view()};
  switch (path) {
    case Path::kModelOp:
      cuda::linear(x, w, out, ActivationQuant::kFp8PerBlock32);
      break;
    case Path::kDense:
      cuda::linear_fp8_dense(x, w, out, launch);
      break;
    case Path::kMma:
      cuda::linear_fp8_mma(x, w, out);
      break;
  }
  rt::synchronize();
  return testing::output_between_guards(rt::to_host(wide.view()), count, r.n, r.name);
}

// Worst |got - want| over the sampled rows below `count` (rows offset by `first`), over
// max |want| of those rows.
double sample_error(const Role& r, const Tensor& got, int64_t first, int64_t count) {
  return testing::sampled_rows_error(r.sample, r.want, r.n, got, first, count);
}

// Rows of `part` (rows [first, first + part rows) of the call) that differ from `all`'s.
int64_t differing_rows(const Tensor& all, const Tensor& part, int64_t first, int64_t n) {
  int64_t differ = 0;
  const int64_t rows = part.view().size(0);
  for (int64_t m = 0; m < rows; ++m) {
    differ += std::memcmp(all.data<float>() + (first + m) * n, part.data<float>() + m * n,
                          static_cast<size_t>(n) * sizeof(float)) != 0;
  }
  return differ;
}

class LinearFp8DenseTest : public ::testing::Test {
 protected:
  void SetUp() override { DEEPINFER_SKIP_WITHOUT_GPU(); }
};

// One role: the largest call through the model's op is the bit reference for every smaller call
// (batch invariance) and for every launch variant on the largest call.
void check_role(const Role& r) {
  const int slices = cuda::linear_fp8_dense_k_slices(r.n, r.k);
  std::printf("%s [%ld x %ld]: K in %d slices, path %s\n", r.name.c_str(), static_cast<long>(r.n),
              static_cast<long>(r.k), slices, cuda::linear_fp8_dense_enabled() ? "on" : "off");
  ASSERT_TRUE(cuda::linear_fp8_dense_supports(
                  LinearWeight{r.device_weight.view(), r.device_scale.view()}) ||
              !cuda::linear_fp8_dense_enabled());
  const Tensor all = run_gpu(r, 0, r.max_rows, Path::kModelOp);
  const double all_error = sample_error(r, all, 0, r.max_rows);
  std::printf("%s, %ld rows (%s): worst error %.3g of the output's scale\n", r.name.c_str(),
              static_cast<long>(r.max_rows),
              launch_name(cuda::linear_fp8_dense_auto_launch(r.max_rows, r.n, r.k)), all_error);
  EXPECT_LE(all_error, kTolerance) << r.name << ", " << r.max_rows << " rows";
  for (int64_t rows : {1, 7, 16, 40, 300}) {
    if (rows >= r.max_rows) continue;
    const Tensor got = run_gpu(r, 0, rows, Path::kModelOp);
    const double error = sample_error(r, got, 0, rows);
    std::printf("%s, %ld rows (%s): worst error %.3g\n", r.name.c_str(), static_cast<long>(rows),
                launch_name(cuda::linear_fp8_dense_auto_launch(rows, r.n, r.k)), error);
    EXPECT_LE(error, kTolerance) << r.name << ", " << rows << " rows";
    EXPECT_EQ(differing_rows(all, got, 0, r.n), 0)
        << r.name << ": rows of a " << rows << "-row call differ from the " << r.max_rows
        << "-row call";
  }
  // A 7-row call starting at row 33 (not on a token tile's edge).
  EXPECT_EQ(differing_rows(all, run_gpu(r, 33, 7, Path::kModelOp), 33, r.n), 0)
      << r.name << ": rows 33..39 differ when called alone";
  if (!cuda::linear_fp8_dense_enabled()) return;
  for (Fp8DenseLaunch launch : {Fp8DenseLaunch::kTokens8, Fp8DenseLaunch::kTokens16,
                                Fp8DenseLaunch::kTokens32, Fp8DenseLaunch::kPrefillTile}) {
    if (launch == Fp8DenseLaunch::kPrefillTile && r.n % 128 != 0) continue;
    const Tensor got = run_gpu(r, 0, r.max_rows, Path::kDense, launch);
    EXPECT_EQ(differing_rows(all, got, 0, r.n), 0)
        << r.name << ": the " << launch_name(launch) << " differs from kAuto at " << r.max_rows
        << " rows";
  }
  // One slice: the same operations as linear_fp8_mma (informational: that kernel is not ours).
  if (slices == 1) {
    const Tensor mma = run_gpu(r, 0, 16, Path::kMma);
    std::printf("%s: one slice, %ld of 16 rows differ from linear_fp8_mma's bits\n", r.name.c_str(),
                static_cast<long>(differing_rows(all, mma, 0, r.n)));
  }
}

TEST_F(LinearFp8DenseTest, AttentionWqA) {
  check_role(make_role("wq_a", 1280, 5120, 300, 11));
}

TEST_F(LinearFp8DenseTest, AttentionWkv) {
  check_role(make_role("wkv", 512, 5120, 300, 21));
}

TEST_F(LinearFp8DenseTest, AttentionWqB) {
  check_role(make_role("wq_b", 32768, 1280, 300, 31));
}

TEST_F(LinearFp8DenseTest, AttentionWoBPrefill) {
  check_role(make_role("wo_b", 5120, 8192, 520, 41));
}

TEST_F(LinearFp8DenseTest, SharedExpertW1) {
  check_role(make_role("shared w1", 2304, 5120, 300, 51));
}

TEST_F(LinearFp8DenseTest, SharedExpertW2) {
  check_role(make_role("shared w2", 5120, 2304, 300, 61));
}

TEST_F(LinearFp8DenseTest, IndexerWqBPrefill) {
  check_role(make_role("indexer wq_b", 4096, 1280, 520, 71));
}

// Every launch variant on small shapes, every row against the reference (quick under
// compute-sanitizer): a partial 32-row scale block and partial row-group blocks (48 rows), slices
// of 3 blocks that end inside the tile's 4-block stages (256 x 384), a partial token tile.
TEST_F(LinearFp8DenseTest, SmallShapesEveryLaunch) {
  struct Case {
    int64_t n, k, rows;
  };
  for (const Case& c : {Case{48, 256, 5}, Case{48, 256, 13}, Case{48, 256, 40}, Case{256, 384, 70},
                        Case{128, 128, 3}}) {
    Role r = make_role("small", c.n, c.k, c.rows, 81, /*with_reference=*/false);
    r.sample.clear();
    for (int64_t row = 0; row < c.rows; ++row) r.sample.push_back(row);
    Tensor dense = Tensor::empty(DType::kF32, {c.rows, c.k});
    for (int64_t row = 0; row < c.rows; ++row) {
      const float* source = r.x.data<float>() + row * (c.k + kExtraColumns) + kColumnOffset;
      std::copy(source, source + c.k, dense.data<float>() + row * c.k);
    }
    r.want = Tensor::empty(DType::kF32, {c.rows, c.n});
    linear(dense.view(), LinearWeight{r.weight.view(), r.scale.view()}, r.want.view(),
           ActivationQuant::kFp8PerBlock32);
    const Tensor model_op = run_gpu(r, 0, c.rows, Path::kModelOp);
    EXPECT_LE(sample_error(r, model_op, 0, c.rows), kTolerance)
        << c.n << " x " << c.k << ", " << c.rows << " rows, model op";
    for (Fp8DenseLaunch launch :
         {Fp8DenseLaunch::kAuto, Fp8DenseLaunch::kTokens8, Fp8DenseLaunch::kTokens16,
          Fp8DenseLaunch::kTokens32, Fp8DenseLaunch::kPrefillTile}) {
      if (launch == Fp8DenseLaunch::kPrefillTile && c.n % 128 != 0) continue;
      const Tensor got = run_gpu(r, 0, c.rows, Path::kDense, launch);
      const double error = sample_error(r, got, 0, c.rows);
      std::printf("small %ld x %ld (%d slices), %ld rows, %s: worst error %.3g\n",
                  static_cast<long>(c.n), static_cast<long>(c.k),
                  cuda::linear_fp8_dense_k_slices(c.n, c.k), static_cast<long>(c.rows),
                  launch_name(launch), error);
      EXPECT_LE(error, kTolerance)
          << c.n << " x " << c.k << ", " << c.rows << " rows, " << launch_name(launch);
      if (cuda::linear_fp8_dense_enabled()) {
        EXPECT_EQ(differing_rows(model_op, got, 0, c.n), 0)
            << c.n << " x " << c.k << ", " << c.rows << " rows: " << launch_name(launch)
            << " differs from the model's op";
      }
    }
  }
}

// Turns the decode tile off for its lifetime (split_kernel, the register loads before it, runs
// the decode launches), on again after, also when a call throws.
struct RegisterDecodeKernel {
  rt::ScopedSwitch decode_tile{"DEEPINFER_FP8_DENSE_DECODE_TILE", false};
};

// Rows [first, first + count) of `r` through each decode launch, with the decode tile and with
// the register kernel: every output row must have the same bits (run_gpu also checks that both
// write every element of the output and nothing outside it). With `reference`, the decode tile's
// sampled rows are also checked against r.want.
void expect_decode_tile_bits(const Role& r, int64_t first, int64_t count, bool reference) {
  for (Fp8DenseLaunch launch :
       {Fp8DenseLaunch::kTokens8, Fp8DenseLaunch::kTokens16, Fp8DenseLaunch::kTokens32}) {
    const Tensor tile = run_gpu(r, first, count, Path::kDense, launch);
    Tensor before;
    {
      const RegisterDecodeKernel register_kernel;
      before = run_gpu(r, first, count, Path::kDense, launch);
    }
    EXPECT_EQ(differing_rows(before, tile, 0, r.n), 0)
        << r.name << " [" << r.n << " x " << r.k << "], rows " << first << ".." << first + count
        << ", " << launch_name(launch) << ": the decode tile differs from the register kernel";
    if (reference) {
      EXPECT_LE(sample_error(r, tile, first, count), kTolerance)
          << r.name << " [" << r.n << " x " << r.k << "], rows " << first << ".." << first + count
          << ", " << launch_name(launch);
    }
  }
}

// The decode tile against the register kernel and the CPU reference on small shapes (quick under
// compute-sanitizer): slices of 1 block (48 x 256, 8 slices), 3 blocks with idle warps (48 x 384:
// 4 slices, a chunk's last block unused, 3 row groups in blocks of 2), 19 blocks (64 x 2432:
// 5 chunks, so the slots wrap, the last one of 3 blocks); 1 to 40 rows.
TEST_F(LinearFp8DenseTest, DecodeTileSmallShapes) {
  struct Case {
    int64_t n, k;
  };
  std::printf("decode tile %s\n", cuda::linear_fp8_dense_decode_tile_enabled() ? "on" : "off");
  for (const Case& c : {Case{48, 256}, Case{48, 384}, Case{64, 2432}}) {
    constexpr int64_t kRows = 40;
    Role r = make_role("small", c.n, c.k, kRows, 101, /*with_reference=*/false);
    r.sample.clear();
    for (int64_t row = 0; row < kRows; ++row) r.sample.push_back(row);
    Tensor dense = Tensor::empty(DType::kF32, {kRows, c.k});
    for (int64_t row = 0; row < kRows; ++row) {
      const float* source = r.x.data<float>() + row * (c.k + kExtraColumns) + kColumnOffset;
      std::copy(source, source + c.k, dense.data<float>() + row * c.k);
    }
    r.want = Tensor::empty(DType::kF32, {kRows, c.n});
    linear(dense.view(), LinearWeight{r.weight.view(), r.scale.view()}, r.want.view(),
           ActivationQuant::kFp8PerBlock32);
    std::printf("small %ld x %ld: %d slices\n", static_cast<long>(c.n), static_cast<long>(c.k),
                cuda::linear_fp8_dense_k_slices(c.n, c.k));
    for (int64_t rows : {1, 13, 40}) expect_decode_tile_bits(r, 0, rows, /*reference=*/true);
    // Rows not starting on a token tile.
    expect_decode_tile_bits(r, 3, 7, /*reference=*/true);
  }
}

// The decode tile against the register kernel, bit for bit, at every released FP8 role's shape
// at decode row counts (the CPU reference is check_role's, through the model's op).
TEST_F(LinearFp8DenseTest, DecodeTileRealShapes) {
  std::printf("decode tile %s\n", cuda::linear_fp8_dense_decode_tile_enabled() ? "on" : "off");
  uint32_t seed = 111;
  for (const testing::WeightShape& s : testing::released_fp8_roles()) {
    const Role r = make_role(s.name, s.n, s.k, 40, seed, /*with_reference=*/false);
    seed += 10;
    std::printf("%s [%ld x %ld]: %d slices\n", s.name, static_cast<long>(s.n),
                static_cast<long>(s.k), cuda::linear_fp8_dense_k_slices(s.n, s.k));
    for (int64_t rows : {1, 2, 8, 16, 32}) expect_decode_tile_bits(r, 0, rows, /*reference=*/false);
    expect_decode_tile_bits(r, 5, 35, /*reference=*/false);
  }
}

// Programmatic dependent launch (DEEPINFER_DECODE_PDL) moves no arithmetic: the decode launches
// give the same bits with it and without it, also right behind the activation quantizer that
// lets them start early (every call here is one).
TEST_F(LinearFp8DenseTest, DecodePdlSameBits) {
  struct Case {
    int64_t n, k, rows;
  };
  for (const Case& c : {Case{48, 2048, 1}, Case{64, 2432, 13}, Case{48, 384, 40}}) {
    const Role r = make_role("small", c.n, c.k, c.rows, 151, /*with_reference=*/false);
    for (Fp8DenseLaunch launch :
         {Fp8DenseLaunch::kTokens8, Fp8DenseLaunch::kTokens16, Fp8DenseLaunch::kTokens32}) {
      const Tensor dependent = run_gpu(r, 0, c.rows, Path::kDense, launch);
      Tensor ordered;
      {
        const rt::ScopedSwitch plain_order{"DEEPINFER_DECODE_PDL", false};
        ordered = run_gpu(r, 0, c.rows, Path::kDense, launch);
      }
      EXPECT_EQ(differing_rows(ordered, dependent, 0, c.n), 0)
          << c.n << " x " << c.k << ", " << c.rows << " rows, " << launch_name(launch);
    }
  }
}

// Both outputs of linear_fp8_dense_pair (pair) or of two linear_fp8_dense calls on rows
// [0, rows) of `a`'s input, each a column slice of a NaN-filled matrix twice as wide (checked
// written, and nothing else).
std::pair<Tensor, Tensor> run_pair(const Role& a, const Role& b, int64_t rows, bool pair) {
  Tensor wide_a = Tensor::empty(DType::kF32, {rows, 2 * a.n}, rt::device_allocator());
  Tensor wide_b = Tensor::empty(DType::kF32, {rows, 2 * b.n}, rt::device_allocator());
  rt::fill_bytes(wide_a.view(), 0xFF);
  rt::fill_bytes(wide_b.view(), 0xFF);
  const TensorView out_a = wide_a.view().narrow(1, a.n, a.n);
  const TensorView out_b = wide_b.view().narrow(1, b.n, b.n);
  const TensorView x = input_rows(a, 0, rows);
  const LinearWeight wa{a.device_weight.view(), a.device_scale.view()};
  const LinearWeight wb{b.device_weight.view(), b.device_scale.view()};
  if (pair) {
    cuda::linear_fp8_dense_pair(x, wa, out_a, wb, out_b);
  } else {
    cuda::linear_fp8_dense(x, wa, out_a);
    cuda::linear_fp8_dense(x, wb, out_b);
  }
  rt::synchronize();
  return {testing::output_between_guards(rt::to_host(wide_a.view()), rows, a.n, a.name),
          testing::output_between_guards(rt::to_host(wide_b.view()), rows, b.n, b.name)};
}

// linear_fp8_dense_pair gives two linear_fp8_dense calls' bits: in one launch where it fuses (the
// model's wq_a + wkv and the shared expert's w1 + w3 at decode rows, small shapes with partial
// row-group blocks, with and without the dependent launch), in two calls where it does not
// (other K slices). The model's op (ops::cuda::linear_pair) takes it at decode rows.
TEST_F(LinearFp8DenseTest, PairSameBitsAsTwoCalls) {
  struct Case {
    int64_t n1, n2, k;
    std::vector<int64_t> rows;
    bool same_slices;
  };
  const std::vector<Case> cases = {
      {1280, 512, 5120, {1, 7, 16, 40}, true},  // wq_a + wkv
      {2304, 2304, 5120, {1, 5, 33}, true},     // shared w1 + w3
      {48, 80, 2048, {1, 13, 40}, true},        // partial blocks of 8 / S row groups
      {48, 8192, 384, {1, 9}, false},           // K in 4 slices against 2: two calls
  };
  uint32_t seed = 211;
  for (const Case& c : cases) {
    const int64_t max_rows = *std::max_element(c.rows.begin(), c.rows.end());
    const Role a = make_role("pair first", c.n1, c.k, max_rows, seed, /*with_reference=*/false);
    const Role b = make_role("pair second", c.n2, c.k, max_rows, seed + 7, false);
    seed += 13;
    const LinearWeight wa{a.device_weight.view(), a.device_scale.view()};
    const LinearWeight wb{b.device_weight.view(), b.device_scale.view()};
    for (int64_t rows : c.rows) {
      const bool fuses = cuda::linear_fp8_dense_pair_fuses(rows, wa, wb);
      std::printf("%ld + %ld x %ld, %ld rows: %s\n", static_cast<long>(c.n1),
                  static_cast<long>(c.n2), static_cast<long>(c.k), static_cast<long>(rows),
                  fuses ? "one launch" : "two calls");
      if (rows <= 16) {
        EXPECT_EQ(fuses, c.same_slices) << c.n1 << " + " << c.n2 << ", " << rows;
      }
      const auto [want_a, want_b] = run_pair(a, b, rows, /*pair=*/false);
      const auto [got_a, got_b] = run_pair(a, b, rows, /*pair=*/true);
      EXPECT_EQ(differing_rows(want_a, got_a, 0, c.n1), 0) << c.n1 << " + " << c.n2 << ", " << rows;
      EXPECT_EQ(differing_rows(want_b, got_b, 0, c.n2), 0) << c.n1 << " + " << c.n2 << ", " << rows;
      if (rows == 1) {
        const rt::ScopedSwitch plain_order{"DEEPINFER_DECODE_PDL", false};
        const auto [ordered_a, ordered_b] = run_pair(a, b, rows, /*pair=*/true);
        EXPECT_EQ(differing_rows(want_a, ordered_a, 0, c.n1), 0) << "without PDL";
        EXPECT_EQ(differing_rows(want_b, ordered_b, 0, c.n2), 0) << "without PDL";
      }
    }
  }
}

// Shapes the path does not take (K % 128 != 0, N % 16 != 0): linear_fp8_dense refuses them and
// the prefill tile refuses N % 128 != 0; ops::cuda::linear still runs them (another kernel).
TEST_F(LinearFp8DenseTest, UnsupportedShapesFallBack) {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{48, 192}, std::pair<int64_t, int64_t>{40, 256}}) {
    Role r = make_role("unsupported", n, k, 5, 91);
    EXPECT_FALSE(cuda::linear_fp8_dense_supports(
        LinearWeight{r.device_weight.view(), r.device_scale.view()}));
    EXPECT_THROW(run_gpu(r, 0, 5, Path::kDense), Error) << n << " x " << k;
    EXPECT_LE(sample_error(r, run_gpu(r, 0, 5, Path::kModelOp), 0, 5), kTolerance)
        << n << " x " << k;
  }
  Role r = make_role("no tile", 48, 256, 5, 93);
  EXPECT_THROW(run_gpu(r, 0, 5, Path::kDense, Fp8DenseLaunch::kPrefillTile), Error);
}

}  // namespace
}  // namespace deepinfer::ops
