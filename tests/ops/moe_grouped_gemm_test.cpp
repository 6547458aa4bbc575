// The grouped FP8 x FP4 expert GEMM (ops::cuda::moe_grouped_gemm_fp4) against the CPU
// reference: each expert's rows through ops::linear on host views (ops/cpu) with the same fp4
// weights and the released activation quantizer. Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "gpu_support.h"
#include "moe_test_util.h"
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
using testing::ExpertSet;
using testing::make_experts;
using testing::make_problem;
using testing::Problem;
using testing::random_bytes;
using testing::random_e4m3;
using testing::random_f32;
using testing::random_routes;
using testing::reference;
using testing::run_moe_op;
using testing::worst_error_matching_nans;

// Summation order only: each 32-block's products are exact in fp32 (e2m1 and e4m3 significands
// are short), the reference adds them in another order. Hopper's FP8 tensor cores add with
// fewer bits than fp32 over long K (DeepSeek-V3 report, 3.3.2), but one 32-wide step starts
// from zero here; the H200 gave 1.4e-7 (2026-11-30), the same bound as ops::linear's.
constexpr double kTolerance = 2e-5;

// Runs the GPU op over x's rows [first_row, first_row + row_count) (all by default).
Tensor run_gpu(const Problem& p, const std::vector<int32_t>& offsets, int64_t first_row = 0,
               int64_t row_count = -1) {
  if (row_count < 0) row_count = p.x.view().size(0);
  std::vector<int32_t> host_offsets = offsets;
  Tensor d_offsets =
      rt::to_device(testing::view_of(host_offsets, {static_cast<int64_t>(host_offsets.size())}));
  Tensor dx = rt::to_device(p.x.view().narrow(0, first_row, row_count));
  Tensor dw = rt::to_device(p.weight.view());
  Tensor ds = rt::to_device(p.scale.view());
  Tensor out = Tensor::empty(DType::kF32, {row_count, p.n}, rt::device_allocator());
  rt::fill_bytes(out.view(), 0xFF);  // NaN: an element never written stays NaN
  cuda::moe_grouped_gemm_fp4(dx.view(), d_offsets.view(), dw.view(), ds.view(), out.view());
  rt::synchronize();
  return rt::to_host(out.view());
}

class MoeGroupedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override { DEEPINFER_SKIP_WITHOUT_GPU(); }
};

void check_against_reference(const Problem& p, const std::string& what) {
  const Tensor want = reference(p);
  const Tensor got = run_gpu(p, p.offsets);
  const double error = worst_error_matching_nans(want, got);
  std::printf("%s: worst error %.3g of the output's scale\n", what.c_str(), error);
  EXPECT_LE(error, kTolerance) << what;
}

TEST_F(MoeGroupedGemmTest, SmallShapesDecodeAndPrefillTiles) {
  // Empty experts, one-row experts, a tile's worth plus one, and two trailing rows that belong
  // to no expert (must stay unwritten).
  check_against_reference(make_problem(6, 48, 512, {3, 0, 1, 9, 0, 17}, 2, 11),
                          "decode tiles (30 rows, 6 experts)");
  // Fewer rows than experts: blocks walk only the experts that have rows.
  std::vector<int32_t> sparse(40, 0);
  sparse[0] = 1;
  sparse[7] = 2;
  sparse[39] = 1;
  check_against_reference(make_problem(40, 32, 256, sparse, 1, 15),
                          "sparse experts (4 rows, 40 experts)");
  // 16+ rows per expert selects the 64-token tile.
  check_against_reference(make_problem(3, 32, 256, {70, 1, 129}, 0, 21),
                          "prefill tiles (200 rows, 3 experts)");
}

TEST_F(MoeGroupedGemmTest, V41FlashExpertShapes) {
  // w1|w3 concatenated (4608 x 5120) and w2 (5120 x 2304), a few experts and rows.
  check_against_reference(make_problem(3, 4608, 5120, {2, 1, 3}, 0, 31), "w13 4608x5120");
  check_against_reference(make_problem(3, 5120, 2304, {1, 4, 2}, 0, 41), "w2 5120x2304");
}

// Each listed row of `all` (one call over all of p's rows) equals the same row computed alone:
// `call_alone(offsets, row)` runs a one-row call whose offsets give the row's expert that row.
void expect_rows_alone_equal(
    const Problem& p, const Tensor& all, std::initializer_list<int64_t> rows,
    const std::function<Tensor(const std::vector<int32_t>&, int64_t)>& call_alone,
    const std::string& what) {
  for (const int64_t row : rows) {
    const auto expert = static_cast<int64_t>(
        std::upper_bound(p.offsets.begin(), p.offsets.end(), static_cast<int32_t>(row)) -
        p.offsets.begin() - 1);
    std::vector<int32_t> single(p.experts + 1, 0);
    for (int64_t e = expert + 1; e <= p.experts; ++e) single[e] = 1;
    const Tensor alone = call_alone(single, row);
    EXPECT_EQ(0, std::memcmp(all.data<float>() + row * p.n, alone.data<float>(),
                             static_cast<size_t>(p.n) * sizeof(float)))
        << what << ", row " << row;
  }
}

