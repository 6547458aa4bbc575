// Paths of the tokenizer test data: the shared DeepSeek tokenizer and the oracle files that
// scripts/tokenizer/make_expected.py produced (extracted by CMake at configure time).
#pragma once

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

namespace deepinfer::tokenizer::testing {

inline std::filesystem::path deepseek_tokenizer_dir() {
  return std::filesystem::path(DEEPINFER_SHARED_DIR) / "data" / "tokenizers" / "deepseek_v3";
}

inline std::filesystem::path oracle_dir() {
  return DEEPINFER_TOKENIZER_ORACLE_DIR;
}

inline std::string hex_to_bytes(const std::string& hex) {
  std::string out;
  out.reserve(hex.size() / 2);
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

}  // namespace deepinfer::tokenizer::testing

#define DI_REQUIRE_DEEPSEEK_TOKENIZER()                                                      \
  do {                                                                                       \
    if (!std::filesystem::exists(::deepinfer::tokenizer::testing::deepseek_tokenizer_dir() / \
                                 "tokenizer.json")) {                                        \
      GTEST_SKIP() << "shared DeepSeek tokenizer not found under DEEPINFER_SHARED_DIR";      \
    }                                                                                        \
  } while (false)
