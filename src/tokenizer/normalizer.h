// HF tokenizers normalizers that byte-level BPE tokenizers use: Sequence, NFC/NFD/NFKC/NFKD,
// Lowercase, Strip, StripAccents, Replace (string or regex) and Prepend. Unicode data comes
// from utf8proc. Anything else is rejected at load time with its type named.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace deepinfer::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string apply(std::string_view text) const = 0;
};

// nullptr when the JSON is null or an empty Sequence (the identity). `origin` names the field.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& origin);

// Individual steps, also used by the engram compressed-vocabulary map.
enum class UnicodeForm { kNFC, kNFD, kNFKC, kNFKD };
std::string unicode_normalize(std::string_view text, UnicodeForm form);
// Rust's char::to_lowercase applied per character (full mapping: U+0130 becomes "i\u0307").
std::string lowercase(std::string_view text);
// Removes characters of General_Category Mark (Mn, Mc, Me).
std::string strip_accents(std::string_view text);
// Rust's char::is_whitespace (the White_Space property).
bool is_unicode_whitespace(char32_t code_point);
std::string strip(std::string_view text, bool left, bool right);

}  // namespace deepinfer::tokenizer
