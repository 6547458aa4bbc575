// A compiled PCRE2 regex (UTF + Unicode properties, JIT when available) with the
// find-all-matches iteration HF tokenizers gets from Oniguruma. Immutable and shareable
// across threads; per-thread match scratch lives inside regex.cpp.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::tokenizer {

struct Span {
  std::size_t begin = 0;
  std::size_t end = 0;
};

// Rewrites \\p{X} / \\P{X} (one- or two-letter General_Category) and \\s / \\S into explicit
// Unicode 16.0 ranges so PCRE2 agrees with Oniguruma; other syntax passes through unchanged.
std::string translate_oniguruma_classes(std::string_view pattern);

class Regex {
 public:
  // `origin` names where the pattern came from (e.g. "pre_tokenizer[2].pattern") for errors.
  Regex(std::string_view pattern, std::string_view origin);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends every non-overlapping match in `subject` (valid UTF-8), left to right, with the
  // subject boundaries as the only context (lookarounds see nothing outside it). An empty
  // match right after the previous match is skipped, as Oniguruma's find iterator does.
  void find_all(std::string_view subject, std::vector<Span>& matches) const;

  // Whether the regex matches anywhere in `subject`.
  bool search(std::string_view subject) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::string origin_;
  void* code_ = nullptr;  // pcre2_code_8*, kept opaque so the PCRE2 header stays here
  bool jit_ = false;
};

}  // namespace deepinfer::tokenizer
