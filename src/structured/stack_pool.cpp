#include "structured/stack_pool.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer::structured {
namespace {

uint64_t hash_set(std::span<const uint32_t> ready, uint8_t flags) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ flags;
  for (uint32_t e : ready) {
    h ^= e + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  }
  return h;
}

}  // namespace

StackPool::StackPool(const Automaton& automaton, const GrammarLimits& limits,
                     bool dense_transitions)
    : automaton_(automaton), limits_(limits), dense_(dense_transitions) {}

uint32_t StackPool::intern_elem(uint32_t node, int32_t parent) {
  uint64_t key = (static_cast<uint64_t>(node) << 32) | static_cast<uint32_t>(parent);
  auto [it, inserted] = elem_ids_.try_emplace(key, static_cast<uint32_t>(elems_.size()));
  if (inserted) {
    if (elems_.size() >= limits_.max_stack_elems) {
      DI_THROW(
          "grammar matcher exceeded ", limits_.max_stack_elems,
          " parser stack configurations (the grammar is too ambiguous or the output too long)");
    }
    elems_.push_back({node, parent});
    closures_.emplace_back();
  }
  return it->second;
}

const StackPool::Closure& StackPool::closure(uint32_t start) {
  if (closures_[start].computed) return closures_[start];
  // Depth-first over epsilon moves: calls push, completions pop.
  ++stamp_;
  std::vector<uint32_t>& ready = closure_ready_;
  ready.clear();
  uint8_t flags = 0;
  todo_.clear();
  todo_.push_back(start);
  auto mark = [&](uint32_t e) {
    if (visit_stamp_.size() <= e)
      visit_stamp_.resize(std::max<size_t>(e + 1, visit_stamp_.size() * 2), 0);
    if (visit_stamp_[e] == stamp_) return false;
    visit_stamp_[e] = stamp_;
    return true;
  };
  mark(start);
  while (!todo_.empty()) {
    uint32_t e = todo_.back();
    todo_.pop_back();
    const StackElem elem = elems_[e];
    const AutomatonNode& node = automaton_.nodes[elem.node];
    if (node.byte_begin != node.byte_end) ready.push_back(e);
    for (uint32_t c = node.call_begin; c < node.call_end; ++c) {
      const CallEdge& call = automaton_.call_edges[c];
      int32_t cont = automaton_.nodes[call.target].pure_return
                         ? elem.parent
                         : static_cast<int32_t>(intern_elem(call.target, elem.parent));
      uint32_t child = intern_elem(automaton_.rule_start[call.rule], cont);
      if (mark(child)) todo_.push_back(child);
    }
    if (node.final) {
      if (elem.parent == kRootParent) {
        flags |= kCanFinish;
      } else if (elem.parent == kSentinelParent) {
        flags |= kHitSentinel;
      } else if (mark(static_cast<uint32_t>(elem.parent))) {
        todo_.push_back(static_cast<uint32_t>(elem.parent));
      }
    }
  }
  std::sort(ready.begin(), ready.end());
  Closure& result = closures_[start];
  result.begin = static_cast<uint32_t>(closure_storage_.size());
  result.size = static_cast<uint32_t>(ready.size());
  result.flags = flags;
  result.computed = true;
  closure_storage_.insert(closure_storage_.end(), ready.begin(), ready.end());
  return result;
}

int32_t StackPool::intern_set(std::vector<uint32_t>& ready, uint8_t flags) {
  std::sort(ready.begin(), ready.end());
  ready.erase(std::unique(ready.begin(), ready.end()), ready.end());
  if (ready.empty() && flags == 0) return kDeadSet;
  if (ready.size() > limits_.max_parallel_stacks) {
    DI_THROW("grammar matcher exceeded ", limits_.max_parallel_stacks,
             " parallel parse stacks (the grammar is too ambiguous)");
  }
  uint64_t h = hash_set(ready, flags);
  auto range = set_ids_.equal_range(h);
  for (auto it = range.first; it != range.second; ++it) {
    const SetInfo& info = sets_[static_cast<size_t>(it->second)];
    if (info.flags == flags && info.size == ready.size() &&
        std::equal(ready.begin(), ready.end(), set_storage_.begin() + info.begin)) {
      return it->second;
    }
  }
  SetInfo info{static_cast<uint32_t>(set_storage_.size()), static_cast<uint32_t>(ready.size()),
               flags};
  set_storage_.insert(set_storage_.end(), ready.begin(), ready.end());
  auto id = static_cast<int32_t>(sets_.size());
  sets_.push_back(info);
  set_ids_.emplace(h, id);
  return id;
}

