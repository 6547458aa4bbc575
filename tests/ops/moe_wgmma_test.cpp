// The wgmma prefill tile (moe_prefill_wgmma.h), which the grouped FP8 x FP4 GEMM and the routed
// experts' op take when batch invariance is off on an sm_90 device: against the CPU reference
// (ops::linear per expert, ops::cpu moe_experts), within the FP8 accumulator's bound below; with
// batch invariance on, the mma.sync tile's bits exactly. Skips without a usable GPU, and the
// wgmma cases without an sm_90 one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.h"
#include "moe_test_util.h"
#include "ops/batch_invariance.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/moe_decode_map.h"
#include "ops/cuda/moe_grouped_gemm.h"
#include "ops/cuda/moe_prefill_wgmma.h"
#include "ops/cuda/runtime_switch.h"
#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

namespace rt = deepinfer::cuda;
using testing::ExpertSet;
using testing::make_experts;
using testing::Problem;
using testing::random_bytes;
using testing::random_f32;
using testing::random_routes;
using testing::reference;
using testing::run_moe_op;
using testing::same_bits;
using testing::worst_error_matching_nans;

// The bound of one K-long dot through the wgmma tile, relative to the output's scale (the
// largest |reference| of the call). The FP8 wgmma accumulator keeps about 13 fraction bits (the
// probe of 2026-12-01: wgmma 0x1.47dp+15 where the exact dot is 0x1.47d5dbdp+15), so each
// 128-wide step, four chained k32 products, is off by up to ~4 * 2^-13 = 2^-11 of the step's
// magnitude before its FP32 fold; the K / 128 steps' errors add, and with the step partials of
// random signs each is about the output's scale over sqrt(K / 128). Hence
// 2^-11 * sqrt(K / 128) (3.1e-3 at K = 5120, 6.9e-4 at K = 256). The re-expression of the
// activations against the step's scale (tiny codes turning subnormal: 2^-10 of the step scale
// per element) and of the weights (exact for shifts up to 14) stay far below it. The invariant
// path's bound (2e-5: summation order only) is not changed.
double wgmma_dot_tolerance(int64_t k) {
  return std::ldexp(1.0, -11) * std::sqrt(static_cast<double>(k) / 128.0);
}

// The op's bound: the one with batch invariance on (2e-3, moe_grouped_gemm_test: the
// intermediate's quantizer can round a value computed a few ulp apart to a neighbouring e4m3
// code), plus what the dots' error does through that quantizer. w1 and w3 off by eps = the dot
// bound at K = dim move the SwiGLU product by ~2 eps of its scale, which moves a fraction
// p ~ 2 eps / 2^-4 (half an e4m3 step relative to the value) of its codes by a whole step,
// 2^-3 of the value; over w2's inter terms of random sign those flips add to ~2^-3 sqrt(p) of the
// output's typical magnitude, i.e. ~0.7 sqrt(eps), and the worst output is ~3x the typical one
// (hence 0.25 sqrt(eps) of the output's scale). w2's own dot adds its bound at K = inter.
double wgmma_op_tolerance(int64_t dim, int64_t inter) {
  return 2e-3 + 0.25 * std::sqrt(wgmma_dot_tolerance(dim)) + wgmma_dot_tolerance(inter);
}

// Of the 32-blocks of `scale` ([rows, K / 32] ue8m0 codes, any leading shape), how many sit more
// than kWgmmaExactWeightShift exponents below the largest of their row's 128-wide step (their
// e4m3 codes are rounded), and how many kWgmmaFlushWeightShift or more (all zero).
struct ShiftCounts {
  int64_t blocks = 0;
  int64_t rounded = 0;
  int64_t flushed = 0;
};
ShiftCounts count_weight_shifts(const Tensor& scale) {
  ShiftCounts counts;
  const auto* codes = static_cast<const uint8_t*>(scale.view().raw_data());
  const int64_t cols = scale.view().size(scale.view().rank() - 1);
  const int64_t rows = scale.numel() / cols;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t step = 0; step < cols / 4; ++step) {
      const uint8_t* block = codes + r * cols + 4 * step;
      const int top = *std::max_element(block, block + 4);
      for (int b = 0; b < 4; ++b) {
        const int shift = top - block[b];
        ++counts.blocks;
        counts.rounded += shift > cuda::kWgmmaExactWeightShift;
        counts.flushed += shift >= cuda::kWgmmaFlushWeightShift;
      }
    }
  }
  return counts;
}

class MoeWgmmaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DEEPINFER_SKIP_WITHOUT_GPU();
    const ScopedBatchInvariance off(false);
    if (cuda::moe_wgmma_fold() == cuda::WgmmaFold::kNone) {
      GTEST_SKIP() << "the wgmma tile needs an sm_90 device";
    }
  }
};

// The fold-per-128 tile's two data paths, one arithmetic (so the same bits): the weights
// converted into wgmma's A registers (the default) and into shared memory
// (DEEPINFER_MOE_WGMMA_REGISTER_A=0).
// `run` with batch invariance off and the fold per 128 (the wgmma numerics every path below
// shares).
template <typename Run>
Tensor run_wgmma_numerics(const Run& run) {
  const ScopedBatchInvariance off(false);
  const rt::ScopedSetting fold_setting("DEEPINFER_MOE_WGMMA_FOLD", 128);
  return run();
}

template <typename Run>
Tensor run_fold128(bool through_registers, const Run& run) {
  const rt::ScopedSwitch path("DEEPINFER_MOE_WGMMA_REGISTER_A", through_registers);
  return run_wgmma_numerics(run);
}

template <typename Run>
void expect_fold128_paths_agree(const Run& run, const std::string& what) {
  const Tensor through_registers = run_fold128(true, run);
  EXPECT_TRUE(same_bits(through_registers, run_fold128(false, run)))
      << what << ": fold per 128, weights in registers against shared memory";
  // The per-128 activation quantizer's two roundings (hardware conversions, the default, and
  // round_to_e4m3) give the same codes, so the same output bits.
  const rt::ScopedSwitch software("DEEPINFER_MOE_QUANT_HW_CVT", false);
  EXPECT_TRUE(same_bits(through_registers, run_fold128(true, run)))
      << what << ": fold per 128, the quantizer's hardware and software roundings";
}

// ---- the grouped GEMM (ops::cuda::moe_grouped_gemm_fp4) ------------------------------------

// Rows past every expert (3) stay unwritten.
Problem make_problem(int64_t n, int64_t k, const std::vector<int32_t>& counts, uint32_t seed,
                     int lowest_scale = 117, int highest_scale = 121) {
  return testing::make_problem(static_cast<int64_t>(counts.size()), n, k, counts, 3, seed,
                               lowest_scale, highest_scale);
}

Tensor run_gemm(const Problem& p) {
  std::vector<int32_t> host_offsets = p.offsets;
  Tensor d_offsets =
      rt::to_device(testing::view_of(host_offsets, {static_cast<int64_t>(host_offsets.size())}));
  Tensor dx = rt::to_device(p.x.view());
  Tensor dw = rt::to_device(p.weight.view());
  Tensor ds = rt::to_device(p.scale.view());
  Tensor out = Tensor::empty(DType::kF32, {p.x.view().size(0), p.n}, rt::device_allocator());
  rt::fill_bytes(out.view(), 0xFF);  // NaN: an element never written stays NaN
  cuda::moe_grouped_gemm_fp4(dx.view(), d_offsets.view(), dw.view(), ds.view(), out.view());
  rt::synchronize();
  return rt::to_host(out.view());
}

// Both folds against the reference; with batch invariance on, the mma.sync tile's bits (the same
// call with invariance off and DEEPINFER_MOE_WGMMA=0 runs that tile).
void check_gemm(const Problem& p, const std::string& what) {
  const Tensor want = reference(p);
  const double tolerance = wgmma_dot_tolerance(p.k);
  const ShiftCounts shifts = count_weight_shifts(p.scale);
  for (const int fold : {128, 32}) {
    const ScopedBatchInvariance off(false);
    const rt::ScopedSetting fold_setting("DEEPINFER_MOE_WGMMA_FOLD", fold);
    const double error = worst_error_matching_nans(want, run_gemm(p));
    std::printf(
        "%s, fold per %d: worst error %.3g of the output's scale (bound %.3g); weight blocks "
        "past the exact shift %lld of %lld, flushed %lld\n",
        what.c_str(), fold, error, tolerance, static_cast<long long>(shifts.rounded),
        static_cast<long long>(shifts.blocks), static_cast<long long>(shifts.flushed));
    EXPECT_LE(error, tolerance) << what << ", fold per " << fold;
  }
  expect_fold128_paths_agree([&] { return run_gemm(p); }, what);
  Tensor invariant;
  {
    const ScopedBatchInvariance on(true);
    invariant = run_gemm(p);
  }
  Tensor mma_sync_tile;
  {
    const ScopedBatchInvariance off(false);
    const rt::ScopedSwitch no_wgmma("DEEPINFER_MOE_WGMMA", false);
    mma_sync_tile = run_gemm(p);
  }
  EXPECT_TRUE(same_bits(invariant, mma_sync_tile)) << what;
  EXPECT_LE(worst_error_matching_nans(want, invariant), 2e-5) << what << ", batch invariant";
}

