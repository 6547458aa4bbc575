// GPT-2's byte <-> printable-character table: byte-level BPE vocabularies spell every byte
// as one visible code point (0x20 becomes U+0120 'Ġ', printable ASCII maps to itself).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace deepinfer::tokenizer {

// The code point that spells `byte` in a byte-level vocabulary.
char32_t byte_to_char(unsigned char byte);

// The byte a code point spells, if it is one of the 256 byte-level characters.
std::optional<unsigned char> char_to_byte(char32_t code_point);

// Bytes a token string stands for, as HF's ByteLevel decoder computes them: every character
// mapped back to its byte, or — if any character is not a byte-level one — the token's own
// UTF-8 bytes unchanged (that is how added tokens such as "<｜User｜>" decode).
std::string byte_level_decode_token(std::string_view token);

// Whether every character of `token` is a byte-level character (the token is reachable by BPE).
bool is_byte_level_spelling(std::string_view token);

// The byte-level spelling of raw bytes (the inverse of byte_level_decode_token).
std::string byte_level_encode(std::string_view bytes);

}  // namespace deepinfer::tokenizer
