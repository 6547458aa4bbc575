// ops::cuda::sink_attention against the CPU reference (ops::sink_attention on host views) at the
// V4.1-Flash shapes the head-group kernel takes (64 heads x 512, a 128-row window, 512 selected
// compressed entries), with short and empty windows, tokens without compressed entries and
// partial key tiles; batch invariance bit for bit; both kernels (the per-head one through
// DEEPINFER_ATTENTION_HEAD_GROUPS=0) within the tolerance; bad indices reported as before.
// The batched form (sink_attention_batch: every request of a step, windows read from the
// requests' rings) against its CPU reference, bit-equal to its per-request path
// (DEEPINFER_ATTENTION_BATCHED=0) and batch invariant; write_window_rings bit-equal to the CPU.
// The split-KV path (DEEPINFER_ATTENTION_SPLIT=1 forces it, =0 the one-block head-group kernel)
// bit-equal to the one-block kernel on every head-group case, both within the tolerance, so the
// choice between them by token count keeps each token's bits.
// The head-group kernels run on the tensor cores by default; DEEPINFER_ATTENTION_MMA=0 takes the
// FMA kernels. Every head-group check runs both, each in its one-block and split forms (each pair
// the same bits), against the CPU within the same tolerance; the Mma* cases add key rows that are
// bf16-exact (the model's: the one-term key path) or a mix of exact and f32 blocks, the split
// path at decode shapes, and a token alone against the same token in a batch of 256.
// The prefill kernel (batch invariance off, at least DEEPINFER_ATTENTION_PREFILL_MIN_TOKENS tokens;
// the Prefill* cases force it at any count with the setting at 1) against the CPU at V4.1 shapes
// and small ones, single-matrix and batched, bad indices, whole tokens and split, with one bf16
// term a query and probability value (the default: kPrefillOneTermTolerance) and with exact
// products (kTolerance); key rows that are not bf16-exact give the one-block tensor-core kernel's
// bits (its fallback); batch invariance on keeps the old path's bits. Its split form (decode-sized
// calls, PrefillSplit*): V4.1 decode at batch 1, 16, 64 and 256, tokens with fewer keys than a
// chunk, -1 entries, tokens without compressed keys, multi-token requests, tokens whose keys are
// not bf16-exact (the old path's bits), chunk counts forced and by the heuristic; the decode
// threshold (DEEPINFER_ATTENTION_PREFILL_DECODE). The wgmma kernel (DEEPINFER_ATTENTION_WGMMA=1 at
// any token count; one term, whole tokens) in every check of the prefill kernel's one-term
// whole-token form, its bits other than the cluster kernel's, and alone at small shapes for the
// sanitizers (PrefillWgmmaSmallShapes). Every GPU output starts as NaN, so an element never
// written fails. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention_batch_case.h"
#include "core/error.h"
#include "gpu_support.h"
#include "ops/batch_invariance.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/runtime_switch.h"
#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

namespace rt = deepinfer::cuda;
using testing::same_bits;

// As backend_ops_test's sink_attention cases (kRowReductionTolerance): online softmax in tiles
// vs. max-first, expf and summation order: a few ulp of the output's scale.
constexpr double kTolerance = 1e-5;

// The prefill kernel's default numerics (DEEPINFER_ATTENTION_PREFILL_EXACT=0: FlashMLA's, one bf16
// term for each query and probability value; exact products, =1, keep kTolerance). One rounding to
// bf16 has a relative error |eta| <= 2^-8, RMS sigma = 2^-8 / sqrt(3) * 0.735 = 1.66e-3 (about
// 2^-9.2; 0.735 the RMS of 1 / m over a log-uniform significand m in [1, 2)). The probabilities'
// rounding dominates: y = sum_j p_j (1 + eta_j) v_j / D errs by sum_j p_j eta_j v_j / D, whose
// spread is sigma times the spread of y itself when y averages values of mean 0 (both scale as
// sqrt(sum_j p_j^2) / D * rms(v), whatever the key count: 576 keys average the error down by as
// much as the output). The queries' rounding moves a score by sigma * scale * |q o k| (2.8e-4 at
// these cases' score spread 0.17), so the output by that fraction of its own spread. The worst
// error over the output's largest magnitude (worst_error: two maxima over the same elements) is
// then about sigma, 1.7e-3; the bound is 2^-8 (3.9e-3, 2.3 sigma), the largest error of one
// rounding. A key left out of a 576-key token still fails it (about 1e-2 of the output's scale).
constexpr double kPrefillOneTermTolerance = 0x1p-8;

Tensor host_f32(Shape shape, uint32_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = uniform(rng);
  return t;
}

