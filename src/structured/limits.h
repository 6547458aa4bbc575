// Bounds that keep pathological grammars, schemas and regexes from hanging the engine or
// exhausting memory. Exceeding one is an Error naming the limit, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>

namespace deepinfer::structured {

struct GrammarLimits {
  // Largest {m,n} count a regex or EBNF repetition may use.
  uint32_t max_repeat = 10'000;
  // States of the intermediate NFA over all rules of one grammar.
  size_t max_nfa_states = 2'000'000;
  // Determinizing one rule stops here; the rule then stays a (correct) NFA.
  size_t max_dfa_states_per_rule = 4'000;
  // Explicit byte DFAs (intersections, complements, numeric ranges, multipleOf).
  size_t max_byte_dfa_states = 50'000;
  // Rules one grammar may have (JSON schema and EBNF).
  size_t max_rules = 100'000;
  // Nesting depth of a regex, an EBNF expression or a JSON schema being merged.
  uint32_t max_nesting = 200;
  // Stack configurations one matcher may hold (bounds ambiguity blow-ups at run time).
  size_t max_stack_elems = 4'000'000;
  // Parallel parse stacks alive at once in one matcher state.
  size_t max_parallel_stacks = 20'000;
};

inline const GrammarLimits& default_limits() {
  static const GrammarLimits kLimits;
  return kLimits;
}

}  // namespace deepinfer::structured
