// The weight table against the released checkpoint's tensor inventory as documented in
// /work/shared/notes/replay-parallel-checkpoint.md §C.2-C.5 (header checker + reference
// inference/model.py shapes), and checkpoint validation.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "core/error.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/weights.h"

namespace deepinfer::deepseek_v41 {
namespace {

const std::filesystem::path kConfigDir =
    std::filesystem::path(DEEPINFER_SOURCE_DIR) / "tests/data/configs";

std::map<std::string, const WeightSpec*> index_by_name(const std::vector<WeightSpec>& table) {
  std::map<std::string, const WeightSpec*> out;
  for (const WeightSpec& spec : table)
    EXPECT_TRUE(out.emplace(spec.name, &spec).second) << spec.name;
  return out;
}

struct Expected {
  const char* name;
  std::vector<int64_t> shape;
  DType dtype;
};

TEST(DeepseekV41Weights, ReleasedFlashMatchesDocumentedHeaders) {
  const DeepseekV41Config config = load_config(kConfigDir / "deepseek_v41_flash_config.json");
  const std::vector<WeightSpec> table = build_weight_table(config.text, WeightLayout::kReleased);
  const auto by_name = index_by_name(table);
  // Rows of the §C.3 table (D = 5120, I = 2304, H = 64 x 512).
  const Expected expected[] = {
      {"embed.weight", {129280, 5120}, DType::kBF16},
      {"head.weight", {129280, 5120}, DType::kBF16},
      {"norm.weight", {5120}, DType::kBF16},
      {"layers.0.attn_norm.weight", {5120}, DType::kBF16},
      {"layers.0.hc_attn_fn", {24, 20480}, DType::kF32},
      {"layers.0.hc_ffn_base", {24}, DType::kF32},
      {"layers.0.hc_ffn_scale", {3}, DType::kF32},
      {"layers.0.attn.wq_a.weight", {1280, 5120}, DType::kF8E4M3},
      {"layers.0.attn.wq_a.scale", {40, 160}, DType::kF8E8M0},
      {"layers.0.attn.q_norm.weight", {1280}, DType::kBF16},
      {"layers.0.attn.wq_b.weight", {32768, 1280}, DType::kF8E4M3},
      {"layers.0.attn.wkv.weight", {512, 5120}, DType::kF8E4M3},
      {"layers.0.attn.kv_norm.weight", {512}, DType::kBF16},
      {"layers.0.attn.wo_a.weight", {8192, 4096}, DType::kF8E4M3},
      {"layers.0.attn.wo_b.weight", {5120, 8192}, DType::kF8E4M3},
      {"layers.0.attn.attn_sink", {64}, DType::kF32},
      {"layers.2.attn.compressor.wkv.weight", {512, 5120}, DType::kBF16},
      {"layers.2.attn.compressor.wgate.weight", {512, 5120}, DType::kBF16},
      {"layers.20.attn.compressor.wkv.weight", {512, 5120}, DType::kBF16},
      {"layers.20.attn.compressor.norm.weight", {512}, DType::kBF16},
      {"layers.24.attn.indexer.wq_b.weight", {4096, 1280}, DType::kF8E4M3},
      {"layers.24.attn.indexer.weights_proj.weight", {32, 5120}, DType::kBF16},
      {"layers.8.attn.indexer.wk.weight", {128, 512}, DType::kBF16},
      {"layers.8.attn.indexer.k_norm.weight", {128}, DType::kBF16},
      {"layers.5.ffn.gate.weight", {384, 5120}, DType::kBF16},
      {"layers.5.ffn.gate.bias", {384}, DType::kF32},
      {"layers.5.ffn.gate.bias_vl", {384}, DType::kF32},
      {"layers.5.ffn.experts.383.w1.weight", {2304, 2560}, DType::kI8},
      {"layers.5.ffn.experts.383.w1.scale", {2304, 160}, DType::kF8E8M0},
      {"layers.5.ffn.experts.0.w2.weight", {5120, 1152}, DType::kI8},
      {"layers.5.ffn.experts.0.w2.scale", {5120, 72}, DType::kF8E8M0},
      {"layers.5.ffn.shared_experts.w1.weight", {2304, 5120}, DType::kF8E4M3},
      {"layers.5.ffn.shared_experts.w2.weight", {5120, 2304}, DType::kF8E4M3},
      {"layers.1.engram.embed.weight", {384006168, 256}, DType::kF8E4M3},
      {"layers.1.engram.embed.scale", {384006168, 8}, DType::kF8E8M0},
      {"layers.14.engram.embed.weight", {384016682, 256}, DType::kF8E4M3},
      {"layers.14.engram.wkv.weight", {25600, 6144}, DType::kF8E4M3},
      {"layers.14.engram.q_weight", {4, 5120}, DType::kBF16},
  };
  for (const Expected& row : expected) {
    auto it = by_name.find(row.name);
    ASSERT_NE(it, by_name.end()) << row.name;
    EXPECT_EQ(it->second->shape, row.shape) << row.name;
    EXPECT_EQ(it->second->dtype, row.dtype) << row.name;
  }
  // Presence follows the config (verified against headers in §C.3).
  auto count_suffix = [&](const std::string& suffix) {
    std::vector<int64_t> layers;
    for (const WeightSpec& spec : table) {
      if (spec.name.size() > suffix.size() && spec.name.ends_with(suffix))
        layers.push_back(spec.layer);
    }
    return layers;
  };
  EXPECT_EQ(count_suffix("attn.compressor.wkv.weight"), (std::vector<int64_t>{2, 8, 14, 20}));
  EXPECT_EQ(count_suffix("attn.compressor.wgate.weight"), (std::vector<int64_t>{2, 8, 14}));
  EXPECT_EQ(count_suffix("attn.indexer.wq_b.weight"),
            (std::vector<int64_t>{2, 8, 14, 20, 24, 28, 32, 36}));
  EXPECT_EQ(count_suffix("attn.indexer.wk.weight"), (std::vector<int64_t>{2, 8, 14, 20}));
  EXPECT_EQ(count_suffix("engram.embed.weight"), (std::vector<int64_t>{1, 14}));
  // §C.2: 40 x 384 x 3 int8-packed routed-expert weights in the backbone.
  int64_t packed = 0;
  for (const WeightSpec& spec : table) packed += spec.role == WeightRole::kFp4Packed;
  EXPECT_EQ(packed, 40 * 384 * 3);
  // No top-level hc_head_* in V4.1 (§C.3).
  for (const WeightSpec& spec : table) EXPECT_FALSE(spec.name.starts_with("hc_head")) << spec.name;
}

TEST(DeepseekV41Weights, HfLayoutIsReleasedRenamedAndDequantized) {
  const DeepseekV41Config config = load_config(kConfigDir / "tiny_v41.json");
  const auto released = build_weight_table(config.text, WeightLayout::kReleased);
  const auto hf = build_weight_table(config.text, WeightLayout::kHfDense);
  const auto hf_by_name = index_by_name(hf);
  // §C.5: the only renames are these four prefixes; fp8/fp4 scales are consumed by the loader.
  auto rename = [](std::string name) {
    for (const auto& [from, to] :
         std::initializer_list<std::pair<std::string, std::string>>{{"layers.", "model.layers."},
                                                                    {"embed.", "model.embed."},
                                                                    {"norm.", "model.norm."},
                                                                    {"head.", "lm_head."}}) {
      if (name.starts_with(from)) return to + name.substr(from.size());
    }
    return name;
  };
  size_t kept = 0;
  for (const WeightSpec& spec : released) {
    const bool consumed_scale =
        spec.role == WeightRole::kFp8BlockScale || spec.role == WeightRole::kFp4Scale;
    auto it = hf_by_name.find(rename(spec.name));
    if (consumed_scale) {
      EXPECT_EQ(it, hf_by_name.end()) << spec.name;
      continue;
    }
    ASSERT_NE(it, hf_by_name.end()) << spec.name;
    ++kept;
    EXPECT_EQ(it->second->shape, spec.logical_shape) << spec.name;  // fp4 unpacked
    const bool fp32_kept = spec.dtype == DType::kF32;  // hc_*, attn_sink, gate.bias(_vl)
    EXPECT_EQ(it->second->dtype, fp32_kept ? DType::kF32 : DType::kBF16) << spec.name;
  }
  EXPECT_EQ(kept, hf.size());
}

TEST(DeepseekV41Weights, TinyTableCoversEveryLayerKind) {
  const DeepseekV41Config config = load_config(kConfigDir / "tiny_v41.json");
  const auto table = build_weight_table(config.text, WeightLayout::kReleased);
  const auto by_name = index_by_name(table);
  EXPECT_TRUE(by_name.contains("layers.2.attn.compressor.wgate.weight"));   // ratio-2 source
  EXPECT_FALSE(by_name.contains("layers.3.attn.compressor.wkv.weight"));    // ratio-2 reuser
  EXPECT_FALSE(by_name.contains("layers.4.attn.compressor.wgate.weight"));  // ratio-1 source
  EXPECT_TRUE(by_name.contains("layers.4.attn.indexer.wk.weight"));
  EXPECT_TRUE(by_name.contains("layers.5.attn.indexer.wq_b.weight"));  // reindex
  EXPECT_FALSE(by_name.contains("layers.5.attn.indexer.wk.weight"));
  EXPECT_TRUE(by_name.contains("layers.1.engram.embed.weight"));
  EXPECT_EQ(by_name.at("layers.1.engram.wkv.weight")->shape,
            (std::vector<int64_t>{64 * 3, 2 * 2 * 32}));
  EXPECT_EQ(by_name.at("layers.0.hc_attn_fn")->shape, (std::vector<int64_t>{8, 128}));
  EXPECT_EQ(by_name.at("layers.0.ffn.experts.7.w2.weight")->shape, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(by_name.at("layers.0.ffn.experts.7.w2.scale")->shape, (std::vector<int64_t>{64, 1}));
}

std::vector<CheckpointTensorInfo> infos_of(const std::vector<WeightSpec>& table) {
  std::vector<CheckpointTensorInfo> infos;
  for (const WeightSpec& spec : table) infos.push_back({spec.name, spec.dtype, spec.shape});
  return infos;
}

TEST(DeepseekV41Weights, ValidationNamesEveryProblemAtOnce) {
  const DeepseekV41Config config = load_config(kConfigDir / "tiny_v41.json");
  const auto table = build_weight_table(config.text, WeightLayout::kReleased);
  auto infos = infos_of(table);
  // A complete checkpoint plus the non-text tensors HF ignores.
  infos.push_back({"mtp.0.attn.wq_a.weight", DType::kF8E4M3, {32, 64}});
  infos.push_back({"vision.blocks.0.attn.wqkv.weight", DType::kBF16, {3, 3}});
  infos.push_back({"aligner.w1.weight", DType::kBF16, {3, 3}});
  infos.push_back({"image_newline", DType::kBF16, {64}});
  EXPECT_NO_THROW(validate_checkpoint_tensors(table, infos, WeightLayout::kReleased, "ckpt"));
  EXPECT_EQ(compare_with_table(table, infos).ignored, 4u);

  auto find = [&](const std::string& name) -> CheckpointTensorInfo& {
    for (auto& info : infos) {
      if (info.name == name) return info;
    }
    throw std::runtime_error(name);
  };
  infos.erase(std::find_if(infos.begin(), infos.end(), [](const auto& info) {
    return info.name == "layers.3.attn.wkv.scale";
  }));
  infos.push_back({"layers.3.attn.extra.weight", DType::kBF16, {4}});
  find("layers.2.attn.compressor.wgate.weight").shape = {32, 63};
  find("layers.0.ffn.experts.1.w3.weight").dtype = DType::kF8E4M3;
  find("layers.1.engram.q_weight").dtype = DType::kF32;  // an accepted alternative (§D.6)
  try {
    validate_checkpoint_tensors(table, infos, WeightLayout::kReleased, "ckpt");
    FAIL() << "accepted a broken checkpoint";
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const char* part :
         {"ckpt", "missing", "layers.3.attn.wkv.scale", "unexpected", "layers.3.attn.extra.weight",
          "layers.2.attn.compressor.wgate.weight: expected [32, 64], got [32, 63]",
          "layers.0.ffn.experts.1.w3.weight: expected I8, got F8_E4M3"}) {
      EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
    }
    EXPECT_EQ(message.find("q_weight"), std::string::npos) << message;
  }
}

TEST(DeepseekV41Weights, DetectsLayoutAndParsesLayoutNames) {
  const DeepseekV41Config config = load_config(kConfigDir / "tiny_v41.json");
  EXPECT_EQ(
      detect_weight_layout(infos_of(build_weight_table(config.text, WeightLayout::kReleased))),
      WeightLayout::kReleased);
  EXPECT_EQ(detect_weight_layout(infos_of(build_weight_table(config.text, WeightLayout::kHfDense))),
            WeightLayout::kHfDense);
  EXPECT_EQ(parse_weight_layout("hf"), WeightLayout::kHfDense);
  EXPECT_THROW(parse_weight_layout("gguf"), Error);
}

TEST(DeepseekV41Weights, UnquantizedReleasedNamesStayBf16) {
  DeepseekV41Config config = load_config(kConfigDir / "tiny_v41.json");
  config.text.quantization_config.reset();
  for (const WeightSpec& spec : build_weight_table(config.text, WeightLayout::kReleased)) {
    EXPECT_TRUE(spec.dtype == DType::kBF16 || spec.dtype == DType::kF32) << spec.name;
    EXPECT_FALSE(spec.name.ends_with(".scale") && !spec.name.ends_with("engram.embed.scale"))
        << spec.name;
  }
}

TEST(DeepseekV41Weights, RejectsConfigsThatCannotBeLaidOut) {
  DeepseekV41Config config = load_config(kConfigDir / "tiny_v41.json");
  config.text.engram_head_dim = 48;
  EXPECT_THROW(build_weight_table(config.text, WeightLayout::kReleased), Error);
  config = load_config(kConfigDir / "tiny_v41.json");
  config.text.moe_intermediate_size = 40;  // w2's input is not a multiple of the fp4 group
  EXPECT_THROW(build_weight_table(config.text, WeightLayout::kReleased), Error);
}

}  // namespace
}  // namespace deepinfer::deepseek_v41
