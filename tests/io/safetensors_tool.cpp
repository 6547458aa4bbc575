// Test helper for the Python cross-check (safetensors_crosscheck.py): exposes the reader and
// the writer through JSON on stdin/stdout, bytes as hex.
//   safetensors_tool dump PATH            -> {"metadata", "tensors": [{name, dtype, shape, hex}]}
//                                           or {"error": message} with exit code 1
//   safetensors_tool write OUT            <- {"metadata", "tensors": [...]} on stdin
//   safetensors_tool write-sharded DIR MAX <- the same
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors_checkpoint.h"
#include "io/safetensors_writer.h"

namespace {

using deepinfer::DType;
using Json = nlohmann::json;

std::string to_hex(std::span<const std::byte> bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    hex.push_back(kDigits[static_cast<unsigned>(b) >> 4]);
    hex.push_back(kDigits[static_cast<unsigned>(b) & 15]);
  }
  return hex;
}

std::vector<std::byte> from_hex(const std::string& hex) {
  std::vector<std::byte> bytes(hex.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<std::byte>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return bytes;
}

int dump(const std::string& path) {
  Json out;
  try {
    const auto checkpoint = deepinfer::SafetensorsCheckpoint::open(path);
    Json metadata = Json::object();
    for (const auto& shard : checkpoint.shards()) {
      for (const auto& [key, value] : shard.metadata()) metadata[key] = value;
    }
    Json tensors = Json::array();
    for (const auto* tensor : checkpoint.tensors()) {
      tensors.push_back({{"name", tensor->name},
                         {"dtype", std::string(deepinfer::dtype_safetensors_name(tensor->dtype))},
                         {"shape", tensor->shape},
                         {"hex", to_hex(tensor->bytes)}});
    }
    out = {{"metadata", metadata}, {"tensors", tensors}};
  } catch (const deepinfer::Error& e) {
    std::cout << Json{{"error", e.what()}}.dump(-1, ' ', false, Json::error_handler_t::replace)
              << "\n";
    return 1;
  }
  std::cout << out.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  return 0;
}

int write(const std::vector<std::string>& args) {
  std::ostringstream input;
  input << std::cin.rdbuf();
  const Json spec = Json::parse(input.str());
  std::vector<std::vector<std::byte>> storage;
  std::vector<deepinfer::SafetensorsEntry> entries;
  storage.reserve(spec["tensors"].size());
  for (const Json& t : spec["tensors"]) {
    storage.push_back(from_hex(t["hex"].get<std::string>()));
    entries.push_back({t["name"].get<std::string>(),
                       *deepinfer::dtype_from_safetensors_name(t["dtype"].get<std::string>()),
                       t["shape"].get<std::vector<int64_t>>(), storage.back()});
  }
  deepinfer::SafetensorsMetadata metadata;
  for (const auto& [key, value] : spec["metadata"].items())
    metadata[key] = value.get<std::string>();
  if (args[0] == "write") {
    deepinfer::write_safetensors(args[1], entries, metadata);
  } else {
    deepinfer::write_sharded_safetensors(args[1], entries, std::stoull(args[2]), metadata);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 2 && args[0] == "dump") return dump(args[1]);
  if ((args.size() == 2 && args[0] == "write") ||
      (args.size() == 3 && args[0] == "write-sharded")) {
    return write(args);
  }
  std::fprintf(stderr,
               "usage: safetensors_tool dump PATH | write OUT | write-sharded DIR MAX_BYTES\n");
  return 2;
}
