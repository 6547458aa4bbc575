#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {

std::string unicode_normalize(std::string_view text, UnicodeForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case UnicodeForm::kNFC:
      options |= UTF8PROC_COMPOSE;
      break;
    case UnicodeForm::kNFD:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case UnicodeForm::kNFKC:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case UnicodeForm::kNFKD:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t length = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
      static_cast<utf8proc_ssize_t>(text.size()), &result, static_cast<utf8proc_option_t>(options));
  if (length < 0) {
    DI_THROW("unicode normalization failed: ", utf8proc_errmsg(length));
  }
  std::string out(reinterpret_cast<const char*>(result), static_cast<std::size_t>(length));
  std::free(result);
  return out;
}

std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t pos = 0;
  while (pos < text.size()) {
    const char32_t cp = decode_utf8(text, pos);
    if (cp == 0x130) {  // the one unconditional multi-character lowercase mapping
      out += "i\xCC\x87";
      continue;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

std::string strip_accents(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t start = pos;
    const char32_t cp = decode_utf8(text, pos);
    const utf8proc_category_t category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    if (category == UTF8PROC_CATEGORY_MN || category == UTF8PROC_CATEGORY_MC ||
        category == UTF8PROC_CATEGORY_ME) {
      continue;
    }
    out.append(text.substr(start, pos - start));
  }
  return out;
}

bool is_unicode_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string strip(std::string_view text, bool left, bool right) {
  std::size_t begin = 0;
  std::size_t end = text.size();
  if (left) {
    while (begin < end) {
      std::size_t pos = begin;
      if (!is_unicode_whitespace(decode_utf8(text, pos))) break;
      begin = pos;
    }
  }
  if (right) {
    while (end > begin) {
      std::size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      std::size_t pos = start;
      if (!is_unicode_whitespace(decode_utf8(text, pos))) break;
      end = start;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

namespace {

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string apply(std::string_view text) const override {
    std::string current(text);
    for (const auto& step : steps_) current = step->apply(current);
    return current;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(UnicodeForm form) : form_(form) {}
  std::string apply(std::string_view text) const override { return unicode_normalize(text, form_); }

 private:
  UnicodeForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string apply(std::string_view text) const override { return lowercase(text); }
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  std::string apply(std::string_view text) const override { return strip_accents(text); }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string apply(std::string_view text) const override { return strip(text, left_, right_); }

 private:
  bool left_;
  bool right_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string apply(std::string_view text) const override {
    if (text.empty()) return {};
    return prefix_ + std::string(text);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string literal, std::unique_ptr<Regex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
  std::string apply(std::string_view text) const override {
    std::string out;
    out.reserve(text.size());
    std::size_t previous = 0;
    if (regex_) {
      std::vector<Span> matches;
      regex_->find_all(text, matches);
      for (const Span& match : matches) {
        out.append(text.substr(previous, match.begin - previous));
        out += content_;
        previous = match.end;
      }
    } else if (!literal_.empty()) {
      for (std::size_t found = text.find(literal_); found != std::string_view::npos;
           found = text.find(literal_, previous)) {
        out.append(text.substr(previous, found - previous));
        out += content_;
        previous = found + literal_.size();
      }
    }
    out.append(text.substr(previous));
    return out;
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& spec, const std::string& origin) {
  if (spec.is_null()) return nullptr;
  if (!spec.is_object() || !spec.contains("type")) {
    DI_THROW("tokenizer.json: ", origin, " must be an object with a \"type\"");
  }
  const std::string type = spec["type"].get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    const auto& list = spec.at("normalizers");
    for (std::size_t i = 0; i < list.size(); ++i) {
      auto step = make_normalizer(list[i], concat(origin, ".normalizers[", i, "]"));
      if (step) steps.push_back(std::move(step));
    }
    if (steps.empty()) return nullptr;
    if (steps.size() == 1) return std::move(steps.front());
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(UnicodeForm::kNFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(spec.value("strip_left", true),
                                             spec.value("strip_right", true));
  }
  if (type == "Prepend")
    return std::make_unique<PrependNormalizer>(spec.at("prepend").get<std::string>());
  if (type == "Replace") {
    const auto& pattern = spec.at("pattern");
    std::string content = spec.at("content").get<std::string>();
    if (pattern.contains("Regex")) {
      return std::make_unique<ReplaceNormalizer>(
          "", std::make_unique<Regex>(pattern["Regex"].get<std::string>(), origin + ".pattern"),
          std::move(content));
    }
    if (pattern.contains("String")) {
      return std::make_unique<ReplaceNormalizer>(pattern["String"].get<std::string>(), nullptr,
                                                 std::move(content));
    }
    DI_THROW("tokenizer.json: ", origin, ".pattern must hold \"String\" or \"Regex\"");
  }
  DI_THROW("tokenizer.json: ", origin, ": normalizer type \"", type,
           "\" is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
           "StripAccents, Replace, Prepend)");
}

}  // namespace deepinfer::tokenizer
