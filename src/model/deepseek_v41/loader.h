// Loading a DeepSeek-V4.1 checkpoint for the forward: config.json, the tensors checked against
// the weight table (weights.h) of the layout the names reveal, and the views the forward reads.
// Weights stay in their stored format and memory-mapped; only the small tensors the ops need in
// f32 (hc_*, sinks, gate biases, the engram q*k product) and the grouped wo_a (run dense by
// both references) are converted at load.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/parameters.h"
#include "model/deepseek_v41/weights.h"

namespace deepinfer {
class SafetensorsCheckpoint;
}

namespace deepinfer::deepseek_v41 {

// Builds the forward's parameters from tensors looked up by their checkpoint name in `layout`
// (the lookup returns the stored tensor: I8 for packed fp4). The tensors must already match the
// weight table; the views must outlive the parameters.
std::unique_ptr<ModelParameters> build_parameters(
    const DeepseekV41TextConfig& config, WeightLayout layout,
    const std::function<TensorView(const std::string& name)>& lookup);

struct LoadedModel {
  DeepseekV41Config config;
  WeightLayout layout = WeightLayout::kReleased;
  std::unique_ptr<SafetensorsCheckpoint> checkpoint;  // keeps the mappings alive
  std::unique_ptr<ModelParameters> parameters;

  LoadedModel();
  ~LoadedModel();
  LoadedModel(LoadedModel&&) noexcept;
  LoadedModel& operator=(LoadedModel&&) noexcept;
};

// Loads `directory` (config.json + safetensors). Throws Error naming every missing, unexpected,
// mis-shaped or mis-typed tensor; non-text tensors (mtp.*, vision.*, ...) are ignored.
LoadedModel load_model(const std::filesystem::path& directory);

}  // namespace deepinfer::deepseek_v41
