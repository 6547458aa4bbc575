// The reader against hand-assembled images: every dtype, the edge cases the format allows,
// and every malformation it must refuse with a message naming the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "safetensors_test_util.h"

namespace deepinfer {
namespace {

using testing::assemble_image;
using testing::iota_bytes;
using testing::ScratchDir;

struct DTypeCase {
  const char* name;
  DType dtype;
  int64_t element_bytes_times_two;  // 1 for F4 (half a byte), 2 for I8, ...
};

// Element sizes from the safetensors format description, not from dtype.cpp.
constexpr DTypeCase kDTypes[] = {
    {"F32", DType::kF32, 8},        {"BF16", DType::kBF16, 4},      {"F16", DType::kF16, 4},
    {"F8_E4M3", DType::kF8E4M3, 2}, {"F8_E5M2", DType::kF8E5M2, 2}, {"F8_E8M0", DType::kF8E8M0, 2},
    {"F4", DType::kF4E2M1x2, 1},    {"I8", DType::kI8, 2},          {"I32", DType::kI32, 8},
    {"I64", DType::kI64, 16},       {"BOOL", DType::kBool, 2},
};

TEST(SafetensorsReader, ReadsEveryDType) {
  for (const DTypeCase& c : kDTypes) {
    SCOPED_TRACE(c.name);
    const int64_t bytes = 2 * 6 * c.element_bytes_times_two / 2;  // shape [2, 6]
    const std::string header = std::string(R"({"t":{"dtype":")") + c.name +
                               R"(","shape":[2,6],"data_offsets":[0,)" + std::to_string(bytes) +
                               "]}}";
    const auto data = iota_bytes(static_cast<size_t>(bytes), 7);
    const auto image = assemble_image(header, data);
    const SafetensorsFile file = SafetensorsFile::parse(image, "mem");
    ASSERT_EQ(file.tensors().size(), 1u);
    const SafetensorsTensor& t = file.at("t");
    EXPECT_EQ(t.dtype, c.dtype);
    EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 6}));
    EXPECT_EQ(t.element_count(), 12);
    ASSERT_EQ(t.bytes.size(), static_cast<size_t>(bytes));
    EXPECT_EQ(t.bytes.data(), image.data() + 8 + header.size());
    for (size_t i = 0; i < data.size(); ++i) EXPECT_EQ(static_cast<uint8_t>(t.bytes[i]), data[i]);
    EXPECT_EQ(t.file, "mem");
  }
}

TEST(SafetensorsReader, OpensFromDiskAndKeepsRecordsValidAfterMove) {
  ScratchDir dir;
  const std::string header =
      R"({"__metadata__":{"format":"pt","note":"é"},"b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]},)"
      R"("a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";
  const auto data = iota_bytes(12);
  testing::write_file(dir.path() / "x.safetensors", assemble_image(header, data));
  std::vector<SafetensorsFile> files;
  files.push_back(SafetensorsFile::open(dir.path() / "x.safetensors"));
  const SafetensorsFile moved = std::move(files.back());
  files.clear();
  EXPECT_EQ(moved.source(), (dir.path() / "x.safetensors").string());
  ASSERT_EQ(moved.tensors().size(), 2u);
  EXPECT_EQ(moved.tensors()[0].name, "a");  // data order
  EXPECT_EQ(moved.tensors()[1].name, "b");
  EXPECT_TRUE(moved.at("a").shape.empty());
  EXPECT_EQ(moved.at("a").element_count(), 1);
  EXPECT_EQ(static_cast<uint8_t>(moved.at("b").bytes[0]), 4);
  EXPECT_EQ(moved.at("b").data_offset, 4u);
  EXPECT_EQ(moved.metadata().at("format"), "pt");
  EXPECT_EQ(moved.metadata().at("note"), "é");
  EXPECT_EQ(moved.header_bytes(), header.size());
  EXPECT_EQ(moved.data_bytes(), 12u);
  EXPECT_EQ(moved.find("c"), nullptr);
}

