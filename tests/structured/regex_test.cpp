// Regex front end against PCRE2 as the independent oracle: every string over a small alphabet
// up to a length bound must match (full match and search) exactly when PCRE2 says so.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <gtest/gtest.h>

#include "core/error.h"
#include "structured/automaton.h"
#include "structured/byte_dfa.h"
#include "structured/regex.h"

namespace deepinfer::structured {
namespace {

class Pcre {
 public:
  Pcre(const std::string& pattern, bool anchored) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    uint32_t flags = PCRE2_UTF | PCRE2_ALT_BSUX | PCRE2_DOLLAR_ENDONLY;
    if (anchored) flags |= PCRE2_ANCHORED | PCRE2_ENDANCHORED;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(), flags,
                          &error, &offset, nullptr);
    EXPECT_NE(code_, nullptr) << "PCRE2 rejects " << pattern;
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Pcre() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  bool matches(const std::string& text) const {
    return pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.c_str()), text.size(), 0, 0, data_,
                       nullptr) >= 0;
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

void all_strings(const std::vector<std::string>& alphabet, size_t max_length,
                 std::vector<std::string>& out) {
  out = {""};
  size_t begin = 0;
  for (size_t len = 1; len <= max_length; ++len) {
    size_t end = out.size();
    for (size_t i = begin; i < end; ++i) {
      for (const auto& a : alphabet) out.push_back(out[i] + a);
    }
    begin = end;
  }
}

void expect_same_language(const std::string& pattern, RegexMode mode,
                          const std::vector<std::string>& alphabet, size_t max_length) {
  Pcre oracle(pattern, mode == RegexMode::kFullMatch);
  ByteDfa dfa = dfa_from_expr(*regex_to_expr(pattern, mode, TextEncoding::kUtf8), default_limits());
  std::vector<std::string> strings;
  all_strings(alphabet, max_length, strings);
  for (const auto& s : strings) {
    ASSERT_EQ(dfa.matches(s), oracle.matches(s)) << "pattern " << pattern << " on '" << s << "'";
  }
}

TEST(Regex, FullMatchAgreesWithPcre2) {
  const std::vector<std::string> alphabet = {"a", "b", "0", "-", " ", "\xc3\xa9" /* é */};
  for (const char* pattern : {"a*",
                              "(a|b)+",
                              "a{2,3}b?",
                              "[ab]{0,2}0",
                              "[^a]*",
                              "a|b|",
                              "(?:ab|a)(b|)",
                              "\\d+",
                              "\\w*-\\s?",
                              "[a-c0-9]+",
                              ".{1,3}",
                              "a{2}",
                              "a{2,}",
                              "(a?){3}",
                              "[\\-a]+",
                              "\\u00e9a",
                              "[\\x61-\\x62]{2}",
                              "(?<name>a)b*",
                              "a+?b",
                              "[^\\d\\s]+",
                              "\\p{L}+",
                              "\\P{L}*",
                              "\\p{Ll}a",
                              "x{",
                              "[]a]"}) {
    SCOPED_TRACE(pattern);
    if (std::string(pattern) == "[]a]") {
      // ECMAScript: [] is an empty class; PCRE reads "]" as a literal. Check ours directly.
      ByteDfa dfa = dfa_from_expr(
          *regex_to_expr(pattern, RegexMode::kFullMatch, TextEncoding::kUtf8), default_limits());
      EXPECT_TRUE(dfa.is_empty());
      continue;
    }
    expect_same_language(pattern, RegexMode::kFullMatch, alphabet, 4);
  }
}

TEST(Regex, SearchModeAgreesWithPcre2) {
  const std::vector<std::string> alphabet = {"a", "b", "c", "1"};
  for (const char* pattern :
       {"ab", "^a", "b$", "^ab$", "^(a|b)$", "^a|b$", "a{2}", "^[0-9]*$", "^\\d+$|^c"}) {
    SCOPED_TRACE(pattern);
    expect_same_language(pattern, RegexMode::kSearch, alphabet, 5);
  }
}

TEST(Regex, JsonStringEncodingEscapesQuoteBackslashAndControls) {
  ByteDfa dfa = dfa_from_expr(
      *regex_to_expr("^[\"\\\\\\n\\x01a]+$", RegexMode::kSearch, TextEncoding::kJsonString),
      default_limits());
  EXPECT_TRUE(dfa.matches("\\\"a\\\\\\n\\u0001"));
  EXPECT_FALSE(dfa.matches("\""));
  EXPECT_FALSE(dfa.matches("\n"));
  EXPECT_FALSE(dfa.matches("\\u000a"));  // canonical form is \n
}

TEST(Regex, ErrorsNamePositionAndReason) {
  auto message = [](const std::string& pattern) {
    try {
      regex_to_expr(pattern, RegexMode::kFullMatch, TextEncoding::kUtf8);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("ab(c").find("position 4: missing ')'"), std::string::npos) << message("ab(c");
  EXPECT_NE(message("a)").find("position 1: unmatched ')'"), std::string::npos) << message("a)");
  EXPECT_NE(message("(?=a)").find("lookaround"), std::string::npos);
  EXPECT_NE(message("(a)\\1").find("backreferences"), std::string::npos);
  EXPECT_NE(message("a{3,2}").find("n < m"), std::string::npos);
  EXPECT_NE(message("[b-a]").find("out of order"), std::string::npos);
  EXPECT_NE(message("a{100000}").find("limit"), std::string::npos);
  EXPECT_NE(message("*").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(message("a\\").find("backslash"), std::string::npos);
}

TEST(Regex, PathologicalPatternStaysBounded) {
  // (a|b)*a(a|b){12} has a 2^13-state DFA; the grammar keeps such rules as NFAs.
  Grammar g;
  g.root = g.add_rule(
      "root", regex_to_expr("(a|b)*a(a|b){12}", RegexMode::kFullMatch, TextEncoding::kUtf8));
  Automaton automaton = build_automaton(g, default_limits());
  EXPECT_LT(automaton.nodes.size(), 100u);
  // Nested unbounded repetition of a nullable group must not hang.
  EXPECT_NO_THROW(dfa_from_expr(
      *regex_to_expr("((a*)*)*b", RegexMode::kFullMatch, TextEncoding::kUtf8), default_limits()));
}

}  // namespace
}  // namespace deepinfer::structured
