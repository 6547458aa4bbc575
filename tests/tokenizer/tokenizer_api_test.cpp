// The tokenizer's public API beyond HF equality: streaming detokenization, BOS handling from
// tokenizer_config.json, special-token parsing switch, batch encoding, and clear errors for
// malformed or unsupported tokenizer files.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_data.h"
#include "tokenizer/streaming_detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

using testing::deepseek_tokenizer_dir;
using testing::hex_to_bytes;
using testing::oracle_dir;

const Tokenizer& deepseek() {
  static const Tokenizer tokenizer = Tokenizer::from_dir(deepseek_tokenizer_dir());
  return tokenizer;
}

std::vector<std::vector<int32_t>> corpus_ids(std::size_t stride) {
  std::vector<std::vector<int32_t>> out;
  std::ifstream file(oracle_dir() / "corpus.jsonl");
  std::string line;
  for (std::size_t i = 0; std::getline(file, line); ++i) {
    if (i % stride == 0)
      out.push_back(nlohmann::json::parse(line)["ids"].get<std::vector<int32_t>>());
  }
  return out;
}

TEST(StreamingDetokenizer, ConcatenationEqualsFullDecodeAndChunksAreWholeCharacters) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER();
  const auto all = corpus_ids(10);
  ASSERT_GT(all.size(), 2000u);
  for (const bool skip : {false, true}) {
    for (const auto& ids : all) {
      StreamingDetokenizer stream(deepseek(), skip);
      std::string text;
      for (const int32_t id : ids) {
        const std::string chunk = stream.push(id);
        ASSERT_TRUE(is_valid_utf8(chunk));
        text += chunk;
      }
      text += stream.finish();
      ASSERT_EQ(text, deepseek().decode(ids, skip));
    }
  }
}

TEST(StreamingDetokenizer, HoldsBackAPartialCharacterUntilItCompletes) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER();
  // Find two byte-level tokens that together spell one 3-byte character.
  const auto ids = deepseek().encode("\xE2\x80\xA6\xE2\x80\xA6\xF0\x9F\xA6\x80", false);
  StreamingDetokenizer stream(deepseek());
  std::string text;
  for (const int32_t id : ids) {
    text += stream.push(id);
    EXPECT_LT(stream.pending_bytes(), 4u);
  }
  EXPECT_EQ(text + stream.finish(), "\xE2\x80\xA6\xE2\x80\xA6\xF0\x9F\xA6\x80");
  // A lone lead byte never completes: finish() turns it into U+FFFD, as decode() does.
  const int32_t lead = *deepseek().token_to_id("\xC3\xA2");  // spelling of byte 0xE2
  StreamingDetokenizer broken(deepseek());
  EXPECT_EQ(broken.push(lead), "");
  EXPECT_EQ(broken.pending_bytes(), 1u);
  EXPECT_EQ(broken.finish(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, AddSpecialTokensPrependsTheConfiguredBos) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER();
  ASSERT_TRUE(deepseek().bos_id().has_value());
  EXPECT_EQ(*deepseek().bos_id(), *deepseek().token_to_id("<｜begin▁of▁sentence｜>"));
  EXPECT_EQ(*deepseek().eos_id(), *deepseek().token_to_id("<｜end▁of▁sentence｜>"));
  const auto plain = deepseek().encode("Hello world", false);
  const auto with = deepseek().encode("Hello world", true);
  ASSERT_EQ(with.size(), plain.size() + 1);
  EXPECT_EQ(with.front(), *deepseek().bos_id());
  // tokenizer.json alone has a ByteLevel post-processor: nothing is added.
  const auto bare = Tokenizer::from_file(deepseek_tokenizer_dir() / "tokenizer.json");
  EXPECT_EQ(bare.encode("Hello world", true), plain);
}

