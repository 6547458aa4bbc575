// Whole-model benchmark of the DeepSeek-V4.1-Flash forward (issue 7): decode-step time at
// several batch sizes and contexts and prefill throughput, each next to its roofline measured in
// the same run (bytes that must move / measured HBM read bandwidth for decode; FLOPs / dense FP8
// peak for prefill).
//
// The model is the released text config at full width with fewer layers (a representative mix
// of every layer kind by default, or the first L layers), random weights in the released
// storage formats drawn on the device, and request states filled with random data and advanced
// to the context (prefilling 256 x 32k tokens would take far too long). Per-layer times come
// from GPU events recorded by the model's layer observer, so each layer kind's time can be
// projected onto the 40-layer schedule.
//
//   cuda_model_bench [--layers L --mix first] [--fp8-peak-tflops X] [--json PATH] ...
//   cuda_model_bench --device cpu --tiny      (the host logic on the tests' tiny config)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <compare>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype_convert.h"
#include "core/error.h"
#include "kernel_trace.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/engram_hash.h"
#include "model/deepseek_v41/loader.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/parameters.h"
#include "model/deepseek_v41/state.h"
#include "model/deepseek_v41/weights.h"
#include "model_bench_device.h"
#include "ops/batch_invariance.h"
#include "ops/cuda/cuda_runtime.h"
#include "ops/ops.h"

namespace deepinfer::model_bench {
namespace {

using deepseek_v41::DeepseekV41TextConfig;
using deepseek_v41::ForwardRequest;
using deepseek_v41::Model;
using deepseek_v41::ModelParameters;
using deepseek_v41::RequestState;
using deepseek_v41::WeightRole;
using deepseek_v41::WeightSpec;
using Json = nlohmann::json;

// The released layers the default mix runs, one of each kind the 40-layer schedule has:
// 0 sliding only; 1 sliding + engram; 2 ratio-2 KV and index source; 3 ratio-2 reuse; 20 ratio-1
// KV, index and candidate source; 21 ratio-1 reuse; 24 ratio-1 re-indexing inside candidates.
// Layer 14 (ratio-2 source + engram) is projected as layer 2 plus the engram's cost (1 - 0).
const std::vector<int64_t> kRepresentativeLayers = {0, 1, 2, 3, 20, 21, 24};

struct Options {
  std::string device = "cuda";
  bool tiny = false;
  std::string mix = "representative";  // or "first"
  int64_t layers = 4;                  // with --mix first
  std::string config_path = "tests/data/configs/deepseek_v41_flash_config.json";
  std::string tiny_config_path = "tests/data/configs/tiny_forward_text.json";
  std::vector<int64_t> batches = {1, 16, 64, 256};
  std::vector<int64_t> contexts = {4096, 32768};
  int steps = 5;
  int64_t prefill_tokens = 8192;
  int64_t prefill_split = 4;  // also as this many requests of prefill_tokens / split (0: off)
  double fp8_peak_tflops =
      1448.0;                   // docs/BENCHMARKS.md's cuBLASLt 8192^3; the lead passes the run's
  double bandwidth_gbps = 0.0;  // 0: measure
  // Cases not started this long after the model is ready (weights drawn: 2-13 s, which a budget
  // counted from the start used to eat: 2026-12-07 22:40, every case of a 6 s budget skipped).
  double time_budget_s = 50.0;
  int64_t engram_vocab_size = 160000;  // shrinks the engram tables (see the report)
  uint64_t seed = 20261130;
  std::string json_path;
  bool dry_run = false;  // config and cost model only
  bool trace = true;     // one extra step of each case under the CUPTI kernel trace (GPU only)
};

// ---- progress -------------------------------------------------------------------------------

const auto kStart = std::chrono::steady_clock::now();

double seconds_since_start() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - kStart).count();
}

// A progress line with the UTC time and the seconds since start, flushed at once so that a run
// cut short by a timeout still shows how far it got.
__attribute__((format(printf, 1, 2))) void progress(const char* format, ...) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[16];
  std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &utc);
  std::printf("[%s +%6.1fs] ", stamp, seconds_since_start());
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
  std::printf("\n");
  std::fflush(stdout);
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// ---- config -----------------------------------------------------------------------------------

Json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) DI_THROW("cannot open ", path, " (run from the repository root or pass --config)");
  return Json::parse(in);
}

Json released_quantization() {
  return Json{{"quant_method", "fp8"},
              {"activation_scheme", "dynamic"},
              {"weight_block_size", {32, 32}},
              {"scale_fmt", "ue8m0"},
              {"expert_dtype", "fp4"}};
}

// The released text config restricted to `real_layers` (ascending), with the released
// schedule's roles of those layers renumbered.
Json restrict_config(Json composite, const DeepseekV41TextConfig& full,
                     const std::vector<int64_t>& real_layers, int64_t engram_vocab_size) {
  Json& text = composite.contains("text_config") ? composite["text_config"] : composite;
  const int64_t n = static_cast<int64_t>(real_layers.size());
  std::vector<int64_t> ratios, kv, index, engram;
  int64_t candidate = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t real = real_layers[static_cast<size_t>(i)];
    ratios.push_back(full.compress_ratio(real));
    if (full.is_kv_source(real)) kv.push_back(i);
    if (full.is_index_source(real)) index.push_back(i);
    if (full.is_candidate_source(real)) candidate = i;
    if (full.engram_index(real) >= 0) engram.push_back(i);
  }
  for (int64_t i = 0; i < full.num_nextn_predict_layers; ++i) ratios.push_back(0);
  text["num_hidden_layers"] = n;
  text["compress_ratios"] = ratios;
  text["kv_source_layer_ids"] = kv;
  text["index_source_layer_ids"] = index;
  text["candidate_source_layer_id"] = candidate;
  text["engram_layer_ids"] = engram;
  text["engram_num_embeddings"] = std::vector<int64_t>(engram.size(), 0);  // set by the hasher
  text["engram_vocab_size"] = engram_vocab_size;
  text.erase("dspark_target_layer_ids");  // derived again for the smaller schedule
  text.erase("layer_types");
  return composite;
}

// The token map the engram needs (normally derived from the tokenizer): every compressed id
// used, the rest of the vocabulary folded onto them.
std::shared_ptr<deepseek_v41::EngramHasher> make_hasher(DeepseekV41TextConfig& config) {
  if (config.engram_layer_ids.empty()) return nullptr;
  const int64_t compressed = config.engram_compressed_vocab_size;
  DI_CHECK(compressed <= config.vocab_size, "engram compressed vocab larger than the vocab");
  std::vector<int32_t> map(static_cast<size_t>(config.vocab_size));
  for (int64_t token = 0; token < config.vocab_size; ++token)
    map[static_cast<size_t>(token)] = static_cast<int32_t>(token % compressed);
  auto hasher = std::make_shared<deepseek_v41::EngramHasher>(config, std::move(map));
  config.engram_num_embeddings.clear();
  for (int64_t e = 0; e < hasher->layers(); ++e)
    config.engram_num_embeddings.push_back(hasher->table_rows(e));
  return hasher;
}

// ---- weights ----------------------------------------------------------------------------------

