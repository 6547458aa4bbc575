// Random checkpoints: deterministic per (seed, name), sane initial scales, and quantized
// tensors that decode (with core's independent dequantizer) back to the initial distribution.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/dtype_convert.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/random_weights.h"

namespace deepinfer::deepseek_v41 {
namespace {

const std::filesystem::path kTiny =
    std::filesystem::path(DEEPINFER_SOURCE_DIR) / "tests/data/configs/tiny_v41.json";

// tiny_v41 with a 1024-token vocabulary: the 129280-row embedding dominates generation time
// and adds nothing the other tensors do not test.
DeepseekV41Config small_vocab_tiny() {
  DeepseekV41Config config = load_config(kTiny);
  config.text.vocab_size = 1024;
  return config;
}

struct Moments {
  double mean = 0;
  double std = 0;
};
Moments moments(const std::vector<float>& v) {
  double sum = 0, sq = 0;
  for (float x : v) sum += x, sq += double(x) * x;
  const double mean = sum / double(v.size());
  return {mean, std::sqrt(sq / double(v.size()) - mean * mean)};
}

// Decodes a weight (and its scale, when it has one) to f32 [rows, cols] with core's
// dequantize_blocks, row by row.
std::vector<float> decode(const RandomTensor& weight, const RandomTensor* scale) {
  const WeightSpec& spec = *weight.spec;
  const int64_t rows = spec.logical_shape[0];
  const int64_t cols = spec.logical_shape.size() > 1 ? spec.logical_shape[1] : 1;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  if (scale == nullptr) {
    convert_to_f32(spec.dtype, weight.bytes.data(), out.data(), rows * cols);
    return out;
  }
  const DType value_type = spec.role == WeightRole::kFp4Packed ? DType::kF4E2M1x2 : spec.dtype;
  const int64_t scale_cols = scale->spec->shape[1];
  std::vector<float> row_scales(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    // Expand this row's scales to one per block_cols elements (block_rows rows share a row).
    const uint8_t* scale_row =
        reinterpret_cast<const uint8_t*>(scale->bytes.data()) + (r / spec.block_rows) * scale_cols;
    const std::byte* values =
        weight.bytes.data() + (value_type == DType::kF4E2M1x2 ? r * cols / 2 : r * cols);
    dequantize_blocks(value_type, values, DType::kF8E8M0, scale_row, cols, spec.block_cols,
                      &out[r * cols]);
  }
  return out;
}

TEST(DeepseekV41RandomWeights, DeterministicAndSeedDependent) {
  const auto config = small_vocab_tiny();
  const auto table = build_weight_table(config.text, WeightLayout::kReleased);
  const auto a = make_random_weights(table, 0.02, 7);
  const auto b = make_random_weights(table, 0.02, 7);
  const auto c = make_random_weights(table, 0.02, 8);
  ASSERT_EQ(a.size(), table.size());
  size_t differing = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].bytes, b[i].bytes) << table[i].name;
    differing += a[i].bytes != c[i].bytes;
  }
  EXPECT_GT(differing, table.size() / 2);
  // Values depend on the name, not the position in the table.
  std::vector<WeightSpec> reversed(table.rbegin(), table.rend());
  const auto r = make_random_weights(reversed, 0.02, 7);
  for (size_t i = 0; i < r.size(); ++i)
    EXPECT_EQ(r[i].bytes, a[a.size() - 1 - i].bytes) << reversed[i].name;
}

TEST(DeepseekV41RandomWeights, QuantizedTensorsDecodeToTheInitialDistribution) {
  const auto config = small_vocab_tiny();
  const auto table = build_weight_table(config.text, WeightLayout::kReleased);
  const auto tensors = make_random_weights(table, 0.02, 1);
  std::map<std::string, const RandomTensor*> by_name;
  for (const auto& t : tensors) by_name[t.spec->name] = &t;
  auto decoded = [&](const std::string& name) {
    const RandomTensor* weight = by_name.at(name);
    const RandomTensor* scale =
        weight->spec->scale_name.empty() ? nullptr : by_name.at(weight->spec->scale_name);
    return decode(*weight, scale);
  };
  // Dense bf16, fp8 32x32, fp4 1x32, fp8 engram rows: mean ~0, std ~0.02 (quantization adds
  // at most a few percent; fp4's coarse grid up to ~10%).
  for (const char* name : {"embed.weight", "layers.0.attn.wq_b.weight",
                           "layers.1.engram.embed.weight", "layers.1.engram.wkv.weight"}) {
    const Moments m = moments(decoded(name));
    EXPECT_NEAR(m.mean, 0.0, 0.002) << name;
    EXPECT_NEAR(m.std, 0.02, 0.001) << name;
  }
  std::vector<float> experts;
  for (int e = 0; e < 8; ++e) {
    for (const char* w : {"w1", "w2", "w3"}) {
      auto v = decoded("layers.3.ffn.experts." + std::to_string(e) + "." + w + ".weight");
      experts.insert(experts.end(), v.begin(), v.end());
    }
  }
  const Moments m = moments(experts);
  EXPECT_NEAR(m.mean, 0.0, 0.002);
  EXPECT_NEAR(m.std, 0.02, 0.002);
  for (float x : decoded("layers.0.attn_norm.weight")) ASSERT_EQ(x, 1.0f);
  for (float x : decoded("layers.0.hc_ffn_base")) ASSERT_EQ(x, 0.0f);
  for (float x : decoded("layers.0.hc_ffn_scale")) ASSERT_EQ(x, 1.0f);
  for (float x : decoded("layers.2.attn.attn_sink")) ASSERT_EQ(x, 0.0f);
  for (float x : decoded("layers.1.engram.q_weight")) ASSERT_EQ(x, 1.0f);
  // Every fp8 block uses its range: the largest |code| value of a block is in (224, 448].
  const RandomTensor& scale = *by_name.at("layers.0.attn.wq_a.scale");
  const RandomTensor& weight = *by_name.at("layers.0.attn.wq_a.weight");
  ASSERT_EQ(scale.bytes.size(), 1u * 2u);  // [32/32, 64/32]
  for (int tile = 0; tile < 2; ++tile) {
    float amax = 0;
    for (int r = 0; r < 32; ++r) {
      for (int col = tile * 32; col < tile * 32 + 32; ++col) {
        amax = std::max(amax,
                        std::fabs(e4m3_to_float(static_cast<uint8_t>(weight.bytes[r * 64 + col]))));
      }
    }
    EXPECT_GT(amax, 224.0f);
    EXPECT_LE(amax, 448.0f);
  }
}

TEST(DeepseekV41RandomWeights, HfLayoutIsDenseBf16) {
  const auto config = small_vocab_tiny();
  const auto table = build_weight_table(config.text, WeightLayout::kHfDense);
  const auto tensors = make_random_weights(table, 0.02, 3);
  for (const auto& t : tensors) {
    EXPECT_TRUE(t.spec->dtype == DType::kBF16 || t.spec->dtype == DType::kF32) << t.spec->name;
    EXPECT_EQ(t.bytes.size(), dtype_storage_bytes(t.spec->dtype, t.spec->element_count()));
  }
}

}  // namespace
}  // namespace deepinfer::deepseek_v41
