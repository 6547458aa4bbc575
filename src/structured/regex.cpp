#include "structured/regex.h"

#include <utf8proc.h>

#include <array>
#include <cctype>
#include <map>
#include <mutex>
#include <string>

#include "core/error.h"

namespace deepinfer::structured {
namespace {

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  enum class Kind { kEmpty, kSet, kSeq, kAlt, kRepeat, kStart, kEnd } kind = Kind::kEmpty;
  CodePointSet set;
  std::vector<NodePtr> children;
  uint32_t min = 0;
  uint32_t max = 0;
};

NodePtr make_node(Node::Kind kind) {
  auto node = std::make_unique<Node>();
  node->kind = kind;
  return node;
}

NodePtr set_node(CodePointSet set) {
  auto node = make_node(Node::Kind::kSet);
  node->set = std::move(set);
  return node;
}

CodePointSet digit_set() {
  return CodePointSet::range('0', '9');
}

CodePointSet word_set() {
  CodePointSet set = CodePointSet::range('0', '9');
  set.add('A', 'Z');
  set.add('a', 'z');
  set.add('_', '_');
  return set;
}

CodePointSet space_set() {
  CodePointSet set;
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u,
                      0x202Fu, 0x205Fu, 0x3000u, 0xFEFFu}) {
    set.add(cp, cp);
  }
  set.add(0x2000, 0x200A);
  return set;
}

CodePointSet dot_set() {
  CodePointSet line_terminators;
  for (uint32_t cp : {0x0Au, 0x0Du, 0x2028u, 0x2029u}) line_terminators.add(cp, cp);
  return line_terminators.complement();
}

// General categories as utf8proc names them, computed once over all code points.
const std::map<std::string, CodePointSet>& category_sets() {
  static const std::map<std::string, CodePointSet> kSets = [] {
    static const char* kNames[] = {"Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd",
                                   "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm",
                                   "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"};
    std::map<std::string, std::vector<std::pair<uint32_t, uint32_t>>> ranges;
    int current = -1;
    uint32_t start = 0;
    auto flush = [&](uint32_t end) {
      if (current >= 0) ranges[kNames[current]].emplace_back(start, end);
    };
    for (uint32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
      int category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
      if (category != current) {
        flush(cp - 1);
        current = category;
        start = cp;
      }
    }
    flush(kMaxCodePoint);
    std::map<std::string, CodePointSet> sets;
    for (auto& [name, list] : ranges) {
      CodePointSet set;
      for (auto [lo, hi] : list) set.add(lo, hi);
      sets[name].add(set);
      sets[name.substr(0, 1)].add(set);
    }
    return sets;
  }();
  return kSets;
}

class Parser {
 public:
  Parser(std::string_view pattern, const GrammarLimits& limits) : text_(pattern), limits_(limits) {}

  NodePtr parse() {
    NodePtr node = parse_alternation(0);
    if (pos_ < text_.size()) fail(text_[pos_] == ')' ? "unmatched ')'" : "unexpected character");
    return node;
  }

