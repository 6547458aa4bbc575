// Code point sets and their lowering to byte-level expressions (UTF-8 or JSON string content).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "structured/grammar.h"

namespace deepinfer::structured {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// Sorted, disjoint, non-adjacent closed ranges of code points.
class CodePointSet {
 public:
  CodePointSet() = default;
  static CodePointSet single(uint32_t cp) { return range(cp, cp); }
  static CodePointSet range(uint32_t lo, uint32_t hi);
  static CodePointSet all();  // every scalar value (surrogates excluded)

  void add(uint32_t lo, uint32_t hi);
  void add(const CodePointSet& other);
  CodePointSet complement() const;  // against all()
  bool empty() const { return ranges_.empty(); }
  bool contains(uint32_t cp) const;
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }

 private:
  void normalize();
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

enum class TextEncoding {
  kUtf8,        // raw UTF-8 bytes
  kJsonString,  // the bytes inside a JSON string literal, escaped the way JSON serializers do
};

// Bytes that encode one code point.
std::string encode_code_point(uint32_t cp, TextEncoding encoding);
// One byte-level expression matching exactly one code point of `set`.
ExprPtr code_point_set_expr(const CodePointSet& set, TextEncoding encoding);
// Any single character of JSON string content: an unescaped scalar or any valid escape.
ExprPtr json_string_char_expr();

// Decodes one UTF-8 scalar at text[pos]; returns false on malformed input.
bool decode_utf8(const std::string& text, size_t& pos, uint32_t& cp);

}  // namespace deepinfer::structured
