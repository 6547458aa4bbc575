// The wgmma version of the fp4 prefill tile (ops::cuda::launch_moe_prefill_wgmma, behind
// DEEPINFER_MOE_WGMMA): first the numerics probe that decides whether it may replace the
// mma.sync tile at all (a 32-wide e4m3 dot from wgmma with scale-d false must equal mma.sync's
// from a zero accumulator, bit for bit), then the kernel against the mma.sync tile (same bits),
// the CPU reference and one-row calls (the decode tile). Skips without a usable GPU, and the
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

#include "core/error.h"
#include "gpu_support.h"
#include "ops/cpu/numerics.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/moe_grouped_gemm.h"
#include "ops/cuda/moe_prefill_wgmma.h"
#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

namespace rt = deepinfer::cuda;
using testing::random_bytes;

// As moe_grouped_gemm_test: summation order only against the CPU reference.
constexpr double kTolerance = 2e-5;

class MoeWgmmaTest : public ::testing::Test {
 protected:
  void SetUp() override { DEEPINFER_SKIP_WITHOUT_GPU(); }
  // Every case leaves the switch as the environment has it (off by default).
  void TearDown() override {
    cuda::set_moe_wgmma(false);
    cuda::set_moe_wgmma_overlap(true);
  }
};

uint32_t bits_of(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// ---- the numerics probe --------------------------------------------------------------------

constexpr int kProbeRows = 64;
constexpr int kProbeK = 128;
constexpr int kProbeBlocks = kProbeK / 32;

bool is_nan_e4m3(uint8_t code) {
  return (code & 0x7f) == 0x7f;
}

// An e4m3 code with the given sign, biased exponent (0: subnormal) and mantissa, never NaN.
uint8_t e4m3_code(int sign, int exponent, int mantissa) {
  const auto code = static_cast<uint8_t>((sign << 7) | (exponent << 3) | mantissa);
  return is_nan_e4m3(code) ? static_cast<uint8_t>(code - 1) : code;
}

// The e4m3 bytes the kernels make of fp4 weights: 2^-6 times an e2m1 value.
uint8_t scaled_e2m1_code(int nibble) {
  return static_cast<uint8_t>(((nibble & 7) << 2) | ((nibble & 8) << 4));
}

// One 32-code block of an operand row in the given style:
//  0: any code (all exponents, subnormals, both signs);
//  1: exponents spread over the whole range, each slot's drawn independently;
//  2: cancellation: the second half repeats the first half (A) or negates it (B), so every
//     product in slot s cancels the one in slot s + 16, plus one small odd term;
//  3: a huge product, its negation and small or subnormal terms (alignment and truncation);
//  4: the scaled e2m1 weights (A) / ordinary activations (B).
void fill_block(uint8_t* block, int style, bool is_a, std::mt19937& rng) {
  std::uniform_int_distribution<int> any(0, 255);
  std::uniform_int_distribution<int> bit(0, 1);
  std::uniform_int_distribution<int> exponent(0, 15);
  std::uniform_int_distribution<int> mantissa(0, 7);
  std::uniform_int_distribution<int> small_exponent(0, 3);
  switch (style) {
    case 0:
      for (int s = 0; s < 32; ++s) {
        uint8_t code = static_cast<uint8_t>(any(rng));
        if (is_nan_e4m3(code)) code = static_cast<uint8_t>(code - 1);
        block[s] = code;
      }
      break;
    case 1:
      for (int s = 0; s < 32; ++s) block[s] = e4m3_code(bit(rng), exponent(rng), mantissa(rng));
      break;
    case 2:
      for (int s = 0; s < 16; ++s) {
        block[s] = e4m3_code(bit(rng), exponent(rng), mantissa(rng));
        block[s + 16] = is_a ? block[s] : static_cast<uint8_t>(block[s] ^ 0x80);
      }
      block[std::uniform_int_distribution<int>(0, 31)(rng)] =
          e4m3_code(bit(rng), small_exponent(rng), mantissa(rng));
      break;
    case 3:
      for (int s = 0; s < 32; ++s) {
        block[s] = e4m3_code(bit(rng), small_exponent(rng), mantissa(rng));
      }
      block[std::uniform_int_distribution<int>(0, 15)(rng)] = e4m3_code(0, 15, 6);
      block[std::uniform_int_distribution<int>(16, 31)(rng)] = e4m3_code(1, 15, 6);
      break;
    default:
      for (int s = 0; s < 32; ++s) {
        block[s] = is_a ? scaled_e2m1_code(std::uniform_int_distribution<int>(0, 15)(rng))
                        : e4m3_code(bit(rng), exponent(rng), mantissa(rng));
      }
      break;
  }
}

// wgmma's and mma.sync's dots of the same codes in the same k-slots are bit-equal. A zero's
// sign is reported but not failed: the kernels add each dot to a running sum that starts at
// +0, and +0 + -0 is +0, so it cannot reach an output. The exact dot (in double) bounds both
// within the tensor core's alignment loss, which catches a wrong operand layout in the probe
// itself (the two would then disagree for a reason that is not numerics).
TEST_F(MoeWgmmaTest, ProbeWgmmaBlockDotBitsEqualMmaSync) {
  constexpr int kTrials = 40;
  std::vector<uint8_t> a(kProbeRows * kProbeK);
  std::vector<uint8_t> b(kProbeRows * kProbeK);
  std::vector<float> from_wgmma(kProbeBlocks * kProbeRows * kProbeRows);
  std::vector<float> from_mma_sync(from_wgmma.size());
  int64_t compared = 0;
  int64_t differing = 0;
  int64_t zero_signs = 0;
  int64_t far_from_exact = 0;
  double worst_miss = 0.0;  // |wgmma - exact| / sum |products|, for the report
  std::string first_difference;
  for (int trial = 0; trial < kTrials; ++trial) {
    std::mt19937 rng(1000 + trial);
    for (int row = 0; row < kProbeRows; ++row) {
      for (int block = 0; block < kProbeBlocks; ++block) {
        // Both operands of a block share the cancellation style in some trials, so the halves
        // cancel across whole dot products; otherwise the styles mix.
        const int shared_style = (trial + block) % 5;
        const bool aligned = trial % 3 == 0;
        fill_block(&a[row * kProbeK + block * 32],
                   aligned ? shared_style : (row + block + trial) % 5, true, rng);
        fill_block(&b[row * kProbeK + block * 32],
                   aligned ? shared_style : (row * 7 + block + trial) % 5, false, rng);
      }
    }
    if (!cuda::probe_fp8_block_dots(a.data(), b.data(), from_wgmma.data(), from_mma_sync.data())) {
      GTEST_SKIP() << "wgmma needs an sm_90 device";
    }
    for (int block = 0; block < kProbeBlocks; ++block) {
      for (int row = 0; row < kProbeRows; ++row) {
        for (int col = 0; col < kProbeRows; ++col) {
          const size_t at = (static_cast<size_t>(block) * kProbeRows + row) * kProbeRows + col;
          const float w = from_wgmma[at];
          const float m = from_mma_sync[at];
          double exact = 0.0;
          double magnitude = 0.0;
          for (int s = 0; s < 32; ++s) {
            const double product =
                static_cast<double>(cpu::e4m3_to_float(a[row * kProbeK + block * 32 + s])) *
                cpu::e4m3_to_float(b[col * kProbeK + block * 32 + s]);
            exact += product;
            magnitude += std::abs(product);
          }
          ++compared;
          // 2^-6 of the products' magnitudes: looser than the alignment loss (about 2^-13 of
          // the largest product per term), far tighter than a wrong layout.
          const double miss = std::abs(w - exact);
          if (magnitude > 0) worst_miss = std::max(worst_miss, miss / magnitude);
          if (miss > magnitude * 0x1p-6 + 0x1p-40) ++far_from_exact;
          if (bits_of(w) == bits_of(m)) continue;
          if (w == 0.0f && m == 0.0f) {
            ++zero_signs;
            continue;
          }
          if (differing++ == 0) {
            char line[512];
            std::snprintf(line, sizeof(line),
                          "trial %d, K block %d, A row %d, B row %d: wgmma %a (0x%08x), "
                          "mma.sync %a (0x%08x), exact %a; A codes",
                          trial, block, row, col, w, bits_of(w), m, bits_of(m), exact);
            first_difference = line;
            for (int s = 0; s < 32; ++s) {
              std::snprintf(line, sizeof(line), " %02x", a[row * kProbeK + block * 32 + s]);
              first_difference += line;
            }
            first_difference += "; B codes";
            for (int s = 0; s < 32; ++s) {
              std::snprintf(line, sizeof(line), " %02x", b[col * kProbeK + block * 32 + s]);
              first_difference += line;
            }
          }
        }
      }
    }
  }
  std::printf(
      "probe: %lld dots, %lld with different bits, %lld only a zero's sign, %lld far "
      "from the exact dot (worst %.3g of the products' magnitude)\n",
      static_cast<long long>(compared), static_cast<long long>(differing),
      static_cast<long long>(zero_signs), static_cast<long long>(far_from_exact), worst_miss);
  if (!first_difference.empty()) std::printf("first difference: %s\n", first_difference.c_str());
  EXPECT_EQ(far_from_exact, 0) << "the probe's operand layout is wrong, not the numerics";
  EXPECT_EQ(differing, 0)
      << "wgmma's block dot differs from mma.sync's: the wgmma tile would break batch "
         "invariance; "
      << first_difference;
}

// ---- the kernel ----------------------------------------------------------------------------

struct Problem {
  int64_t experts = 0;
  int64_t n = 0;
  int64_t k = 0;
  std::vector<int32_t> offsets;  // E + 1
  Tensor x;                      // host [R, K] f32
  Tensor weight;                 // host [E, N, K] fp4
  Tensor scale;                  // host [E, N, K/32] ue8m0
};

Problem make_problem(int64_t experts, int64_t n, int64_t k, const std::vector<int32_t>& counts,
                     int64_t extra_rows, uint32_t seed) {
  Problem p;
  p.experts = experts;
  p.n = n;
  p.k = k;
  p.offsets.push_back(0);
  for (int32_t c : counts) p.offsets.push_back(p.offsets.back() + c);
  const int64_t rows = p.offsets.back() + extra_rows;
  p.x = Tensor::empty(DType::kF32, {rows, k});
  const std::vector<float> values = testing::random_values(static_cast<size_t>(rows * k), seed);
  std::copy(values.begin(), values.end(), p.x.data<float>());
  p.weight = random_bytes(DType::kF4E2M1x2, {experts, n, k}, seed + 1, 0, 255);
  p.scale = random_bytes(DType::kF8E8M0, {experts, n, k / 32}, seed + 2, 117, 121);
  return p;
}

struct DeviceProblem {
  explicit DeviceProblem(const Problem& p)
      : x(rt::to_device(p.x.view())),
        weight(rt::to_device(p.weight.view())),
        scale(rt::to_device(p.scale.view())) {}
  Tensor x;
  Tensor weight;
  Tensor scale;
};

// One call over x rows [first, first + count) with `offsets` relative to `first`; [count, N] on
// the host, NaN where nothing was written.
Tensor call_gpu(const DeviceProblem& d, int64_t n, const std::vector<int32_t>& offsets,
                int64_t first, int64_t count, bool wgmma) {
  cuda::set_moe_wgmma(wgmma);
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

// The CPU reference, expert by expert; rows outside every expert stay NaN.
Tensor reference(const Problem& p) {
  const int64_t rows = p.x.view().size(0);
  Tensor want = Tensor::empty(DType::kF32, {rows, p.n});
  std::fill(want.data<float>(), want.data<float>() + want.numel(), NAN);
  for (int64_t e = 0; e < p.experts; ++e) {
    const int64_t first = p.offsets[e];
    const int64_t count = p.offsets[e + 1] - first;
    if (count == 0) continue;
    linear(p.x.view().narrow(0, first, count),
           LinearWeight{p.weight.view().select(0, e), p.scale.view().select(0, e)},
           want.view().narrow(0, first, count), ActivationQuant::kFp8PerBlock32);
  }
  return want;
}

double worst_error(const Tensor& want, const Tensor& got) {
  const float* w = want.data<float>();
  const float* g = got.data<float>();
  double scale = 1e-30;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (!std::isnan(w[i])) scale = std::max(scale, std::abs(static_cast<double>(w[i])));
  }
  double worst = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::isnan(w[i]) || std::isnan(g[i])) {
      if (std::isnan(w[i]) != std::isnan(g[i])) return INFINITY;
      continue;
    }
    worst = std::max(worst, std::abs(static_cast<double>(g[i]) - w[i]) / scale);
  }
  return worst;
}