TEST_F(MoeGroupedGemmTest, RowsDoNotDependOnTheBatch) {
  // The same rows through the prefill tile (200 rows in the call) and alone (a one-row call,
  // the decode tile) are bit-equal.
  const Problem p = make_problem(3, 64, 512, {70, 1, 129}, 0, 51);
  const Tensor all = run_gpu(p, p.offsets);
  expect_rows_alone_equal(
      p, all, {0, 69, 70, 71, 150, 199},
      [&](const std::vector<int32_t>& offsets, int64_t row) { return run_gpu(p, offsets, row, 1); },
      "prefill tile against one-row calls");
}

// ---- the prefill tile (rows >= 16 x experts, N % 128 == 0) ---------------------------------

// A problem's tensors on the device, uploaded once for many calls.
struct DeviceProblem {
  explicit DeviceProblem(const Problem& p)
      : x(rt::to_device(p.x.view())),
        weight(rt::to_device(p.weight.view())),
        scale(rt::to_device(p.scale.view())) {}
  Tensor x;
  Tensor weight;
  Tensor scale;
};

// One call over x rows [first, first + count) with `offsets` relative to `first`: [count, N] on
// the host, NaN where nothing was written.
Tensor call_gpu(const DeviceProblem& d, int64_t n, const std::vector<int32_t>& offsets,
                int64_t first, int64_t count) {
  std::vector<int32_t> host_offsets = offsets;
  Tensor d_offsets =
      rt::to_device(testing::view_of(host_offsets, {static_cast<int64_t>(host_offsets.size())}));
  Tensor out = Tensor::empty(DType::kF32, {count, n}, rt::device_allocator());
  rt::fill_bytes(out.view(), 0xFF);
  cuda::moe_grouped_gemm_fp4(d.x.view().narrow(0, first, count), d_offsets.view(), d.weight.view(),
                             d.scale.view(), out.view());
  rt::synchronize();
  return rt::to_host(out.view());
}

// The offsets a call over rows [first, first + count) sees.
std::vector<int32_t> window_offsets(const std::vector<int32_t>& offsets, int64_t first,
                                    int64_t count) {
  std::vector<int32_t> result;
  for (int32_t offset : offsets) {
    result.push_back(static_cast<int32_t>(std::clamp<int64_t>(offset - first, 0, count)));
  }
  return result;
}

// Every row of `all` (one call over all rows: the prefill tile) equals the same row from calls
// over windows of fewer than 16 rows per expert (the decode tile), bit for bit; rows outside
// every expert are unwritten in both.
void check_bits_against_decode_tile(const Problem& p, const DeviceProblem& d, const Tensor& all,
                                    const std::string& what) {
  const int64_t rows = p.x.view().size(0);
  const int64_t window = 16 * p.experts - 1;
  int64_t mismatched = 0;
  int64_t first_mismatch = -1;
  for (int64_t first = 0; first < rows; first += window) {
    const int64_t count = std::min(window, rows - first);
    const Tensor part = call_gpu(d, p.n, window_offsets(p.offsets, first, count), first, count);
    for (int64_t r = 0; r < count; ++r) {
      if (std::memcmp(all.data<float>() + (first + r) * p.n, part.data<float>() + r * p.n,
                      static_cast<size_t>(p.n) * sizeof(float)) != 0) {
        if (first_mismatch < 0) first_mismatch = first + r;
        ++mismatched;
      }
    }
  }
  std::printf("%s: %ld of %ld rows differ from the decode tile's bits\n", what.c_str(),
              static_cast<long>(mismatched), static_cast<long>(rows));
  EXPECT_EQ(mismatched, 0) << what << ", first differing row " << first_mismatch;
}

// Against the CPU reference on rows around the tile edges of each expert (the full reference at
// these shapes takes the CPU too long; the bit check above covers every row); rows outside every
// expert must be unwritten.
void check_sampled_rows(const Problem& p, const Tensor& got, const std::string& what) {
  const int64_t rows = p.x.view().size(0);
  double scale = 1e-30;
  double worst = 0.0;
  for (int64_t e = 0; e < p.experts; ++e) {
    const int64_t first = p.offsets[e];
    const int64_t count = p.offsets[e + 1] - first;
    std::vector<int64_t> picked;
    for (int64_t local :
         {int64_t{0}, int64_t{64}, int64_t{97}, int64_t{128}, int64_t{256}, count - 1}) {
      if (local >= 0 && local < count &&
          std::find(picked.begin(), picked.end(), local) == picked.end()) {
        picked.push_back(local);
      }
    }
    for (int64_t local : picked) {
      const int64_t row = first + local;
      Tensor want = Tensor::empty(DType::kF32, {1, p.n});
      linear(p.x.view().narrow(0, row, 1),
             LinearWeight{p.weight.view().select(0, e), p.scale.view().select(0, e)}, want.view(),
             ActivationQuant::kFp8PerBlock32);
      for (int64_t i = 0; i < p.n; ++i) {
        const double w = want.data<float>()[i];
        const double g = got.data<float>()[row * p.n + i];
        scale = std::max(scale, std::abs(w));
        worst = std::max(worst, std::isnan(g) ? INFINITY : std::abs(g - w));
      }
    }
  }
  std::printf("%s: worst error %.3g of the sampled rows' scale\n", what.c_str(), worst / scale);
  EXPECT_LE(worst / scale, kTolerance) << what;
  for (int64_t row = p.offsets.back(); row < rows; ++row) {
    for (int64_t i = 0; i < p.n; ++i) {
      ASSERT_TRUE(std::isnan(got.data<float>()[row * p.n + i])) << what << ": row " << row;
    }
  }
}

