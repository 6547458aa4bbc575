// Loading a DeepSeek-V4.1 checkpoint for the forward: config.json, the tensors checked against
// the weight table (weights.h) of the layout the names reveal, and the views the forward reads.
// Weights stay in their stored format and memory-mapped; only the small tensors the ops need in
// f32 (hc_*, sinks, gate biases, the engram q*k product) are converted at load, and the grouped
// wo_a (run as bf16 by both references) is dequantized exactly to bf16 unless
// keeps_wo_a_as_stored.
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

// DEEPINFER_WO_A_FP8=1 (default 0; any other value is an error): the grouped wo_a stays FP8 as
// stored where it is FP8 in whole scale blocks per group (ops::linear_grouped_supports; the
// released checkpoint's 1024-row groups of 32-row blocks): the same values as its bf16
// dequantization (e4m3 times a power of two is exact in bf16), half the bytes a decode step
// reads. Off by default until the GPU kernels that read it (linear_bf16_mma.cu's fp8 decode tile,
// the cuBLASLt path's dequantization) have run their tests on a GPU; the CPU gives the same bits
// either way (loader_test).
bool fp8_wo_a_requested();
// Whether the loader keeps this wo_a as stored (the setting above and the shape rule) rather than
// dequantizing it; shapes and dtypes only, so any views (the model bench asks before it draws).
bool keeps_wo_a_as_stored(const ops::LinearWeight& wo_a, int64_t groups);

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
