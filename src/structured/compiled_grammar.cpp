#include "structured/compiled_grammar.h"

#include "core/error.h"
#include "structured/ebnf.h"
#include "structured/regex.h"

namespace deepinfer::structured {

GrammarType parse_grammar_type(const std::string& name) {
  if (name == "regex") return GrammarType::kRegex;
  if (name == "json" || name == "json_schema") return GrammarType::kJsonSchema;
  if (name == "ebnf" || name == "gbnf") return GrammarType::kEbnf;
  if (name == "any_json" || name == "json_object") return GrammarType::kAnyJson;
  DI_THROW("unknown schema_type '", name, "' (expected regex, json, ebnf or any_json)");
}

Grammar to_grammar(const GrammarSpec& spec) {
  switch (spec.type) {
    case GrammarType::kRegex: {
      Grammar grammar;
      grammar.root = grammar.add_rule("root", regex_to_expr(spec.text, RegexMode::kFullMatch,
                                                            TextEncoding::kUtf8, spec.limits));
      return grammar;
    }
    case GrammarType::kJsonSchema:
      return json_schema_to_grammar(std::string_view(spec.text), spec.json_options, spec.limits);
    case GrammarType::kEbnf:
      return ebnf_to_grammar(spec.text, spec.limits);
    case GrammarType::kAnyJson:
      return any_json_grammar(spec.json_options);
  }
  DI_THROW("unknown grammar type");
}

size_t CompiledGrammar::memory_bytes() const {
  const Automaton& a = state_->automaton;
  size_t bytes = a.nodes.capacity() * sizeof(AutomatonNode) +
                 a.byte_edges.capacity() * sizeof(ByteEdge) +
                 a.call_edges.capacity() * sizeof(CallEdge);
  for (const auto& m : state_->masks) bytes += m.memory_bytes() + sizeof(NodeTokenMask);
  return bytes;
}

CompiledGrammar compile_grammar(const GrammarSpec& spec, std::shared_ptr<const VocabIndex> vocab,
                                const CompileOptions& options) {
  auto state = std::make_shared<CompiledGrammar::State>();
  state->limits = spec.limits;
  state->automaton = build_automaton(to_grammar(spec), spec.limits);
  if (state->automaton.empty_language && !options.allow_empty_language) {
    DI_THROW("the grammar accepts no document at all (contradictory constraints?)");
  }
  state->vocab = std::move(vocab);
  state->masks =
      build_token_mask_cache(state->automaton, *state->vocab, state->limits, options.num_threads);
  CompiledGrammar out;
  out.state_ = std::move(state);
  return out;
}

CompiledGrammar compile_grammar(const GrammarSpec& spec, const TokenizerVocab& vocab,
                                const CompileOptions& options) {
  return compile_grammar(spec, std::make_shared<const VocabIndex>(vocab), options);
}

}  // namespace deepinfer::structured