// Big (128) and small (32) token tiles, an empty expert, a remainder of 3 rows.
TEST_F(MoeWgmmaTest, GroupedGemmSmallShapes) {
  check_gemm(make_problem(256, 512, {150, 20, 0, 131}, 10), "256 x 512, 4 experts");
  check_gemm(make_problem(128, 256, {97, 33}, 20), "128 x 256, 2 experts");
}

// Scale codes over [100, 127]: many blocks sit more than 14 exponents below their step's
// largest (rounded or flushed codes); they are below 2^-14 of it, within the bound.
TEST_F(MoeWgmmaTest, GroupedGemmWideScaleSpreadSmallShapes) {
  const Problem p = make_problem(256, 512, {140, 60}, 30, 100, 127);
  const ShiftCounts shifts = count_weight_shifts(p.scale);
  EXPECT_GT(shifts.rounded, 0);
  check_gemm(p, "256 x 512, scales 2^-27..2^0");
}

// The V4.1-Flash expert shapes: w1 / w3 (2304 x 5120) and w2 (5120 x 2304).
TEST_F(MoeWgmmaTest, GroupedGemmV41FlashShapes) {
  check_gemm(make_problem(2304, 5120, {130, 97, 40}, 40), "w1 2304 x 5120");
  check_gemm(make_problem(5120, 2304, {130, 97, 40}, 50), "w2 5120 x 2304");
}

// The register tile's sized token tiles (DEEPINFER_MOE_WGMMA_TILES: one tile of 32, 64, 96, 128,
// 144 or 160 tokens for an expert's rest after its 128-token tiles) compute each token's column
// with the same products and folds as the 128 / 32 tiles (wgmma's columns do not depend on its
// N), so every setting gives the shared-memory tile's bits, which reads the 128 / 32 tiles. The
// counts put rows at every size's edges (1, 32 | 33, 64 | 65, 96 | 97, 128 | 129, 144 | 145,
// 160 | 161) and past the largest (300: 128 + 128 + 44).
void check_sized_tiles(const Problem& p, const std::string& what) {
  const auto run = [&] { return run_gemm(p); };
  const Tensor shared_memory_tile = run_fold128(false, run);
  const double error = worst_error_matching_nans(reference(p), shared_memory_tile);
  EXPECT_LE(error, wgmma_dot_tolerance(p.k)) << what;
  for (const int tiles : {0, 128, 144, 160}) {
    const rt::ScopedSetting setting("DEEPINFER_MOE_WGMMA_TILES", tiles);
    EXPECT_TRUE(same_bits(run_fold128(true, run), shared_memory_tile))
        << what << ": DEEPINFER_MOE_WGMMA_TILES=" << tiles << " against the shared-memory tile";
  }
}

TEST_F(MoeWgmmaTest, GroupedGemmSizedTiles) {
  const std::vector<int32_t> counts = {1,   32,  33,  64,  65,  96, 97, 128, 129,
                                       144, 145, 160, 161, 300, 0,  20, 140, 155};
  check_sized_tiles(make_problem(256, 512, counts, 70), "sized tiles 256 x 512");
  check_sized_tiles(make_problem(128, 768, counts, 71), "sized tiles 128 x 768");
  check_sized_tiles(make_problem(5120, 2304, {140, 155, 60, 100}, 72), "sized tiles w2");
}

// ---- decode shapes (DEEPINFER_MOE_WGMMA_DECODE) ---------------------------------------------

// With batch invariance off, the fp4 decode regime (fewer than 16 rows per expert) takes the
// wgmma numerics too: the decode tile (DEEPINFER_MOE_WGMMA_DECODE=2: 64 rows x 16 or 8 tokens)
// computes register_a's products and folds in its order, so it must give the prefill tiles' bits
// (=1: register_a's 32-token tiles), and both lie within the wgmma bound of the reference.
template <typename Run>
Tensor run_wgmma_decode(int setting, const Run& run) {
  const rt::ScopedSetting decode("DEEPINFER_MOE_WGMMA_DECODE", setting);
  return run_wgmma_numerics(run);
}

