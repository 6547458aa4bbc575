#include "structured/token_mask_cache.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>

namespace deepinfer::structured {
namespace {

// Return-node analyses are skipped for rules called from more places than this (each costs a
// walk over the node's context-dependent tokens at compile time); those nodes fall back to a
// real parse of all their context-dependent tokens at run time, which is still exact.
constexpr size_t kMaxReturnNodesPerRule = 64;
constexpr size_t kMaxReturnAnalyses = 4096;

// Runs fn(index, pool) for every index below count, one StackPool per thread (kept across calls,
// so transitions computed once are reused). Each thread gets at least min_per_thread items:
// starting a thread costs more than a few small items (much more on a loaded machine).
template <class Fn>
void parallel_for(size_t count, size_t min_per_thread,
                  std::vector<std::unique_ptr<StackPool>>& pools, Fn&& fn) {
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  auto worker = [&](StackPool& pool) {
    try {
      for (size_t i; (i = next.fetch_add(1)) < count && !failed;) fn(i, pool);
    } catch (...) {
      if (!failed.exchange(true)) failure = std::current_exception();
    }
  };
  size_t num_threads = std::max<size_t>(1, std::min(pools.size(), count / min_per_thread));
  std::vector<std::thread> threads;
  for (size_t t = 1; t < num_threads; ++t) threads.emplace_back(worker, std::ref(*pools[t]));
  worker(*pools[0]);
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

// For each rule, the nodes a call of it can return to (kRootReturn for the root rule). A call
// whose continuation is a pure return is a tail call: the callee inherits the caller's returns.
// Rules with more than kMaxReturnNodesPerRule returns are marked by an empty list + overflow.
struct ReturnNodes {
  std::vector<std::vector<uint32_t>> per_rule;
  std::vector<uint8_t> overflow;
};

ReturnNodes collect_return_nodes(const Automaton& automaton) {
  const size_t num_rules = automaton.rule_start.size();
  ReturnNodes out;
  out.per_rule.resize(num_rules);
  out.overflow.assign(num_rules, 0);
  std::vector<std::pair<uint32_t, uint32_t>> tail_calls;  // (caller rule, callee rule)
  for (const AutomatonNode& node : automaton.nodes) {
    for (uint32_t c = node.call_begin; c < node.call_end; ++c) {
      const CallEdge& call = automaton.call_edges[c];
      if (automaton.nodes[call.target].pure_return) {
        if (node.rule != call.rule) tail_calls.emplace_back(node.rule, call.rule);
      } else {
        out.per_rule[call.rule].push_back(call.target);
      }
    }
  }
  out.per_rule[automaton.root_rule].push_back(kRootReturn);
  auto normalize = [&](uint32_t rule) {
    auto& list = out.per_rule[rule];
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
    if (list.size() > kMaxReturnNodesPerRule) out.overflow[rule] = 1;
    if (out.overflow[rule]) list.clear();
  };
  for (uint32_t r = 0; r < num_rules; ++r) normalize(r);
  for (bool changed = true; changed;) {
    changed = false;
    for (auto [caller, callee] : tail_calls) {
      if (out.overflow[callee]) continue;
      size_t before = out.per_rule[callee].size();
      if (out.overflow[caller]) {
        out.overflow[callee] = 1;
        out.per_rule[callee].clear();
        changed = true;
        continue;
      }
      const auto& from = out.per_rule[caller];
      auto& to = out.per_rule[callee];
      to.insert(to.end(), from.begin(), from.end());
      normalize(callee);
      changed = changed || out.overflow[callee] || to.size() != before;
    }
  }
  return out;
}

}  // namespace

TokenSet TokenSet::from_ids(std::vector<int32_t> ids, size_t vocab_size) {
  TokenSet set;
  const size_t words = (vocab_size + 31) / 32;
  // A bitmask ORs a word per 32 ids at vector speed; an id list costs a scattered write per id.
  if (ids.size() * 4 > words) {
    set.bits.assign(words, 0);
    for (int32_t id : ids) set.bits[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  } else {
    std::sort(ids.begin(), ids.end());
    set.ids = std::move(ids);
    set.ids.shrink_to_fit();
  }
  return set;
}

void TokenSet::or_into(std::span<uint32_t> mask) const {
  if (!bits.empty()) {
    uint32_t* __restrict out = mask.data();
    const uint32_t* __restrict in = bits.data();
    for (size_t w = 0, n = bits.size(); w < n; ++w) out[w] |= in[w];
  } else {
    for (int32_t id : ids) mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  }
}

const ReturnContextMask* NodeTokenMask::find_return(uint32_t return_node) const {
  auto it = std::lower_bound(
      by_return.begin(), by_return.end(), return_node,
      [](const ReturnContextMask& m, uint32_t node) { return m.return_node < node; });
  return it != by_return.end() && it->return_node == return_node ? &*it : nullptr;
}

size_t NodeTokenMask::memory_bytes() const {
  size_t bytes = accepted.memory_bytes() + uncertain_ids.capacity() * 4 +
                 by_return.capacity() * sizeof(ReturnContextMask);
  for (const auto& m : by_return) bytes += m.accepted.memory_bytes() + m.uncertain.capacity() * 4;
  return bytes;
}

void SortedTokenClassifier::run(StackPool& pool, int32_t start_set, std::span<const int32_t> ids,
                                const VocabIndex& vocab, std::vector<int32_t>& accepted,
                                std::vector<int32_t>* uncertain) {
  const bool whole_vocab =
      ids.data() == vocab.sorted_ids().data() && ids.size() == vocab.sorted_ids().size();
  // Over the whole vocabulary, only the first bytes some element of the start set consumes are
  // visited: every other first-byte group is rejected without being looked at (uncertain instead
  // if the start set could already leave the context, hence the flag check).
  if (!whole_vocab || (pool.flags(start_set) & kHitSentinel)) {
    run_range(pool, start_set, ids, 0, ids.size(), whole_vocab, vocab, accepted, uncertain);
    return;
  }
  std::array<bool, 256> live{};
  const Automaton& automaton = pool.automaton();
  for (uint32_t e : pool.elems(start_set)) {
    const AutomatonNode& node = automaton.nodes[pool.elem(e).node];
    for (uint32_t k = node.byte_begin; k < node.byte_end; ++k) {
      const ByteEdge& edge = automaton.byte_edges[k];
      for (unsigned b = edge.lo; b <= edge.hi; ++b) live[b] = true;
    }
  }
  for (unsigned lo = 0; lo < 256;) {
    if (!live[lo]) {
      ++lo;
      continue;
    }
    unsigned hi = lo;
    while (hi + 1 < 256 && live[hi + 1]) ++hi;
    run_range(pool, start_set, ids, vocab.first_byte_begin(lo), vocab.first_byte_begin(hi + 1),
              true, vocab, accepted, uncertain);
    lo = hi + 1;
  }
}

void SortedTokenClassifier::run_range(StackPool& pool, int32_t start_set,
                                      std::span<const int32_t> ids, size_t begin, size_t end_index,
                                      bool whole_vocab, const VocabIndex& vocab,
                                      std::vector<int32_t>& accepted,
                                      std::vector<int32_t>* uncertain) {
  sets_.assign(1, start_set);
  // past_end_[d]: the analysed context could already have ended after fewer than d bytes.
  past_end_.assign(1, 0);
  size_t valid_depth = 0;
  std::string_view previous;
  for (size_t i = begin; i < end_index;) {
    const std::string_view bytes = whole_vocab ? vocab.sorted_bytes(i) : vocab.bytes(ids[i]);
    size_t depth = 0;
    if (whole_vocab) {
      depth = std::min<size_t>(vocab.lcp()[i], valid_depth);
    } else {
      size_t limit = std::min({previous.size(), bytes.size(), valid_depth});
      while (depth < limit && previous[depth] == bytes[depth]) ++depth;
    }
    previous = bytes;
    if (sets_.size() <= bytes.size()) {
      sets_.resize(bytes.size() + 1);
      past_end_.resize(bytes.size() + 1);
    }
    size_t dead_at = SIZE_MAX;
    for (; depth < bytes.size(); ++depth) {
      int32_t next = pool.step(sets_[depth], static_cast<uint8_t>(bytes[depth]));
      if (next == kDeadSet) {
        dead_at = depth;
        break;
      }
      past_end_[depth + 1] = past_end_[depth] || (pool.flags(sets_[depth]) & kHitSentinel);
      sets_[depth + 1] = next;
    }
    if (dead_at == SIZE_MAX) {
      valid_depth = bytes.size();
      accepted.push_back(ids[i]);
      ++i;
      continue;
    }
    valid_depth = dead_at;
    const bool is_uncertain = past_end_[dead_at] || (pool.flags(sets_[dead_at]) & kHitSentinel);
    // Every following token that shares the failing byte fails the same way.
    size_t end = i + 1;
    if (whole_vocab) {
      end = vocab.subtree_end(i, dead_at);
    } else {
      while (end < end_index) {
        const std::string_view next_bytes = vocab.bytes(ids[end]);
        if (next_bytes.size() <= dead_at ||
            std::memcmp(next_bytes.data(), bytes.data(), dead_at + 1) != 0)
          break;
        ++end;
      }
    }
    if (is_uncertain && uncertain)
      uncertain->insert(uncertain->end(), ids.begin() + i, ids.begin() + end);
    i = end;
  }
}

std::vector<NodeTokenMask> build_token_mask_cache(const Automaton& automaton,
                                                  const VocabIndex& vocab,
                                                  const GrammarLimits& limits,
                                                  unsigned num_threads) {
  std::vector<NodeTokenMask> cache(automaton.nodes.size());
  std::vector<uint32_t> work;
  for (uint32_t n = 0; n < automaton.nodes.size(); ++n) {
    if (automaton.nodes[n].byte_begin != automaton.nodes[n].byte_end) work.push_back(n);
  }
  std::vector<std::unique_ptr<StackPool>> pools;
  for (unsigned t = 0; t < std::max(1u, num_threads); ++t) {
    pools.push_back(std::make_unique<StackPool>(automaton, limits, /*dense_transitions=*/true));
  }
  // Context-independent part: each node with its parent replaced by the sentinel.
  parallel_for(work.size(), /*min_per_thread=*/1, pools, [&](size_t i, StackPool& pool) {
    SortedTokenClassifier classifier;
    std::vector<int32_t> accepted;
    NodeTokenMask& mask = cache[work[i]];
    classifier.run(pool, pool.single_set(work[i], kSentinelParent), vocab.sorted_ids(), vocab,
                   accepted, &mask.uncertain_ids);
    mask.accepted = TokenSet::from_ids(std::move(accepted), vocab.vocab_size());
    mask.uncertain_ids.shrink_to_fit();
  });

  // The context-dependent tokens again, under each return node of the node's rule.
  ReturnNodes returns = collect_return_nodes(automaton);
  std::vector<std::pair<uint32_t, uint32_t>> jobs;  // (node, return node)
  for (uint32_t node : work) {
    if (cache[node].uncertain_ids.empty()) continue;
    for (uint32_t ret : returns.per_rule[automaton.nodes[node].rule]) jobs.emplace_back(node, ret);
  }
  if (jobs.size() > kMaxReturnAnalyses) jobs.clear();
  std::vector<ReturnContextMask> results(jobs.size());
  parallel_for(jobs.size(), /*min_per_thread=*/64, pools, [&](size_t i, StackPool& pool) {
    auto [node, ret] = jobs[i];
    int32_t parent =
        ret == kRootReturn ? kRootParent : static_cast<int32_t>(pool.element(ret, kSentinelParent));
    SortedTokenClassifier classifier;
    std::vector<int32_t> accepted;
    ReturnContextMask& result = results[i];
    result.return_node = ret;
    classifier.run(pool, pool.single_set(node, parent), cache[node].uncertain_ids, vocab, accepted,
                   &result.uncertain);
    result.accepted = TokenSet::from_ids(std::move(accepted), vocab.vocab_size());
    result.uncertain.shrink_to_fit();
  });
  // jobs are grouped by node with return nodes ascending, so by_return comes out sorted.
  for (size_t i = 0; i < jobs.size(); ++i) {
    cache[jobs[i].first].by_return.push_back(std::move(results[i]));
  }
  return cache;
}

}  // namespace deepinfer::structured
