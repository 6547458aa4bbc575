// Per grammar and vocabulary: for every automaton node that can consume a byte, which tokens
// are accepted no matter what lies below on the parse stack, and which depend on it (they run
// past the end of the node's rule). Computed once by walking the byte-sorted vocabulary with the
// rule analysed in isolation (its parent replaced by a sentinel), as xgrammar's adaptive token
// mask cache does. At run time only the context-dependent tokens need a real parse.
//
// One level deeper: the context-dependent tokens of a node are classified again for each return
// node its rule can have (the caller's continuation, with the sentinel below it), so the tokens
// that close a string and continue in the enclosing object are decided at compile time too; only
// those that also run past the end of the caller's rule are parsed at run time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "structured/automaton.h"
#include "structured/limits.h"
#include "structured/stack_pool.h"
#include "structured/vocab.h"

namespace deepinfer::structured {

// A set of token ids stored as an id list when few, as a full bitmask when many.
struct TokenSet {
  std::vector<int32_t> ids;
  std::vector<uint32_t> bits;

  // ids in any order, each below vocab_size.
  static TokenSet from_ids(std::vector<int32_t> ids, size_t vocab_size);
  void or_into(std::span<uint32_t> mask) const;
  size_t memory_bytes() const { return ids.capacity() * 4 + bits.capacity() * 4; }
};

// Return node standing for "the rule was entered from the root: popping completes the document".
inline constexpr uint32_t kRootReturn = UINT32_MAX;

// A node's context-dependent tokens classified under one return node of its rule.
struct ReturnContextMask {
  uint32_t return_node;            // kRootReturn or the caller's continuation node
  TokenSet accepted;               // whatever lies below the return node
  std::vector<int32_t> uncertain;  // also leave the caller's rule: parsed at run time; byte order
};

struct NodeTokenMask {
  TokenSet accepted;                         // whatever the stack below
  std::vector<int32_t> uncertain_ids;        // context-dependent, in byte order
  std::vector<ReturnContextMask> by_return;  // sorted by return_node; may be incomplete

  // nullptr when the return node was not analysed (then all uncertain_ids need a real parse).
  const ReturnContextMask* find_return(uint32_t return_node) const;
  size_t memory_bytes() const;
};

// Which tokens of the byte-sorted `ids`, parsed from `start_set`, are accepted and which are
// uncertain (fail only after a sentinel parent could have been reached); the rest are rejected.
// Consecutive tokens share the parse of their common prefix, and after a failure the tokens that
// share the failing prefix get the same verdict unparsed. `ids` may be vocab.sorted_ids() (then
// the precomputed prefix tables are used) or any byte-sorted subset of it.
class SortedTokenClassifier {
 public:
  void run(StackPool& pool, int32_t start_set, std::span<const int32_t> ids,
           const VocabIndex& vocab, std::vector<int32_t>& accepted,
           std::vector<int32_t>* uncertain);

 private:
  // Tokens ids[begin, end_index), which must not share a prefix with ids[begin - 1].
  void run_range(StackPool& pool, int32_t start_set, std::span<const int32_t> ids, size_t begin,
                 size_t end_index, bool whole_vocab, const VocabIndex& vocab,
                 std::vector<int32_t>& accepted, std::vector<int32_t>* uncertain);

  std::vector<int32_t> sets_;
  std::vector<uint8_t> past_end_;
};

// Indexed by node id; nodes without byte edges get an empty entry.
std::vector<NodeTokenMask> build_token_mask_cache(const Automaton& automaton,
                                                  const VocabIndex& vocab,
                                                  const GrammarLimits& limits,
                                                  unsigned num_threads);

}  // namespace deepinfer::structured
