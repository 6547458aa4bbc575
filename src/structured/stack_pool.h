// Parse configurations of the grammar automaton, hash-consed so that equal configurations share
// one id. A stack element is (node, parent element); a "stack set" is the set of elements that
// can consume the next byte, plus whether the document may end here. Sets are immutable, so the
// transition (set, byte) -> set is cached: matching a byte string becomes table lookups (a lazy
// DFA over parser configurations) and rolling back means returning to an earlier set id.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "structured/automaton.h"
#include "structured/limits.h"

namespace deepinfer::structured {

inline constexpr int32_t kRootParent = -1;      // popping here completes the document
inline constexpr int32_t kSentinelParent = -2;  // popping here leaves the context being analysed
inline constexpr int32_t kDeadSet = -1;

inline constexpr uint8_t kCanFinish = 1;    // the root rule may complete here
inline constexpr uint8_t kHitSentinel = 2;  // the analysed rule may complete here

struct StackElem {
  uint32_t node;
  int32_t parent;
};

class StackPool {
 public:
  // Dense transition tables (1 KiB per set) suit short-lived analysis pools; matchers use a map.
  StackPool(const Automaton& automaton, const GrammarLimits& limits, bool dense_transitions);

  int32_t initial_set();
  // The interned stack element (node, parent); parent is an element id or kRootParent /
  // kSentinelParent.
  uint32_t element(uint32_t node, int32_t parent) { return intern_elem(node, parent); }
  // The set holding exactly one element (node, parent); node must have byte edges.
  int32_t single_set(uint32_t node, int32_t parent);
  int32_t single_set_of_elem(uint32_t elem);
  int32_t step(int32_t set, uint8_t byte) {
    // Fast path (inline: walks over the vocabulary call this for every byte): a cached row.
    if (dense_) {
      int32_t row = sets_[static_cast<size_t>(set)].dense_row;
      if (row >= 0) {
        int32_t cached = dense_rows_[static_cast<size_t>(row) * 256 + byte];
        if (cached != kNotComputed) return cached;
      }
    }
    return compute_step(set, byte);
  }
  int32_t step_bytes(int32_t set, std::span<const uint8_t> bytes);

  std::span<const uint32_t> elems(int32_t set) const {
    const SetInfo& info = sets_[static_cast<size_t>(set)];
    return {set_storage_.data() + info.begin, info.size};
  }
  uint8_t flags(int32_t set) const { return sets_[static_cast<size_t>(set)].flags; }
  const StackElem& elem(uint32_t id) const { return elems_[id]; }
  const Automaton& automaton() const { return automaton_; }
  size_t num_elems() const { return elems_.size(); }
  size_t num_sets() const { return sets_.size(); }
  size_t memory_bytes() const;

 private:
  struct SetInfo {
    uint32_t begin;
    uint32_t size;
    uint8_t flags;
    int32_t dense_row = -1;
  };
  struct Closure {
    uint32_t begin = 0;
    uint32_t size = 0;
    uint8_t flags = 0;
    bool computed = false;
  };

  static constexpr int32_t kNotComputed = -2;

  int32_t compute_step(int32_t set, uint8_t byte);
  uint32_t intern_elem(uint32_t node, int32_t parent);
  const Closure& closure(uint32_t elem);
  int32_t intern_set(std::vector<uint32_t>& ready, uint8_t flags);

  const Automaton& automaton_;
  const GrammarLimits& limits_;
  bool dense_;
  std::vector<StackElem> elems_;
  std::unordered_map<uint64_t, uint32_t> elem_ids_;
  std::vector<Closure> closures_;
  std::vector<uint32_t> closure_storage_;
  std::vector<SetInfo> sets_;
  std::vector<uint32_t> set_storage_;
  std::unordered_multimap<uint64_t, int32_t> set_ids_;
  std::vector<int32_t> dense_rows_;
  std::unordered_map<uint64_t, int32_t> sparse_transitions_;
  // Scratch for closure and step.
  std::vector<uint32_t> visit_stamp_;
  uint32_t stamp_ = 0;
  std::vector<uint32_t> closure_ready_;
  std::vector<uint32_t> step_ready_;
  std::vector<uint32_t> step_next_;
  std::vector<uint32_t> todo_;
};

}  // namespace deepinfer::structured