Tensor host_i32(Shape shape, const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty(DType::kI32, shape);
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// One call's inputs: per-token window ranges and selected compressed rows (-1 = none).
struct Case {
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int64_t selected = 0;  // compressed entries per token; 0: no compressed keys at all
  Tensor q, window, compressed, sink, range, index;
  float scale = 1.0f;
};

using attention_cases::KeyValues;

// Token i's window ends at window_length + i (a sliding window as in prefill); some tokens get
// a short or empty window, some no compressed entry at all, some a few -1 entries. `keys`: which
// key values are bf16-exact.
Case make_case(int64_t tokens, int64_t heads, int64_t head_dim, int64_t window_length,
               int64_t selected, int64_t compressed_rows, uint32_t seed,
               KeyValues keys = KeyValues::kF32) {
  Case c;
  c.tokens = tokens;
  c.heads = heads;
  c.head_dim = head_dim;
  c.selected = selected;
  c.q = host_f32({tokens, heads, head_dim}, seed);
  c.window = host_f32({window_length + tokens, head_dim}, seed + 1, 0.5f);
  c.compressed = host_f32({std::max<int64_t>(compressed_rows, 1), head_dim}, seed + 2, 0.5f);
  c.sink = host_f32({heads}, seed + 3, 2.0f);
  std::vector<int32_t> ranges, indices;
  std::mt19937 rng(seed + 4);
  for (int64_t t = 0; t < tokens; ++t) {
    const auto hi = static_cast<int32_t>(window_length + t);
    int32_t lo = static_cast<int32_t>(hi - window_length);
    if (t % 7 == 1) lo = hi;       // empty window
    if (t % 7 == 3) lo = hi - 5;   // short window
    if (t % 7 == 5) lo = hi - 33;  // one row past a key tile
    ranges.push_back(std::max(lo, 0));
    ranges.push_back(hi);
    for (int64_t k = 0; k < selected; ++k) {
      int32_t j = static_cast<int32_t>(rng() % static_cast<uint32_t>(compressed_rows));
      if (t % 7 == 2 || k % 9 == 8) j = -1;  // a token without compressed keys; a few holes
      indices.push_back(j);
    }
  }
  c.range = host_i32({tokens, 2}, ranges);
  c.index = host_i32({tokens, selected}, indices);
  c.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  attention_cases::round_keys_to_bf16(c.window, keys);
  attention_cases::round_keys_to_bf16(c.compressed, keys);
  return c;
}

TensorView no_index(int64_t tokens, Device device) {
  return TensorView::contiguous(nullptr, DType::kI32, {tokens, 0}, device);
}

Tensor reference(const Case& c) {
  Tensor want = Tensor::empty(DType::kF32, {c.tokens, c.heads, c.head_dim});
  sink_attention(c.q, c.window, c.range, c.compressed,
                 c.selected > 0 ? c.index.view() : no_index(c.tokens, Device::cpu()), c.sink,
                 c.scale, want);
  return want;
}

// The device copies of a case's inputs.
struct DeviceCase {
  Tensor q, window, compressed, sink, range, index;
  explicit DeviceCase(const Case& c)
      : q(rt::to_device(c.q.view())),
        window(rt::to_device(c.window.view())),
        compressed(rt::to_device(c.compressed.view())),
        sink(rt::to_device(c.sink.view())),
        range(rt::to_device(c.range.view())),
        index(c.selected > 0 ? rt::to_device(c.index.view()) : Tensor()) {}
};

// A run-time switch or setting overridden for a scope with the value the environment would
// give it ("0", "1"; nullptr: left as it is), restored however the scope ends.
class ScopedOverride {
 public:
  ScopedOverride(const char* name, const char* value) {
    if (value != nullptr) setting_.emplace(name, std::stoi(value));
  }

 private:
  std::optional<rt::ScopedSetting> setting_;
};

// Tokens [first, first + count) of the case on the GPU; `head_groups` false takes the per-head
// kernel; `split` "1" / "0" forces the split-KV path / the one-block kernel (nullptr: the op
// chooses); `mma` false takes the FMA head-group kernels. Waits and reports kernel errors
// (throws) before copying back.
Tensor run_gpu(const Case& c, const DeviceCase& d, int64_t first, int64_t count,
               bool head_groups = true, const char* split = nullptr, bool mma = true) {
  const ScopedOverride head_group_setting("DEEPINFER_ATTENTION_HEAD_GROUPS",
                                          head_groups ? nullptr : "0");
  const ScopedOverride split_setting("DEEPINFER_ATTENTION_SPLIT", split);
  const ScopedOverride mma_setting("DEEPINFER_ATTENTION_MMA", mma ? nullptr : "0");
  Tensor out = Tensor::empty(DType::kF32, {count, c.heads, c.head_dim}, rt::device_allocator());
  rt::fill_bytes(out.view(), 0xFF);
  const TensorView index =
      c.selected > 0 ? d.index.view().narrow(0, first, count) : no_index(count, Device::cuda(0));
  cuda::sink_attention(d.q.view().narrow(0, first, count), d.window,
                       d.range.view().narrow(0, first, count), d.compressed, index, d.sink, c.scale,
                       out);
  rt::synchronize();
  return rt::to_host(out.view());
}

// Worst |got - want| over max |want|; a NaN in got (never written) is infinite.
double worst_error(const Tensor& want, const Tensor& got, int64_t got_first_row = 0) {
  const int64_t row = want.numel() / want.view().size(0);
  const float* g = got.data<float>() + got_first_row * row;
  double scale = 1e-30;
  for (int64_t i = 0; i < want.numel(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(want.data<float>()[i])));
  }
  double worst = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    worst = std::max(worst, std::abs(static_cast<double>(g[i]) - want.data<float>()[i]) / scale);
  }
  return worst;
}

bool equal_rows(const Tensor& a, int64_t a_row, const Tensor& b, int64_t b_row) {
  const int64_t row = a.numel() / a.view().size(0);
  return std::memcmp(a.data<float>() + a_row * row, b.data<float>() + b_row * row,
                     static_cast<size_t>(row) * sizeof(float)) == 0;
}

class AttentionGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { DEEPINFER_SKIP_WITHOUT_GPU(); }
};

// Each kernel against the reference: the one-block head-group kernel and its split-KV path (the
// same bits), on the tensor cores and with FMAs, and the per-head kernel.
void check_against_reference(const Case& c, const std::string& what) {
  const Tensor want = reference(c);
  const DeviceCase d(c);
  const Tensor one_block = run_gpu(c, d, 0, c.tokens, true, "0");
  const Tensor split = run_gpu(c, d, 0, c.tokens, true, "1");
  const Tensor fma_one_block = run_gpu(c, d, 0, c.tokens, true, "0", false);
  const Tensor fma_split = run_gpu(c, d, 0, c.tokens, true, "1", false);
  const Tensor per_head = run_gpu(c, d, 0, c.tokens, false);
  for (const auto& [got, kernel] :
       {std::pair{&one_block, "tensor-core head-group"}, std::pair{&split, "tensor-core split-KV"},
        std::pair{&fma_one_block, "FMA head-group"}, std::pair{&fma_split, "FMA split-KV"},
        std::pair{&per_head, "per-head"}}) {
    const double error = worst_error(want, *got);
    std::printf("%s, %s kernel: worst error %.3g of the output's scale\n", what.c_str(), kernel,
                error);
    EXPECT_LE(error, kTolerance) << what << ", " << kernel;
  }
  EXPECT_TRUE(same_bits(one_block, split))
      << what << ": tensor-core split-KV and one-block bits differ";
  EXPECT_TRUE(same_bits(fma_one_block, fma_split))
      << what << ": FMA split-KV and one-block bits differ";
}

// Decode at V4.1-Flash: 64 heads x 512, window 128, 512 selected of 2048 compressed rows.
TEST_F(AttentionGpuTest, RealShapesDecode) {
  check_against_reference(make_case(9, 64, 512, 128, 512, 2048, 11), "v41 decode 9 tokens");
  check_against_reference(make_case(3, 64, 512, 128, 0, 0, 21), "v41 window only");
}

// Prefill: many tokens, each its own sliding window over shared rows.
TEST_F(AttentionGpuTest, RealShapesPrefill) {
  check_against_reference(make_case(150, 64, 512, 128, 64, 300, 31), "v41 prefill 150 tokens");
}

// A token's output does not depend on the call: the same bits alone, in a 37-token call and in
// a 5-token call.
TEST_F(AttentionGpuTest, TokensDoNotDependOnTheBatch) {
  const Case c = make_case(37, 64, 512, 128, 512, 2048, 41);
  const DeviceCase d(c);
  const Tensor all = run_gpu(c, d, 0, 37);
  const Tensor want = reference(c);
  EXPECT_LE(worst_error(want, all), kTolerance);
  for (int64_t t : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{5}, int64_t{19}, int64_t{36}}) {
    const Tensor alone = run_gpu(c, d, t, 1);
    EXPECT_TRUE(equal_rows(all, t, alone, 0)) << "token " << t << " differs when alone";
  }
  const Tensor five = run_gpu(c, d, 30, 5);
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(equal_rows(all, 30 + i, five, i)) << "token " << 30 + i << " in a 5-token call";
  }
}

// Small shapes for the sanitizers: one and two head groups, partial key tiles (window 3..40,
// 40 selected), a 24-head shape the per-head kernel takes; for the split path: 2 and 3 chunks
// with a partial last one, and a token without any key (empty window, no compressed entries).
TEST_F(AttentionGpuTest, SmallShapes) {
  check_against_reference(make_case(3, 16, 512, 40, 40, 50, 51), "16 heads, 3 tokens");
  check_against_reference(make_case(2, 32, 512, 3, 7, 9, 61), "32 heads, 2 tokens");
  check_against_reference(make_case(2, 24, 512, 20, 5, 9, 71), "24 heads (per-head kernel)");
  check_against_reference(make_case(4, 16, 512, 100, 70, 80, 72), "16 heads, 3 chunks");
  check_against_reference(make_case(3, 16, 512, 40, 0, 0, 73), "16 heads, a token without keys");
}

