#include "structured/automaton.h"

#include <algorithm>
#include <map>
#include <unordered_set>

#include "core/error.h"
#include "structured/nfa.h"

namespace deepinfer::structured {
namespace {

struct LocalNode {
  std::vector<ByteEdge> bytes;
  std::vector<CallEdge> calls;  // rule ids are global, targets local
  bool final = false;
  bool deterministic = false;
};

void collect_refs(const Expr& expr, std::vector<uint32_t>& out) {
  if (expr.kind == ExprKind::kRuleRef) out.push_back(expr.rule);
  for (const auto& child : expr.children) collect_refs(*child, out);
}

// Subset construction over byte ranges and call symbols. Returns false when the rule's DFA
// would exceed the limit; the caller then keeps the epsilon-free NFA.
bool determinize(const Nfa& nfa, uint32_t entry, uint32_t exit, size_t limit,
                 std::vector<LocalNode>& out) {
  out.clear();
  std::map<std::vector<uint32_t>, uint32_t> ids;
  std::vector<std::vector<uint32_t>> pending;
  bool too_big = false;
  auto intern = [&](std::vector<uint32_t> set) -> uint32_t {
    auto it = ids.find(set);
    if (it != ids.end()) return it->second;
    if (out.size() >= limit) {
      too_big = true;
      return 0;
    }
    LocalNode node;
    node.final = std::binary_search(set.begin(), set.end(), exit);
    node.deterministic = true;
    out.push_back(std::move(node));
    auto id = static_cast<uint32_t>(out.size() - 1);
    ids.emplace(set, id);
    pending.push_back(std::move(set));
    return id;
  };
  intern(nfa.epsilon_closure({entry}));
  for (size_t index = 0; index < pending.size() && !too_big; ++index) {
    const std::vector<uint32_t> set = pending[index];
    std::map<uint32_t, std::vector<uint32_t>> calls;
    std::vector<uint32_t> bounds;
    struct Range {
      int lo, hi;
      uint32_t target;
    };
    std::vector<Range> ranges;
    for (uint32_t s : set) {
      for (const auto& edge : nfa.edges(s)) {
        if (edge.kind == NfaEdgeKind::kCall) {
          calls[edge.rule].push_back(edge.target);
        } else if (edge.kind == NfaEdgeKind::kByteRange) {
          ranges.push_back({edge.lo, edge.hi, edge.target});
          bounds.push_back(edge.lo);
          bounds.push_back(static_cast<uint32_t>(edge.hi) + 1);
        }
      }
    }
    for (auto& [rule, targets] : calls) {
      uint32_t target = intern(nfa.epsilon_closure(targets));
      out[index].calls.push_back({rule, target});
    }
    std::sort(bounds.begin(), bounds.end());
    bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
    std::vector<ByteEdge> edges;
    std::vector<uint32_t> last_move;
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
      int lo = static_cast<int>(bounds[i]);
      int hi = static_cast<int>(bounds[i + 1]) - 1;
      std::vector<uint32_t> move;
      for (const auto& r : ranges) {
        if (r.lo <= lo && hi <= r.hi) move.push_back(r.target);
      }
      if (move.empty()) continue;
      std::sort(move.begin(), move.end());
      move.erase(std::unique(move.begin(), move.end()), move.end());
      if (!edges.empty() && edges.back().hi + 1 == lo && move == last_move) {
        edges.back().hi = static_cast<uint8_t>(hi);
        continue;
      }
      uint32_t target = intern(nfa.epsilon_closure(move));
      edges.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), target});
      last_move = std::move(move);
    }
    out[index].bytes = std::move(edges);
  }
  return !too_big;
}

