// The BF16 tensor-core path of ops::cuda::linear (linear_bf16_mma) against the CPU reference
// (ops::linear on host views, f32 arithmetic) at the released checkpoint's BF16 shapes: attention
// wo_a (one group, 1024 x 4096, on a column slice of the 32768-wide attention output), the router
// gate (384 x 5120) and the compressor (512 x 5120); batch invariance bit for bit across every
// token tiling the launch picks; outputs fully written and nothing else. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "core/dtype_convert.h"
#include "core/error.h"
#include "gpu_support.h"
#include "ops/batch_invariance.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/linear_bf16_mma.h"
#include "ops/cuda/runtime_switch.h"
#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

namespace rt = deepinfer::cuda;
using testing::same_bits;

// As ops::linear's FMA kernel against the same reference (backend_ops_test): the tensor-core
// path differs in summation order and, with two bf16 terms per activation, in x's remainder
// below about 2^-16 of |x| (random signs: about 3e-6 of the output's scale expected; three terms
// are exact, leaving summation order only).
constexpr double kTolerance = 2e-5;

// run_gpu's `terms` meaning "through ops::cuda::linear, the model's op".
constexpr int kModelOp = -1;

// Normal values times 2^e, e uniform in [lo_exp, hi_exp]: magnitudes over several binades.
std::vector<float> varied_values(size_t count, uint32_t seed, int lo_exp, int hi_exp) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(lo_exp, hi_exp);
  std::vector<float> values(count);
  for (float& v : values) v = std::ldexp(normal(rng), exponent(rng));
  return values;
}

Tensor host_f32(Shape shape, uint32_t seed) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  const std::vector<float> values = varied_values(static_cast<size_t>(t.numel()), seed, -8, 3);
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

// Weight-like magnitudes (about 0.02, spread over 2^-3..2^3 of it), rounded to bf16.
Tensor host_bf16(Shape shape, uint32_t seed) {
  Tensor t = Tensor::empty(DType::kBF16, shape);
  const std::vector<float> values = varied_values(static_cast<size_t>(t.numel()), seed, -9, -3);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<BFloat16>()[i].bits = float_to_bf16(values[i]);
  return t;
}

// Worst |got - want| over max |want|; a NaN in got (an element never written) is infinite.
double worst_error(const Tensor& want, const Tensor& got) {
  double scale = 1e-30;
  for (int64_t i = 0; i < want.numel(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(want.data<float>()[i])));
  }
  double worst = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const float g = got.data<float>()[i];
    if (!std::isfinite(g)) return INFINITY;
    worst = std::max(worst, std::abs(static_cast<double>(g) - want.data<float>()[i]) / scale);
  }
  return worst;
}

// One BF16 role: weight [n, k] and an activation matrix whose rows are k wide, optionally a
// column slice of a wider matrix (wo_a's input is attn_flat.narrow(1, g * 4096, 4096)).
struct Role {
  std::string name;
  int64_t n = 0;
  int64_t k = 0;
  int64_t x_width = 0;   // columns of the whole activation matrix (>= k)
  int64_t x_column = 0;  // first column of the slice
  Tensor weight;         // host bf16
  Tensor x;              // host f32 [max rows, x_width]
  Tensor device_weight;
  Tensor device_x;
};

Role make_role(std::string name, int64_t n, int64_t k, int64_t x_width, int64_t x_column,
               int64_t max_rows, uint32_t seed) {
  Role r;
  r.name = std::move(name);
  r.n = n;
  r.k = k;
  r.x_width = x_width;
  r.x_column = x_column;
  r.weight = host_bf16({n, k}, seed);
  r.x = host_f32({max_rows, x_width}, seed + 1);
  r.device_weight = rt::to_device(r.weight.view());
  r.device_x = rt::to_device(r.x.view());
  return r;
}

// The LM head (129280 x 5120 bf16) for the decode tile's test: 662M weights from a counter hash
// rather than make_role's normal draws (seconds instead of a minute), bf16 of magnitude
// 2^-9..2^-3 with random signs and significands.
Role make_lm_head(int64_t max_rows, uint32_t seed) {
  constexpr int64_t kVocab = 129280;
  constexpr int64_t kHidden = 5120;
  Role r;
  r.name = "lm_head";
  r.n = kVocab;
  r.k = kHidden;
  r.x_width = kHidden;
  r.x_column = 0;
  r.weight = Tensor::empty(DType::kBF16, {kVocab, kHidden});
  BFloat16* w = r.weight.data<BFloat16>();
  for (int64_t i = 0; i < r.weight.numel(); ++i) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const uint16_t exponent = static_cast<uint16_t>(118 + (h >> 40) % 7);  // 2^-9..2^-3
    w[i].bits = static_cast<uint16_t>(((h >> 8) & 0x8000u) | (exponent << 7) | (h & 0x7Fu));
  }
  r.x = host_f32({max_rows, kHidden}, seed + 1);
  r.device_weight = rt::to_device(r.weight.view());
  r.device_x = rt::to_device(r.x.view());
  return r;
}

TensorView rows_of(const Tensor& x, const Role& r, int64_t first, int64_t count) {
  return x.view().narrow(0, first, count).narrow(1, r.x_column, r.k);
}

