// Incremental detokenization for streaming outputs: text is released only at complete UTF-8
// boundaries, and the concatenation of everything released (plus finish()) equals
// Tokenizer::decode of all ids — including U+FFFD for bytes that can never complete.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(Tokenizer tokenizer, bool skip_special_tokens = false);

  // Appends one token; returns the text that became complete (possibly empty).
  std::string push(int32_t id);
  std::string push(std::span<const int32_t> ids);
  // Releases whatever is still pending (an unfinished sequence becomes U+FFFD) and resets.
  std::string finish();
  // Bytes held back because they may still complete a character.
  std::size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string release();

  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
};

}  // namespace deepinfer::tokenizer
