#include "tokenizer/engram_map.h"

#include <unordered_map>

#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

std::string collapse_ascii_whitespace_runs(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool in_run = false;
  for (const char c : text) {
    const bool space = c == ' ' || c == '\t' || c == '\r' || c == '\n';
    if (space) {
      if (!in_run) out.push_back(' ');
      in_run = true;
    } else {
      out.push_back(c);
      in_run = false;
    }
  }
  return out;
}

}  // namespace

std::string engram_normalize(std::string_view text) {
  std::string s = unicode_normalize(text, UnicodeForm::kNFKC);
  s = unicode_normalize(s, UnicodeForm::kNFD);
  s = strip_accents(s);
  s = lowercase(s);
  s = collapse_ascii_whitespace_runs(s);
  // HF swaps a string that is exactly one space for U+E000 before Strip() and back after, so
  // a lone space survives; any other string is stripped. (No newline is left for "^ $" to
  // see, so it can only match the whole string.) A pre-existing U+E000 also becomes a space.
  if (s == " ") return s;
  s = strip(s, true, true);
  std::string out;
  out.reserve(s.size());
  const std::string_view sentinel = "\xEE\x80\x80";
  for (std::size_t pos = 0; pos < s.size();) {
    if (s.compare(pos, sentinel.size(), sentinel) == 0) {
      out.push_back(' ');
      pos += sentinel.size();
    } else {
      out.push_back(s[pos++]);
    }
  }
  return out;
}

CompressedTokenMap build_compressed_token_map(const Tokenizer& tokenizer) {
  CompressedTokenMap map;
  const int32_t size = tokenizer.vocab_size();
  map.lookup.resize(static_cast<std::size_t>(size));
  std::unordered_map<std::string, int32_t> key_to_compressed;
  key_to_compressed.reserve(static_cast<std::size_t>(size));
  std::string replacement;
  append_utf8(replacement, kReplacementChar);
  for (int32_t id = 0; id < size; ++id) {
    const std::string text = utf8_lossy(tokenizer.token_bytes(id));
    std::string key;
    if (text.find(replacement) != std::string::npos) {
      key = tokenizer.id_to_token(id);  // a partial UTF-8 byte token: keyed by its raw spelling
    } else {
      key = engram_normalize(text);
      if (key.empty()) key = text;
    }
    auto [it, inserted] =
        key_to_compressed.emplace(std::move(key), static_cast<int32_t>(key_to_compressed.size()));
    map.lookup[static_cast<std::size_t>(id)] = it->second;
  }
  map.compressed_vocab_size = static_cast<int32_t>(key_to_compressed.size());
  return map;
}

}  // namespace deepinfer::tokenizer