Tensor reference(const Role& r, int64_t first, int64_t count) {
  Tensor want = Tensor::empty(DType::kF32, {count, r.n});
  linear(rows_of(r.x, r, first, count), LinearWeight{r.weight.view(), TensorView()}, want.view());
  return want;
}

// The GPU path on rows [first, first + count): through ops::cuda::linear (kModelOp), else
// linear_bf16_mma directly with `terms` bf16 terms per activation. The output is a column slice
// of a NaN-filled matrix twice as wide (as wo_a writes its group's columns): the other half must
// stay NaN.
Tensor run_gpu(const Role& r, int64_t first, int64_t count, int terms = kModelOp) {
  Tensor wide = Tensor::empty(DType::kF32, {count, 2 * r.n}, rt::device_allocator());
  rt::fill_bytes(wide.view(), 0xFF);
  const TensorView out = wide.view().narrow(1, r.n, r.n);
  const TensorView x = rows_of(r.device_x, r, first, count);
  const LinearWeight w{r.device_weight.view(), TensorView()};
  if (terms == kModelOp) {
    cuda::linear(x, w, out, ActivationQuant::kNone);
  } else {
    cuda::linear_bf16_mma(x, w, out, terms);
  }
  rt::synchronize();
  const Tensor host = rt::to_host(wide.view());
  Tensor got = Tensor::empty(DType::kF32, {count, r.n});
  for (int64_t m = 0; m < count; ++m) {
    const float* row = host.data<float>() + m * 2 * r.n;
    for (int64_t n = 0; n < r.n; ++n) {
      EXPECT_TRUE(std::isnan(row[n])) << r.name << ": column " << n << " outside the output";
    }
    std::copy(row + r.n, row + 2 * r.n, got.data<float>() + m * r.n);
  }
  return got;
}

bool equal_rows(const Tensor& a, int64_t a_row, const Tensor& b, int64_t b_row, int64_t n) {
  return std::memcmp(a.data<float>() + a_row * n, b.data<float>() + b_row * n,
                     static_cast<size_t>(n) * sizeof(float)) == 0;
}

class LinearBf16MmaTest : public ::testing::Test {
 protected:
  void SetUp() override { DEEPINFER_SKIP_WITHOUT_GPU(); }
};

// Every row count picks a different launch: 1 and 7 rows the 8-token decode tile, 16 the 16-token
// one, 40 and 300 the 32-token tile with K split over warps. Both term counts are measured; the
// model's op must equal the direct call with its own count.
void check_role(const Role& r) {
  std::printf("%s [%ld x %ld]: K in %d slices; ops::cuda::linear uses %d terms (path %s)\n",
              r.name.c_str(), static_cast<long>(r.n), static_cast<long>(r.k),
              cuda::linear_bf16_mma_k_slices(r.n, r.k), cuda::linear_bf16_mma_activation_terms(),
              cuda::linear_bf16_mma_enabled() ? "on" : "off");
  for (int64_t rows : {1, 7, 16, 40, 300}) {
    const Tensor want = reference(r, 0, rows);
    const Tensor model_op = run_gpu(r, 0, rows);
    EXPECT_LE(worst_error(want, model_op), kTolerance) << r.name << ", " << rows << " rows";
    for (int terms : {2, 3}) {
      const Tensor got = run_gpu(r, 0, rows, terms);
      const double error = worst_error(want, got);
      std::printf("%s, %ld rows, %d terms: worst error %.3g of the output's scale\n",
                  r.name.c_str(), static_cast<long>(rows), terms, error);
      EXPECT_LE(error, kTolerance) << r.name << ", " << rows << " rows, " << terms << " terms";
      if (cuda::linear_bf16_mma_enabled() && terms == cuda::linear_bf16_mma_activation_terms()) {
        EXPECT_EQ(0, std::memcmp(model_op.data<float>(), got.data<float>(),
                                 static_cast<size_t>(rows * r.n) * sizeof(float)))
            << r.name << ", " << rows << " rows: ops::cuda::linear did not take this path";
      }
    }
  }
}

TEST_F(LinearBf16MmaTest, WoAGroupOnAStridedInput) {
  // Group 3 of 8: columns [12288, 16384) of the 32768-wide attention output.
  check_role(make_role("wo_a group", 1024, 4096, 32768, 3 * 4096, 300, 11));
}

TEST_F(LinearBf16MmaTest, RouterGate) {
  check_role(make_role("gate", 384, 5120, 5120, 0, 300, 21));
}

TEST_F(LinearBf16MmaTest, Compressor) {
  check_role(make_role("compressor wkv", 512, 5120, 5120, 0, 300, 31));
}

