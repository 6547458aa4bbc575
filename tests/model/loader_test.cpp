// Loading checkpoints: a random released-layout checkpoint (fp8 32x32 dense roles, fp4
// experts, fp8 engram table) and the HF-layout checkpoint of its dequantized weights load and
// give bit-identical logits under the dense numerics; the released numerics run on it; broken
// checkpoints fail naming the tensor.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/dtype_convert.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/deepseek_v41/loader.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/random_weights.h"
#include "random_model.h"

namespace deepinfer::deepseek_v41 {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() /
             ("deepinfer_loader_test_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// The tiny config as a composite config.json with the released quantization_config.
nlohmann::json tiny_config_json(int64_t engram_rows) {
  // The forward tests' tiny config with wider low-rank projections (FP8 32x32 blocks need K
  // and N multiples of 32), 4 experts and softmax scoring.
  nlohmann::json text = testing::tiny_config_json(R"({
    "model_type": "deepseek_v41_text", "q_lora_rank": 32, "o_lora_rank": 32,
    "n_routed_experts": 4, "scoring_func": "softmax"
  })");
  text["engram_num_embeddings"] = {engram_rows};
  nlohmann::json config;
  config["architectures"] = {"DeepseekV41ForCausalLM"};
  config["model_type"] = "deepseek_v41";
  config["text_config"] = text;
  config["quantization_config"] = nlohmann::json::parse(
      R"({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
          "scale_fmt": "ue8m0", "expert_dtype": "fp4"})");
  return config;
}

std::vector<int32_t> token_map() {
  std::vector<int32_t> map(300);
  for (int32_t i = 0; i < 300; ++i) map[static_cast<size_t>(i)] = (i * 7) % 200;
  return map;
}

int64_t engram_rows() {
  nlohmann::json probe = tiny_config_json(0);
  const DeepseekV41Config config = parse_config(probe, "probe");
  return EngramHasher(config.text, token_map()).table_rows(0);
}

void write_config(const fs::path& directory, const nlohmann::json& config) {
  std::ofstream(directory / "config.json") << config.dump(2);
}

// Writes a released checkpoint and the HF checkpoint of its exactly dequantized weights.
void write_checkpoints(const fs::path& released, const fs::path& hf, bool drop_one = false) {
  const nlohmann::json json = tiny_config_json(engram_rows());
  const DeepseekV41Config config = parse_config(json, "test config");
  const std::vector<WeightSpec> table = build_weight_table(config.text, WeightLayout::kReleased);
  const std::vector<RandomTensor> tensors = make_random_weights(table, 0.3, 5);
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, const RandomTensor*> by_name;
  for (const RandomTensor& t : tensors) {
    by_name[t.spec->name] = &t;
    if (drop_one && t.spec->name == "layers.3.attn.wq_b.weight") continue;
    entries.push_back({t.spec->name, t.spec->dtype, t.spec->shape, t.bytes});
  }
  write_config(released, json);
  write_safetensors(released / "model.safetensors", entries);

  // HF layout: same values, dequantized to bf16 (exact), `model.` / `lm_head.` names.
  std::vector<std::vector<std::byte>> storage;
  std::vector<SafetensorsEntry> hf_entries;
  for (const WeightSpec& spec : build_weight_table(config.text, WeightLayout::kHfDense)) {
    std::string native = spec.name;
    if (native == "lm_head.weight") native = "head.weight";
    if (native.rfind("model.", 0) == 0) native = native.substr(6);
    const RandomTensor& source = *by_name.at(native);
    const WeightSpec& s = *source.spec;
    std::vector<float> values;
    const int64_t count = s.element_count();
    const auto* bytes = reinterpret_cast<const void*>(source.bytes.data());
    if (s.role == WeightRole::kFp8Block || s.role == WeightRole::kFp4Packed ||
        (s.role == WeightRole::kEngramTable && s.dtype == DType::kF8E4M3)) {
      const RandomTensor& scale = *by_name.at(s.scale_name);
      const DType value_type = s.role == WeightRole::kFp4Packed ? DType::kF4E2M1x2 : s.dtype;
      const std::vector<int64_t>& logical = s.logical_shape.empty() ? s.shape : s.logical_shape;
      const TensorView weight =
          TensorView::contiguous(const_cast<void*>(bytes), value_type, {logical[0], logical[1]});
      const TensorView scale_view =
          TensorView::contiguous(const_cast<std::byte*>(scale.bytes.data()), DType::kF8E8M0,
                                 {scale.spec->shape[0], scale.spec->shape[1]});
      values.resize(static_cast<size_t>(logical[0] * logical[1]));
      ops::dequantize_weight(
          {weight, scale_view},
          TensorView::contiguous(values.data(), DType::kF32, {logical[0], logical[1]}));
    } else {
      values.resize(static_cast<size_t>(count));
      convert_to_f32(s.dtype, bytes, values.data(), count);
    }
    storage.emplace_back(dtype_storage_bytes(spec.dtype, static_cast<int64_t>(values.size())));
    convert_from_f32(values.data(), spec.dtype, storage.back().data(),
                     static_cast<int64_t>(values.size()));
    hf_entries.push_back({spec.name, spec.dtype, spec.shape, storage.back()});
  }
  write_config(hf, json);
  write_safetensors(hf / "model.safetensors", hf_entries);
}

