#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

struct Tables {
  std::array<char32_t, 256> byte_to_char{};
  std::array<int, 512> char_to_byte{};  // every byte-level code point is below U+0200
  Tables() {
    char_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next_extra = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t c =
          printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next_extra++);
      byte_to_char[static_cast<std::size_t>(b)] = c;
      char_to_byte[c] = b;
    }
  }
};

const Tables& tables() {
  static const Tables instance;
  return instance;
}

}  // namespace

char32_t byte_to_char(unsigned char byte) {
  return tables().byte_to_char[byte];
}

std::optional<unsigned char> char_to_byte(char32_t code_point) {
  if (code_point >= 512) return std::nullopt;
  const int byte = tables().char_to_byte[code_point];
  if (byte < 0) return std::nullopt;
  return static_cast<unsigned char>(byte);
}

std::string byte_level_decode_token(std::string_view token) {
  if (!is_valid_utf8(token)) return std::string(token);
  std::string bytes;
  bytes.reserve(token.size());
  std::size_t pos = 0;
  while (pos < token.size()) {
    const auto byte = char_to_byte(decode_utf8(token, pos));
    if (!byte) return std::string(token);
    bytes.push_back(static_cast<char>(*byte));
  }
  return bytes;
}

bool is_byte_level_spelling(std::string_view token) {
  if (!is_valid_utf8(token)) return false;
  std::size_t pos = 0;
  while (pos < token.size()) {
    if (!char_to_byte(decode_utf8(token, pos))) return false;
  }
  return true;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char byte : bytes) append_utf8(out, byte_to_char(static_cast<unsigned char>(byte)));
  return out;
}

}  // namespace deepinfer::tokenizer