// A row's output is the same bits alone, in a 7-row call and in a large call, whatever tile and
// kernel each call picks. The 520-row case of a wide weight takes the prefill kernel (all K
// slices in one warp) against the decode kernel's slices spread over warps.
TEST_F(LinearBf16MmaTest, RowsDoNotDependOnTheBatch) {
  struct Case {
    Role role;
    int64_t rows;
  };
  std::vector<Case> cases;
  cases.push_back({make_role("wo_a group", 1024, 4096, 32768, 5 * 4096, 300, 41), 300});
  cases.push_back({make_role("gate", 384, 5120, 5120, 0, 300, 51), 300});
  cases.push_back({make_role("wide 4096 x 512", 4096, 512, 512, 0, 520, 61), 520});
  for (const Case& c : cases) {
    const Role& r = c.role;
    const Tensor want = reference(r, 0, c.rows);
    for (int terms : {2, 3}) {
      const std::string what = r.name + ", " + std::to_string(terms) + " terms";
      const Tensor all = run_gpu(r, 0, c.rows, terms);
      const double error = worst_error(want, all);
      std::printf("%s, %ld rows: worst error %.3g of the output's scale\n", what.c_str(),
                  static_cast<long>(c.rows), error);
      EXPECT_LE(error, kTolerance) << what;
      const Tensor seven = run_gpu(r, 100, 7, terms);
      for (int64_t i = 0; i < 7; ++i) {
        EXPECT_TRUE(equal_rows(all, 100 + i, seven, i, r.n))
            << what << ": row " << 100 + i << " differs in a 7-row call";
      }
      for (int64_t row : {int64_t{0}, int64_t{31}, int64_t{103}, c.rows - 1}) {
        const Tensor alone = run_gpu(r, row, 1, terms);
        EXPECT_TRUE(equal_rows(all, row, alone, 0, r.n))
            << what << ": row " << row << " differs when computed alone";
      }
      const Tensor sixteen = run_gpu(r, 32, 16, terms);
      for (int64_t i = 0; i < 16; ++i) {
        EXPECT_TRUE(equal_rows(all, 32 + i, sixteen, i, r.n))
            << what << ": row " << 32 + i << " differs in a 16-row call";
      }
    }
  }
}

// Every launch variant on small shapes (quick under compute-sanitizer): 5 rows (8-token tile),
// 13 (16-token tile), 40 (32-token tile, pre-split activations, K over warps), 1024 rows of a
// 2048-row weight (the prefill kernel); partial row-group blocks (48 rows = 3 groups).
TEST_F(LinearBf16MmaTest, SmallShapesEveryLaunch) {
  struct Case {
    int64_t n, k, rows;
  };
  for (const Case& c : {Case{48, 256, 5}, Case{48, 256, 13}, Case{48, 256, 40},
                        Case{2048, 64, 1024}, Case{80, 96, 3}}) {
    const Role r = make_role("small", c.n, c.k, c.k + 32, 32, c.rows, 81);
    const Tensor want = reference(r, 0, c.rows);
    for (int terms : {kModelOp, 2, 3}) {
      const double error = worst_error(want, run_gpu(r, 0, c.rows, terms));
      std::printf("small %ld x %ld, %ld rows, terms %d: worst error %.3g\n", static_cast<long>(c.n),
                  static_cast<long>(c.k), static_cast<long>(c.rows), terms, error);
      EXPECT_LE(error, kTolerance) << c.n << " x " << c.k << ", " << c.rows << " rows";
    }
  }
}

// ---- the decode tile (weights through shared memory) against the register-ring kernel -------

// Runs its body on the register-ring decode kernel, restoring the decode tile afterwards.
class RegisterKernelForDecode {
 public:
  RegisterKernelForDecode() = default;
  RegisterKernelForDecode(const RegisterKernelForDecode&) = delete;
  RegisterKernelForDecode& operator=(const RegisterKernelForDecode&) = delete;

 private:
  rt::ScopedSwitch decode_tile_{"DEEPINFER_BF16_DECODE_TILE", false};
};

// Lowers the weight size from which the decode variants apply (so small weights reach them),
// restoring the default afterwards.
class DecodeVariantsForEveryWeight {
 public:
  DecodeVariantsForEveryWeight() { cuda::set_bf16_decode_pre_split_min_bytes(0); }
  ~DecodeVariantsForEveryWeight() { cuda::set_bf16_decode_pre_split_min_bytes(-1); }
  DecodeVariantsForEveryWeight(const DecodeVariantsForEveryWeight&) = delete;
  DecodeVariantsForEveryWeight& operator=(const DecodeVariantsForEveryWeight&) = delete;
};

// Rows [0, rows) of r through the decode tile (every decode variant) and through the register
// kernel, with the model's term count and both explicit ones: the same bits, and within the
// reference's tolerance when `with_reference`.
void check_decode_tile(const Role& r, int64_t rows, bool with_reference) {
  const std::string what = r.name + " [" + std::to_string(r.n) + " x " + std::to_string(r.k) +
                           "], " + std::to_string(rows) + " rows";
  Tensor want;
  if (with_reference) want = reference(r, 0, rows);
  for (int terms : {kModelOp, 2, 3}) {
    const Tensor tile = run_gpu(r, 0, rows, terms);
    Tensor register_kernel;
    {
      const RegisterKernelForDecode old_path;
      register_kernel = run_gpu(r, 0, rows, terms);
    }
    EXPECT_TRUE(same_bits(tile, register_kernel))
        << what << ", terms " << terms << ": the decode tile differs from the register kernel";
    for (int variant = 0; variant < cuda::bf16_decode_variants(); ++variant) {
      Tensor variant_tile;
      {
        const rt::ScopedSetting decode_variant("DEEPINFER_BF16_DECODE_VARIANT", variant);
        variant_tile = run_gpu(r, 0, rows, terms);
      }
      EXPECT_TRUE(same_bits(variant_tile, register_kernel))
          << what << ", terms " << terms << ": decode variant " << variant
          << " differs from the register kernel";
    }
    if (with_reference) {
      const double error = worst_error(want, tile);
      std::printf("%s, terms %d: worst error %.3g of the output's scale\n", what.c_str(), terms,
                  error);
      EXPECT_LE(error, kTolerance) << what << ", terms " << terms;
    }
  }
}

