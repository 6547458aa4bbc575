#include "io/safetensors_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_set>

#include "core/error.h"

namespace deepinfer {

namespace {

using OrderedJson = nlohmann::ordered_json;

// The reference library orders its Dtype enum by alignment and lays tensors out from the
// largest alignment down, ties broken by name; these ranks reproduce that enum's order.
int alignment_rank(DType dtype) {
  switch (dtype) {
    case DType::kBool:
      return 0;
    case DType::kF4E2M1x2:
      return 1;
    case DType::kI8:
      return 5;
    case DType::kF8E5M2:
      return 6;
    case DType::kF8E4M3:
      return 7;
    case DType::kF8E8M0:
      return 8;
    case DType::kF16:
      return 11;
    case DType::kBF16:
      return 12;
    case DType::kI32:
      return 13;
    case DType::kF32:
      return 15;
    case DType::kI64:
      return 18;
  }
  DI_CHECK(false, "unhandled dtype");
  return 0;
}

bool is_valid_utf8_json_string(const std::string& text) {
  try {
    (void)OrderedJson(text).dump();
    return true;
  } catch (const OrderedJson::exception&) {
    return false;
  }
}

struct PreparedFile {
  std::string header;  // padded JSON, without the length prefix
  std::vector<const SafetensorsEntry*> data_order;
  uint64_t data_bytes = 0;
};

PreparedFile prepare(std::span<const SafetensorsEntry> tensors, const SafetensorsMetadata& metadata,
                     std::string_view destination) {
  std::unordered_set<std::string_view> names;
  for (const SafetensorsEntry& tensor : tensors) {
    auto fail = [&](const std::string& problem) {
      DI_THROW("writing safetensors '", destination, "': tensor '", tensor.name, "': ", problem);
    };
    if (tensor.name == "__metadata__") fail("the name is reserved for the header's metadata");
    if (!names.insert(tensor.name).second) fail("the name appears more than once");
    if (!is_valid_utf8_json_string(tensor.name)) fail("the name is not valid UTF-8");
    int64_t count = 1;
    for (int64_t extent : tensor.shape) {
      if (extent < 0) fail(concat("negative extent ", extent, " in the shape"));
      if (__builtin_mul_overflow(count, extent, &count))
        fail("the shape's element count overflows");
    }
    if (dtype_bits(tensor.dtype) == 4 && count % 2 != 0) {
      fail(concat("packed fp4 needs an even element count, the shape has ", count));
    }
    const size_t expected = dtype_storage_bytes(tensor.dtype, count);
    if (tensor.bytes.size() != expected) {
      fail(concat("holds ", tensor.bytes.size(), " bytes but dtype ",
                  dtype_safetensors_name(tensor.dtype), " with ", count, " elements needs ",
                  expected));
    }
  }
  for (const auto& [key, value] : metadata) {
    if (!is_valid_utf8_json_string(key) || !is_valid_utf8_json_string(value)) {
      DI_THROW("writing safetensors '", destination, "': metadata entry '", key,
               "' is not valid UTF-8");
    }
  }

  PreparedFile prepared;
  for (const SafetensorsEntry& tensor : tensors) prepared.data_order.push_back(&tensor);
  std::sort(prepared.data_order.begin(), prepared.data_order.end(),
            [](const auto* a, const auto* b) {
              const int rank_a = alignment_rank(a->dtype), rank_b = alignment_rank(b->dtype);
              if (rank_a != rank_b) return rank_a > rank_b;
              return a->name < b->name;
            });

  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson entries = OrderedJson::object();
    for (const auto& [key, value] : metadata) entries[key] = value;
    header["__metadata__"] = std::move(entries);
  }
  for (const SafetensorsEntry* tensor : prepared.data_order) {
    const uint64_t begin = prepared.data_bytes;
    prepared.data_bytes += tensor->bytes.size();
    header[tensor->name] =
        OrderedJson{{"dtype", std::string(dtype_safetensors_name(tensor->dtype))},
                    {"shape", tensor->shape},
                    {"data_offsets", {begin, prepared.data_bytes}}};
  }
  prepared.header = header.dump();
  // Padding to 8 bytes keeps the data section, and with this ordering every tensor, aligned.
  prepared.header.append((8 - prepared.header.size() % 8) % 8, ' ');
  return prepared;
}

void append_le64(uint64_t value, std::vector<std::byte>& out) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xff));
}

