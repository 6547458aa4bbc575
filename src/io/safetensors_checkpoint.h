// A checkpoint of one or more safetensors files: either a single model.safetensors, or shards
// listed by model.safetensors.index.json ({"metadata": {"total_size": N}, "weight_map":
// {tensor: shard file}}). Opening validates that the index and the shards agree exactly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "io/safetensors.h"

namespace deepinfer {

inline constexpr std::string_view kSafetensorsIndexName = "model.safetensors.index.json";
inline constexpr std::string_view kSafetensorsSingleFileName = "model.safetensors";

class SafetensorsCheckpoint {
 public:
  // `path` is a directory (holding model.safetensors.index.json, else model.safetensors), an
  // index .json file, or a single .safetensors file. Throws Error naming the file and tensor
  // when a listed shard is missing, a listed tensor is not in its shard, a tensor appears in
  // two shards or in no index entry, or any shard is malformed.
  static SafetensorsCheckpoint open(const std::filesystem::path& path);

  // The files, in shard-name order.
  std::span<const SafetensorsFile> shards() const { return shards_; }
  // Every tensor of every shard, sorted by name.
  std::span<const SafetensorsTensor* const> tensors() const { return by_name_; }
  const SafetensorsTensor* find(std::string_view name) const;
  // Throws Error naming the tensor and the checkpoint when absent.
  const SafetensorsTensor& at(std::string_view name) const;

  // The index file; empty for a single-file checkpoint.
  const std::filesystem::path& index_path() const { return index_path_; }
  // metadata.total_size from the index, when it has one.
  std::optional<uint64_t> declared_total_size() const { return declared_total_size_; }
  // Sum of the tensors' byte sizes.
  uint64_t total_tensor_bytes() const;

 private:
  std::filesystem::path root_;
  std::filesystem::path index_path_;
  std::optional<uint64_t> declared_total_size_;
  std::vector<SafetensorsFile> shards_;
  std::vector<const SafetensorsTensor*> by_name_;
};

}  // namespace deepinfer