// Every decode shape class on small weights (quick under compute-sanitizer): 8 K slices of one
// chunk (a stage half empty), 1 slice of 3 chunks, 2 slices of 5 chunks (odd: the last stage
// holds one chunk), 8 slices of 32 chunks (more stages than slots, slots reused), one row group
// and partial blocks; rows over the 8-, 16- and 32-token tiles (17+ with pre-split terms), and a
// row computed alone equals the same row in the call.
TEST_F(LinearBf16MmaTest, DecodeTileSmallShapes) {
  struct Case {
    int64_t n, k;
  };
  for (const Case& c : {Case{48, 256}, Case{80, 96}, Case{64, 320}, Case{48, 8192}, Case{16, 512},
                        Case{112, 1024}}) {
    const Role r = make_role("small", c.n, c.k, c.k + 32, 32, 40, 91);
    const DecodeVariantsForEveryWeight every_weight;
    std::printf("small %ld x %ld: K in %d slices\n", static_cast<long>(c.n), static_cast<long>(c.k),
                cuda::linear_bf16_mma_k_slices(c.n, c.k));
    for (int64_t rows : {1, 2, 5, 8, 13, 16, 24, 32, 40}) check_decode_tile(r, rows, true);
    const Tensor all = run_gpu(r, 0, 40);
    for (int64_t row : {int64_t{0}, int64_t{9}, int64_t{39}}) {
      EXPECT_TRUE(equal_rows(all, row, run_gpu(r, row, 1), 0, r.n))
          << c.n << " x " << c.k << ": row " << row << " differs when computed alone";
    }
  }
}

// The released checkpoint's decode GEMMs on the BF16 path at 1, 2, 8, 16 and 32 rows: a wo_a
// group on its strided input, the router gate, the compressor and the LM head (129280 x 5120,
// 1.3 GB of bf16; its CPU reference only at one row). Bits equal to the register kernel's.
TEST_F(LinearBf16MmaTest, DecodeTileV41FlashShapes) {
  std::vector<Role> roles;
  roles.push_back(make_role("wo_a group", 1024, 4096, 32768, 6 * 4096, 32, 101));
  roles.push_back(make_role("gate", 384, 5120, 5120, 0, 32, 111));
  roles.push_back(make_role("compressor wkv", 512, 5120, 5120, 0, 32, 121));
  {
    // The variants on these shapes too (the model takes them for the LM head only).
    const DecodeVariantsForEveryWeight every_weight;
    for (const Role& r : roles) {
      for (int64_t rows : {1, 2, 8, 16, 32}) check_decode_tile(r, rows, true);
    }
  }
  const Role head = make_lm_head(32, 131);
  for (int64_t rows : {1, 2, 8, 16, 32}) check_decode_tile(head, rows, rows == 1);
}

// ---- linear_grouped: the attention's wo_a groups in one launch ------------------------------

// The CPU's linear_grouped of host_x and a host bf16 weight (the reference), `got` within the
// tolerance of it; returns the reference.
Tensor expect_close_to_cpu_grouped(const TensorView& host_x, const TensorView& weight,
                                   int64_t groups, const Tensor& got, const std::string& what) {
  Tensor want = Tensor::empty(DType::kF32, {host_x.size(0), weight.size(0)});
  linear_grouped(host_x, LinearWeight{weight, TensorView()}, groups, want.view());
  const double error = worst_error(want, got);
  std::printf("%s: worst error %.3g\n", what.c_str(), error);
  EXPECT_LE(error, kTolerance) << what;
  return want;
}