TEST_F(MoeGroupedGemmTest, PrefillTileSmallShapes) {
  // 177 rows over 3 experts: a full 128-row tile plus a 2-row remainder, an empty expert, a
  // 45-row expert in two 32-row tiles, two rows in no expert. Small enough for memcheck and
  // racecheck.
  const Problem p = make_problem(3, 256, 512, {130, 0, 45}, 2, 111);
  check_against_reference(p, "prefill tile (177 rows, 3 experts, 256x512)");
  const DeviceProblem d(p);
  const Tensor all = call_gpu(d, p.n, p.offsets, 0, p.x.view().size(0));
  check_bits_against_decode_tile(p, d, all, "prefill tile 256x512");
  // A remainder of more than 96 rows takes a full-size tile: 100 and 97 + 128 rows.
  const Problem q = make_problem(2, 128, 256, {100, 225}, 0, 121);
  check_against_reference(q, "prefill tile (100 and 225 rows, 128x256)");
  const DeviceProblem dq(q);
  check_bits_against_decode_tile(q, dq, call_gpu(dq, q.n, q.offsets, 0, q.x.view().size(0)),
                                 "prefill tile 128x256");
  // Offsets past the rows are clamped as in the decode tile; decreasing ones overlap experts'
  // rows (which expert's result a row keeps is then unspecified) but read and write nothing
  // outside x, out and the tile lists.
  const Tensor clamped = call_gpu(d, p.n, {0, 130, 130, 100000}, 0, p.x.view().size(0));
  // The same seed and row count: the same x and weights with the last expert's end at 177.
  const Problem clamped_problem = make_problem(3, 256, 512, {130, 0, 47}, 0, 111);
  EXPECT_LE(worst_error_matching_nans(reference(clamped_problem), clamped), kTolerance);
  // Two experts over the same 177 rows (decreasing offsets): tiles for both, each row written by
  // one of them; nothing outside the buffers (memcheck says so).
  EXPECT_NO_THROW(call_gpu(d, p.n, {0, 177, 0, 177}, 0, p.x.view().size(0)));
}

TEST_F(MoeGroupedGemmTest, PrefillTileV41FlashExpertShapes) {
  // 8 experts with ragged counts at the real w1|w3 and w2 shapes: 300 (2 full tiles + 44 rows),
  // empty, 129 (a full tile + 1 row), 128, 1, 97 (one full-size tile), 33 (two 32-row tiles),
  // 250 (two full-size tiles); 3 trailing rows in no expert (941 rows, not a tile multiple).
  const std::vector<int32_t> counts = {300, 0, 129, 128, 1, 97, 33, 250};
  const struct {
    int64_t n, k;
    uint32_t seed;
    const char* what;
  } cases[] = {{4608, 5120, 131, "prefill tile w13 4608x5120"},
               {5120, 2304, 141, "prefill tile w2 5120x2304"}};
  for (const auto& c : cases) {
    const Problem p = make_problem(8, c.n, c.k, counts, 3, c.seed);
    const DeviceProblem d(p);
    const Tensor all = call_gpu(d, p.n, p.offsets, 0, p.x.view().size(0));
    check_sampled_rows(p, all, c.what);
    check_bits_against_decode_tile(p, d, all, c.what);
    expect_rows_alone_equal(
        p, all, {0, 299, 429, 937},
        [&](const std::vector<int32_t>& offsets, int64_t row) {
          return call_gpu(d, p.n, offsets, row, 1);
        },
        c.what);
  }
}

// ---- the dense FP8 path (linear_fp8_mma) ----------------------------------------------------

// Worst error of linear_fp8_mma on x rows [first, first + count) against the CPU reference,
// and the GPU output.
std::pair<double, Tensor> fp8_case(const Tensor& x, const Tensor& w, const Tensor& s, int64_t first,
                                   int64_t count) {
  const TensorView rows = x.view().narrow(0, first, count);
  Tensor want = Tensor::empty(DType::kF32, {count, w.view().size(0)});
  linear(rows, LinearWeight{w.view(), s.view()}, want.view(), ActivationQuant::kFp8PerBlock32);
  Tensor dx = rt::to_device(rows);
  Tensor dw = rt::to_device(w.view());
  Tensor ds = rt::to_device(s.view());
  Tensor out = Tensor::empty(DType::kF32, {count, w.view().size(0)}, rt::device_allocator());
  rt::fill_bytes(out.view(), 0xFF);
  cuda::linear_fp8_mma(dx.view(), LinearWeight{dw.view(), ds.view()}, out.view());
  rt::synchronize();
  Tensor got = rt::to_host(out.view());
  return {worst_error_matching_nans(want, got), std::move(got)};
}