uint64_t hash_name(const std::string& name) {  // FNV-1a
  uint64_t h = 0xCBF29CE484222325ull;
  for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001B3ull;
  return h;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ue8m0 code of the power of two >= `value`.
uint8_t ue8m0_ceil(double value) {
  return static_cast<uint8_t>(127 + static_cast<int>(std::ceil(std::log2(value))));
}

// Whether the loader keeps the FP8 wo_a as stored (deepseek_v41::keeps_wo_a_as_stored:
// DEEPINFER_WO_A_FP8=1 and each group whole scale blocks) rather than dequantizing it on the host.
// Shapes only: the views repeat one byte.
bool loader_keeps_wo_a(const WeightSpec& weight, const WeightSpec& scale, int64_t groups) {
  static std::byte byte{};
  const auto shaped = [](const WeightSpec& spec) {
    return TensorView(&byte, 1, 0, spec.dtype, Shape(std::span<const int64_t>(spec.shape)),
                      Strides{0, 0});
  };
  return deepseek_v41::keeps_wo_a_as_stored({shaped(weight), shaped(scale)}, groups);
}

// Random released-format parameters, built by the loader's own build_parameters from tensors
// allocated and filled on `device` as it asks for them. The few tensors the loader converts on
// the host (f32 mixes, sinks, gate biases, the engram's q/k; wo_a where the loader dequantizes
// it, as for the tests' tiny config) are made on the host and moved afterwards.
struct RandomModel {
  std::map<std::string, Tensor> tensors;
  std::unique_ptr<ModelParameters> parameters;
  double device_bytes = 0;
};

std::unique_ptr<RandomModel> make_random_model(const DeepseekV41TextConfig& config, Device device,
                                               uint64_t seed) {
  auto model = std::make_unique<RandomModel>();
  Allocator& target = ops::allocator_for(device);
  std::map<std::string, const WeightSpec*> specs;
  const std::vector<WeightSpec> table =
      deepseek_v41::build_weight_table(config, deepseek_v41::WeightLayout::kReleased);
  for (const WeightSpec& spec : table) specs.emplace(spec.name, &spec);

  // Weights of magnitude initializer_range; scales so that 5 sigma fits e4m3's 448 and 2.5 sigma
  // e2m1's 6 (the rare larger draws saturate, as the reference's quantizer would not need to).
  const double sigma = config.initializer_range;
  const uint8_t fp8_scale = ue8m0_ceil(5.0 * sigma / 448.0);
  const uint8_t fp4_scale = ue8m0_ceil(2.5 * sigma / 6.0);
  const auto scale_value = [](uint8_t code) { return std::ldexp(1.0, int{code} - 127); };
  std::set<std::string> host_names;
  for (const WeightSpec& spec : table) {
    const bool converted_on_host = spec.dtype == DType::kF32 ||
                                   ends_with(spec.name, "engram.q_weight") ||
                                   ends_with(spec.name, "engram.k_weight");
    const bool dense_wo_a = ends_with(spec.name, "attn.wo_a.weight") &&
                            (spec.scale_name.empty() ||
                             !loader_keeps_wo_a(spec, *specs.at(spec.scale_name), config.o_groups));
    if (converted_on_host || dense_wo_a) {
      host_names.insert(spec.name);
      if (!spec.scale_name.empty()) host_names.insert(spec.scale_name);
    }
  }

  const auto lookup = [&](const std::string& name) -> TensorView {
    if (auto found = model->tensors.find(name); found != model->tensors.end())
      return found->second.view();
    const auto it = specs.find(name);
    DI_CHECK(it != specs.end(), "no weight spec ", name);
    const WeightSpec& spec = *it->second;
    const bool on_host = device.is_cpu() || host_names.count(name) > 0;
    Tensor tensor = Tensor::empty(spec.dtype, Shape(std::span<const int64_t>(spec.shape)),
                                  on_host ? host_allocator() : target);
    FillSpec fill;
    switch (spec.role) {
      case WeightRole::kPlain:
        fill.kind = FillKind::kNormal;
        fill.mean = spec.init == deepseek_v41::WeightInit::kOnes ? 1.0f : 0.0f;
        fill.stddev =
            spec.init == deepseek_v41::WeightInit::kNormal ? static_cast<float>(sigma) : 0.0f;
        break;
      case WeightRole::kFp8Block:
      case WeightRole::kEngramTable:
        fill.kind = FillKind::kE4m3;
        fill.stddev = static_cast<float>(sigma / scale_value(fp8_scale));
        break;
      case WeightRole::kFp8BlockScale:
      case WeightRole::kEngramScale:
        fill.kind = FillKind::kByte;
        fill.byte = fp8_scale;
        break;
      case WeightRole::kFp4Packed:
        fill.kind = FillKind::kE2m1Packed;
        fill.stddev = static_cast<float>(sigma / scale_value(fp4_scale));
        break;
      case WeightRole::kFp4Scale:
        fill.kind = FillKind::kByte;
        fill.byte = fp4_scale;
        break;
    }
    DI_CHECK(spec.role != WeightRole::kFp8BlockScale || spec.dtype == DType::kF8E8M0,
             "expected ue8m0 scales for ", name);
    fill_tensor(tensor.view(), fill, seed ^ hash_name(name));
    if (!on_host) model->device_bytes += static_cast<double>(tensor.view().nbytes());
    const TensorView view = tensor.view();
    model->tensors.emplace(name, std::move(tensor));
    return view;
  };
  model->parameters =
      deepseek_v41::build_parameters(config, deepseek_v41::WeightLayout::kReleased, lookup);
  ModelParameters& p = *model->parameters;
  if (device.is_cuda()) {
    deepseek_v41::for_each_view(p, [&](TensorView& view) {
      if (view.numel() == 0 || view.device() == device) return;
      Tensor copy = Tensor::empty(view.dtype(), view.shape(), target);
      ops::copy(view, copy.view());
      model->device_bytes += static_cast<double>(copy.view().nbytes());
      p.owned.push_back(std::move(copy));
      view = p.owned.back().view();
    });
    ops::synchronize(device);
    // The host tensors are no longer referenced.
    std::erase_if(p.owned, [](const Tensor& tensor) { return tensor.device().is_cpu(); });
    std::erase_if(model->tensors, [](const auto& entry) { return entry.second.device().is_cpu(); });
  }
  deepseek_v41::for_each_view(p, [&](TensorView& view) {
    DI_CHECK(view.numel() == 0 || view.device() == device, "parameter ", view.to_string(),
             " is not on ", device.to_string());
  });
  return model;
}

// ---- states -----------------------------------------------------------------------------------

double state_bytes(const DeepseekV41TextConfig& c, int64_t max_tokens, int64_t max_rollback) {
  double bytes = static_cast<double>(c.num_hidden_layers) * (c.sliding_window + max_rollback) *
                 c.head_dim * 4.0;
  for (int64_t layer : c.kv_source_layer_ids) {
    const int64_t ratio = c.compress_ratio(layer);
    const double groups = static_cast<double>(max_tokens / ratio + 1);
    bytes += groups * c.head_dim * 4.0;
    if (c.is_index_source(layer)) bytes += groups * (c.index_head_dim / 2 + c.index_head_dim / 32);
    if (ratio > 1) bytes += 2.0 * (ratio + max_rollback) * c.head_dim * 4.0;
  }
  return bytes;
}

// A state whose every cache holds random finite rows, advanced to `context` (the next token
// goes to position `context`), with valid engram history ids. The attention's key rows (window
// and compressed) hold e4m3 values, bf16-exact as the model's cached rows are (window rows e4m3 x
// a power of two, compressed rows e2m1 x an e4m3 scale), so decode takes the kernels a served
// model takes: arbitrary f32 rows would send every token down the f32-key paths (three key terms,
// and with batch invariance off the prefill kernel's fallback). Until 2026-12-01 22:33 UTC the
// rows were N(0, 1) f32 (docs/BENCHMARKS.md).
std::unique_ptr<RequestState> filled_state(const DeepseekV41TextConfig& c, int64_t context,
                                           Allocator& allocator, uint64_t seed) {
  auto state = std::make_unique<RequestState>(
      c, deepseek_v41::StateLimits{context + 1, /*max_rollback=*/1}, allocator);
  const FillSpec rows{FillKind::kNormal, 0.0f, 1.0f};
  const FillSpec key_rows{FillKind::kE4m3Values, 0.0f, 1.0f};
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer)
    fill_tensor(state->window(layer), key_rows, seed ^ hash_name("window" + std::to_string(layer)));
  for (int64_t layer : c.kv_source_layer_ids) {
    const std::string tag = std::to_string(layer);
    fill_tensor(state->compressed_kv(layer), key_rows, seed ^ hash_name("compressed" + tag));
    if (c.is_index_source(layer)) {
      // Codes of N(0, 2) (most of the grid) under a scale of 2^-2: keys of magnitude ~1.
      const ops::IndexerKeys keys = state->index_keys(layer);
      fill_tensor(keys.codes, {FillKind::kE2m1Packed, 0.0f, 2.0f}, seed ^ hash_name("keys" + tag));
      FillSpec scales{FillKind::kByte};
      scales.byte = 125;
      fill_tensor(keys.scales, scales, seed ^ hash_name("key scales" + tag));
    }
    fill_tensor(state->pending_kv(layer), rows, seed ^ hash_name("pending_kv" + tag));
    fill_tensor(state->pending_gate(layer), rows, seed ^ hash_name("pending_gate" + tag));
  }
  if (state->history_capacity() > 0) {
    const TensorView history =
        TensorView::contiguous(state->engram_history(), DType::kI32, {state->history_capacity()});
    FillSpec ids{FillKind::kIndex};
    ids.index_bound = static_cast<int32_t>(c.engram_compressed_vocab_size);
    fill_tensor(history, ids, seed ^ hash_name("history"));
  }
  state->advance(context);
  return state;
}

// ---- cost model ------------------------------------------------------------------------------

