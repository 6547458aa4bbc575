// The writer: byte-exact against the reference library's own test vectors, round trips of
// every dtype through the reader, layout alignment, and refusal of inconsistent input.
#include <gtest/gtest.h>

#include <cstring>
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
using testing::assemble_image;
using testing::ScratchDir;

std::vector<uint8_t> float_bytes(std::vector<float> values) {
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// Expected images from huggingface/safetensors safetensors/src/tensor.rs (test_serialization,
// test_serialization_forced_alignement, test_empty), where they are spelled as byte arrays.
TEST(SafetensorsWriter, MatchesReferenceLibraryVectors) {
  const auto data = float_bytes({0, 1, 2, 3, 4, 5});
  {
    const SafetensorsEntry entry{"attn.0", DType::kF32, {1, 2, 3}, as_bytes(data)};
    const auto image = serialize_safetensors({&entry, 1});
    const auto expected =
        assemble_image(R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})", data);
    EXPECT_EQ(image, expected);
    EXPECT_EQ(static_cast<int>(image[0]), 64);
  }
  {
    const SafetensorsEntry entry{"attn0", DType::kF32, {1, 1, 2, 3}, as_bytes(data)};
    const auto image = serialize_safetensors({&entry, 1});
    const auto expected =
        assemble_image(R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})"
                       "       ",
                       data);
    EXPECT_EQ(image, expected);
    EXPECT_EQ(static_cast<int>(image[0]), 72);
  }
  EXPECT_EQ(serialize_safetensors({}), assemble_image("{}      ", {}));
  EXPECT_EQ(serialize_safetensors({}, {{"framework", "pt"}}),
            assemble_image(R"({"__metadata__":{"framework":"pt"}})"
                           "     ",
                           {}));
}

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t count) {
  std::vector<uint8_t> bytes(count);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

TEST(SafetensorsWriter, RoundTripsEveryDTypeAlignedInTheReferenceOrder) {
  const DType dtypes[] = {DType::kF32,    DType::kBF16,   DType::kF16,      DType::kF8E4M3,
                          DType::kF8E5M2, DType::kF8E8M0, DType::kF4E2M1x2, DType::kI8,
                          DType::kI32,    DType::kI64,    DType::kBool};
  std::mt19937 rng(1234);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<SafetensorsEntry> entries;
  for (DType dtype : dtypes) {
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<int64_t> shape;
      if (variant == 0) shape = {3, 2};
      if (variant == 1) shape = {};      // scalar (not for fp4)
      if (variant == 2) shape = {0, 5};  // empty
      if (dtype == DType::kF4E2M1x2 && variant == 1) shape = {1, 2};
      int64_t count = 1;
      for (int64_t e : shape) count *= e;
      storage.push_back(random_bytes(rng, dtype_storage_bytes(dtype, count)));
      entries.push_back({std::string(dtype_name(dtype)) + "/" + std::to_string(variant), dtype,
                         shape, as_bytes(storage.back())});
    }
  }
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"z", "last"}, {"a", "first"}};
  ScratchDir dir;
  const auto path = dir.path() / "all.safetensors";
  write_safetensors(path, entries, metadata);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "all.safetensors.partial"));

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata(), metadata);
  EXPECT_EQ(file.header_bytes() % 8, 0u);
  ASSERT_EQ(file.tensors().size(), entries.size());
  for (const SafetensorsEntry& entry : entries) {
    SCOPED_TRACE(entry.name);
    const SafetensorsTensor& t = file.at(entry.name);
    EXPECT_EQ(t.dtype, entry.dtype);
    EXPECT_EQ(t.shape, entry.shape);
    ASSERT_EQ(t.bytes.size(), entry.bytes.size());
    EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), entry.bytes.begin()));
    // Layout by descending alignment puts every tensor on a multiple of its element size.
    const int element_bytes = std::max(1, dtype_bits(t.dtype) / 8);
    EXPECT_EQ(t.data_offset % element_bytes, 0u);
    EXPECT_EQ((8 + file.header_bytes() + t.data_offset) % element_bytes, 0u);
  }
  // Alignments never grow along the data: I64 first ... BOOL last.
  auto alignment = [](DType dtype) { return std::max(1, dtype_bits(dtype) / 8); };
  for (size_t i = 1; i < file.tensors().size(); ++i) {
    EXPECT_GE(alignment(file.tensors()[i - 1].dtype), alignment(file.tensors()[i].dtype));
  }
  EXPECT_EQ(file.tensors().front().dtype, DType::kI64);
  EXPECT_EQ(file.tensors().back().dtype, DType::kBool);
  // The in-memory image is the file, byte for byte.
  EXPECT_EQ(serialize_safetensors(entries, metadata),
            std::vector<std::byte>(file.image().begin(), file.image().end()));
}