int32_t StackPool::initial_set() {
  uint32_t root = intern_elem(automaton_.start_node(), kRootParent);
  const Closure& c = closure(root);
  std::vector<uint32_t> ready(closure_storage_.begin() + c.begin,
                              closure_storage_.begin() + c.begin + c.size);
  return intern_set(ready, c.flags);
}

int32_t StackPool::single_set(uint32_t node, int32_t parent) {
  return single_set_of_elem(intern_elem(node, parent));
}

int32_t StackPool::single_set_of_elem(uint32_t elem) {
  std::vector<uint32_t> ready = {elem};
  return intern_set(ready, 0);
}

int32_t StackPool::compute_step(int32_t set, uint8_t byte) {
  SetInfo* info = &sets_[static_cast<size_t>(set)];
  uint64_t sparse_key = 0;
  if (dense_) {
    if (info->dense_row >= 0) {
      int32_t cached = dense_rows_[static_cast<size_t>(info->dense_row) * 256 + byte];
      if (cached != kNotComputed) return cached;
    } else {
      info->dense_row = static_cast<int32_t>(dense_rows_.size() / 256);
      dense_rows_.resize(dense_rows_.size() + 256, kNotComputed);
    }
  } else {
    sparse_key = (static_cast<uint64_t>(static_cast<uint32_t>(set)) << 8) | byte;
    auto it = sparse_transitions_.find(sparse_key);
    if (it != sparse_transitions_.end()) return it->second;
  }
  std::vector<uint32_t>& next = step_next_;
  next.clear();
  uint8_t flags = 0;
  // Copy: interning below may grow set_storage_.
  std::vector<uint32_t>& ready = step_ready_;
  ready.assign(set_storage_.begin() + info->begin, set_storage_.begin() + info->begin + info->size);
  for (uint32_t e : ready) {
    const StackElem elem = elems_[e];
    const AutomatonNode& node = automaton_.nodes[elem.node];
    for (uint32_t i = node.byte_begin; i < node.byte_end; ++i) {
      const ByteEdge& edge = automaton_.byte_edges[i];
      if (byte < edge.lo) {
        if (node.deterministic) break;
        continue;
      }
      if (byte > edge.hi) continue;
      uint32_t moved = intern_elem(edge.target, elem.parent);
      const Closure& c = closure(moved);
      next.insert(next.end(), closure_storage_.begin() + c.begin,
                  closure_storage_.begin() + c.begin + c.size);
      flags |= c.flags;
      if (node.deterministic) break;
    }
  }
  int32_t result = intern_set(next, flags);
  if (dense_) {
    dense_rows_[static_cast<size_t>(sets_[static_cast<size_t>(set)].dense_row) * 256 + byte] =
        result;
  } else {
    sparse_transitions_.emplace(sparse_key, result);
  }
  return result;
}

int32_t StackPool::step_bytes(int32_t set, std::span<const uint8_t> bytes) {
  for (uint8_t b : bytes) {
    if (set == kDeadSet) return kDeadSet;
    set = step(set, b);
  }
  return set;
}

size_t StackPool::memory_bytes() const {
  return elems_.capacity() * sizeof(StackElem) + elem_ids_.size() * 32 +
         closures_.capacity() * sizeof(Closure) + closure_storage_.capacity() * 4 +
         sets_.capacity() * sizeof(SetInfo) + set_storage_.capacity() * 4 + set_ids_.size() * 32 +
         dense_rows_.capacity() * 4 + sparse_transitions_.size() * 32;
}

}  // namespace deepinfer::structured
