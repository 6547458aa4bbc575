#include "random_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "core/dtype_convert.h"
#include "core/error.h"

namespace deepinfer::deepseek_v41::testing {
namespace {

class Draw {
 public:
  explicit Draw(uint32_t seed) : rng_(seed) {}
  std::vector<float> normal(int64_t count, float stddev, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, stddev);
    std::vector<float> values(static_cast<size_t>(count));
    for (float& v : values) v = dist(rng_);
    return values;
  }
  std::mt19937& rng() { return rng_; }

 private:
  std::mt19937 rng_;
};

class Builder {
 public:
  Builder(ModelParameters& parameters, uint32_t seed, WeightFormat format)
      : p_(parameters), draw_(seed), format_(format) {}

  TensorView f32(Shape shape, float stddev, float mean = 0.0f) {
    const std::vector<float> values = draw_.normal(shape.product(), stddev, mean);
    Tensor tensor = Tensor::empty(DType::kF32, shape);
    std::copy(values.begin(), values.end(), tensor.data<float>());
    return keep(std::move(tensor));
  }
  // A norm weight (bf16 in the released format).
  TensorView norm(int64_t dim) { return maybe_bf16(f32({dim}, 0.1f, 1.0f)); }
  TensorView maybe_bf16(const TensorView& view) {
    if (format_ == WeightFormat::kDense) return view;
    Tensor tensor = Tensor::empty(DType::kBF16, view.shape());
    convert_from_f32(view.data<float>(), DType::kBF16, tensor.view().raw_data(), view.numel());
    return keep(std::move(tensor));
  }
  // A dense-role linear: f32, or fp8 e4m3 with 32x32 ue8m0 block scales.
  ops::LinearWeight linear(int64_t out, int64_t in, bool quantized_role) {
    const TensorView dense = f32({out, in}, 1.0f / std::sqrt(static_cast<float>(in)));
    if (format_ == WeightFormat::kDense || !quantized_role) {
      return ops::LinearWeight{maybe_bf16(dense), TensorView()};
    }
    const int64_t sr = (out + 31) / 32, sc = (in + 31) / 32;
    Tensor q = Tensor::empty(DType::kF8E4M3, {out, in});
    Tensor s = Tensor::empty(DType::kF8E8M0, {sr, sc});
    auto* qb = static_cast<uint8_t*>(q.view().raw_data());
    auto* sb = static_cast<uint8_t*>(s.view().raw_data());
    for (int64_t bi = 0; bi < sr; ++bi) {
      for (int64_t bj = 0; bj < sc; ++bj) {
        float amax = 0;
        for (int64_t i = bi * 32; i < std::min(out, bi * 32 + 32); ++i)
          for (int64_t j = bj * 32; j < std::min(in, bj * 32 + 32); ++j)
            amax = std::max(amax, std::fabs(dense.data<float>()[i * in + j]));
        const uint8_t code = e8m0_pow2_ceil(std::max(amax, 1e-8f) / 448.0f);
        sb[bi * sc + bj] = code;
        const float scale = e8m0_to_float(code);
        for (int64_t i = bi * 32; i < std::min(out, bi * 32 + 32); ++i)
          for (int64_t j = bj * 32; j < std::min(in, bj * 32 + 32); ++j)
            qb[i * in + j] = float_to_e4m3_saturate(dense.data<float>()[i * in + j] / scale);
      }
    }
    return ops::LinearWeight{keep(std::move(q)), keep(std::move(s))};
  }
  // A routed-expert linear: f32, or packed fp4 e2m1 with ue8m0 scales per 32 along `in`.
  ops::LinearWeight expert(int64_t out, int64_t in) {
    const TensorView dense = f32({out, in}, 1.0f / std::sqrt(static_cast<float>(in)));
    if (format_ == WeightFormat::kDense) return ops::LinearWeight{dense, TensorView()};
    Tensor q = Tensor::empty(DType::kF4E2M1x2, {out, in});
    Tensor s = Tensor::empty(DType::kF8E8M0, {out, in / 32});
    std::vector<uint8_t> codes(static_cast<size_t>(out * in));
    auto* sb = static_cast<uint8_t*>(s.view().raw_data());
    for (int64_t i = 0; i < out; ++i) {
      for (int64_t b = 0; b < in / 32; ++b) {
        float amax = 0;
        for (int64_t j = b * 32; j < b * 32 + 32; ++j)
          amax = std::max(amax, std::fabs(dense.data<float>()[i * in + j]));
        const uint8_t code = e8m0_pow2_ceil(std::max(amax, 1e-8f) / 6.0f);
        sb[i * (in / 32) + b] = code;
        for (int64_t j = b * 32; j < b * 32 + 32; ++j) {
          codes[static_cast<size_t>(i * in + j)] =
              float_to_e2m1(dense.data<float>()[i * in + j] / e8m0_to_float(code));
        }
      }
    }
    pack_fp4(codes.data(), static_cast<uint8_t*>(q.view().raw_data()), out * in);
    return ops::LinearWeight{keep(std::move(q)), keep(std::move(s))};
  }
  // The engram table: f32, or e4m3 rows with a ue8m0 scale per 32 columns.
  std::pair<TensorView, TensorView> engram_table(int64_t rows, int64_t dim) {
    const TensorView dense = f32({rows, dim}, 1.0f);
    if (format_ == WeightFormat::kDense) return {dense, TensorView()};
    Tensor q = Tensor::empty(DType::kF8E4M3, {rows, dim});
    Tensor s = Tensor::empty(DType::kF8E8M0, {rows, dim / 32});
    auto* qb = static_cast<uint8_t*>(q.view().raw_data());
    auto* sb = static_cast<uint8_t*>(s.view().raw_data());
    for (int64_t i = 0; i < rows * dim / 32; ++i) {
      float amax = 0;
      for (int j = 0; j < 32; ++j)
        amax = std::max(amax, std::fabs(dense.data<float>()[i * 32 + j]));
      sb[i] = e8m0_pow2_ceil(std::max(amax, 1e-8f) / 448.0f);
      for (int j = 0; j < 32; ++j) {
        qb[i * 32 + j] =
            float_to_e4m3_saturate(dense.data<float>()[i * 32 + j] / e8m0_to_float(sb[i]));
      }
    }
    return {keep(std::move(q)), keep(std::move(s))};
  }