// x [rows, groups * group_in] (a column slice of a wider matrix, as attn_flat is not, to test the
// stride), weight [groups * group_out, group_in] bf16. linear_grouped on the GPU against the
// per-group ops::cuda::linear calls (bits), the same with the grouped launch off (bits), and the
// CPU's linear_grouped (tolerance; itself the per-group CPU linears, bits). Every output column
// is written, nothing outside.
// With `invariant` false (batch invariance off: the grouped and per-group launches may take
// different cluster ranks, so other additions) only the tolerance is checked.
void check_grouped(int64_t groups, int64_t group_out, int64_t group_in, int64_t rows, uint32_t seed,
                   bool invariant = true) {
  const std::string what = std::to_string(groups) + " x [" + std::to_string(group_out) + " x " +
                           std::to_string(group_in) + "], " + std::to_string(rows) + " rows";
  const int64_t n = groups * group_out;
  const int64_t width = groups * group_in;
  const Tensor weight = host_bf16({n, group_in}, seed);
  const Tensor x = host_f32({rows, width + 64}, seed + 1);
  const Tensor device_weight = rt::to_device(weight.view());
  const Tensor device_x = rt::to_device(x.view());
  const TensorView x_view = device_x.view().narrow(1, 32, width);
  const LinearWeight w{device_weight.view(), TensorView()};
  // Into columns [n, 2n) of a NaN-filled [rows, 2n]: the first half must stay NaN.
  const auto gpu = [&](const auto& call) {
    Tensor wide = Tensor::empty(DType::kF32, {rows, 2 * n}, rt::device_allocator());
    rt::fill_bytes(wide.view(), 0xFF);
    call(wide.view().narrow(1, n, n));
    rt::synchronize();
    const Tensor host = rt::to_host(wide.view());
    Tensor got = Tensor::empty(DType::kF32, {rows, n});
    for (int64_t m = 0; m < rows; ++m) {
      const float* row = host.data<float>() + m * 2 * n;
      for (int64_t c = 0; c < n; ++c) {
        EXPECT_TRUE(std::isnan(row[c])) << what << ": column " << c << " outside the output";
      }
      std::copy(row + n, row + 2 * n, got.data<float>() + m * n);
    }
    return got;
  };
  const Tensor grouped =
      gpu([&](const TensorView& out) { linear_grouped(x_view, w, groups, out); });
  const Tensor per_group = gpu([&](const TensorView& out) {
    for (int64_t g = 0; g < groups; ++g) {
      cuda::linear(x_view.narrow(1, g * group_in, group_in),
                   LinearWeight{w.weight.narrow(0, g * group_out, group_out), TensorView()},
                   out.narrow(1, g * group_out, group_out));
    }
  });
  Tensor grouped_off;
  {
    const rt::ScopedSwitch per_group_launches("DEEPINFER_BF16_GROUPED", false);
    grouped_off = gpu([&](const TensorView& out) { linear_grouped(x_view, w, groups, out); });
  }
  if (invariant) {
    EXPECT_TRUE(same_bits(grouped, per_group)) << what << ": one launch differs from the groups";
    EXPECT_TRUE(same_bits(grouped_off, per_group)) << what << ": the switched-off path differs";
  }

  const TensorView host_x = x.view().narrow(1, 32, width);
  const Tensor want =
      expect_close_to_cpu_grouped(host_x, weight.view(), groups, grouped, "grouped " + what);
  Tensor want_per_group = Tensor::empty(DType::kF32, {rows, n});
  for (int64_t g = 0; g < groups; ++g) {
    linear(host_x.narrow(1, g * group_in, group_in),
           LinearWeight{weight.view().narrow(0, g * group_out, group_out), TensorView()},
           want_per_group.view().narrow(1, g * group_out, group_out));
  }
  EXPECT_TRUE(same_bits(want, want_per_group)) << what << ": CPU grouped differs from the groups";
}

// Small groups (quick under compute-sanitizer): K in several slices and in one, one row group per
// group and several, rows over both decode tiles and past them (the per-group fallback).
TEST_F(LinearBf16MmaTest, GroupedLinearSmallShapes) {
  struct Case {
    int64_t groups, group_out, group_in;
  };
  for (const Case& c : {Case{8, 16, 64}, Case{8, 48, 320}, Case{3, 32, 1024}, Case{2, 16, 96}}) {
    for (int64_t rows : {1, 5, 8, 13, 16, 24}) {
      check_grouped(c.groups, c.group_out, c.group_in, rows, 161);
    }
  }
}

// The attention's wo_a: 8 groups of 1024 x 4096 on the 32768-wide attention output.
TEST_F(LinearBf16MmaTest, GroupedLinearWoA) {
  for (int64_t rows : {1, 2, 8, 16, 32}) check_grouped(8, 1024, 4096, rows, 171);
}

// ---- fp8 weights without activation quantization: wo_a as released -----------------------------

// Weight [groups * group_out, group_in] as e4m3 codes with ue8m0 scales of 32 x 32 blocks (all
// codes but NaN, scales 2^-10..2^-6). The GPU's linear_grouped on the fp8 weight (one group: a
// plain linear without activation quantization) must give the bits of the same call on its exact
// bf16 dequantization (the decode tile converting the codes at 1-16 rows, the bf16 path on a
// dequantized copy beyond), under batch invariance on or off; and the CPU reference's values
// within the tolerance.
void check_fp8_weight(int64_t groups, int64_t group_out, int64_t group_in, int64_t rows,
                      uint32_t seed, bool invariant) {
  const std::string what = std::to_string(groups) + " x fp8 [" + std::to_string(group_out) + " x " +
                           std::to_string(group_in) + "], " + std::to_string(rows) +
                           " rows, invariance " + (invariant ? "on" : "off");
  const ScopedBatchInvariance invariance(invariant);
  const int64_t n = groups * group_out;
  const int64_t width = groups * group_in;
  const Tensor codes = testing::random_e4m3({n, group_in}, seed);
  const Tensor scale =
      testing::random_bytes(DType::kF8E8M0, {n / 32, group_in / 32}, seed + 1, 117, 121);
  Tensor dense = Tensor::empty(DType::kBF16, {n, group_in});
  dequantize_weight(LinearWeight{codes.view(), scale.view()}, dense.view());
  const Tensor x = host_f32({rows, width + 64}, seed + 2);
  const Tensor device_codes = rt::to_device(codes.view());
  const Tensor device_scale = rt::to_device(scale.view());
  const Tensor device_dense = rt::to_device(dense.view());
  const Tensor device_x = rt::to_device(x.view());
  const TensorView x_view = device_x.view().narrow(1, 32, width);
  const auto gpu = [&](const LinearWeight& w) {
    Tensor out = Tensor::empty(DType::kF32, {rows, n}, rt::device_allocator());
    rt::fill_bytes(out.view(), 0xFF);
    linear_grouped(x_view, w, groups, out.view());
    rt::synchronize();
    return rt::to_host(out.view());
  };
  const Tensor from_codes = gpu(LinearWeight{device_codes.view(), device_scale.view()});
  const Tensor from_dense = gpu(LinearWeight{device_dense.view(), TensorView()});
  EXPECT_TRUE(same_bits(from_codes, from_dense)) << what << ": fp8 codes differ from bf16";

  expect_close_to_cpu_grouped(x.view().narrow(1, 32, width), dense.view(), groups, from_codes,
                              what);
}

