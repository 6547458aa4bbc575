// EBNF (GBNF dialect) front end. Oracles: PCRE2 for regular grammars, a hand-written bracket
// checker for a recursive one.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <gtest/gtest.h>

#include "core/error.h"
#include "structured/automaton.h"
#include "structured/ebnf.h"
#include "structured/stack_pool.h"

namespace deepinfer::structured {
namespace {

bool accepts(const Automaton& automaton, const std::string& text) {
  StackPool pool(automaton, default_limits(), false);
  int32_t set = pool.step_bytes(pool.initial_set(),
                                {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  return set != kDeadSet && (pool.flags(set) & kCanFinish);
}

bool pcre_full_match(const std::string& pattern, const std::string& text) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                    PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &error, &offset, nullptr);
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  bool ok = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.c_str()), text.size(), 0, 0, data,
                        nullptr) >= 0;
  pcre2_match_data_free(data);
  pcre2_code_free(code);
  return ok;
}

std::vector<std::string> strings_over(const std::string& alphabet, size_t max_length) {
  std::vector<std::string> out = {""};
  size_t begin = 0;
  for (size_t len = 1; len <= max_length; ++len) {
    size_t end = out.size();
    for (size_t i = begin; i < end; ++i) {
      for (char c : alphabet) out.push_back(out[i] + c);
    }
    begin = end;
  }
  return out;
}

TEST(Ebnf, RegularGrammarsAgreeWithPcre2) {
  struct Case {
    const char* ebnf;
    const char* regex;
  };
  for (const Case& c : {
           Case{"root ::= \"a\" b*\nb ::= [bc] | \"-\"", "a([bc]|-)*"},
           Case{"root ::= (x | y){2,3}  # comment\nx ::= 'a'\ny ::= \"b\" \"c\"?", "(a|bc?){2,3}"},
           Case{"root ::= [^a-b]+ \"a\"?", "[^a-b]+a?"},
           Case{"root ::=\n  \"a\"\n  | \"b\" root2\nroot2 ::= \"\\x63\"{1,}", "a|bc+"},
       }) {
    SCOPED_TRACE(c.ebnf);
    Automaton automaton = build_automaton(ebnf_to_grammar(c.ebnf), default_limits());
    for (const auto& s : strings_over("abc-", 5)) {
      ASSERT_EQ(accepts(automaton, s), pcre_full_match(c.regex, s)) << "'" << s << "'";
    }
  }
}

TEST(Ebnf, RecursiveGrammarAgreesWithBracketChecker) {
  Automaton automaton = build_automaton(
      ebnf_to_grammar("root ::= item*\nitem ::= \"(\" root \")\" | \"[\" root \"]\""),
      default_limits());
  auto balanced = [](const std::string& s) {
    std::string stack;
    for (char c : s) {
      if (c == '(' || c == '[') {
        stack.push_back(c);
      } else {
        if (stack.empty() || (c == ')' && stack.back() != '(') || (c == ']' && stack.back() != '['))
          return false;
        stack.pop_back();
      }
    }
    return stack.empty();
  };
  for (const auto& s : strings_over("()[]", 7))
    ASSERT_EQ(accepts(automaton, s), balanced(s)) << "'" << s << "'";
}

TEST(Ebnf, ErrorsNameLineColumnAndReason) {
  auto message = [](const std::string& text) {
    try {
      build_automaton(ebnf_to_grammar(text), default_limits());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(
      message("root ::= \"a\" b").find("line 1, column 14: rule 'b' is used but never defined"),
      std::string::npos)
      << message("root ::= \"a\" b");
  EXPECT_NE(
      message("root ::= \"a\nx ::= \"b\"").find("line 1, column 12: unterminated string literal"),
      std::string::npos)
      << message("root ::= \"a\nx ::= \"b\"");
  EXPECT_NE(message("root ::= (\"a\"").find("expected ')'"), std::string::npos);
  EXPECT_NE(message("root = \"a\"").find("expected '::='"), std::string::npos);
  EXPECT_NE(message("start ::= \"a\"").find("no rule named 'root'"), std::string::npos);
  EXPECT_NE(message("root ::= root \"a\" | \"b\"").find("left recursion"), std::string::npos);
  EXPECT_NE(message("root ::= x \"a\" | \"b\"\nx ::= \"\"? root").find("left recursion"),
            std::string::npos);
  EXPECT_NE(message("root ::= \"a\"{5,2}").find("n < m"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\"{99999999}").find("limit"), std::string::npos);
  EXPECT_NE(message("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
}

TEST(Ebnf, GrammarWithNoFiniteDocumentIsEmpty) {
  Automaton automaton = build_automaton(ebnf_to_grammar("root ::= \"a\" root"), default_limits());
  EXPECT_TRUE(automaton.empty_language);
}

}  // namespace
}  // namespace deepinfer::structured
