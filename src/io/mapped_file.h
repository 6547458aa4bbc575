// A read-only, private memory mapping of a whole file. Checkpoint tensors are served straight
// from it: nothing is read until a page is touched, and untouched pages cost no memory.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>

namespace deepinfer {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` with PROT_READ and MAP_PRIVATE. Throws Error naming the file when it cannot be
  // opened, is not a regular file, or cannot be mapped. An empty file maps to an empty span.
  static MappedFile open(const std::filesystem::path& path);

  ~MappedFile() { unmap(); }
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void unmap() noexcept;

  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace deepinfer