TEST_F(MoeGroupedGemmTest, DenseFp8MatchesReference) {
  struct Shape2 {
    int64_t n, k, rows;
    const char* what;
  };
  // Small with a partial 32-row scale block, both token tiles; V4.1-Flash wq_b and wo_b.
  for (const Shape2& c :
       {Shape2{48, 512, 5, "48x512, 5 rows"}, Shape2{48, 512, 40, "48x512, 40 rows"},
        Shape2{32768, 1280, 3, "wq_b 32768x1280"}, Shape2{5120, 8192, 2, "wo_b 5120x8192"}}) {
    const Tensor x = random_f32({c.rows, c.k}, 81);
    const Tensor w = random_e4m3({c.n, c.k}, 82);
    const Tensor s = random_bytes(DType::kF8E8M0, {(c.n + 31) / 32, c.k / 32}, 83, 117, 121);
    const double error = fp8_case(x, w, s, 0, c.rows).first;
    std::printf("dense fp8 %s: worst error %.3g of the output's scale\n", c.what, error);
    EXPECT_LE(error, kTolerance) << c.what;
  }
  // Rows of a 40-row call (wide tile) equal the same rows alone (decode tile), bit for bit.
  const Tensor x = random_f32({40, 512}, 91);
  const Tensor w = random_e4m3({64, 512}, 92);
  const Tensor s = random_bytes(DType::kF8E8M0, {2, 16}, 93, 117, 121);
  const Tensor all = fp8_case(x, w, s, 0, 40).second;
  for (int64_t row : {0, 17, 39}) {
    const Tensor alone = fp8_case(x, w, s, row, 1).second;
    EXPECT_EQ(0, std::memcmp(all.data<float>() + row * 64, alone.data<float>(), 64 * sizeof(float)))
        << "row " << row;
  }
}

// ops::cuda::linear, the model's op, takes the tensor-core path for FP8 32x32 weights under the
// released numerics (same bits as calling linear_fp8_dense) and keeps the FMA tile kernel without
// activation quantization (within the reference tolerance either way).
TEST_F(MoeGroupedGemmTest, ModelLinearUsesTheTensorCoresForReleasedFp8) {
  const Tensor x = random_f32({3, 512}, 101);
  const Tensor w = random_e4m3({64, 512}, 102);
  const Tensor s = random_bytes(DType::kF8E8M0, {2, 16}, 103, 117, 121);
  Tensor dx = rt::to_device(x.view());
  Tensor dw = rt::to_device(w.view());
  Tensor ds = rt::to_device(s.view());
  // The op's FP8 path is linear_fp8_dense (K split by the weight's shape, so its last bits are
  // not linear_fp8_mma's): the op must give exactly the direct call's bits.
  Tensor direct_out = Tensor::empty(DType::kF32, {3, 64}, rt::device_allocator());
  cuda::linear_fp8_dense(dx.view(), LinearWeight{dw.view(), ds.view()}, direct_out.view());
  rt::synchronize();
  const Tensor direct = rt::to_host(direct_out.view());
  for (ActivationQuant quant : {ActivationQuant::kFp8PerBlock32, ActivationQuant::kNone}) {
    Tensor out = Tensor::empty(DType::kF32, {3, 64}, rt::device_allocator());
    rt::fill_bytes(out.view(), 0xFF);
    cuda::linear(dx.view(), LinearWeight{dw.view(), ds.view()}, out.view(), quant);
    rt::synchronize();
    const Tensor got = rt::to_host(out.view());
    if (quant == ActivationQuant::kFp8PerBlock32) {
      EXPECT_EQ(0, std::memcmp(direct.data<float>(), got.data<float>(), 3 * 64 * sizeof(float)));
    }
    Tensor want = Tensor::empty(DType::kF32, {3, 64});
    linear(x.view(), LinearWeight{w.view(), s.view()}, want.view(), quant);
    EXPECT_LE(worst_error_matching_nans(want, got), kTolerance);
  }
}