// Same bits everywhere, unwritten rows (NaN fill) included; prints the first difference.
void expect_same_bits(const Tensor& want, const Tensor& got, int64_t n, const std::string& what) {
  const float* w = want.data<float>();
  const float* g = got.data<float>();
  int64_t differing = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (bits_of(w[i]) == bits_of(g[i])) continue;
    if (differing++ == 0) {
      ADD_FAILURE() << what << ": first difference at row " << i / n << ", column " << i % n
                    << ": mma.sync tile " << w[i] << " (0x" << std::hex << bits_of(w[i])
                    << "), wgmma tile " << g[i] << " (0x" << bits_of(g[i]) << std::dec << ")";
    }
  }
  EXPECT_EQ(differing, 0) << what << ": elements with different bits";
}

// Both prefill kernels over all of p's rows: the wgmma tile's output has the mma.sync tile's
// bits; returns the wgmma tile's.
// Both wgmma schedules (conversion overlapped or between steps) are checked.
Tensor check_wgmma_against_mma_sync(const Problem& p, const DeviceProblem& d,
                                    const std::string& what) {
  const int64_t rows = p.x.view().size(0);
  const Tensor old_tile = call_gpu(d, p.n, p.offsets, 0, rows, false);
  cuda::set_moe_wgmma_overlap(false);
  const Tensor between_steps = call_gpu(d, p.n, p.offsets, 0, rows, true);
  expect_same_bits(old_tile, between_steps, p.n, what + " (conversion between steps)");
  cuda::set_moe_wgmma_overlap(true);
  Tensor new_tile = call_gpu(d, p.n, p.offsets, 0, rows, true);
  expect_same_bits(old_tile, new_tile, p.n, what + " (conversion overlapped)");
  return new_tile;
}

