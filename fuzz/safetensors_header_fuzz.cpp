// libFuzzer target: arbitrary bytes as a safetensors file image. Parsing must either throw
// deepinfer::Error or yield records that satisfy the format's invariants and survive a round
// trip through the writer. Any other exception, a trap, or a sanitizer report is a finding.
//
//   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
//         -DDEEPINFER_FUZZ=ON -DDEEPINFER_BUILD_TESTS=OFF
//   cmake --build build-fuzz --target safetensors_header_fuzz
//   build-fuzz/fuzz/safetensors_header_fuzz -dict=fuzz/safetensors.dict fuzz/corpus/safetensors
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace {

void require(bool condition) {
  if (!condition) __builtin_trap();
}

void check_accepted(const deepinfer::SafetensorsFile& file, const std::vector<std::byte>& image) {
  uint64_t covered = 0;
  unsigned checksum = 0;
  for (const deepinfer::SafetensorsTensor& tensor : file.tensors()) {
    require(tensor.bytes.data() >= image.data() + 8 + file.header_bytes());
    require(tensor.bytes.data() + tensor.bytes.size() <= image.data() + image.size());
    require(tensor.bytes.size() ==
            deepinfer::dtype_storage_bytes(tensor.dtype, tensor.element_count()));
    require(tensor.data_offset == covered);
    require(file.find(tensor.name) == &tensor);
    covered += tensor.bytes.size();
    if (!tensor.bytes.empty()) {  // touch both ends: ASan checks them against the exact-size copy
      checksum +=
          static_cast<unsigned>(tensor.bytes.front()) + static_cast<unsigned>(tensor.bytes.back());
    }
    try {
      (void)tensor.view();
    } catch (const deepinfer::Error&) {  // rank above kMaxRank or a misaligned legacy file
    }
  }
  require(covered == file.data_bytes());
  require(8 + file.header_bytes() + file.data_bytes() == image.size());

  std::vector<deepinfer::SafetensorsEntry> entries;
  for (const auto& tensor : file.tensors())
    entries.push_back({tensor.name, tensor.dtype, tensor.shape, tensor.bytes});
  const std::vector<std::byte> rewritten =
      deepinfer::serialize_safetensors(entries, file.metadata());
  const auto again = deepinfer::SafetensorsFile::parse(rewritten, "rewritten");
  require(again.tensors().size() == file.tensors().size());
  require(again.metadata() == file.metadata());
  for (const auto& tensor : file.tensors()) {
    const auto& copy = again.at(tensor.name);
    require(copy.dtype == tensor.dtype && copy.shape == tensor.shape);
    require(
        std::equal(copy.bytes.begin(), copy.bytes.end(), tensor.bytes.begin(), tensor.bytes.end()));
  }
  // Keeps the loads above from being optimised away.
  asm volatile("" : : "r"(checksum));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exact-size heap copy, so any read past the end is an ASan report.
  const std::vector<std::byte> image(reinterpret_cast<const std::byte*>(data),
                                     reinterpret_cast<const std::byte*>(data) + size);
  try {
    check_accepted(deepinfer::SafetensorsFile::parse(image, "fuzz"), image);
  } catch (const deepinfer::Error&) {
    // Refused with a message: the expected outcome for most inputs.
  }
  return 0;
}
