// Structured outputs for the engine: the vocabulary index of a tokenizer (cached per
// tokenizer content, process-wide, because building it sorts the whole vocabulary) and
// compiled grammars (cached per vocabulary index and so_args, since requests repeat schemas).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "deepinfer/sampling_params.h"
#include "structured/compiled_grammar.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::engine {

// The grammar engine's view of `tokenizer` over the model's `model_vocab` rows: model rows
// past the tokenizer have no text (never allowed); `stop_token_ids` (the model's EOS ids) are
// allowed only when the document is complete; other special tokens never.
std::shared_ptr<const structured::VocabIndex> vocab_index_for(
    const tokenizer::Tokenizer& tokenizer, int64_t model_vocab,
    std::span<const int32_t> stop_token_ids);

// Compiles so_args against `vocab`; throws Error naming the problem (unknown schema_type,
// malformed schema, unsupported keyword, empty language).
structured::CompiledGrammar compile_structured_output(
    const StructuredOutputArgs& so_args,
    const std::shared_ptr<const structured::VocabIndex>& vocab);

}  // namespace deepinfer::engine