// The decode tile against the prefill tiles, bit for bit.
template <typename Run>
void expect_decode_tile_matches_prefill_tiles(const Run& run, const std::string& what) {
  EXPECT_TRUE(same_bits(run_wgmma_decode(2, run), run_wgmma_decode(1, run)))
      << what << ": the wgmma decode tile against the prefill tiles";
}

// With batch invariance on the setting changes nothing: the mma.sync decode tile's bits.
template <typename Run>
void expect_invariant_bits_unchanged(const Run& run, const std::string& what) {
  const ScopedBatchInvariance on(true);
  Tensor mma_sync_tile;
  {
    const rt::ScopedSetting decode("DEEPINFER_MOE_WGMMA_DECODE", 0);
    mma_sync_tile = run();
  }
  const rt::ScopedSetting decode("DEEPINFER_MOE_WGMMA_DECODE", 2);
  EXPECT_TRUE(same_bits(mma_sync_tile, run())) << what << ": batch invariance on";
}

void check_decode_gemm(const Problem& p, const std::string& what) {
  const int64_t rows = p.x.view().size(0);
  ASSERT_LT(rows, 16 * p.experts) << what << " is not a decode shape";
  const Tensor want = reference(p);
  const auto run = [&] { return run_gemm(p); };
  const Tensor decode_tile = run_wgmma_decode(2, run);
  expect_decode_tile_matches_prefill_tiles(run, what);
  const double error = worst_error_matching_nans(want, decode_tile);
  const double tolerance = wgmma_dot_tolerance(p.k);
  std::printf("%s, wgmma decode tile: worst error %.3g of the output's scale (bound %.3g)\n",
              what.c_str(), error, tolerance);
  EXPECT_LE(error, tolerance) << what << ", wgmma decode tile";
  expect_invariant_bits_unchanged(run, what);
}

// 1, 4, 16 (one full tile), 17 (a full tile and an 8-token one) and 9 (a 16-token tile for 9
// rows) tokens per expert, an empty expert; 4 and 2 K steps (2 and 1 two-step slots: the ring
// of 4 never wraps), weights below their step's largest scale by more than the exact shift.
TEST_F(MoeWgmmaTest, DecodeGemmSmallShapes) {
  check_decode_gemm(make_problem(256, 512, {1, 4, 16, 0, 17, 9}, 60), "decode 256 x 512");
  check_decode_gemm(make_problem(128, 256, {8, 0, 3}, 61), "decode 128 x 256");
  check_decode_gemm(make_problem(384, 512, {4, 12, 1, 2}, 62, 100, 127),
                    "decode 384 x 512, scales 2^-27..2^0");
  check_decode_gemm(make_problem(256, 512, {0, 0, 5, 0}, 63), "decode 256 x 512, empty experts");
}

// The V4.1-Flash expert shapes: K = 5120 (40 steps) and 2304 (18) wrap the copy ring.
TEST_F(MoeWgmmaTest, DecodeGemmV41FlashShapes) {
  check_decode_gemm(make_problem(2304, 5120, {1, 4, 16, 0, 9}, 64), "decode w1 2304 x 5120");
  check_decode_gemm(make_problem(5120, 2304, {15, 2, 0, 8, 1}, 65), "decode w2 5120 x 2304");
}

// Other ring lengths (the grouped GEMM takes K % 256 == 0, so every slot holds two steps): 6
// steps (3 slots, the ring of 4 never wraps) and 56 (28 slots: the ring wraps 7 times before
// the peeled last slot).
TEST_F(MoeWgmmaTest, DecodeGemmRingLengths) {
  check_decode_gemm(make_problem(256, 768, {3, 16, 0, 9}, 66), "decode 256 x 768");
  check_decode_gemm(make_problem(128, 7168, {1, 12, 5, 17}, 67), "decode 128 x 7168");
}