// ops::cuda::moe_experts, the model's op, runs FP4 experts of aligned shapes with FP8
// activations on the grouped tensor-core kernel (each expert its own allocation, as in the
// model): against the CPU reference, and a token's output alone equal to it inside the batch.
TEST_F(MoeGroupedGemmTest, ModelMoeExpertsUsesTheGroupedKernel) {
  constexpr int64_t kExperts = 4, kDim = 256, kInter = 512, kTokens = 40, kTopK = 2;
  std::vector<Tensor> host_storage, device_storage;
  std::vector<ExpertWeights> host_experts(kExperts), device_experts(kExperts);
  uint32_t seed = 300;
  const auto make = [&](int64_t out, int64_t in, LinearWeight& host, LinearWeight& device) {
    const Tensor& w =
        host_storage.emplace_back(random_bytes(DType::kF4E2M1x2, {out, in}, ++seed, 0, 255));
    const Tensor& sc =
        host_storage.emplace_back(random_bytes(DType::kF8E8M0, {out, in / 32}, ++seed, 117, 121));
    const Tensor& dw = device_storage.emplace_back(rt::to_device(w.view()));
    const Tensor& dsc = device_storage.emplace_back(rt::to_device(sc.view()));
    host = LinearWeight{w.view(), sc.view()};
    device = LinearWeight{dw.view(), dsc.view()};
  };
  host_storage.reserve(6 * kExperts);
  device_storage.reserve(6 * kExperts);
  for (int64_t e = 0; e < kExperts; ++e) {
    make(kInter, kDim, host_experts[e].w1, device_experts[e].w1);
    make(kInter, kDim, host_experts[e].w3, device_experts[e].w3);
    make(kDim, kInter, host_experts[e].w2, device_experts[e].w2);
  }
  Tensor chosen = Tensor::empty(DType::kI32, {kTokens, kTopK});
  std::mt19937 rng(310);
  for (int64_t t = 0; t < kTokens; ++t) {
    const auto first = static_cast<int32_t>(rng() % kExperts);
    chosen.data<int32_t>()[t * kTopK] = first;
    chosen.data<int32_t>()[t * kTopK + 1] =
        static_cast<int32_t>((first + 1 + rng() % (kExperts - 1)) % kExperts);
  }
  const Tensor weights = random_f32({kTokens, kTopK}, 311);
  const Tensor x = random_f32({kTokens, kDim}, 312);
  const auto run = [&](int64_t first, int64_t count) {
    Tensor dx = rt::to_device(x.view().narrow(0, first, count));
    Tensor dc = rt::to_device(chosen.view().narrow(0, first, count));
    Tensor dwt = rt::to_device(weights.view().narrow(0, first, count));
    Tensor out = Tensor::empty(DType::kF32, {count, kDim}, rt::device_allocator());
    rt::fill_bytes(out.view(), 0xFF);
    cuda::moe_experts(dx.view(), dc.view(), dwt.view(), device_experts, 10.0f,
                      ActivationQuant::kFp8PerBlock32, out.view());
    rt::synchronize();
    return rt::to_host(out.view());
  };
  const Tensor got = run(0, kTokens);  // 80 rows over 4 experts: the wide token tile
  Tensor want = Tensor::empty(DType::kF32, {kTokens, kDim});
  moe_experts(x.view(), chosen.view(), weights.view(), host_experts, 10.0f,
              ActivationQuant::kFp8PerBlock32, want.view());
  // As backend_ops_test's moe_experts bound: the intermediate's quantizer can round a value the
  // backends computed a few ulp apart (summation order) to neighbouring e4m3 codes.
  const double error = worst_error_matching_nans(want, got);
  std::printf("moe_experts fp4 fp8-act 4 experts %ldx%ld: worst error %.3g of the output's scale\n",
              static_cast<long>(kInter), static_cast<long>(kDim), error);
  EXPECT_LE(error, 2e-3);
  for (int64_t token : {0, 21, 39}) {
    const Tensor alone = run(token, 1);  // 2 rows: the decode token tile
    EXPECT_EQ(
        0, std::memcmp(got.data<float>() + token * kDim, alone.data<float>(), kDim * sizeof(float)))
        << "token " << token;
  }
}

bool same_bits(const float* a, const float* b, int64_t count) {
  return std::memcmp(a, b, static_cast<size_t>(count) * sizeof(float)) == 0;
}

