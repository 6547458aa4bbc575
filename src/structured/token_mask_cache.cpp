#include "structured/token_mask_cache.h"

#include <atomic>
#include <exception>
#include <thread>

#include "structured/stack_pool.h"

namespace deepinfer::structured {
namespace {

enum class Verdict : uint8_t { kRejected, kAccepted, kUncertain };

NodeTokenMask analyse_node(uint32_t node, StackPool& pool, const VocabIndex& vocab) {
  const auto& sorted = vocab.sorted_ids();
  const auto& lcp = vocab.lcp();
  std::vector<int32_t> sets(1, pool.single_set(node, kSentinelParent));
  // past_end[d]: the rule could already have ended after fewer than d bytes.
  std::vector<uint8_t> past_end(1, 0);
  std::vector<int32_t> accepted;
  NodeTokenMask mask;
  size_t valid_depth = 0;
  for (size_t i = 0; i < sorted.size();) {
    const std::string& bytes = vocab.bytes(sorted[i]);
    size_t depth = std::min<size_t>(lcp[i], valid_depth);
    if (sets.size() <= bytes.size()) {
      sets.resize(bytes.size() + 1);
      past_end.resize(bytes.size() + 1);
    }
    size_t dead_at = SIZE_MAX;
    for (; depth < bytes.size(); ++depth) {
      int32_t next = pool.step(sets[depth], static_cast<uint8_t>(bytes[depth]));
      if (next == kDeadSet) {
        dead_at = depth;
        break;
      }
      past_end[depth + 1] = past_end[depth] || (pool.flags(sets[depth]) & kHitSentinel);
      sets[depth + 1] = next;
    }
    if (dead_at == SIZE_MAX) {
      valid_depth = bytes.size();
      accepted.push_back(sorted[i]);
      ++i;
      continue;
    }
    valid_depth = dead_at;
    bool uncertain = past_end[dead_at] || (pool.flags(sets[dead_at]) & kHitSentinel);
    // Every following token that shares the failing byte fails the same way.
    size_t end = vocab.subtree_end(i, dead_at);
    if (uncertain) {
      for (; i < end; ++i) mask.uncertain_ids.push_back(sorted[i]);
    }
    i = end;
  }
  if (accepted.size() * 32 > vocab.vocab_size()) {
    mask.accepted_bits.assign(vocab.mask_words(), 0);
    for (int32_t id : accepted) mask.accepted_bits[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  } else {
    mask.accepted_ids = std::move(accepted);
  }
  mask.accepted_ids.shrink_to_fit();
  mask.uncertain_ids.shrink_to_fit();
  return mask;
}

}  // namespace

std::vector<NodeTokenMask> build_token_mask_cache(const Automaton& automaton,
                                                  const VocabIndex& vocab,
                                                  const GrammarLimits& limits,
                                                  unsigned num_threads) {
  std::vector<NodeTokenMask> cache(automaton.nodes.size());
  std::vector<uint32_t> work;
  for (uint32_t n = 0; n < automaton.nodes.size(); ++n) {
    if (automaton.nodes[n].byte_begin != automaton.nodes[n].byte_end) work.push_back(n);
  }
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  auto worker = [&] {
    try {
      StackPool pool(automaton, limits, /*dense_transitions=*/true);
      for (size_t i; (i = next.fetch_add(1)) < work.size() && !failed;) {
        cache[work[i]] = analyse_node(work[i], pool, vocab);
      }
    } catch (...) {
      if (!failed.exchange(true)) failure = std::current_exception();
    }
  };
  num_threads = std::max(1u, std::min<unsigned>(num_threads, static_cast<unsigned>(work.size())));
  std::vector<std::thread> threads;
  for (unsigned t = 1; t < num_threads; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  return cache;
}

}  // namespace deepinfer::structured
