#include "structured/nfa.h"

#include <algorithm>

#include "core/error.h"
#include "structured/byte_dfa.h"

namespace deepinfer::structured {

uint32_t Nfa::new_state() {
  if (edges_.size() >= limits_.max_nfa_states) {
    DI_THROW("grammar too large: more than ", limits_.max_nfa_states,
             " automaton states (reduce repetition counts, string lengths or schema size)");
  }
  edges_.emplace_back();
  return static_cast<uint32_t>(edges_.size() - 1);
}

std::pair<uint32_t, uint32_t> Nfa::build(const Expr& expr) {
  uint32_t entry = new_state();
  uint32_t exit = new_state();
  build_into(expr, entry, exit);
  return {entry, exit};
}

void Nfa::build_into(const Expr& expr, uint32_t entry, uint32_t exit) {
  switch (expr.kind) {
    case ExprKind::kEmpty:
      add_epsilon(entry, exit);
      return;
    case ExprKind::kNothing:
      return;
    case ExprKind::kBytes: {
      uint32_t at = entry;
      for (size_t i = 0; i < expr.bytes.size(); ++i) {
        uint32_t next = i + 1 == expr.bytes.size() ? exit : new_state();
        auto b = static_cast<uint8_t>(expr.bytes[i]);
        add_bytes(at, b, b, next);
        at = next;
      }
      return;
    }
    case ExprKind::kByteSet:
      for (int b = 0; b < 256; ++b) {
        if (!expr.byte_set.test(static_cast<size_t>(b))) continue;
        int e = b;
        while (e + 1 < 256 && expr.byte_set.test(static_cast<size_t>(e + 1))) ++e;
        add_bytes(entry, static_cast<uint8_t>(b), static_cast<uint8_t>(e), exit);
        b = e;
      }
      return;
    case ExprKind::kSeq: {
      uint32_t at = entry;
      for (size_t i = 0; i < expr.children.size(); ++i) {
        uint32_t next = i + 1 == expr.children.size() ? exit : new_state();
        build_into(*expr.children[i], at, next);
        at = next;
      }
      return;
    }
    case ExprKind::kAlt:
      for (const auto& child : expr.children) build_into(*child, entry, exit);
      return;
    case ExprKind::kRepeat: {
      const Expr& child = *expr.children[0];
      uint32_t at = entry;
      for (uint32_t i = 0; i < expr.min; ++i) {
        uint32_t next = new_state();
        build_into(child, at, next);
        at = next;
      }
      if (expr.max == kUnbounded) {
        // Loop through a fresh state so the loop cannot be entered from elsewhere.
        uint32_t loop = new_state();
        add_epsilon(at, loop);
        uint32_t body_end = new_state();
        build_into(child, loop, body_end);
        add_epsilon(body_end, loop);
        add_epsilon(loop, exit);
        return;
      }
      // Optional copies, each able to skip straight to the exit: x (x (x)?)? stays linear.
      for (uint32_t i = expr.min; i < expr.max; ++i) {
        add_epsilon(at, exit);
        uint32_t next = i + 1 == expr.max ? exit : new_state();
        build_into(child, at, next);
        at = next;
      }
      if (expr.max == expr.min) add_epsilon(at, exit);
      return;
    }
    case ExprKind::kRuleRef:
      add_call(entry, expr.rule, exit);
      return;
    case ExprKind::kDfa: {
      const ByteDfa& dfa = *expr.dfa;
      std::vector<uint32_t> states(dfa.num_states());
      for (auto& s : states) s = new_state();
      for (size_t s = 0; s < dfa.num_states(); ++s) {
        for (int b = 0; b < 256; ++b) {
          int32_t t = dfa.step(static_cast<int32_t>(s), static_cast<uint8_t>(b));
          if (t < 0) continue;
          int e = b;
          while (e + 1 < 256 && dfa.step(static_cast<int32_t>(s), static_cast<uint8_t>(e + 1)) == t)
            ++e;
          add_bytes(states[s], static_cast<uint8_t>(b), static_cast<uint8_t>(e),
                    states[static_cast<size_t>(t)]);
          b = e;
        }
        if (dfa.accepting[s]) add_epsilon(states[s], exit);
      }
      add_epsilon(entry, states[static_cast<size_t>(dfa.start)]);
      return;
    }
  }
}

std::vector<uint32_t> Nfa::epsilon_closure(std::vector<uint32_t> states) const {
  std::vector<uint32_t> stack = states;
  std::vector<uint32_t> seen = std::move(states);
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  while (!stack.empty()) {
    uint32_t s = stack.back();
    stack.pop_back();
    for (const auto& edge : edges_[s]) {
      if (edge.kind != NfaEdgeKind::kEpsilon) continue;
      auto it = std::lower_bound(seen.begin(), seen.end(), edge.target);
      if (it != seen.end() && *it == edge.target) continue;
      seen.insert(it, edge.target);
      stack.push_back(edge.target);
    }
  }
  return seen;
}

}  // namespace deepinfer::structured
