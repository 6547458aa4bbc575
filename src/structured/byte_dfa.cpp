#include "structured/byte_dfa.h"

#include <algorithm>
#include <map>
#include <utility>

#include "core/error.h"
#include "structured/nfa.h"

namespace deepinfer::structured {

int32_t ByteDfa::add_state(bool is_accepting) {
  next.resize(next.size() + 256, -1);
  accepting.push_back(is_accepting ? 1 : 0);
  return static_cast<int32_t>(accepting.size() - 1);
}

bool ByteDfa::matches(std::string_view text) const {
  int32_t state = start;
  for (char c : text) {
    state = step(state, static_cast<uint8_t>(c));
    if (state < 0) return false;
  }
  return accepting[static_cast<size_t>(state)] != 0;
}

bool ByteDfa::is_empty() const {
  std::vector<uint8_t> seen(num_states(), 0);
  std::vector<int32_t> stack = {start};
  seen[static_cast<size_t>(start)] = 1;
  while (!stack.empty()) {
    int32_t s = stack.back();
    stack.pop_back();
    if (accepting[static_cast<size_t>(s)]) return false;
    for (int b = 0; b < 256; ++b) {
      int32_t t = step(s, static_cast<uint8_t>(b));
      if (t >= 0 && !seen[static_cast<size_t>(t)]) {
        seen[static_cast<size_t>(t)] = 1;
        stack.push_back(t);
      }
    }
  }
  return true;
}

ByteDfa dfa_from_expr(const Expr& expr, const GrammarLimits& limits) {
  Nfa nfa(limits);
  auto [entry, exit] = nfa.build(expr);
  for (uint32_t s = 0; s < nfa.num_states(); ++s) {
    for (const auto& edge : nfa.edges(s)) {
      if (edge.kind == NfaEdgeKind::kCall) {
        DI_THROW("internal: a byte automaton cannot contain rule references");
      }
    }
  }
  ByteDfa dfa;
  std::map<std::vector<uint32_t>, int32_t> ids;
  std::vector<std::vector<uint32_t>> pending;
  auto intern = [&](std::vector<uint32_t> set) -> int32_t {
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    if (dfa.num_states() >= limits.max_byte_dfa_states) {
      DI_THROW("constraint too complex: its automaton exceeds ", limits.max_byte_dfa_states,
               " states");
    }
    bool accepting = std::binary_search(set.begin(), set.end(), exit);
    int32_t id = dfa.add_state(accepting);
    ids.emplace(set, id);
    pending.push_back(std::move(set));
    return id;
  };
  dfa.start = intern(nfa.epsilon_closure({entry}));
  for (size_t index = 0; index < pending.size(); ++index) {
    std::vector<uint32_t> set = pending[index];
    std::vector<std::vector<uint32_t>> moves(256);
    for (uint32_t s : set) {
      for (const auto& edge : nfa.edges(s)) {
        if (edge.kind != NfaEdgeKind::kByteRange) continue;
        for (int b = edge.lo; b <= edge.hi; ++b)
          moves[static_cast<size_t>(b)].push_back(edge.target);
      }
    }
    std::map<std::vector<uint32_t>, int32_t> local;  // byte sets often share targets
    for (int b = 0; b < 256; ++b) {
      auto& move = moves[static_cast<size_t>(b)];
      if (move.empty()) continue;
      auto found = local.find(move);
      int32_t target;
      if (found != local.end()) {
        target = found->second;
      } else {
        target = intern(nfa.epsilon_closure(move));
        local.emplace(move, target);
      }
      dfa.next[index * 256 + static_cast<size_t>(b)] = target;
    }
  }
  return dfa;
}

ByteDfa dfa_intersect(const ByteDfa& a, const ByteDfa& b, const GrammarLimits& limits) {
  ByteDfa out;
  std::map<std::pair<int32_t, int32_t>, int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> pending;
  auto intern = [&](int32_t x, int32_t y) -> int32_t {
    auto it = ids.find({x, y});
    if (it != ids.end()) return it->second;
    if (out.num_states() >= limits.max_byte_dfa_states) {
      DI_THROW("constraint too complex: combining constraints exceeds ", limits.max_byte_dfa_states,
               " automaton states");
    }
    int32_t id =
        out.add_state(a.accepting[static_cast<size_t>(x)] && b.accepting[static_cast<size_t>(y)]);
    ids.emplace(std::make_pair(x, y), id);
    pending.emplace_back(x, y);
    return id;
  };
  out.start = intern(a.start, b.start);
  for (size_t index = 0; index < pending.size(); ++index) {
    auto [x, y] = pending[index];
    for (int c = 0; c < 256; ++c) {
      int32_t tx = a.step(x, static_cast<uint8_t>(c));
      int32_t ty = b.step(y, static_cast<uint8_t>(c));
      if (tx < 0 || ty < 0) continue;
      out.next[index * 256 + static_cast<size_t>(c)] = intern(tx, ty);
    }
  }
  return dfa_trim(out);
}

ByteDfa dfa_complement(const ByteDfa& a) {
  ByteDfa out = a;
  int32_t sink = out.add_state(false);
  for (auto& t : out.next) {
    if (t < 0) t = sink;
  }
  for (auto& acc : out.accepting) acc = acc ? 0 : 1;
  return out;
}

ByteDfa dfa_trim(const ByteDfa& a) {
  size_t n = a.num_states();
  // Reverse reachability from accepting states.
  std::vector<std::vector<int32_t>> reverse(n);
  for (size_t s = 0; s < n; ++s) {
    for (int c = 0; c < 256; ++c) {
      int32_t t = a.step(static_cast<int32_t>(s), static_cast<uint8_t>(c));
      if (t >= 0) reverse[static_cast<size_t>(t)].push_back(static_cast<int32_t>(s));
    }
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> stack;
  for (size_t s = 0; s < n; ++s) {
    if (a.accepting[s]) {
      live[s] = 1;
      stack.push_back(static_cast<int32_t>(s));
    }
  }
  while (!stack.empty()) {
    int32_t s = stack.back();
    stack.pop_back();
    for (int32_t p : reverse[static_cast<size_t>(s)]) {
      if (!live[static_cast<size_t>(p)]) {
        live[static_cast<size_t>(p)] = 1;
        stack.push_back(p);
      }
    }
  }
  ByteDfa out;
  std::vector<int32_t> remap(n, -1);
  out.start = out.add_state(a.accepting[static_cast<size_t>(a.start)] != 0);
  remap[static_cast<size_t>(a.start)] = out.start;
  for (size_t s = 0; s < n; ++s) {
    if (live[s] && remap[s] < 0) remap[s] = out.add_state(a.accepting[s] != 0);
  }
  for (size_t s = 0; s < n; ++s) {
    if (remap[s] < 0) continue;
    for (int c = 0; c < 256; ++c) {
      int32_t t = a.step(static_cast<int32_t>(s), static_cast<uint8_t>(c));
      if (t >= 0 && live[static_cast<size_t>(t)]) {
        out.next[static_cast<size_t>(remap[s]) * 256 + static_cast<size_t>(c)] =
            remap[static_cast<size_t>(t)];
      }
    }
  }
  return out;
}

}  // namespace deepinfer::structured