// Moore partition refinement: merges equivalent DFA states (e.g. "just after the opening quote"
// and "after a character" of a string), so the token mask cache analyses each position once.
void minimize(std::vector<LocalNode>& nodes) {
  const size_t n = nodes.size();
  if (n < 2) return;
  std::vector<uint32_t> cls(n);
  for (size_t s = 0; s < n; ++s) cls[s] = nodes[s].final ? 1 : 0;
  size_t num_classes = 0;
  while (true) {
    std::map<std::vector<int64_t>, uint32_t> ids;
    std::vector<uint32_t> next(n);
    for (size_t s = 0; s < n; ++s) {
      std::vector<int64_t> signature = {cls[s]};
      for (const auto& e : nodes[s].bytes) {
        signature.push_back(e.lo);
        signature.push_back(e.hi);
        signature.push_back(cls[e.target]);
      }
      signature.push_back(-1);
      std::vector<std::pair<uint32_t, uint32_t>> calls;
      for (const auto& c : nodes[s].calls) calls.emplace_back(c.rule, cls[c.target]);
      std::sort(calls.begin(), calls.end());
      for (auto [rule, target] : calls) {
        signature.push_back(rule);
        signature.push_back(target);
      }
      next[s] = ids.emplace(std::move(signature), static_cast<uint32_t>(ids.size())).first->second;
    }
    cls = std::move(next);
    if (ids.size() == num_classes) break;
    num_classes = ids.size();
  }
  if (num_classes == n) return;
  // Renumber so the start state stays 0, then merge adjacent ranges with equal targets.
  std::vector<uint32_t> order(num_classes, UINT32_MAX);
  uint32_t used = 0;
  for (size_t s = 0; s < n; ++s) {
    if (order[cls[s]] == UINT32_MAX) order[cls[s]] = used++;
  }
  std::vector<LocalNode> out(num_classes);
  std::vector<uint8_t> filled(num_classes, 0);
  for (size_t s = 0; s < n; ++s) {
    uint32_t c = order[cls[s]];
    if (filled[c]) continue;
    filled[c] = 1;
    LocalNode node;
    node.final = nodes[s].final;
    node.deterministic = true;
    for (const auto& e : nodes[s].bytes) {
      uint32_t target = order[cls[e.target]];
      if (!node.bytes.empty() && node.bytes.back().hi + 1 == e.lo &&
          node.bytes.back().target == target) {
        node.bytes.back().hi = e.hi;
      } else {
        node.bytes.push_back({e.lo, e.hi, target});
      }
    }
    for (const auto& call : nodes[s].calls)
      node.calls.push_back({call.rule, order[cls[call.target]]});
    out[c] = std::move(node);
  }
  nodes = std::move(out);
}

// Each NFA state reached by a consuming edge becomes a node carrying its epsilon closure's edges.
void epsilon_free(const Nfa& nfa, uint32_t entry, uint32_t exit, std::vector<LocalNode>& out) {
  out.clear();
  std::map<uint32_t, uint32_t> ids;
  std::vector<uint32_t> pending;
  auto intern = [&](uint32_t state) -> uint32_t {
    auto it = ids.find(state);
    if (it != ids.end()) return it->second;
    out.emplace_back();
    auto id = static_cast<uint32_t>(out.size() - 1);
    ids.emplace(state, id);
    pending.push_back(state);
    return id;
  };
  intern(entry);
  for (size_t index = 0; index < pending.size(); ++index) {
    auto closure = nfa.epsilon_closure({pending[index]});
    LocalNode node;
    node.final = std::binary_search(closure.begin(), closure.end(), exit);
    for (uint32_t s : closure) {
      for (const auto& edge : nfa.edges(s)) {
        if (edge.kind == NfaEdgeKind::kCall) {
          node.calls.push_back({edge.rule, intern(edge.target)});
        } else if (edge.kind == NfaEdgeKind::kByteRange) {
          node.bytes.push_back({edge.lo, edge.hi, intern(edge.target)});
        }
      }
    }
    out[index] = std::move(node);
  }
}

}  // namespace