 private:
  TensorView keep(Tensor tensor) {
    p_.owned.push_back(std::move(tensor));
    return p_.owned.back().view();
  }
  ModelParameters& p_;
  Draw draw_;
  WeightFormat format_;
};

}  // namespace

nlohmann::json tiny_config_json(const std::string& overrides) {
  const std::filesystem::path path =
      std::filesystem::path(DEEPINFER_SOURCE_DIR) / "tests/data/configs/tiny_forward_text.json";
  std::ifstream file(path);
  DI_CHECK(file.good(), "cannot open ", path.string());
  nlohmann::json object = nlohmann::json::parse(file);
  object.merge_patch(nlohmann::json::parse(overrides));
  return object;
}

DeepseekV41TextConfig tiny_config(const std::string& overrides) {
  return parse_text_config(tiny_config_json(overrides), "tiny test config");
}

std::shared_ptr<EngramHasher> tiny_hasher(DeepseekV41TextConfig& config, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t compressed = config.engram_compressed_vocab_size;
  std::vector<int32_t> map(static_cast<size_t>(config.vocab_size));
  for (size_t i = 0; i < map.size(); ++i) {
    map[i] = static_cast<int32_t>(i < static_cast<size_t>(compressed) ? i : rng() % compressed);
  }
  std::shuffle(map.begin(), map.end(), rng);
  auto hasher = std::make_shared<EngramHasher>(config, std::move(map));
  config.engram_num_embeddings.clear();
  for (int64_t e = 0; e < hasher->layers(); ++e)
    config.engram_num_embeddings.push_back(hasher->table_rows(e));
  return hasher;
}