// The tensor-core kernels' key paths at small shapes (for the sanitizers): bf16-exact key rows
// (one term) and a mix of exact and f32 operand blocks in one tile (both paths, warp by warp).
TEST_F(AttentionGpuTest, MmaSmallShapes) {
  for (const auto& [keys, name] :
       {std::pair{KeyValues::kBf16, "bf16 keys"}, std::pair{KeyValues::kMixed, "mixed keys"}}) {
    const std::string what = std::string(name) + ", ";
    check_against_reference(make_case(3, 16, 512, 40, 40, 50, 151, keys), what + "3 tokens");
    check_against_reference(make_case(4, 16, 512, 100, 70, 80, 152, keys), what + "3 chunks");
    check_against_reference(make_case(2, 32, 512, 3, 7, 9, 153, keys), what + "32 heads");
  }
}

// V4.1-Flash shapes with the model's kind of key rows (bf16-exact) and the mix, decode and
// prefill, against the CPU.
TEST_F(AttentionGpuTest, MmaRealShapesBf16Keys) {
  for (const auto& [keys, name] :
       {std::pair{KeyValues::kBf16, "bf16 keys"}, std::pair{KeyValues::kMixed, "mixed keys"}}) {
    const std::string what = std::string("v41 ") + name + ", ";
    check_against_reference(make_case(9, 64, 512, 128, 512, 2048, 161, keys), what + "decode");
    check_against_reference(make_case(150, 64, 512, 128, 64, 300, 162, keys), what + "prefill");
  }
}

// A compressed index past the table is recorded (synchronize throws) and skipped: the output is
// the reference's with that entry dropped. A bad window range is recorded too and its token's
// output is NaN, the other tokens' as before.
TEST_F(AttentionGpuTest, BadIndicesAreReported) {
  for (const char* split : {"0", "1", "0 fma", "1 fma", "per-head"}) {
    const bool head_groups = std::string(split) != "per-head";
    const bool fma = std::string(split).ends_with("fma");
    const ScopedOverride split_setting("DEEPINFER_ATTENTION_SPLIT",
                                       head_groups ? (split[0] == '1' ? "1" : "0") : nullptr);
    const ScopedOverride mma_setting("DEEPINFER_ATTENTION_MMA", fma ? "0" : nullptr);
    Case c = make_case(3, 16, 512, 40, 40, 50, 81);
    Case bad = make_case(3, 16, 512, 40, 40, 50, 81);
    bad.index.data<int32_t>()[1 * 40 + 6] = 50;  // token 1, entry 6: one past the table
    c.index.data<int32_t>()[1 * 40 + 6] = -1;
    const DeviceCase d(bad);
    Tensor out = Tensor::empty(DType::kF32, {3, 16, 512}, rt::device_allocator());
    {
      const ScopedOverride head_group_setting("DEEPINFER_ATTENTION_HEAD_GROUPS",
                                              head_groups ? nullptr : "0");
      cuda::sink_attention(d.q, d.window, d.range, d.compressed, d.index, d.sink, c.scale, out);
    }
    EXPECT_THROW(rt::synchronize(), Error);
    EXPECT_LE(worst_error(reference(c), rt::to_host(out.view())), kTolerance);
    rt::synchronize();  // reported once and cleared

    Case bad_range = make_case(3, 16, 512, 40, 40, 50, 91);
    bad_range.range.data<int32_t>()[2 * 2 + 1] = 1000;  // token 2 ends past the window rows
    const DeviceCase dr(bad_range);
    Tensor out2 = Tensor::empty(DType::kF32, {3, 16, 512}, rt::device_allocator());
    {
      const ScopedOverride head_group_setting("DEEPINFER_ATTENTION_HEAD_GROUPS",
                                              head_groups ? nullptr : "0");
      cuda::sink_attention(dr.q, dr.window, dr.range, dr.compressed, dr.index, dr.sink,
                           bad_range.scale, out2);
    }
    EXPECT_THROW(rt::synchronize(), Error);
    const Tensor got = rt::to_host(out2.view());
    const int64_t row = 16 * 512;
    for (int64_t i = 2 * row; i < 3 * row; ++i) {
      ASSERT_TRUE(std::isnan(got.data<float>()[i])) << "element " << i << " of the bad token";
    }
    Case first_two = make_case(3, 16, 512, 40, 40, 50, 91);
    const Tensor want = reference(first_two);
    for (int64_t i = 0; i < 2 * row; ++i) {
      ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5) << "element " << i;
    }
  }
}

// ---- the prefill kernel (batch invariance off) --------------------------------------------------

// The op with batch invariance `invariant` and DEEPINFER_ATTENTION_PREFILL_MIN_TOKENS `min_tokens`
// (nullptr: its default, 256; "1": every call) and the kernel's DEEPINFER_ATTENTION_PREFILL_EXACT
// `exact` (nullptr: the default).
// `chunks`: DEEPINFER_ATTENTION_PREFILL_CHUNKS (nullptr: by the op's heuristic; "1" whole tokens).
// `wgmma`: DEEPINFER_ATTENTION_WGMMA ("1": whole-token calls of any size take the wgmma kernel,
// "0": never; nullptr: its default).
Tensor run_gpu_policy(const Case& c, const DeviceCase& d, bool invariant, const char* min_tokens,
                      const char* exact = nullptr, const char* chunks = nullptr,
                      const char* wgmma = nullptr) {
  const ScopedBatchInvariance invariance(invariant);
  const ScopedOverride threshold("DEEPINFER_ATTENTION_PREFILL_MIN_TOKENS", min_tokens);
  const ScopedOverride exact_setting("DEEPINFER_ATTENTION_PREFILL_EXACT", exact);
  const ScopedOverride chunk_setting("DEEPINFER_ATTENTION_PREFILL_CHUNKS", chunks);
  const ScopedOverride wgmma_setting("DEEPINFER_ATTENTION_WGMMA", wgmma);
  return run_gpu(c, d, 0, c.tokens);
}

// DEEPINFER_ATTENTION_PREFILL_EXACT: one bf16 term (the default), three (exact products).
constexpr const char* kExact[] = {"0", "1"};

// The prefill kernel's forms a check runs: one term and exact products, each whole-token and split
// into 3 chunks of a token; the wgmma kernel (one term, whole tokens: form kWgmmaForm, the
// cluster kernel's same form kClusterForm).
struct PrefillForm {
  const char* exact;
  const char* chunks;
  const char* wgmma;
};
constexpr PrefillForm kPrefillForms[] = {
    {"0", "1", "0"}, {"0", "1", "1"}, {"1", "1", "0"}, {"0", "3", "0"}, {"1", "3", "0"}};
constexpr size_t kClusterForm = 0;
constexpr size_t kWgmmaForm = 1;

// The prefill kernel's tolerance against the CPU: `exact` "1" (nullptr: the default, one term).
double prefill_tolerance(const char* exact) {
  return exact != nullptr && std::string(exact) == "1" ? kTolerance : kPrefillOneTermTolerance;
}

