// Backend ops test (as llama.cpp's test-backend-ops): every op of ops/ops.h runs on the CPU
// reference and on the CUDA backend over the same random inputs, at the tiny test model's
// shapes and at the real DeepSeek-V4.1-Flash shapes (both read from tests/data/configs), and
// the results are compared with a tolerance stated per op. Every GPU output starts as a NaN
// (or out-of-range) sentinel, so an element the kernel never wrote fails the comparison.
// Real-shape cases use a few rows only, to keep the CPU side fast. Skips without a usable GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention_batch_case.h"
#include "core/dtype_convert.h"
#include "gpu_support.h"
#include "ops/batch_invariance.h"
#include "ops/concurrent_branch.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/cuda/runtime_switch.h"
#include "ops/ops.h"
#include "test_util.h"

namespace deepinfer::ops {
namespace {

namespace rt = deepinfer::cuda;  // the runtime: memory, copies, streams
using testing::host_key_cache;
using testing::HostKeyCache;
using testing::random_values;
using testing::same_bits;

// The model dimensions the ops see, from a config.json's text_config.
struct ModelShapes {
  std::string name;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  int rope_dim = 0;
  int64_t q_lora = 0;
  int64_t moe_intermediate = 0;
  int64_t experts = 0;
  int top_k = 0;
  int hc = 0;
  int sinkhorn_iters = 0;
  int64_t index_heads = 0;
  int64_t index_dim = 0;
  int index_topk = 0;
  int candidate_topk_blocks = 0;
  int candidate_block_size = 0;
  int64_t window = 0;
  int64_t engram_heads = 0;
  int64_t engram_dim = 0;
  int64_t engram_columns = 0;
  double rope_theta = 0;
  YarnParams yarn;
  int64_t rows = 0;  // activation rows per case: few at real shapes (the CPU side must be fast)
};

// The checkout's root: DEEPINFER_SOURCE_DIR in the environment (the test binary is built here
// and run on the GPU machine, where the checkout lives elsewhere), else the build's source.
std::string source_dir() {
  const char* from_environment = std::getenv("DEEPINFER_SOURCE_DIR");
  return from_environment != nullptr ? from_environment : DEEPINFER_SOURCE_DIR;
}

ModelShapes load_shapes(const std::string& file, const std::string& name, int64_t rows) {
  std::ifstream in(source_dir() + "/tests/data/configs/" + file);
  EXPECT_TRUE(in.good()) << file;
  const nlohmann::json c = nlohmann::json::parse(in)["text_config"];
  ModelShapes s;
  s.name = name;
  s.hidden = c["hidden_size"];
  s.heads = c["num_attention_heads"];
  s.head_dim = c["head_dim"];
  s.rope_dim = c["qk_rope_head_dim"];
  s.q_lora = c["q_lora_rank"];
  s.moe_intermediate = c["moe_intermediate_size"];
  s.experts = c["n_routed_experts"];
  s.top_k = c["num_experts_per_tok"];
  s.hc = c["hc_mult"];
  s.sinkhorn_iters = c["hc_sinkhorn_iters"];
  s.index_heads = c["index_n_heads"];
  s.index_dim = c["index_head_dim"];
  s.index_topk = c["index_topk"];
  s.candidate_topk_blocks = c["candidate_topk_blocks"];
  s.candidate_block_size = c["candidate_block_size"];
  s.window = c["sliding_window"];
  s.engram_heads = c["engram_n_heads"];
  s.engram_dim = c["engram_head_dim"];
  s.engram_columns = s.engram_heads * (static_cast<int64_t>(c["engram_max_ngram_size"]) - 1);
  s.rope_theta = c["rope_theta"];
  s.yarn.factor = c["rope_scaling"]["factor"];
  s.yarn.original_max_position = c["rope_scaling"]["original_max_position_embeddings"];
  s.yarn.beta_fast = c["rope_scaling"]["beta_fast"];
  s.yarn.beta_slow = c["rope_scaling"]["beta_slow"];
  s.rows = rows;
  return s;
}

// BACKEND_OPS_TINY_ONLY=1 keeps the tiny shapes only (the compute-sanitizer runs, which slow
// every kernel down a hundredfold): the model-width cases skip.
bool tiny_shapes_only() {
  const char* tiny_only = std::getenv("BACKEND_OPS_TINY_ONLY");
  return tiny_only != nullptr && std::string(tiny_only) == "1";
}

std::vector<ModelShapes> all_shapes() {
  std::vector<ModelShapes> shapes = {load_shapes("tiny_v41.json", "tiny", 5)};
  if (!tiny_shapes_only()) {
    shapes.push_back(load_shapes("deepseek_v41_flash_config.json", "v41-flash", 3));
  }
  return shapes;
}

// ---- host tensors ---------------------------------------------------------------------------

Tensor host_f32(Shape shape, uint32_t seed, float scale = 1.0f) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  const std::vector<float> values = random_values(static_cast<size_t>(t.numel()), seed, scale);
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

Tensor host_i32(Shape shape, std::vector<int32_t> values) {
  Tensor t = Tensor::empty(DType::kI32, shape);
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// Random bytes for quantized storage; `avoid_e4m3_nan` skips the e4m3 NaN codes.
Tensor host_bytes(DType dtype, Shape shape, uint32_t seed, int lo = 0, int hi = 255,
                  bool avoid_e4m3_nan = false) {
  Tensor t = Tensor::empty(dtype, shape);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(lo, hi);
  auto* bytes = static_cast<uint8_t*>(t.view().raw_data());
  for (size_t i = 0; i < t.view().nbytes(); ++i) {
    uint8_t b = static_cast<uint8_t>(byte(rng));
    if (avoid_e4m3_nan && (b & 0x7F) == 0x7F) b ^= 1;
    bytes[i] = b;
  }
  return t;
}

Tensor host_bf16(Shape shape, uint32_t seed, float scale = 1.0f) {
  Tensor f = host_f32(shape, seed, scale);
  Tensor t = Tensor::empty(DType::kBF16, shape);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<BFloat16>()[i].bits = float_to_bf16(f.data<float>()[i]);
  return t;
}

Tensor copy_of(const TensorView& v) {
  Tensor t = Tensor::empty(v.dtype(), v.shape());
  std::memcpy(t.view().raw_data(), v.raw_data(), v.nbytes());
  return t;
}

// ---- device tensors -------------------------------------------------------------------------

Tensor gpu(const TensorView& host) {
  return rt::to_device(host);
}

// A device output whose every byte is a sentinel: NaN for f32 (0xFF bytes), 0x7F7F7F7F for
// i32 and 127 for i8 -- values no op writes for these inputs.
Tensor gpu_output(DType dtype, Shape shape) {
  Tensor t = Tensor::empty(dtype, shape, rt::device_allocator());
  rt::fill_bytes(t.view(), dtype == DType::kF32 ? 0xFF : 0x7F);
  return t;
}

// Compares a device result with the CPU reference. Elements must agree in kind (NaN, +-inf,
// finite); finite ones within abs_tol + rel_tol * max|reference| (the scale of the output).
void expect_close(const TensorView& want, const TensorView& got_device, double rel_tol,
                  const std::string& what) {
  rt::synchronize();
  Tensor got = rt::to_host(got_device);
  ASSERT_EQ(want.numel(), got.numel()) << what;
  const float* w = want.data<float>();
  const float* g = got.data<float>();
  double scale = 1e-30;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::isfinite(w[i])) scale = std::max(scale, std::abs(static_cast<double>(w[i])));
  }
  double worst = 0.0;
  int64_t worst_index = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (std::isnan(g[i]) != std::isnan(w[i])) {
      FAIL() << what << ": element " << i << " is " << g[i] << " (NaN = never written?), want "
             << w[i];
    }
    if (std::isinf(w[i]) || std::isinf(g[i])) {
      ASSERT_EQ(g[i], w[i]) << what << ": element " << i;
      continue;
    }
    if (std::isnan(w[i])) continue;
    const double error = std::abs(static_cast<double>(g[i]) - w[i]) / scale;
    if (error > worst) {
      worst = error;
      worst_index = i;
    }
  }
  EXPECT_LE(worst, rel_tol) << what << ": worst relative error at element " << worst_index
                            << ": got " << g[worst_index] << ", want " << w[worst_index];
}

// Bit-for-bit equality (integer outputs, gathers, quantizers).
void expect_equal(const TensorView& want, const TensorView& got_device, const std::string& what) {
  rt::synchronize();
  Tensor got = rt::to_host(got_device);
  ASSERT_EQ(want.nbytes(), got.view().nbytes()) << what;
  const auto* w = static_cast<const uint8_t*>(want.raw_data());
  const auto* g = static_cast<const uint8_t*>(got.view().raw_data());
  const size_t width = std::max<size_t>(1, static_cast<size_t>(dtype_bits(want.dtype()) / 8));
  for (size_t i = 0; i < want.nbytes(); i += width) {
    if (std::memcmp(w + i, g + i, width) != 0) {
      if (want.dtype() == DType::kF32) {
        float a, b;
        std::memcpy(&a, w + i, 4);
        std::memcpy(&b, g + i, 4);
        FAIL() << what << ": element " << i / width << " is " << b << ", want " << a;
      }
      if (want.dtype() == DType::kI32) {
        int32_t a, b;
        std::memcpy(&a, w + i, 4);
        std::memcpy(&b, g + i, 4);
        FAIL() << what << ": element " << i / width << " is " << b << ", want " << a;
      }
      FAIL() << what << ": byte " << i << " is " << int(g[i]) << ", want " << int(w[i]);
    }
  }
}

class BackendOpsTest : public ::testing::Test {
 protected:
  void SetUp() override { DEEPINFER_SKIP_WITHOUT_GPU(); }
};

// ---- concurrent branches --------------------------------------------------------------------

// A branch's ops see what the stream queued before the branch opened, the ops after join() see
// the branch's results, and the two lines in between run apart: x is rewritten in place on the
// main stream before the fork (a branch that did not wait would read the old x), the branch and
// the main stream then each write their own output from it, and the sum after the join reads
// both. 16M elements so that each op runs long enough for a missing wait to show. The same ops
// on the CPU give the reference (elementwise ops: exact on both backends).
TEST_F(BackendOpsTest, ConcurrentBranchOrdersItsOpsWithTheStream) {
  const Shape shape{4096, 4096};
  Tensor x_host = host_f32(shape, 91);
  // x *= 2; then on the branch x + x, beside it on the main stream 3x; after the join their sum.
  const auto branch_then_sum = [](const Tensor& x, const Tensor& on_branch, const Tensor& on_main,
                                  const Tensor& sum) {
    ops::scale(x.view(), 2.0f, x.view());
    {
      ops::ConcurrentBranch branch(x.device());
      branch.run([&] { ops::add(x.view(), x.view(), on_branch.view()); });
      ops::scale(x.view(), 3.0f, on_main.view());
      branch.join();
    }
    ops::add(on_branch.view(), on_main.view(), sum.view());
  };
  Tensor want_x = copy_of(x_host.view());
  Tensor want_branch = Tensor::empty(DType::kF32, shape);
  Tensor want_sum = Tensor::empty(DType::kF32, shape);
  branch_then_sum(want_x, want_branch, Tensor::empty(DType::kF32, shape), want_sum);

  Tensor x = gpu(x_host.view());
  Tensor on_branch = gpu_output(DType::kF32, shape);
  Tensor sum = gpu_output(DType::kF32, shape);
  branch_then_sum(x, on_branch, gpu_output(DType::kF32, shape), sum);
  expect_equal(want_sum.view(), sum.view(), "branch + main after the join");
  expect_equal(want_branch.view(), on_branch.view(), "the branch's output");

  // One branch a thread: a second one while the first is open names the problem; the first
  // still joins (and its ops ran) when it goes out of scope.
  {
    ops::ConcurrentBranch branch(x.device());
    branch.run([&] { ops::scale(x.view(), 0.5f, on_branch.view()); });
    try {
      ops::ConcurrentBranch second(x.device());
      ADD_FAILURE() << "a second branch opened while one was open";
    } catch (const InternalError& error) {  // a programming error, not bad input
      EXPECT_NE(std::string(error.what()).find("already open"), std::string::npos) << error.what();
    }
  }
  ops::scale(x.view(), 0.5f, sum.view());
  Tensor in_place = rt::to_host(sum.view());
  expect_equal(in_place.view(), on_branch.view(), "a branch joined by its destructor");
}