 private:
  [[noreturn]] void fail(const std::string& reason) const {
    DI_THROW("regex '", text_, "' at position ", pos_, ": ", reason);
  }
  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }

  NodePtr parse_alternation(uint32_t depth) {
    if (depth > limits_.max_nesting) fail("groups nested too deeply");
    std::vector<NodePtr> branches;
    branches.push_back(parse_sequence(depth));
    while (!at_end() && peek() == '|') {
      ++pos_;
      branches.push_back(parse_sequence(depth));
    }
    if (branches.size() == 1) return std::move(branches[0]);
    auto node = make_node(Node::Kind::kAlt);
    node->children = std::move(branches);
    return node;
  }

  NodePtr parse_sequence(uint32_t depth) {
    auto node = make_node(Node::Kind::kSeq);
    while (!at_end() && peek() != '|' && peek() != ')') {
      NodePtr atom = parse_atom(depth);
      atom = parse_quantifiers(std::move(atom));
      node->children.push_back(std::move(atom));
    }
    return node;
  }

  bool parse_number(uint32_t& value) {
    size_t start = pos_;
    uint64_t v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<uint64_t>(peek() - '0');
      if (v > 0xFFFFFFFFull) v = 0xFFFFFFFFull;
      ++pos_;
    }
    value = static_cast<uint32_t>(v);
    return pos_ > start;
  }

  NodePtr parse_quantifiers(NodePtr atom) {
    while (!at_end()) {
      char c = peek();
      uint32_t min = 0, max = 0;
      size_t quantifier_start = pos_;
      if (c == '*') {
        min = 0;
        max = kUnbounded;
        ++pos_;
      } else if (c == '+') {
        min = 1;
        max = kUnbounded;
        ++pos_;
      } else if (c == '?') {
        min = 0;
        max = 1;
        ++pos_;
      } else if (c == '{') {
        ++pos_;
        if (!parse_number(min)) {
          pos_ = quantifier_start;  // a literal '{' (ECMAScript Annex B)
          return atom;
        }
        max = min;
        if (!at_end() && peek() == ',') {
          ++pos_;
          if (!parse_number(max)) max = kUnbounded;
        }
        if (at_end() || peek() != '}') {
          pos_ = quantifier_start;
          return atom;
        }
        ++pos_;
        if (max != kUnbounded && max < min) {
          pos_ = quantifier_start;
          fail("quantifier {m,n} has n < m");
        }
        if (min > limits_.max_repeat || (max != kUnbounded && max > limits_.max_repeat)) {
          pos_ = quantifier_start;
          fail("repetition count exceeds the limit of " + std::to_string(limits_.max_repeat));
        }
      } else {
        return atom;
      }
      if (atom->kind == Node::Kind::kStart || atom->kind == Node::Kind::kEnd) {
        pos_ = quantifier_start;
        fail("nothing to repeat");
      }
      if (!at_end() && peek() == '?') ++pos_;  // lazy: same language
      auto node = make_node(Node::Kind::kRepeat);
      node->children.push_back(std::move(atom));
      node->min = min;
      node->max = max;
      atom = std::move(node);
    }
    return atom;
  }

  uint32_t parse_literal_code_point() {
    uint32_t cp;
    std::string buffer(text_.substr(pos_, std::min<size_t>(4, text_.size() - pos_)));
    size_t local = 0;
    if (!decode_utf8(buffer, local, cp)) fail("invalid UTF-8 in pattern");
    pos_ += local;
    return cp;
  }

  uint32_t parse_hex(size_t digits) {
    uint32_t value = 0;
    for (size_t i = 0; i < digits; ++i) {
      if (at_end() || !std::isxdigit(static_cast<unsigned char>(peek())))
        fail("expected a hex digit");
      char c = peek();
      value = value * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c))
                                                     ? c - '0'
                                                     : (std::tolower(c) - 'a' + 10));
      ++pos_;
    }
    return value;
  }

  // After a backslash. Returns a set (for class escapes) or a single code point.
  CodePointSet parse_escape(bool in_class) {
    if (at_end()) fail("pattern ends with a backslash");
    char c = peek();
    ++pos_;
    switch (c) {
      case 'd':
        return digit_set();
      case 'D':
        return digit_set().complement();
      case 'w':
        return word_set();
      case 'W':
        return word_set().complement();
      case 's':
        return space_set();
      case 'S':
        return space_set().complement();
      case 'n':
        return CodePointSet::single('\n');
      case 'r':
        return CodePointSet::single('\r');
      case 't':
        return CodePointSet::single('\t');
      case 'f':
        return CodePointSet::single('\f');
      case 'v':
        return CodePointSet::single('\v');
      case '0':
        return CodePointSet::single(0);
      case 'b':
        if (in_class) return CodePointSet::single('\b');
        --pos_;
        fail("word boundary \\b is not supported");
      case 'B':
        --pos_;
        fail("\\B is not supported");
      case 'x':
        return CodePointSet::single(parse_hex(2));
      case 'u': {
        if (!at_end() && peek() == '{') {
          ++pos_;
          uint32_t value = 0;
          size_t digits = 0;
          while (!at_end() && peek() != '}') {
            value = value * 16 + parse_hex(1);
            if (++digits > 6 || value > kMaxCodePoint) fail("code point out of range");
          }
          if (at_end() || digits == 0) fail("unterminated \\u{...}");
          ++pos_;
          return CodePointSet::single(value);
        }
        uint32_t unit = parse_hex(4);
        // A surrogate pair written as two \u escapes is one code point.
        if (unit >= 0xD800 && unit <= 0xDBFF && text_.substr(pos_, 2) == "\\u") {
          size_t save = pos_;
          pos_ += 2;
          uint32_t low = parse_hex(4);
          if (low >= 0xDC00 && low <= 0xDFFF)
            return CodePointSet::single(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00));
          pos_ = save;
        }
        if (unit >= 0xD800 && unit <= 0xDFFF) fail("lone surrogate escape cannot match UTF-8 text");
        return CodePointSet::single(unit);
      }
      case 'c': {
        if (at_end() || !std::isalpha(static_cast<unsigned char>(peek())))
          fail("\\c needs a letter");
        uint32_t cp = static_cast<uint32_t>(peek()) % 32;
        ++pos_;
        return CodePointSet::single(cp);
      }
      case 'p':
      case 'P': {
        if (at_end() || peek() != '{') fail("\\p needs {Category}");
        size_t close = text_.find('}', pos_);
        if (close == std::string_view::npos) fail("unterminated \\p{...}");
        std::string name(text_.substr(pos_ + 1, close - pos_ - 1));
        if (name.rfind("General_Category=", 0) == 0) name = name.substr(17);
        if (name.rfind("gc=", 0) == 0) name = name.substr(3);
        const auto& sets = category_sets();
        auto it = sets.find(name);
        if (it == sets.end())
          fail("unsupported Unicode property '" + name + "' (general categories only)");
        pos_ = close + 1;
        return c == 'p' ? it->second : it->second.complement();
      }
      default:
        if (c >= '1' && c <= '9') {
          --pos_;
          fail("backreferences are not supported");
        }
        if (std::isalnum(static_cast<unsigned char>(c))) {
          --pos_;
          fail(std::string("unknown escape \\") + c);
        }
        --pos_;
        return CodePointSet::single(parse_literal_code_point());
    }
  }

  NodePtr parse_class() {
    // After '['.
    bool negated = false;
    if (!at_end() && peek() == '^') {
      negated = true;
      ++pos_;
    }
    CodePointSet set;
    bool first = true;
    while (true) {
      if (at_end()) fail("unterminated character class");
      if (peek() == ']' && !(first && false)) {
        ++pos_;
        break;
      }
      first = false;
      CodePointSet lo_set = parse_class_atom();
      if (!at_end() && peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        size_t dash = pos_;
        ++pos_;
        CodePointSet hi_set = parse_class_atom();
        if (lo_set.ranges().size() != 1 || lo_set.ranges()[0].first != lo_set.ranges()[0].second ||
            hi_set.ranges().size() != 1 || hi_set.ranges()[0].first != hi_set.ranges()[0].second) {
          pos_ = dash;
          fail("class escape used as a range bound");
        }
        uint32_t lo = lo_set.ranges()[0].first, hi = hi_set.ranges()[0].first;
        if (lo > hi) {
          pos_ = dash;
          fail("range out of order in character class");
        }
        set.add(lo, hi);
      } else {
        set.add(lo_set);
      }
    }
    if (negated) set = set.complement();
    return set_node(std::move(set));
  }

  CodePointSet parse_class_atom() {
    if (peek() == '\\') {
      ++pos_;
      return parse_escape(true);
    }
    return CodePointSet::single(parse_literal_code_point());
  }

  NodePtr parse_atom(uint32_t depth) {
    char c = peek();
    switch (c) {
      case '(': {
        ++pos_;
        if (!at_end() && peek() == '?') {
          ++pos_;
          if (!at_end() && peek() == ':') {
            ++pos_;
          } else if (!at_end() && peek() == '<' && pos_ + 1 < text_.size() &&
                     text_[pos_ + 1] != '=' && text_[pos_ + 1] != '!') {
            size_t close = text_.find('>', pos_);
            if (close == std::string_view::npos) fail("unterminated group name");
            pos_ = close + 1;
          } else {
            pos_ -= 2;
            fail("lookaround and other (?...) groups are not supported");
          }
        }
        NodePtr inner = parse_alternation(depth + 1);
        if (at_end() || peek() != ')') fail("missing ')'");
        ++pos_;
        return inner;
      }
      case '[':
        ++pos_;
        return parse_class();
      case '.':
        ++pos_;
        return set_node(dot_set());
      case '^':
        ++pos_;
        return make_node(Node::Kind::kStart);
      case '$':
        ++pos_;
        return make_node(Node::Kind::kEnd);
      case '\\': {
        ++pos_;
        return set_node(parse_escape(false));
      }
      case '*':
      case '+':
      case '?':
        fail("nothing to repeat");
      default:
        return set_node(CodePointSet::single(parse_literal_code_point()));
    }
  }

  std::string_view text_;
  const GrammarLimits& limits_;
  size_t pos_ = 0;
};