// The prefill kernel against the CPU. `new_bits`: every token's keys are bf16-exact, so the kernel
// computes them itself (another summation order than the old kernel: some bit differs); false: the
// keys are f32, so every token with a key falls back to the one-block tensor-core kernel (its
// bits).
void check_prefill(const Case& c, const std::string& what, std::optional<bool> new_bits,
                   const char* min_tokens = "1") {
  const Tensor want = reference(c);
  const DeviceCase d(c);
  const Tensor old_path = run_gpu(c, d, 0, c.tokens, true, "0");
  std::vector<Tensor> outputs;
  for (const PrefillForm& form : kPrefillForms) {
    const char* exact = form.exact;
    outputs.push_back(run_gpu_policy(c, d, false, min_tokens, exact, form.chunks, form.wgmma));
    const Tensor& got = outputs.back();
    const double error = worst_error(want, got);
    const std::string kernel =
        std::string("exact ") + exact + ", chunks " + form.chunks + ", wgmma " + form.wgmma;
    std::printf(
        "%s, prefill kernel %s: worst error %.3g of the output's scale (one-block kernel "
        "%.3g; tolerance %.3g)\n",
        what.c_str(), kernel.c_str(), error, worst_error(want, old_path), prefill_tolerance(exact));
    EXPECT_LE(error, prefill_tolerance(exact)) << what << ", " << kernel;
    if (new_bits.has_value()) {
      EXPECT_EQ(!same_bits(got, old_path), *new_bits)
          << what << ", " << kernel
          << (*new_bits ? ": the prefill kernel did not run" : ": fallback bits differ");
    }
  }
  if (new_bits.value_or(false)) {
    EXPECT_FALSE(same_bits(outputs[kWgmmaForm], outputs[kClusterForm]))
        << what << ": the wgmma kernel did not run";
  }
}

// V4.1-Flash prefill: 64 heads x 512, window 128 (some tokens' short, empty or one row past a
// tile), 512 selected of 2048 (holes, tokens without any), bf16-exact keys as the model's: at the
// default threshold (256 tokens) and forced; fewer than 512 selected (100, 33: partial tiles).
TEST_F(AttentionGpuTest, PrefillRealShapes) {
  const Case c = make_case(256, 64, 512, 128, 512, 2048, 201, KeyValues::kBf16);
  check_prefill(c, "v41 prefill 256 tokens, bf16 keys, default threshold", true, nullptr);
  check_prefill(make_case(64, 64, 512, 128, 100, 300, 202, KeyValues::kBf16),
                "v41 prefill 64 tokens, 100 selected, bf16 keys", true);
  check_prefill(make_case(40, 64, 512, 128, 33, 50, 203, KeyValues::kBf16),
                "v41 prefill 40 tokens, 33 selected, bf16 keys", true);
  // Below the default threshold the op takes the prefill kernel (other bits than the head-group
  // kernels': the split form below DEEPINFER_ATTENTION_WGMMA tokens, the wgmma kernel from there)
  // from DEEPINFER_ATTENTION_PREFILL_DECODE tokens, or with DEEPINFER_ATTENTION_PREFILL_DECODE=0
  // the head-group kernels.
  const Case small = make_case(40, 64, 512, 128, 33, 50, 203, KeyValues::kBf16);
  const DeviceCase ds(small);
  const Tensor old_path = run_gpu(small, ds, 0, 40);
  Tensor split;
  {
    const ScopedOverride decode("DEEPINFER_ATTENTION_PREFILL_DECODE", "1");
    split = run_gpu_policy(small, ds, false, nullptr);
  }
  EXPECT_FALSE(same_bits(split, old_path)) << "the split form did not run";
  EXPECT_LE(worst_error(reference(small), split), kPrefillOneTermTolerance);
  const ScopedOverride decode("DEEPINFER_ATTENTION_PREFILL_DECODE", "0");
  EXPECT_TRUE(same_bits(run_gpu_policy(small, ds, false, nullptr), old_path));
}

// Key rows that are not bf16-exact: every token falls back to the one-block tensor-core kernel
// (f32 keys: the same bits); a mix of exact and f32 blocks (each token's own choice) within the
// tolerance.
TEST_F(AttentionGpuTest, PrefillFallback) {
  check_prefill(make_case(40, 64, 512, 128, 64, 300, 211), "v41 prefill 40 tokens, f32 keys",
                false);
  check_prefill(make_case(40, 64, 512, 128, 64, 300, 212, KeyValues::kMixed),
                "v41 prefill 40 tokens, mixed keys", std::nullopt);
}

// Small shapes (for the sanitizers): few keys, partial tiles, a token without any key, 2 tiles.
TEST_F(AttentionGpuTest, PrefillSmallShapes) {
  check_prefill(make_case(3, 64, 512, 40, 40, 50, 221, KeyValues::kBf16), "64 heads, 3 tokens",
                true);
  check_prefill(make_case(2, 64, 512, 3, 7, 9, 222, KeyValues::kBf16), "64 heads, 10 keys", true);
  check_prefill(make_case(3, 64, 512, 40, 0, 0, 223, KeyValues::kBf16),
                "64 heads, a token without keys", std::nullopt);
  check_prefill(make_case(2, 64, 512, 3, 7, 9, 224), "64 heads, f32 keys", false);
}

// Batch invariance on: the prefill kernel never runs, whatever the threshold (the old bits);
// invariance off with the threshold at 0: the old bits too.
TEST_F(AttentionGpuTest, PrefillOffKeepsTheOldBits) {
  const Case c = make_case(256, 64, 512, 128, 64, 300, 231, KeyValues::kBf16);
  const DeviceCase d(c);
  const Tensor old_path = run_gpu(c, d, 0, c.tokens);
  EXPECT_TRUE(same_bits(old_path, run_gpu_policy(c, d, true, "1")));
  EXPECT_TRUE(same_bits(old_path, run_gpu_policy(c, d, true, nullptr)));
  EXPECT_TRUE(same_bits(old_path, run_gpu_policy(c, d, false, "0")));
  EXPECT_FALSE(same_bits(old_path, run_gpu_policy(c, d, false, nullptr)));
}

