// Reads token byte strings from a Hugging Face tokenizer.json with a byte-level BPE model
// (GPT-2 bytes_to_unicode alphabet), for tests, benchmarks and the CLI until the tokenizer
// layer provides token_bytes(id).
#pragma once

#include <string>

#include "structured/vocab.h"

namespace deepinfer::structured {

// Rows up to `vocab_size` (0: as many as the file defines); rows without a token stay empty.
// Special added tokens are marked special; `stop_token_text` (e.g. "<｜end▁of▁sentence｜>")
// names the stop token.
TokenizerVocab load_hf_byte_level_vocab(const std::string& tokenizer_json_path, size_t vocab_size,
                                        const std::string& stop_token_text);

}  // namespace deepinfer::structured
