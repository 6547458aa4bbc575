// Golden logits (docs/GOLDEN.md): for every fixture config, both numerics against their oracle
// (dense on the HF checkpoint vs HF DeepseekV41ForCausalLM; released numerics on the released
// checkpoint vs DeepSeek's reference with fp32 activations), in prefill, chunked and decode
// modes. Rule: |ours - ref| <= 1e-3 * max|ref| everywhere, and the argmax matches wherever the
// reference's top-two margin exceeds that tolerance. Skips while the fixtures are absent.
// Dense-only fixtures (no logits_ref_fp32act.safetensors: full-strength weights, where only the
// dense comparison is well-posed, docs/GOLDEN.md) compare the dense path with HF in every mode and
// check the released path only for agreement between its modes.
// BothNumericsAllModesOnGpu runs the same comparison with the weights and state on GPU 0
// (skips without one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_support.h"
#include "io/safetensors.h"
#include "model/deepseek_v41/loader.h"
#include "model/deepseek_v41/model.h"

namespace deepinfer::deepseek_v41 {
namespace {

namespace fs = std::filesystem;

const fs::path kGoldenDir = fs::path(DEEPINFER_SOURCE_DIR) / "tests/data/golden";

std::vector<std::vector<int32_t>> read_tokens(const fs::path& path) {
  std::ifstream file(path);
  std::vector<std::vector<int32_t>> requests;
  std::string line;
  while (std::getline(file, line)) {
    std::istringstream words(line);
    std::vector<int32_t> ids;
    int32_t id;
    while (words >> id) ids.push_back(id);
    if (!ids.empty()) requests.push_back(ids);
  }
  return requests;
}

std::vector<float> run(const LoadedModel& loaded, Numerics numerics,
                       std::shared_ptr<const EngramHasher> hasher,
                       const std::vector<std::vector<int32_t>>& prompts, int64_t chunk,
                       bool on_gpu) {
  std::unique_ptr<ModelParameters> device_parameters;
  if (on_gpu) {
    device_parameters = copy_parameters(*loaded.parameters, ops::allocator_for(Device::cuda(0)));
  }
  Model model(loaded.config.text, on_gpu ? *device_parameters : *loaded.parameters, numerics,
              std::move(hasher));
  return run_prompts(model, prompts, chunk);
}

void expect_matches(const std::vector<float>& ours, const fs::path& reference_file, int64_t vocab,
                    const std::string& what) {
  const SafetensorsFile file = SafetensorsFile::open(reference_file);
  const SafetensorsTensor& tensor = file.at("logits");
  ASSERT_EQ(tensor.dtype, DType::kF32);
  ASSERT_EQ(tensor.element_count(), static_cast<int64_t>(ours.size())) << what;
  const float* ref = reinterpret_cast<const float*>(tensor.bytes.data());
  float scale = 0;
  for (size_t i = 0; i < ours.size(); ++i) scale = std::max(scale, std::fabs(ref[i]));
  const float tol = 1e-3f * scale;
  float worst = 0;
  int64_t argmax_mismatches = 0;
  const int64_t rows = static_cast<int64_t>(ours.size()) / vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ours.data() + r * vocab;
    const float* b = ref + r * vocab;
    int64_t best_a = 0, best_b = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      worst = std::max(worst, std::fabs(a[v] - b[v]));
      if (a[v] > a[best_a]) best_a = v;
      if (b[v] > b[best_b]) best_b = v;
    }
    float second = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) {
      if (v != best_b) second = std::max(second, b[v]);
    }
    if (b[best_b] - second > tol && best_a != best_b) ++argmax_mismatches;
  }
  std::printf("[ golden   ] %-50s max |ours - ref| %.3g (tol %.3g), argmax mismatches %lld\n",
              what.c_str(), static_cast<double>(worst), static_cast<double>(tol),
              static_cast<long long>(argmax_mismatches));
  EXPECT_LE(worst, tol) << what << ": max |ours - ref| " << worst << " > tol " << tol;
  EXPECT_EQ(argmax_mismatches, 0) << what;
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  if (!fs::exists(kGoldenDir)) return names;
  for (const auto& entry : fs::directory_iterator(kGoldenDir)) {
    if (fs::exists(entry.path() / "tokens.txt")) names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Prefill, chunked and decode must agree with each other to 1e-5 relative (issue 5).
void expect_modes_agree(const std::vector<float>& prefill, const std::vector<float>& other,
                        const std::string& what) {
  ASSERT_EQ(prefill.size(), other.size());
  float scale = 0, worst = 0;
  for (size_t i = 0; i < prefill.size(); ++i) {
    scale = std::max(scale, std::fabs(prefill[i]));
    worst = std::max(worst, std::fabs(prefill[i] - other[i]));
  }
  EXPECT_LE(worst, 1e-5f * scale) << what << " differs from prefill";
}

void check_fixture(const std::string& fixture, bool on_gpu) {
  const fs::path dir = kGoldenDir / fixture;
  const auto prompts = read_tokens(dir / "tokens.txt");
  const LoadedModel hf = load_model(dir / "hf");
  const LoadedModel released = load_model(dir / "released");
  std::shared_ptr<const EngramHasher> hasher;
  if (!hf.config.text.engram_layer_ids.empty()) {
    // The tokenizer-derived compressed vocabulary (HF build_compressed_token_map), which the
    // generator stores with each engram fixture.
    const fs::path map_path = dir / "engram_token_map.json";
    ASSERT_TRUE(fs::exists(map_path)) << fixture << ": engram fixture without " << map_path;
    hasher = std::make_shared<EngramHasher>(hf.config.text, read_engram_token_map(map_path));
  }
  const int64_t vocab = hf.config.text.vocab_size;
  // Sanitizer builds run the prefill only: decode is ~600 forwards per numerics.
  const bool sanitized = std::getenv("DEEPINFER_SANITIZER_BUILD") != nullptr;
  const fs::path released_reference = dir / "logits_ref_fp32act.safetensors";
  const bool dense_only = !fs::exists(released_reference);
  if (dense_only) {
    std::printf(
        "[ golden   ] %s is dense-only (no %s): dense vs HF in every mode, released modes "
        "agree with each other\n",
        fixture.c_str(), released_reference.filename().c_str());
  }
  std::vector<float> dense_prefill, released_prefill;
  for (int64_t chunk : {int64_t{0}, int64_t{37}, int64_t{1}}) {
    if (sanitized && chunk != 0) continue;
    const std::string mode = chunk == 0 ? "prefill" : (chunk == 1 ? "decode" : "chunked:37");
    const std::vector<float> dense = run(hf, Numerics::kDense, hasher, prompts, chunk, on_gpu);
    expect_matches(dense, dir / "logits_hf.safetensors", vocab, fixture + " dense " + mode);
    const std::vector<float> quantized =
        run(released, Numerics::kReleased, hasher, prompts, chunk, on_gpu);
    if (!dense_only) {
      expect_matches(quantized, released_reference, vocab, fixture + " released " + mode);
    }
    if (chunk == 0) {
      dense_prefill = dense;
      released_prefill = quantized;
    } else {
      expect_modes_agree(dense_prefill, dense, fixture + " dense " + mode);
      expect_modes_agree(
          released_prefill, quantized,
          fixture + (dense_only ? " released (dense-only fixture) " : " released ") + mode);
    }
  }
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, BothNumericsAllModes) {
  check_fixture(GetParam(), false);
}

TEST_P(GoldenTest, BothNumericsAllModesOnGpu) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  check_fixture(GetParam(), true);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& fixture) {
                           return fixture.param;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GoldenTest);

}  // namespace
}  // namespace deepinfer::deepseek_v41
