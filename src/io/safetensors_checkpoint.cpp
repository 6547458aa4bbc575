#include "io/safetensors_checkpoint.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/logging.h"
#include "io/strict_json.h"

namespace deepinfer {

namespace {

using Json = nlohmann::json;

// Index files of real checkpoints are a few MB (96k tensors); anything far larger is corrupt.
constexpr uintmax_t kMaxIndexBytes = 256u << 20;

std::string read_index_text(const std::filesystem::path& path) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(path, error);
  if (error) DI_THROW("cannot read checkpoint index '", path.string(), "': ", error.message());
  if (size > kMaxIndexBytes) {
    DI_THROW("checkpoint index '", path.string(), "' is ", size, " bytes, more than the ",
             kMaxIndexBytes, "-byte limit for an index");
  }
  std::ifstream stream(path, std::ios::binary);
  std::ostringstream text;
  text << stream.rdbuf();
  if (!stream) DI_THROW("cannot read checkpoint index '", path.string(), "'");
  return std::move(text).str();
}

// A weight_map value names a file next to the index; refusing absolute paths and ".." keeps
// a hostile index from pointing the loader anywhere else on the machine.
bool is_plain_relative_path(const std::string& name) {
  if (name.empty()) return false;
  const std::filesystem::path path(name);
  if (path.is_absolute()) return false;
  for (const auto& part : path) {
    if (part == "..") return false;
  }
  return true;
}

}  // namespace

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::filesystem::path& path) {
  SafetensorsCheckpoint checkpoint;
  checkpoint.root_ = path;
  std::error_code error;
  std::filesystem::path index_path;
  if (std::filesystem::is_directory(path, error)) {
    if (std::filesystem::exists(path / kSafetensorsIndexName, error)) {
      index_path = path / kSafetensorsIndexName;
    } else if (std::filesystem::exists(path / kSafetensorsSingleFileName, error)) {
      checkpoint.shards_.push_back(SafetensorsFile::open(path / kSafetensorsSingleFileName));
    } else {
      DI_THROW("checkpoint directory '", path.string(), "' has neither ", kSafetensorsIndexName,
               " nor ", kSafetensorsSingleFileName);
    }
  } else if (path.extension() == ".json") {
    index_path = path;
  } else {
    checkpoint.shards_.push_back(SafetensorsFile::open(path));
  }

  // weight_map, grouped by shard: shard file name -> tensor names.
  std::map<std::string, std::vector<std::string>> listed;
  if (!index_path.empty()) {
    checkpoint.index_path_ = index_path;
    const std::string where = concat("checkpoint index '", index_path.string(), "'");
    Json index;
    DuplicateKey duplicate;
    bool unique = false;
    const std::string text = read_index_text(index_path);
    if (const size_t nul = text.find('\0'); nul != std::string::npos) {
      DI_THROW(where, " is not valid JSON: NUL byte at offset ", nul);
    }
    try {
      unique = parse_json_without_duplicates(text, index, duplicate);
    } catch (const Json::exception& parse_error) {
      DI_THROW(where, " is not valid JSON: ", parse_error.what());
    }
    if (!unique) {
      if (duplicate.depth == 2)
        DI_THROW(where, ": tensor '", duplicate.key, "' appears more than once in weight_map");
      DI_THROW(where, " repeats the key '", duplicate.key, "' inside one object");
    }
    if (!index.is_object()) DI_THROW(where, " must be a JSON object, found ", index.type_name());
    auto metadata = index.find("metadata");
    if (metadata != index.end() && metadata->is_object()) {
      auto total = metadata->find("total_size");
      if (total != metadata->end() && total->is_number_unsigned()) {
        checkpoint.declared_total_size_ = total->get<uint64_t>();
      }
    }
    auto weight_map = index.find("weight_map");
    if (weight_map == index.end()) DI_THROW(where, " has no 'weight_map'");
    if (!weight_map->is_object())
      DI_THROW(where, ": 'weight_map' must be an object, found ", weight_map->type_name());
    for (const auto& [tensor, shard] : weight_map->items()) {
      if (!shard.is_string()) {
        DI_THROW(where, ": tensor '", tensor, "': the shard must be a file name string, found ",
                 shard.dump());
      }
      const std::string shard_name = shard.get<std::string>();
      if (!is_plain_relative_path(shard_name)) {
        DI_THROW(where, ": tensor '", tensor, "': shard '", shard_name,
                 "' must be a relative path inside the checkpoint directory");
      }
      listed[shard_name].push_back(tensor);
    }
    const std::filesystem::path directory = index_path.parent_path();
    for (const auto& [shard_name, tensors] : listed) {
      const std::filesystem::path shard_path = directory / shard_name;
      if (!std::filesystem::is_regular_file(shard_path, error)) {
        DI_THROW(where, " lists shard '", shard_name, "' (for tensor '", tensors.front(), "'",
                 tensors.size() > 1 ? concat(" and ", tensors.size() - 1, " more") : std::string(),
                 "), but '", shard_path.string(), "' does not exist");
      }
      checkpoint.shards_.push_back(SafetensorsFile::open(shard_path));
    }
  }

  for (const SafetensorsFile& shard : checkpoint.shards_) {
    for (const SafetensorsTensor& tensor : shard.tensors()) checkpoint.by_name_.push_back(&tensor);
  }
  std::sort(checkpoint.by_name_.begin(), checkpoint.by_name_.end(),
            [](const auto* a, const auto* b) { return a->name < b->name; });
  for (size_t i = 1; i < checkpoint.by_name_.size(); ++i) {
    const SafetensorsTensor* first = checkpoint.by_name_[i - 1];
    const SafetensorsTensor* second = checkpoint.by_name_[i];
    if (first->name == second->name) {
      DI_THROW("checkpoint '", path.string(), "': tensor '", first->name,
               "' appears in two shards, '", first->file, "' and '", second->file, "'");
    }
  }

  if (!checkpoint.index_path_.empty()) {
    const std::string where = concat("checkpoint index '", checkpoint.index_path_.string(), "'");
    const std::filesystem::path directory = checkpoint.index_path_.parent_path();
    size_t listed_count = 0;
    for (const auto& [shard_name, tensors] : listed) {
      const std::string shard_path = (directory / shard_name).string();
      for (const std::string& name : tensors) {
        ++listed_count;
        const SafetensorsTensor* tensor = checkpoint.find(name);
        if (tensor == nullptr) {
          DI_THROW(where, " lists tensor '", name, "' in shard '", shard_name,
                   "', but no shard contains it");
        }
        if (tensor->file != shard_path) {
          DI_THROW(where, " lists tensor '", name, "' in shard '", shard_name,
                   "', but that shard does not contain it (it is in '", tensor->file, "')");
        }
      }
    }
    if (listed_count != checkpoint.by_name_.size()) {
      std::map<std::string_view, bool> in_index;
      for (const auto& [shard_name, tensors] : listed) {
        for (const std::string& name : tensors) in_index[name] = true;
      }
      for (const SafetensorsTensor* tensor : checkpoint.by_name_) {
        if (!in_index.contains(tensor->name)) {
          DI_THROW(where, ": shard '", tensor->file, "' holds tensor '", tensor->name,
                   "', which the index's weight_map does not list");
        }
      }
    }
    if (checkpoint.declared_total_size_ &&
        *checkpoint.declared_total_size_ != checkpoint.total_tensor_bytes()) {
      DI_LOG_WARN(where, ": metadata.total_size is ", *checkpoint.declared_total_size_,
                  " but the shards hold ", checkpoint.total_tensor_bytes(), " tensor bytes");
    }
  }
  DI_LOG_DEBUG("opened checkpoint '", path.string(), "': ", checkpoint.shards_.size(), " files, ",
               checkpoint.by_name_.size(), " tensors");
  return checkpoint;
}

const SafetensorsTensor* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = std::lower_bound(
      by_name_.begin(), by_name_.end(), name,
      [](const SafetensorsTensor* tensor, std::string_view key) { return tensor->name < key; });
  if (it == by_name_.end() || (*it)->name != name) return nullptr;
  return *it;
}

const SafetensorsTensor& SafetensorsCheckpoint::at(std::string_view name) const {
  const SafetensorsTensor* tensor = find(name);
  if (tensor == nullptr) {
    DI_THROW("checkpoint '", root_.string(), "' has no tensor '", name, "'");
  }
  return *tensor;
}

uint64_t SafetensorsCheckpoint::total_tensor_bytes() const {
  uint64_t total = 0;
  for (const SafetensorsTensor* tensor : by_name_) total += tensor->bytes.size();
  return total;
}

}  // namespace deepinfer
