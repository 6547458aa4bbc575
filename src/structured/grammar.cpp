#include "structured/grammar.h"

#include <sstream>

#include "structured/byte_dfa.h"

namespace deepinfer::structured {
namespace {

ExprPtr make(ExprKind kind) {
  auto expr = std::make_shared<Expr>();
  expr->kind = kind;
  return expr;
}

}  // namespace

ExprPtr empty_expr() {
  static const ExprPtr kEmpty = make(ExprKind::kEmpty);
  return kEmpty;
}

ExprPtr nothing_expr() {
  static const ExprPtr kNothing = make(ExprKind::kNothing);
  return kNothing;
}

ExprPtr bytes_expr(std::string_view bytes) {
  if (bytes.empty()) return empty_expr();
  auto expr = std::make_shared<Expr>();
  expr->kind = ExprKind::kBytes;
  expr->bytes = std::string(bytes);
  return expr;
}

ExprPtr byte_set_expr(const std::bitset<256>& set) {
  if (set.none()) return nothing_expr();
  auto expr = std::make_shared<Expr>();
  expr->kind = ExprKind::kByteSet;
  expr->byte_set = set;
  return expr;
}

ExprPtr byte_range_expr(uint8_t lo, uint8_t hi) {
  std::bitset<256> set;
  for (int b = lo; b <= hi; ++b) set.set(static_cast<size_t>(b));
  return byte_set_expr(set);
}

ExprPtr seq_expr(std::vector<ExprPtr> children) {
  std::vector<ExprPtr> kept;
  kept.reserve(children.size());
  for (auto& child : children) {
    if (child->kind == ExprKind::kNothing) return nothing_expr();
    if (child->kind == ExprKind::kEmpty) continue;
    if (child->kind == ExprKind::kSeq) {
      kept.insert(kept.end(), child->children.begin(), child->children.end());
    } else {
      kept.push_back(std::move(child));
    }
  }
  if (kept.empty()) return empty_expr();
  if (kept.size() == 1) return kept.front();
  auto expr = std::make_shared<Expr>();
  expr->kind = ExprKind::kSeq;
  expr->children = std::move(kept);
  return expr;
}

ExprPtr alt_expr(std::vector<ExprPtr> children) {
  std::vector<ExprPtr> kept;
  kept.reserve(children.size());
  for (auto& child : children) {
    if (child->kind == ExprKind::kNothing) continue;
    if (child->kind == ExprKind::kAlt) {
      kept.insert(kept.end(), child->children.begin(), child->children.end());
    } else {
      kept.push_back(std::move(child));
    }
  }
  if (kept.empty()) return nothing_expr();
  if (kept.size() == 1) return kept.front();
  auto expr = std::make_shared<Expr>();
  expr->kind = ExprKind::kAlt;
  expr->children = std::move(kept);
  return expr;
}

ExprPtr repeat_expr(ExprPtr child, uint32_t min, uint32_t max) {
  if (max != kUnbounded && max < min) return nothing_expr();
  if (max == 0) return empty_expr();
  if (min == 1 && max == 1) return child;
  if (child->kind == ExprKind::kEmpty) return empty_expr();
  if (child->kind == ExprKind::kNothing) return min == 0 ? empty_expr() : nothing_expr();
  auto expr = std::make_shared<Expr>();
  expr->kind = ExprKind::kRepeat;
  expr->children = {std::move(child)};
  expr->min = min;
  expr->max = max;
  return expr;
}

ExprPtr optional_expr(ExprPtr child) {
  return repeat_expr(std::move(child), 0, 1);
}
ExprPtr star_expr(ExprPtr child) {
  return repeat_expr(std::move(child), 0, kUnbounded);
}

ExprPtr rule_ref_expr(uint32_t rule) {
  auto expr = std::make_shared<Expr>();
  expr->kind = ExprKind::kRuleRef;
  expr->rule = rule;
  return expr;
}

ExprPtr dfa_expr(std::shared_ptr<const ByteDfa> dfa) {
  auto expr = std::make_shared<Expr>();
  expr->kind = ExprKind::kDfa;
  expr->dfa = std::move(dfa);
  return expr;
}

namespace {

void print_byte(std::ostream& out, int b) {
  if (b >= 0x20 && b < 0x7f && b != '\\' && b != ']' && b != '"' && b != '-' && b != '^') {
    out << static_cast<char>(b);
  } else {
    static const char* kHex = "0123456789abcdef";
    out << "\\x" << kHex[b >> 4] << kHex[b & 15];
  }
}

void print_expr(std::ostream& out, const Grammar& grammar, const Expr& expr) {
  switch (expr.kind) {
    case ExprKind::kEmpty:
      out << "\"\"";
      break;
    case ExprKind::kNothing:
      out << "[]";
      break;
    case ExprKind::kBytes:
      out << '"';
      for (unsigned char c : expr.bytes) print_byte(out, c);
      out << '"';
      break;
    case ExprKind::kByteSet: {
      out << '[';
      for (int b = 0; b < 256; ++b) {
        if (!expr.byte_set.test(static_cast<size_t>(b))) continue;
        int e = b;
        while (e + 1 < 256 && expr.byte_set.test(static_cast<size_t>(e + 1))) ++e;
        print_byte(out, b);
        if (e > b) {
          out << '-';
          print_byte(out, e);
        }
        b = e;
      }
      out << ']';
      break;
    }
    case ExprKind::kSeq:
    case ExprKind::kAlt: {
      out << '(';
      for (size_t i = 0; i < expr.children.size(); ++i) {
        if (i > 0) out << (expr.kind == ExprKind::kAlt ? " | " : " ");
        print_expr(out, grammar, *expr.children[i]);
      }
      out << ')';
      break;
    }
    case ExprKind::kRepeat:
      print_expr(out, grammar, *expr.children[0]);
      out << '{' << expr.min << ',';
      if (expr.max != kUnbounded) out << expr.max;
      out << '}';
      break;
    case ExprKind::kRuleRef:
      out << (expr.rule < grammar.rules.size() ? grammar.rules[expr.rule].name : "?");
      break;
    case ExprKind::kDfa:
      out << "<dfa " << expr.dfa->num_states() << " states>";
      break;
  }
}

}  // namespace

std::string to_string(const Grammar& grammar) {
  std::ostringstream out;
  for (const auto& rule : grammar.rules) {
    out << rule.name << " ::= ";
    if (rule.body) print_expr(out, grammar, *rule.body);
    out << '\n';
  }
  return out.str();
}

}  // namespace deepinfer::structured
