// Subcommands of the model layer:
//   make-checkpoint   a random DeepSeek-V4.1 checkpoint for a config (tests, CI, benchmarks)
//   check-checkpoint  a checkpoint's tensors against the weight table of its config
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "io/safetensors_checkpoint.h"
#include "io/safetensors_writer.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/random_weights.h"
#include "model/deepseek_v41/weights.h"

namespace deepinfer::cli {
namespace {

namespace v41 = deepinfer::deepseek_v41;

struct MakeCheckpointOptions {
  std::string config;
  uint64_t seed = 0;
  std::string out;
  std::string layout = "released";
  double max_shard_mib = 4096;
};

void make_checkpoint(const MakeCheckpointOptions& options) {
  v41::DeepseekV41Config config = v41::load_config(options.config);
  const v41::WeightLayout layout = v41::parse_weight_layout(options.layout);
  if (layout == v41::WeightLayout::kHfDense) {
    // HF's save_pretrained of a dequantized model writes no quantization_config.
    config.quantization_config.reset();
    config.text.quantization_config.reset();
  }
  const std::vector<v41::WeightSpec> table = v41::build_weight_table(config.text, layout);
  const std::vector<v41::RandomTensor> tensors =
      v41::make_random_weights(table, config.text.initializer_range, options.seed);

  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const v41::RandomTensor& tensor : tensors) {
    entries.push_back({tensor.spec->name, tensor.spec->dtype, tensor.spec->shape, tensor.bytes});
  }
  const std::filesystem::path out(options.out);
  std::filesystem::create_directories(out);
  const auto max_bytes = static_cast<uint64_t>(options.max_shard_mib * 1024.0 * 1024.0);
  const ShardedWriteResult written =
      write_sharded_safetensors(out, entries, max_bytes, {{"format", "pt"}});

  std::ofstream config_file(out / "config.json");
  config_file << v41::config_to_json(config).dump(2) << "\n";
  if (!config_file) DI_THROW((out / "config.json").string(), ": cannot write");
  std::printf("wrote %zu tensors (%llu bytes, %s layout) in %zu file(s) to %s\n", entries.size(),
              static_cast<unsigned long long>(written.total_size), options.layout.c_str(),
              written.files.size(), out.string().c_str());
}

void check_checkpoint(const std::string& directory, const std::string& config_path,
                      const std::string& layout_name) {
  const std::filesystem::path root(directory);
  const v41::DeepseekV41Config config = v41::load_config(
      config_path.empty() ? root / "config.json" : std::filesystem::path(config_path));
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(root);
  std::vector<v41::CheckpointTensorInfo> infos;
  for (const SafetensorsTensor* tensor : checkpoint.tensors()) {
    infos.push_back({tensor->name, tensor->dtype, tensor->shape});
  }
  v41::WeightLayout layout;
  if (!layout_name.empty()) {
    layout = v41::parse_weight_layout(layout_name);
  } else if (auto detected = v41::detect_weight_layout(infos)) {
    layout = *detected;
  } else {
    DI_THROW(directory,
             ": cannot tell the layout from the tensor names; pass --layout released|hf");
  }
  v41::validate_checkpoint_tensors(v41::build_weight_table(config.text, layout), infos, layout,
                                   directory);
  std::printf("%s: %zu tensors match the %s layout\n", directory.c_str(), infos.size(),
              std::string(v41::weight_layout_name(layout)).c_str());
}

}  // namespace

void register_model_commands(CLI::App& app) {
  auto options = std::make_shared<MakeCheckpointOptions>();
  auto* make = app.add_subcommand("make-checkpoint",
                                  "Write a random DeepSeek-V4.1 checkpoint for a config.json");
  make->add_option("--config", options->config, "config.json (composite or flat text config)")
      ->required()
      ->check(CLI::ExistingFile);
  make->add_option("--seed", options->seed, "RNG seed; values depend only on (seed, tensor name)")
      ->required();
  make->add_option("--out", options->out, "output directory")->required();
  make->add_option("--layout", options->layout,
                   "released (fp8/fp4, checkpoint-native names) or hf (dense bf16)")
      ->check(CLI::IsMember({"released", "hf"}));
  make->add_option("--max-shard-mib", options->max_shard_mib, "largest shard, MiB")
      ->check(CLI::PositiveNumber);
  make->callback([options] { make_checkpoint(*options); });

  auto directory = std::make_shared<std::string>();
  auto config = std::make_shared<std::string>();
  auto layout = std::make_shared<std::string>();
  auto* check = app.add_subcommand(
      "check-checkpoint", "Check a checkpoint's tensors against the DeepSeek-V4.1 weight table");
  check->add_option("--checkpoint", *directory, "checkpoint directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  check->add_option("--config", *config, "config.json (default: the checkpoint's)");
  check->add_option("--layout", *layout, "released or hf (default: detected from the names)")
      ->check(CLI::IsMember({"released", "hf"}));
  check->callback([directory, config, layout] { check_checkpoint(*directory, *config, *layout); });
}

}  // namespace deepinfer::cli
