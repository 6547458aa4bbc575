#include "tokenizer/streaming_detokenizer.h"

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {

StreamingDetokenizer::StreamingDetokenizer(Tokenizer tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_tokens_(skip_special_tokens) {}

std::string StreamingDetokenizer::push(int32_t id) {
  if (id < 0) DI_THROW("streaming detokenizer: id ", id, " is negative");
  if (id >= tokenizer_.vocab_size()) return {};  // a padded model row: decodes to nothing
  if (!(skip_special_tokens_ && tokenizer_.is_special(id))) pending_ += tokenizer_.token_bytes(id);
  return release();
}

std::string StreamingDetokenizer::push(std::span<const int32_t> ids) {
  std::string out;
  for (const int32_t id : ids) out += push(id);
  return out;
}

std::string StreamingDetokenizer::release() {
  // Everything before an unfinished-but-well-formed tail decodes the same whatever follows.
  const std::size_t hold = incomplete_utf8_tail(pending_);
  const std::size_t ready = pending_.size() - hold;
  if (ready == 0) return {};
  std::string_view head(pending_.data(), ready);
  std::string out = is_valid_utf8(head) ? std::string(head) : utf8_lossy(head);
  pending_.erase(0, ready);
  return out;
}

std::string StreamingDetokenizer::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace deepinfer::tokenizer
