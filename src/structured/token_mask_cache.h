// Per grammar and vocabulary: for every automaton node that can consume a byte, which tokens
// are accepted no matter what lies below on the parse stack, and which depend on it (they run
// past the end of the node's rule). Computed once by walking the byte-sorted vocabulary with the
// rule analysed in isolation (its parent replaced by a sentinel), as xgrammar's adaptive token
// mask cache does. At run time only the context-dependent tokens need a real parse.
#pragma once

#include <cstdint>
#include <vector>

#include "structured/automaton.h"
#include "structured/limits.h"
#include "structured/vocab.h"

namespace deepinfer::structured {

struct NodeTokenMask {
  std::vector<int32_t> accepted_ids;    // when few are accepted
  std::vector<uint32_t> accepted_bits;  // when many are: a full bitmask
  std::vector<int32_t> uncertain_ids;   // context-dependent, in byte order
  size_t memory_bytes() const {
    return accepted_ids.capacity() * 4 + accepted_bits.capacity() * 4 +
           uncertain_ids.capacity() * 4;
  }
};

// Indexed by node id; nodes without byte edges get an empty entry.
std::vector<NodeTokenMask> build_token_mask_cache(const Automaton& automaton,
                                                  const VocabIndex& vocab,
                                                  const GrammarLimits& limits,
                                                  unsigned num_threads);

}  // namespace deepinfer::structured
