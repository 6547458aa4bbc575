// The engram compressed-vocabulary map of DeepSeek-V4.1: tokens whose decoded text normalizes
// alike (" The", "the", "THE") share one compressed id, and the n-gram hashes run over those
// ids. Follows HF transformers' build_compressed_token_map (models/deepseek_v41) step by step.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {

struct CompressedTokenMap {
  std::vector<int32_t> lookup;  // token id -> compressed id
  int32_t compressed_vocab_size = 0;
};

// NFKC, NFD, strip accents, lowercase, runs of [ \t\r\n] to one space, a lone " " kept (the
// private-use sentinel rule), strip outer whitespace.
std::string engram_normalize(std::string_view text);

CompressedTokenMap build_compressed_token_map(const Tokenizer& tokenizer);

}  // namespace deepinfer::tokenizer