class OutputFile {
 public:
  explicit OutputFile(const std::filesystem::path& path) : path_(path) {
    file_ = std::fopen(path.c_str(), "wb");
    if (file_ == nullptr) DI_THROW("cannot create '", path.string(), "': ", std::strerror(errno));
  }
  ~OutputFile() {
    if (file_ != nullptr) std::fclose(file_);
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t size) {
    if (size > 0 && std::fwrite(data, 1, size, file_) != size) {
      DI_THROW("cannot write '", path_.string(), "': ", std::strerror(errno));
    }
  }
  void close() {
    FILE* file = file_;
    file_ = nullptr;
    if (std::fclose(file) != 0)
      DI_THROW("cannot write '", path_.string(), "': ", std::strerror(errno));
  }

 private:
  std::filesystem::path path_;
  FILE* file_ = nullptr;
};

void write_atomically(const std::filesystem::path& path, const auto& write_contents) {
  std::filesystem::path partial = path;
  partial += ".partial";
  try {
    OutputFile output(partial);
    write_contents(output);
    output.close();
    std::filesystem::rename(partial, path);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw;
  }
}

}  // namespace

std::vector<std::byte> serialize_safetensors(std::span<const SafetensorsEntry> tensors,
                                             const SafetensorsMetadata& metadata) {
  const PreparedFile prepared = prepare(tensors, metadata, "<memory>");
  std::vector<std::byte> image;
  image.reserve(8 + prepared.header.size() + prepared.data_bytes);
  append_le64(prepared.header.size(), image);
  const auto* header = reinterpret_cast<const std::byte*>(prepared.header.data());
  image.insert(image.end(), header, header + prepared.header.size());
  for (const SafetensorsEntry* tensor : prepared.data_order) {
    image.insert(image.end(), tensor->bytes.begin(), tensor->bytes.end());
  }
  return image;
}

void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                       const SafetensorsMetadata& metadata) {
  const PreparedFile prepared = prepare(tensors, metadata, path.string());
  write_atomically(path, [&](OutputFile& output) {
    std::vector<std::byte> length;
    append_le64(prepared.header.size(), length);
    output.write(length.data(), length.size());
    output.write(prepared.header.data(), prepared.header.size());
    for (const SafetensorsEntry* tensor : prepared.data_order) {
      output.write(tensor->bytes.data(), tensor->bytes.size());
    }
  });
}

ShardedWriteResult write_sharded_safetensors(const std::filesystem::path& directory,
                                             std::span<const SafetensorsEntry> tensors,
                                             uint64_t max_shard_bytes,
                                             const SafetensorsMetadata& metadata) {
  if (max_shard_bytes == 0)
    DI_THROW("writing checkpoint '", directory.string(), "': max shard size must be positive");
  std::unordered_set<std::string_view> names;
  for (const SafetensorsEntry& tensor : tensors) {
    if (!names.insert(tensor.name).second) {
      DI_THROW("writing checkpoint '", directory.string(), "': tensor '", tensor.name,
               "' appears more than once");
    }
  }

  // Greedy in the caller's order, as transformers does: a new shard starts when the next
  // tensor would push the current one past the limit.
  std::vector<std::vector<SafetensorsEntry>> shards;
  uint64_t current_bytes = 0;
  ShardedWriteResult result;
  for (const SafetensorsEntry& tensor : tensors) {
    if (shards.empty() ||
        (current_bytes > 0 && current_bytes + tensor.bytes.size() > max_shard_bytes)) {
      shards.emplace_back();
      current_bytes = 0;
    }
    shards.back().push_back(tensor);
    current_bytes += tensor.bytes.size();
    result.total_size += tensor.bytes.size();
  }
  if (shards.empty()) shards.emplace_back();

  std::filesystem::create_directories(directory);
  const std::filesystem::path index_path = directory / "model.safetensors.index.json";
  if (shards.size() == 1) {
    result.files.push_back(directory / "model.safetensors");
    write_safetensors(result.files.back(), shards.front(), metadata);
    std::error_code ignored;
    std::filesystem::remove(index_path, ignored);  // a stale index would shadow the new file
    return result;
  }

  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    result.files.push_back(directory / name);
    write_safetensors(result.files.back(), shards[k], metadata);
    for (const SafetensorsEntry& tensor : shards[k]) weight_map[tensor.name] = name;
  }
  const nlohmann::json index = {{"metadata", {{"total_size", result.total_size}}},
                                {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  write_atomically(index_path, [&](OutputFile& output) { output.write(text.data(), text.size()); });
  result.files.push_back(index_path);
  return result;
}

}  // namespace deepinfer
