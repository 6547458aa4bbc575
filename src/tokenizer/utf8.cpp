#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

// Expected sequence length from the lead byte; 0 for bytes that cannot start a sequence.
std::size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// The allowed range of the second byte depends on the lead byte (Unicode Table 3-7).
bool second_byte_ok(unsigned char lead, unsigned char second) {
  switch (lead) {
    case 0xE0:
      return second >= 0xA0 && second <= 0xBF;
    case 0xED:
      return second >= 0x80 && second <= 0x9F;
    case 0xF0:
      return second >= 0x90 && second <= 0xBF;
    case 0xF4:
      return second >= 0x80 && second <= 0x8F;
    default:
      return second >= 0x80 && second <= 0xBF;
  }
}

bool is_continuation(unsigned char byte) {
  return byte >= 0x80 && byte <= 0xBF;
}

// How many bytes from pos form a well-formed prefix of a sequence (1..expected).
std::size_t well_formed_prefix(std::string_view text, std::size_t pos, std::size_t expected) {
  const auto lead = static_cast<unsigned char>(text[pos]);
  std::size_t length = 1;
  while (length < expected && pos + length < text.size()) {
    const auto byte = static_cast<unsigned char>(text[pos + length]);
    const bool ok = length == 1 ? second_byte_ok(lead, byte) : is_continuation(byte);
    if (!ok) break;
    ++length;
  }
  return length;
}

}  // namespace

std::size_t valid_utf8_length_at(std::string_view text, std::size_t pos) {
  const std::size_t expected = sequence_length(static_cast<unsigned char>(text[pos]));
  if (expected == 0) return 0;
  if (expected == 1) return 1;
  return well_formed_prefix(text, pos, expected) == expected ? expected : 0;
}

std::size_t invalid_utf8_subpart_length(std::string_view text, std::size_t pos) {
  const std::size_t expected = sequence_length(static_cast<unsigned char>(text[pos]));
  if (expected <= 1) return 1;
  return well_formed_prefix(text, pos, expected);
}

bool is_valid_utf8(std::string_view text) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const std::size_t length = valid_utf8_length_at(text, pos);
    if (length == 0) return false;
    pos += length;
  }
  return true;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t pos = 0;
  while (pos < bytes.size()) {
    const std::size_t length = valid_utf8_length_at(bytes, pos);
    if (length > 0) {
      out.append(bytes.substr(pos, length));
      pos += length;
    } else {
      append_utf8(out, kReplacementChar);
      pos += invalid_utf8_subpart_length(bytes, pos);
    }
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t decode_utf8(std::string_view text, std::size_t& pos) {
  const auto lead = static_cast<unsigned char>(text[pos]);
  if (lead < 0x80) {
    ++pos;
    return lead;
  }
  const std::size_t length = sequence_length(lead);
  char32_t cp = lead & (0x7F >> length);
  for (std::size_t i = 1; i < length; ++i) {
    cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  }
  pos += length;
  return cp;
}

std::size_t incomplete_utf8_tail(std::string_view text) {
  // A sequence is at most 4 bytes, so only the last 3 bytes can be an unfinished prefix.
  const std::size_t size = text.size();
  for (std::size_t back = 1; back <= 3 && back <= size; ++back) {
    const std::size_t pos = size - back;
    const auto byte = static_cast<unsigned char>(text[pos]);
    if (is_continuation(byte)) continue;
    const std::size_t expected = sequence_length(byte);
    if (expected <= back) return 0;  // complete (or invalid) sequence ends the text
    return well_formed_prefix(text, pos, expected) == back ? back : 0;
  }
  return 0;
}

}  // namespace deepinfer::tokenizer