TEST(SafetensorsReader, AcceptsWhatTheFormatAllows) {
  // Empty header padded with spaces, as the reference writer emits it.
  EXPECT_TRUE(SafetensorsFile::parse(assemble_image("{}      ", {}), "m").tensors().empty());
  // Leading whitespace; zero-element tensors sharing an offset with a real one.
  const auto image = assemble_image(
      R"( {"z":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"y":{"dtype":"BF16","shape":[3,0],"data_offsets":[0,0]},)"
      R"("x":{"dtype":"I8","shape":[2],"data_offsets":[0,2]}})",
      {1, 2});
  const SafetensorsFile file = SafetensorsFile::parse(image, "m");
  EXPECT_EQ(file.tensors().size(), 3u);
  EXPECT_EQ(file.at("z").bytes.size(), 0u);
  EXPECT_EQ(file.at("z").element_count(), 0);
  EXPECT_EQ(file.at("x").bytes.size(), 2u);
  // Unknown fields in an entry are ignored, as the reference reader does.
  EXPECT_NO_THROW(SafetensorsFile::parse(
      assemble_image(R"({"x":{"dtype":"I8","shape":[1],"data_offsets":[0,1],"extra":[1]}})", {1}),
      "m"));
}

TEST(SafetensorsReader, ReinterpretsI8AsPackedFp4) {
  // The released checkpoint's routed experts: I8 [out, in/2] next to F8_E8M0 [out, in/32].
  const auto image = assemble_image(
      R"({"w":{"dtype":"I8","shape":[2,32],"data_offsets":[0,64]},"w.scale":{"dtype":"F8_E8M0","shape":[2,2],"data_offsets":[64,68]},)"
      R"("f":{"dtype":"F32","shape":[1],"data_offsets":[68,72]},"s":{"dtype":"I8","shape":[],"data_offsets":[72,73]}})",
      iota_bytes(73));
  const SafetensorsFile file = SafetensorsFile::parse(image, "ckpt");
  const SafetensorsTensor packed = reinterpret_as_packed_fp4(file.at("w"));
  EXPECT_EQ(packed.dtype, DType::kF4E2M1x2);
  EXPECT_EQ(packed.shape, (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(packed.bytes.data(), file.at("w").bytes.data());
  EXPECT_EQ(packed.bytes.size(), 64u);
  EXPECT_EQ(dtype_storage_bytes(packed.dtype, packed.element_count()), packed.bytes.size());
  // The scale's group size follows from the logical shape: 64 / 2 = 32 elements per scale.
  EXPECT_EQ(packed.shape[1] / file.at("w.scale").shape[1], 32);
  EXPECT_EQ(reinterpret_as_packed_fp4(packed).shape, packed.shape);  // already fp4: unchanged

  try {
    reinterpret_as_packed_fp4(file.at("f"));
    FAIL() << "F32 reinterpreted as fp4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'f'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'ckpt'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(reinterpret_as_packed_fp4(file.at("s")), Error);
}

TEST(SafetensorsReader, ViewsPointIntoTheMapping) {
  ScratchDir dir;
  const float values[] = {1.5f, -2.0f, 3.25f, 0.0f, 8.0f, -0.5f};
  std::vector<uint8_t> data(sizeof(values));
  std::memcpy(data.data(), values, sizeof(values));
  data.push_back(0x21);  // one packed fp4 byte: values 1 (low nibble) and 2
  // Header padded to 56 bytes, so the data section (and the F32 tensor) is 8-byte aligned.
  std::string header =
      R"({"f":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"p":{"dtype":"I8","shape":[1,1],"data_offsets":[24,25]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  testing::write_file(dir.path() / "v.safetensors", assemble_image(header, data));
  const SafetensorsFile file = SafetensorsFile::open(dir.path() / "v.safetensors");
  const TensorView f = file.at("f").view();
  EXPECT_EQ(f.dtype(), DType::kF32);
  EXPECT_EQ(f.shape(), (Shape{2, 3}));
  EXPECT_TRUE(f.is_contiguous());
  EXPECT_EQ(f.raw_data(), file.at("f").bytes.data());
  EXPECT_EQ(f.at<float>(1, 0), 0.0f);
  EXPECT_EQ(f.at<float>(0, 2), 3.25f);
  const TensorView p = reinterpret_as_packed_fp4(file.at("p")).view();
  EXPECT_EQ(p.dtype(), DType::kF4E2M1x2);
  EXPECT_EQ(p.shape(), (Shape{1, 2}));
  EXPECT_EQ(p.nbytes(), 1u);

  // A header whose length is not a multiple of 8 misaligns the F32 data: view() refuses.
  const auto odd =
      assemble_image(R"({"f":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} )", iota_bytes(4));
  std::vector<std::byte> aligned_copy(odd.size() + 8);
  // Place the image at an 8-byte boundary so that only the header length decides alignment.
  auto* base = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(aligned_copy.data()) + 7) &
                                            ~uintptr_t{7});
  std::memcpy(base, odd.data(), odd.size());
  const SafetensorsFile misaligned =
      SafetensorsFile::parse({base, odd.size()}, "legacy.safetensors");
  ASSERT_NE(reinterpret_cast<uintptr_t>(misaligned.at("f").bytes.data()) % 4, 0u);
  try {
    (void)misaligned.at("f").view();
    FAIL() << "misaligned view";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("legacy.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'f'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("aligned"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsReader, MissingTensorNamesFileAndTensor) {
  const SafetensorsFile file =
      SafetensorsFile::parse(assemble_image("{}", {}), "some/file.safetensors");
  try {
    file.at("layers.0.attn.wq_a.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("some/file.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("layers.0.attn.wq_a.weight"), std::string::npos);
  }
}

// --- malformed files ------------------------------------------------------------------------

struct Malformed {
  const char* label;
  std::vector<std::byte> image;
  std::vector<std::string> expected;  // substrings of the message besides the file name
};

std::vector<Malformed> malformed_cases() {
  auto one = [](const std::string& entry, std::vector<uint8_t> data) {
    return assemble_image(R"({"bad.tensor":)" + entry + "}", data);
  };
  const std::string t = "'bad.tensor'";
  std::vector<Malformed> cases = {
      {"shorter than the length prefix", {std::byte{1}, std::byte{0}, std::byte{0}}, {"too short"}},
      {"header length beyond file", assemble_image("{}", {}, 3), {"header length 3", "truncated"}},
      {"header length absurd", assemble_image("{}", {}, 200'000'000), {"exceeds the limit"}},
      {"header length 2^64-1", assemble_image("{}", {}, UINT64_MAX - 1), {"exceeds the limit"}},
      {"invalid JSON", assemble_image(R"({"a":{"dtype":"F32",)", {}), {"not valid JSON"}},
      {"invalid UTF-8", assemble_image("{\"\xff\":1}", {}), {"not valid JSON"}},
      {"trailing garbage", assemble_image("{}x", {}), {"not valid JSON"}},
      {"NUL padding", assemble_image(std::string("{}\0\0", 4), {}), {"not valid JSON", "NUL byte"}},
      {"NUL then garbage", assemble_image(std::string("{}\0x", 4), {}), {"not valid JSON"}},
      {"header not an object", assemble_image("[1,2]", {}), {"must be a JSON object", "array"}},
      {"entry not an object", one("[]", {}), {t, "must be an object"}},
      {"missing dtype",
       one(R"({"shape":[1],"data_offsets":[0,1]})", {0}),
       {t, "missing field 'dtype'"}},
      {"missing shape",
       one(R"({"dtype":"I8","data_offsets":[0,1]})", {0}),
       {t, "missing field 'shape'"}},
      {"missing offsets",
       one(R"({"dtype":"I8","shape":[1]})", {0}),
       {t, "missing field 'data_offsets'"}},
      {"dtype not a string",
       one(R"({"dtype":8,"shape":[1],"data_offsets":[0,1]})", {0}),
       {t, "'dtype' must be a string"}},
      {"unknown dtype",
       one(R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})", iota_bytes(8)),
       {t, "unknown dtype \"F64\""}},
      {"lowercase dtype",
       one(R"({"dtype":"f32","shape":[1],"data_offsets":[0,4]})", iota_bytes(4)),
       {t, "unknown dtype"}},
      {"shape not an array",
       one(R"({"dtype":"I8","shape":"1","data_offsets":[0,1]})", {0}),
       {t, "'shape' must be an array"}},
      {"shape float",
       one(R"({"dtype":"I8","shape":[1.0],"data_offsets":[0,1]})", {0}),
       {t, "non-negative integer"}},
      {"shape string",
       one(R"({"dtype":"I8","shape":["1"],"data_offsets":[0,1]})", {0}),
       {t, "non-negative integer"}},
      {"negative shape",
       one(R"({"dtype":"I8","shape":[-1],"data_offsets":[0,1]})", {0}),
       {t, "negative"}},
      {"shape beyond 64 bits",
       one(R"({"dtype":"I8","shape":[18446744073709551616],"data_offsets":[0,1]})", {0}),
       {t, "non-negative integer"}},
      {"shape product overflow",
       one(R"({"dtype":"I8","shape":[4294967296,4294967296],"data_offsets":[0,1]})", {0}),
       {t, "more elements than fit"}},
      {"extent above int64",
       one(R"({"dtype":"I8","shape":[9223372036854775808],"data_offsets":[0,1]})", {0}),
       {t, "more elements than fit"}},
      {"byte count overflow",
       one(R"({"dtype":"I64","shape":[4611686018427387904],"data_offsets":[0,8]})", iota_bytes(8)),
       {t, "more bytes than fit"}},
      {"offsets not an array",
       one(R"({"dtype":"I8","shape":[1],"data_offsets":0})", {0}),
       {t, "'data_offsets' must be an array"}},
      {"offsets wrong length",
       one(R"({"dtype":"I8","shape":[1],"data_offsets":[0,1,2]})", {0}),
       {t, "'data_offsets' must be an array"}},
      {"negative offset",
       one(R"({"dtype":"I8","shape":[1],"data_offsets":[-1,0]})", {0}),
       {t, "negative"}},
      {"end before begin",
       one(R"({"dtype":"I8","shape":[0],"data_offsets":[1,0]})", {0}),
       {t, "end before"}},
      {"size mismatch",
       one(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})", iota_bytes(20)),
       {t, "span 20 bytes", "needs 24 bytes"}},
      {"odd F4 count",
       one(R"({"dtype":"F4","shape":[3],"data_offsets":[0,2]})", {0, 0}),
       {t, "odd element count 3"}},
      {"truncated data",
       one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})", iota_bytes(10)),
       {t, "truncated"}},
      {"offsets far outside",
       one(R"({"dtype":"I8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]})",
           {0}),
       {t, "run past the end"}},
      {"overlap",
       assemble_image(
           R"({"first":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},"bad.tensor":{"dtype":"I8","shape":[4],"data_offsets":[2,6]}})",
           iota_bytes(6)),
       {t, "overlap tensor 'first'"}},
      {"empty tensor inside another",
       assemble_image(
           R"({"first":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},"bad.tensor":{"dtype":"I8","shape":[0],"data_offsets":[2,2]}})",
           iota_bytes(4)),
       {t, "overlap tensor 'first'"}},
      {"same offsets twice",
       assemble_image(
           R"({"first":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},"bad.tensor":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})",
           iota_bytes(4)),
       {"overlap tensor"}},
      {"gap between tensors",
       assemble_image(
           R"({"first":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},"bad.tensor":{"dtype":"I8","shape":[4],"data_offsets":[5,9]}})",
           iota_bytes(9)),
       {t, "gap of 1 unused bytes after tensor 'first'"}},
      {"gap at start",
       one(R"({"dtype":"I8","shape":[1],"data_offsets":[3,4]})", iota_bytes(4)),
       {t, "gap of 3", "start of the data section"}},
      {"trailing bytes",
       one(R"({"dtype":"I8","shape":[1],"data_offsets":[0,1]})", iota_bytes(5)),
       {t, "4 trailing bytes"}},
      {"data without tensors", assemble_image("{}", iota_bytes(3)), {"3 trailing bytes"}},
      {"duplicate tensor",
       assemble_image(
           R"({"bad.tensor":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"bad.tensor":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}})",
           {0}),
       {t, "more than once"}},
      {"duplicate field",
       one(R"({"dtype":"I8","dtype":"I8","shape":[1],"data_offsets":[0,1]})", {0}),
       {"repeats the key 'dtype'"}},
      {"metadata not an object",
       assemble_image(R"({"__metadata__":["a"]})", {}),
       {"__metadata__ must be an object"}},
      {"metadata value not a string",
       assemble_image(R"({"__metadata__":{"epoch":3}})", {}),
       {"'epoch' must be a string"}},
  };
  return cases;
}