// A compressed index past the table is recorded and skipped; a bad window range is recorded and
// its token's output is NaN (the other tokens' as before).
// `chunks`: DEEPINFER_ATTENTION_PREFILL_CHUNKS ("1": the whole-token kernel, "2": its split form).
// `wgmma`: DEEPINFER_ATTENTION_WGMMA ("1": the wgmma kernel for whole tokens, "0": never).
void check_prefill_bad_indices(const char* exact, const char* chunks, const char* wgmma) {
  const ScopedBatchInvariance invariance(false);
  const ScopedOverride threshold("DEEPINFER_ATTENTION_PREFILL_MIN_TOKENS", "1");
  const ScopedOverride exact_setting("DEEPINFER_ATTENTION_PREFILL_EXACT", exact);
  const ScopedOverride chunk_setting("DEEPINFER_ATTENTION_PREFILL_CHUNKS", chunks);
  const ScopedOverride wgmma_setting("DEEPINFER_ATTENTION_WGMMA", wgmma);
  const double tolerance = prefill_tolerance(exact);
  Case c = make_case(3, 64, 512, 40, 40, 50, 241, KeyValues::kBf16);
  Case bad = make_case(3, 64, 512, 40, 40, 50, 241, KeyValues::kBf16);
  bad.index.data<int32_t>()[1 * 40 + 6] = 50;
  c.index.data<int32_t>()[1 * 40 + 6] = -1;
  const DeviceCase d(bad);
  Tensor out = Tensor::empty(DType::kF32, {3, 64, 512}, rt::device_allocator());
  cuda::sink_attention(d.q, d.window, d.range, d.compressed, d.index, d.sink, c.scale, out);
  EXPECT_THROW(rt::synchronize(), Error);
  EXPECT_LE(worst_error(reference(c), rt::to_host(out.view())), tolerance);
  rt::synchronize();

  Case bad_range = make_case(3, 64, 512, 40, 40, 50, 242, KeyValues::kBf16);
  bad_range.range.data<int32_t>()[2 * 2 + 1] = 1000;
  const DeviceCase dr(bad_range);
  Tensor out2 = Tensor::empty(DType::kF32, {3, 64, 512}, rt::device_allocator());
  cuda::sink_attention(dr.q, dr.window, dr.range, dr.compressed, dr.index, dr.sink, bad_range.scale,
                       out2);
  EXPECT_THROW(rt::synchronize(), Error);
  const Tensor got = rt::to_host(out2.view());
  const int64_t row = 64 * 512;
  for (int64_t i = 2 * row; i < 3 * row; ++i) {
    ASSERT_TRUE(std::isnan(got.data<float>()[i])) << "element " << i << " of the bad token";
  }
  const Tensor want = reference(make_case(3, 64, 512, 40, 40, 50, 242, KeyValues::kBf16));
  // The other tokens within the tolerance of their own outputs' scale.
  double scale = 1e-30;
  for (int64_t i = 0; i < 2 * row; ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(want.data<float>()[i])));
  }
  for (int64_t i = 0; i < 2 * row; ++i) {
    ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], tolerance * scale) << "element " << i;
  }
}

TEST_F(AttentionGpuTest, PrefillBadIndicesAreReported) {
  for (const char* exact : kExact) {
    for (const char* chunks : {"1", "2"}) check_prefill_bad_indices(exact, chunks, "0");
  }
  check_prefill_bad_indices("0", "1", "1");
}

// ---- the batched form -------------------------------------------------------------------------

using attention_cases::AttentionBatch;
using attention_cases::BatchTensors;

BatchTensors device_tensors(const AttentionBatch& b) {
  return attention_cases::copy_tensors(b.host,
                                       [](const TensorView& v) { return rt::to_device(v); });
}

// One switch set for the duration of a call.
struct Setting {
  const char* name = nullptr;
  const char* value = nullptr;
};

// The batch on the GPU (fresh device copies); waits and reports kernel errors (throws) before
// copying back.
Tensor run_gpu_batch(const AttentionBatch& b, std::vector<Setting> settings = {}) {
  const BatchTensors d = device_tensors(b);
  Tensor out = Tensor::empty(DType::kF32, {b.tokens, b.heads, b.head_dim}, rt::device_allocator());
  rt::fill_bytes(out.view(), 0xFF);
  {
    std::deque<ScopedOverride> overrides;
    for (const Setting& setting : settings) overrides.emplace_back(setting.name, setting.value);
    cuda::sink_attention_batch(d.q, d.new_kv, attention_cases::request_views(b, d), b.window,
                               d.sink, b.scale, out);
  }
  rt::synchronize();
  return rt::to_host(out.view());
}

Tensor cpu_batch(const AttentionBatch& b) {
  Tensor out = Tensor::empty(DType::kF32, {b.tokens, b.heads, b.head_dim});
  sink_attention_batch(b.host.q, b.host.new_kv, attention_cases::request_views(b, b.host), b.window,
                       b.host.sink, b.scale, out);
  return out;
}

// V4.1-Flash: 64 heads x 512, window 128, 512 selected; rows not in request order: a decode
// token whose window wraps its ring, a first chunk, a 45-token chunk whose early queries read
// a wrapping ring, a decode token with a short history (4 compressed rows, repeated), a
// 3-token chunk at position 1000.
AttentionBatch real_batch() {
  return attention_cases::make_batch({{300, 1, 130, 512},
                                      {0, 40, 130, 0},
                                      {200, 45, 128, 512},
                                      {5, 1, 128, 512},
                                      {1000, 3, 136, 512}},
                                     {3, 1, 0, 4, 2}, 64, 512, 128, 101);
}

// Small shapes for the sanitizers: one head group with partial key tiles, and 24 heads (the
// per-head kernel).
AttentionBatch small_batch(int64_t heads) {
  return attention_cases::make_batch({{50, 3, 40, 40}, {0, 2, 40, 0}, {45, 1, 41, 7}}, {1, 0, 2},
                                     heads, 512, 40, 111);
}

// The one-block head-group kernel and its split-KV path, on the tensor cores and with FMAs, and
// the per-head kernel against the CPU; each split path bit-equal to its one-block kernel, and the
// op's own choice equal to the tensor-core pair.
void check_batch_against_cpu(const AttentionBatch& b, const std::string& what) {
  const Tensor want = cpu_batch(b);
  const Tensor one_block = run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "0"}});
  const Tensor split = run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "1"}});
  const Tensor fma_one_block =
      run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "0"}, {"DEEPINFER_ATTENTION_MMA", "0"}});
  const Tensor fma_split =
      run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "1"}, {"DEEPINFER_ATTENTION_MMA", "0"}});
  const Tensor per_head = run_gpu_batch(b, {{"DEEPINFER_ATTENTION_HEAD_GROUPS", "0"}});
  for (const auto& [got, kernel] :
       {std::pair{&one_block, "tensor-core head-group"}, std::pair{&split, "tensor-core split-KV"},
        std::pair{&fma_one_block, "FMA head-group"}, std::pair{&fma_split, "FMA split-KV"},
        std::pair{&per_head, "per-head"}}) {
    const double error = worst_error(want, *got);
    std::printf("batched %s, %s kernel: worst error %.3g of the output's scale\n", what.c_str(),
                kernel, error);
    EXPECT_LE(error, kTolerance) << what << ", " << kernel;
  }
  EXPECT_TRUE(same_bits(one_block, split))
      << what << ": tensor-core split-KV and one-block bits differ";
  EXPECT_TRUE(same_bits(fma_one_block, fma_split))
      << what << ": FMA split-KV and one-block bits differ";
  EXPECT_TRUE(same_bits(one_block, run_gpu_batch(b))) << what << ": the op's choice differs";
}

