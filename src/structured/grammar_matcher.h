// Per-request grammar state: which tokens may come next, advancing, rolling back.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "structured/compiled_grammar.h"
#include "structured/stack_pool.h"

namespace deepinfer::structured {

class GrammarMatcher {
 public:
  explicit GrammarMatcher(CompiledGrammar grammar);

  // Sets bit (id % 32) of bitmask[id / 32] for every allowed token, clears the others. Stop
  // tokens are allowed exactly when the document is complete. Needs vocab().mask_words() words.
  void fill_next_token_bitmask(std::span<uint32_t> bitmask);
  // Advances by one token; returns false (and changes nothing) if the token is not allowed.
  bool accept_token(int32_t token_id);
  // Advances by raw bytes (forced continuations, tests); false and no change if not allowed.
  bool accept_bytes(std::string_view bytes);
  // Undoes the last `count` accepted tokens (or byte strings). Throws if fewer were accepted.
  void rollback(size_t count);
  void reset();

  bool is_complete() const;    // the text so far is a complete document
  bool is_terminated() const;  // a stop token was accepted
  size_t num_accepted() const { return history_.size() - 1; }
  size_t memory_bytes() const { return pool_.memory_bytes() + history_.capacity() * sizeof(Step); }
  const CompiledGrammar& grammar() const { return grammar_; }

 private:
  struct Step {
    int32_t set;
    bool stop;
  };
  // Parses `ids` from the stack element alone and sets the bits of those that are accepted.
  void parse_tokens(uint32_t elem, std::span<const int32_t> ids, std::span<uint32_t> bitmask);

  CompiledGrammar grammar_;
  StackPool pool_;
  std::vector<Step> history_;
  // Scratch reused across steps.
  SortedTokenClassifier classifier_;
  std::vector<int32_t> parsed_accepted_;
  std::vector<uint32_t> step_elems_;
  std::vector<uint32_t> step_nodes_;
  std::vector<std::pair<uint32_t, uint32_t>> step_contexts_;
};

}  // namespace deepinfer::structured