// What a step must move and compute, from the config and the released storage formats: the
// floor an implementation reading the release's compact caches would meet (ours keeps f32
// caches; the "as stored here" figure counts those). The weights are read as released, wo_a
// included, so both figures count the same weight bytes.
class CostModel {
 public:
  explicit CostModel(const DeepseekV41TextConfig& config) : c_(config) {
    const std::vector<WeightSpec> table =
        deepseek_v41::build_weight_table(config, deepseek_v41::WeightLayout::kReleased);
    layer_bytes_.assign(static_cast<size_t>(c_.num_hidden_layers), 0.0);
    for (const WeightSpec& spec : table) {
      const double bytes =
          static_cast<double>(dtype_storage_bytes(spec.dtype, spec.element_count()));
      if (spec.layer < 0) {
        if (spec.name.rfind("head.", 0) == 0) head_bytes_ += bytes;
        if (spec.name == "embed.weight")
          embed_row_bytes_ = bytes / static_cast<double>(c_.vocab_size);
        continue;
      }
      const std::string expert0 = "layers." + std::to_string(spec.layer) + ".ffn.experts.0.";
      if (spec.name.find(".ffn.experts.") != std::string::npos) {
        if (spec.layer == 0 && spec.name.rfind(expert0, 0) == 0) expert_bytes_ += bytes;
        continue;
      }
      if (spec.role == WeightRole::kEngramTable || spec.role == WeightRole::kEngramScale ||
          ends_with(spec.name, "gate.bias_vl")) {
        continue;
      }
      layer_bytes_[static_cast<size_t>(spec.layer)] += bytes;
    }
    engram_row_bytes_ = static_cast<double>(c_.engram_head_dim) * (1.0 + 1.0 / 32.0);
  }

  double expected_distinct_experts(int64_t tokens) const {
    const double e = static_cast<double>(c_.n_routed_experts);
    const double k = static_cast<double>(c_.num_experts_per_tok);
    return e * (1.0 - std::pow(1.0 - k / e, static_cast<double>(tokens)));
  }

  // Compressed entries a query at `position` sees in the cache layer `layer` reads.
  int64_t entries(int64_t layer, int64_t position) const {
    const int64_t source = c_.kv_source_of(layer);
    return source < 0 ? 0 : (position + 1) / c_.compress_ratio(source);
  }
  int64_t scored_entries(int64_t layer, int64_t position) const {
    const int64_t n = entries(layer, position);
    return c_.uses_candidates(layer)
               ? std::min<int64_t>(n, c_.candidate_topk_blocks * c_.candidate_block_size)
               : n;
  }

  struct Bytes {
    double weights = 0, cache = 0, cache_here = 0;
    double total() const { return weights + cache; }
    double total_here() const { return weights + cache_here; }  // the weights as released
  };

  // One decode step: `batch` requests, one token each at position `context`.
  Bytes decode_bytes(int64_t batch, int64_t context) const {
    Bytes b;
    const double distinct = expected_distinct_experts(batch);
    const double engram_rows = static_cast<double>(batch) *
                               static_cast<double>(c_.engram_layer_ids.size()) *
                               static_cast<double>(c_.engram_hash_columns());
    const double shared = head_bytes_ + static_cast<double>(batch) * embed_row_bytes_ +
                          engram_rows * engram_row_bytes_;
    b.weights = shared;
    for (int64_t layer = 0; layer < c_.num_hidden_layers; ++layer) {
      b.weights += layer_bytes_[static_cast<size_t>(layer)] + distinct * expert_bytes_;
    }
    const double dh = static_cast<double>(c_.head_dim), di = static_cast<double>(c_.index_head_dim);
    const double window_row = dh + dh / 32.0;            // e4m3 + a ue8m0 scale per 32
    const double compressed_row = dh / 2.0 + dh / 16.0;  // e2m1 + an e4m3 scale per 16
    const double key_row = di / 2.0 + di / 32.0;         // e2m1 + a ue8m0 scale per 32
    for (int64_t layer = 0; layer < c_.num_hidden_layers; ++layer) {
      const double window = static_cast<double>(std::min(context + 1, c_.sliding_window));
      double selected = 0, scored = 0;
      if (c_.compress_ratio(layer) > 0) {
        selected = static_cast<double>(std::min(c_.index_topk, entries(layer, context)));
        if (c_.is_index_source(layer)) scored = static_cast<double>(scored_entries(layer, context));
      }
      b.cache += batch * (window * window_row + selected * compressed_row + scored * key_row);
      // Here: f32 rows; the indexer scores every entry and masks the non-candidates.
      const double scored_here = c_.is_index_source(layer) && c_.compress_ratio(layer) > 0
                                     ? static_cast<double>(entries(layer, context))
                                     : 0.0;
      b.cache_here += batch * ((window + selected) * dh * 4.0 + scored_here * di * 4.0);
    }
    return b;
  }

  // FLOPs of one token at `position` through every layer (no LM head).
  double token_flops(int64_t position) const {
    const double d = static_cast<double>(c_.hidden_size);
    const double h = static_cast<double>(c_.num_attention_heads);
    const double dh = static_cast<double>(c_.head_dim);
    const double lq = static_cast<double>(c_.q_lora_rank);
    const double hi = static_cast<double>(c_.index_n_heads);
    const double di = static_cast<double>(c_.index_head_dim);
    const double inter = static_cast<double>(c_.moe_intermediate_size);
    const double mix_rows = static_cast<double>(c_.hc_mix_rows());
    const double hc = static_cast<double>(c_.hc_mult);
    double flops = 0;
    for (int64_t layer = 0; layer < c_.num_hidden_layers; ++layer) {
      const int64_t ratio = c_.compress_ratio(layer);
      flops += 2 * 2 * hc * d * mix_rows;                                    // hc mixes, 2 sites
      flops += 2 * d * lq + 2 * lq * h * dh + 2 * d * dh;                    // wq_a, wq_b, wkv
      flops += 2 * h * dh * static_cast<double>(c_.o_lora_rank)              // wo_a (grouped)
               + 2 * static_cast<double>(c_.o_groups * c_.o_lora_rank) * d;  // wo_b
      double keys = static_cast<double>(std::min(position + 1, c_.sliding_window));
      if (ratio > 0) keys += static_cast<double>(std::min(c_.index_topk, entries(layer, position)));
      flops += 4 * h * dh * keys;  // scores and values
      if (c_.is_kv_source(layer)) {
        flops += 2 * d * dh * (ratio > 1 ? 2 : 1);  // compressor wkv (+ wgate)
        if (c_.is_index_source(layer) && (position + 1) % ratio == 0) flops += 2 * dh * di;  // wk
      }
      if (c_.is_index_source(layer) && ratio > 0) {
        flops += 2 * lq * hi * di + 2 * d * hi;  // wq_b, weights
        flops += 2 * hi * di * static_cast<double>(scored_entries(layer, position));  // scores
      }
      flops += 2 * d * static_cast<double>(c_.n_routed_experts);                     // gate
      flops += static_cast<double>(c_.num_experts_per_tok + 1) * 3 * 2 * d * inter;  // experts
      if (c_.engram_index(layer) >= 0) {
        flops += 2 * static_cast<double>(c_.engram_hash_columns() * c_.engram_head_dim) * d *
                 (hc + 1);  // engram wkv
      }
    }
    return flops;
  }
  double head_flops_per_row() const {
    return 2.0 * static_cast<double>(c_.hidden_size) * static_cast<double>(c_.vocab_size);
  }

  double weight_bytes_total() const {
    double total = head_bytes_ + embed_row_bytes_ * static_cast<double>(c_.vocab_size);
    for (double bytes : layer_bytes_) total += bytes + expert_bytes_ * c_.n_routed_experts;
    return total;
  }

 private:
  const DeepseekV41TextConfig& c_;
  std::vector<double> layer_bytes_;
  double expert_bytes_ = 0, head_bytes_ = 0, embed_row_bytes_ = 0, engram_row_bytes_ = 0;
};

// ---- layer kinds and the 40-layer projection ---------------------------------------------

struct LayerKind {
  int64_t ratio = 0;
  bool kv_source = false, index_source = false, candidate_source = false, uses_candidates = false;
  bool engram = false;
  auto operator<=>(const LayerKind&) const = default;
  std::string name() const {
    std::string text = ratio == 0 ? "sliding" : "ratio" + std::to_string(ratio);
    if (kv_source) text += "+kv_source";
    if (index_source) text += uses_candidates ? "+reindex" : "+index";
    if (candidate_source) text += "+candidates";
    if (ratio > 0 && !kv_source && !index_source) text += "+reuse";
    if (engram) text += "+engram";
    return text;
  }
};