// The decode tile's shared-memory maps (host only, no GPU): what ldmatrix gives each lane on
// lean3's row addresses is the word lean's 32-bit loads read, the copies put each 16-byte chunk
// of a row's step at raw_offset, the chunks of a matrix's 8 rows take 8 different bank groups
// (conflict-free), and the paired codes hold each row once, a thread's two rows side by side.
TEST(MoeDecodeMapTest, CopiesAndReadsAgree) {
  namespace dm = cuda::decode_map;
  for (int warp = 0; warp < 4; ++warp) {
    for (int lane = 0; lane < 32; ++lane) {
      for (int half = 0; half < 2; ++half) {
        for (int block = 0; block < dm::kBlocks; ++block) {
          EXPECT_EQ(dm::matrix_word(warp, lane, half, block), dm::raw_word(warp, lane, half, block))
              << "warp " << warp << " lane " << lane << " half " << half << " block " << block;
        }
      }
    }
    for (int m = 0; m < dm::kBlocks; ++m) {
      for (int half = 0; half < 2; ++half) {
        std::vector<bool> bank_groups(8, false);
        for (int r = 0; r < 8; ++r) {
          const int address = dm::matrix_row(warp, 8 * m + r) + dm::kMatrixSecondHalf * half;
          EXPECT_EQ(address % 16, 0);
          EXPECT_FALSE(bank_groups[(address / 16) % 8]) << "matrix " << m << " row " << r;
          bank_groups[(address / 16) % 8] = true;
        }
      }
    }
  }
  // Every chunk of every row once, at raw_offset, from the row's bytes 64 step + 16 chunk.
  std::vector<int> written(dm::kStepRawBytes / 16 * 2, 0);
  for (int thread = 0; thread < 128; ++thread) {
    for (int i = 0; i < 4; ++i) {
      const int r = dm::copy_row(thread, i);
      ASSERT_LT(r, dm::kRows);
      const int destination =
          dm::copy_step(thread) * dm::kStepRawBytes + dm::raw_offset(r, dm::copy_chunk(thread));
      ++written[destination / 16];
      EXPECT_EQ(dm::raw_offset(dm::copy_row(thread, 0), dm::copy_chunk(thread)) + i * 1024,
                dm::raw_offset(r, dm::copy_chunk(thread)))
          << "the copies' shared offsets step 1 KB a copy";
    }
  }
  for (size_t chunk = 0; chunk < written.size(); ++chunk) EXPECT_EQ(written[chunk], 1) << chunk;
  std::vector<int> codes(dm::kRows, 0);
  for (int r = 0; r < dm::kRows; ++r) {
    ASSERT_EQ(dm::paired_codes(r) % 4, 0);
    ASSERT_LT(dm::paired_codes(r) / 4, dm::kRows);
    ++codes[dm::paired_codes(r) / 4];
  }
  for (int r = 0; r < dm::kRows; ++r) EXPECT_EQ(codes[r], 1) << r;
  for (int warp = 0; warp < 4; ++warp) {
    for (int lane = 0; lane < 32; ++lane) {
      const int row = 16 * warp + lane / 4;
      EXPECT_EQ(dm::paired_codes_read(warp, lane), dm::paired_codes(row));
      EXPECT_EQ(dm::paired_codes_read(warp, lane) + 4, dm::paired_codes(row + 8));
    }
  }
}

// ---- the routed experts' op (ops::cuda::moe_experts) ---------------------------------------

// One op case: random experts, routes, route weights and input, and the CPU op's output.
struct MoeOpCase {
  MoeOpCase(int64_t experts, int64_t dim, int64_t inter, int64_t tokens, int64_t top_k,
            uint32_t seed)
      : set(make_experts(experts, dim, inter, seed)),
        chosen(random_routes(tokens, experts, top_k, seed + 100)),
        weights(random_f32({tokens, top_k}, seed + 101)),
        x(random_f32({tokens, dim}, seed + 102)),
        want(Tensor::empty(DType::kF32, {tokens, dim})) {
    moe_experts(x.view(), chosen.view(), weights.view(), set.host, 10.0f,
                ActivationQuant::kFp8PerBlock32, want.view());
  }
  ExpertSet set;
  Tensor chosen, weights, x, want;
};

