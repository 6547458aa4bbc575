#include "structured/grammar_matcher.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace deepinfer::structured {

GrammarMatcher::GrammarMatcher(CompiledGrammar grammar)
    : grammar_(std::move(grammar)),
      pool_(grammar_.automaton(), grammar_.limits(), /*dense_transitions=*/true) {
  reset();
}

void GrammarMatcher::reset() {
  history_.clear();
  int32_t initial = grammar_.automaton().empty_language ? kDeadSet : pool_.initial_set();
  history_.push_back({initial, false});
}

bool GrammarMatcher::is_complete() const {
  int32_t set = history_.back().set;
  return set != kDeadSet && (pool_.flags(set) & kCanFinish) != 0;
}

bool GrammarMatcher::is_terminated() const {
  return history_.back().stop;
}

bool GrammarMatcher::accept_token(int32_t token_id) {
  if (is_terminated()) return false;
  const VocabIndex& vocab = grammar_.vocab();
  if (vocab.is_stop(token_id)) {
    if (!is_complete()) return false;
    history_.push_back({history_.back().set, true});
    return true;
  }
  if (!vocab.is_ordinary(token_id)) return false;
  return accept_bytes(vocab.bytes(token_id));
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (is_terminated()) return false;
  int32_t set = history_.back().set;
  if (set == kDeadSet) return false;
  set = pool_.step_bytes(set, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  if (set == kDeadSet) return false;
  history_.push_back({set, false});
  return true;
}

void GrammarMatcher::rollback(size_t count) {
  if (count > num_accepted()) {
    DI_THROW("cannot roll back ", count, " tokens: only ", num_accepted(), " were accepted");
  }
  history_.resize(history_.size() - count);
}

void GrammarMatcher::parse_tokens(uint32_t elem, std::span<const int32_t> ids,
                                  std::span<uint32_t> bitmask) {
  parsed_accepted_.clear();
  classifier_.run(pool_, pool_.single_set_of_elem(elem), ids, grammar_.vocab(), parsed_accepted_,
                  nullptr);
  for (int32_t id : parsed_accepted_) bitmask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
}

void GrammarMatcher::fill_next_token_bitmask(std::span<uint32_t> bitmask) {
  const VocabIndex& vocab = grammar_.vocab();
  if (bitmask.size() < vocab.mask_words()) {
    DI_THROW("token bitmask has ", bitmask.size(), " words; the vocabulary needs ",
             vocab.mask_words());
  }
  int32_t set = history_.back().set;
  if (is_terminated() || set == kDeadSet) {
    std::fill(bitmask.begin(), bitmask.end(), 0u);
    return;
  }
  const auto& cache = grammar_.mask_cache();
  // Copy the element ids: parsing tokens below may grow the pool's storage.
  auto elems = pool_.elems(set);
  step_elems_.assign(elems.begin(), elems.end());
  // Context-independent part: one OR per distinct node. The first full bitmask is copied rather
  // than ORed into a cleared mask, saving a pass over the vocabulary.
  step_nodes_.clear();
  for (uint32_t e : step_elems_) step_nodes_.push_back(pool_.elem(e).node);
  std::sort(step_nodes_.begin(), step_nodes_.end());
  step_nodes_.erase(std::unique(step_nodes_.begin(), step_nodes_.end()), step_nodes_.end());
  auto first_bits = std::find_if(step_nodes_.begin(), step_nodes_.end(),
                                 [&](uint32_t node) { return !cache[node].accepted.bits.empty(); });
  if (first_bits != step_nodes_.end()) {
    const auto& bits = cache[*first_bits].accepted.bits;
    std::copy(bits.begin(), bits.end(), bitmask.begin());
    std::fill(bitmask.begin() + static_cast<ptrdiff_t>(bits.size()), bitmask.end(), 0u);
  } else {
    std::fill(bitmask.begin(), bitmask.end(), 0u);
  }
  for (auto it = step_nodes_.begin(); it != step_nodes_.end(); ++it) {
    if (it != first_bits) cache[*it].accepted.or_into(bitmask);
  }
  // Context-dependent part: decided per (node, return node) at compile time where analysed; the
  // tokens that run past the caller's rule too are parsed with the real stack.
  step_contexts_.clear();
  for (uint32_t e : step_elems_) {
    const StackElem elem = pool_.elem(e);
    const NodeTokenMask& mask = cache[elem.node];
    if (mask.uncertain_ids.empty()) continue;
    uint32_t return_node = elem.parent == kRootParent
                               ? kRootReturn
                               : pool_.elem(static_cast<uint32_t>(elem.parent)).node;
    const ReturnContextMask* context = mask.find_return(return_node);
    if (!context) {
      parse_tokens(e, mask.uncertain_ids, bitmask);
      continue;
    }
    std::pair<uint32_t, uint32_t> key{elem.node, return_node};
    if (std::find(step_contexts_.begin(), step_contexts_.end(), key) == step_contexts_.end()) {
      step_contexts_.push_back(key);
      context->accepted.or_into(bitmask);
    }
    if (!context->uncertain.empty()) parse_tokens(e, context->uncertain, bitmask);
  }
  if (pool_.flags(set) & kCanFinish) {
    for (int32_t id : vocab.stop_ids()) bitmask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  }
}

}  // namespace deepinfer::structured
