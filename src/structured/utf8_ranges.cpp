#include "structured/utf8_ranges.h"

#include <algorithm>

namespace deepinfer::structured {

CodePointSet CodePointSet::range(uint32_t lo, uint32_t hi) {
  CodePointSet set;
  set.add(lo, hi);
  return set;
}

CodePointSet CodePointSet::all() {
  CodePointSet set;
  set.add(0, 0xD7FF);
  set.add(0xE000, kMaxCodePoint);
  return set;
}

void CodePointSet::add(uint32_t lo, uint32_t hi) {
  if (lo > hi) return;
  ranges_.emplace_back(lo, hi);
  normalize();
}

void CodePointSet::add(const CodePointSet& other) {
  ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  normalize();
}

void CodePointSet::normalize() {
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& r : ranges_) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  ranges_ = std::move(merged);
}

CodePointSet CodePointSet::complement() const {
  CodePointSet out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : ranges_) {
    if (lo > next) out.ranges_.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.ranges_.emplace_back(next, kMaxCodePoint);
  // Remove surrogates: they are not scalar values and have no UTF-8 encoding.
  CodePointSet scalars;
  for (const auto& [lo, hi] : out.ranges_) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      scalars.ranges_.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) scalars.ranges_.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) scalars.ranges_.emplace_back(0xE000, hi);
  }
  return scalars;
}

bool CodePointSet::contains(uint32_t cp) const {
  for (const auto& [lo, hi] : ranges_) {
    if (cp >= lo && cp <= hi) return true;
  }
  return false;
}

namespace {

int utf8_length(uint32_t cp) {
  if (cp < 0x80) return 1;
  if (cp < 0x800) return 2;
  if (cp < 0x10000) return 3;
  return 4;
}

void encode_utf8(uint32_t cp, uint8_t* out) {
  switch (utf8_length(cp)) {
    case 1:
      out[0] = static_cast<uint8_t>(cp);
      break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  }
}

// Splits [lo, hi] (same encoded length) until each piece is a product of byte ranges.
void split_utf8(uint32_t lo, uint32_t hi, std::vector<ExprPtr>& out) {
  int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    uint32_t mask = (1u << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        split_utf8(lo, lo | mask, out);
        split_utf8((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        split_utf8(lo, (hi & ~mask) - 1, out);
        split_utf8(hi & ~mask, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  encode_utf8(lo, a);
  encode_utf8(hi, b);
  std::vector<ExprPtr> seq;
  for (int k = 0; k < n; ++k) seq.push_back(byte_range_expr(a[k], b[k]));
  out.push_back(seq_expr(std::move(seq)));
}

void utf8_range_exprs(uint32_t lo, uint32_t hi, std::vector<ExprPtr>& out) {
  static const uint32_t kBounds[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  for (uint32_t bound : kBounds) {
    if (lo > hi) return;
    if (lo > bound) continue;
    uint32_t end = std::min(hi, bound);
    split_utf8(lo, end, out);
    lo = end + 1;
  }
}

bool needs_json_escape(uint32_t cp) {
  return cp < 0x20 || cp == '"' || cp == '\\';
}

}  // namespace

std::string encode_code_point(uint32_t cp, TextEncoding encoding) {
  if (encoding == TextEncoding::kJsonString && needs_json_escape(cp)) {
    switch (cp) {
      case '"':
        return "\\\"";
      case '\\':
        return "\\\\";
      case '\b':
        return "\\b";
      case '\f':
        return "\\f";
      case '\n':
        return "\\n";
      case '\r':
        return "\\r";
      case '\t':
        return "\\t";
      default: {
        static const char* kHex = "0123456789abcdef";
        return std::string("\\u00") + kHex[cp >> 4] + kHex[cp & 15];
      }
    }
  }
  uint8_t buf[4];
  encode_utf8(cp, buf);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(utf8_length(cp)));
}

ExprPtr code_point_set_expr(const CodePointSet& set, TextEncoding encoding) {
  std::vector<ExprPtr> alternatives;
  for (auto [lo, hi] : set.ranges()) {
    if (encoding == TextEncoding::kJsonString) {
      // Escaped characters (all below 0x5D) become literals; the rest is raw UTF-8.
      while (lo <= hi && lo <= '\\') {
        if (needs_json_escape(lo)) {
          alternatives.push_back(bytes_expr(encode_code_point(lo, encoding)));
          ++lo;
          continue;
        }
        uint32_t end = lo;
        while (end < hi && !needs_json_escape(end + 1)) ++end;
        utf8_range_exprs(lo, end, alternatives);
        lo = end + 1;
      }
      if (lo > hi) continue;
    }
    utf8_range_exprs(lo, hi, alternatives);
  }
  return alt_expr(std::move(alternatives));
}

ExprPtr json_string_char_expr() {
  static const ExprPtr kChar = [] {
    CodePointSet raw = CodePointSet::all();
    CodePointSet escaped;
    escaped.add(0, 0x1F);
    escaped.add('"', '"');
    escaped.add('\\', '\\');
    CodePointSet unescaped;
    for (auto [lo, hi] : raw.ranges()) {
      for (uint32_t cp = lo; cp <= hi;) {
        if (escaped.contains(cp)) {
          ++cp;
          continue;
        }
        uint32_t end = cp;
        while (end < hi && !escaped.contains(end + 1)) ++end;
        unescaped.add(cp, end);
        cp = end + 1;
      }
    }
    std::bitset<256> simple_escape;
    for (char c : std::string("\"\\/bfnrt")) simple_escape.set(static_cast<uint8_t>(c));
    std::bitset<256> hex;
    for (char c : std::string("0123456789abcdefABCDEF")) hex.set(static_cast<uint8_t>(c));
    ExprPtr hex_digit = byte_set_expr(hex);
    ExprPtr escape = seq_expr(
        {bytes_expr("\\"),
         alt_expr({byte_set_expr(simple_escape),
                   seq_expr({bytes_expr("u"), hex_digit, hex_digit, hex_digit, hex_digit})})});
    return alt_expr({code_point_set_expr(unescaped, TextEncoding::kUtf8), escape});
  }();
  return kChar;
}

bool decode_utf8(const std::string& text, size_t& pos, uint32_t& cp) {
  auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  uint8_t b0 = byte(pos);
  int n;
  if (b0 < 0x80) {
    cp = b0;
    n = 1;
  } else if ((b0 & 0xE0) == 0xC0) {
    cp = b0 & 0x1F;
    n = 2;
  } else if ((b0 & 0xF0) == 0xE0) {
    cp = b0 & 0x0F;
    n = 3;
  } else if ((b0 & 0xF8) == 0xF0) {
    cp = b0 & 0x07;
    n = 4;
  } else {
    return false;
  }
  if (pos + static_cast<size_t>(n) > text.size()) return false;
  for (int k = 1; k < n; ++k) {
    uint8_t b = byte(pos + static_cast<size_t>(k));
    if ((b & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (utf8_length(cp) != n || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  pos += static_cast<size_t>(n);
  return true;
}

}  // namespace deepinfer::structured