class Lowering {
 public:
  Lowering(std::string_view pattern, TextEncoding encoding)
      : pattern_(pattern), encoding_(encoding) {}

  ExprPtr lower(const Node& node) {
    switch (node.kind) {
      case Node::Kind::kEmpty:
        return empty_expr();
      case Node::Kind::kSet:
        return code_point_set_expr(node.set, encoding_);
      case Node::Kind::kSeq: {
        std::vector<ExprPtr> parts;
        for (const auto& child : node.children) parts.push_back(lower(*child));
        return seq_expr(std::move(parts));
      }
      case Node::Kind::kAlt: {
        std::vector<ExprPtr> parts;
        for (const auto& child : node.children) parts.push_back(lower(*child));
        return alt_expr(std::move(parts));
      }
      case Node::Kind::kRepeat:
        return repeat_expr(lower(*node.children[0]), node.min, node.max);
      case Node::Kind::kStart:
      case Node::Kind::kEnd:
        DI_THROW("regex '", pattern_,
                 "': anchors ^ and $ are only supported at the start and end of "
                 "the pattern or of a top-level alternative");
    }
    return nothing_expr();
  }

 private:
  std::string_view pattern_;
  TextEncoding encoding_;
};

// Flattens a single-child sequence/group chain so ^(a|b)$ exposes its alternation.
const Node* unwrap(const Node* node) {
  while (node->kind == Node::Kind::kSeq && node->children.size() == 1)
    node = node->children[0].get();
  return node;
}

}  // namespace