std::vector<float> run_prompt(const LoadedModel& loaded, Numerics numerics,
                              const std::vector<int32_t>& prompt) {
  auto hasher = std::make_shared<EngramHasher>(loaded.config.text, token_map());
  Model model(loaded.config.text, *loaded.parameters, numerics, hasher);
  RequestState state(loaded.config.text, {128, 0});
  const int64_t vocab = loaded.config.text.vocab_size;
  std::vector<float> logits(prompt.size() * static_cast<size_t>(vocab));
  ForwardRequest request{&state, prompt};
  model.forward({&request, 1},
                TensorView::contiguous(logits.data(), DType::kF32,
                                       {static_cast<int64_t>(prompt.size()), vocab}));
  return logits;
}

// DEEPINFER_WO_A_FP8 set to `value` while it lives (nullptr: unset), unset afterwards.
class WoAFp8Setting {
 public:
  explicit WoAFp8Setting(const char* value) {
    if (value == nullptr) {
      unsetenv(kVariable);
    } else {
      setenv(kVariable, value, 1);
    }
  }
  ~WoAFp8Setting() { unsetenv(kVariable); }
  WoAFp8Setting(const WoAFp8Setting&) = delete;
  WoAFp8Setting& operator=(const WoAFp8Setting&) = delete;

 private:
  static constexpr const char* kVariable = "DEEPINFER_WO_A_FP8";
};

TEST(LoaderTest, ReleasedAndHfLayoutsGiveIdenticalDenseLogits) {
  TempDir released("released"), hf("hf");
  write_checkpoints(released.path, hf.path);
  const WoAFp8Setting keep_fp8_wo_a("1");
  const LoadedModel a = load_model(released.path);
  const LoadedModel b = load_model(hf.path);
  EXPECT_EQ(a.layout, WeightLayout::kReleased);
  EXPECT_EQ(b.layout, WeightLayout::kHfDense);
  std::vector<int32_t> prompt(29);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37 + 11) % 300);
  // wo_a: the released FP8 weight kept as stored (each group's 32 rows one scale block row),
  // the HF layout's bf16 as stored; the same values, so the same logits.
  const ops::LinearWeight& released_wo_a = a.parameters->layers[0].attn.wo_a;
  EXPECT_EQ(released_wo_a.weight.dtype(), DType::kF8E4M3);
  EXPECT_EQ(released_wo_a.scale.dtype(), DType::kF8E8M0);
  EXPECT_EQ(b.parameters->layers[0].attn.wo_a.weight.dtype(), DType::kBF16);
  EXPECT_EQ(b.parameters->layers[0].attn.wo_a.scale.numel(), 0);
  const std::vector<float> dense_released = run_prompt(a, Numerics::kDense, prompt);
  const std::vector<float> dense_hf = run_prompt(b, Numerics::kDense, prompt);
  EXPECT_EQ(dense_released, dense_hf);
  float spread = 0;
  for (float v : dense_released) spread = std::max(spread, std::fabs(v));
  EXPECT_GT(spread, 0.0f);
  // The released numerics quantize activations: close to, but not the same as, dense.
  const std::vector<float> quantized = run_prompt(a, Numerics::kReleased, prompt);
  // wo_a dequantized at load, as before it was kept as stored: the same logits in both numerics.
  LoadedModel dense_wo_a = load_model(released.path);
  for (LayerParameters& layer : dense_wo_a.parameters->layers) {
    layer.attn.wo_a = dense_wo_a.parameters->own_dense(layer.attn.wo_a);
  }
  EXPECT_EQ(run_prompt(dense_wo_a, Numerics::kDense, prompt), dense_released);
  EXPECT_EQ(run_prompt(dense_wo_a, Numerics::kReleased, prompt), quantized);
  double worst = 0;
  for (size_t i = 0; i < quantized.size(); ++i) {
    ASSERT_TRUE(std::isfinite(quantized[i]));
    worst = std::max(worst, std::fabs(double(quantized[i]) - dense_released[i]));
  }
  EXPECT_GT(worst, 0.0);
}

