// Reader of the safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// header ({"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {str: str}}), then the
// tensor bytes. The file is memory-mapped; records point into the mapping, so opening a
// checkpoint reads only its headers and tensor bytes are paged in when first touched.
//
// Everything in the header is validated when the file is opened, and every failure throws
// Error naming the file and, where one is involved, the tensor. See docs/CHECKPOINT_IO.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace deepinfer {

// Headers larger than this are refused as corrupt (the same cap as the reference library).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

using SafetensorsMetadata = std::map<std::string, std::string, std::less<>>;

// One tensor of an open safetensors file. `bytes` points into the file's mapping and stays
// valid while any SafetensorsFile handle of that file is alive.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;        // logical elements (fp4 "F4": two per byte)
  std::span<const std::byte> bytes;  // exactly dtype_storage_bytes(dtype, element_count())
  uint64_t data_offset = 0;          // where `bytes` begins, relative to the data section
  std::string_view file;             // the file that holds it, for messages

  int64_t element_count() const;
  // A contiguous host view of the mapped bytes. The mapping is read-only: writing through the
  // view faults. Throws Error naming the tensor when the rank exceeds kMaxRank or the bytes
  // are not aligned to the element size (only possible in files whose header length is not a
  // multiple of 8, which conforming writers never produce).
  TensorView view() const;
};

// The released DeepSeek checkpoints store MXFP4 routed-expert weights as I8 [..., in/2]: two
// e2m1 values per byte, low nibble first. This returns the same bytes described as
// kF4E2M1x2 with the logical shape [..., in]. A record that is already F4 is returned as is;
// any other dtype, or a scalar, throws Error naming the tensor and file.
SafetensorsTensor reinterpret_as_packed_fp4(const SafetensorsTensor& tensor);

class SafetensorsFile {
 public:
  // Maps and validates `path`.
  static SafetensorsFile open(const std::filesystem::path& path);
  // Validates a whole file image owned by the caller, which must outlive the result and its
  // records; `source` names the image in messages (tests and the fuzzer use this).
  static SafetensorsFile parse(std::span<const std::byte> image, std::string source);

  // The path (or source name) used in messages.
  const std::string& source() const;
  // Every tensor, in data order (ascending data_offset).
  std::span<const SafetensorsTensor> tensors() const;
  // nullptr when absent.
  const SafetensorsTensor* find(std::string_view name) const;
  // Throws Error naming the tensor and the file when absent.
  const SafetensorsTensor& at(std::string_view name) const;
  // The optional "__metadata__" object (empty when absent).
  const SafetensorsMetadata& metadata() const;

  uint64_t header_bytes() const;             // N, the JSON header's length (padding included)
  uint64_t data_bytes() const;               // the data section: file size - 8 - N
  std::span<const std::byte> image() const;  // the whole file

 private:
  struct State;
  static std::shared_ptr<const State> parse_image(std::shared_ptr<State> state);
  explicit SafetensorsFile(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

}  // namespace deepinfer