// The batched form on the prefill kernel: V4.1 requests (rings wrapping, chunks reading this
// call's rows) against the CPU with bf16-exact keys; f32 keys fall back to the one-block kernel's
// bits; invariance on keeps the old bits.
// `wgmma`: DEEPINFER_ATTENTION_WGMMA ("1": the wgmma kernel, "0": the cluster kernel).
void check_prefill_batch(const char* exact_products, const char* wgmma) {
  AttentionBatch exact = real_batch();
  attention_cases::round_batch_keys(exact, KeyValues::kBf16);
  const std::vector<Setting> prefill = {{"DEEPINFER_ATTENTION_PREFILL_MIN_TOKENS", "1"},
                                        {"DEEPINFER_ATTENTION_PREFILL_EXACT", exact_products},
                                        {"DEEPINFER_ATTENTION_WGMMA", wgmma}};
  Tensor got, old_path;
  {
    const ScopedBatchInvariance invariance(false);
    got = run_gpu_batch(exact, prefill);
  }
  old_path = run_gpu_batch(exact, {{"DEEPINFER_ATTENTION_SPLIT", "0"}});
  const Tensor want = cpu_batch(exact);
  const double error = worst_error(want, got);
  std::printf(
      "batched v41 5 requests, bf16 keys, prefill kernel exact %s, wgmma %s: worst error %.3g "
      "(one-block kernel %.3g; tolerance %.3g)\n",
      exact_products, wgmma, error, worst_error(want, old_path), prefill_tolerance(exact_products));
  EXPECT_LE(error, prefill_tolerance(exact_products));
  EXPECT_FALSE(same_bits(got, old_path)) << "the prefill kernel did not run";
  EXPECT_TRUE(same_bits(old_path, run_gpu_batch(exact, prefill))) << "invariance on";

  const AttentionBatch f32 = real_batch();
  Tensor fallback;
  {
    const ScopedBatchInvariance invariance(false);
    fallback = run_gpu_batch(f32, prefill);
  }
  EXPECT_TRUE(same_bits(fallback, run_gpu_batch(f32, {{"DEEPINFER_ATTENTION_SPLIT", "0"}})))
      << "f32 keys: the fallback's bits";
}

TEST_F(AttentionGpuTest, PrefillBatchMatchesTheCpu) {
  for (const char* exact : kExact) check_prefill_batch(exact, "0");
  check_prefill_batch("0", "1");
}

TEST_F(AttentionGpuTest, BatchMatchesTheCpu) {
  check_batch_against_cpu(real_batch(), "v41 5 requests");
}

// Named for the sanitizer runs' filter (scripts/cuda/run_device_tests.sh: *SmallShapes*).
TEST_F(AttentionGpuTest, BatchSmallShapes) {
  check_batch_against_cpu(small_batch(16), "16 heads, 3 requests");
  check_batch_against_cpu(small_batch(24), "24 heads, 3 requests");
  AttentionBatch exact = small_batch(16);
  attention_cases::round_batch_keys(exact, KeyValues::kBf16);
  check_batch_against_cpu(exact, "16 heads, 3 requests, bf16 keys");
}

// Decode batches of 1, 16 and 64 one-token requests at V4.1-Flash shapes (64 heads x 512,
// window 128, 512 selected): the tensor-core split path bit-equal to its one-block kernel, both
// within the tolerance of the CPU, with f32 and with bf16-exact key rows.
AttentionBatch decode_batch(int64_t batch, KeyValues keys, uint32_t seed) {
  std::vector<attention_cases::RequestSpec> specs;
  std::vector<int> row_order;
  for (int64_t r = 0; r < batch; ++r) {
    specs.push_back({1000 + 3 * r, 1, 136, 512});  // rings wrapping at different slots
    row_order.push_back(static_cast<int>((r * 7) % batch));
  }
  if (batch % 7 == 0) std::iota(row_order.begin(), row_order.end(), 0);
  AttentionBatch b = attention_cases::make_batch(specs, row_order, 64, 512, 128, seed);
  attention_cases::round_batch_keys(b, keys);
  return b;
}

TEST_F(AttentionGpuTest, MmaSplitEqualsOneBlockDecode) {
  for (const int64_t batch : {int64_t{1}, int64_t{16}, int64_t{64}}) {
    for (const auto& [keys, name] :
         {std::pair{KeyValues::kF32, "f32 keys"}, std::pair{KeyValues::kBf16, "bf16 keys"}}) {
      const AttentionBatch b = decode_batch(batch, keys, 171 + static_cast<uint32_t>(batch));
      const std::string what = "v41 decode b" + std::to_string(batch) + ", " + name;
      const Tensor want = cpu_batch(b);
      const Tensor one_block = run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "0"}});
      const Tensor split = run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "1"}});
      for (const auto& [got, kernel] : {std::pair{&one_block, "tensor-core head-group"},
                                        std::pair{&split, "tensor-core split-KV"}}) {
        const double error = worst_error(want, *got);
        std::printf("%s, %s kernel: worst error %.3g of the output's scale\n", what.c_str(), kernel,
                    error);
        EXPECT_LE(error, kTolerance) << what << ", " << kernel;
      }
      EXPECT_TRUE(same_bits(one_block, split)) << what << ": split-KV and one-block bits differ";
    }
  }
}

// A token alone (the op takes the split path) gives the bits it has in a batch of 256 one-token
// requests (the one-block kernel: 1024 head-group blocks), on the tensor cores, with f32 and with
// bf16-exact key rows; the lone tokens also against the CPU.
TEST_F(AttentionGpuTest, MmaTokenAloneEqualsBatchOf256) {
  for (const auto& [keys, name] :
       {std::pair{KeyValues::kF32, "f32 keys"}, std::pair{KeyValues::kBf16, "bf16 keys"}}) {
    const AttentionBatch b = decode_batch(256, keys, 181);
    const Tensor all = run_gpu_batch(b);
    for (const size_t r : {size_t{0}, size_t{1}, size_t{100}, size_t{201}, size_t{255}}) {
      const AttentionBatch one = attention_cases::only_request(b, r);
      const Tensor alone = run_gpu_batch(one);
      EXPECT_TRUE(equal_rows(all, b.offsets[r], alone, 0))
          << name << ": request " << r << " alone differs from the batch of 256";
      EXPECT_LE(worst_error(cpu_batch(one), alone), kTolerance) << name << ": request " << r;
    }
  }
}

// The same keys in the same order as the per-request path (gathered rows, single-matrix form):
// the same bits; and a request's tokens alone give the same bits as in the full call.
TEST_F(AttentionGpuTest, BatchEqualsThePerRequestPathAndIsBatchInvariant) {
  const AttentionBatch b = real_batch();
  const Tensor all = run_gpu_batch(b);
  EXPECT_TRUE(same_bits(all, run_gpu_batch(b, {{"DEEPINFER_ATTENTION_BATCHED", "0"}})))
      << "batched path differs from the per-request path";
  for (size_t r = 0; r < b.specs.size(); ++r) {
    const Tensor alone = run_gpu_batch(attention_cases::only_request(b, r));
    for (int64_t i = 0; i < b.specs[r].count; ++i) {
      EXPECT_TRUE(equal_rows(all, b.offsets[r] + i, alone, i))
          << "request " << r << " token " << i << " differs when alone";
    }
  }
}

// V4.1-Flash calls for the split path: one-token requests (decode) with 0, 1, 512, 1000 and
// 1024 selected entries, key counts that are not a multiple of the 64-key chunk (windows of 6,
// 71, 128 and 130 rows), and multi-token requests whose early queries read a wrapping ring and
// whose later ones read this call's new rows; -1 entries throughout (make_batch).
TEST_F(AttentionGpuTest, SplitEqualsOneBlockRealShapes) {
  check_batch_against_cpu(attention_cases::make_batch({{300, 1, 130, 512},
                                                       {5, 1, 128, 512},
                                                       {70, 1, 128, 1000},
                                                       {4000, 1, 136, 1024},
                                                       {900, 1, 136, 0},
                                                       {129, 1, 128, 1}},
                                                      {4, 0, 5, 1, 3, 2}, 64, 512, 128, 121),
                          "v41 decode, 6 requests");
  check_batch_against_cpu(
      attention_cases::make_batch({{200, 45, 128, 512}, {1000, 3, 136, 1024}, {0, 7, 8, 100}},
                                  {2, 0, 1}, 64, 512, 128, 131),
      "v41 chunks, 3 requests");
}