// Random released-layout tensors of `config` in memory, and the loader's parameters over them.
struct RandomReleasedWeights {
  explicit RandomReleasedWeights(const DeepseekV41TextConfig& text_config)
      : config(text_config),
        table(build_weight_table(text_config, WeightLayout::kReleased)),
        tensors(make_random_weights(table, 0.3, 5)) {
    for (RandomTensor& t : tensors) {
      views[t.spec->name] =
          TensorView::contiguous(t.bytes.data(), t.spec->dtype, Shape(std::span(t.spec->shape)));
    }
  }
  std::unique_ptr<ModelParameters> build() const {
    return build_parameters(config, WeightLayout::kReleased,
                            [&](const std::string& name) { return views.at(name); });
  }

  const DeepseekV41TextConfig& config;
  std::vector<WeightSpec> table;  // the tensors' specs point into it
  std::vector<RandomTensor> tensors;
  std::map<std::string, TensorView> views;
};

// The FP8 wo_a stays as stored only where linear_grouped can take each group's share of the
// scale rows: with o_lora_rank 16 a 32-row scale block spans both groups, so the loader
// dequantizes it (exactly, to bf16) as it did every wo_a before.
TEST(LoaderTest, Fp8WoAIsKeptOnlyInWholeScaleBlocksPerGroup) {
  const WoAFp8Setting keep_fp8_wo_a("1");
  for (const int64_t o_lora_rank : {32, 16}) {
    nlohmann::json json = tiny_config_json(engram_rows());
    json["text_config"]["o_lora_rank"] = o_lora_rank;
    const DeepseekV41Config config = parse_config(json, "test config");
    const RandomReleasedWeights weights(config.text);
    const std::unique_ptr<ModelParameters> parameters = weights.build();
    const std::map<std::string, TensorView>& views = weights.views;
    const ops::LinearWeight& wo_a = parameters->layers[0].attn.wo_a;
    const TensorView& stored = views.at("layers.0.attn.wo_a.weight");
    const TensorView& stored_scale = views.at("layers.0.attn.wo_a.scale");
    if (o_lora_rank == 32) {
      EXPECT_EQ(wo_a.weight.raw_data(), stored.raw_data());
      EXPECT_EQ(wo_a.scale.raw_data(), stored_scale.raw_data());
      continue;
    }
    ASSERT_EQ(wo_a.weight.dtype(), DType::kBF16);
    EXPECT_EQ(wo_a.scale.numel(), 0);
    Tensor want = Tensor::empty(DType::kBF16, stored.shape());
    ops::dequantize_weight({stored, stored_scale}, want.view());
    EXPECT_EQ(std::memcmp(wo_a.weight.raw_data(), want.view().raw_data(), want.view().nbytes()), 0);
  }
}

// By default (DEEPINFER_WO_A_FP8 unset or 0) every wo_a is dequantized exactly to bf16, as
// before the switch; any other value is an error naming it.
TEST(LoaderTest, Fp8WoAIsDequantizedByDefault) {
  const DeepseekV41Config config = parse_config(tiny_config_json(engram_rows()), "test config");
  const RandomReleasedWeights weights(config.text);
  const auto build = [&] { return weights.build(); };
  for (const char* value : {static_cast<const char*>(nullptr), "0"}) {
    const WoAFp8Setting setting(value);
    const std::unique_ptr<ModelParameters> parameters = build();
    EXPECT_EQ(parameters->layers[0].attn.wo_a.weight.dtype(), DType::kBF16);
    EXPECT_EQ(parameters->layers[0].attn.wo_a.scale.numel(), 0);
  }
  const WoAFp8Setting bad("yes");
  try {
    build();
    FAIL() << "DEEPINFER_WO_A_FP8=yes was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("DEEPINFER_WO_A_FP8='yes'"), std::string::npos)
        << error.what();
  }
}

TEST(LoaderTest, MissingTensorIsNamed) {
  TempDir released("broken"), hf("broken_hf");
  write_checkpoints(released.path, hf.path, /*drop_one=*/true);
  try {
    load_model(released.path);
    FAIL() << "a checkpoint without layers.3.attn.wq_b.weight loaded";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("layers.3.attn.wq_b.weight"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace deepinfer::deepseek_v41