// ---- linear -----------------------------------------------------------------------------------

struct WeightCase {
  const char* name;
  Tensor weight;
  Tensor scale;
};

std::vector<WeightCase> weight_cases(int64_t out, int64_t in, uint32_t seed) {
  std::vector<WeightCase> cases;
  cases.push_back({"f32", host_f32({out, in}, seed, 0.05f), Tensor()});
  cases.push_back({"bf16", host_bf16({out, in}, seed + 1, 0.05f), Tensor()});
  // ue8m0 scales near 2^-8 (codes 117..121): realistic weight magnitudes.
  cases.push_back(
      {"fp8", host_bytes(DType::kF8E4M3, {out, in}, seed + 2, 0, 255, true),
       host_bytes(DType::kF8E8M0, {(out + 31) / 32, (in + 31) / 32}, seed + 3, 117, 121)});
  cases.push_back({"fp4", host_bytes(DType::kF4E2M1x2, {out, in}, seed + 4),
                   host_bytes(DType::kF8E8M0, {out, in / 32}, seed + 5, 117, 121)});
  return cases;
}

// Summation order differs (CPU: 8 interleaved lanes; GPU: one ascending FMA chain per output),
// so results differ by rounding only: a few ulp of the sum of |terms| over K <= 5120.
constexpr double kLinearTolerance = 2e-5;

TEST_F(BackendOpsTest, LinearAllFormatsAndActivationQuant) {
  for (const ModelShapes& s : all_shapes()) {
    // q_a projection shape (hidden -> q_lora) and an expert's up projection.
    for (auto [out, in] :
         {std::pair{s.q_lora, s.hidden}, std::pair{s.moe_intermediate, s.hidden}}) {
      for (WeightCase& w : weight_cases(out, in, 11)) {
        Tensor x = host_f32({s.rows, in}, 3);
        Tensor dw = gpu(w.weight), ds = w.scale.numel() ? gpu(w.scale) : Tensor();
        for (ActivationQuant quant : {ActivationQuant::kNone, ActivationQuant::kFp8PerBlock32}) {
          const std::string what = s.name + " linear " + w.name + " [" + std::to_string(out) + "x" +
                                   std::to_string(in) + "]" +
                                   (quant == ActivationQuant::kNone ? "" : " fp8-act");
          Tensor want = Tensor::empty(DType::kF32, {s.rows, out});
          linear(x, LinearWeight{w.weight, w.scale.view()}, want, quant);
          Tensor dx = gpu(x);
          Tensor got = gpu_output(DType::kF32, {s.rows, out});
          cuda::linear(dx, LinearWeight{dw, ds.view()}, got, quant);
          expect_close(want, got, kLinearTolerance, what);
        }
        // Dequantization is exact in every format.
        Tensor want = Tensor::empty(DType::kF32, {out, in});
        dequantize_weight(LinearWeight{w.weight, w.scale.view()}, want);
        Tensor got = gpu_output(DType::kF32, {out, in});
        cuda::dequantize_weight(LinearWeight{dw, ds.view()}, got);
        expect_equal(want, got, s.name + " dequantize " + w.name);
      }
    }
  }
}

// linear_pair is two linears of one input: on each backend the same bits as its two linear
// calls (the GPU's one decode launch of two FP8 weights included), every weight format and both
// activation numerics.
TEST_F(BackendOpsTest, LinearPairEqualsTwoLinears) {
  for (const ModelShapes& s : all_shapes()) {
    const int64_t in = s.hidden;
    std::vector<WeightCase> firsts = weight_cases(s.q_lora, in, 31);
    std::vector<WeightCase> seconds = weight_cases(s.moe_intermediate, in, 41);
    for (size_t i = 0; i < firsts.size(); ++i) {
      const WeightCase& w1 = firsts[i];
      const WeightCase& w2 = seconds[i];
      Tensor dw1 = gpu(w1.weight), ds1 = w1.scale.numel() ? gpu(w1.scale) : Tensor();
      Tensor dw2 = gpu(w2.weight), ds2 = w2.scale.numel() ? gpu(w2.scale) : Tensor();
      for (int64_t rows : {int64_t{1}, s.rows}) {
        Tensor x = host_f32({rows, in}, 9);
        Tensor dx = gpu(x);
        for (ActivationQuant quant : {ActivationQuant::kNone, ActivationQuant::kFp8PerBlock32}) {
          const std::string what = s.name + " linear_pair " + w1.name + ", " +
                                   std::to_string(rows) + " rows" +
                                   (quant == ActivationQuant::kNone ? "" : " fp8-act");
          const LinearWeight hw1{w1.weight, w1.scale.view()}, hw2{w2.weight, w2.scale.view()};
          Tensor want1 = Tensor::empty(DType::kF32, {rows, s.q_lora});
          Tensor want2 = Tensor::empty(DType::kF32, {rows, s.moe_intermediate});
          linear(x, hw1, want1, quant);
          linear(x, hw2, want2, quant);
          Tensor got1 = Tensor::empty(DType::kF32, {rows, s.q_lora});
          Tensor got2 = Tensor::empty(DType::kF32, {rows, s.moe_intermediate});
          linear_pair(x, hw1, got1, hw2, got2, quant);
          EXPECT_EQ(0, std::memcmp(want1.data<float>(), got1.data<float>(), want1.view().nbytes()))
              << what << ": CPU first";
          EXPECT_EQ(0, std::memcmp(want2.data<float>(), got2.data<float>(), want2.view().nbytes()))
              << what << ": CPU second";
          const LinearWeight gw1{dw1, ds1.view()}, gw2{dw2, ds2.view()};
          Tensor single1 = gpu_output(DType::kF32, {rows, s.q_lora});
          Tensor single2 = gpu_output(DType::kF32, {rows, s.moe_intermediate});
          cuda::linear(dx, gw1, single1, quant);
          cuda::linear(dx, gw2, single2, quant);
          Tensor pair1 = gpu_output(DType::kF32, {rows, s.q_lora});
          Tensor pair2 = gpu_output(DType::kF32, {rows, s.moe_intermediate});
          cuda::linear_pair(dx, gw1, pair1, gw2, pair2, quant);
          expect_equal(rt::to_host(single1), pair1, what + ": GPU first");
          expect_equal(rt::to_host(single2), pair2, what + ": GPU second");
          expect_close(want1, pair1, kLinearTolerance, what + ": against the CPU");
        }
      }
    }
  }
}

TEST_F(BackendOpsTest, LinearIsBatchInvariantAndTakesStridedRows) {
  // 130 rows span three row tiles; each row must equal the same row computed alone.
  const int64_t rows = 130, in = 96, out = 72;
  Tensor x = host_f32({rows, in}, 5);
  Tensor w = host_f32({out, in}, 6, 0.1f);
  Tensor dx = gpu(x), dw = gpu(w);
  Tensor all = gpu_output(DType::kF32, {rows, out});
  cuda::linear(dx, LinearWeight{dw, TensorView()}, all);
  Tensor want = Tensor::empty(DType::kF32, {rows, out});
  linear(x, LinearWeight{w, TensorView()}, want);
  expect_close(want, all, kLinearTolerance, "linear 130 rows");
  Tensor all_host = rt::to_host(all);
  for (int64_t r : {0, 63, 64, 129}) {
    Tensor one = gpu_output(DType::kF32, {1, out});
    cuda::linear(dx.view().narrow(0, r, 1), LinearWeight{dw, TensorView()}, one);
    Tensor one_host = rt::to_host(one);
    EXPECT_EQ(0, std::memcmp(one_host.data<float>(), all_host.data<float>() + r * out, out * 4))
        << "row " << r << " differs when computed alone";
  }
  // A column slice of a wider activation matrix (row stride > row length).
  Tensor wide = host_f32({4, 2 * in}, 7);
  Tensor dwide = gpu(wide);
  Tensor got = gpu_output(DType::kF32, {4, out});
  cuda::linear(dwide.view().narrow(1, in, in), LinearWeight{dw, TensorView()}, got);
  Tensor want_slice = Tensor::empty(DType::kF32, {4, out});
  linear(wide.view().narrow(1, in, in), LinearWeight{w, TensorView()}, want_slice);
  expect_close(want_slice, got, kLinearTolerance, "linear on a column slice");
}

// ---- elementwise ------------------------------------------------------------------------------

TEST_F(BackendOpsTest, EmbeddingGathersExactRows) {
  for (const ModelShapes& s : all_shapes()) {
    const int64_t vocab = 1000;  // the real 129280 rows add nothing but memory
    for (bool bf16 : {false, true}) {
      Tensor table = bf16 ? host_bf16({vocab, s.hidden}, 1) : host_f32({vocab, s.hidden}, 1);
      std::vector<int32_t> ids = {0, 999, 17, 17, 512, 3, 8};
      ids.resize(static_cast<size_t>(s.rows));
      Tensor want = Tensor::empty(DType::kF32, {s.rows, s.hidden});
      embedding(table, ids, want);
      Tensor dtable = gpu(table);
      Tensor got = gpu_output(DType::kF32, {s.rows, s.hidden});
      cuda::embedding(dtable, ids, got);
      expect_equal(want, got, s.name + (bf16 ? " embedding bf16" : " embedding f32"));
      std::vector<int32_t> bad = {1, static_cast<int32_t>(vocab)};
      Tensor two = gpu_output(DType::kF32, {2, s.hidden});
      EXPECT_THROW(cuda::embedding(dtable, bad, two), Error);
    }
  }
}

// rmsnorm, softmax, rope, swiglu, engram_mix, hc ops: one reduction per row in a different
// order (a tree of 256 partial sums vs. the CPU's 8 lanes) and CUDA's expf/sqrtf (<= 2 ulp):
// differences of a few ulp of the output scale.
constexpr double kRowReductionTolerance = 1e-5;