// The op with the V4.1-Flash expert shapes (w1/w3 2304 x 5120, w2 5120 x 2304), 16 experts,
// top-6: 1 and 5 tokens (decode tile), 40 (240 rows, still the decode tile) and 48 (288 rows,
// the prefill tile). Each against the CPU reference (rows of one 48-token reference: the CPU op
// is row by row), equal to the per-projection path bit for bit, and each token of the smaller
// calls equal to the same token in the 48-token call.
TEST_F(MoeGroupedGemmTest, ModelMoeExpertsV41FlashShapes) {
  constexpr int64_t kExperts = 16, kDim = 5120, kInter = 2304, kTopK = 6, kMostTokens = 48;
  const ExpertSet set = make_experts(kExperts, kDim, kInter, 400);
  const Tensor chosen = random_routes(kMostTokens, kExperts, kTopK, 410);
  const Tensor weights = random_f32({kMostTokens, kTopK}, 411);
  const Tensor x = random_f32({kMostTokens, kDim}, 412);
  Tensor want = Tensor::empty(DType::kF32, {kMostTokens, kDim});
  moe_experts(x.view(), chosen.view(), weights.view(), set.host, 10.0f,
              ActivationQuant::kFp8PerBlock32, want.view());
  const Tensor all = run_moe_op(set, x, chosen, weights, 0, kMostTokens, true);
  for (int64_t tokens : {int64_t{1}, int64_t{5}, int64_t{40}, kMostTokens}) {
    const Tensor got = run_moe_op(set, x, chosen, weights, 0, tokens, true);
    const Tensor earlier = run_moe_op(set, x, chosen, weights, 0, tokens, false);
    Tensor want_rows = Tensor::empty(DType::kF32, {tokens, kDim});
    std::memcpy(want_rows.data<float>(), want.data<float>(),
                static_cast<size_t>(tokens * kDim) * sizeof(float));
    const double error = worst_error_matching_nans(want_rows, got);
    std::printf("moe_experts V4.1 shapes, %ld tokens: worst error %.3g of the output's scale\n",
                static_cast<long>(tokens), error);
    EXPECT_LE(error, 2e-3) << tokens << " tokens";
    EXPECT_TRUE(same_bits(got.data<float>(), earlier.data<float>(), tokens * kDim))
        << tokens << " tokens: the fused path differs from the per-projection one";
    for (int64_t t = 0; t < tokens; ++t) {
      EXPECT_TRUE(same_bits(got.data<float>() + t * kDim, all.data<float>() + t * kDim, kDim))
          << "token " << t << " of " << tokens << " differs from the 48-token call";
    }
  }
}

// Small shapes for the sanitizers: the fused path equals the per-projection one bit for bit in
// the decode tile (3 tokens) and the prefill tile (40 tokens x top-2 over 4 experts), both
// within the reference's bound; and a bad expert id is still reported.
TEST_F(MoeGroupedGemmTest, FusedMoeExpertsSmallShapes) {
  constexpr int64_t kExperts = 4, kDim = 256, kInter = 512, kTopK = 2, kTokens = 40;
  const ExpertSet set = make_experts(kExperts, kDim, kInter, 500);
  const Tensor chosen = random_routes(kTokens, kExperts, kTopK, 510);
  const Tensor weights = random_f32({kTokens, kTopK}, 511);
  const Tensor x = random_f32({kTokens, kDim}, 512);
  Tensor want = Tensor::empty(DType::kF32, {kTokens, kDim});
  moe_experts(x.view(), chosen.view(), weights.view(), set.host, 10.0f,
              ActivationQuant::kFp8PerBlock32, want.view());
  for (int64_t tokens : {int64_t{3}, kTokens}) {
    const Tensor got = run_moe_op(set, x, chosen, weights, 0, tokens, true);
    const Tensor earlier = run_moe_op(set, x, chosen, weights, 0, tokens, false);
    Tensor want_rows = Tensor::empty(DType::kF32, {tokens, kDim});
    std::memcpy(want_rows.data<float>(), want.data<float>(),
                static_cast<size_t>(tokens * kDim) * sizeof(float));
    EXPECT_LE(worst_error_matching_nans(want_rows, got), 2e-3) << tokens << " tokens";
    EXPECT_TRUE(same_bits(got.data<float>(), earlier.data<float>(), tokens * kDim))
        << tokens << " tokens";
  }
  Tensor bad = Tensor::empty(DType::kI32, {2, kTopK});
  std::copy(chosen.data<int32_t>(), chosen.data<int32_t>() + 2 * kTopK, bad.data<int32_t>());
  bad.data<int32_t>()[1] = static_cast<int32_t>(kExperts);            // past the expert list
  EXPECT_THROW(run_moe_op(set, x, bad, weights, 0, 2, true), Error);  // from the synchronize
}

// ---- the decode tile (fewer than 16 rows per expert) ---------------------------------------

// Turns the decode tile off for its lifetime (the register kernel before it runs), on again
// after, also when a call throws.
struct RegisterKernelForDecode {
  rt::ScopedSwitch decode_tile{"DEEPINFER_MOE_DECODE_TILE", false};
};

// The same call through the decode tile and through the register kernel must give the same bits
// in every element, the unwritten (NaN sentinel) ones included.
void expect_decode_tile_bits(const std::function<Tensor()>& call, const std::string& what) {
  Tensor before;
  {
    const RegisterKernelForDecode register_kernel;
    before = call();
  }
  const Tensor tile = call();
  const int64_t count = before.numel();
  int64_t first_difference = -1;
  for (int64_t i = 0; i < count && first_difference < 0; ++i) {
    if (std::memcmp(tile.data<float>() + i, before.data<float>() + i, sizeof(float)) != 0) {
      first_difference = i;
    }
  }
  EXPECT_EQ(first_difference, -1)
      << what << ": the decode tile differs from the register kernel at element "
      << first_difference;
}