// The op takes the split path for calls with few tokens and the one-block kernel for calls with
// many: a token's bits are the same either way. 80 one-token requests (320 head-group blocks:
// the one-block kernel on an H200's 132 SMs) against a few of them alone (the split path).
TEST_F(AttentionGpuTest, SplitChoiceKeepsTokensBatchInvariant) {
  std::vector<attention_cases::RequestSpec> specs;
  std::vector<int> row_order;
  for (int r = 0; r < 80; ++r) {
    specs.push_back({100 + 53 * r, 1, 136, 512});
    row_order.push_back((r * 37) % 80);
  }
  const AttentionBatch b = attention_cases::make_batch(specs, row_order, 64, 512, 128, 141);
  const Tensor all = run_gpu_batch(b);
  EXPECT_TRUE(same_bits(all, run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "0"}})));
  EXPECT_TRUE(same_bits(all, run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "1"}})));
  for (size_t r : {size_t{0}, size_t{1}, size_t{41}, size_t{79}}) {
    const Tensor alone = run_gpu_batch(attention_cases::only_request(b, r));
    EXPECT_TRUE(equal_rows(all, b.offsets[r], alone, 0)) << "request " << r << " alone differs";
  }
}

TEST_F(AttentionGpuTest, WriteWindowRingsSmallShapes) {
  for (const char* batched : {"1", "0"}) {
    AttentionBatch b = small_batch(16);
    const BatchTensors d = device_tensors(b);
    {
      const ScopedOverride batched_setting("DEEPINFER_ATTENTION_BATCHED", batched);
      cuda::write_window_rings(d.new_kv, attention_cases::request_views(b, d));
    }
    rt::synchronize();
    write_window_rings(b.host.new_kv, attention_cases::request_views(b, b.host));
    for (size_t r = 0; r < b.specs.size(); ++r) {
      EXPECT_TRUE(same_bits(b.host.rings[r], rt::to_host(d.rings[r].view())))
          << "ring " << r << " (DEEPINFER_ATTENTION_BATCHED=" << batched << ")";
    }
  }
}

// A compressed index past a request's rows is recorded (synchronize throws) and skipped.
TEST_F(AttentionGpuTest, BatchBadIndicesAreReported) {
  for (const char* split : {"0", "1", "per-head"}) {
    const bool head_groups = std::string(split) != "per-head";
    AttentionBatch bad = small_batch(16);
    AttentionBatch skipped = small_batch(16);
    const int64_t rows = bad.host.compressed[0].view().size(0);
    bad.host.selected[0].data<int32_t>()[1 * 40 + 3] = static_cast<int32_t>(rows);
    skipped.host.selected[0].data<int32_t>()[1 * 40 + 3] = -1;
    const BatchTensors d = device_tensors(bad);
    Tensor out =
        Tensor::empty(DType::kF32, {bad.tokens, bad.heads, bad.head_dim}, rt::device_allocator());
    {
      const ScopedOverride head_group_setting("DEEPINFER_ATTENTION_HEAD_GROUPS",
                                              head_groups ? nullptr : "0");
      const ScopedOverride split_setting("DEEPINFER_ATTENTION_SPLIT",
                                         head_groups ? split : nullptr);
      cuda::sink_attention_batch(d.q, d.new_kv, attention_cases::request_views(bad, d), bad.window,
                                 d.sink, bad.scale, out);
    }
    EXPECT_THROW(rt::synchronize(), Error);
    EXPECT_LE(worst_error(cpu_batch(skipped), rt::to_host(out.view())), kTolerance);
    rt::synchronize();  // reported once and cleared
  }
}

// ---- the prefill kernel's split form (decode, batch invariance off) ----------------------------

// The forms a decode check runs with batch invariance off (DEEPINFER_ATTENTION_PREFILL_DECODE=1:
// the prefill kernel at any token count): the op's defaults (below 256 tokens the split form, its
// chunks by the heuristic), chunks forced (7: a last chunk shorter than the others), whole
// tokens, exact products.
struct SplitForm {
  const char* name;
  std::vector<Setting> settings;
  bool exact = false;
};

std::vector<SplitForm> split_forms() {
  std::vector<SplitForm> forms = {
      {"defaults", {}},
      {"2 chunks", {{"DEEPINFER_ATTENTION_PREFILL_CHUNKS", "2"}}},
      {"7 chunks", {{"DEEPINFER_ATTENTION_PREFILL_CHUNKS", "7"}}},
      {"whole tokens",
       {{"DEEPINFER_ATTENTION_PREFILL_CHUNKS", "1"}, {"DEEPINFER_ATTENTION_WGMMA", "0"}}},
      {"wgmma", {{"DEEPINFER_ATTENTION_PREFILL_CHUNKS", "1"}, {"DEEPINFER_ATTENTION_WGMMA", "1"}}},
      {"exact products", {{"DEEPINFER_ATTENTION_PREFILL_EXACT", "1"}}, true},
      {"5 chunks, exact products",
       {{"DEEPINFER_ATTENTION_PREFILL_CHUNKS", "5"}, {"DEEPINFER_ATTENTION_PREFILL_EXACT", "1"}},
       true}};
  // Every call of these cases takes the prefill kernel, whatever the default threshold for
  // decode-sized calls.
  for (SplitForm& form : forms)
    form.settings.push_back({"DEEPINFER_ATTENTION_PREFILL_DECODE", "1"});
  return forms;
}

Tensor run_gpu_batch_off(const AttentionBatch& b, std::vector<Setting> settings) {
  const ScopedBatchInvariance invariance(false);
  return run_gpu_batch(b, std::move(settings));
}

// Every form against the CPU (one term: kPrefillOneTermTolerance; exact products: kTolerance).
// `old_bits_rows`: tokens whose keys are not all bf16-exact, which must give the one-block
// tensor-core kernel's bits (the redo); every other token's keys are exact, so the prefill kernel
// computes them (some bit differs from the old path).
void check_split_batch(const AttentionBatch& b, const std::string& what,
                       const std::vector<int64_t>& old_bits_rows = {}) {
  const Tensor want = cpu_batch(b);
  const Tensor old_path = run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "0"}});
  for (const SplitForm& form : split_forms()) {
    const Tensor got = run_gpu_batch_off(b, form.settings);
    const double error = worst_error(want, got);
    const double tolerance = form.exact ? kTolerance : kPrefillOneTermTolerance;
    std::printf(
        "%s, prefill split form (%s): worst error %.3g of the output's scale (tolerance "
        "%.3g)\n",
        what.c_str(), form.name, error, tolerance);
    EXPECT_LE(error, tolerance) << what << ", " << form.name;
    EXPECT_FALSE(same_bits(got, old_path)) << what << ", " << form.name << ": did not run";
    for (const int64_t row : old_bits_rows) {
      EXPECT_TRUE(equal_rows(got, row, old_path, row))
          << what << ", " << form.name << ": token " << row << " lost the old path's bits";
    }
  }
  if (b.tokens < 256) {
    EXPECT_TRUE(
        same_bits(old_path, run_gpu_batch_off(b, {{"DEEPINFER_ATTENTION_PREFILL_DECODE", "0"}})))
        << what << ": DEEPINFER_ATTENTION_PREFILL_DECODE=0 must keep the head-group kernels";
  }
  EXPECT_TRUE(same_bits(old_path, run_gpu_batch(b))) << what << ": invariance on";
}