LayerKind kind_of(const DeepseekV41TextConfig& c, int64_t layer) {
  LayerKind kind;
  kind.ratio = c.compress_ratio(layer);
  kind.kv_source = c.is_kv_source(layer);
  kind.index_source = c.is_index_source(layer);
  kind.candidate_source = c.is_candidate_source(layer);
  kind.uses_candidates = c.uses_candidates(layer);
  kind.engram = c.engram_index(layer) >= 0;
  return kind;
}

// Per-kind times from the measured layers; the 40-layer step is outside + the sum over the
// released schedule of its layers' kind times (an engram kind not measured is its plain kind
// plus the measured engram delta).
struct Projection {
  bool complete = true;
  double step_ms = 0;
  std::vector<std::string> missing;
  Json kind_ms = Json::object();  // measured mean per layer kind, plus the engram delta
};

Projection project(const DeepseekV41TextConfig& measured, const std::vector<double>& layer_ms,
                   double outside_ms, const DeepseekV41TextConfig& full) {
  std::map<LayerKind, std::vector<double>> samples;
  for (int64_t layer = 0; layer < measured.num_hidden_layers; ++layer)
    samples[kind_of(measured, layer)].push_back(layer_ms[static_cast<size_t>(layer)]);
  std::map<LayerKind, double> kind_ms;
  for (const auto& [kind, values] : samples)
    kind_ms[kind] = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
  std::optional<double> engram_delta;
  for (const auto& [kind, ms] : kind_ms) {
    if (!kind.engram) continue;
    LayerKind plain = kind;
    plain.engram = false;
    if (auto it = kind_ms.find(plain); it != kind_ms.end()) engram_delta = ms - it->second;
  }
  Projection projection;
  projection.step_ms = outside_ms;
  for (const auto& [kind, ms] : kind_ms) projection.kind_ms[kind.name()] = ms;
  if (engram_delta) projection.kind_ms["engram_delta"] = *engram_delta;
  for (int64_t layer = 0; layer < full.num_hidden_layers; ++layer) {
    const LayerKind kind = kind_of(full, layer);
    if (auto it = kind_ms.find(kind); it != kind_ms.end()) {
      projection.step_ms += it->second;
      continue;
    }
    LayerKind plain = kind;
    plain.engram = false;
    if (kind.engram && engram_delta && kind_ms.count(plain)) {
      projection.step_ms += kind_ms[plain] + *engram_delta;
      continue;
    }
    projection.complete = false;
    projection.missing.push_back(kind.name());
  }
  std::sort(projection.missing.begin(), projection.missing.end());
  projection.missing.erase(std::unique(projection.missing.begin(), projection.missing.end()),
                           projection.missing.end());
  return projection;
}

// ---- timing -----------------------------------------------------------------------------------

// Marks before the step, after every layer (the model's layer observer) and after the step:
// GPU events on a device model, host clocks on a host one (whose ops are synchronous).
class StepMarks {
 public:
  StepMarks(Device device, int64_t layers) : slots_(static_cast<int>(layers) + 2) {
    if (device.is_cuda()) events_ = std::make_unique<EventMarks>(slots_);
    host_.resize(static_cast<size_t>(slots_));
  }
  int slots() const { return slots_; }
  void record(int slot) {
    if (events_) events_->record(slot);
    host_[static_cast<size_t>(slot)] = std::chrono::steady_clock::now();
  }
  // Waits for the step; returns [step, layer 0 .. layer L-1, after the last layer] in ms.
  std::vector<double> intervals() {
    if (events_) events_->wait();
    std::vector<double> out;
    out.push_back(elapsed(0, slots_ - 1));
    for (int slot = 1; slot < slots_; ++slot) out.push_back(elapsed(slot - 1, slot));
    return out;
  }
  // The same intervals on the host clock: how long the host took to enqueue the step and each
  // layer. On a device model, host intervals as long as the GPU's say the step is launch-bound.
  std::vector<double> host_intervals() const {
    std::vector<double> out;
    out.push_back(host_elapsed(0, slots_ - 1));
    for (int slot = 1; slot < slots_; ++slot) out.push_back(host_elapsed(slot - 1, slot));
    return out;
  }

 private:
  double elapsed(int from, int to) const {
    if (events_) return events_->elapsed_ms(from, to);
    return host_elapsed(from, to);
  }
  double host_elapsed(int from, int to) const {
    return std::chrono::duration<double, std::milli>(host_[static_cast<size_t>(to)] -
                                                     host_[static_cast<size_t>(from)])
        .count();
  }
  int slots_;
  std::unique_ptr<EventMarks> events_;
  std::vector<std::chrono::steady_clock::time_point> host_;
};

struct StepTimes {
  double step_ms = 0;
  std::vector<double> layer_ms;  // median per layer (layer 0 includes the step's prologue)
  double epilogue_ms = 0;        // final collapse, norm and LM head
  std::vector<double> steps_ms;
};

StepTimes summarize(const std::vector<std::vector<double>>& runs, int64_t layers) {
  StepTimes times;
  std::vector<double> epilogue;
  std::vector<std::vector<double>> per_layer(static_cast<size_t>(layers));
  for (const std::vector<double>& run : runs) {
    times.steps_ms.push_back(run[0]);
    for (int64_t layer = 0; layer < layers; ++layer)
      per_layer[static_cast<size_t>(layer)].push_back(run[static_cast<size_t>(layer) + 1]);
    epilogue.push_back(run.back());
  }
  times.step_ms = median(times.steps_ms);
  for (const auto& values : per_layer) times.layer_ms.push_back(median(values));
  times.epilogue_ms = median(epilogue);
  return times;
}

struct FiniteCheck {
  int64_t non_finite = 0;
  double max_abs = 0;
};

FiniteCheck check_logits(const TensorView& logits) {
  Tensor host = Tensor::empty(DType::kF32, logits.shape());
  ops::copy(logits, host.view());
  ops::synchronize(logits.device());
  FiniteCheck check;
  const float* values = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    if (!std::isfinite(values[i])) {
      ++check.non_finite;
    } else {
      check.max_abs = std::max(check.max_abs, static_cast<double>(std::fabs(values[i])));
    }
  }
  return check;
}

// One more run of `step` under the CUPTI kernel trace; prints where its time went.
template <typename Step>
Json traced(const char* label, Step&& step) {
  KernelTrace trace;
  trace.start();
  step();
  Json summary = trace.stop();
  if (summary.contains("error")) {
    progress("%s trace: %s", label, summary["error"].get<std::string>().c_str());
    return summary;
  }
  progress(
      "%s trace: GPU busy %.0f of %.0f us (%lld kernels summing %.0f us), %lld runtime "
      "calls holding the host %.0f us",
      label, summary["gpu_busy_us"].get<double>(), summary["span_us"].get<double>(),
      summary["kernel_count"].get<long long>(), summary["kernel_sum_us"].get<double>(),
      summary["runtime_call_count"].get<long long>(),
      summary["runtime_call_host_us"].get<double>());
  int shown = 0;
  for (const Json& kernel : summary["kernels"]) {
    if (shown++ == 8) break;
    progress("  %8.1f us %5lld x  %.110s", kernel["total_us"].get<double>(),
             kernel["count"].get<long long>(), kernel["name"].get<std::string>().c_str());
  }
  return summary;
}

// Prefill computes the LM head for the last row of each request only, where the Model offers
// that forward (as the engine samples); false: every row's logits (the head's FLOPs counted so).
constexpr bool kPrefillHeadOnLastRows = true;

template <typename M>
concept HasRowForward = requires(M& m, std::span<const ForwardRequest> requests,
                                 std::span<const int32_t> rows, const TensorView& out) {
  m.forward(requests, rows, out);
};
template <typename M>
constexpr bool kHasRowForward = (kPrefillHeadOnLastRows && HasRowForward<M>);

// The forward with logits of `rows` only where this Model has that overload (the LM head is
// then computed for the sampled rows of a prefill, as the engine does); else every row's.
template <typename M>
bool forward_rows(M& model, std::span<const ForwardRequest> requests, std::span<const int32_t> rows,
                  const TensorView& row_logits, const TensorView& all_logits) {
  if constexpr (kHasRowForward<M>) {
    model.forward(requests, rows, row_logits);
    return true;
  } else {
    model.forward(requests, all_logits);
    return false;
  }
}

// ---- the benchmark ---------------------------------------------------------------------------

class Bench {
 public:
  explicit Bench(Options options) : o_(std::move(options)) {}
  int run();

