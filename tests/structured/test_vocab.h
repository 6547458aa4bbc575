// Vocabularies for tests: a small synthetic one (every byte plus multi-byte JSON-ish pieces) and
// the DeepSeek V3 vocabulary from the shared data (skips when absent).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "structured/hf_vocab.h"
#include "structured/vocab.h"

namespace deepinfer::structured::testing {

inline std::shared_ptr<const VocabIndex> small_vocab() {
  static const std::shared_ptr<const VocabIndex> kVocab = [] {
    TokenizerVocab vocab;
    vocab.token_bytes.push_back("<eos>");
    vocab.stop_token_ids.push_back(0);
    vocab.token_bytes.push_back("<special>");
    vocab.special_token_ids.push_back(1);
    vocab.token_bytes.push_back("");  // padding row
    for (int b = 0; b < 256; ++b) vocab.token_bytes.push_back(std::string(1, static_cast<char>(b)));
    for (const char* piece :
         {"{\"",      "\":",   "\",\"", "\"}",  "}}",  "[{",  "}]",     "\":\"",
          "true",     "false", "null",  "12",   "0.",  "e+",  "-1",     "abc",
          "ab",       "\\u00", "\\n",   "  ",   "\n ", ",\"", "\"a\":", "name",
          "\xc3\xa9", "\xc3",  "\xa9x", "aaaa", "a\"", "1,",  "],",     "\"]"}) {
      vocab.token_bytes.push_back(piece);
    }
    return std::make_shared<const VocabIndex>(std::move(vocab));
  }();
  return kVocab;
}

inline std::string deepseek_tokenizer_path() {
  return std::string(DEEPINFER_SHARED_DIR) + "/data/tokenizers/deepseek_v3/tokenizer.json";
}

// nullptr when the shared data is absent.
inline std::shared_ptr<const VocabIndex> deepseek_vocab() {
  static const std::shared_ptr<const VocabIndex> kVocab =
      []() -> std::shared_ptr<const VocabIndex> {
    if (!std::filesystem::exists(deepseek_tokenizer_path())) return nullptr;
    return std::make_shared<const VocabIndex>(
        load_hf_byte_level_vocab(deepseek_tokenizer_path(), 129280,
                                 "<\xef\xbd\x9c"
                                 "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"));
  }();
  return kVocab;
}

}  // namespace deepinfer::structured::testing
