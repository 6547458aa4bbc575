// The executable grammar: every rule is a small automaton (deterministic where that stays small)
// whose edges consume a byte range or call another rule. A matcher walks it with a stack of
// return points. Built once per grammar; immutable and shared by all matchers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "structured/grammar.h"
#include "structured/limits.h"

namespace deepinfer::structured {

struct ByteEdge {
  uint8_t lo;
  uint8_t hi;
  uint32_t target;
};

struct CallEdge {
  uint32_t rule;
  uint32_t target;  // where the caller continues once the rule completes
};

struct AutomatonNode {
  uint32_t byte_begin = 0;
  uint32_t byte_end = 0;
  uint32_t call_begin = 0;
  uint32_t call_end = 0;
  uint32_t rule = 0;
  bool final = false;          // the rule may complete here
  bool pure_return = false;    // final with no outgoing edge: a call returning here is a tail call
  bool deterministic = false;  // byte edges are disjoint and sorted
};

struct Automaton {
  std::vector<AutomatonNode> nodes;
  std::vector<ByteEdge> byte_edges;
  std::vector<CallEdge> call_edges;
  std::vector<uint32_t> rule_start;  // per rule; UINT32_MAX for rules not reachable from root
  std::vector<std::string> rule_names;
  uint32_t root_rule = 0;
  bool empty_language = false;  // the grammar accepts no document at all

  uint32_t start_node() const { return rule_start[root_rule]; }
};

// Throws Error on undefined rules, left recursion or exceeded limits.
Automaton build_automaton(const Grammar& grammar, const GrammarLimits& limits);

}  // namespace deepinfer::structured