 private:
  bool over_budget(const char* what) {
    if (seconds_since_start() - model_ready_s_ < o_.time_budget_s) return false;
    progress("skipped %s: past the time budget of %.0f s after the model was ready", what,
             o_.time_budget_s);
    return true;
  }
  void setup();         // config and cost model (host only)
  void setup_device();  // roofline, weights, model
  void print_config() const;
  bool dry_run() const;  // false when the default mix misses a layer kind
  void decode_context(int64_t context);
  void prefill(int64_t requests, int64_t tokens_each);
  Json case_floor(double bytes, double flops) const;
  void print_tables() const;
  std::string json_path() const;
  void write_json();

  Options o_;
  double model_ready_s_ = 0.0;  // seconds since start when the weights were drawn
  Device device_ = Device::cpu();
  DeepseekV41TextConfig config_;       // as run
  DeepseekV41TextConfig full_config_;  // the released 40 layers (the projection's schedule)
  std::vector<int64_t> real_layers_;
  std::shared_ptr<deepseek_v41::EngramHasher> hasher_;
  std::unique_ptr<RandomModel> weights_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<CostModel> cost_, full_cost_;
  double bandwidth_gbps_ = 0;
  Json report_;
  int failures_ = 0;
};

void Bench::setup() {
  device_ = o_.device == "cuda" ? Device::cuda(0) : Device::cpu();
  if (o_.device != "cuda" && o_.device != "cpu") DI_THROW("--device must be cuda or cpu");
  // The encoders the device fills use must equal core's (checked here on every run).
  for (float v = -500.0f; v <= 500.0f; v += 0.0137f) {
    DI_CHECK(encode_e4m3_for_test(v) == float_to_e4m3_saturate(v), "e4m3 encoder differs at ", v);
    DI_CHECK(encode_e2m1_for_test(v / 64.0f) == float_to_e2m1(v / 64.0f),
             "e2m1 encoder differs at ", v / 64.0f);
  }
  for (float v : {0.0f, 1e-4f, 9.765625e-4f, 1.5e-3f, 0.015625f, 0.25f, 1.0f, 447.9f, 448.0f}) {
    DI_CHECK(encode_e4m3_for_test(v) == float_to_e4m3_saturate(v), "e4m3 encoder differs at ", v);
  }
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;  // the NaNs
    const auto byte = static_cast<uint8_t>(code);
    DI_CHECK(decode_e4m3_for_test(byte) == e4m3_to_float(byte), "e4m3 decoder differs at code ",
             code);
  }

  Json composite = read_json(o_.config_path);
  if (o_.tiny) {
    Json text = read_json(o_.tiny_config_path);
    if (!text.contains("quantization_config"))
      text["quantization_config"] = released_quantization();
    config_ = deepseek_v41::parse_config(text, o_.tiny_config_path).text;
    for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer)
      real_layers_.push_back(layer);
  } else {
    full_config_ = deepseek_v41::parse_config(composite, o_.config_path).text;
    if (o_.mix == "representative") {
      real_layers_ = kRepresentativeLayers;
    } else if (o_.mix == "first") {
      DI_CHECK(o_.layers >= 1 && o_.layers <= full_config_.num_hidden_layers, "--layers ",
               o_.layers);
      for (int64_t layer = 0; layer < o_.layers; ++layer) real_layers_.push_back(layer);
    } else {
      DI_THROW("--mix must be representative or first, got ", o_.mix);
    }
    config_ = deepseek_v41::parse_config(
                  restrict_config(composite, full_config_, real_layers_, o_.engram_vocab_size),
                  o_.config_path)
                  .text;
  }
  hasher_ = make_hasher(config_);
  if (o_.tiny) full_config_ = config_;  // the tiny model projects onto itself
  cost_ = std::make_unique<CostModel>(config_);
  full_cost_ = std::make_unique<CostModel>(full_config_);
  if (o_.dry_run) return;
}

void Bench::setup_device() {
  if (device_.is_cuda()) {
    cuda::device_allocator(0);  // checks the GPU
    if (o_.bandwidth_gbps <= 0) {
      bandwidth_gbps_ = measure_read_bandwidth_gbps(4ull << 30);
      progress("HBM read bandwidth (streaming 16-byte loads over 4 GiB): %.0f GB/s",
               bandwidth_gbps_);
    }
  }
  if (bandwidth_gbps_ <= 0) bandwidth_gbps_ = o_.bandwidth_gbps > 0 ? o_.bandwidth_gbps : 4558.0;
  print_config();
  weights_ = make_random_model(config_, device_, o_.seed);
  ops::synchronize(device_);
  progress("random weights on %s: %.2f GB", device_.to_string().c_str(),
           weights_->device_bytes * 1e-9);
  // DEEPINFER_BF16_WEIGHT_COPIES=1: as the engine's runner does (parameters.h says what it trades).
  size_t copy_bytes = 0;
  if (device_.is_cuda() && deepseek_v41::bf16_copies_requested() && !ops::batch_invariant()) {
    copy_bytes = deepseek_v41::add_bf16_copies(*weights_->parameters, ops::allocator_for(device_));
    progress("bf16 copies of the dense fp8 weights: %.2f GB",
             static_cast<double>(copy_bytes) * 1e-9);
  }
  report_["bf16_weight_copies_bytes"] = copy_bytes;
  // DEEPINFER_WO_A_FP8=1: wo_a read as stored (FP8) instead of its bf16 dequantization.
  const std::string wo_a_dtype(
      weights_->parameters->layers.empty()
          ? std::string_view("none")
          : dtype_name(weights_->parameters->layers.front().attn.wo_a.weight.dtype()));
  report_["wo_a_dtype"] = wo_a_dtype;
  progress("wo_a held as %s", wo_a_dtype.c_str());
  model_ = std::make_unique<Model>(config_, *weights_->parameters,
                                   deepseek_v41::Numerics::kReleased, hasher_);
  model_ready_s_ = seconds_since_start();

  report_["device"] = device_.to_string();
  // DEEPINFER_BATCH_INVARIANT=0 lets large GEMMs take kernels chosen by rows (docs/CUDA.md).
  report_["batch_invariant"] = ops::batch_invariant();
  progress("batch invariance %s", ops::batch_invariant() ? "on" : "off");
  report_["config"] = {{"layers", config_.num_hidden_layers},
                       {"mix", o_.tiny ? "tiny" : o_.mix},
                       {"released_layers", real_layers_},
                       {"layer_kinds", Json::array()},
                       {"engram_vocab_size", config_.engram_vocab_size},
                       {"engram_table_rows", config_.engram_num_embeddings},
                       {"weight_bytes_on_device", weights_->device_bytes}};
  for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer)
    report_["config"]["layer_kinds"].push_back(kind_of(config_, layer).name());
  report_["roofline"] = {{"hbm_read_gbps", bandwidth_gbps_},
                         {"hbm_read_measured", o_.bandwidth_gbps <= 0 && device_.is_cuda()},
                         {"fp8_peak_tflops", o_.fp8_peak_tflops}};
  report_["decode"] = Json::array();
  report_["prefill"] = Json::array();
}

void Bench::print_config() const {
  if (!config_.engram_layer_ids.empty()) {
    progress(
        "engram: vocab size %lld -> table rows %s of %lld bytes (+ scales); the released "
        "tables have %s",
        static_cast<long long>(config_.engram_vocab_size),
        Json(config_.engram_num_embeddings).dump().c_str(),
        static_cast<long long>(config_.engram_head_dim),
        Json(full_config_.engram_num_embeddings).dump().c_str());
  }
  progress("config: %lld layers (released layers %s), hidden %lld, %lld experts, vocab %lld",
           static_cast<long long>(config_.num_hidden_layers), Json(real_layers_).dump().c_str(),
           static_cast<long long>(config_.hidden_size),
           static_cast<long long>(config_.n_routed_experts),
           static_cast<long long>(config_.vocab_size));
  for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer) {
    progress("  layer %lld (released %lld): %s", static_cast<long long>(layer),
             static_cast<long long>(real_layers_[static_cast<size_t>(layer)]),
             kind_of(config_, layer).name().c_str());
  }
}

Json Bench::case_floor(double bytes, double flops) const {
  return {{"bytes", bytes},
          {"bandwidth_floor_ms", bytes / (bandwidth_gbps_ * 1e9) * 1e3},
          {"flops", flops},
          {"compute_floor_ms", flops / (o_.fp8_peak_tflops * 1e12) * 1e3}};
}

