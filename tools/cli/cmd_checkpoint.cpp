// Subcommands of the checkpoint layer: `deepinfer safetensors-info FILE_OR_DIR`.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "io/safetensors_checkpoint.h"

namespace deepinfer::cli {

namespace {

struct InfoOptions {
  std::string path;
  bool summary_only = false;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

void print_info(const InfoOptions& options) {
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(options.path);
  const bool sharded = !checkpoint.index_path().empty();
  if (sharded) std::printf("index: %s\n", checkpoint.index_path().c_str());
  for (const SafetensorsFile& shard : checkpoint.shards()) {
    std::printf("file: %s (%zu tensors, header %llu bytes, data %llu bytes)\n",
                shard.source().c_str(), shard.tensors().size(),
                static_cast<unsigned long long>(shard.header_bytes()),
                static_cast<unsigned long long>(shard.data_bytes()));
    for (const auto& [key, value] : shard.metadata()) {
      std::printf("  metadata %s = %s\n", key.c_str(), value.c_str());
    }
  }

  struct DTypeTotal {
    size_t tensors = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, DTypeTotal> by_dtype;
  size_t name_width = 4;
  for (const SafetensorsTensor* tensor : checkpoint.tensors())
    name_width = std::max(name_width, tensor->name.size());
  if (!options.summary_only) {
    std::printf("%-*s  %-8s  %-20s  %12s%s\n", static_cast<int>(name_width), "name", "dtype",
                "shape", "bytes", sharded ? "  shard" : "");
  }
  for (const SafetensorsTensor* tensor : checkpoint.tensors()) {
    const std::string dtype(dtype_safetensors_name(tensor->dtype));
    by_dtype[dtype].tensors += 1;
    by_dtype[dtype].bytes += tensor->bytes.size();
    if (options.summary_only) continue;
    std::printf("%-*s  %-8s  %-20s  %12zu%s%s\n", static_cast<int>(name_width),
                tensor->name.c_str(), dtype.c_str(), shape_text(tensor->shape).c_str(),
                tensor->bytes.size(), sharded ? "  " : "",
                sharded ? std::filesystem::path(tensor->file).filename().c_str() : "");
  }
  for (const auto& [dtype, total] : by_dtype) {
    std::printf("dtype %-8s %8zu tensors %16llu bytes\n", dtype.c_str(), total.tensors,
                static_cast<unsigned long long>(total.bytes));
  }
  std::printf("total: %zu tensors, %llu bytes in %zu file(s)\n", checkpoint.tensors().size(),
              static_cast<unsigned long long>(checkpoint.total_tensor_bytes()),
              checkpoint.shards().size());
  if (checkpoint.declared_total_size()) {
    std::printf("index metadata.total_size: %llu\n",
                static_cast<unsigned long long>(*checkpoint.declared_total_size()));
  }
}

}  // namespace

void register_checkpoint_commands(CLI::App& app) {
  auto options = std::make_shared<InfoOptions>();
  auto* info = app.add_subcommand("safetensors-info",
                                  "Validate a safetensors file or checkpoint and list its tensors "
                                  "(name, dtype, shape, bytes) and totals");
  info->add_option(
          "path", options->path,
          "A .safetensors file, a model.safetensors.index.json, or a directory holding either")
      ->required();
  info->add_flag("--summary", options->summary_only,
                 "Print only files, metadata and totals, not every tensor");
  info->footer(
      "Every header is validated (dtypes, shapes, offsets, overlaps, gaps, truncation) and, for "
      "sharded\n"
      "checkpoints, the index against the shards. Packed fp4 expert weights of the DeepSeek "
      "checkpoints\n"
      "are listed as stored: I8 [out, in/2]. Exit code 1 and a message naming the file and tensor "
      "on error.");
  info->callback([options] { print_info(*options); });
}

}  // namespace deepinfer::cli
