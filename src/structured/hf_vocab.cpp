#include "structured/hf_vocab.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "structured/utf8_ranges.h"

namespace deepinfer::structured {
namespace {

// GPT-2's reversible map from bytes to printable code points, inverted.
std::vector<int> unicode_to_byte() {
  std::vector<int> table(512, -1);
  std::vector<int> printable;
  for (int b = '!'; b <= '~'; ++b) printable.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) printable.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) printable.push_back(b);
  std::vector<bool> is_printable(256, false);
  for (int b : printable) {
    is_printable[static_cast<size_t>(b)] = true;
    table[static_cast<size_t>(b)] = b;
  }
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    if (!is_printable[static_cast<size_t>(b)]) table[static_cast<size_t>(next++)] = b;
  }
  return table;
}

}  // namespace

TokenizerVocab load_hf_byte_level_vocab(const std::string& path, size_t vocab_size,
                                        const std::string& stop_token_text) {
  std::ifstream stream(path);
  if (!stream) DI_THROW("cannot open tokenizer file '", path, "'");
  nlohmann::json tokenizer;
  try {
    tokenizer = nlohmann::json::parse(stream);
  } catch (const nlohmann::json::parse_error& e) {
    DI_THROW("tokenizer file '", path, "' is not valid JSON: ", e.what());
  }
  const auto& vocab = tokenizer.at("model").at("vocab");
  size_t max_id = 0;
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    max_id = std::max(max_id, it.value().get<size_t>());
  for (const auto& added : tokenizer.at("added_tokens"))
    max_id = std::max(max_id, added.at("id").get<size_t>());
  TokenizerVocab out;
  out.token_bytes.resize(vocab_size ? vocab_size : max_id + 1);
  static const std::vector<int> kTable = unicode_to_byte();
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    size_t id = it.value().get<size_t>();
    if (id >= out.token_bytes.size()) continue;
    const std::string& text = it.key();
    std::string bytes;
    bool byte_level = true;
    for (size_t pos = 0; pos < text.size() && byte_level;) {
      uint32_t cp;
      byte_level = decode_utf8(text, pos, cp) && cp < kTable.size() && kTable[cp] >= 0;
      if (byte_level) bytes += static_cast<char>(kTable[cp]);
    }
    // Entries outside the byte alphabet are special tokens; added_tokens below defines them.
    if (byte_level) out.token_bytes[id] = std::move(bytes);
  }
  for (const auto& added : tokenizer.at("added_tokens")) {
    auto id = added.at("id").get<int32_t>();
    if (static_cast<size_t>(id) >= out.token_bytes.size()) continue;
    std::string content = added.at("content").get<std::string>();
    out.token_bytes[static_cast<size_t>(id)] = content;
    if (content == stop_token_text) {
      out.stop_token_ids.push_back(id);
    } else if (added.value("special", false)) {
      out.special_token_ids.push_back(id);
    }
  }
  if (!stop_token_text.empty() && out.stop_token_ids.empty()) {
    DI_THROW("tokenizer file '", path, "' has no token '", stop_token_text, "'");
  }
  return out;
}

}  // namespace deepinfer::structured