// Small shapes (quick under compute-sanitizer): one and several row groups and K slices, rows on
// both decode tiles and past them (the dequantized copy).
TEST_F(LinearBf16MmaTest, Fp8WeightSmallShapes) {
  struct Case {
    int64_t groups, group_out, group_in;
  };
  for (const Case& c : {Case{8, 32, 64}, Case{4, 64, 320}, Case{1, 96, 1024}, Case{2, 32, 96}}) {
    for (int64_t rows : {1, 5, 8, 13, 16, 24}) {
      for (bool invariant : {true, false}) {
        check_fp8_weight(c.groups, c.group_out, c.group_in, rows, 181, invariant);
      }
    }
  }
}

// The attention's wo_a as released: 8 groups of 1024 x 4096 fp8 on the 32768-wide attention
// output, decode and past it (80 rows: cuBLASLt with batch invariance off).
TEST_F(LinearBf16MmaTest, Fp8WeightWoA) {
  for (int64_t rows : {1, 2, 8, 16, 80}) {
    for (bool invariant : {true, false}) check_fp8_weight(8, 1024, 4096, rows, 191, invariant);
  }
}

// ---- prefill: the wide tile and the grouped block order against the kernel before them -------

// Runs its body on prefill's one-row-group-per-warp kernel (bf16_mma_kernel<4, false, ...>), in
// grouped or plain block order, restoring the defaults afterwards.
class RegisterKernelForPrefill {
 public:
  explicit RegisterKernelForPrefill(bool grouped_order)
      : wide_groups_("DEEPINFER_BF16_WIDE_GROUPS", grouped_order) {}
  RegisterKernelForPrefill(const RegisterKernelForPrefill&) = delete;
  RegisterKernelForPrefill& operator=(const RegisterKernelForPrefill&) = delete;

 private:
  rt::ScopedSwitch wide_tile_{"DEEPINFER_BF16_WIDE_TILE", false};
  rt::ScopedSwitch wide_groups_;
};

// Runs its body on the wide tile (128 weight rows a block) instead of the big tile (256, where N
// and K allow it), restoring the default afterwards.
class WideTileForPrefill {
 public:
  WideTileForPrefill() = default;
  WideTileForPrefill(const WideTileForPrefill&) = delete;
  WideTileForPrefill& operator=(const WideTileForPrefill&) = delete;

 private:
  rt::ScopedSwitch big_tile_{"DEEPINFER_BF16_BIG_TILE", false};
};

// Rows [0, rows) of r on the default prefill tile (the big tile where N % 256 == 0 and K % 64 ==
// 0, else the wide tile), on the wide tile and on the register kernel in grouped and in plain
// block order: the same bits (with the model's term count and both explicit ones), and the listed
// rows equal to the same rows computed alone (the decode tile).
void check_prefill(const Role& r, int64_t rows, std::initializer_list<int64_t> alone_rows) {
  const std::string what = r.name + " [" + std::to_string(r.n) + " x " + std::to_string(r.k) +
                           "], " + std::to_string(rows) + " rows";
  for (int terms : {kModelOp, 2, 3}) {
    const Tensor tile = run_gpu(r, 0, rows, terms);
    {
      const WideTileForPrefill wide_tile;
      EXPECT_TRUE(same_bits(tile, run_gpu(r, 0, rows, terms)))
          << what << ", terms " << terms << ": the default tile differs from the wide tile";
    }
    for (bool grouped_order : {true, false}) {
      Tensor register_kernel;
      {
        const RegisterKernelForPrefill old_path(grouped_order);
        register_kernel = run_gpu(r, 0, rows, terms);
      }
      EXPECT_TRUE(same_bits(tile, register_kernel))
          << what << ", terms " << terms << ": the wide tile differs from the register kernel in "
          << (grouped_order ? "grouped" : "plain") << " block order";
    }
    for (int64_t row : alone_rows) {
      EXPECT_TRUE(equal_rows(tile, row, run_gpu(r, row, 1, terms), 0, r.n))
          << what << ", terms " << terms << ": row " << row << " differs when computed alone";
    }
  }
}

