// Regular languages of decimal numerals (positional notation, no exponent) with numeric
// constraints: x >= / > / <= / < a decimal bound, and x a multiple of a decimal step.
// Combined by automaton intersection in the JSON schema compiler.
#pragma once

#include <string>

#include "structured/byte_dfa.h"
#include "structured/grammar.h"

namespace deepinfer::structured {

struct Decimal {
  bool negative = false;
  std::string integer = "0";  // no leading zeros
  std::string fraction;       // no trailing zeros
  bool is_zero() const { return integer == "0" && fraction.empty(); }
};

// Parses positional or exponent notation ("1.5", "-2", "1e-8") exactly; throws on anything else.
Decimal parse_decimal(const std::string& text);

// -?(0|[1-9][0-9]*)(\.[0-9]+)?  and the integers  -?(0|[1-9][0-9]*)(\.0+)?
ExprPtr decimal_numeral_expr();
ExprPtr integer_numeral_expr();
// Numerals equal to `value` (trailing zeros in the fraction allowed).
ExprPtr decimal_equal_expr(const Decimal& value);
ExprPtr decimal_at_least_expr(const Decimal& bound, bool inclusive);
ExprPtr decimal_at_most_expr(const Decimal& bound, bool inclusive);
// Numerals that are an integer multiple of `step` (> 0). Throws Error if the automaton
// would exceed the limit.
ByteDfa decimal_multiple_of_dfa(const Decimal& step, const GrammarLimits& limits);

}  // namespace deepinfer::structured