TEST(SafetensorsWriter, WritesPackedFp4AsI8OrF4) {
  const auto packed = std::vector<uint8_t>{0x21, 0x43, 0x65, 0x87};
  const SafetensorsEntry entries[] = {{"as_i8", DType::kI8, {2, 2}, as_bytes(packed)},
                                      {"as_f4", DType::kF4E2M1x2, {2, 4}, as_bytes(packed)}};
  const auto image = serialize_safetensors(entries);
  const std::string text(reinterpret_cast<const char*>(image.data() + 8), image.size() - 8 - 8);
  EXPECT_NE(text.find(R"("as_f4":{"dtype":"F4","shape":[2,4])"), std::string::npos) << text;
  const SafetensorsFile file = SafetensorsFile::parse(image, "m");
  const SafetensorsTensor widened = reinterpret_as_packed_fp4(file.at("as_i8"));
  EXPECT_EQ(widened.shape, file.at("as_f4").shape);
  EXPECT_EQ(widened.dtype, file.at("as_f4").dtype);
  EXPECT_TRUE(
      std::equal(widened.bytes.begin(), widened.bytes.end(), file.at("as_f4").bytes.begin()));
}

TEST(SafetensorsWriter, RefusesInconsistentTensors) {
  const auto four = std::vector<uint8_t>{1, 2, 3, 4};
  auto expect_refused = [&](std::vector<SafetensorsEntry> entries, const std::string& part) {
    try {
      serialize_safetensors(entries);
      ADD_FAILURE() << "accepted: " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_refused({{"w", DType::kF32, {2}, as_bytes(four)}}, "tensor 'w'");
  expect_refused({{"w", DType::kF32, {2}, as_bytes(four)}}, "needs 8");
  expect_refused({{"w", DType::kI8, {4}, as_bytes(four)}, {"w", DType::kI8, {4}, as_bytes(four)}},
                 "more than once");
  expect_refused({{"__metadata__", DType::kI8, {4}, as_bytes(four)}}, "reserved");
  expect_refused({{"w", DType::kI8, {-4}, as_bytes(four)}}, "negative");
  expect_refused({{"w", DType::kF4E2M1x2, {7}, as_bytes(four)}}, "even element count");
  expect_refused({{"bad\xff", DType::kI8, {4}, as_bytes(four)}}, "UTF-8");
  EXPECT_THROW(serialize_safetensors({}, {{"k", "\xc3"}}), Error);
  ScratchDir dir;
  EXPECT_THROW(write_safetensors(dir.path() / "missing_dir" / "x.safetensors", {}), Error);
}

TEST(SafetensorsWriter, EscapesNamesLikeJson) {
  const auto one = std::vector<uint8_t>{7};
  const SafetensorsEntry entry{
      "quote\" slash\\ newline\n ctrl\x01 é", DType::kI8, {1}, as_bytes(one)};
  const auto image = serialize_safetensors({&entry, 1});
  const std::string text(reinterpret_cast<const char*>(image.data() + 8), image.size() - 9);
  EXPECT_NE(text.find(R"("quote\" slash\\ newline\n ctrl\u0001 é")"), std::string::npos) << text;
  EXPECT_EQ(SafetensorsFile::parse(image, "m").tensors()[0].name, entry.name);
}

}  // namespace
}  // namespace deepinfer
