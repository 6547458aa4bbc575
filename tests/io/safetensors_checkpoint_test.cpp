// Sharded checkpoints: the writer's split and index, and the reader's cross-validation of the
// index against the shards (missing shard, tensor in the wrong shard, duplicates).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors_checkpoint.h"
#include "io/safetensors_writer.h"
#include "safetensors_test_util.h"

namespace deepinfer {
namespace {

using testing::as_bytes;
using testing::iota_bytes;
using testing::read_text;
using testing::ScratchDir;

// Five I8 tensors of 40, 40, 40, 100 and 10 bytes; with a 100-byte limit the greedy split
// (a new shard when the next tensor would overflow the current one) gives
// {a, b} {c} {d} {e}.
struct Fixture {
  std::vector<std::vector<uint8_t>> storage = {iota_bytes(40, 1), iota_bytes(40, 2),
                                               iota_bytes(40, 3), iota_bytes(100, 4),
                                               iota_bytes(10, 5)};
  std::vector<SafetensorsEntry> entries;
  Fixture() {
    const char* names[] = {"layers.0.a", "layers.0.b", "layers.1.c", "layers.1.d", "norm.e"};
    for (size_t i = 0; i < storage.size(); ++i) {
      entries.push_back(
          {names[i], DType::kI8, {static_cast<int64_t>(storage[i].size())}, as_bytes(storage[i])});
    }
  }
};

void expect_error(const std::filesystem::path& path, const std::vector<std::string>& parts) {
  try {
    SafetensorsCheckpoint::open(path);
    ADD_FAILURE() << "opened " << path;
  } catch (const Error& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

nlohmann::json read_index(const std::filesystem::path& dir) {
  return nlohmann::json::parse(read_text(dir / "model.safetensors.index.json"));
}

void write_index(const std::filesystem::path& dir, const nlohmann::json& index) {
  const std::string text = index.dump(2);
  std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()),
                               reinterpret_cast<const std::byte*>(text.data()) + text.size());
  testing::write_file(dir / "model.safetensors.index.json", bytes);
}

TEST(SafetensorsCheckpoint, WritesAndReadsShards) {
  Fixture fixture;
  ScratchDir dir;
  const ShardedWriteResult result =
      write_sharded_safetensors(dir.path(), fixture.entries, 100, {{"format", "pt"}});
  EXPECT_EQ(result.total_size, 230u);
  ASSERT_EQ(result.files.size(), 5u);
  EXPECT_EQ(result.files[0].filename(), "model-00001-of-00004.safetensors");
  EXPECT_EQ(result.files[3].filename(), "model-00004-of-00004.safetensors");
  EXPECT_EQ(result.files[4].filename(), "model.safetensors.index.json");

  const nlohmann::json index = read_index(dir.path());
  EXPECT_EQ(index["metadata"]["total_size"], 230);
  const nlohmann::json expected_map = {{"layers.0.a", "model-00001-of-00004.safetensors"},
                                       {"layers.0.b", "model-00001-of-00004.safetensors"},
                                       {"layers.1.c", "model-00002-of-00004.safetensors"},
                                       {"layers.1.d", "model-00003-of-00004.safetensors"},
                                       {"norm.e", "model-00004-of-00004.safetensors"}};
  EXPECT_EQ(index["weight_map"], expected_map);

  for (const auto& opened : {dir.path(), dir.path() / "model.safetensors.index.json"}) {
    const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(opened);
    EXPECT_EQ(checkpoint.shards().size(), 4u);
    EXPECT_EQ(checkpoint.declared_total_size(), 230u);
    EXPECT_EQ(checkpoint.total_tensor_bytes(), 230u);
    ASSERT_EQ(checkpoint.tensors().size(), 5u);
    for (size_t i = 0; i < fixture.entries.size(); ++i) {
      const SafetensorsTensor& t = checkpoint.at(fixture.entries[i].name);
      EXPECT_EQ(t.bytes.size(), fixture.storage[i].size());
      EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), fixture.entries[i].bytes.begin()));
      EXPECT_EQ(std::filesystem::path(t.file).filename(),
                expected_map[fixture.entries[i].name].get<std::string>());
    }
    EXPECT_EQ(checkpoint.shards()[0].metadata().at("format"), "pt");
    EXPECT_EQ(checkpoint.find("absent"), nullptr);
    EXPECT_THROW(checkpoint.at("absent"), Error);
  }
}

TEST(SafetensorsCheckpoint, OneShardIsASingleFileWithoutIndex) {
  Fixture fixture;
  ScratchDir dir;
  write_sharded_safetensors(dir.path(), fixture.entries, 100);  // leaves an index behind
  const ShardedWriteResult result = write_sharded_safetensors(dir.path(), fixture.entries, 1 << 20);
  ASSERT_EQ(result.files.size(), 1u);
  EXPECT_EQ(result.files[0].filename(), "model.safetensors");
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "model.safetensors.index.json"));
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(dir.path());
  EXPECT_TRUE(checkpoint.index_path().empty());
  EXPECT_EQ(checkpoint.tensors().size(), 5u);
  EXPECT_EQ(SafetensorsCheckpoint::open(dir.path() / "model.safetensors").tensors().size(), 5u);
}