void Bench::decode_context(int64_t context) {
  if (over_budget("a decode context")) return;
  const int64_t max_batch = *std::max_element(o_.batches.begin(), o_.batches.end());
  const double per_state = state_bytes(config_, context + 1, 1);
  int64_t fits = max_batch;
  if (device_.is_cuda()) {
    // Leave room for the step's workspace and logits.
    const double reserve = 6e9 + static_cast<double>(max_batch) * config_.vocab_size * 4.0;
    const double free_bytes = static_cast<double>(device_free_bytes());
    fits = std::min<int64_t>(max_batch,
                             static_cast<int64_t>(std::max(0.0, free_bytes - reserve) / per_state));
    progress("context %lld: %.1f MB a request state here, %.1f GB free: %lld states fit",
             static_cast<long long>(context), per_state * 1e-6, free_bytes * 1e-9,
             static_cast<long long>(fits));
  }
  Allocator& allocator = ops::allocator_for(device_);
  std::vector<std::unique_ptr<RequestState>> states;
  for (int64_t r = 0; r < fits; ++r)
    states.push_back(filled_state(config_, context, allocator, o_.seed + 7919 * r + context));
  ops::synchronize(device_);
  progress("context %lld: %lld states filled", static_cast<long long>(context),
           static_cast<long long>(fits));

  std::vector<int32_t> tokens(static_cast<size_t>(max_batch));
  for (size_t r = 0; r < tokens.size(); ++r)
    tokens[r] = static_cast<int32_t>((o_.seed + 104729 * r) % config_.vocab_size);
  StepMarks marks(device_, config_.num_hidden_layers);
  model_->set_layer_observer(
      [&](int64_t layer, const TensorView&) { marks.record(static_cast<int>(layer) + 1); });

  for (int64_t batch : o_.batches) {
    Json entry = {{"batch", batch}, {"context", context}};
    if (batch > fits) {
      progress("decode b=%lld ctx=%lld: skipped, does not fit (%.1f GB of states)",
               static_cast<long long>(batch), static_cast<long long>(context),
               per_state * batch * 1e-9);
      entry["status"] = "skipped: does not fit memory";
      report_["decode"].push_back(entry);
      continue;
    }
    if (over_budget("a decode case")) {
      entry["status"] = "skipped: time budget";
      report_["decode"].push_back(entry);
      continue;
    }
    try {
      std::vector<ForwardRequest> requests;
      for (int64_t r = 0; r < batch; ++r)
        requests.push_back({states[static_cast<size_t>(r)].get(),
                            std::span<const int32_t>(&tokens[static_cast<size_t>(r)], 1)});
      Tensor logits = Tensor::empty(DType::kF32, {batch, config_.vocab_size}, allocator);
      std::vector<std::vector<double>> runs, host_runs;
      int steps = o_.steps;
      for (int step = 0; step <= steps; ++step) {  // step 0 warms up
        marks.record(0);
        model_->forward(requests, logits.view());
        marks.record(marks.slots() - 1);
        const std::vector<double> intervals = marks.intervals();
        if (step > 0) {
          runs.push_back(intervals);
          host_runs.push_back(marks.host_intervals());
        }
        if (step == 0 && intervals[0] > 1000.0) steps = std::min(steps, 2);  // slow: fewer steps
        // Forget the token so the context stays put.
        for (const ForwardRequest& request : requests) request.state->rollback(1);
      }
      if (o_.trace && device_.is_cuda()) {
        char label[64];
        std::snprintf(label, sizeof(label), "decode b=%lld ctx=%lld", static_cast<long long>(batch),
                      static_cast<long long>(context));
        entry["trace"] = traced(label, [&] { model_->forward(requests, logits.view()); });
        for (const ForwardRequest& request : requests) request.state->rollback(1);
      }
      const FiniteCheck finite = check_logits(logits.view());
      const StepTimes times = summarize(runs, config_.num_hidden_layers);
      const StepTimes host_times = summarize(host_runs, config_.num_hidden_layers);
      const CostModel::Bytes bytes = cost_->decode_bytes(batch, context);
      const double flops =
          static_cast<double>(batch) * (cost_->token_flops(context) + cost_->head_flops_per_row());
      const double outside = times.epilogue_ms;  // the prologue is inside layer 0 (see the report)
      const Projection projection = project(config_, times.layer_ms, outside, full_config_);
      const CostModel::Bytes full_bytes = full_cost_->decode_bytes(batch, context);
      const double full_flops = static_cast<double>(batch) * (full_cost_->token_flops(context) +
                                                              full_cost_->head_flops_per_row());
      entry["status"] = finite.non_finite == 0 ? "ok" : "non-finite logits";
      entry["step_ms"] = times.step_ms;
      entry["steps_ms"] = times.steps_ms;
      entry["tokens_per_s"] = static_cast<double>(batch) / (times.step_ms * 1e-3);
      entry["layer_ms"] = times.layer_ms;
      entry["epilogue_ms"] = times.epilogue_ms;
      entry["host_enqueue_ms"] = host_times.step_ms;
      entry["host_layer_ms"] = host_times.layer_ms;
      if (device_.is_cuda()) {  // --device cpu runs without a driver
        const GraphMemory graphs = graph_memory();
        entry["graph_memory_mb"] = {
            {"reserved", static_cast<double>(graphs.reserved_bytes) * 1e-6},
            {"reserved_high", static_cast<double>(graphs.reserved_high_bytes) * 1e-6}};
      }
      entry["floor"] = case_floor(bytes.total(), flops);
      entry["floor"]["weight_bytes"] = bytes.weights;
      entry["floor"]["cache_bytes"] = bytes.cache;
      entry["floor"]["bytes_as_stored_here"] = bytes.total_here();
      entry["floor"]["expected_distinct_experts"] = cost_->expected_distinct_experts(batch);
      entry["logits"] = {{"non_finite", finite.non_finite}, {"max_abs", finite.max_abs}};
      entry["projected_40_layers"] = case_floor(full_bytes.total(), full_flops);
      entry["projected_40_layers"]["complete"] = projection.complete;
      entry["projected_40_layers"]["missing_kinds"] = projection.missing;
      entry["kind_ms"] = projection.kind_ms;
      if (projection.complete) {
        entry["projected_40_layers"]["step_ms"] = projection.step_ms;
        entry["projected_40_layers"]["tokens_per_s"] =
            static_cast<double>(batch) / (projection.step_ms * 1e-3);
      }
      progress(
          "decode b=%lld ctx=%lld: %.2f ms/step (%.0f tok/s), floor %.3f ms (%.2f GB at %.0f "
          "GB/s), "
          "compute floor %.3f ms; host enqueue %.2f ms; logits non-finite %lld, max |logit| %.3g",
          static_cast<long long>(batch), static_cast<long long>(context), times.step_ms,
          static_cast<double>(entry["tokens_per_s"]),
          static_cast<double>(entry["floor"]["bandwidth_floor_ms"]), bytes.total() * 1e-9,
          bandwidth_gbps_, static_cast<double>(entry["floor"]["compute_floor_ms"]),
          host_times.step_ms, static_cast<long long>(finite.non_finite), finite.max_abs);
    } catch (const std::exception& error) {
      progress("decode b=%lld ctx=%lld FAILED: %s", static_cast<long long>(batch),
               static_cast<long long>(context), error.what());
      entry["status"] = std::string("error: ") + error.what();
      failures_ += 1;
    }
    report_["decode"].push_back(entry);
    write_json();
  }
  model_->set_layer_observer(nullptr);
  states.clear();
  ops::synchronize(device_);
}

