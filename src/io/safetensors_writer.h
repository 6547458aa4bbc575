// Writer of safetensors files and sharded checkpoints (model-0000K-of-0000N.safetensors plus
// model.safetensors.index.json), byte-compatible with the reference Python library: tensors
// are laid out by descending dtype alignment then by name, the header is compact JSON padded
// with spaces to a multiple of 8 bytes, so every tensor starts aligned to its element size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/safetensors.h"

namespace deepinfer {

// One tensor to write. `bytes` must hold exactly dtype_storage_bytes(dtype, product(shape)).
// kF4E2M1x2 is written as safetensors "F4" with the logical shape; to mirror the released
// DeepSeek checkpoints (packed fp4 stored as I8 [..., in/2]), pass kI8 and the packed shape.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
};

// The whole file image. Throws Error naming the tensor for a reserved ("__metadata__")
// or repeated name, a negative extent, or a byte count that does not match dtype and shape.
std::vector<std::byte> serialize_safetensors(std::span<const SafetensorsEntry> tensors,
                                             const SafetensorsMetadata& metadata = {});

// Writes the file through a temporary sibling and a rename, so a crash never leaves a
// truncated checkpoint under the final name.
void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> tensors,
                       const SafetensorsMetadata& metadata = {});

struct ShardedWriteResult {
  std::vector<std::filesystem::path> files;  // shards, then the index when one was written
  uint64_t total_size = 0;                   // sum of tensor bytes (the index's total_size)
};

// Splits `tensors`, in the given order, into shards of at most `max_shard_bytes` tensor bytes
// (a tensor larger than that gets a shard of its own) and writes them to `directory` as
// model-00001-of-0000N.safetensors plus model.safetensors.index.json. As transformers'
// save_pretrained does, a checkpoint that fits in one shard is written as model.safetensors
// without an index. `metadata` goes into every shard's header.
ShardedWriteResult write_sharded_safetensors(const std::filesystem::path& directory,
                                             std::span<const SafetensorsEntry> tensors,
                                             uint64_t max_shard_bytes,
                                             const SafetensorsMetadata& metadata = {});

}  // namespace deepinfer
