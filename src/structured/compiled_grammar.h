// Public entry points of the structured-output engine.
//
//   auto vocab = std::make_shared<VocabIndex>(TokenizerVocab{...});
//   CompiledGrammar grammar = compile_grammar({GrammarType::kJsonSchema, schema_text}, vocab);
//   GrammarMatcher matcher(grammar);
//   matcher.fill_next_token_bitmask(mask);  // bit i of mask[i / 32] set: token i allowed
//   matcher.accept_token(id);
//   matcher.rollback(k);                    // undo the last k accepted tokens
//
// A CompiledGrammar is immutable and can be shared by many matchers (threads included).
#pragma once

#include <memory>
#include <string>

#include "structured/automaton.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "structured/limits.h"
#include "structured/token_mask_cache.h"
#include "structured/vocab.h"

namespace deepinfer::structured {

enum class GrammarType { kRegex, kJsonSchema, kEbnf, kAnyJson };

struct GrammarSpec {
  GrammarType type = GrammarType::kAnyJson;
  std::string text;
  JsonSchemaOptions json_options = {};
  GrammarLimits limits = {};
};

// "regex" | "json" | "ebnf" | "any_json" (the names SamplingParams' so_args use).
GrammarType parse_grammar_type(const std::string& name);

// Runs the front end only: the grammar over bytes.
Grammar to_grammar(const GrammarSpec& spec);

struct CompileOptions {
  unsigned num_threads = 2;
  // An empty language is an error (nothing could ever be generated) unless allowed here.
  bool allow_empty_language = false;
};

class CompiledGrammar {
 public:
  const Automaton& automaton() const { return state_->automaton; }
  const VocabIndex& vocab() const { return *state_->vocab; }
  const std::vector<NodeTokenMask>& mask_cache() const { return state_->masks; }
  const GrammarLimits& limits() const { return state_->limits; }
  size_t memory_bytes() const;

 private:
  struct State {
    Automaton automaton;
    std::shared_ptr<const VocabIndex> vocab;
    std::vector<NodeTokenMask> masks;
    GrammarLimits limits;
  };
  std::shared_ptr<const State> state_;
  friend CompiledGrammar compile_grammar(const GrammarSpec&, std::shared_ptr<const VocabIndex>,
                                         const CompileOptions&);
};

CompiledGrammar compile_grammar(const GrammarSpec& spec, std::shared_ptr<const VocabIndex> vocab,
                                const CompileOptions& options = {});
CompiledGrammar compile_grammar(const GrammarSpec& spec, const TokenizerVocab& vocab,
                                const CompileOptions& options = {});

}  // namespace deepinfer::structured
