// Helpers shared by the io tests: hand-assembled file images (independent of the writer under
// test) and a per-test scratch directory.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

namespace deepinfer::testing {

// 8-byte little-endian length, the header text verbatim, then `data`.
inline std::vector<std::byte> assemble_image(std::string_view header,
                                             const std::vector<uint8_t>& data,
                                             uint64_t declared_length = UINT64_MAX) {
  const uint64_t length = declared_length == UINT64_MAX ? header.size() : declared_length;
  std::vector<std::byte> image;
  for (int i = 0; i < 8; ++i) image.push_back(static_cast<std::byte>((length >> (8 * i)) & 0xff));
  for (char c : header) image.push_back(static_cast<std::byte>(c));
  for (uint8_t b : data) image.push_back(static_cast<std::byte>(b));
  return image;
}

inline std::vector<uint8_t> iota_bytes(size_t count, uint8_t start = 0) {
  std::vector<uint8_t> bytes(count);
  for (size_t i = 0; i < count; ++i) bytes[i] = static_cast<uint8_t>(start + i);
  return bytes;
}

inline void write_file(const std::filesystem::path& path, const std::vector<std::byte>& image) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(image.data()),
            static_cast<std::streamsize>(image.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A fresh directory under the system temp dir, removed when the test ends.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (std::string("deepinfer_io_") + info->test_suite_name() + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::span<const std::byte> as_bytes(const std::vector<uint8_t>& data) {
  return std::as_bytes(std::span<const uint8_t>(data));
}

}  // namespace deepinfer::testing
