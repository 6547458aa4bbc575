// UTF-8 helpers shared by the tokenizer layer: decoding one code point, validation and the
// lossy repair that Rust's String::from_utf8_lossy and Python's errors="replace" both apply
// (each maximal invalid subpart becomes one U+FFFD), so our policy matches HF's byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::tokenizer {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length of the valid UTF-8 sequence starting at text[pos], or 0 if the bytes there are not a
// complete, well-formed sequence (overlong forms, surrogates and > U+10FFFF are invalid).
std::size_t valid_utf8_length_at(std::string_view text, std::size_t pos);

// Number of bytes of the maximal invalid subpart at text[pos] (>= 1); only meaningful when
// valid_utf8_length_at(text, pos) == 0.
std::size_t invalid_utf8_subpart_length(std::string_view text, std::size_t pos);

bool is_valid_utf8(std::string_view text);

// Replaces every maximal invalid subpart with U+FFFD; valid input comes back unchanged.
std::string utf8_lossy(std::string_view bytes);

// Appends the UTF-8 encoding of `code_point`.
void append_utf8(std::string& out, char32_t code_point);

// Decodes the code point at text[pos] of *valid* UTF-8 and advances pos.
char32_t decode_utf8(std::string_view text, std::size_t& pos);

// True when `text` ends inside an incomplete but so far well-formed UTF-8 sequence; returns the
// number of trailing bytes that may still complete into a character.
std::size_t incomplete_utf8_tail(std::string_view text);

}  // namespace deepinfer::tokenizer