// V4.1-Flash decode (one-token requests, 128 window rows + 512 selected with -1 holes,
// bf16-exact keys as the model's) at batch 1, 16, 64 (the split form) and 256 (whole tokens by
// default, split when forced).
TEST_F(AttentionGpuTest, PrefillSplitDecode) {
  for (const int64_t batch : {int64_t{1}, int64_t{16}, int64_t{64}, int64_t{256}}) {
    check_split_batch(decode_batch(batch, KeyValues::kBf16, 301 + static_cast<uint32_t>(batch)),
                      "v41 decode b" + std::to_string(batch));
  }
}

// Tokens with fewer keys than a chunk (a one-row window, 6 rows, one selected entry, none),
// more keys than the others (1000 and 1024 selected), chunks of multi-token requests, tokens
// without compressed keys (make_batch's every third token).
TEST_F(AttentionGpuTest, PrefillSplitShortAndLongTokens) {
  AttentionBatch b = attention_cases::make_batch({{300, 1, 130, 512},
                                                  {5, 1, 128, 512},
                                                  {70, 1, 128, 1000},
                                                  {4000, 1, 136, 1024},
                                                  {900, 1, 136, 0},
                                                  {129, 1, 128, 1},
                                                  {0, 1, 130, 0},
                                                  {2, 1, 128, 3}},
                                                 {4, 0, 7, 5, 1, 3, 6, 2}, 64, 512, 128, 311);
  attention_cases::round_batch_keys(b, KeyValues::kBf16);
  check_split_batch(b, "v41 decode, 8 requests");
  AttentionBatch chunks = real_batch();
  attention_cases::round_batch_keys(chunks, KeyValues::kBf16);
  check_split_batch(chunks, "v41 5 requests (chunks)");
}

// A token whose key rows are not all bf16-exact (its own new row; another's selected compressed
// row) gives the one-block kernel's bits (the redo), in every form; the others stay within the
// tolerance of the CPU.
TEST_F(AttentionGpuTest, PrefillSplitInexactTokensTakeTheOldBits) {
  AttentionBatch b = decode_batch(16, KeyValues::kBf16, 321);
  const int64_t dim = b.head_dim;
  float& own = b.host.new_kv.data<float>()[b.offsets[5] * dim + 7];
  own = std::nextafter(own, INFINITY);  // bf16-exact before: not after
  const Tensor& selected = b.host.selected[9];
  int32_t row = -1;
  for (int64_t k = 0; k < selected.numel() && row < 0; ++k) row = selected.data<int32_t>()[k];
  ASSERT_GE(row, 0);
  float& chosen = b.host.compressed[9].data<float>()[row * dim + 100];
  chosen = std::nextafter(chosen, INFINITY);
  check_split_batch(b, "v41 decode b16, 2 tokens with f32 keys", {b.offsets[5], b.offsets[9]});
}

// DEEPINFER_ATTENTION_PREFILL_DECODE=n: decode-sized calls (batch invariance off) of at least n
// tokens take the split form, smaller ones the head-group kernels (their bits).
TEST_F(AttentionGpuTest, PrefillDecodeThreshold) {
  for (const int64_t batch : {int64_t{4}, int64_t{8}}) {
    const AttentionBatch b = decode_batch(batch, KeyValues::kBf16, 331);
    const Tensor old_path = run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "0"}});
    const Tensor got = run_gpu_batch_off(b, {{"DEEPINFER_ATTENTION_PREFILL_DECODE", "8"}});
    EXPECT_EQ(same_bits(got, old_path), batch < 8) << "b" << batch;
    EXPECT_LE(worst_error(cpu_batch(b), got), kPrefillOneTermTolerance) << "b" << batch;
  }
}

// The wgmma kernel alone at small shapes (named for the sanitizer runs' *SmallShapes* filter):
// partial tiles, -1 holes, a token without any key, a token with no compressed keys, a ring
// that wraps (small_batch at 64 heads: 40-row rings, positions past them), against the CPU;
// f32 keys give the one-block kernel's bits (the redo), and one inexact value among exact keys
// sends only its own token there.
TEST_F(AttentionGpuTest, PrefillWgmmaSmallShapes) {
  const ScopedOverride wgmma("DEEPINFER_ATTENTION_WGMMA", "1");
  const ScopedOverride chunks("DEEPINFER_ATTENTION_PREFILL_CHUNKS", "1");
  for (const auto& [c, what] :
       {std::pair{make_case(3, 64, 512, 40, 40, 50, 251, KeyValues::kBf16), "3 tokens"},
        std::pair{make_case(2, 64, 512, 3, 7, 9, 252, KeyValues::kBf16), "10 keys"},
        std::pair{make_case(3, 64, 512, 40, 0, 0, 253, KeyValues::kBf16), "a token without keys"},
        std::pair{make_case(2, 64, 512, 70, 70, 90, 254, KeyValues::kBf16), "3 tiles"}}) {
    const DeviceCase d(c);
    const Tensor got = run_gpu_policy(c, d, false, "1");
    const double error = worst_error(reference(c), got);
    std::printf("wgmma kernel, %s: worst error %.3g of the output's scale\n", what, error);
    EXPECT_LE(error, kPrefillOneTermTolerance) << what;
  }
  {
    const Case f32 = make_case(2, 64, 512, 3, 7, 9, 255);
    const DeviceCase d(f32);
    EXPECT_TRUE(same_bits(run_gpu_policy(f32, d, false, "1"), run_gpu(f32, d, 0, 2, true, "0")))
        << "f32 keys: the fallback's bits";
  }
  AttentionBatch b = small_batch(64);
  attention_cases::round_batch_keys(b, KeyValues::kBf16);
  const std::vector<Setting> settings = {{"DEEPINFER_ATTENTION_PREFILL_MIN_TOKENS", "1"}};
  const Tensor got = run_gpu_batch_off(b, settings);
  const double error = worst_error(cpu_batch(b), got);
  std::printf("wgmma kernel, 64 heads, 3 requests: worst error %.3g\n", error);
  EXPECT_LE(error, kPrefillOneTermTolerance);
  EXPECT_FALSE(same_bits(got, run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "0"}})))
      << "the wgmma kernel did not run";
  float& inexact = b.host.new_kv.data<float>()[b.offsets[2] * b.head_dim + 3];
  inexact = std::nextafter(inexact, INFINITY);
  const Tensor mixed = run_gpu_batch_off(b, settings);
  const Tensor old_path = run_gpu_batch(b, {{"DEEPINFER_ATTENTION_SPLIT", "0"}});
  EXPECT_TRUE(equal_rows(mixed, b.offsets[2], old_path, b.offsets[2])) << "the redo's bits";
  EXPECT_LE(worst_error(cpu_batch(b), mixed), kPrefillOneTermTolerance);
}

}  // namespace
}  // namespace deepinfer::ops
