// Golden logits (docs/GOLDEN.md): for every fixture config, both numerics against their oracle
// (dense on the HF checkpoint vs HF DeepseekV41ForCausalLM; released numerics on the released
// checkpoint vs DeepSeek's reference with fp32 activations), in prefill, chunked and decode
// modes. Rule: |ours - ref| <= 1e-3 * max|ref| everywhere, and the argmax matches wherever the
// reference's top-two margin exceeds that tolerance. Skips while the fixtures are absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

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

// Every position's logits of every request, request after request, with `chunk` tokens per
// request per step (0 = whole prompt).
std::vector<float> run(const LoadedModel& loaded, Numerics numerics,
                       std::shared_ptr<const EngramHasher> hasher,
                       const std::vector<std::vector<int32_t>>& prompts, int64_t chunk) {
  const DeepseekV41TextConfig& config = loaded.config.text;
  Model model(config, *loaded.parameters, numerics, std::move(hasher));
  const int64_t vocab = config.vocab_size;
  std::vector<std::unique_ptr<RequestState>> states;
  std::vector<int64_t> offsets = {0};
  for (const auto& p : prompts) {
    states.push_back(
        std::make_unique<RequestState>(config, StateLimits{static_cast<int64_t>(p.size()), 0}));
    offsets.push_back(offsets.back() + static_cast<int64_t>(p.size()));
  }
  std::vector<float> all(static_cast<size_t>(offsets.back() * vocab));
  std::vector<float> step;
  while (true) {
    std::vector<ForwardRequest> requests;
    std::vector<size_t> which;
    int64_t total = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t done = states[i]->length();
      const int64_t left = static_cast<int64_t>(prompts[i].size()) - done;
      if (left == 0) continue;
      const int64_t count = chunk == 0 ? left : std::min(left, chunk);
      requests.push_back({states[i].get(), {prompts[i].data() + done, static_cast<size_t>(count)}});
      which.push_back(i);
      total += count;
    }
    if (requests.empty()) break;
    step.resize(static_cast<size_t>(total * vocab));
    std::vector<int64_t> starts;
    for (const auto& r : requests) starts.push_back(r.state->length());
    model.forward(requests, TensorView::contiguous(step.data(), DType::kF32, {total, vocab}));
    int64_t row = 0;
    for (size_t j = 0; j < requests.size(); ++j) {
      for (size_t t = 0; t < requests[j].tokens.size(); ++t, ++row) {
        std::copy_n(step.data() + row * vocab, vocab,
                    all.data() + (offsets[which[j]] + starts[j] + static_cast<int64_t>(t)) * vocab);
      }
    }
  }
  return all;
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
  EXPECT_LE(worst, tol) << what << ": max |ours - ref| " << worst << " > tol " << tol;
  EXPECT_EQ(argmax_mismatches, 0) << what;
}

TEST(GoldenTest, EveryConfigBothNumericsAllModes) {
  if (!fs::exists(kGoldenDir)) GTEST_SKIP() << "no golden fixtures under " << kGoldenDir;
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(kGoldenDir)) {
    const fs::path dir = entry.path();
    if (!fs::exists(dir / "tokens.txt") || !fs::exists(dir / "hf")) continue;
    const auto prompts = read_tokens(dir / "tokens.txt");
    const LoadedModel hf = load_model(dir / "hf");
    const LoadedModel released = load_model(dir / "released");
    std::shared_ptr<const EngramHasher> hasher;
    if (!hf.config.text.engram_layer_ids.empty()) {
      // The tokenizer-derived compressed vocabulary (HF build_compressed_token_map), from the
      // fixture or from $DEEPINFER_ENGRAM_MAP_DIR/<config>.json.
      fs::path map_path = dir / "engram_token_map.json";
      if (const char* maps = std::getenv("DEEPINFER_ENGRAM_MAP_DIR");
          maps && !fs::exists(map_path)) {
        map_path = fs::path(maps) / (dir.filename().string() + ".json");
      }
      if (!fs::exists(map_path)) {
        // The fixtures do not carry the tokenizer-derived compressed vocabulary yet.
        std::cout << "[ SKIPPED  ] " << dir.filename() << ": engram config without "
                  << "engram_token_map.json (set DEEPINFER_ENGRAM_MAP_DIR)\n";
        continue;
      }
      std::ifstream map_file(map_path);
      const auto map = nlohmann::json::parse(map_file).get<std::vector<int32_t>>();
      hasher = std::make_shared<EngramHasher>(hf.config.text, map);
    }
    const int64_t vocab = hf.config.text.vocab_size;
    for (int64_t chunk : {int64_t{0}, int64_t{37}, int64_t{1}}) {
      const std::string mode = chunk == 0 ? "prefill" : (chunk == 1 ? "decode" : "chunked:37");
      expect_matches(run(hf, Numerics::kDense, hasher, prompts, chunk),
                     dir / "logits_hf.safetensors", vocab,
                     dir.filename().string() + " dense " + mode);
      if (fs::exists(dir / "logits_ref_fp32act.safetensors")) {
        expect_matches(run(released, Numerics::kReleased, hasher, prompts, chunk),
                       dir / "logits_ref_fp32act.safetensors", vocab,
                       dir.filename().string() + " released " + mode);
      }
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no fixture directories in " << kGoldenDir;
}

}  // namespace
}  // namespace deepinfer::deepseek_v41