Automaton build_automaton(const Grammar& grammar, const GrammarLimits& limits) {
  const size_t num_rules = grammar.rules.size();
  if (num_rules == 0) DI_THROW("grammar has no rules");
  if (num_rules > limits.max_rules) {
    DI_THROW("grammar has ", num_rules, " rules; the limit is ", limits.max_rules);
  }
  // Rules reachable from the root.
  std::vector<uint8_t> reachable(num_rules, 0);
  std::vector<uint32_t> stack = {grammar.root};
  reachable[grammar.root] = 1;
  while (!stack.empty()) {
    uint32_t r = stack.back();
    stack.pop_back();
    if (!grammar.rules[r].body) DI_THROW("rule '", grammar.rules[r].name, "' is never defined");
    std::vector<uint32_t> refs;
    collect_refs(*grammar.rules[r].body, refs);
    for (uint32_t ref : refs) {
      if (ref >= num_rules)
        DI_THROW("rule '", grammar.rules[r].name, "' references rule #", ref,
                 " which does not exist");
      if (!reachable[ref]) {
        reachable[ref] = 1;
        stack.push_back(ref);
      }
    }
  }

  std::vector<std::vector<LocalNode>> local(num_rules);
  size_t total_states = 0;
  for (uint32_t r = 0; r < num_rules; ++r) {
    if (!reachable[r]) continue;
    Nfa nfa(limits);
    auto [entry, exit] = nfa.build(*grammar.rules[r].body);
    if (determinize(nfa, entry, exit, limits.max_dfa_states_per_rule, local[r])) {
      minimize(local[r]);
    } else {
      epsilon_free(nfa, entry, exit, local[r]);
    }
    total_states += local[r].size();
    if (total_states > limits.max_nfa_states) {
      DI_THROW("grammar too large: more than ", limits.max_nfa_states, " automaton states");
    }
  }

  // Productivity: a node is productive if some finite string takes it to completion.
  std::vector<std::vector<uint8_t>> productive(num_rules);
  for (uint32_t r = 0; r < num_rules; ++r) productive[r].assign(local[r].size(), 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t r = 0; r < num_rules; ++r) {
      for (size_t n = 0; n < local[r].size(); ++n) {
        if (productive[r][n]) continue;
        const LocalNode& node = local[r][n];
        bool p = node.final;
        for (const auto& e : node.bytes) p = p || productive[r][e.target];
        for (const auto& c : node.calls) {
          p = p || (!local[c.rule].empty() && productive[c.rule][0] && productive[r][c.target]);
        }
        if (p) {
          productive[r][n] = 1;
          changed = true;
        }
      }
    }
  }
  auto rule_productive = [&](uint32_t rule) { return !local[rule].empty() && productive[rule][0]; };

  Automaton out;
  out.root_rule = grammar.root;
  out.rule_start.assign(num_rules, UINT32_MAX);
  for (const auto& rule : grammar.rules) out.rule_names.push_back(rule.name);
  if (!rule_productive(grammar.root)) {
    out.empty_language = true;
    out.rule_start[grammar.root] = 0;
    out.nodes.push_back(AutomatonNode{0, 0, 0, 0, grammar.root, false, false, true});
    return out;
  }

  // Nullable rules and the left-call graph, for left-recursion detection.
  std::vector<uint8_t> nullable(num_rules, 0);
  auto epsilon_reach = [&](uint32_t r, auto&& on_call) {
    // Nodes reachable from the start of r without consuming bytes.
    std::vector<uint8_t> seen(local[r].size(), 0);
    std::vector<uint32_t> todo = {0};
    seen[0] = 1;
    bool reaches_final = false;
    while (!todo.empty()) {
      uint32_t n = todo.back();
      todo.pop_back();
      const LocalNode& node = local[r][n];
      if (node.final) reaches_final = true;
      for (const auto& c : node.calls) {
        if (!rule_productive(c.rule) || !productive[r][c.target]) continue;
        on_call(c.rule);
        if (nullable[c.rule] && !seen[c.target]) {
          seen[c.target] = 1;
          todo.push_back(c.target);
        }
      }
    }
    return reaches_final;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t r = 0; r < num_rules; ++r) {
      if (local[r].empty() || nullable[r]) continue;
      if (epsilon_reach(r, [](uint32_t) {})) {
        nullable[r] = 1;
        changed = true;
      }
    }
  }
  std::vector<std::vector<uint32_t>> left_calls(num_rules);
  for (uint32_t r = 0; r < num_rules; ++r) {
    if (local[r].empty()) continue;
    epsilon_reach(r, [&](uint32_t callee) { left_calls[r].push_back(callee); });
  }
  {
    std::vector<uint8_t> color(num_rules, 0);  // 0 new, 1 on stack, 2 done
    std::vector<uint32_t> path;
    auto dfs = [&](auto&& self, uint32_t r) -> void {
      color[r] = 1;
      path.push_back(r);
      for (uint32_t callee : left_calls[r]) {
        if (color[callee] == 1) {
          std::string cycle;
          auto it = std::find(path.begin(), path.end(), callee);
          for (; it != path.end(); ++it) cycle += grammar.rules[*it].name + " -> ";
          cycle += grammar.rules[callee].name;
          DI_THROW("left recursion is not supported: ", cycle,
                   " (rewrite it as repetition, e.g. a ::= b (\"+\" b)*)");
        }
        if (color[callee] == 0) self(self, callee);
      }
      path.pop_back();
      color[r] = 2;
    };
    for (uint32_t r = 0; r < num_rules; ++r) {
      if (!local[r].empty() && color[r] == 0) dfs(dfs, r);
    }
  }

  // Lay out productive nodes reachable from each rule's start, rules in order.
  std::vector<std::vector<uint32_t>> global_id(num_rules);
  for (uint32_t r = 0; r < num_rules; ++r) {
    if (!rule_productive(r)) continue;
    global_id[r].assign(local[r].size(), UINT32_MAX);
    std::vector<uint32_t> order = {0};
    global_id[r][0] = static_cast<uint32_t>(out.nodes.size());
    out.nodes.emplace_back();
    for (size_t i = 0; i < order.size(); ++i) {
      const LocalNode& node = local[r][order[i]];
      auto visit = [&](uint32_t target) {
        if (!productive[r][target] || global_id[r][target] != UINT32_MAX) return;
        global_id[r][target] = static_cast<uint32_t>(out.nodes.size());
        out.nodes.emplace_back();
        order.push_back(target);
      };
      for (const auto& e : node.bytes) visit(e.target);
      for (const auto& c : node.calls) {
        if (rule_productive(c.rule)) visit(c.target);
      }
    }
    out.rule_start[r] = global_id[r][0];
  }
  for (uint32_t r = 0; r < num_rules; ++r) {
    if (!rule_productive(r)) continue;
    for (size_t n = 0; n < local[r].size(); ++n) {
      uint32_t g = global_id[r][n];
      if (g == UINT32_MAX) continue;
      const LocalNode& node = local[r][n];
      AutomatonNode& dst = out.nodes[g];
      dst.rule = r;
      dst.final = node.final;
      dst.deterministic = node.deterministic;
      dst.byte_begin = static_cast<uint32_t>(out.byte_edges.size());
      for (const auto& e : node.bytes) {
        if (productive[r][e.target]) out.byte_edges.push_back({e.lo, e.hi, global_id[r][e.target]});
      }
      dst.byte_end = static_cast<uint32_t>(out.byte_edges.size());
      dst.call_begin = static_cast<uint32_t>(out.call_edges.size());
      for (const auto& c : node.calls) {
        if (rule_productive(c.rule) && productive[r][c.target]) {
          out.call_edges.push_back({c.rule, global_id[r][c.target]});
        }
      }
      dst.call_end = static_cast<uint32_t>(out.call_edges.size());
    }
  }
  // Call targets refer to the callee's start node after layout.
  for (auto& node : out.nodes) {
    node.pure_return =
        node.final && node.byte_begin == node.byte_end && node.call_begin == node.call_end;
  }
  return out;
}

}  // namespace deepinfer::structured