TEST_F(BackendOpsTest, RmsnormWeightedUnweightedAndInPlace) {
  for (const ModelShapes& s : all_shapes()) {
    for (int64_t dim : {s.hidden, s.hidden * s.hc}) {
      Tensor x = host_f32({s.rows, dim}, 2, 3.0f);
      for (int kind = 0; kind < 3; ++kind) {
        Tensor weight = kind == 0 ? Tensor() : kind == 1 ? host_f32({dim}, 4) : host_bf16({dim}, 4);
        Tensor want = Tensor::empty(DType::kF32, {s.rows, dim});
        rmsnorm(x, weight.view(), 1e-6f, want);
        Tensor dx = gpu(x);
        Tensor dweight = weight.numel() ? gpu(weight) : Tensor();
        Tensor got = gpu_output(DType::kF32, {s.rows, dim});
        cuda::rmsnorm(dx, dweight.view(), 1e-6f, got);
        expect_close(want, got, kRowReductionTolerance, s.name + " rmsnorm");
        cuda::rmsnorm(dx, dweight.view(), 1e-6f, dx);  // out aliases x
        expect_close(want, dx, kRowReductionTolerance, s.name + " rmsnorm in place");
      }
    }
  }
}

TEST_F(BackendOpsTest, RopeForwardAndInverse) {
  for (const ModelShapes& s : all_shapes()) {
    const RopeTable table = make_rope_table(s.rope_dim, s.rope_theta, s.yarn);
    std::vector<int32_t> positions = {0, 1, 65535, 1048575, 77};
    positions.resize(static_cast<size_t>(s.rows));
    for (bool inverse : {false, true}) {
      Tensor x = host_f32({s.rows, s.heads, s.head_dim}, 9);
      Tensor dx = gpu(x);
      Tensor host_positions = host_i32({s.rows}, positions);
      rope(x, host_positions, table, inverse);
      cuda::rope(dx, gpu(host_positions), table, inverse);
      // Same f32 angle and double-precision cos/sin on both sides; only the final products can
      // round differently (FMA contraction on the GPU).
      expect_close(x, dx, 1e-6, s.name + (inverse ? " rope inverse" : " rope"));
    }
  }
}

TEST_F(BackendOpsTest, SoftmaxRows) {
  for (const ModelShapes& s : all_shapes()) {
    for (int64_t n : {s.hc * int64_t{1}, s.experts, s.window + s.index_topk}) {
      Tensor x = host_f32({s.rows, n}, 10, 4.0f);
      Tensor dx = gpu(x);
      softmax_rows(x);
      cuda::softmax_rows(dx);
      expect_close(x, dx, kRowReductionTolerance, s.name + " softmax n=" + std::to_string(n));
    }
  }
}

TEST_F(BackendOpsTest, FakeQuantizersAreBitExact) {
  for (const ModelShapes& s : all_shapes()) {
    // Values over many binades, zeros and exact ties of the fp4 grid.
    Tensor x = host_f32({s.rows, s.head_dim}, 12, 2.0f);
    for (int64_t i = 0; i < x.numel(); i += 7) x.data<float>()[i] *= 1e-3f;
    for (int64_t i = 3; i < x.numel(); i += 11) x.data<float>()[i] = 0.0f;
    for (int64_t i = 5; i < x.numel(); i += 13) x.data<float>()[i] = 0.25f * (i % 9);
    Tensor a = copy_of(x);
    Tensor da = gpu(x);
    fake_quant_fp8(a, 32);
    cuda::fake_quant_fp8(da, 32);
    expect_equal(a, da, s.name + " fake_quant_fp8");
    for (Fp4ScaleFormat format : {Fp4ScaleFormat::kUe8m0, Fp4ScaleFormat::kE4m3}) {
      Tensor b = copy_of(x);
      Tensor db = gpu(x);
      fake_quant_fp4(b, 32, format);
      cuda::fake_quant_fp4(db, 32, format);
      expect_equal(b, db, s.name + " fake_quant_fp4");
    }
  }
  // Rows that are not a multiple of the block stay as they are.
  Tensor odd = host_f32({2, 40}, 13);
  Tensor dodd = gpu(odd);
  cuda::fake_quant_fp8(dodd, 32);
  expect_equal(odd, dodd, "fake_quant_fp8 unblockable");
}

// ---- attention --------------------------------------------------------------------------------

TEST_F(BackendOpsTest, SinkAttentionWindowAndCompressed) {
  for (const ModelShapes& s : all_shapes()) {
    const int64_t t = s.rows;
    const int64_t window_rows = s.window + t;
    const int64_t compressed_rows = 3 * s.index_topk / 2;
    const int64_t selected = s.index_topk;
    Tensor q = host_f32({t, s.heads, s.head_dim}, 20);
    Tensor window = host_f32({window_rows, s.head_dim}, 21, 0.5f);
    Tensor compressed = host_f32({compressed_rows, s.head_dim}, 22, 0.5f);
    Tensor sink = host_f32({s.heads}, 23);
    std::vector<int32_t> ranges, idx;
    std::mt19937 rng(24);
    for (int64_t i = 0; i < t; ++i) {
      // Token i sees the window ending at its position; one token sees an empty window.
      const int32_t hi = static_cast<int32_t>(s.window + i);
      ranges.push_back(i == 1 ? hi : static_cast<int32_t>(std::max<int64_t>(0, hi - s.window + 1)));
      ranges.push_back(hi);
      for (int64_t k = 0; k < selected; ++k) {
        const int32_t j = static_cast<int32_t>(rng() % compressed_rows);
        idx.push_back(k % 5 == 4 ? -1 : j);
      }
    }
    Tensor range = host_i32({t, 2}, ranges);
    Tensor index = host_i32({t, selected}, idx);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    for (bool with_compressed : {false, true}) {
      Tensor want = Tensor::empty(DType::kF32, {t, s.heads, s.head_dim});
      const TensorView no_index = TensorView::contiguous(nullptr, DType::kI32, {t, 0});
      sink_attention(q, window, range, compressed, with_compressed ? index.view() : no_index, sink,
                     scale, want);
      Tensor dq = gpu(q), dwindow = gpu(window), dcompressed = gpu(compressed), dsink = gpu(sink);
      Tensor drange = gpu(range), dindex = gpu(index);
      const TensorView dno_index =
          TensorView::contiguous(nullptr, DType::kI32, {t, 0}, Device::cuda(0));
      Tensor got = gpu_output(DType::kF32, {t, s.heads, s.head_dim});
      cuda::sink_attention(dq, dwindow, drange, dcompressed,
                           with_compressed ? dindex.view() : dno_index, dsink, scale, got);
      // Online softmax (running max rescaled per chunk of 4 keys) vs. max-first, and expf:
      // a few ulp of the output scale.
      expect_close(want, got, kRowReductionTolerance,
                   s.name + (with_compressed ? " sink_attention window+compressed"
                                             : " sink_attention window"));
    }
  }
}

// The batched form over 4 requests: a decode token whose window wraps its ring, a first chunk
// (no ring reads, no compressed keys), a chunk straddling its ring's wrap, a short history; rows
// not in request order; then write_window_rings bit-equal to the CPU.
TEST_F(BackendOpsTest, SinkAttentionBatchAndWindowRings) {
  for (const ModelShapes& s : all_shapes()) {
    const int64_t w = s.window;
    const int64_t k = s.index_topk;
    attention_cases::AttentionBatch b =
        attention_cases::make_batch({{2 * w + 5, 1, w + 2, k},
                                     {0, s.rows + 2, w + 2, 0},
                                     {w + 3, s.rows + 4, w, k},
                                     {5, 1, w, k}},
                                    {2, 0, 3, 1}, s.heads, s.head_dim, w, 25);
    const attention_cases::BatchTensors d =
        attention_cases::copy_tensors(b.host, [](const TensorView& v) { return gpu(v); });
    Tensor want = Tensor::empty(DType::kF32, {b.tokens, b.heads, b.head_dim});
    sink_attention_batch(b.host.q, b.host.new_kv, attention_cases::request_views(b, b.host),
                         b.window, b.host.sink, b.scale, want);
    Tensor got = gpu_output(DType::kF32, {b.tokens, b.heads, b.head_dim});
    cuda::sink_attention_batch(d.q, d.new_kv, attention_cases::request_views(b, d), b.window,
                               d.sink, b.scale, got);
    expect_close(want, got, kRowReductionTolerance, s.name + " sink_attention_batch");
    write_window_rings(b.host.new_kv, attention_cases::request_views(b, b.host));
    cuda::write_window_rings(d.new_kv, attention_cases::request_views(b, d));
    for (size_t r = 0; r < b.specs.size(); ++r) {
      expect_equal(b.host.rings[r], d.rings[r],
                   s.name + " write_window_rings " + std::to_string(r));
    }
  }
}

TEST_F(BackendOpsTest, BadDeviceIndicesAreReportedAtSynchronize) {
  Tensor q = gpu(host_f32({1, 2, 32}, 1));
  Tensor window = gpu(host_f32({4, 32}, 2));
  Tensor sink = gpu(host_f32({2}, 3));
  Tensor range = gpu(host_i32({1, 2}, {0, 5}));  // past the 4 window rows
  Tensor out = gpu_output(DType::kF32, {1, 2, 32});
  cuda::sink_attention(q, window, range, window,
                       TensorView::contiguous(nullptr, DType::kI32, {1, 0}, Device::cuda(0)), sink,
                       1.0f, out);
  EXPECT_THROW(rt::synchronize(), Error);
  Tensor table = gpu(host_f32({10, 8}, 4));
  Tensor ids = gpu(host_i32({1, 2}, {3, 10}));
  Tensor gathered = gpu_output(DType::kF32, {1, 16});
  cuda::engram_gather(table, TensorView(), ids, gathered);
  EXPECT_THROW(rt::synchronize(), Error);
  rt::synchronize();  // the error was reported once and cleared
}

// ---- compressed branch ------------------------------------------------------------------------

TEST_F(BackendOpsTest, CompressPool) {
  for (const ModelShapes& s : all_shapes()) {
    for (int ratio : {1, 2, 4}) {
      const int64_t groups = s.rows + 1;
      Tensor kv = host_f32({groups * ratio, s.head_dim}, 30);
      Tensor gate = host_f32({groups * ratio, s.head_dim}, 31, 3.0f);
      Tensor want = Tensor::empty(DType::kF32, {groups, s.head_dim});
      compress_pool(kv, gate, ratio, want);
      Tensor got = gpu_output(DType::kF32, {groups, s.head_dim});
      cuda::compress_pool(gpu(kv), gpu(gate), ratio, got);
      expect_close(want, got, kRowReductionTolerance, s.name + " compress_pool");
    }
  }
}

// A key cache's host and device copies.
struct KeyCachePair {
  HostKeyCache host;
  Tensor codes, scales;  // on the device
  IndexerKeys device() const { return {codes.view(), scales.view()}; }
};

KeyCachePair key_cache_pair(int64_t rows, int64_t dim, uint32_t seed, float magnitude = 1.0f) {
  KeyCachePair pair;
  pair.host =
      host_key_cache(random_values(static_cast<size_t>(rows * dim), seed, magnitude), rows, dim);
  pair.codes = gpu(pair.host.codes.view());
  pair.scales = gpu(pair.host.scales.view());
  return pair;
}