// Prefill-sized calls of small weights (quick under compute-sanitizer): 20 row blocks (the last
// with one row group, so rows past N; groups of 8, 8 and 4) times 15 64-token blocks, K in 2
// slices; 32 row blocks times 9, K in 4 slices (the slice totals); 256 row blocks times two
// 32-token blocks (40 rows: the 32-token tile, tokens past the end). Against the CPU reference.
TEST_F(LinearBf16MmaTest, WideTileSmallShapes) {
  struct Case {
    int64_t n, k, rows;
  };
  for (const Case& c : {Case{2448, 64, 900}, Case{4096, 128, 520}, Case{32768, 64, 40}}) {
    const Role r = make_role("small wide", c.n, c.k, c.k, 0, c.rows, 141);
    const double error = worst_error(reference(r, 0, c.rows), run_gpu(r, 0, c.rows));
    std::printf("small wide %ld x %ld (K in %d slices), %ld rows: worst error %.3g\n",
                static_cast<long>(c.n), static_cast<long>(c.k),
                cuda::linear_bf16_mma_k_slices(c.n, c.k), static_cast<long>(c.rows), error);
    EXPECT_LE(error, kTolerance) << c.n << " x " << c.k << ", " << c.rows << " rows";
    check_prefill(r, c.rows, {0, 33, c.rows - 1});
  }
}

// Prefill-sized calls the big tile takes (N % 256 == 0, K % 64 == 0; quick under
// compute-sanitizer): K in 4 slices of one chunk (a slice ends after each stage's first chunk
// too), in 2 slices of 3 and of 5 chunks (slice ends inside a stage; the running totals through
// the output), 512 row blocks of the 32-token block at 20 rows (tokens past the end) and of the
// 64-token block at 33 rows, and too few blocks for the prefill kernels (K in 8 slices of 2
// chunks on grid.z, 32- and 64-token blocks; before, the decode tile). Against the CPU reference
// and the paths before.
TEST_F(LinearBf16MmaTest, BigTileSmallShapes) {
  struct Case {
    int64_t n, k, rows;
  };
  for (const Case& c :
       {Case{4096, 128, 520}, Case{4096, 192, 520}, Case{8192, 320, 300}, Case{65536, 64, 20},
        Case{65536, 64, 33}, Case{1024, 512, 40}, Case{1024, 512, 200}, Case{256, 512, 70}}) {
    const Role r = make_role("small big", c.n, c.k, c.k, 0, c.rows, 181);
    const double error = worst_error(reference(r, 0, c.rows), run_gpu(r, 0, c.rows));
    std::printf("small big %ld x %ld (K in %d slices), %ld rows: worst error %.3g\n",
                static_cast<long>(c.n), static_cast<long>(c.k),
                cuda::linear_bf16_mma_k_slices(c.n, c.k), static_cast<long>(c.rows), error);
    EXPECT_LE(error, kTolerance) << c.n << " x " << c.k << ", " << c.rows << " rows";
    check_prefill(r, c.rows, {0, 17, c.rows - 1});
  }
}

// A prefill call of one wo_a group (1024 x 4096, K in 8 slices, on its column slice of the
// attention output) at 2048 rows: the big tile's 4 x 32 blocks, the same bits as the wide tile
// and the register kernel, rows equal to themselves alone, the first rows against the CPU; then
// 17, 64 and 256 rows (the slices on grid.z) against the CPU and the decode tile.
TEST_F(LinearBf16MmaTest, BigTileWoAPrefill) {
  constexpr int64_t kRows = 2048;
  const Role r = make_role("wo_a prefill", 1024, 4096, 32768, 3 * 4096, kRows, 191);
  const Tensor got = run_gpu(r, 0, kRows);
  const Tensor want = reference(r, 0, 4);
  Tensor first = Tensor::empty(DType::kF32, {4, r.n});
  std::copy(got.data<float>(), got.data<float>() + 4 * r.n, first.data<float>());
  EXPECT_LE(worst_error(want, first), kTolerance);
  check_prefill(r, kRows, {0, 1000, kRows - 1});
  // Decode batches past 16 rows: the big tile with K slices on grid.z (the decode tile before).
  for (int64_t rows : {17, 64, 256}) {
    const Tensor part = run_gpu(r, 0, rows);
    EXPECT_LE(worst_error(reference(r, 0, rows), part), kTolerance) << rows << " rows";
    check_prefill(r, rows, {0, rows - 1});
  }
}

// The LM head at 9-32 rows (the big tile's 32-token block; at 9-16 rows in place of the decode
// tile, which the wide-tile comparison then runs): the CPU reference at 16 and 17 rows, the
// same bits as the paths before, rows equal to themselves alone (the decode tile).
TEST_F(LinearBf16MmaTest, BigTileLmHeadFewRows) {
  const Role head = make_lm_head(32, 153);
  for (int64_t rows : {16, 17}) {
    const double error = worst_error(reference(head, 0, rows), run_gpu(head, 0, rows));
    std::printf("lm_head, %ld rows: worst error %.3g\n", static_cast<long>(rows), error);
    EXPECT_LE(error, kTolerance) << rows << " rows";
  }
  check_prefill(head, 9, {0, 8});
  check_prefill(head, 16, {0, 15});
  check_prefill(head, 17, {0, 16});
  check_prefill(head, 32, {0, 31});
}

// The LM head at 64, 100 and 256 rows (the prefill kernels from 17 rows on; 32-token tile at 64,
// 64-token tile beyond): bits equal to the register kernel's, and rows equal the same rows
// alone (the decode tile, which DecodeTileV41FlashShapes checks against the CPU reference).
TEST_F(LinearBf16MmaTest, WideTileLmHead) {
  const Role head = make_lm_head(256, 151);
  check_prefill(head, 64, {0, 63});
  check_prefill(head, 100, {0, 99});
  check_prefill(head, 256, {0, 100, 255});
}

