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

void GrammarMatcher::check_uncertain(uint32_t elem, const NodeTokenMask& mask,
                                     std::span<uint32_t> bitmask) {
  const VocabIndex& vocab = grammar_.vocab();
  walk_sets_.assign(1, pool_.single_set_of_elem(elem));
  size_t valid_depth = 0;
  const std::string* previous = nullptr;
  const auto& ids = mask.uncertain_ids;
  for (size_t i = 0; i < ids.size();) {
    const std::string& bytes = vocab.bytes(ids[i]);
    size_t shared = 0;
    if (previous) {
      size_t limit = std::min({previous->size(), bytes.size(), valid_depth});
      while (shared < limit && (*previous)[shared] == bytes[shared]) ++shared;
    }
    previous = &bytes;
    if (walk_sets_.size() <= bytes.size()) walk_sets_.resize(bytes.size() + 1);
    size_t depth = shared;
    bool dead = false;
    for (; depth < bytes.size(); ++depth) {
      int32_t next = pool_.step(walk_sets_[depth], static_cast<uint8_t>(bytes[depth]));
      if (next == kDeadSet) {
        dead = true;
        break;
      }
      walk_sets_[depth + 1] = next;
    }
    valid_depth = depth;
    if (!dead) bitmask[static_cast<size_t>(ids[i]) / 32] |= 1u << (ids[i] % 32);
    ++i;
    if (dead) {
      // Skip the following tokens that share the failing byte.
      while (i < ids.size()) {
        const std::string& next_bytes = vocab.bytes(ids[i]);
        if (next_bytes.size() <= depth ||
            std::memcmp(next_bytes.data(), bytes.data(), depth + 1) != 0)
          break;
        ++i;
      }
    }
  }
}

void GrammarMatcher::fill_next_token_bitmask(std::span<uint32_t> bitmask) {
  const VocabIndex& vocab = grammar_.vocab();
  if (bitmask.size() < vocab.mask_words()) {
    DI_THROW("token bitmask has ", bitmask.size(), " words; the vocabulary needs ",
             vocab.mask_words());
  }
  std::fill(bitmask.begin(), bitmask.end(), 0u);
  int32_t set = history_.back().set;
  if (is_terminated() || set == kDeadSet) return;
  const auto& cache = grammar_.mask_cache();
  auto elems = pool_.elems(set);
  // Context-independent part: one OR per distinct node.
  std::vector<uint32_t> nodes;
  nodes.reserve(elems.size());
  for (uint32_t e : elems) nodes.push_back(pool_.elem(e).node);
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  for (uint32_t node : nodes) {
    const NodeTokenMask& mask = cache[node];
    if (!mask.accepted_bits.empty()) {
      for (size_t w = 0; w < mask.accepted_bits.size(); ++w) bitmask[w] |= mask.accepted_bits[w];
    } else {
      for (int32_t id : mask.accepted_ids) bitmask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    }
  }
  // Context-dependent part: parse those tokens with the real stack.
  // Copy the element ids: checking tokens may grow the pool's storage.
  std::vector<uint32_t> elem_ids(elems.begin(), elems.end());
  for (uint32_t e : elem_ids) {
    const NodeTokenMask& mask = cache[pool_.elem(e).node];
    if (!mask.uncertain_ids.empty()) check_uncertain(e, mask, bitmask);
  }
  if (pool_.flags(set) & kCanFinish) {
    for (int32_t id : vocab.stop_ids()) bitmask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  }
}

}  // namespace deepinfer::structured