void Bench::prefill(int64_t requests, int64_t tokens_each) {
  Json entry = {{"requests", requests}, {"tokens_each", tokens_each}};
  if (over_budget("a prefill case")) {
    entry["status"] = "skipped: time budget";
    report_["prefill"].push_back(entry);
    return;
  }
  Allocator& allocator = ops::allocator_for(device_);
  const int64_t total = requests * tokens_each;
  std::vector<std::unique_ptr<RequestState>> states;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> rows;
  for (int64_t r = 0; r < requests; ++r) {
    states.push_back(std::make_unique<RequestState>(
        config_, deepseek_v41::StateLimits{tokens_each, 0}, allocator));
    std::vector<int32_t> prompt(static_cast<size_t>(tokens_each));
    for (int64_t t = 0; t < tokens_each; ++t)
      prompt[static_cast<size_t>(t)] =
          static_cast<int32_t>((o_.seed * 31 + 7 * r + 104729 * t) % config_.vocab_size);
    prompts.push_back(std::move(prompt));
    rows.push_back(static_cast<int32_t>((r + 1) * tokens_each - 1));
  }
  std::vector<ForwardRequest> batch;
  for (int64_t r = 0; r < requests; ++r)
    batch.push_back({states[static_cast<size_t>(r)].get(), prompts[static_cast<size_t>(r)]});
  Tensor row_logits = Tensor::empty(DType::kF32, {requests, config_.vocab_size}, allocator);
  Tensor all_logits;  // only where the model has no row-selecting forward
  if constexpr (!kHasRowForward<Model>) {
    all_logits = Tensor::empty(DType::kF32, {total, config_.vocab_size}, allocator);
  }
  StepMarks marks(device_, config_.num_hidden_layers);
  model_->set_layer_observer(
      [&](int64_t layer, const TensorView&) { marks.record(static_cast<int>(layer) + 1); });
  std::vector<std::vector<double>> runs;
  bool only_rows = false;
  for (int run = 0; run < 2; ++run) {  // run 0 warms up (grows the workspace)
    for (auto& state : states) state->reset();
    marks.record(0);
    only_rows = forward_rows(*model_, batch, rows, row_logits.view(), all_logits.view());
    marks.record(marks.slots() - 1);
    const std::vector<double> intervals = marks.intervals();
    if (run > 0) runs.push_back(intervals);
    progress("prefill %lldx%lld run %d: %.1f ms", static_cast<long long>(requests),
             static_cast<long long>(tokens_each), run, intervals[0]);
  }
  model_->set_layer_observer(nullptr);
  if (o_.trace && device_.is_cuda()) {
    char label[64];
    std::snprintf(label, sizeof(label), "prefill %lldx%lld", static_cast<long long>(requests),
                  static_cast<long long>(tokens_each));
    for (auto& state : states) state->reset();
    entry["trace"] = traced(
        label, [&] { forward_rows(*model_, batch, rows, row_logits.view(), all_logits.view()); });
  }
  const FiniteCheck finite = check_logits(only_rows ? row_logits.view() : all_logits.view());
  const StepTimes times = summarize(runs, config_.num_hidden_layers);
  const int64_t head_rows = only_rows ? requests : total;
  double flops = static_cast<double>(head_rows) * cost_->head_flops_per_row();
  double full_flops = static_cast<double>(head_rows) * full_cost_->head_flops_per_row();
  for (int64_t t = 0; t < tokens_each; ++t) {
    flops += static_cast<double>(requests) * cost_->token_flops(t);
    full_flops += static_cast<double>(requests) * full_cost_->token_flops(t);
  }
  const Projection projection = project(config_, times.layer_ms, times.epilogue_ms, full_config_);
  const double tflops = flops / (times.step_ms * 1e-3) * 1e-12;
  entry["status"] = finite.non_finite == 0 ? "ok" : "non-finite logits";
  entry["ms"] = times.step_ms;
  entry["tokens_per_s"] = static_cast<double>(total) / (times.step_ms * 1e-3);
  entry["tflops"] = tflops;
  entry["fraction_of_fp8_peak"] = tflops / o_.fp8_peak_tflops;
  entry["lm_head_rows"] = head_rows;
  entry["layer_ms"] = times.layer_ms;
  entry["epilogue_ms"] = times.epilogue_ms;
  entry["floor"] = case_floor(0.0, flops);
  entry["logits"] = {{"non_finite", finite.non_finite}, {"max_abs", finite.max_abs}};
  entry["projected_40_layers"] = case_floor(0.0, full_flops);
  entry["projected_40_layers"]["complete"] = projection.complete;
  entry["projected_40_layers"]["missing_kinds"] = projection.missing;
  entry["kind_ms"] = projection.kind_ms;
  if (projection.complete) {
    entry["projected_40_layers"]["ms"] = projection.step_ms;
    entry["projected_40_layers"]["tokens_per_s"] =
        static_cast<double>(total) / (projection.step_ms * 1e-3);
    entry["projected_40_layers"]["tflops"] = full_flops / (projection.step_ms * 1e-3) * 1e-12;
  }
  progress(
      "prefill %lldx%lld: %.1f ms, %.0f tok/s, %.1f TFLOP/s = %.1f%% of FP8 peak "
      "(compute floor %.2f ms); logits non-finite %lld, max |logit| %.3g",
      static_cast<long long>(requests), static_cast<long long>(tokens_each), times.step_ms,
      static_cast<double>(entry["tokens_per_s"]), tflops, 100.0 * tflops / o_.fp8_peak_tflops,
      static_cast<double>(entry["floor"]["compute_floor_ms"]),
      static_cast<long long>(finite.non_finite), finite.max_abs);
  report_["prefill"].push_back(entry);
  states.clear();
  ops::synchronize(device_);
}

std::string number_or_na(const Json& object, const char* key, const char* format) {
  if (!object.contains(key)) return "n/a";
  char text[32];
  std::snprintf(text, sizeof(text), format, object[key].get<double>());
  return text;
}

void Bench::print_tables() const {
  std::printf("\n%s, %lld layers (released %s), HBM read %.0f GB/s, FP8 peak %.0f TFLOP/s\n",
              device_.to_string().c_str(), static_cast<long long>(config_.num_hidden_layers),
              Json(real_layers_).dump().c_str(), bandwidth_gbps_, o_.fp8_peak_tflops);
  std::printf("\nDecode (one token per request; floor = bytes that must move / HBM read)\n");
  std::printf(
      "| batch | context | ms/step | tok/s | floor ms | floor/step | GB moved | "
      "40 layers: ms/step | tok/s | floor ms |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Json& e : report_["decode"]) {
    if (e["status"] != "ok" && !e.contains("step_ms")) {
      std::printf("| %lld | %lld | %s | | | | | | | |\n", e["batch"].get<long long>(),
                  e["context"].get<long long>(), e["status"].get<std::string>().c_str());
      continue;
    }
    const Json& p = e["projected_40_layers"];
    const double floor_ms = e["floor"]["bandwidth_floor_ms"];
    const double step_ms = e["step_ms"];
    std::printf(
        "| %lld | %lld | %.2f | %.0f | %.3f | %.1f%% | %.2f | %s | %s | %.3f |\n",
        e["batch"].get<long long>(), e["context"].get<long long>(), step_ms,
        e["tokens_per_s"].get<double>(), floor_ms, 100.0 * floor_ms / step_ms,
        e["floor"]["bytes"].get<double>() * 1e-9, number_or_na(p, "step_ms", "%.2f").c_str(),
        number_or_na(p, "tokens_per_s", "%.0f").c_str(), p["bandwidth_floor_ms"].get<double>());
  }
  std::printf("\nPrefill (from an empty state)\n");
  std::printf(
      "| requests x tokens | ms | tok/s | TFLOP/s | of FP8 peak | 40 layers: ms | tok/s |\n"
      "|---|---|---|---|---|---|---|\n");
  for (const Json& e : report_["prefill"]) {
    if (!e.contains("ms")) {
      std::printf("| %lld x %lld | %s | | | | | |\n", e["requests"].get<long long>(),
                  e["tokens_each"].get<long long>(), e["status"].get<std::string>().c_str());
      continue;
    }
    const Json& p = e["projected_40_layers"];
    std::printf(
        "| %lld x %lld | %.1f | %.0f | %.1f | %.1f%% | %s | %s |\n", e["requests"].get<long long>(),
        e["tokens_each"].get<long long>(), e["ms"].get<double>(), e["tokens_per_s"].get<double>(),
        e["tflops"].get<double>(), 100.0 * e["fraction_of_fp8_peak"].get<double>(),
        number_or_na(p, "ms", "%.1f").c_str(), number_or_na(p, "tokens_per_s", "%.0f").c_str());
  }
  std::printf(
      "\nPer-layer ms (layer 0 includes the step's prologue: metadata upload, embedding)\n");
  std::printf("| case |");
  for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer)
    std::printf(" %lld %s |", static_cast<long long>(layer),
                kind_of(config_, layer).name().c_str());
  std::printf(" head |\n|---|");
  for (int64_t layer = 0; layer <= config_.num_hidden_layers; ++layer) std::printf("---|");
  std::printf("\n");
  const auto row = [&](const std::string& name, const Json& e) {
    if (!e.contains("layer_ms")) return;
    std::printf("| %s |", name.c_str());
    for (const Json& ms : e["layer_ms"]) std::printf(" %.3f |", ms.get<double>());
    std::printf(" %.3f |\n", e["epilogue_ms"].get<double>());
  };
  for (const Json& e : report_["decode"]) {
    row("decode b" + std::to_string(e["batch"].get<long long>()) + " ctx" +
            std::to_string(e["context"].get<long long>()),
        e);
  }
  for (const Json& e : report_["prefill"]) {
    row("prefill " + std::to_string(e["requests"].get<long long>()) + "x" +
            std::to_string(e["tokens_each"].get<long long>()),
        e);
  }
  std::fflush(stdout);
}