// Rows of `all` (the wgmma tile over every row) equal the same row in a one-row call, which
// takes the decode tile: a row's bits do not depend on the batch.
void check_rows_alone(const Problem& p, const DeviceProblem& d, const Tensor& all,
                      const std::vector<int64_t>& rows, const std::string& what) {
  for (const int64_t row : rows) {
    const auto expert = static_cast<int64_t>(
        std::upper_bound(p.offsets.begin(), p.offsets.end(), static_cast<int32_t>(row)) -
        p.offsets.begin() - 1);
    std::vector<int32_t> single(p.experts + 1, 0);
    for (int64_t e = expert + 1; e <= p.experts; ++e) single[e] = 1;
    const Tensor alone = call_gpu(d, p.n, single, row, 1, true);
    EXPECT_EQ(0, std::memcmp(all.data<float>() + row * p.n, alone.data<float>(),
                             static_cast<size_t>(p.n) * sizeof(float)))
        << what << ": row " << row << " alone differs from the row in the full call";
  }
}

bool wgmma_available() {
  cuda::set_moe_wgmma(true);
  return cuda::moe_wgmma_enabled();
}

TEST_F(MoeWgmmaTest, PrefillWgmmaSmallShapes) {
  if (!wgmma_available()) GTEST_SKIP() << "wgmma needs an sm_90 device";
  // 5 experts over N=256, K=512: 129 (a full tile + 1), empty, 1, 300 (two full tiles and a
  // 44-row remainder in two small tiles), 33 (two small tiles); two rows in no expert stay
  // unwritten. Small enough for memcheck and racecheck.
  const Problem p = make_problem(5, 256, 512, {129, 0, 1, 300, 33}, 2, 211);
  const DeviceProblem d(p);
  const Tensor all = check_wgmma_against_mma_sync(p, d, "wgmma tile 256x512");
  const double error = worst_error(reference(p), all);
  std::printf("wgmma tile 256x512: worst error %.3g of the output's scale\n", error);
  EXPECT_LE(error, kTolerance);
  check_rows_alone(p, d, all, {0, 128, 129, 130, 200, 429, 430, 462}, "wgmma tile 256x512");
  // One expert with 97 rows (a full-size tile, 31 masked tokens) and one with 40.
  const Problem q = make_problem(2, 128, 256, {97, 40}, 0, 221);
  const DeviceProblem dq(q);
  const Tensor q_all = check_wgmma_against_mma_sync(q, dq, "wgmma tile 128x256");
  EXPECT_LE(worst_error(reference(q), q_all), kTolerance);
}