TEST_F(BackendOpsTest, WriteIndexerKeys) {
  // The GPU's codes and scales are the CPU's byte for byte (the CPU's are fake_quant_fp4's
  // values: compressed_branch_test), at 32 to 128 channels, with blocks of every regime.
  for (const int64_t dim : {32, 128, 1024}) {
    const int64_t rows = 300;
    Tensor x = host_f32({rows, dim}, 45);
    float* v = x.data<float>();
    std::fill_n(v, 32, 0.0f);
    for (int64_t c = 0; c < 32; ++c) v[dim + c] = 0x1p-130f * static_cast<float>(c - 16);
    for (int64_t c = 0; c < 32; ++c) v[2 * dim + c] = (c % 4 - 1.5f) * 0x1p-3f;  // ties
    v[2 * dim + 31] = 6.0f * 0x1p-3f;
    for (int64_t c = 0; c < 32; ++c) v[3 * dim + c] *= 3e36f;
    v[4 * dim + 5] = NAN;
    v[5 * dim + 7] = INFINITY;
    Tensor dx = gpu(x);
    const Shape codes_shape{rows + 7, dim}, scales_shape{rows + 7, dim / 32};
    HostKeyCache want{Tensor::zeros(DType::kF4E2M1x2, codes_shape),
                      Tensor::zeros(DType::kF8E8M0, scales_shape)};
    Tensor codes = gpu(want.codes.view()), scales = gpu(want.scales.view());
    const IndexerKeys device{codes.view(), scales.view()};
    // Rows in two writes, at other cache rows than their call rows (cache rows 100-106 unwritten).
    const std::vector<IndexerKeyWrite> host_writes = {{want.keys(), 0, 200, 107},
                                                      {want.keys(), 200, 100, 0}};
    const std::vector<IndexerKeyWrite> device_writes = {{device, 0, 200, 107},
                                                        {device, 200, 100, 0}};
    write_indexer_keys(x, host_writes);
    cuda::write_indexer_keys(dx, device_writes);
    const std::string what = std::to_string(dim) + " channels";
    EXPECT_TRUE(same_bits(want.codes, rt::to_host(codes))) << what << ": codes";
    EXPECT_TRUE(same_bits(want.scales, rt::to_host(scales))) << what << ": scales";
    const IndexerKeyWrite outside{device, 290, 20, 0};
    EXPECT_ANY_THROW(cuda::write_indexer_keys(dx, {&outside, 1})) << what;
  }
}

TEST_F(BackendOpsTest, IndexerScores) {
  for (const ModelShapes& s : all_shapes()) {
    const int64_t keys = s.name == "tiny" ? 9 : 2000;
    Tensor q = host_f32({s.rows, s.index_heads, s.index_dim}, 40);
    const KeyCachePair k = key_cache_pair(keys, s.index_dim, 41);
    Tensor w = host_f32({s.rows, s.index_heads}, 42);
    std::vector<int32_t> visible = {static_cast<int32_t>(keys), 0, static_cast<int32_t>(keys / 2),
                                    static_cast<int32_t>(keys + 5), 1};
    visible.resize(static_cast<size_t>(s.rows));
    Tensor vis = host_i32({s.rows}, visible);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.index_dim));
    Tensor want = Tensor::empty(DType::kF32, {s.rows, keys});
    indexer_scores(q, k.host.keys(), w, vis, scale, want);
    Tensor got = gpu_output(DType::kF32, {s.rows, keys});
    cuda::indexer_scores(gpu(q), k.device(), gpu(w), gpu(vis), scale, got);
    // Per-head dots reduced across a warp instead of 8 lanes; heads summed in the same order.
    expect_close(want, got, kRowReductionTolerance, s.name + " indexer_scores");
  }
}

// ---- indexer_scores_batch ----------------------------------------------------------------

// One ragged step of indexer_scores_batch: per request its tokens and keys.
struct IndexerBatchShape {
  std::string name;
  int64_t heads = 0;
  int64_t dim = 0;
  std::vector<int64_t> counts;
  std::vector<int64_t> entries;
  int64_t extra_width = 0;     // columns past every request's keys
  bool fp4 = true;             // q as the forward quantizes it (exact in bf16); keys always are
  float key_magnitude = 1.0f;  // the keys' values before quantization lie in +-key_magnitude
};

Tensor indexer_input(Shape shape, uint32_t seed, bool fp4) {
  Tensor t = host_f32(shape, seed);
  if (fp4) fake_quant_fp4(t, 32, Fp4ScaleFormat::kUe8m0);
  return t;
}

// The GPU batch op against the CPU reference (which is the per-request op), then every
// request alone on the GPU against its rows of the batched call, bit for bit.
// given_visible: per token in request order (placed at the requests' rows); empty: derived from
// the counts and entries.
void check_indexer_batch(const IndexerBatchShape& shape, uint32_t seed,
                         const std::vector<int32_t>& given_visible = {}) {
  const size_t request_count = shape.counts.size();
  int64_t tokens = 0;
  int64_t width = 0;
  for (size_t r = 0; r < request_count; ++r) {
    tokens += shape.counts[r];
    width = std::max(width, shape.entries[r]);
  }
  width += shape.extra_width;
  // Rows placed in reverse request order: the table, not the order, maps rows to requests.
  std::vector<int64_t> offsets(request_count);
  int64_t next_row = 0;
  for (size_t r = request_count; r-- > 0;) {
    offsets[r] = next_row;
    next_row += shape.counts[r];
  }
  // Causal-style visible counts ending at the request's entries, plus one past its keys and
  // one with none visible where a request has the tokens for them.
  std::vector<int32_t> visible(static_cast<size_t>(tokens));
  for (size_t r = 0; r < request_count; ++r) {
    const int64_t count = shape.counts[r];
    for (int64_t i = 0; i < count; ++i) {
      int64_t v = std::max<int64_t>(0, shape.entries[r] - (count - 1 - i) * 3);
      if (count >= 3 && i == 0) v = shape.entries[r] + 3;
      if (count >= 3 && i == 1) v = 0;
      visible[static_cast<size_t>(offsets[r] + i)] = static_cast<int32_t>(v);
    }
  }
  if (!given_visible.empty()) {
    size_t given = 0;
    for (size_t r = 0; r < request_count; ++r) {
      for (int64_t i = 0; i < shape.counts[r]; ++i) {
        visible[static_cast<size_t>(offsets[r] + i)] = given_visible.at(given++);
      }
    }
  }
  Tensor q = indexer_input({tokens, shape.heads, shape.dim}, seed, shape.fp4);
  Tensor w = host_f32({tokens, shape.heads}, seed + 1);
  Tensor vis = host_i32({tokens}, visible);
  std::vector<KeyCachePair> keys;
  std::vector<IndexerRequest> host_requests, device_requests;
  for (size_t r = 0; r < request_count; ++r) {
    keys.push_back(key_cache_pair(shape.entries[r], shape.dim, seed + 2 + static_cast<uint32_t>(r),
                                  shape.key_magnitude));
    host_requests.push_back({keys.back().host.keys(), offsets[r], shape.counts[r]});
    device_requests.push_back({keys.back().device(), offsets[r], shape.counts[r]});
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(shape.dim));
  Tensor want = Tensor::empty(DType::kF32, {tokens, width});
  indexer_scores_batch(q, host_requests, w, vis, scale, want);
  Tensor dq = gpu(q), dw = gpu(w), dvis = gpu(vis);
  Tensor got = gpu_output(DType::kF32, {tokens, width});
  cuda::indexer_scores_batch(dq, device_requests, dw, dvis, scale, got);
  // Exact products (fp4 inputs), heads summed in another order: a few ulp of the scores' scale.
  // -inf placement (visible limits, columns past a request's keys) is compared exactly.
  expect_close(want, got, kRowReductionTolerance, shape.name + " indexer_scores_batch");
  if (shape.fp4 && shape.heads <= 2) {
    // At most two heads the GPU's sum order is the reference's: the same bits.
    expect_equal(want, got, shape.name + " indexer_scores_batch (<= 2 heads: exact)");
  }

  Tensor batched = rt::to_host(got);
  for (size_t r = 0; r < request_count; ++r) {
    const int64_t count = shape.counts[r];
    if (count == 0) continue;
    Tensor alone = gpu_output(DType::kF32, {count, width});
    const IndexerRequest request{keys[r].device(), 0, count};
    cuda::indexer_scores_batch(dq.view().narrow(0, offsets[r], count), {&request, 1},
                               dw.view().narrow(0, offsets[r], count),
                               dvis.view().narrow(0, offsets[r], count), scale, alone);
    Tensor alone_host = rt::to_host(alone);
    EXPECT_EQ(0, std::memcmp(alone_host.data<float>(), batched.data<float>() + offsets[r] * width,
                             static_cast<size_t>(count * width) * sizeof(float)))
        << shape.name << ": request " << r << " scored alone differs from the batched call";
  }
}

TEST_F(BackendOpsTest, IndexerScoresBatchSmallShapes) {
  // Key tiles of 256 and token runs of 64 crossed, several staging passes per run (double
  // buffered), heads padded to 16, empty requests; the FP32 per-request path for shapes the
  // tensor-core kernel is not built for.
  check_indexer_batch({"2 heads x 32", 2, 32, {1, 70, 0, 3}, {300, 40, 5, 0}, 7}, 70);
  check_indexer_batch({"20 heads x 64", 20, 64, {5, 1}, {257, 9}, 0}, 71);
  check_indexer_batch({"32 heads x 128", 32, 128, {130, 1}, {300, 600}, 0}, 75);
  check_indexer_batch({"64 heads x 128", 64, 128, {1, 9}, {513, 100}, 3}, 72);
  check_indexer_batch({"128 heads x 128 (fp32 path: > 64 heads)", 128, 128, {3}, {40}, 0}, 73);
  check_indexer_batch({"3 heads x 96 (fp32 path), q not fp4", 3, 96, {2, 1}, {30, 0}, 2, false},
                      74);
}

TEST_F(BackendOpsTest, IndexerScoresBatchRealShapes) {
  for (const ModelShapes& s : all_shapes()) {
    const bool tiny = s.name == "tiny";
    // Decode rows (one token against thousands of keys) next to a ~300-token prefill chunk.
    check_indexer_batch({s.name + " decode+prefill",
                         s.index_heads,
                         s.index_dim,
                         {1, tiny ? 40 : 300, 1, 0},
                         {tiny ? 30 : 4500, tiny ? 20 : 3000, tiny ? 9 : 2049, tiny ? 3 : 17},
                         0},
                        80);
  }
}

