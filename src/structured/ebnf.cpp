#include "structured/ebnf.h"

#include <cctype>
#include <map>
#include <string>

#include "core/error.h"
#include "structured/utf8_ranges.h"

namespace deepinfer::structured {
namespace {

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
}

class EbnfParser {
 public:
  EbnfParser(std::string_view text, const GrammarLimits& limits) : text_(text), limits_(limits) {}

  Grammar parse(std::string_view root_name) {
    skip_space();
    while (!at_end()) {
      size_t name_pos = pos_;
      std::string name = parse_name();
      skip_space();
      if (text_.substr(pos_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      uint32_t id = rule_id(name, name_pos);
      if (defined_.count(name)) {
        pos_ = name_pos;
        fail("rule '" + name + "' is defined twice");
      }
      defined_[name] = name_pos;
      grammar_.rules[id].body = parse_alternation(0);
      skip_space();
    }
    for (const auto& [name, id] : ids_) {
      if (!defined_.count(name)) {
        pos_ = first_use_[name];
        fail("rule '" + name + "' is used but never defined");
      }
    }
    auto root = ids_.find(std::string(root_name));
    if (root == ids_.end())
      DI_THROW("EBNF grammar has no rule named '", root_name, "' to start from");
    grammar_.root = root->second;
    return std::move(grammar_);
  }

 private:
  [[noreturn]] void fail(const std::string& reason) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    DI_THROW("EBNF line ", line, ", column ", column, ": ", reason);
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }

  void skip_space() {
    while (!at_end()) {
      if (std::isspace(static_cast<unsigned char>(peek()))) {
        ++pos_;
      } else if (peek() == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    if (pos_ == start) fail("expected a rule name");
    return std::string(text_.substr(start, pos_ - start));
  }

  uint32_t rule_id(const std::string& name, size_t pos) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    if (grammar_.rules.size() >= limits_.max_rules) fail("too many rules");
    uint32_t id = grammar_.add_rule(name);
    ids_[name] = id;
    first_use_[name] = pos;
    return id;
  }

  // True if the upcoming text is "name ::=", i.e. the current rule body has ended.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < text_.size() && is_name_char(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && std::isspace(static_cast<unsigned char>(text_[p]))) ++p;
    return text_.substr(p, 3) == "::=";
  }

  ExprPtr parse_alternation(uint32_t depth) {
    if (depth > limits_.max_nesting) fail("expression nested too deeply");
    std::vector<ExprPtr> alternatives = {parse_sequence(depth)};
    while (!at_end() && peek() == '|') {
      ++pos_;
      alternatives.push_back(parse_sequence(depth));
    }
    return alt_expr(std::move(alternatives));
  }

  ExprPtr parse_sequence(uint32_t depth) {
    std::vector<ExprPtr> items;
    while (true) {
      skip_space();
      if (at_end() || peek() == '|' || peek() == ')' || at_rule_start()) break;
      ExprPtr item = parse_primary(depth);
      item = parse_postfix(std::move(item));
      items.push_back(std::move(item));
    }
    return seq_expr(std::move(items));
  }

  uint32_t parse_count() {
    size_t start = pos_;
    uint64_t v = 0;
    while (!at_end() && std::isdigit(static_cast<unsigned char>(peek()))) {
      v = std::min<uint64_t>(v * 10 + static_cast<uint64_t>(peek() - '0'), UINT32_MAX - 1);
      ++pos_;
    }
    if (pos_ == start) fail("expected a number in {m,n}");
    if (v > limits_.max_repeat) {
      pos_ = start;
      fail("repetition count exceeds the limit of " + std::to_string(limits_.max_repeat));
    }
    return static_cast<uint32_t>(v);
  }

  ExprPtr parse_postfix(ExprPtr item) {
    while (!at_end()) {
      char c = peek();
      if (c == '*') {
        ++pos_;
        item = star_expr(item);
      } else if (c == '+') {
        ++pos_;
        item = repeat_expr(item, 1, kUnbounded);
      } else if (c == '?') {
        ++pos_;
        item = optional_expr(item);
      } else if (c == '{') {
        ++pos_;
        skip_space();
        uint32_t min = parse_count();
        uint32_t max = min;
        skip_space();
        if (!at_end() && peek() == ',') {
          ++pos_;
          skip_space();
          max = (!at_end() && peek() == '}') ? kUnbounded : parse_count();
          skip_space();
        }
        if (at_end() || peek() != '}') fail("expected '}' to close {m,n}");
        ++pos_;
        if (max != kUnbounded && max < min) fail("{m,n} with n < m");
        item = repeat_expr(item, min, max);
      } else {
        break;
      }
    }
    return item;
  }

  uint32_t parse_hex(size_t digits) {
    uint32_t value = 0;
    for (size_t i = 0; i < digits; ++i) {
      if (at_end() || !std::isxdigit(static_cast<unsigned char>(peek())))
        fail("expected a hex digit");
      char c = static_cast<char>(std::tolower(peek()));
      value = value * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c))
                                                     ? c - '0'
                                                     : c - 'a' + 10);
      ++pos_;
    }
    return value;
  }

  uint32_t parse_char() {
    if (at_end()) fail("unexpected end of grammar");
    if (peek() == '\\') {
      ++pos_;
      if (at_end()) fail("unfinished escape");
      char c = peek();
      ++pos_;
      switch (c) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case 'f':
          return '\f';
        case 'v':
          return '\v';
        case '0':
          return 0;
        case 'x':
          return parse_hex(2);
        case 'u':
          return parse_hex(4);
        case 'U':
          return parse_hex(8);
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return static_cast<uint32_t>(c);
        default:
          --pos_;
          fail(std::string("unknown escape \\") + c);
      }
    }
    std::string buffer(text_.substr(pos_, std::min<size_t>(4, text_.size() - pos_)));
    size_t local = 0;
    uint32_t cp;
    if (!decode_utf8(buffer, local, cp)) fail("invalid UTF-8");
    pos_ += local;
    return cp;
  }

  ExprPtr parse_primary(uint32_t depth) {
    char c = peek();
    if (c == '"' || c == '\'') {
      char quote = c;
      ++pos_;
      std::string bytes;
      while (true) {
        if (at_end() || peek() == '\n') fail("unterminated string literal");
        if (peek() == quote) {
          ++pos_;
          break;
        }
        uint32_t cp = parse_char();
        if (cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF))
          fail("invalid code point in literal");
        bytes += encode_code_point(cp, TextEncoding::kUtf8);
      }
      return bytes_expr(bytes);
    }
    if (c == '[') {
      ++pos_;
      bool negated = false;
      if (!at_end() && peek() == '^') {
        negated = true;
        ++pos_;
      }
      CodePointSet set;
      while (true) {
        if (at_end()) fail("unterminated character class");
        if (peek() == ']') {
          ++pos_;
          break;
        }
        uint32_t lo = parse_char();
        uint32_t hi = lo;
        if (!at_end() && peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
          ++pos_;
          hi = parse_char();
          if (hi < lo) fail("character range out of order");
        }
        set.add(lo, hi);
      }
      if (negated) set = set.complement();
      return code_point_set_expr(set, TextEncoding::kUtf8);
    }
    if (c == '(') {
      ++pos_;
      ExprPtr inner = parse_alternation(depth + 1);
      skip_space();
      if (at_end() || peek() != ')') fail("expected ')'");
      ++pos_;
      return inner;
    }
    if (c == '.') {
      ++pos_;
      return code_point_set_expr(CodePointSet::all(), TextEncoding::kUtf8);
    }
    if (is_name_char(c)) {
      size_t start = pos_;
      std::string name = parse_name();
      return rule_ref_expr(rule_id(name, start));
    }
    fail(std::string("unexpected character '") + c + "'");
  }

  std::string_view text_;
  const GrammarLimits& limits_;
  size_t pos_ = 0;
  Grammar grammar_;
  std::map<std::string, uint32_t> ids_;
  std::map<std::string, size_t> defined_;
  std::map<std::string, size_t> first_use_;
};

}  // namespace

Grammar ebnf_to_grammar(std::string_view text, const GrammarLimits& limits,
                        std::string_view root_rule) {
  EbnfParser parser(text, limits);
  return parser.parse(root_rule);
}

}  // namespace deepinfer::structured