TEST_F(MoeWgmmaTest, PrefillWgmmaV41FlashExpertShapes) {
  if (!wgmma_available()) GTEST_SKIP() << "wgmma needs an sm_90 device";
  const std::vector<int32_t> counts = {300, 0, 129, 128, 1, 97, 33, 250};
  const struct {
    int64_t n, k;
    uint32_t seed;
    const char* what;
  } cases[] = {{4608, 5120, 231, "wgmma tile w13 4608x5120"},
               {5120, 2304, 241, "wgmma tile w2 5120x2304"}};
  for (const auto& c : cases) {
    const Problem p = make_problem(8, c.n, c.k, counts, 3, c.seed);
    const DeviceProblem d(p);
    const Tensor all = check_wgmma_against_mma_sync(p, d, c.what);
    check_rows_alone(p, d, all, {0, 299, 300, 428, 557, 558, 655, 687, 937}, c.what);
  }
}

// ops::cuda::moe_experts with the V4.1 flow (w1 and w3 over one quantization: the hook's two
// weight tables; w2 over the SwiGLU's codes): 40 tokens x top-2 over 4 experts (80 rows, the
// prefill regime), wgmma tile against mma.sync tile bit for bit, fused and per-projection paths.
TEST_F(MoeWgmmaTest, PrefillWgmmaFusedMoeExpertsSmallShapes) {
  if (!wgmma_available()) GTEST_SKIP() << "wgmma needs an sm_90 device";
  constexpr int64_t kExperts = 4, kDim = 256, kInter = 512, kTopK = 2, kTokens = 40;
  std::vector<Tensor> storage;
  storage.reserve(6 * kExperts);
  std::vector<ExpertWeights> experts(kExperts);
  uint32_t seed = 600;
  const auto make = [&](int64_t out, int64_t in, LinearWeight& device) {
    const Tensor w = random_bytes(DType::kF4E2M1x2, {out, in}, ++seed, 0, 255);
    const Tensor sc = random_bytes(DType::kF8E8M0, {out, in / 32}, ++seed, 117, 121);
    const Tensor& dw = storage.emplace_back(rt::to_device(w.view()));
    const Tensor& dsc = storage.emplace_back(rt::to_device(sc.view()));
    device = LinearWeight{dw.view(), dsc.view()};
  };
  for (int64_t e = 0; e < kExperts; ++e) {
    make(kInter, kDim, experts[e].w1);
    make(kInter, kDim, experts[e].w3);
    make(kDim, kInter, experts[e].w2);
  }
  Tensor chosen = Tensor::empty(DType::kI32, {kTokens, kTopK});
  std::mt19937 rng(610);
  for (int64_t t = 0; t < kTokens; ++t) {
    const auto first = static_cast<int32_t>(rng() % kExperts);
    chosen.data<int32_t>()[t * kTopK] = first;
    chosen.data<int32_t>()[t * kTopK + 1] =
        static_cast<int32_t>((first + 1 + rng() % (kExperts - 1)) % kExperts);
  }
  Tensor weights = Tensor::empty(DType::kF32, {kTokens, kTopK});
  Tensor x = Tensor::empty(DType::kF32, {kTokens, kDim});
  const std::vector<float> weight_values = testing::random_values(kTokens * kTopK, 611);
  const std::vector<float> x_values = testing::random_values(kTokens * kDim, 612);
  std::copy(weight_values.begin(), weight_values.end(), weights.data<float>());
  std::copy(x_values.begin(), x_values.end(), x.data<float>());
  const Tensor dx = rt::to_device(x.view());
  const Tensor dc = rt::to_device(chosen.view());
  const Tensor dwt = rt::to_device(weights.view());
  const auto run = [&](bool wgmma, bool fused) {
    cuda::set_moe_wgmma(wgmma);
    cuda::set_moe_experts_fused_path(fused);
    Tensor out = Tensor::empty(DType::kF32, {kTokens, kDim}, rt::device_allocator());
    rt::fill_bytes(out.view(), 0xFF);
    cuda::moe_experts(dx.view(), dc.view(), dwt.view(), experts, 10.0f,
                      ActivationQuant::kFp8PerBlock32, out.view());
    rt::synchronize();
    cuda::set_moe_experts_fused_path(true);
    return rt::to_host(out.view());
  };
  for (const bool fused : {true, false}) {
    const Tensor old_tile = run(false, fused);
    for (const bool overlap : {true, false}) {
      cuda::set_moe_wgmma_overlap(overlap);
      const Tensor new_tile = run(true, fused);
      expect_same_bits(
          old_tile, new_tile, kDim,
          std::string(fused ? "moe_experts fused path" : "moe_experts per-projection path") +
              (overlap ? ", conversion overlapped" : ", conversion between steps"));
    }
  }
}

}  // namespace
}  // namespace deepinfer::ops