TEST(Tokenizer, SpecialTokenTextIsPlainTextWhenParsingIsOff) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER();
  const std::string text = "a<｜User｜>b<｜end▁of▁sentence｜>";
  const int32_t user = *deepseek().token_to_id("<｜User｜>");
  const int32_t eos = *deepseek().eos_id();
  const auto parsed = deepseek().encode(text, false);
  EXPECT_NE(std::find(parsed.begin(), parsed.end(), user), parsed.end());
  const auto plain = deepseek().encode(text, false, /*parse_special_tokens=*/false);
  EXPECT_EQ(std::find(plain.begin(), plain.end(), eos), plain.end());
  EXPECT_EQ(deepseek().decode(plain), text);
  EXPECT_TRUE(deepseek().is_special(eos));
  EXPECT_EQ(deepseek().decode(parsed, /*skip_special_tokens=*/true),
            "a<｜User｜>b");  // User is not special
}

TEST(Tokenizer, DecodeSkipsPaddedIdsAndRejectsNegativeOnes) {
  DI_REQUIRE_DEEPSEEK_TOKENIZER();
  // HF tokenizers: Tokenizer.decode([100, 129000, 101]) == decode([100, 101]).
  const std::vector<int32_t> padded = {100, deepseek().vocab_size(), 129279, 101};
  const std::vector<int32_t> plain = {100, 101};
  EXPECT_EQ(deepseek().decode(padded), deepseek().decode(plain));
  const std::vector<int32_t> negative = {-1};
  EXPECT_THROW((void)deepseek().decode(negative), Error);
}

class MalformedTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("di_tok_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static nlohmann::json minimal() {
    return nlohmann::json::parse(R"({
      "added_tokens": [], "normalizer": null,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
      "post_processor": null, "decoder": {"type": "ByteLevel"},
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
  }

  // Writes `json` (or raw text) and returns the message of the Error that loading throws.
  std::string load_error(const std::string& text) {
    std::ofstream(dir_ / "tokenizer.json") << text;
    try {
      (void)Tokenizer::from_dir(dir_);
    } catch (const Error& e) {
      return e.what();
    }
    return "<no error>";
  }

  std::filesystem::path dir_;
};

TEST_F(MalformedTokenizer, ErrorsNameTheFileAndTheComponent) {
  EXPECT_NE(load_error("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(load_error("{not json").find("tokenizer.json"), std::string::npos);

  auto with = [&](const char* pointer, const nlohmann::json& value) {
    nlohmann::json spec = minimal();
    spec[nlohmann::json::json_pointer(pointer)] = value;
    return load_error(spec.dump());
  };
  EXPECT_NE(with("/model/type", "WordPiece").find("WordPiece"), std::string::npos);
  EXPECT_NE(with("/normalizer", {{"type", "BertNormalizer"}}).find("BertNormalizer"),
            std::string::npos);
  EXPECT_NE(with("/pre_tokenizer", {{"type", "Metaspace"}}).find("Metaspace"), std::string::npos);
  EXPECT_NE(with("/decoder", {{"type", "WordPiece"}}).find("WordPiece"), std::string::npos);
  EXPECT_NE(with("/post_processor", {{"type", "BertProcessing"}}).find("BertProcessing"),
            std::string::npos);
  EXPECT_NE(with("/model/merges", {"a c"}).find("merges[0]"), std::string::npos);
  EXPECT_NE(with("/model/byte_fallback", true).find("byte_fallback"), std::string::npos);
  EXPECT_NE(
      with("/pre_tokenizer",
           {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}})
          .find("cannot compile regex"),
      std::string::npos);
  EXPECT_NE(with("/pre_tokenizer",
                 {{"type", "Split"}, {"pattern", {{"Regex", "x"}}}, {"behavior", "Isolated"}})
                .find("no ByteLevel"),
            std::string::npos);
  EXPECT_EQ(load_error(minimal().dump()), "<no error>");  // the baseline itself is valid
}

TEST_F(MalformedTokenizer, MissingDirectoryFileIsReported) {
  try {
    (void)Tokenizer::from_dir(dir_ / "nope");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace deepinfer::tokenizer
