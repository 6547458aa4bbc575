// The text <-> token-id layer: loads a byte-level BPE tokenizer.json (the format HF tokenizers
// writes and DeepSeek ships) and encodes/decodes exactly as HF tokenizers does.
//
// Invalid UTF-8 policy: encode() first replaces every maximal invalid subpart with U+FFFD
// (what Python's bytes.decode("utf-8", "replace") and Rust's from_utf8_lossy do), so the ids
// equal HF's ids for the repaired string. decode() produces valid UTF-8 the same way.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::tokenizer {

struct TokenizerImpl;

class Tokenizer {
 public:
  // Loads tokenizer.json only: encode(..., true) applies its post_processor.
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json);
  // Loads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json: its bos/eos tokens,
  // add_bos_token/add_eos_token (applied by encode(..., true) as transformers'
  // LlamaTokenizerFast does) and chat_template.
  static Tokenizer from_dir(const std::filesystem::path& dir);

  // `add_special_tokens`: apply the post-processor / BOS-EOS rule. Special-token text inside
  // `text` is always recognised unless `parse_special_tokens` is false (then it is plain text,
  // HF's encode_special_tokens=True) — use that for untrusted user content.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true,
                              bool parse_special_tokens = true) const;
  // Encodes every text on `num_threads` threads (0: all hardware threads).
  std::vector<std::vector<int32_t>> encode_batch(std::span<const std::string> texts,
                                                 bool add_special_tokens = true,
                                                 unsigned num_threads = 0) const;
  // Throws Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One past the largest id (model vocabulary and added tokens together).
  int32_t vocab_size() const;
  // The raw bytes id contributes to a decode (may be a partial UTF-8 sequence); empty for an
  // id that has no token.
  const std::string& token_bytes(int32_t id) const;
  // The token's spelling in tokenizer.json (byte-level characters for model tokens).
  const std::string& id_to_token(int32_t id) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // tokenizer_config.json's chat_template, if any (see docs/TOKENIZER.md for how it is used).
  const std::optional<std::string>& chat_template() const;

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const TokenizerImpl> impl_;  // immutable: copies share, threads share
};

}  // namespace deepinfer::tokenizer
