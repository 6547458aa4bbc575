// Randomized robustness: thousands of mutations of valid files (bit flips, byte edits,
// truncation, extension, edits of the JSON text, wrong length prefixes) with a fixed seed.
// Each must either parse into records that satisfy the format's invariants or throw Error;
// any other exception, a crash, or (under ASan) an out-of-bounds read fails the test.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "safetensors_test_util.h"

namespace deepinfer {
namespace {

using testing::as_bytes;

std::vector<std::vector<std::byte>> seed_images() {
  std::mt19937 rng(7);
  std::vector<std::vector<std::byte>> images;
  const DType dtypes[] = {DType::kF32,    DType::kBF16,   DType::kF16,      DType::kF8E4M3,
                          DType::kF8E5M2, DType::kF8E8M0, DType::kF4E2M1x2, DType::kI8,
                          DType::kI32,    DType::kI64,    DType::kBool};
  for (int file = 0; file < 6; ++file) {
    std::vector<std::vector<uint8_t>> storage;
    std::vector<SafetensorsEntry> entries;
    const int count = 1 + file * 2;
    for (int i = 0; i < count; ++i) {
      const DType dtype = dtypes[(file + i) % std::size(dtypes)];
      std::vector<int64_t> shape;
      const int rank = static_cast<int>(rng() % 3);
      for (int d = 0; d < rank; ++d) shape.push_back(static_cast<int64_t>(rng() % 4) * 2);
      int64_t elements = 1;
      for (int64_t e : shape) elements *= e;
      if (dtype == DType::kF4E2M1x2 && elements % 2 != 0) shape = {2};
      elements = 1;
      for (int64_t e : shape) elements *= e;
      storage.emplace_back(dtype_storage_bytes(dtype, elements));
      for (auto& b : storage.back()) b = static_cast<uint8_t>(rng());
      entries.push_back(
          {"layers." + std::to_string(i) + ".w", dtype, shape, as_bytes(storage.back())});
    }
    SafetensorsMetadata metadata;
    if (file % 2 == 0) metadata["format"] = "pt";
    images.push_back(serialize_safetensors(entries, metadata));
  }
  return images;
}

const char* const kJsonFragments[] = {"-1",
                                      "0",
                                      "1e3",
                                      "1.5",
                                      "18446744073709551615",
                                      "9223372036854775808",
                                      "\"F4\"",
                                      "\"I8\"",
                                      "\"F64\"",
                                      "[",
                                      "]",
                                      "{",
                                      "}",
                                      ",",
                                      ":",
                                      "null",
                                      "\"__metadata__\"",
                                      "\"dtype\"",
                                      "\"shape\"",
                                      "\"data_offsets\"",
                                      "\"\\u0000\"",
                                      "\xff",
                                      "[0,0]",
                                      "[]",
                                      "\"a\":{}",
                                      " "};

std::vector<std::byte> mutate(const std::vector<std::byte>& original, std::mt19937& rng) {
  std::vector<std::byte> image = original;
  const uint64_t header_size = [&] {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint64_t>(image[i]);
    return n;
  }();
  auto random_index = [&](size_t bound) {
    return bound == 0 ? 0 : static_cast<size_t>(rng() % bound);
  };
  const int edits = 1 + static_cast<int>(rng() % 3);
  bool text_edited = false;
  for (int e = 0; e < edits && !image.empty(); ++e) {
    switch (rng() % 8) {
      case 0:  // bit flip anywhere
        image[random_index(image.size())] ^= static_cast<std::byte>(1u << (rng() % 8));
        break;
      case 1:  // random byte in the length prefix or the header
        image[random_index(std::min<size_t>(image.size(), 8 + header_size))] =
            static_cast<std::byte>(rng());
        break;
      case 2:  // truncation
        image.resize(random_index(image.size()));
        break;
      case 3:  // extension
        for (size_t n = 1 + random_index(16); n > 0; --n)
          image.push_back(static_cast<std::byte>(rng()));
        break;
      case 4: {  // delete a span of header text
        if (image.size() <= 9) break;
        const size_t begin = 8 + random_index(std::min<size_t>(image.size() - 8, header_size));
        const size_t length = 1 + random_index(8);
        image.erase(
            image.begin() + static_cast<std::ptrdiff_t>(begin),
            image.begin() + static_cast<std::ptrdiff_t>(std::min(image.size(), begin + length)));
        text_edited = true;
        break;
      }
      case 5: {  // insert a JSON fragment into the header text
        const std::string fragment = kJsonFragments[random_index(std::size(kJsonFragments))];
        const size_t at = std::min(image.size(), 8 + random_index(header_size + 1));
        image.insert(image.begin() + static_cast<std::ptrdiff_t>(at),
                     reinterpret_cast<const std::byte*>(fragment.data()),
                     reinterpret_cast<const std::byte*>(fragment.data()) + fragment.size());
        text_edited = true;
        break;
      }
      case 6: {  // change one digit of the header: shapes and offsets
        std::vector<size_t> digits;
        for (size_t i = 8; i < std::min<size_t>(image.size(), 8 + header_size); ++i) {
          if (std::isdigit(static_cast<int>(image[i]))) digits.push_back(i);
        }
        if (!digits.empty())
          image[digits[random_index(digits.size())]] = static_cast<std::byte>('0' + rng() % 10);
        break;
      }
      case 7: {  // small change of the length prefix
        if (image.size() < 8) break;
        const int64_t delta = static_cast<int64_t>(rng() % 17) - 8;
        const uint64_t n = header_size + static_cast<uint64_t>(delta);
        for (int i = 0; i < 8; ++i) image[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
        break;
      }
    }
  }
  // Half of the text edits keep the prefix consistent, so the edit reaches the JSON parser.
  if (text_edited && image.size() >= 8 && rng() % 2 == 0) {
    const uint64_t n = header_size + image.size() - original.size();
    for (int i = 0; i < 8; ++i) image[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  }
  return image;
}

// What must hold for anything the reader accepts.
void check_invariants(const SafetensorsFile& file, std::span<const std::byte> image) {
  uint64_t covered = 0;
  for (const SafetensorsTensor& t : file.tensors()) {
    ASSERT_GE(t.bytes.data(), image.data() + 8 + file.header_bytes());
    ASSERT_LE(t.bytes.data() + t.bytes.size(), image.data() + image.size());
    ASSERT_EQ(t.bytes.size(), dtype_storage_bytes(t.dtype, t.element_count()));
    ASSERT_EQ(t.data_offset, covered);
    covered += t.bytes.size();
    ASSERT_EQ(file.find(t.name), &t);
  }
  ASSERT_EQ(covered, file.data_bytes());
  ASSERT_EQ(8 + file.header_bytes() + file.data_bytes(), image.size());
}

TEST(SafetensorsMutation, EveryMutationParsesOrThrowsError) {
  const auto seeds = seed_images();
  std::mt19937 rng(20260101);
  int accepted = 0, refused = 0;
  constexpr int kIterations = 4000;
  for (int iteration = 0; iteration < kIterations; ++iteration) {
    const auto mutated = mutate(seeds[iteration % seeds.size()], rng);
    // An exact-size heap copy, so ASan flags any read past the end.
    const std::vector<std::byte> image(mutated.begin(), mutated.end());
    try {
      const SafetensorsFile file = SafetensorsFile::parse(image, "mutant");
      check_invariants(file, image);
      // Anything accepted survives a round trip through the writer.
      std::vector<SafetensorsEntry> entries;
      for (const SafetensorsTensor& t : file.tensors())
        entries.push_back({t.name, t.dtype, t.shape, t.bytes});
      const auto rewritten = serialize_safetensors(entries, file.metadata());
      const SafetensorsFile again = SafetensorsFile::parse(rewritten, "rewritten");
      ASSERT_EQ(again.tensors().size(), file.tensors().size());
      ASSERT_EQ(again.metadata(), file.metadata());
      for (const SafetensorsTensor& t : file.tensors()) {
        const SafetensorsTensor& u = again.at(t.name);
        ASSERT_EQ(u.dtype, t.dtype);
        ASSERT_EQ(u.shape, t.shape);
        ASSERT_TRUE(std::equal(u.bytes.begin(), u.bytes.end(), t.bytes.begin(), t.bytes.end()));
      }
      ++accepted;
    } catch (const Error& e) {
      ASSERT_NE(std::string(e.what()).find("mutant"), std::string::npos) << e.what();
      ++refused;
    }
    if (::testing::Test::HasFatalFailure()) {
      FAIL() << "iteration " << iteration;
    }
  }
  // The mutations must exercise both outcomes, or the test proves little.
  EXPECT_GT(accepted, kIterations / 50);
  EXPECT_GT(refused, kIterations / 2);
  std::printf("accepted %d, refused %d of %d mutants\n", accepted, refused, kIterations);
}

}  // namespace
}  // namespace deepinfer