// Shapes the path does not take: linear_bf16_mma refuses them, ops::cuda::linear runs them on
// the FMA tile kernel (still within the reference's tolerance).
TEST_F(LinearBf16MmaTest, UnalignedShapesFallBack) {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{24, 256}, std::pair<int64_t, int64_t>{32, 48}}) {
    const Role r = make_role("unaligned", n, k, k, 0, 5, 71);
    EXPECT_THROW(run_gpu(r, 0, 5, 3), Error) << n << " x " << k;
    EXPECT_LE(worst_error(reference(r, 0, 5), run_gpu(r, 0, 5)), kTolerance) << n << " x " << k;
  }
}

// ---- batch invariance off: K over a cluster's blocks ----------------------------------------

// Batch invariance off, the decode tile's K cut over the blocks of a thread-block cluster as well
// (linear.cuh's decode_cluster_ranks): rows [0, rows) of r through the model's op within the
// reference's tolerance, and with the clusters switched off bit for bit the invariant launch.
// Returns whether the cluster form changed any bit (it adds in another order, so with random
// operands it does wherever it ran).
bool check_cluster_k(const Role& r, int64_t rows) {
  const std::string what = r.name + " [" + std::to_string(r.n) + " x " + std::to_string(r.k) +
                           "], " + std::to_string(rows) + " rows";
  const Tensor want = reference(r, 0, rows);
  const Tensor invariant = run_gpu(r, 0, rows);
  const ScopedBatchInvariance off(false);
  const Tensor clustered = run_gpu(r, 0, rows);
  const double error = worst_error(want, clustered);
  const bool changed = !same_bits(clustered, invariant);
  std::printf("%s, invariance off: worst error %.3g, %s\n", what.c_str(), error,
              changed ? "clusters ran" : "same bits as invariant");
  EXPECT_LE(error, kTolerance) << what << ", invariance off";
  const rt::ScopedSwitch no_clusters("DEEPINFER_DECODE_CLUSTER_K", false);
  EXPECT_TRUE(same_bits(run_gpu(r, 0, rows), invariant))
      << what << ": invariance off without clusters differs from the invariant launch";
  return changed;
}

// Programmatic dependent launch (DEEPINFER_DECODE_PDL) moves no arithmetic: the decode tile
// gives the same bits with it and without it (invariant and clustered launches).
TEST_F(LinearBf16MmaTest, DecodePdlSameBits) {
  const Role r = make_role("small", 48, 1536, 1536 + 32, 32, 24, 187);
  for (bool invariant : {true, false}) {
    const ScopedBatchInvariance mode(invariant);
    for (int64_t rows : {1, 13, 24}) {
      const Tensor dependent = run_gpu(r, 0, rows);
      Tensor ordered;
      {
        const rt::ScopedSwitch plain_order("DEEPINFER_DECODE_PDL", false);
        ordered = run_gpu(r, 0, rows);
      }
      EXPECT_TRUE(same_bits(dependent, ordered))
          << rows << " rows, invariance " << (invariant ? "on" : "off");
    }
  }
}

// Small shapes with the slice floor at one 32-chunk (quick under compute-sanitizer): 48 x 8192
// (8 slices a block, up to 8 ranks of 32 chunks), 48 x 1536 (6 ranks of one chunk: a stage half
// empty), over the 8-, 16- and 32-token tiles.
TEST_F(LinearBf16MmaTest, ClusterKSmallShapes) {
  const rt::ScopedSetting thin_slices("DEEPINFER_DECODE_CLUSTER_MIN_SLICE_BYTES", 64);
  for (auto [n, k] :
       {std::pair<int64_t, int64_t>{48, 8192}, std::pair<int64_t, int64_t>{48, 1536}}) {
    const Role r = make_role("small", n, k, k + 32, 32, 40, 181);
    for (int64_t rows : {1, 5, 13, 16, 24, 40}) {
      EXPECT_TRUE(check_cluster_k(r, rows)) << n << " x " << k << ", " << rows << " rows";
    }
  }
}

// The released BF16 decode shapes with the default ranks: the gate's 24 blocks and the
// compressor's 32 at one row are under a wave, so the clusters must run there.
TEST_F(LinearBf16MmaTest, ClusterKV41FlashShapes) {
  const Role gate = make_role("gate", 384, 5120, 5120, 0, 32, 191);
  const Role compressor = make_role("compressor wkv", 512, 5120, 5120, 0, 32, 193);
  const Role wo_a = make_role("wo_a group", 1024, 4096, 32768, 6 * 4096, 32, 197);
  EXPECT_TRUE(check_cluster_k(gate, 1));
  EXPECT_TRUE(check_cluster_k(compressor, 1));
  for (const Role* r : {&gate, &compressor, &wo_a}) {
    for (int64_t rows : {2, 8, 16, 32}) check_cluster_k(*r, rows);
  }
  // The 8 wo_a groups in one launch, against the CPU.
  const ScopedBatchInvariance off(false);
  for (int64_t rows : {1, 8, 16}) check_grouped(8, 1024, 4096, rows, 199, /*invariant=*/false);
}

}  // namespace
}  // namespace deepinfer::ops
