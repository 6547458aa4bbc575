// Deterministic automata over bytes for the regular parts of a grammar that need boolean
// operations: intersection (pattern AND length, numeric bounds AND multipleOf) and complement
// (property names that are not declared). Dense: 256 transitions per state.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "structured/grammar.h"
#include "structured/limits.h"

namespace deepinfer::structured {

struct ByteDfa {
  std::vector<int32_t> next;  // next[state * 256 + byte], -1 where no transition
  std::vector<uint8_t> accepting;
  int32_t start = 0;

  size_t num_states() const { return accepting.size(); }
  int32_t step(int32_t state, uint8_t byte) const {
    return next[static_cast<size_t>(state) * 256 + byte];
  }
  int32_t add_state(bool is_accepting);
  bool matches(std::string_view text) const;
  bool is_empty() const;  // accepts no string
};

// Determinizes a rule-free expression; throws Error if it references rules or exceeds the limit.
ByteDfa dfa_from_expr(const Expr& expr, const GrammarLimits& limits);
ByteDfa dfa_intersect(const ByteDfa& a, const ByteDfa& b, const GrammarLimits& limits);
// Strings over all bytes that `a` rejects.
ByteDfa dfa_complement(const ByteDfa& a);
// Drops states that cannot reach an accepting state (keeps the start state).
ByteDfa dfa_trim(const ByteDfa& a);

}  // namespace deepinfer::structured