TEST_F(BackendOpsTest, IndexerScoresBatchInvarianceOff) {
  // Batch invariance off: single-token requests of <= 32 heads take the decode kernel (keys as
  // the MMA's M side, streamed), the others indexer_scores_mma_kernel in the same call. Against
  // the reference as above; a request alone gives its rows of the batched call bit for bit, and
  // at <= 2 heads the bits are the reference's. Visible limits inside a 16-key tile, at 0, past
  // the keys, and requests without keys; a width past every request's keys.
  const ScopedBatchInvariance off(false);
  check_indexer_batch({"32 heads x 128 decode",
                       32,
                       128,
                       {1, 1, 1, 1, 1, 1, 2},
                       {4500, 1, 17, 0, 300, 2049, 600},
                       13},
                      90, {4500, 1, 5, 3, 301, 0, 600, 598});
  check_indexer_batch({"20 heads x 64 decode", 20, 64, {1, 1, 1}, {257, 9, 40}, 0}, 91,
                      {250, 9, 41});
  check_indexer_batch({"2 heads x 32 decode", 2, 32, {1, 1, 3}, {300, 33, 70}, 5}, 92);
  check_indexer_batch(
      {"64 heads x 128 decode (> 32 heads: the MMA kernel)", 64, 128, {1, 1}, {513, 40}, 0}, 93);
  // Key scales far from 1 (the decode kernel folds 2^126 x scale into a bf16 factor: exact for
  // scales 2^-68 to 2^65, so 2^40 and 2^-60 keys score as the reference does).
  for (const float magnitude : {0x1p40f, 0x1p-60f}) {
    IndexerBatchShape shape{"32 heads x 128 decode, keys of magnitude " + std::to_string(magnitude),
                            32,
                            128,
                            {1, 1},
                            {700, 33},
                            0};
    shape.key_magnitude = magnitude;
    check_indexer_batch(shape, 95);
  }
  check_indexer_batch({"2 heads x 32", 2, 32, {1, 70, 0, 3}, {300, 40, 5, 0}, 7}, 70);
  check_indexer_batch({"32 heads x 128", 32, 128, {130, 1}, {300, 600}, 0}, 75);
  for (const ModelShapes& s : all_shapes()) {
    const bool tiny = s.name == "tiny";
    check_indexer_batch(
        {s.name + " decode+prefill",
         s.index_heads,
         s.index_dim,
         {1, tiny ? 40 : 300, 1, 0, 1},
         {tiny ? 30 : 4500, tiny ? 20 : 3000, tiny ? 9 : 2049, tiny ? 3 : 17, tiny ? 40 : 8192},
         0},
        94);
  }
}

// Scores with ties (values on a coarse grid) and -inf tails, for the selections.
Tensor selection_scores(int64_t rows, int64_t cols, uint32_t seed,
                        const std::vector<int32_t>& visible) {
  Tensor t = host_f32({rows, cols}, seed);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      float& v = t.data<float>()[r * cols + j];
      v = std::round(v * 8.0f) / 8.0f;  // many exact ties
      if (j % 97 == 5) v = -0.0f;
      if (j >= visible[static_cast<size_t>(r)]) v = -INFINITY;
    }
  }
  return t;
}

TEST_F(BackendOpsTest, CandidateBlocksMaskScoresAndTopK) {
  for (const ModelShapes& s : all_shapes()) {
    const int64_t cols = s.name == "tiny" ? 9 : 20000;
    std::vector<int32_t> visible = {static_cast<int32_t>(cols), static_cast<int32_t>(cols / 3), 0,
                                    static_cast<int32_t>(s.index_topk / 2), 7};
    visible.resize(static_cast<size_t>(s.rows));
    Tensor scores = selection_scores(s.rows, cols, 50, visible);
    Tensor vis = host_i32({s.rows}, visible);
    Tensor dscores = gpu(scores), dvis = gpu(vis);

    Tensor mask = Tensor::empty(DType::kI8, {s.rows, cols});
    candidate_blocks(scores, vis, s.candidate_topk_blocks, s.candidate_block_size, mask);
    Tensor dmask = gpu_output(DType::kI8, {s.rows, cols});
    cuda::candidate_blocks(dscores, dvis, s.candidate_topk_blocks, s.candidate_block_size, dmask);
    expect_equal(mask, dmask, s.name + " candidate_blocks");

    mask_scores(scores, mask);
    cuda::mask_scores(dscores, dmask);
    expect_equal(scores, dscores, s.name + " mask_scores");

    for (int k : {s.index_topk, 1}) {
      Tensor idx = Tensor::empty(DType::kI32, {s.rows, k});
      topk_indices(scores, k, idx);
      Tensor didx = gpu_output(DType::kI32, {s.rows, k});
      cuda::topk_indices(dscores, k, didx);
      expect_equal(idx, didx, s.name + " topk_indices k=" + std::to_string(k));
    }
  }
}

TEST_F(BackendOpsTest, TopKIndicesInvarianceOff) {
  // Batch invariance off: rows up to 32768 entries take the register kernel (4, 8, 16 or 32
  // entries a thread; float4 loads when the row allows them), and longer rows, or fewer than 64
  // rows of over 8192 entries, its two-pass chunked form (chunks of 4096 or more, wider for
  // k = 2048 at 100003 entries; the old kernel past what two passes hold: k = 20000 at 70000).
  // The indices must be the reference's: larger first, ties by lower index, -inf never kept, -1
  // past the kept ones.
  const ScopedBatchInvariance off(false);
  for (int64_t cols :
       {int64_t{9}, int64_t{1000}, int64_t{4096}, int64_t{8190}, int64_t{16384}, int64_t{20000},
        int64_t{30001}, int64_t{32768}, int64_t{32769}, int64_t{70000}, int64_t{100003}}) {
    for (const int64_t repeats : {int64_t{1}, int64_t{10}}) {  // 7 rows, then 70
      const int32_t c = static_cast<int32_t>(cols);
      std::vector<int32_t> visible;
      for (int64_t r = 0; r < repeats; ++r)
        visible.insert(visible.end(), {c, c / 3, 0, 256, 7, c, c - 1});
      const int64_t rows = static_cast<int64_t>(visible.size());
      Tensor scores = selection_scores(rows, cols, 51 + static_cast<uint32_t>(cols), visible);
      for (int64_t j = 0; j < cols; ++j) scores.data<float>()[5 * cols + j] = 0.25f;  // all ties
      // A row whose top entries tie across chunk edges: 0.5 everywhere but -inf every 3rd entry.
      for (int64_t j = 0; j < cols; ++j) {
        scores.data<float>()[6 * cols + j] = j % 3 == 0 ? -INFINITY : 0.5f;
      }
      Tensor dscores = gpu(scores);
      std::vector<int> ks = {512, 1, 2048};
      if (cols == 70000) ks.push_back(20000);
      for (int k : ks) {
        Tensor idx = Tensor::empty(DType::kI32, {rows, k});
        topk_indices(scores, k, idx);
        Tensor didx = gpu_output(DType::kI32, {rows, k});
        cuda::topk_indices(dscores, k, didx);
        expect_equal(idx, didx,
                     "topk_indices rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                         " k=" + std::to_string(k));
      }
    }
  }
}

// ---- hyper-connections ------------------------------------------------------------------------

TEST_F(BackendOpsTest, HyperConnectionMixesCollapseExpand) {
  for (const ModelShapes& s : all_shapes()) {
    const int hc = s.hc;
    const int64_t mixes = static_cast<int64_t>(2 + hc) * hc;
    Tensor x = host_f32({s.rows, hc, s.hidden}, 60);
    Tensor fn = host_f32({mixes, hc * s.hidden}, 61, 0.02f);
    Tensor scale = host_f32({3}, 62);
    Tensor base = host_f32({mixes}, 63);
    const HcParams params{hc, s.sinkhorn_iters, 1e-6f, 1e-6f};
    Tensor pre = Tensor::empty(DType::kF32, {s.rows, hc});
    Tensor post = Tensor::empty(DType::kF32, {s.rows, hc});
    Tensor comb = Tensor::empty(DType::kF32, {s.rows, hc, hc});
    hc_mixes(x, fn, scale, base, params, pre, post, comb);
    Tensor dx = gpu(x);
    const auto check_gpu_mixes = [&](const std::string& what) {
      Tensor dpre = gpu_output(DType::kF32, {s.rows, hc});
      Tensor dpost = gpu_output(DType::kF32, {s.rows, hc});
      Tensor dcomb = gpu_output(DType::kF32, {s.rows, hc, hc});
      cuda::hc_mixes(dx, gpu(fn), gpu(scale), gpu(base), params, dpre, dpost, dcomb);
      expect_close(pre, dpre, kRowReductionTolerance, s.name + " " + what + " pre");
      expect_close(post, dpost, kRowReductionTolerance, s.name + " " + what + " post");
      // Twenty Sinkhorn passes divide by sums of the mixes' rounding differences again and
      // again: the comb matrix keeps ~1e-5 of its scale.
      expect_close(comb, dcomb, 5e-5, s.name + " " + what + " comb");
    };
    check_gpu_mixes("hc_mixes");
    {  // hc_mix_partials_rows_kernel at every row count (the default takes it from 1024 rows)
      const deepinfer::cuda::ScopedSetting every_row_count{"DEEPINFER_HC_ROWS_MIN", 1};
      check_gpu_mixes("hc_mixes rows kernel");
    }
    {  // batch invariance off: the dots as one cuBLASLt FP32 GEMM (by default from 1024 rows)
      const ScopedBatchInvariance off(false);
      const deepinfer::cuda::ScopedSetting every_row_count{"DEEPINFER_CUBLASLT_MIN_ROWS", 1};
      const deepinfer::cuda::ScopedSetting gemm_rows{"DEEPINFER_HC_CUBLASLT_MIN_ROWS", 1};
      check_gpu_mixes("hc_mixes cuBLASLt");
    }

    // Collapse and expand take the CPU's mixes, so they are tested on their own.
    Tensor dpre_exact = gpu(pre), dpost_exact = gpu(post), dcomb_exact = gpu(comb);
    Tensor collapsed = Tensor::empty(DType::kF32, {s.rows, s.hidden});
    hc_collapse(x, pre, collapsed);
    Tensor dcollapsed = gpu_output(DType::kF32, {s.rows, s.hidden});
    cuda::hc_collapse(dx, dpre_exact, dcollapsed);
    expect_close(collapsed, dcollapsed, 1e-6, s.name + " hc_collapse");

    Tensor y = host_f32({s.rows, s.hidden}, 64);
    Tensor expanded = Tensor::empty(DType::kF32, {s.rows, hc, s.hidden});
    hc_expand(y, x, post, comb, expanded);
    Tensor dy = gpu(y);
    Tensor dexpanded = gpu_output(DType::kF32, {s.rows, hc, s.hidden});
    cuda::hc_expand(dy, dx, dpost_exact, dcomb_exact, dexpanded);
    expect_close(expanded, dexpanded, 1e-6, s.name + " hc_expand");
    cuda::hc_expand(dy, dx, dpost_exact, dcomb_exact, dx);  // out aliases the residual
    expect_close(expanded, dx, 1e-6, s.name + " hc_expand in place");
  }
}

// ---- mixture of experts -----------------------------------------------------------------------

TEST_F(BackendOpsTest, RouteAllScoreFunctions) {
  for (const ModelShapes& s : all_shapes()) {
    const int64_t rows = s.rows + 2;
    Tensor x = host_f32({rows, s.hidden}, 70);
    Tensor gate = host_bf16({s.experts, s.hidden}, 71, 0.03f);
    Tensor bias = host_f32({s.experts}, 72, 0.1f);
    for (ScoreFunction f :
         {ScoreFunction::kSqrtSoftplus, ScoreFunction::kSigmoid, ScoreFunction::kSoftmax}) {
      for (bool with_bias : {true, false}) {
        RouterParams params;
        params.score_function = f;
        params.top_k = s.top_k;
        params.routed_scale = 1.5f;
        Tensor weights = Tensor::empty(DType::kF32, {rows, s.top_k});
        Tensor experts = Tensor::empty(DType::kI32, {rows, s.top_k});
        route(x, gate, with_bias ? bias.view() : TensorView(), params, weights, experts);
        Tensor dbias = gpu(bias);
        Tensor dweights = gpu_output(DType::kF32, {rows, s.top_k});
        Tensor dexperts = gpu_output(DType::kI32, {rows, s.top_k});
        cuda::route(gpu(x), gpu(gate), with_bias ? dbias.view() : TensorView(), params, dweights,
                    dexperts);
        const std::string what = s.name + " route f=" + std::to_string(static_cast<int>(f)) +
                                 (with_bias ? " biased" : "");
        // The logits come from linear (kLinearTolerance); the chosen experts must be identical
        // (random gates leave no near-ties at the top for these seeds).
        expect_equal(experts, dexperts, what + " experts");
        expect_close(weights, dweights, kLinearTolerance, what + " weights");
      }
    }
  }
}

TEST_F(BackendOpsTest, SwigluClampedWeightedInPlace) {
  for (const ModelShapes& s : all_shapes()) {
    Tensor g = host_f32({s.rows, s.moe_intermediate}, 80, 8.0f);
    Tensor u = host_f32({s.rows, s.moe_intermediate}, 81, 8.0f);
    Tensor rw = host_f32({s.rows}, 82);
    for (float limit : {0.0f, 10.0f}) {
      for (bool weighted : {false, true}) {
        Tensor want = Tensor::empty(DType::kF32, {s.rows, s.moe_intermediate});
        swiglu(g, u, limit, weighted ? rw.view() : TensorView(), want);
        Tensor dg = gpu(g), du = gpu(u), drw = gpu(rw);
        cuda::swiglu(dg, du, limit, weighted ? drw.view() : TensorView(), dg);  // out aliases gate
        // expf differs by <= 2 ulp; nothing is summed.
        expect_close(want, dg, 1e-6, s.name + " swiglu");
      }
    }
  }
}

// ---- engram -------------------------------------------------------------------------------------

TEST_F(BackendOpsTest, EngramGatherAllTableFormats) {
  for (const ModelShapes& s : all_shapes()) {
    const int64_t table_rows = 4096;
    const int64_t dim = s.engram_dim;
    std::vector<int32_t> ids;
    std::mt19937 rng(90);
    for (int64_t i = 0; i < s.rows * s.engram_columns; ++i)
      ids.push_back(static_cast<int32_t>(rng() % table_rows));
    Tensor ids32 = host_i32({s.rows, s.engram_columns}, ids);
    Tensor ids64 = Tensor::empty(DType::kI64, {s.rows, s.engram_columns});
    for (size_t i = 0; i < ids.size(); ++i) ids64.data<int64_t>()[i] = ids[i];
    struct Table {
      Tensor values, scale;
    };
    std::vector<Table> tables;
    tables.push_back({host_f32({table_rows, dim}, 91), Tensor()});
    tables.push_back({host_bf16({table_rows, dim}, 92), Tensor()});
    tables.push_back({host_bytes(DType::kF8E4M3, {table_rows, dim}, 93, 0, 255, true),
                      host_bytes(DType::kF8E8M0, {table_rows, dim / 32}, 94, 120, 130)});
    for (Table& table : tables) {
      Tensor dtable = gpu(table.values);
      Tensor dscale = table.scale.numel() ? gpu(table.scale) : Tensor();
      for (const Tensor* id : {&ids32, &ids64}) {
        Tensor want = Tensor::empty(DType::kF32, {s.rows, s.engram_columns * dim});
        engram_gather(table.values, table.scale.view(), *id, want);
        Tensor got = gpu_output(DType::kF32, {s.rows, s.engram_columns * dim});
        cuda::engram_gather(dtable, dscale.view(), gpu(*id), got);
        expect_equal(want, got,
                     s.name + " engram_gather " + std::string(dtype_name(table.values.dtype())));
      }
    }
  }
}

TEST_F(BackendOpsTest, EngramMixInPlace) {
  for (const ModelShapes& s : all_shapes()) {
    Tensor x = host_f32({s.rows, s.hc, s.hidden}, 100);
    Tensor key = host_f32({s.rows, s.hc, s.hidden}, 101);
    Tensor value = host_f32({s.rows, s.hidden}, 102);
    Tensor qk = host_f32({s.hc, s.hidden}, 103);
    Tensor want = Tensor::empty(DType::kF32, {s.rows, s.hc, s.hidden});
    engram_mix(x, key, value, qk, 1e-6f, want);
    Tensor dx = gpu(x);
    cuda::engram_mix(dx, gpu(key), gpu(value), gpu(qk), 1e-6f, dx);
    expect_close(want, dx, kRowReductionTolerance, s.name + " engram_mix");
  }
}

TEST_F(BackendOpsTest, PublicOpsRunTheBackendOfTheirTensors) {
  // ops::linear / ops::route on device views run the CUDA kernels (same bits as calling them
  // directly); on host views they run the CPU reference.
  Tensor x = host_f32({3, 64}, 120);
  Tensor w = host_bf16({8, 64}, 121);
  Tensor dx = gpu(x), dw = gpu(w);
  Tensor direct = gpu_output(DType::kF32, {3, 8});
  Tensor dispatched = gpu_output(DType::kF32, {3, 8});
  cuda::linear(dx, LinearWeight{dw, TensorView()}, direct);
  ops::linear(dx, LinearWeight{dw, TensorView()}, dispatched);
  expect_equal(rt::to_host(direct), dispatched, "dispatched linear");
  Tensor host_out = Tensor::empty(DType::kF32, {3, 8});
  ops::linear(x, LinearWeight{w, TensorView()}, host_out);
  expect_close(host_out, dispatched, kLinearTolerance, "host linear vs device");
  Tensor weights = gpu_output(DType::kF32, {3, 2});
  Tensor experts = gpu_output(DType::kI32, {3, 2});
  RouterParams params;
  params.top_k = 2;
  ops::route(dx, dw, TensorView(), params, weights, experts);
  Tensor cpu_weights = Tensor::empty(DType::kF32, {3, 2});
  Tensor cpu_experts = Tensor::empty(DType::kI32, {3, 2});
  ops::route(x, w, TensorView(), params, cpu_weights, cpu_experts);
  expect_equal(cpu_experts, experts, "dispatched route experts");
}

TEST_F(BackendOpsTest, CopiesRoundTripStridedRowsAndStreams) {
  Tensor x = host_f32({6, 10}, 110);
  Tensor dx = gpu(x);
  rt::Stream stream;
  rt::StreamScope scope(stream);
  // A column slice of a device matrix into a dense host tensor and back into a slice.
  Tensor slice = rt::to_host(dx.view().narrow(1, 2, 5));
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(slice.at<float>(r, c), x.at<float>(r, 2 + c));
  }
  Tensor other = gpu_output(DType::kF32, {6, 10});
  rt::copy(dx, other);
  rt::copy(slice, other.view().narrow(1, 0, 5));
  Tensor back = rt::to_host(other);
  for (int64_t r = 0; r < 6; ++r) {
    for (int64_t c = 0; c < 10; ++c) {
      EXPECT_EQ(back.at<float>(r, c), c < 5 ? x.at<float>(r, 2 + c) : x.at<float>(r, c));
    }
  }
  EXPECT_THROW(rt::copy(x, gpu_output(DType::kF32, {6, 9})), Error);
  // Arena over device memory: the per-step activation scratch.
  Arena arena(rt::device_allocator(), 1 << 20, "device scratch");
  TensorView a = arena_tensor(arena, DType::kF32, {16, 16});
  EXPECT_TRUE(a.device().is_cuda());
  rt::copy(host_f32({16, 16}, 111), a);
  rt::synchronize();
}

