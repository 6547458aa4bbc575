#include "engine/deepseek_runner.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "deepinfer/engine_args.h"
#include "model/deepseek_v41/random_weights.h"
#include "model/deepseek_v41/weights.h"
#include "tokenizer/engram_map.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::engine {

namespace v41 = deepseek_v41;

DeepseekRunner::DeepseekRunner(const v41::DeepseekV41TextConfig& config,
                               const v41::ModelParameters& parameters, v41::Numerics numerics,
                               std::shared_ptr<const v41::EngramHasher> engram,
                               std::shared_ptr<void> keep_alive)
    : keep_alive_(std::move(keep_alive)),
      config_(config),
      model_(config_, parameters, numerics, std::move(engram)) {}

int64_t DeepseekRunner::vocab_size() const {
  return config_.vocab_size;
}

std::vector<int32_t> DeepseekRunner::eos_token_ids() const {
  std::vector<int32_t> ids;
  for (int64_t id : config_.eos_token_ids) ids.push_back(static_cast<int32_t>(id));
  return ids;
}

int64_t DeepseekRunner::max_model_len() const {
  return config_.max_position_embeddings;
}

// What one more token of sequence costs: the compressed KV and indexer rows it adds per source
// layer (windows and rings are fixed per slot), measured on a probe state.
int64_t DeepseekRunner::state_bytes_per_token() const {
  constexpr int64_t kProbeTokens = 1024;
  v41::RequestState probe(config_, v41::StateLimits{kProbeTokens, 0});
  int64_t bytes = 0;
  for (int64_t layer : config_.kv_source_layer_ids) {
    bytes += static_cast<int64_t>(probe.compressed_kv(layer).nbytes() +
                                  probe.index_keys(layer).nbytes());
  }
  return std::max<int64_t>(1, bytes / kProbeTokens);
}

void DeepseekRunner::allocate_slots(int32_t num_slots, int64_t max_tokens_per_slot) {
  slots_.clear();
  for (int32_t i = 0; i < num_slots; ++i) {
    slots_.push_back(
        std::make_unique<v41::RequestState>(config_, v41::StateLimits{max_tokens_per_slot, 0}));
  }
  requests_.reserve(static_cast<size_t>(num_slots));
}

void DeepseekRunner::reset_slot(int32_t slot) {
  slots_.at(static_cast<size_t>(slot))->reset();
}

void DeepseekRunner::forward(std::span<const SlotTokens> batch, std::span<float> logits) {
  requests_.clear();
  int64_t total = 0;
  for (const auto& item : batch) {
    requests_.push_back({slots_.at(static_cast<size_t>(item.slot)).get(), item.tokens});
    total += static_cast<int64_t>(item.tokens.size());
  }
  DI_CHECK(static_cast<int64_t>(logits.size()) == total * config_.vocab_size,
           "logits buffer does not match the batch");
  model_.forward(requests_,
                 TensorView::contiguous(logits.data(), DType::kF32, {total, config_.vocab_size}));
}

