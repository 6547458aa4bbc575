// The one grammar form every front end (regex, JSON schema, EBNF) lowers to: rules whose bodies
// are expressions over bytes, with references to other rules. Expressions are immutable and
// shared, so front ends can reuse sub-expressions freely.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::structured {

struct ByteDfa;
struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

enum class ExprKind {
  kEmpty,    // matches the empty string
  kNothing,  // matches no string at all
  kBytes,    // a literal byte string
  kByteSet,  // one byte out of a set
  kSeq,
  kAlt,
  kRepeat,   // children[0] repeated [min, max] times (max == kUnbounded: no limit)
  kRuleRef,  // the language of another rule (recursion allowed, left recursion is an error)
  kDfa,      // an explicit deterministic automaton over bytes (from intersections, complements)
};

inline constexpr uint32_t kUnbounded = UINT32_MAX;

struct Expr {
  ExprKind kind = ExprKind::kEmpty;
  std::string bytes;
  std::bitset<256> byte_set;
  std::vector<ExprPtr> children;
  uint32_t min = 0;
  uint32_t max = 0;
  uint32_t rule = 0;
  std::shared_ptr<const ByteDfa> dfa;
};

// Constructors that simplify as they go (Seq with a Nothing is Nothing, and so on).
ExprPtr empty_expr();
ExprPtr nothing_expr();
ExprPtr bytes_expr(std::string_view bytes);
ExprPtr byte_set_expr(const std::bitset<256>& set);
ExprPtr byte_range_expr(uint8_t lo, uint8_t hi);
ExprPtr seq_expr(std::vector<ExprPtr> children);
ExprPtr alt_expr(std::vector<ExprPtr> children);
ExprPtr repeat_expr(ExprPtr child, uint32_t min, uint32_t max);
ExprPtr optional_expr(ExprPtr child);
ExprPtr star_expr(ExprPtr child);
ExprPtr rule_ref_expr(uint32_t rule);
ExprPtr dfa_expr(std::shared_ptr<const ByteDfa> dfa);

struct Rule {
  std::string name;
  ExprPtr body;
};

struct Grammar {
  std::vector<Rule> rules;
  uint32_t root = 0;

  uint32_t add_rule(std::string name, ExprPtr body = nullptr) {
    rules.push_back(Rule{std::move(name), std::move(body)});
    return static_cast<uint32_t>(rules.size() - 1);
  }
};

// Human-readable dump of a grammar (EBNF-like), for debugging and error messages.
std::string to_string(const Grammar& grammar);

}  // namespace deepinfer::structured