// ---- glue ops of the forward -------------------------------------------------------------------

TEST_F(BackendOpsTest, GlueCopyFillScaleAddAreExact) {
  for (const ModelShapes& s : all_shapes()) {
    // One stream of [M, hc, D] written from a dense [M, D] (the embedding's replication), a
    // column of [M, hc] filled (the one-hot first pre mix), rows scaled and added.
    Tensor x = host_f32({s.rows, s.hidden}, 120);
    Tensor streams = host_f32({s.rows, s.hc, s.hidden}, 121);
    Tensor dstreams = gpu(streams);
    for (int64_t k = 0; k < s.hc; ++k) {
      ops::copy(x, streams.view().select(1, k));
      ops::copy(gpu(x), dstreams.view().select(1, k));
    }
    expect_equal(streams, dstreams, s.name + " copy into streams");
    Tensor mix = host_f32({s.rows, s.hc}, 122);
    Tensor dmix = gpu(mix);
    for (const TensorView& m : {mix.view(), dmix.view()}) {
      ops::fill(m, 0.0f);
      ops::fill(m.narrow(1, 0, 1), 1.0f);
    }
    expect_equal(mix, dmix, s.name + " fill");
    Tensor y = host_f32({s.rows, s.hidden}, 123);
    Tensor dx = gpu(x), dy = gpu(y);
    ops::scale(x, 0.125f + 1e-3f, x);
    cuda::scale(dx, 0.125f + 1e-3f, dx);
    expect_equal(x, dx, s.name + " scale in place");
    Tensor sum = Tensor::empty(DType::kF32, {s.rows, s.hidden});
    ops::add(x, y, sum);
    Tensor dsum = gpu_output(DType::kF32, {s.rows, s.hidden});
    cuda::add(dx, dy, dsum);
    expect_equal(sum, dsum, s.name + " add");
    cuda::add(dx, dy, dy);  // out aliases an input
    expect_equal(sum, dy, s.name + " add in place");
  }
}

// Distinct random experts per token, and routing weights.
void random_routing(int64_t tokens, int64_t experts, int k, uint32_t seed, Tensor& chosen,
                    Tensor& weights) {
  std::mt19937 rng(seed);
  chosen = Tensor::empty(DType::kI32, {tokens, k});
  weights = host_f32({tokens, k}, seed + 1);
  std::vector<int32_t> ids(static_cast<size_t>(experts));
  for (int64_t t = 0; t < tokens; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int s = 0; s < k; ++s) chosen.at<int32_t>(t, s) = ids[static_cast<size_t>(s)];
  }
}