// The cost model's figures without a model (no weights, no device): checks the restricted
// config and the floors on any machine.
bool Bench::dry_run() const {
  print_config();
  const double bandwidth = o_.bandwidth_gbps > 0 ? o_.bandwidth_gbps : 4558.0;
  const auto show = [&](const char* label, const CostModel& cost, int64_t batch, int64_t context) {
    const CostModel::Bytes bytes = cost.decode_bytes(batch, context);
    const double flops =
        static_cast<double>(batch) * (cost.token_flops(context) + cost.head_flops_per_row());
    progress(
        "%s decode b=%lld ctx=%lld: weights %.3f GB (%.1f distinct experts a layer), "
        "cache %.3f GB, floor %.3f ms at %.0f GB/s (as stored here %.3f GB); %.3f TFLOP, "
        "compute floor %.4f ms",
        label, static_cast<long long>(batch), static_cast<long long>(context), bytes.weights * 1e-9,
        cost.expected_distinct_experts(batch), bytes.cache * 1e-9,
        bytes.total() / (bandwidth * 1e9) * 1e3, bandwidth, bytes.total_here() * 1e-9,
        flops * 1e-12, flops / (o_.fp8_peak_tflops * 1e12) * 1e3);
  };
  progress(
      "weights of the model as run: %.2f GB; of the 40-layer model: %.2f GB (released formats, "
      "engram tables excluded)",
      cost_->weight_bytes_total() * 1e-9, full_cost_->weight_bytes_total() * 1e-9);
  for (int64_t context : o_.contexts) {
    for (int64_t batch : o_.batches) {
      show("as run:", *cost_, batch, context);
      show("40 layers:", *full_cost_, batch, context);
    }
  }
  // Every released layer kind must be covered: 1 ms per measured layer projects to 1 ms a layer.
  const Projection unit =
      project(config_, std::vector<double>(static_cast<size_t>(config_.num_hidden_layers), 1.0),
              0.0, full_config_);
  progress("projection check: 1 ms per measured layer -> %.1f ms for %lld layers (%s)",
           unit.step_ms, static_cast<long long>(full_config_.num_hidden_layers),
           unit.complete ? "complete" : ("missing " + Json(unit.missing).dump()).c_str());
  for (const auto* cost : {cost_.get(), full_cost_.get()}) {
    double flops = cost->head_flops_per_row();
    for (int64_t t = 0; t < o_.prefill_tokens; ++t) flops += cost->token_flops(t);
    progress(
        "%s prefill 1x%lld (LM head on the last row): %.2f TFLOP, compute floor %.2f ms",
        cost == cost_.get() ? "as run:" : "40 layers:", static_cast<long long>(o_.prefill_tokens),
        flops * 1e-12, flops / (o_.fp8_peak_tflops * 1e12) * 1e3);
  }
  return unit.complete || o_.mix != "representative";
}

int Bench::run() {
  setup();
  if (o_.dry_run) return dry_run() ? 0 : 1;
  setup_device();
  // The headline figures first (the time budget cuts from the end): decode at the first
  // context, the one-request prefill, the other contexts, the split prefill.
  const auto guarded = [&](const std::string& what, const auto& fn) {
    try {
      fn();
    } catch (const std::exception& error) {
      progress("%s FAILED: %s", what.c_str(), error.what());
      model_->set_layer_observer(nullptr);  // it may point at the failed case's marks
      report_["errors"].push_back(what + ": " + error.what());
      failures_ += 1;
    }
    write_json();
  };
  const auto prefill_case = [&](int64_t requests, int64_t tokens_each) {
    guarded("prefill " + std::to_string(requests) + "x" + std::to_string(tokens_each),
            [&] { prefill(requests, tokens_each); });
  };
  for (size_t i = 0; i < o_.contexts.size(); ++i) {
    guarded("decode context " + std::to_string(o_.contexts[i]),
            [&] { decode_context(o_.contexts[i]); });
    if (i == 0 && o_.prefill_tokens > 0) prefill_case(1, o_.prefill_tokens);
  }
  if (o_.contexts.empty() && o_.prefill_tokens > 0) prefill_case(1, o_.prefill_tokens);
  if (o_.prefill_tokens > 0 && o_.prefill_split > 1)
    prefill_case(o_.prefill_split, o_.prefill_tokens / o_.prefill_split);
  print_tables();

  bool all_finite = true;
  for (const char* section : {"decode", "prefill"}) {
    for (const Json& e : report_[section]) {
      if (e.contains("logits") && e["logits"]["non_finite"].get<int64_t>() != 0) all_finite = false;
    }
  }
  report_["all_logits_finite"] = all_finite;
  report_["failures"] = failures_;
  write_json();
  progress("wrote %s; logits finite in every case: %s; failed cases: %d", json_path().c_str(),
           all_finite ? "yes" : "NO", failures_);
  return all_finite && failures_ == 0 ? 0 : 1;
}

std::string Bench::json_path() const {
  if (!o_.json_path.empty()) return o_.json_path;
  const char* out = std::getenv("OUT");
  return out != nullptr && *out != '\0' ? std::string(out) + "/model_bench.json"
                                        : "model_bench.json";
}

// Written after every case, so a run cut short still leaves its figures.
void Bench::write_json() {
  report_["seconds"] = seconds_since_start();
  std::ofstream(json_path()) << report_.dump(2) << "\n";
}

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> values;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) values.push_back(std::stoll(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return values;
}

const char* kUsage =
    "usage: cuda_model_bench [--device cuda|cpu] [--tiny] [--mix representative|first]\n"
    "  [--layers L (with --mix first)] [--batches 1,16,64,256] [--contexts 4096,32768]\n"
    "  [--steps N] [--prefill-tokens 8192 (0: no prefill)] [--prefill-split 4 (0: off)]\n"
    "  [--fp8-peak-tflops X] [--bandwidth-gbps X (default: measured)] [--time-budget-s 50 (after the weights)]\n"
    "  [--engram-vocab-size 160000] [--config PATH] [--seed S] [--json PATH] [--dry-run]\n"
    "  [--no-trace (no CUPTI kernel trace of one extra step per case)]\n";

Options parse_options(int argc, char** argv) {
  Options o;
  bool batches_given = false, contexts_given = false, prefill_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) DI_THROW("missing value after ", arg, "\n", kUsage);
      return argv[++i];
    };
    if (arg == "--device")
      o.device = value();
    else if (arg == "--tiny")
      o.tiny = true;
    else if (arg == "--mix")
      o.mix = value();
    else if (arg == "--layers")
      o.layers = std::stoll(value()), o.mix = "first";
    else if (arg == "--batches")
      o.batches = parse_list(value()), batches_given = true;
    else if (arg == "--contexts")
      o.contexts = parse_list(value()), contexts_given = true;
    else if (arg == "--steps")
      o.steps = std::stoi(value());
    else if (arg == "--prefill-tokens")
      o.prefill_tokens = std::stoll(value()), prefill_given = true;
    else if (arg == "--prefill-split")
      o.prefill_split = std::stoll(value());
    else if (arg == "--fp8-peak-tflops")
      o.fp8_peak_tflops = std::stod(value());
    else if (arg == "--bandwidth-gbps")
      o.bandwidth_gbps = std::stod(value());
    else if (arg == "--time-budget-s")
      o.time_budget_s = std::stod(value());
    else if (arg == "--engram-vocab-size")
      o.engram_vocab_size = std::stoll(value());
    else if (arg == "--config")
      o.config_path = value();
    else if (arg == "--seed")
      o.seed = std::stoull(value());
    else if (arg == "--json")
      o.json_path = value();
    else if (arg == "--dry-run")
      o.dry_run = true;
    else if (arg == "--no-trace")
      o.trace = false;
    else if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      std::exit(0);
    } else {
      DI_THROW("unknown argument ", arg, "\n", kUsage);
    }
  }
  if (o.device == "cpu" && !o.tiny && !o.dry_run) {
    DI_THROW("--device cpu runs the tiny model only (--tiny): the full-width one needs ~55 GB");
  }
  if (o.tiny) {  // the tests' tiny model: small contexts, a short prefill
    if (!batches_given) o.batches = {1, 4};
    if (!contexts_given) o.contexts = {40, 300};
    if (!prefill_given) o.prefill_tokens = 96;
  }
  DI_CHECK(o.steps >= 1 && !o.batches.empty() && o.prefill_tokens >= 0, "bad options\n", kUsage);
  return o;
}

}  // namespace
}  // namespace deepinfer::model_bench

int main(int argc, char** argv) {
  try {
    return deepinfer::model_bench::Bench(deepinfer::model_bench::parse_options(argc, argv)).run();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "cuda_model_bench: %s\n", error.what());
    return 2;
  }
}