TEST_F(MoeGroupedGemmTest, DecodeTileSmallShapes) {
  const struct {
    int64_t experts, n, k;
    std::vector<int32_t> counts;
    int64_t extra_rows;
    uint32_t seed;
    const char* what;
  } cases[] = {
      // 9 and 15 rows: one 16-token pass with idle tokens; N = 48 leaves a block's last warp
      // without rows; K = 512 is fewer chunks than the pipeline's stages.
      {6, 48, 512, {3, 0, 1, 9, 0, 15}, 2, 211, "decode tile 6 experts 48x512"},
      // 17 rows: a 16-token pass then an 8-token one; K = 1280 reuses every stage slot.
      {4, 64, 1280, {17, 2, 0, 8}, 1, 221, "decode tile 4 experts 64x1280"},
      // One group of 13 rows: the token tiles spread over grid.z.
      {1, 32, 256, {13}, 0, 231, "decode tile one group 32x256"},
      // K = 2048 (8 chunks, more than the pipeline's stages): a hot expert's 16- and 8-token
      // passes each refill the pipeline; N = 80 leaves the second block's last warps without rows.
      {3, 80, 2048, {17, 1, 5}, 1, 233, "decode tile passes 80x2048"},
      {3, 256, 2048, {17, 0, 5}, 0, 235, "decode tile passes 256x2048"},
      // One group over grid.z at K = 2048.
      {1, 128, 2048, {13}, 0, 237, "decode tile one group 128x2048"},
  };
  for (const auto& c : cases) {
    const Problem p = make_problem(c.experts, c.n, c.k, c.counts, c.extra_rows, c.seed);
    check_against_reference(p, c.what);
    const DeviceProblem d(p);
    const int64_t rows = p.x.view().size(0);
    expect_decode_tile_bits([&] { return call_gpu(d, p.n, p.offsets, 0, rows); }, c.what);
    const Tensor all = call_gpu(d, p.n, p.offsets, 0, rows);
    expect_rows_alone_equal(
        p, all, {0, p.offsets.back() - 1},
        [&](const std::vector<int32_t>& offsets, int64_t row) {
          return call_gpu(d, p.n, offsets, row, 1);
        },
        c.what);
  }
  // Fewer rows than experts: the blocks walk only the experts with rows.
  std::vector<int32_t> sparse(40, 0);
  sparse[2] = 1;
  sparse[21] = 3;
  sparse[39] = 2;
  const Problem p = make_problem(40, 32, 768, sparse, 1, 241);
  check_against_reference(p, "decode tile sparse experts 32x768");
  const DeviceProblem d(p);
  expect_decode_tile_bits([&] { return call_gpu(d, p.n, p.offsets, 0, p.x.view().size(0)); },
                          "decode tile sparse experts 32x768");
  // The expert search (nth_nonempty_group's 32-groups-a-round walk): 70 groups with rows in the
  // first, a middle and the last group (the last round partly past the end); 600 groups.
  for (const int64_t experts : {int64_t{70}, int64_t{600}}) {
    std::vector<int32_t> counts(static_cast<size_t>(experts), 0);
    counts.front() = 2;
    counts[static_cast<size_t>(experts / 2)] = 1;
    counts.back() = 3;
    const Problem q =
        make_problem(experts, 16, 256, counts, 0, static_cast<uint32_t>(250 + experts));
    const std::string what = "decode tile expert search, " + std::to_string(experts) + " experts";
    check_against_reference(q, what);
    const DeviceProblem dq(q);
    expect_decode_tile_bits([&] { return call_gpu(dq, q.n, q.offsets, 0, q.x.view().size(0)); },
                            what);
  }
}

// The model's fused expert sequence (w1 and w3 in one launch, then w2) through the decode tile
// equals it through the register kernel.
TEST_F(MoeGroupedGemmTest, DecodeTileFusedMoeExpertsSmallShapes) {
  constexpr int64_t kExperts = 4, kDim = 256, kInter = 512, kTopK = 2, kTokens = 5;
  const ExpertSet set = make_experts(kExperts, kDim, kInter, 600);
  const Tensor chosen = random_routes(kTokens, kExperts, kTopK, 610);
  const Tensor weights = random_f32({kTokens, kTopK}, 611);
  const Tensor x = random_f32({kTokens, kDim}, 612);
  expect_decode_tile_bits([&] { return run_moe_op(set, x, chosen, weights, 0, kTokens, true); },
                          "fused moe_experts, 5 tokens");
}