TEST_F(BackendOpsTest, MoeExpertsGroupsOnTheDeviceAndCombinesInExpertOrder) {
  for (const ModelShapes& s : all_shapes()) {
    // Tiny: 40 tokens over at most 16 experts, so groups hold several rows and some are empty.
    // Real shapes: top_k + 2 of the 384 experts (every expert's weights are the same shape; the
    // CPU side of 384 would take minutes) and 4 tokens.
    const bool tiny = s.name == "tiny";
    const int64_t experts = tiny ? std::min<int64_t>(s.experts, 16) : s.top_k + 2;
    const int64_t tokens = tiny ? 40 : 4;
    const int64_t dim = s.hidden, inter = s.moe_intermediate;
    Tensor chosen, weights;
    random_routing(tokens, experts, s.top_k, 130, chosen, weights);
    Tensor x = host_f32({tokens, dim}, 131);
    for (const char* format : {"f32", "fp4"}) {
      const bool fp4 = std::string(format) == "fp4";
      std::vector<Tensor> host_storage, device_storage;
      std::vector<ExpertWeights> host_experts, device_experts;
      host_storage.reserve(static_cast<size_t>(experts) * 6);
      device_storage.reserve(static_cast<size_t>(experts) * 6);
      const auto make = [&](int64_t out, int64_t in, uint32_t seed, LinearWeight& host,
                            LinearWeight& device) {
        if (fp4) {
          host_storage.push_back(host_bytes(DType::kF4E2M1x2, {out, in}, seed));
          host_storage.push_back(host_bytes(DType::kF8E8M0, {out, in / 32}, seed + 1, 117, 121));
        } else {
          host_storage.push_back(host_f32({out, in}, seed, 0.05f));
          host_storage.push_back(Tensor());
        }
        const Tensor& w = host_storage[host_storage.size() - 2];
        const Tensor& sc = host_storage.back();
        device_storage.push_back(gpu(w));
        device_storage.push_back(sc.numel() ? gpu(sc) : Tensor());
        host = LinearWeight{w.view(), sc.view()};
        device = LinearWeight{device_storage[device_storage.size() - 2].view(),
                              device_storage.back().view()};
      };
      host_experts.resize(static_cast<size_t>(experts));
      device_experts.resize(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) {
        const uint32_t seed = 200 + 10 * static_cast<uint32_t>(e);
        ExpertWeights& h = host_experts[static_cast<size_t>(e)];
        ExpertWeights& d = device_experts[static_cast<size_t>(e)];
        make(inter, dim, seed, h.w1, d.w1);
        make(inter, dim, seed + 3, h.w3, d.w3);
        make(dim, inter, seed + 6, h.w2, d.w2);
      }
      for (ActivationQuant quant : {ActivationQuant::kNone, ActivationQuant::kFp8PerBlock32}) {
        const std::string what =
            s.name + " moe_experts " + format + (quant == ActivationQuant::kNone ? "" : " fp8-act");
        Tensor want = Tensor::empty(DType::kF32, {tokens, dim});
        ops::moe_experts(x, chosen, weights, host_experts, 10.0f, quant, want);
        Tensor got = gpu_output(DType::kF32, {tokens, dim});
        ops::moe_experts(gpu(x), gpu(chosen), gpu(weights), device_experts, 10.0f, quant, got);
        // Three chained linears (each 2e-5: summation order). With fp8 activations the
        // intermediate's quantizer can round a value the two backends computed a few ulp apart
        // to neighbouring e4m3 codes (one code = 1/16 of the value), which moves the down
        // projection by up to ~1e-3 of its scale.
        expect_close(want, got, quant == ActivationQuant::kNone ? 1e-4 : 2e-3, what);
      }
    }
  }
}

TEST_F(BackendOpsTest, MoeExpertsReportsABadExpertIdAtSynchronize) {
  const int64_t dim = 32, inter = 64;
  std::vector<Tensor> storage;
  std::vector<ExpertWeights> experts(2);
  for (ExpertWeights& e : experts) {
    for (auto [weight, out, in] : {std::tuple{&e.w1, inter, dim}, std::tuple{&e.w3, inter, dim},
                                   std::tuple{&e.w2, dim, inter}}) {
      storage.push_back(gpu(host_f32({out, in}, 140)));
      *weight = LinearWeight{storage.back().view(), TensorView()};
    }
  }
  Tensor chosen = host_i32({2, 2}, {0, 1, 1, 2});  // expert 2 does not exist
  Tensor weights = host_f32({2, 2}, 141);
  Tensor out = gpu_output(DType::kF32, {2, dim});
  ops::moe_experts(gpu(host_f32({2, dim}, 142)), gpu(chosen), gpu(weights), experts, 0.0f,
                   ActivationQuant::kNone, out);
  EXPECT_THROW(rt::synchronize(), Error);
  rt::synchronize();  // reported once
}

// ---- the small ops' fast paths: the same bits as the kernels they replace -------------------
//
// Each fast path has a switch (DEEPINFER_<NAME>=0: the previous kernel). These cases run both
// on the same inputs at 1, 16 and 256 rows and require equal bits (the fast paths keep the old
// reduction orders). *SmallShapes: a few narrow shapes (the compute-sanitizer runs); *RealShapes:
// V4.1-Flash widths.

// Run-time switches turned off for a scope, restored however the scope ends.
class ScopedSwitches {
 public:
  explicit ScopedSwitches(const std::vector<const char*>& names) {
    for (const char* name : names) off_.emplace_back(name, false);
  }

 private:
  std::deque<deepinfer::cuda::ScopedSwitch> off_;
};

// Device outputs as one vector (Tensor moves only; an initializer list would copy).
template <typename... Outputs>
std::vector<Tensor> outputs_of(Outputs&&... outputs) {
  std::vector<Tensor> all;
  (all.push_back(std::move(outputs)), ...);
  return all;
}

// Runs `op` (writing device outputs, returned) with every path on, then with each set of
// switches off, and requires the same bytes from all of them.
void expect_same_bits_with_switches(const std::function<std::vector<Tensor>()>& op,
                                    const std::vector<std::vector<const char*>>& switch_sets,
                                    const std::string& what) {
  std::vector<Tensor> fast;
  for (const Tensor& t : op()) fast.push_back(rt::to_host(t));
  for (const auto& set : switch_sets) {
    std::vector<Tensor> old;
    {
      ScopedSwitches off(set);
      old = op();
    }
    ASSERT_EQ(fast.size(), old.size()) << what;
    std::string names;
    for (const char* name : set) names += std::string(" ") + name + "=0";
    for (size_t i = 0; i < fast.size(); ++i) {
      expect_equal(fast[i], old[i], what + " output " + std::to_string(i) + " vs" + names);
    }
  }
}

constexpr int64_t kSwitchRowCounts[] = {1, 16, 256};

void rmsnorm_fast_vs_old(int64_t cols, const std::string& what) {
  for (const int64_t rows : kSwitchRowCounts) {
    Tensor dx = gpu(host_f32({rows, cols}, 300 + static_cast<uint32_t>(cols), 3.0f));
    for (int kind = 0; kind < 3; ++kind) {
      Tensor weight = kind == 0 ? Tensor() : kind == 1 ? host_f32({cols}, 4) : host_bf16({cols}, 4);
      Tensor dweight = weight.numel() ? gpu(weight) : Tensor();
      expect_same_bits_with_switches(
          [&] {
            Tensor out = gpu_output(DType::kF32, {rows, cols});
            cuda::rmsnorm(dx, dweight.view(), 1e-6f, out);
            Tensor in_place = rt::to_device(rt::to_host(dx));
            cuda::rmsnorm(in_place, dweight.view(), 1e-6f, in_place);  // out aliases x
            return outputs_of(out, in_place);
          },
          {{"DEEPINFER_RMSNORM_REGISTERS"}},
          what + " rmsnorm " + std::to_string(rows) + "x" + std::to_string(cols) + " weight " +
              std::to_string(kind));
    }
  }
}

TEST_F(BackendOpsTest, RmsnormRegistersMatchOldBitsSmallShapes) {
  for (const int64_t cols : {1, 7, 64, 300, 1000, 4100}) rmsnorm_fast_vs_old(cols, "small");
}

TEST_F(BackendOpsTest, RmsnormRegistersMatchOldBitsRealShapes) {
  if (tiny_shapes_only()) GTEST_SKIP() << "model widths: not under BACKEND_OPS_TINY_ONLY";
  // hidden, q_lora, head_dim, index head_dim; hc * hidden takes the old kernel (wider than 8192).
  for (const int64_t cols : {5120, 1280, 512, 128, 8192, 20480}) rmsnorm_fast_vs_old(cols, "real");
}

// Rows a prefill of 8192 tokens gives, less two: hc_mix_partials_rows_kernel's last tile and
// chunk are partial.
constexpr int64_t kPrefillRows = 8190;

void hc_mixes_fast_vs_old(int hc, int64_t hidden, int sinkhorn_iters, const std::string& what,
                          bool prefill_rows = false) {
  const int64_t mixes = static_cast<int64_t>(2 + hc) * hc;
  Tensor fn = gpu(host_f32({mixes, hc * hidden}, 61, 0.02f));
  Tensor scale = gpu(host_f32({3}, 62));
  Tensor base = gpu(host_f32({mixes}, 63));
  const HcParams params{hc, sinkhorn_iters, 1e-6f, 1e-6f};
  std::vector<int64_t> row_counts(std::begin(kSwitchRowCounts), std::end(kSwitchRowCounts));
  if (prefill_rows) row_counts.push_back(kPrefillRows);
  for (const int64_t rows : row_counts) {
    Tensor dx = gpu(host_f32({rows, hc, hidden}, 60));
    const auto op = [&] {
      Tensor pre = gpu_output(DType::kF32, {rows, hc});
      Tensor post = gpu_output(DType::kF32, {rows, hc});
      Tensor comb = gpu_output(DType::kF32, {rows, hc, hc});
      cuda::hc_mixes(dx, fn, scale, base, params, pre, post, comb);
      return outputs_of(pre, post, comb);
    };
    const std::string name = what + " hc_mixes hc " + std::to_string(hc) + " rows " +
                             std::to_string(rows) + " hidden " + std::to_string(hidden);
    // The default choice by rows (DEEPINFER_HC_ROWS_MIN), then the rows kernel at every row
    // count with either tile: the old kernels' bits each time.
    expect_same_bits_with_switches(
        op,
        {{"DEEPINFER_HC_ROWS"},
         {"DEEPINFER_HC_ROWS", "DEEPINFER_HC_PRELOAD"},
         {"DEEPINFER_HC_WARP_FINISH"},
         {"DEEPINFER_HC_ROWS", "DEEPINFER_HC_PRELOAD", "DEEPINFER_HC_WARP_FINISH"}},
        name);
    for (const int tile : {2, 4}) {
      const deepinfer::cuda::ScopedSetting every_row_count{"DEEPINFER_HC_ROWS_MIN", 1};
      const deepinfer::cuda::ScopedSetting rows_a_warp{"DEEPINFER_HC_ROWS_TILE", tile};
      expect_same_bits_with_switches(op,
                                     {{"DEEPINFER_HC_ROWS"},
                                      {"DEEPINFER_HC_ROWS", "DEEPINFER_HC_PRELOAD"},
                                      {"DEEPINFER_HC_ROWS", "DEEPINFER_HC_WARP_FINISH"}},
                                     name + " rows kernel tile " + std::to_string(tile));
    }
  }
}

TEST_F(BackendOpsTest, HcMixesFastPathsMatchOldBitsSmallShapes) {
  hc_mixes_fast_vs_old(4, 64, 20, "small");
  hc_mixes_fast_vs_old(4, 300, 3, "small");  // a partial last slice
  hc_mixes_fast_vs_old(2, 520, 1, "small");
  hc_mixes_fast_vs_old(6, 64, 5, "small");  // 49 mixes and squares: the block finish
}

TEST_F(BackendOpsTest, HcMixesFastPathsMatchOldBitsRealShapes) {
  if (tiny_shapes_only()) GTEST_SKIP() << "model widths: not under BACKEND_OPS_TINY_ONLY";
  hc_mixes_fast_vs_old(4, 5120, 20, "real", /*prefill_rows=*/true);
}

