#include "engine/deepseek_runner.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "deepinfer/engine_args.h"
#include "model/deepseek_v41/random_weights.h"
#include "model/deepseek_v41/weights.h"
#include "ops/batch_invariance.h"
#include "ops/ops.h"
#include "sampling/sampler.h"
#include "tokenizer/engram_map.h"
#include "tokenizer/tokenizer.h"

#ifdef DEEPINFER_HAS_CUDA
#include "ops/cuda/cuda_device.h"
#include "ops/cuda/cuda_runtime.h"  // Stream, StreamScope
#include "sampling/cuda_sampler.h"
#endif

namespace deepinfer::engine {

namespace v41 = deepseek_v41;

int64_t ModelRunner::free_memory() const {
  return ops::free_memory(Device::cpu());
}

void ModelRunner::sample(std::span<const sampling::SamplerRow>, std::span<sampling::SampledToken>) {
  throw InternalError("ModelRunner::sample called on a runner that samples on the host");
}

#ifdef DEEPINFER_HAS_CUDA
struct DeepseekRunner::DeviceStream {
  cuda::Stream stream;
  sampling::CudaSampler sampler;
};
#else
struct DeepseekRunner::DeviceStream {};
#endif

DeepseekRunner::DeepseekRunner(const v41::DeepseekV41TextConfig& config,
                               const v41::ModelParameters& parameters, v41::Numerics numerics,
                               std::shared_ptr<const v41::EngramHasher> engram,
                               std::shared_ptr<const void> keep_alive)
    : keep_alive_(std::move(keep_alive)),
      config_(config),
      model_(config_, parameters, numerics, std::move(engram)),
      device_(parameters.embed.device()) {
#ifdef DEEPINFER_HAS_CUDA
  // Steps run on the runner's own stream, whichever thread calls forward (the async worker).
  if (device_.is_cuda()) stream_ = std::make_unique<DeviceStream>();
#endif
}

DeepseekRunner::~DeepseekRunner() = default;

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

int64_t DeepseekRunner::slot_bytes(int64_t max_tokens) const {
  return v41::RequestState::bytes(config_, v41::StateLimits{max_tokens, 0});
}

int64_t DeepseekRunner::free_memory() const {
  return ops::free_memory(device_);
}

void DeepseekRunner::allocate_slots(int32_t num_slots, int64_t max_tokens_per_slot,
                                    int64_t max_tokens_per_step) {
  Allocator& allocator = ops::allocator_for(device_);
  slots_.clear();
  for (int32_t i = 0; i < num_slots; ++i) {
    slots_.push_back(std::make_unique<v41::RequestState>(
        config_, v41::StateLimits{max_tokens_per_slot, 0}, allocator));
  }
  requests_.reserve(static_cast<size_t>(num_slots));
  gather_rows_.reserve(static_cast<size_t>(num_slots));
  max_tokens_per_step_ = max_tokens_per_step;
  if (device_.is_cuda()) {
    sampled_logits_ = Tensor::empty(DType::kF32, {num_slots, config_.vocab_size}, allocator);
    // Whatever the states' construction queued on this thread's stream is done before the
    // runner's own stream (which does not wait for others) touches them.
    ops::synchronize(device_);
  }
}

void DeepseekRunner::reset_slot(int32_t slot) {
  slots_.at(static_cast<size_t>(slot))->reset();
}

void DeepseekRunner::forward(std::span<const SlotTokens> batch,
                             std::span<const int64_t> logits_rows, std::span<float> logits) {
  requests_.clear();
  int64_t total = 0;
  for (const auto& item : batch) {
    requests_.push_back({slots_.at(static_cast<size_t>(item.slot)).get(), item.tokens});
    total += static_cast<int64_t>(item.tokens.size());
  }
  DI_CHECK(total <= max_tokens_per_step_, "a step of ", total,
           " tokens exceeds the runner's max_tokens_per_step ", max_tokens_per_step_);
  const auto rows = static_cast<int64_t>(logits_rows.size());
  const bool keep_on_device = samples_on_device();
  DI_CHECK(static_cast<int64_t>(logits.size()) == (keep_on_device ? 0 : rows) * config_.vocab_size,
           "logits buffer does not match the sampled rows");
  gather_rows_.clear();
  for (int64_t row : logits_rows) {
    DI_CHECK(row >= 0 && row < total, "logits row ", row, " is outside the step's ", total,
             " tokens");
    gather_rows_.push_back(static_cast<int32_t>(row));
  }
#ifdef DEEPINFER_HAS_CUDA
  std::optional<cuda::StreamScope> on_stream;
  if (stream_) on_stream.emplace(stream_->stream);
#endif
  gathered_rows_ = rows;
  // The model computes the LM head for the sampled rows only.
  if (device_.is_cpu()) {
    model_.forward(requests_, gather_rows_,
                   TensorView::contiguous(logits.data(), DType::kF32, {rows, config_.vocab_size}));
    return;
  }
  DI_CHECK(rows <= sampled_logits_.shape()[0], "a step samples ", rows,
           " rows, more than the runner's ", sampled_logits_.shape()[0], " slots");
  const TensorView gathered = sampled_logits_.view().narrow(0, 0, rows);
  model_.forward(requests_, gather_rows_, gathered);
  if (keep_on_device) return;  // sample() waits
  if (rows > 0) {
    ops::copy(gathered,
              TensorView::contiguous(logits.data(), DType::kF32, {rows, config_.vocab_size}));
  }
  // The step's one wait; it also reports what kernels found wrong in their inputs.
  ops::synchronize(device_);
}

bool DeepseekRunner::samples_on_device() const {
#ifdef DEEPINFER_HAS_CUDA
  return device_.is_cuda();
#else
  return false;
#endif
}

void DeepseekRunner::sample(std::span<const sampling::SamplerRow> rows,
                            std::span<sampling::SampledToken> results) {
  DI_CHECK(samples_on_device(), "DeepseekRunner::sample on a runner that samples on the host");
  DI_CHECK(static_cast<int64_t>(rows.size()) == gathered_rows_ && results.size() == rows.size(),
           "sample() rows do not match the last forward's logits rows");
  if (rows.empty()) return;
#ifdef DEEPINFER_HAS_CUDA
  cuda::StreamScope on_stream(stream_->stream);
  stream_->sampler.launch(sampled_logits_.view().narrow(0, 0, gathered_rows_), rows);
  stream_->sampler.wait(results);
  ops::synchronize(device_);  // reports what the forward's kernels found wrong in their inputs
#endif
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

// The runner on `accelerator` over host parameters that `host_owner` keeps alive: those
// parameters themselves on cpu; on nvidia a copy on GPU 0 made once here (the host copy is then
// released with `host_owner`, unless the caller holds it too).
std::unique_ptr<ModelRunner> runner_on(Accelerator accelerator,
                                       const v41::DeepseekV41TextConfig& config,
                                       const v41::ModelParameters& host_parameters,
                                       v41::Numerics numerics,
                                       std::shared_ptr<const v41::EngramHasher> engram,
                                       std::shared_ptr<const void> host_owner) {
  if (accelerator == Accelerator::kCpu) {
    return std::make_unique<DeepseekRunner>(config, host_parameters, numerics, std::move(engram),
                                            std::move(host_owner));
  }
  std::unique_ptr<v41::ModelParameters> copy =
      v41::copy_parameters(host_parameters, ops::allocator_for(Device::cuda(0)));
  if (v41::bf16_copies_requested() && !ops::batch_invariant()) {
    v41::add_bf16_copies(*copy, ops::allocator_for(Device::cuda(0)));
  }
  std::shared_ptr<const v41::ModelParameters> on_gpu = std::move(copy);
  return std::make_unique<DeepseekRunner>(config, *on_gpu, numerics, std::move(engram), on_gpu);
}

// Random weights made in memory, and the parameters that view them.
struct RandomModel {
  std::vector<v41::RandomTensor> tensors;
  std::unique_ptr<v41::ModelParameters> parameters;
};

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

std::unique_ptr<ModelRunner> make_random_model_runner(const std::filesystem::path& config_json,
                                                      uint64_t seed, Accelerator accelerator,
                                                      const tokenizer::Tokenizer* tokenizer) {
  const v41::DeepseekV41Config config = v41::load_config(config_json);
  const auto layout = v41::WeightLayout::kReleased;
  auto model = std::make_shared<RandomModel>();
  const std::vector<v41::WeightSpec> table = v41::build_weight_table(config.text, layout);
  model->tensors = v41::make_random_weights(table, config.text.initializer_range, seed);
  std::map<std::string, v41::RandomTensor*> by_name;
  for (auto& tensor : model->tensors) by_name[tensor.spec->name] = &tensor;
  model->parameters = v41::build_parameters(config.text, layout, [&](const std::string& name) {
    auto it = by_name.find(name);
    DI_CHECK(it != by_name.end(), "random model: no random tensor named ", name);
    v41::RandomTensor& tensor = *it->second;
    return TensorView::contiguous(tensor.bytes.data(), tensor.spec->dtype,
                                  Shape(std::span<const int64_t>(tensor.spec->shape)));
  });
  return runner_on(accelerator, config.text, *model->parameters, v41::Numerics::kReleased,
                   make_engram_hasher(config.text, config_json.parent_path(), tokenizer), model);
}

std::unique_ptr<ModelRunner> make_model_runner(const EngineArgs& args,
                                               const tokenizer::Tokenizer* tokenizer) {
  DI_CHECK(args.accelerator.has_value(), "make_model_runner needs resolved EngineArgs");
  const Accelerator accelerator = *args.accelerator;
  if (accelerator == Accelerator::kNvidia) {
#ifdef DEEPINFER_HAS_CUDA
    try {
      cuda::require_supported_device(0);
    } catch (const Error& error) {
      DI_THROW("DEEPINFER_ACCELERATOR=nvidia: ", error.what(), "; use cpu");
    }
#else
    DI_THROW(
        "DEEPINFER_ACCELERATOR=nvidia: this build of deepinfer was not built with CUDA "
        "(configure with -DDEEPINFER_CUDA=ON); use cpu");
#endif
  }
  if (args.model.empty()) {
    constexpr uint64_t kDefaultModelSeed = 0;
    return make_random_model_runner(std::filesystem::path(default_model_dir()) / "config.json",
                                    kDefaultModelSeed, accelerator, tokenizer);
  }
  auto loaded = std::make_shared<v41::LoadedModel>(v41::load_model(args.model));
  const auto& config = loaded->config.text;
  auto hasher = make_engram_hasher(config, args.model, tokenizer);
  const v41::ModelParameters& parameters = *loaded->parameters;
  // The released checkpoint runs as DeepSeek's reference runs it; the HF layout as HF does.
  const auto numerics = loaded->layout == v41::WeightLayout::kReleased ? v41::Numerics::kReleased
                                                                       : v41::Numerics::kDense;
  return runner_on(accelerator, config, parameters, numerics, std::move(hasher), loaded);
}

}  // namespace deepinfer::engine
