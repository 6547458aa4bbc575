// Exact equality with HF tokenizers (PyPI) on the committed corpus: ids, round trips, the bytes
// of every token and the engram compressed-vocabulary map. The expected values were produced by
// scripts/tokenizer/make_expected.py; nothing here is derived from deepinfer's own output.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_data.h"
#include "tokenizer/engram_map.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

using testing::deepseek_tokenizer_dir;
using testing::hex_to_bytes;
using testing::oracle_dir;

struct CorpusEntry {
  std::string bytes;
  std::vector<int32_t> ids;
};

const std::vector<CorpusEntry>& corpus() {
  static const std::vector<CorpusEntry> entries = [] {
    std::vector<CorpusEntry> out;
    std::ifstream file(oracle_dir() / "corpus.jsonl");
    std::string line;
    while (std::getline(file, line)) {
      const auto json = nlohmann::json::parse(line);
      CorpusEntry entry;
      entry.bytes = json.contains("t") ? json["t"].get<std::string>()
                                       : hex_to_bytes(json["x"].get<std::string>());
      entry.ids = json["ids"].get<std::vector<int32_t>>();
      out.push_back(std::move(entry));
    }
    return out;
  }();
  return entries;
}

const Tokenizer& deepseek() {
  static const Tokenizer tokenizer =
      Tokenizer::from_file(deepseek_tokenizer_dir() / "tokenizer.json");
  return tokenizer;
}

std::string printable(std::string_view bytes) {
  const std::string head(bytes.substr(0, 120));
  return nlohmann::json(utf8_lossy(head)).dump();
}

TEST(HfEquality, CorpusIdsAreIdentical) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER();
  const auto& entries = corpus();
  ASSERT_GE(entries.size(), 20000u) << "oracle corpus missing or truncated in " << oracle_dir();
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto ids = deepseek().encode(entries[i].bytes, /*add_special_tokens=*/false);
    if (ids != entries[i].ids) {
      if (++mismatches <= 10) {
        ADD_FAILURE() << "corpus line " << i + 1 << " " << printable(entries[i].bytes)
                      << "\n  deepinfer: " << nlohmann::json(ids).dump().substr(0, 300)
                      << "\n  HF:        " << nlohmann::json(entries[i].ids).dump().substr(0, 300);
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << entries.size() << " strings";
}

TEST(HfEquality, BatchEncodeOnAllThreadsMatches) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER();
  const auto& entries = corpus();
  std::vector<std::string> texts;
  for (std::size_t i = 0; i < entries.size(); i += 7) texts.push_back(entries[i].bytes);
  const auto batch = deepseek().encode_batch(texts, false, 0);
  ASSERT_EQ(batch.size(), texts.size());
  for (std::size_t i = 0, j = 0; i < entries.size(); i += 7, ++j) {
    ASSERT_EQ(batch[j], entries[i].ids) << "corpus line " << i + 1;
  }
}

TEST(HfEquality, DecodeRoundTripsToTheRepairedText) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER();
  std::size_t mismatches = 0;
  for (const auto& entry : corpus()) {
    if (deepseek().decode(entry.ids) != utf8_lossy(entry.bytes) && ++mismatches <= 10) {
      ADD_FAILURE() << "round trip differs for " << printable(entry.bytes);
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(HfEquality, EveryTokenDecodesToTheOracleBytes) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER();
  std::ifstream file(oracle_dir() / "token_bytes.json");
  ASSERT_TRUE(file) << "missing " << oracle_dir() / "token_bytes.json";
  const auto table = nlohmann::json::parse(file).get<std::vector<std::string>>();
  ASSERT_EQ(static_cast<std::size_t>(deepseek().vocab_size()), table.size());
  for (std::size_t id = 0; id < table.size(); ++id) {
    ASSERT_EQ(deepseek().token_bytes(static_cast<int32_t>(id)), hex_to_bytes(table[id]))
        << "id " << id;
  }
}

TEST(HfEquality, EngramCompressedMapIsIdentical) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER();
  std::ifstream file(oracle_dir() / "engram_map.json");
  ASSERT_TRUE(file) << "missing " << oracle_dir() / "engram_map.json";
  const auto expected = nlohmann::json::parse(file);
  const auto map = build_compressed_token_map(deepseek());
  EXPECT_EQ(map.compressed_vocab_size, expected["compressed_vocab"].get<int32_t>());
  const auto lookup = expected["map"].get<std::vector<int32_t>>();
  ASSERT_EQ(map.lookup.size(), lookup.size());
  std::size_t mismatches = 0;
  for (std::size_t id = 0; id < lookup.size(); ++id) {
    if (map.lookup[id] != lookup[id] && ++mismatches <= 10) {
      ADD_FAILURE() << "id " << id << " token "
                    << printable(deepseek().token_bytes(static_cast<int32_t>(id))) << ": deepinfer "
                    << map.lookup[id] << ", HF " << lookup[id];
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

}  // namespace
}  // namespace deepinfer::tokenizer