namespace {

std::vector<int32_t> read_token_map(const std::filesystem::path& path) {
  std::ifstream file(path);
  if (!file) DI_THROW("cannot open engram token map ", path.string());
  try {
    nlohmann::json json;
    file >> json;
    return json.get<std::vector<int32_t>>();
  } catch (const nlohmann::json::exception& error) {
    DI_THROW(path.string(), ": an engram token map must be a JSON array of compressed ids (",
             error.what(), ")");
  }
}

// The engram hashes tokenizer-normalized ids: derive them from the model's tokenizer, or read
// a precomputed map when the checkpoint ships one instead.
std::shared_ptr<const v41::EngramHasher> make_engram_hasher(
    const v41::DeepseekV41TextConfig& config, const std::filesystem::path& model_dir,
    const tokenizer::Tokenizer* tokenizer) {
  if (config.engram_layer_ids.empty()) return nullptr;
  std::vector<int32_t> token_map;
  if (tokenizer != nullptr) {
    token_map = tokenizer::build_compressed_token_map(*tokenizer).lookup;
  } else if (std::filesystem::exists(model_dir / "tokenizer.json")) {
    token_map =
        tokenizer::build_compressed_token_map(tokenizer::Tokenizer::from_dir(model_dir)).lookup;
  } else if (std::filesystem::exists(model_dir / "engram_token_map.json")) {
    token_map = read_token_map(model_dir / "engram_token_map.json");
  } else {
    DI_THROW("the model in ", model_dir.string(),
             " has engram layers, which need its tokenizer.json (or engram_token_map.json: the "
             "compressed id of every token id) next to config.json");
  }
  return std::make_shared<v41::EngramHasher>(config, std::move(token_map));
}

// The default model's weights, made in memory, and the parameters that view them.
struct DefaultModel {
  std::vector<v41::RandomTensor> tensors;
  std::unique_ptr<v41::ModelParameters> parameters;
};

std::unique_ptr<ModelRunner> make_default_model_runner(const tokenizer::Tokenizer* tokenizer) {
  const std::filesystem::path dir = default_model_dir();
  const v41::DeepseekV41Config config = v41::load_config(dir / "config.json");
  constexpr uint64_t kDefaultModelSeed = 0;
  const auto layout = v41::WeightLayout::kReleased;
  auto model = std::make_shared<DefaultModel>();
  const std::vector<v41::WeightSpec> table = v41::build_weight_table(config.text, layout);
  model->tensors =
      v41::make_random_weights(table, config.text.initializer_range, kDefaultModelSeed);
  std::map<std::string, v41::RandomTensor*> by_name;
  for (auto& tensor : model->tensors) by_name[tensor.spec->name] = &tensor;
  model->parameters = v41::build_parameters(config.text, layout, [&](const std::string& name) {
    auto it = by_name.find(name);
    DI_CHECK(it != by_name.end(), "default model: no random tensor named ", name);
    v41::RandomTensor& tensor = *it->second;
    return TensorView::contiguous(tensor.bytes.data(), tensor.spec->dtype,
                                  Shape(std::span<const int64_t>(tensor.spec->shape)));
  });
  return std::make_unique<DeepseekRunner>(config.text, *model->parameters, v41::Numerics::kReleased,
                                          make_engram_hasher(config.text, dir, tokenizer), model);
}

}  // namespace

std::string default_model_dir() {
  // A relocatable copy (the Python wheel ships one inside the package and points here).
  if (const char* packaged = std::getenv("DEEPINFER_DEFAULT_MODEL_DIR"); packaged && *packaged) {
    if (std::filesystem::exists(std::filesystem::path(packaged) / "config.json")) return packaged;
  }
  for (const char* candidate : {DEEPINFER_INSTALLED_MODEL_DIR, DEEPINFER_SOURCE_MODEL_DIR}) {
    if (std::filesystem::exists(std::filesystem::path(candidate) / "config.json")) {
      return candidate;
    }
  }
  DI_THROW("the embedded default model is missing: neither ", DEEPINFER_INSTALLED_MODEL_DIR,
           " nor ", DEEPINFER_SOURCE_MODEL_DIR,
           " holds config.json; set EngineArgs.model / --model or DEEPINFER_HF_MODEL_DIR");
}

std::unique_ptr<ModelRunner> make_model_runner(const EngineArgs& args,
                                               const tokenizer::Tokenizer* tokenizer) {
  if (args.accelerator == Accelerator::kNvidia) {
#ifdef DEEPINFER_HAS_CUDA
    DI_THROW("DEEPINFER_ACCELERATOR=nvidia: the CUDA backend does not run the engine yet; use cpu");
#else
    DI_THROW(
        "DEEPINFER_ACCELERATOR=nvidia: this build of deepinfer was not built with CUDA "
        "(configure with -DDEEPINFER_CUDA=ON); use cpu");
#endif
  }
  if (args.model.empty()) return make_default_model_runner(tokenizer);
  auto loaded = std::make_shared<v41::LoadedModel>(v41::load_model(args.model));
  const auto& config = loaded->config.text;
  auto hasher = make_engram_hasher(config, args.model, tokenizer);
  const v41::ModelParameters& parameters = *loaded->parameters;
  // The released checkpoint runs as DeepSeek's reference runs it; the HF layout as HF does.
  const auto numerics = loaded->layout == v41::WeightLayout::kReleased ? v41::Numerics::kReleased
                                                                       : v41::Numerics::kDense;
  return std::make_unique<DeepseekRunner>(config, parameters, numerics, std::move(hasher), loaded);
}

}  // namespace deepinfer::engine