ExprPtr regex_to_expr(std::string_view pattern, RegexMode mode, TextEncoding encoding,
                      const GrammarLimits& limits) {
  Parser parser(pattern, limits);
  NodePtr root = parser.parse();
  Lowering lowering(pattern, encoding);
  ExprPtr any_text = star_expr(code_point_set_expr(CodePointSet::all(), encoding));

  std::vector<const Node*> branches;
  const Node* top = unwrap(root.get());
  if (top->kind == Node::Kind::kAlt) {
    for (const auto& child : top->children) branches.push_back(child.get());
  } else {
    branches.push_back(root.get());
  }
  std::vector<ExprPtr> alternatives;
  for (const Node* branch : branches) {
    std::vector<const Node*> items;
    const Node* b = unwrap(branch);
    if (b->kind == Node::Kind::kSeq) {
      for (const auto& child : b->children) items.push_back(child.get());
    } else {
      items.push_back(b);
    }
    bool anchored_start = false, anchored_end = false;
    while (!items.empty() && items.front()->kind == Node::Kind::kStart) {
      anchored_start = true;
      items.erase(items.begin());
    }
    while (!items.empty() && items.back()->kind == Node::Kind::kEnd) {
      anchored_end = true;
      items.pop_back();
    }
    // ^(a|b)$ : anchors around one group apply to each of its alternatives.
    std::vector<ExprPtr> parts;
    if (mode == RegexMode::kSearch && !anchored_start) parts.push_back(any_text);
    for (const Node* item : items) parts.push_back(lowering.lower(*item));
    if (mode == RegexMode::kSearch && !anchored_end) parts.push_back(any_text);
    alternatives.push_back(seq_expr(std::move(parts)));
  }
  return alt_expr(std::move(alternatives));
}

}  // namespace deepinfer::structured