TEST(SafetensorsCheckpoint, MissingShard) {
  Fixture fixture;
  ScratchDir dir;
  write_sharded_safetensors(dir.path(), fixture.entries, 100);
  std::filesystem::remove(dir.path() / "model-00001-of-00004.safetensors");
  expect_error(dir.path(), {"model.safetensors.index.json", "model-00001-of-00004.safetensors",
                            "layers.0.a", "and 1 more", "does not exist"});
}

TEST(SafetensorsCheckpoint, TensorInTheWrongShard) {
  Fixture fixture;
  ScratchDir dir;
  write_sharded_safetensors(dir.path(), fixture.entries, 100);
  nlohmann::json index = read_index(dir.path());
  index["weight_map"]["layers.0.a"] = "model-00003-of-00004.safetensors";  // it is in shard 1
  write_index(dir.path(), index);
  expect_error(dir.path(), {"model.safetensors.index.json", "'layers.0.a'",
                            "'model-00003-of-00004.safetensors'", "does not contain it",
                            "model-00001-of-00004.safetensors"});
}

TEST(SafetensorsCheckpoint, TensorInNoShard) {
  Fixture fixture;
  ScratchDir dir;
  write_sharded_safetensors(dir.path(), fixture.entries, 100);
  nlohmann::json index = read_index(dir.path());
  index["weight_map"]["layers.9.ghost"] = "model-00004-of-00004.safetensors";
  write_index(dir.path(), index);
  expect_error(dir.path(), {"'layers.9.ghost'", "no shard contains it"});
}

TEST(SafetensorsCheckpoint, TensorMissingFromIndex) {
  Fixture fixture;
  ScratchDir dir;
  write_sharded_safetensors(dir.path(), fixture.entries, 100);
  nlohmann::json index = read_index(dir.path());
  index["weight_map"].erase("layers.0.b");  // shard 1 stays listed through layers.0.a
  write_index(dir.path(), index);
  expect_error(dir.path(), {"'layers.0.b'", "model-00001-of-00004.safetensors", "does not list"});
}

TEST(SafetensorsCheckpoint, TensorInTwoShards) {
  Fixture fixture;
  ScratchDir dir;
  write_sharded_safetensors(dir.path(), fixture.entries, 100);
  // Rewrite shard 4 so it also holds layers.1.c, which shard 2 has.
  std::vector<SafetensorsEntry> shard4 = {fixture.entries[2], fixture.entries[4]};
  write_safetensors(dir.path() / "model-00004-of-00004.safetensors", shard4);
  expect_error(dir.path(), {"'layers.1.c'", "two shards", "model-00002-of-00004.safetensors",
                            "model-00004-of-00004.safetensors"});
}

TEST(SafetensorsCheckpoint, DuplicateEntryInWeightMap) {
  Fixture fixture;
  ScratchDir dir;
  write_sharded_safetensors(dir.path(), fixture.entries, 100);
  std::string text = read_text(dir.path() / "model.safetensors.index.json");
  const std::string entry = R"("norm.e": "model-00004-of-00004.safetensors")";
  ASSERT_NE(text.find(entry), std::string::npos);
  text.replace(text.find(entry), entry.size(),
               entry + ",\n    " + R"("norm.e": "model-00001-of-00004.safetensors")");
  testing::write_file(
      dir.path() / "model.safetensors.index.json",
      std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                             reinterpret_cast<const std::byte*>(text.data()) + text.size()));
  expect_error(dir.path(), {"'norm.e'", "more than once in weight_map"});
}

TEST(SafetensorsCheckpoint, MalformedIndex) {
  Fixture fixture;
  ScratchDir dir;
  write_sharded_safetensors(dir.path(), fixture.entries, 100);
  const nlohmann::json good = read_index(dir.path());

  nlohmann::json index = good;
  index["weight_map"]["norm.e"] = "../outside.safetensors";
  write_index(dir.path(), index);
  expect_error(dir.path(), {"'norm.e'", "relative path inside"});

  index = good;
  index["weight_map"]["norm.e"] = "/etc/passwd";
  write_index(dir.path(), index);
  expect_error(dir.path(), {"'norm.e'", "relative path inside"});

  index = good;
  index["weight_map"]["norm.e"] = 4;
  write_index(dir.path(), index);
  expect_error(dir.path(), {"'norm.e'", "file name string"});

  index = good;
  index.erase("weight_map");
  write_index(dir.path(), index);
  expect_error(dir.path(), {"no 'weight_map'"});

  testing::write_file(dir.path() / "model.safetensors.index.json", {std::byte{'{'}});
  expect_error(dir.path(), {"model.safetensors.index.json", "not valid JSON"});

  // A corrupt shard is reported with its own file name.
  write_index(dir.path(), good);
  testing::write_file(dir.path() / "model-00002-of-00004.safetensors", {std::byte{1}});
  expect_error(dir.path(), {"model-00002-of-00004.safetensors", "too short"});
}

TEST(SafetensorsCheckpoint, DirectoryWithoutCheckpoint) {
  ScratchDir dir;
  expect_error(dir.path(), {dir.path().string(), "neither"});
  expect_error(dir.path() / "absent.safetensors", {"absent.safetensors"});
}

}  // namespace
}  // namespace deepinfer