std::unique_ptr<ModelParameters> random_parameters(const DeepseekV41TextConfig& c, uint32_t seed,
                                                   WeightFormat format) {
  auto parameters = std::make_unique<ModelParameters>();
  ModelParameters& p = *parameters;
  p.owned.reserve(4096);  // views point into owned tensors; avoid moving them around
  Builder b(p, seed, format);
  const int64_t d = c.hidden_size, hc = c.hc_mult, mix = c.hc_mix_rows();
  p.embed = b.maybe_bf16(b.f32({c.vocab_size, d}, 1.0f));
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    LayerParameters lp;
    lp.attn_norm = b.norm(d);
    lp.ffn_norm = b.norm(d);
    lp.hc_attn_fn = b.f32({mix, hc * d}, 0.1f);
    lp.hc_attn_base = b.f32({mix}, 0.5f);
    lp.hc_attn_scale = b.f32({3}, 0.2f, 1.0f);
    lp.hc_ffn_fn = b.f32({mix, hc * d}, 0.1f);
    lp.hc_ffn_base = b.f32({mix}, 0.5f);
    lp.hc_ffn_scale = b.f32({3}, 0.2f, 1.0f);
    AttentionParameters& a = lp.attn;
    const int64_t h = c.num_attention_heads, hd = c.head_dim;
    a.wq_a = b.linear(c.q_lora_rank, d, true);
    a.q_norm = b.norm(c.q_lora_rank);
    a.wq_b = b.linear(h * hd, c.q_lora_rank, true);
    a.wkv = b.linear(hd, d, true);
    a.kv_norm = b.norm(hd);
    // wo_a is run dense in both numerics (the reference dequantizes it).
    a.wo_a = ops::LinearWeight{b.f32({c.o_groups * c.o_lora_rank, h * hd / c.o_groups},
                                     1.0f / std::sqrt(static_cast<float>(h * hd / c.o_groups))),
                               TensorView()};
    a.wo_b = b.linear(d, c.o_groups * c.o_lora_rank, true);
    a.attn_sink = b.f32({h}, 1.0f);
    if (c.is_kv_source(layer)) {
      a.compressor_wkv = b.linear(hd, d, false);
      if (c.compress_ratio(layer) > 1) a.compressor_wgate = b.linear(hd, d, false);
      a.compressor_norm = b.norm(hd);
    }
    if (c.is_index_source(layer)) {
      a.indexer_wq_b = b.linear(c.index_n_heads * c.index_head_dim, c.q_lora_rank, true);
      a.indexer_weights_proj = b.linear(c.index_n_heads, d, false);
      if (c.is_kv_source(layer)) {
        a.indexer_wk = b.linear(c.index_head_dim, hd, false);
        a.indexer_k_norm = b.norm(c.index_head_dim);
      }
    }
    lp.gate_weight = b.maybe_bf16(b.f32({c.n_routed_experts, d}, 0.5f));
    lp.gate_bias = b.f32({c.n_routed_experts}, 0.1f);
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      lp.experts.push_back({b.expert(c.moe_intermediate_size, d),
                            b.expert(d, c.moe_intermediate_size),
                            b.expert(c.moe_intermediate_size, d)});
    }
    lp.shared_expert = {b.linear(c.moe_intermediate_size, d, true),
                        b.linear(d, c.moe_intermediate_size, true),
                        b.linear(c.moe_intermediate_size, d, true)};
    const int64_t engram_index = c.engram_index(layer);
    if (engram_index >= 0) {
      EngramParameters ep;
      auto [table, scale] = b.engram_table(
          c.engram_num_embeddings[static_cast<size_t>(engram_index)], c.engram_head_dim);
      ep.table = table;
      ep.table_scale = scale;
      ep.wkv = b.linear(d * (hc + 1), c.engram_hash_columns() * c.engram_head_dim, true);
      ep.qk = b.f32({hc, d}, 0.5f, 1.0f);
      lp.engram = ep;
    }
    p.layers.push_back(std::move(lp));
  }
  p.norm = b.norm(d);
  p.head = ops::LinearWeight{
      b.maybe_bf16(b.f32({c.vocab_size, d}, 1.0f / std::sqrt(static_cast<float>(d)))),
      TensorView()};
  return parameters;
}

}  // namespace deepinfer::deepseek_v41::testing