// Decode at the real shapes: 1 to 1536 routed rows over 384 experts of w1/w3 (2304 x 5120) and
// w2 (5120 x 2304), a few hot experts with tens of rows (16-token passes, several passes) among
// ones with 0-4. The 384 experts repeat 8 random ones (host time and memory); the kernel does not
// know. Decode tile against the register kernel bit for bit, and a few rows against the CPU.
TEST_F(MoeGroupedGemmTest, DecodeTileV41FlashShapes) {
  constexpr int64_t kExperts = 384, kDistinct = 8;
  const struct {
    int64_t n, k;
    uint32_t seed;
    const char* what;
  } shapes[] = {{2304, 5120, 700, "w1/w3 2304x5120"}, {5120, 2304, 710, "w2 5120x2304"}};
  for (const auto& shape : shapes) {
    const Tensor weight =
        random_bytes(DType::kF4E2M1x2, {kDistinct, shape.n, shape.k}, shape.seed, 0, 255);
    const Tensor scale =
        random_bytes(DType::kF8E8M0, {kDistinct, shape.n, shape.k / 32}, shape.seed + 1, 117, 121);
    Tensor d_weight =
        Tensor::empty(DType::kF4E2M1x2, {kExperts, shape.n, shape.k}, rt::device_allocator());
    Tensor d_scale =
        Tensor::empty(DType::kF8E8M0, {kExperts, shape.n, shape.k / 32}, rt::device_allocator());
    for (int64_t e = 0; e < kExperts; ++e) {
      rt::copy(weight.view().select(0, e % kDistinct), d_weight.view().select(0, e));
      rt::copy(scale.view().select(0, e % kDistinct), d_scale.view().select(0, e));
    }
    for (int64_t routed : {1, 4, 16, 96, 384, 1536}) {
      // One row in 8 goes to one of 4 hot experts, the others anywhere.
      std::mt19937 rng(static_cast<uint32_t>(shape.seed + routed));
      std::vector<int32_t> counts(kExperts, 0);
      for (int64_t r = 0; r < routed; ++r) {
        const uint32_t pick = rng();
        ++counts[pick % 8 == 0 ? 37 * (rng() % 4) : rng() % kExperts];
      }
      std::vector<int32_t> offsets = {0};
      for (int32_t c : counts) offsets.push_back(offsets.back() + c);
      const int64_t rows = routed + 2;  // two rows in no expert stay unwritten
      const Tensor x = random_f32({rows, shape.k}, static_cast<uint32_t>(shape.seed + 2 + routed));
      Tensor d_x = rt::to_device(x.view());
      Tensor d_offsets = rt::to_device(testing::view_of(offsets, {kExperts + 1}));
      const auto call = [&] {
        Tensor out = Tensor::empty(DType::kF32, {rows, shape.n}, rt::device_allocator());
        rt::fill_bytes(out.view(), 0xFF);
        cuda::moe_grouped_gemm_fp4(d_x.view(), d_offsets.view(), d_weight.view(), d_scale.view(),
                                   out.view());
        rt::synchronize();
        return rt::to_host(out.view());
      };
      const std::string what =
          std::string("decode tile ") + shape.what + ", " + std::to_string(routed) + " rows";
      expect_decode_tile_bits(call, what);
      const Tensor got = call();
      // The first and last routed rows and the hottest expert's first row, against the CPU.
      const auto hottest =
          static_cast<int64_t>(std::max_element(counts.begin(), counts.end()) - counts.begin());
      double scale_seen = 1e-30;
      double worst = 0.0;
      for (int64_t row : {int64_t{0}, routed - 1, int64_t{offsets[hottest]}}) {
        const auto expert = static_cast<int64_t>(
            std::upper_bound(offsets.begin(), offsets.end(), static_cast<int32_t>(row)) -
            offsets.begin() - 1);
        Tensor want = Tensor::empty(DType::kF32, {1, shape.n});
        linear(x.view().narrow(0, row, 1),
               LinearWeight{weight.view().select(0, expert % kDistinct),
                            scale.view().select(0, expert % kDistinct)},
               want.view(), ActivationQuant::kFp8PerBlock32);
        for (int64_t i = 0; i < shape.n; ++i) {
          const double w = want.data<float>()[i];
          const double g = got.data<float>()[row * shape.n + i];
          scale_seen = std::max(scale_seen, std::abs(w));
          worst = std::max(worst, std::isnan(g) ? INFINITY : std::abs(g - w));
        }
      }
      std::printf("%s: worst error %.3g of the sampled rows' scale\n", what.c_str(),
                  worst / scale_seen);
      EXPECT_LE(worst / scale_seen, kTolerance) << what;
      for (int64_t i = routed * shape.n; i < rows * shape.n; ++i) {
        ASSERT_TRUE(std::isnan(got.data<float>()[i])) << what << ": element " << i;
      }
    }
  }
}

TEST_F(MoeGroupedGemmTest, BadInput) {
  Problem p = make_problem(2, 32, 256, {3, 2}, 0, 61);
  // Offsets past the rows are clamped on the device: no out-of-range reads, the valid rows
  // are still right.
  const Tensor got = run_gpu(p, {0, 3, 1000});
  const Tensor want = reference(p);
  EXPECT_LE(worst_error_matching_nans(want, got), kTolerance);
  // K not a multiple of 256 and mismatched scales are refused on the host.
  Problem odd = make_problem(2, 32, 288, {3, 2}, 0, 71);
  EXPECT_THROW(run_gpu(odd, odd.offsets), Error);
  std::vector<int32_t> short_offsets = {0, 5};
  EXPECT_THROW(run_gpu(p, short_offsets), Error);
}

}  // namespace
}  // namespace deepinfer::ops