// Batch invariance off at V4.1's width: the cuBLASLt FP32 GEMM path against the slice kernels
// (which HyperConnectionMixesCollapseExpand holds to the CPU), at the threshold, a decode batch of
// 256 and a prefill: other sums' order, the same bounds as against the CPU.
TEST_F(BackendOpsTest, HcMixesCublasLtWithinBoundsRealShapes) {
  if (tiny_shapes_only()) GTEST_SKIP() << "model widths: not under BACKEND_OPS_TINY_ONLY";
  constexpr int hc = 4;
  constexpr int64_t hidden = 5120;
  const int64_t mixes = static_cast<int64_t>(2 + hc) * hc;
  Tensor fn = gpu(host_f32({mixes, hc * hidden}, 61, 0.02f));
  Tensor scale = gpu(host_f32({3}, 62));
  Tensor base = gpu(host_f32({mixes}, 63));
  const HcParams params{hc, 20, 1e-6f, 1e-6f};
  for (const int64_t rows : {int64_t{65}, int64_t{256}, kPrefillRows}) {
    Tensor dx = gpu(host_f32({rows, hc, hidden}, 60));
    const auto op = [&](bool invariant) {
      const ScopedBatchInvariance policy(invariant);
      const deepinfer::cuda::ScopedSetting gemm_rows{"DEEPINFER_HC_CUBLASLT_MIN_ROWS", 1};
      Tensor pre = gpu_output(DType::kF32, {rows, hc});
      Tensor post = gpu_output(DType::kF32, {rows, hc});
      Tensor comb = gpu_output(DType::kF32, {rows, hc, hc});
      cuda::hc_mixes(dx, fn, scale, base, params, pre, post, comb);
      rt::synchronize();
      return outputs_of(rt::to_host(pre), rt::to_host(post), rt::to_host(comb));
    };
    const std::vector<Tensor> slices = op(true);
    const std::vector<Tensor> gemm = op(false);
    const std::string name = "hc_mixes cuBLASLt rows " + std::to_string(rows);
    expect_close(slices[0], gpu(gemm[0]), kRowReductionTolerance, name + " pre");
    expect_close(slices[1], gpu(gemm[1]), kRowReductionTolerance, name + " post");
    expect_close(slices[2], gpu(gemm[2]), 5e-5, name + " comb");
  }
}

// hc_collapse_vec_kernel and hc_expand_vec_kernel (also in place) against a thread per channel.
void hc_collapse_expand_fast_vs_old(int hc, int64_t hidden, const std::string& what,
                                    bool prefill_rows = false) {
  std::vector<int64_t> row_counts(std::begin(kSwitchRowCounts), std::end(kSwitchRowCounts));
  if (prefill_rows) row_counts.push_back(kPrefillRows);
  for (const int64_t rows : row_counts) {
    Tensor x = host_f32({rows, hc, hidden}, 70);
    Tensor dx = gpu(x);
    Tensor dy = gpu(host_f32({rows, hidden}, 71));
    Tensor dpre = gpu(host_f32({rows, hc}, 72));
    Tensor dpost = gpu(host_f32({rows, hc}, 73));
    Tensor dcomb = gpu(host_f32({rows, hc, hc}, 74));
    expect_same_bits_with_switches(
        [&] {
          Tensor collapsed = gpu_output(DType::kF32, {rows, hidden});
          cuda::hc_collapse(dx, dpre, collapsed);
          Tensor expanded = gpu_output(DType::kF32, {rows, hc, hidden});
          cuda::hc_expand(dy, dx, dpost, dcomb, expanded);
          Tensor in_place = gpu(x);
          cuda::hc_expand(dy, in_place, dpost, dcomb, in_place);  // out aliases the residual
          return outputs_of(collapsed, expanded, in_place);
        },
        {{"DEEPINFER_HC_COLLAPSE_VEC", "DEEPINFER_HC_EXPAND_VEC"}},
        what + " hc_collapse/hc_expand hc " + std::to_string(hc) + " rows " + std::to_string(rows) +
            " hidden " + std::to_string(hidden));
  }
}

TEST_F(BackendOpsTest, HcCollapseExpandVectorsMatchOldBitsSmallShapes) {
  hc_collapse_expand_fast_vs_old(4, 64, "small");
  hc_collapse_expand_fast_vs_old(2, 300, "small");
  hc_collapse_expand_fast_vs_old(1, 8, "small");
  hc_collapse_expand_fast_vs_old(8, 36, "small");
  hc_collapse_expand_fast_vs_old(3, 64, "small");  // no vector kernel: the old one both times
  hc_collapse_expand_fast_vs_old(4, 30, "small");  // 30 channels: not float4 rows
}

TEST_F(BackendOpsTest, HcCollapseExpandVectorsMatchOldBitsRealShapes) {
  if (tiny_shapes_only()) GTEST_SKIP() << "model widths: not under BACKEND_OPS_TINY_ONLY";
  hc_collapse_expand_fast_vs_old(4, 5120, "real", /*prefill_rows=*/true);
}

void topk_fast_vs_old(int64_t cols, int k, const std::string& what) {
  for (const int64_t rows : kSwitchRowCounts) {
    // Row r sees a varying prefix: all, a third, none, fewer than k, 7.
    std::vector<int32_t> visible(static_cast<size_t>(rows));
    const int32_t pattern[] = {static_cast<int32_t>(cols), static_cast<int32_t>(cols / 3), 0,
                               std::max(0, k / 2), 7};
    for (int64_t r = 0; r < rows; ++r) visible[static_cast<size_t>(r)] = pattern[r % 5];
    Tensor dscores = gpu(selection_scores(rows, cols, 51 + static_cast<uint32_t>(cols), visible));
    expect_same_bits_with_switches(
        [&] {
          Tensor idx = gpu_output(DType::kI32, {rows, k});
          cuda::topk_indices(dscores, k, idx);
          return outputs_of(idx);
        },
        {{"DEEPINFER_TOPK_SHARED"}},
        what + " topk_indices " + std::to_string(rows) + "x" + std::to_string(cols) +
            " k=" + std::to_string(k));
  }
}

TEST_F(BackendOpsTest, TopkIndicesSharedMatchesOldSmallShapes) {
  for (const int64_t cols : {1, 9, 300, 1001}) {
    for (const int k : {1, 5, 64}) topk_fast_vs_old(cols, k, "small");
  }
}

TEST_F(BackendOpsTest, TopkIndicesSharedMatchesOldRealShapes) {
  if (tiny_shapes_only()) GTEST_SKIP() << "model widths: not under BACKEND_OPS_TINY_ONLY";
  // index_topk 512 of the 2048 and 8192 candidates; 16384 is the largest shared row.
  for (const int64_t cols : {2048, 8192, 16384}) {
    for (const int k : {512, 1}) topk_fast_vs_old(cols, k, "real");
  }
}

void route_fast_vs_old(int64_t hidden, int64_t experts, int top_k, const std::string& what) {
  Tensor gate = gpu(host_bf16({experts, hidden}, 71, 0.03f));
  Tensor bias = gpu(host_f32({experts}, 72, 0.1f));
  for (const int64_t rows : kSwitchRowCounts) {
    Tensor dx = gpu(host_f32({rows, hidden}, 70));
    for (ScoreFunction f :
         {ScoreFunction::kSqrtSoftplus, ScoreFunction::kSigmoid, ScoreFunction::kSoftmax}) {
      for (bool with_bias : {true, false}) {
        RouterParams params;
        params.score_function = f;
        params.top_k = top_k;
        params.routed_scale = 1.5f;
        expect_same_bits_with_switches(
            [&] {
              Tensor weights = gpu_output(DType::kF32, {rows, top_k});
              Tensor chosen = gpu_output(DType::kI32, {rows, top_k});
              cuda::route(dx, gate, with_bias ? bias.view() : TensorView(), params, weights,
                          chosen);
              return outputs_of(weights, chosen);
            },
            {{"DEEPINFER_ROUTE_WARP_SELECT"}},
            what + " route " + std::to_string(rows) + " rows, " + std::to_string(experts) +
                " experts, f=" + std::to_string(static_cast<int>(f)) +
                (with_bias ? " biased" : ""));
      }
    }
  }
}

TEST_F(BackendOpsTest, RouteWarpSelectMatchesOldBitsSmallShapes) {
  route_fast_vs_old(64, 16, 3, "small");
  route_fast_vs_old(64, 40, 1, "small");
  route_fast_vs_old(32, 300, 8, "small");
}

TEST_F(BackendOpsTest, RouteWarpSelectMatchesOldBitsRealShapes) {
  if (tiny_shapes_only()) GTEST_SKIP() << "model widths: not under BACKEND_OPS_TINY_ONLY";
  route_fast_vs_old(5120, 384, 6, "real");
}

// moe_experts end to end (the combine is its last kernel), with top_k + 2 experts.
void combine_fast_vs_old(int64_t dim, int64_t inter, int top_k, bool fp4, const std::string& what) {
  const int64_t experts = top_k + 2;
  std::vector<Tensor> storage;
  std::vector<ExpertWeights> device_experts(static_cast<size_t>(experts));
  const auto make = [&](int64_t out, int64_t in, uint32_t seed, LinearWeight& device) {
    if (fp4) {
      storage.push_back(gpu(host_bytes(DType::kF4E2M1x2, {out, in}, seed)));
      storage.push_back(gpu(host_bytes(DType::kF8E8M0, {out, in / 32}, seed + 1, 117, 121)));
      device = LinearWeight{storage[storage.size() - 2].view(), storage.back().view()};
    } else {
      storage.push_back(gpu(host_f32({out, in}, seed, 0.05f)));
      device = LinearWeight{storage.back().view(), TensorView()};
    }
  };
  storage.reserve(static_cast<size_t>(experts) * 6);
  for (int64_t e = 0; e < experts; ++e) {
    const uint32_t seed = 400 + 10 * static_cast<uint32_t>(e);
    ExpertWeights& d = device_experts[static_cast<size_t>(e)];
    make(inter, dim, seed, d.w1);
    make(inter, dim, seed + 3, d.w3);
    make(dim, inter, seed + 6, d.w2);
  }
  for (const int64_t tokens : kSwitchRowCounts) {
    Tensor chosen, weights;
    random_routing(tokens, experts, top_k, 150, chosen, weights);
    Tensor dx = gpu(host_f32({tokens, dim}, 151));
    Tensor dchosen = gpu(chosen), dweights = gpu(weights);
    for (ActivationQuant quant : {ActivationQuant::kNone, ActivationQuant::kFp8PerBlock32}) {
      expect_same_bits_with_switches(
          [&] {
            Tensor out = gpu_output(DType::kF32, {tokens, dim});
            ops::moe_experts(dx, dchosen, dweights, device_experts, 10.0f, quant, out);
            return outputs_of(out);
          },
          {{"DEEPINFER_MOE_COMBINE_COLUMNS"}},
          what + " moe combine " + std::to_string(tokens) + " tokens, dim " + std::to_string(dim) +
              (fp4 ? " fp4" : " f32") + (quant == ActivationQuant::kNone ? "" : " fp8-act"));
    }
  }
}

TEST_F(BackendOpsTest, MoeCombineColumnsMatchOldBitsSmallShapes) {
  combine_fast_vs_old(64, 32, 3, false, "small");
  combine_fast_vs_old(34, 32, 2, false, "small");    // dim % 4 != 0: the old kernel both times
  combine_fast_vs_old(1000, 64, 9, false, "small");  // 9 slots: the old kernel
}

TEST_F(BackendOpsTest, MoeCombineColumnsMatchOldBitsRealShapes) {
  if (tiny_shapes_only()) GTEST_SKIP() << "model widths: not under BACKEND_OPS_TINY_ONLY";
  combine_fast_vs_old(5120, 2304, 6, true, "real");  // V4.1: hidden, moe_intermediate, top-6
}

}  // namespace
}  // namespace deepinfer::ops