// The op without batch invariance (both folds) against the CPU op; with it, the mma.sync tile's
// bits and each of a few tokens alone equal to itself in the batch (the decode tile).
void check_moe_op(int64_t experts, int64_t dim, int64_t inter, int64_t tokens, int64_t top_k,
                  uint32_t seed, const std::string& what) {
  const MoeOpCase c(experts, dim, inter, tokens, top_k, seed);
  const double tolerance = wgmma_op_tolerance(dim, inter);
  for (const int fold : {128, 32}) {
    const ScopedBatchInvariance off(false);
    const rt::ScopedSetting fold_setting("DEEPINFER_MOE_WGMMA_FOLD", fold);
    const double error =
        worst_error_matching_nans(c.want, run_moe_op(c.set, c.x, c.chosen, c.weights, 0, tokens));
    std::printf(
        "moe_experts %s, fold per %d: worst error %.3g of the output's scale (bound %.3g)\n",
        what.c_str(), fold, error, tolerance);
    EXPECT_LE(error, tolerance) << what << ", fold per " << fold;
  }
  const auto run_op = [&] { return run_moe_op(c.set, c.x, c.chosen, c.weights, 0, tokens); };
  expect_fold128_paths_agree(run_op, what);
  Tensor invariant;
  {
    const ScopedBatchInvariance on(true);
    invariant = run_moe_op(c.set, c.x, c.chosen, c.weights, 0, tokens);
    for (const int64_t token : {int64_t{0}, tokens / 2, tokens - 1}) {
      const Tensor alone = run_moe_op(c.set, c.x, c.chosen, c.weights, token, 1);
      EXPECT_EQ(0, std::memcmp(invariant.data<float>() + token * dim, alone.data<float>(),
                               static_cast<size_t>(dim) * sizeof(float)))
          << what << ": token " << token << " alone";
    }
  }
  Tensor mma_sync_tile;
  {
    const ScopedBatchInvariance off(false);
    const rt::ScopedSwitch no_wgmma("DEEPINFER_MOE_WGMMA", false);
    mma_sync_tile = run_moe_op(c.set, c.x, c.chosen, c.weights, 0, tokens);
  }
  EXPECT_TRUE(same_bits(invariant, mma_sync_tile)) << what;
  EXPECT_LE(worst_error_matching_nans(c.want, invariant), 2e-3) << what << ", batch invariant";
}

// The op at decode shapes (w1 and w3 in one launch of the decode tile, the SwiGLU's per-128
// codes into w2): the decode tile's bits are the prefill tiles', within the op's bound of the
// CPU op; with batch invariance on the setting changes nothing.
void check_moe_decode_op(int64_t experts, int64_t dim, int64_t inter, int64_t tokens, int64_t top_k,
                         uint32_t seed, const std::string& what) {
  ASSERT_LT(tokens * top_k, 16 * experts) << what << " is not a decode shape";
  const MoeOpCase c(experts, dim, inter, tokens, top_k, seed);
  const auto run = [&] { return run_moe_op(c.set, c.x, c.chosen, c.weights, 0, tokens); };
  const Tensor decode_tile = run_wgmma_decode(2, run);
  expect_decode_tile_matches_prefill_tiles(run, what);
  const double error = worst_error_matching_nans(c.want, decode_tile);
  const double tolerance = wgmma_op_tolerance(dim, inter);
  std::printf("moe_experts %s, wgmma decode tile: worst error %.3g (bound %.3g)\n", what.c_str(),
              error, tolerance);
  EXPECT_LE(error, tolerance) << what << ", wgmma decode tile";
  expect_invariant_bits_unchanged(run, what);
}

TEST_F(MoeWgmmaTest, MoeExpertsDecodeShapes) {
  check_moe_decode_op(4, 256, 512, 5, 2, 800, "decode 4 experts 512 x 256, 5 tokens");
  check_moe_decode_op(8, 5120, 2304, 4, 6, 810, "decode 8 experts 2304 x 5120, 4 tokens");
  check_moe_decode_op(8, 5120, 2304, 1, 6, 820, "decode 8 experts 2304 x 5120, 1 token");
}

// 4 experts, 200 tokens x top-2: ~100 rows per expert (big and small token tiles).
TEST_F(MoeWgmmaTest, MoeExpertsSmallShapes) {
  check_moe_op(4, 256, 512, 200, 2, 600, "4 experts 512 x 256, 200 tokens");
}

// The V4.1-Flash expert shapes, 8 experts, 136 tokens x top-6: ~102 rows per expert.
TEST_F(MoeWgmmaTest, MoeExpertsV41FlashShapes) {
  check_moe_op(8, 5120, 2304, 136, 6, 700, "8 experts 2304 x 5120, 136 tokens");
}

}  // namespace
}  // namespace deepinfer::ops
