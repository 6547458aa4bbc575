// Thompson construction: an Expr becomes an NFA with epsilon edges, byte-range edges and call
// edges (a call consumes a whole rule's language and continues at the edge's target).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "structured/grammar.h"
#include "structured/limits.h"

namespace deepinfer::structured {

enum class NfaEdgeKind : uint8_t { kEpsilon, kByteRange, kCall };

struct NfaEdge {
  NfaEdgeKind kind;
  uint8_t lo = 0;
  uint8_t hi = 0;
  uint32_t rule = 0;
  uint32_t target = 0;
};

class Nfa {
 public:
  explicit Nfa(const GrammarLimits& limits) : limits_(limits) {}

  uint32_t new_state();
  void add_epsilon(uint32_t from, uint32_t to) {
    edges_[from].push_back({NfaEdgeKind::kEpsilon, 0, 0, 0, to});
  }
  void add_bytes(uint32_t from, uint8_t lo, uint8_t hi, uint32_t to) {
    edges_[from].push_back({NfaEdgeKind::kByteRange, lo, hi, 0, to});
  }
  void add_call(uint32_t from, uint32_t rule, uint32_t to) {
    edges_[from].push_back({NfaEdgeKind::kCall, 0, 0, rule, to});
  }
  // Builds `expr` between two fresh states and returns {entry, exit}.
  std::pair<uint32_t, uint32_t> build(const Expr& expr);

  size_t num_states() const { return edges_.size(); }
  const std::vector<NfaEdge>& edges(uint32_t state) const { return edges_[state]; }
  // The states reachable from `states` over epsilon edges (sorted, unique).
  std::vector<uint32_t> epsilon_closure(std::vector<uint32_t> states) const;

 private:
  void build_into(const Expr& expr, uint32_t entry, uint32_t exit);

  const GrammarLimits& limits_;
  std::vector<std::vector<NfaEdge>> edges_;
};

}  // namespace deepinfer::structured