TEST(SafetensorsReader, RefusesMalformedFilesNamingFileAndTensor) {
  ScratchDir dir;
  for (const Malformed& c : malformed_cases()) {
    SCOPED_TRACE(c.label);
    const auto path = dir.path() / "broken-shard.safetensors";
    testing::write_file(path, c.image);
    // Both the mapped-file path and the in-memory path must refuse it with the same message.
    for (int from_disk = 0; from_disk < 2; ++from_disk) {
      try {
        if (from_disk) {
          SafetensorsFile::open(path);
        } else {
          SafetensorsFile::parse(c.image, path.string());
        }
        ADD_FAILURE() << "accepted";
      } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find(path.string()), std::string::npos) << message;
        for (const std::string& part : c.expected)
          EXPECT_NE(message.find(part), std::string::npos) << message;
      }
    }
  }
}

TEST(SafetensorsReader, RefusesWhatIsNotAFile) {
  ScratchDir dir;
  EXPECT_THROW(SafetensorsFile::open(dir.path()), Error);
  EXPECT_THROW(SafetensorsFile::open(dir.path() / "absent.safetensors"), Error);
  testing::write_file(dir.path() / "empty.safetensors", {});
  try {
    SafetensorsFile::open(dir.path() / "empty.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("empty.safetensors"), std::string::npos);
  }
}

}  // namespace
}  // namespace deepinfer
