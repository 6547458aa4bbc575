// ModelRunner over the DeepSeek-V4.1 forward (src/model): a pool of RequestState slots made
// at start-up, and Model::forward on the engine's ragged batch. It runs where its parameters
// live: on the host, or on a GPU (state slots and logits on the device, one device-to-host
// copy of the sampled rows per step).
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "deepinfer/engine_args.h"
#include "engine/model_runner.h"
#include "model/deepseek_v41/loader.h"
#include "model/deepseek_v41/model.h"

namespace deepinfer::engine {

class DeepseekRunner final : public ModelRunner {
 public:
  // `parameters` must outlive the runner; `keep_alive` (optional) owns what they point into.
  // The runner's device is the parameters' (their embedding table's) device.
  DeepseekRunner(const deepseek_v41::DeepseekV41TextConfig& config,
                 const deepseek_v41::ModelParameters& parameters, deepseek_v41::Numerics numerics,
                 std::shared_ptr<const deepseek_v41::EngramHasher> engram,
                 std::shared_ptr<const void> keep_alive = nullptr);
  ~DeepseekRunner() override;

  int64_t vocab_size() const override;
  std::vector<int32_t> eos_token_ids() const override;
  int64_t max_model_len() const override;
  int64_t state_bytes_per_token() const override;
  int64_t slot_bytes(int64_t max_tokens) const override;
  int64_t free_memory() const override;
  void allocate_slots(int32_t num_slots, int64_t max_tokens_per_slot,
                      int64_t max_tokens_per_step) override;
  void reset_slot(int32_t slot) override;
  void forward(std::span<const SlotTokens> batch, std::span<const int64_t> logits_rows,
               std::span<float> logits) override;
  // True on a GPU (in a CUDA build): sampling runs there (src/sampling/cuda_sampler.h).
  bool samples_on_device() const override;
  void sample(std::span<const sampling::SamplerRow> rows,
              std::span<sampling::SampledToken> results) override;

  Device device() const { return device_; }

 private:
  std::shared_ptr<const void> keep_alive_;
  deepseek_v41::DeepseekV41TextConfig config_;
  deepseek_v41::Model model_;
  std::vector<std::unique_ptr<deepseek_v41::RequestState>> slots_;
  std::vector<deepseek_v41::ForwardRequest> requests_;
  Device device_;
  // Sized by allocate_slots. On a GPU the sampled rows' logits [num_slots, vocab] stay on the
  // device for the sampler (one copy to the host where the host samples).
  int64_t max_tokens_per_step_ = 0;
  Tensor sampled_logits_;
  std::vector<int32_t> gather_rows_;
  int64_t gathered_rows_ = 0;  // rows of sampled_logits_ the last forward wrote
  // On a GPU: the stream every step runs on and the sampler (CUDA builds only).
  struct DeviceStream;
  std::unique_ptr<DeviceStream> stream_;
};

// The runner over the config file `config_json` with random weights of `seed` in the released
// layout, made in memory (the model `deepinfer make-checkpoint --config <config_json> --seed
// <seed>` writes), on `accelerator`. The engram map comes from `tokenizer` when given, else
// from a tokenizer.json next to the config. The embedded default model is this with
// models/default/config.json and seed 0.
std::unique_ptr<ModelRunner> make_random_model_runner(const std::filesystem::path& config_json,
                                                      uint64_t seed, Accelerator accelerator,
                                                      const tokenizer::Tokenizer* tokenizer);

}  // namespace deepinfer::engine
