#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/logging.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {

struct TokenizerImpl {
  BpeModel model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::vector<AddedToken> added_tokens;  // in tokenizer.json order
  AddedTokenMatcher raw_matcher;         // tokens with normalized == false
  AddedTokenMatcher normalized_matcher;  // tokens with normalized == true
  std::vector<int32_t> prefix_ids;       // post-processing of a single sequence
  std::vector<int32_t> suffix_ids;
  int32_t vocab_size = 0;
  std::vector<std::string> tokens;  // id -> spelling
  std::vector<std::string> bytes;   // id -> decoded bytes
  std::vector<uint8_t> flags;       // id -> kSpecial | kAdded
  std::unordered_map<std::string, int32_t> token_ids;
  std::optional<int32_t> bos;
  std::optional<int32_t> eos;
  std::optional<std::string> chat_template;

  static constexpr uint8_t kSpecial = 1;
  static constexpr uint8_t kAdded = 2;

  void encode_into(std::string_view text, bool add_special_tokens, bool parse_special,
                   std::vector<int32_t>& ids) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const;
};

namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) DI_THROW(path.string(), ": cannot open");
  std::stringstream buffer;
  buffer << file.rdbuf();
  try {
    return nlohmann::json::parse(buffer.str());
  } catch (const nlohmann::json::parse_error& e) {
    DI_THROW(path.string(), ": not valid JSON: ", e.what());
  }
}

std::vector<int32_t> template_ids(const nlohmann::json& items, const nlohmann::json& special_tokens,
                                  bool before_sequence) {
  std::vector<int32_t> ids;
  bool seen_sequence = false;
  for (const auto& item : items) {
    if (item.contains("Sequence")) {
      if (item["Sequence"].value("id", std::string("A")) != "A") {
        DI_THROW("tokenizer.json: post_processor.single refers to sequence B");
      }
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken")) {
      DI_THROW("tokenizer.json: post_processor.single item ", item.dump(), " is not understood");
    }
    if (seen_sequence == before_sequence) continue;
    const std::string name = item["SpecialToken"].at("id").get<std::string>();
    if (!special_tokens.contains(name)) {
      DI_THROW("tokenizer.json: post_processor.special_tokens lacks \"", name, "\"");
    }
    for (const auto& id : special_tokens[name].at("ids")) ids.push_back(id.get<int32_t>());
  }
  return ids;
}

void load_post_processor(const nlohmann::json& spec, const std::string& origin,
                         TokenizerImpl& impl) {
  if (spec.is_null()) return;
  const std::string type = spec.at("type").get<std::string>();
  if (type == "ByteLevel") return;  // only trims offsets; ids are unchanged
  if (type == "Sequence") {
    const auto& list = spec.at("processors");
    for (std::size_t i = 0; i < list.size(); ++i) {
      load_post_processor(list[i], concat(origin, ".processors[", i, "]"), impl);
    }
    return;
  }
  if (type == "TemplateProcessing") {
    const auto& special = spec.value("special_tokens", nlohmann::json::object());
    const auto prefix = template_ids(spec.at("single"), special, true);
    const auto suffix = template_ids(spec.at("single"), special, false);
    impl.prefix_ids.insert(impl.prefix_ids.end(), prefix.begin(), prefix.end());
    impl.suffix_ids.insert(impl.suffix_ids.end(), suffix.begin(), suffix.end());
    return;
  }
  DI_THROW("tokenizer.json: ", origin, ": post-processor type \"", type,
           "\" is not supported (supported: ByteLevel, TemplateProcessing, Sequence)");
}

void check_decoder(const nlohmann::json& spec, const std::string& origin) {
  if (spec.is_null()) {
    DI_THROW("tokenizer.json: ", origin, " is null; only the ByteLevel decoder is supported");
  }
  const std::string type = spec.at("type").get<std::string>();
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const auto& list = spec.at("decoders");
    for (std::size_t i = 0; i < list.size(); ++i) {
      check_decoder(list[i], concat(origin, ".decoders[", i, "]"));
    }
    return;
  }
  DI_THROW("tokenizer.json: ", origin, ": decoder type \"", type,
           "\" is not supported (supported: ByteLevel, Sequence of ByteLevel)");
}

std::shared_ptr<TokenizerImpl> load_tokenizer_json(const std::filesystem::path& path) {
  const nlohmann::json root = read_json(path);
  auto impl = std::make_shared<TokenizerImpl>();
  const std::string name = path.string();
  try {
    if (!root.contains("model")) DI_THROW("the \"model\" object is missing");
    impl->model = BpeModel::from_json(root["model"]);
    impl->normalizer = make_normalizer(root.value("normalizer", nlohmann::json()), "normalizer");
    impl->pre_tokenizer =
        make_pre_tokenizer(root.value("pre_tokenizer", nlohmann::json()), "pre_tokenizer");
    if (!impl->pre_tokenizer || !impl->pre_tokenizer->has_byte_level()) {
      DI_THROW("pre_tokenizer has no ByteLevel step; only byte-level BPE tokenizers are supported");
    }
    load_post_processor(root.value("post_processor", nlohmann::json()), "post_processor", *impl);
    check_decoder(root.value("decoder", nlohmann::json()), "decoder");
    if (root.contains("truncation") && !root["truncation"].is_null()) {
      DI_THROW("\"truncation\" is set; truncation inside the tokenizer is not supported");
    }
  } catch (const Error& e) {
    DI_THROW(name, ": ", e.what());
  } catch (const nlohmann::json::exception& e) {
    DI_THROW(name, ": unexpected structure: ", e.what());
  }

  int32_t max_id = impl->model.max_id();
  for (const auto& entry : root.value("added_tokens", nlohmann::json::array())) {
    AddedToken token;
    try {
      token.id = entry.at("id").get<int32_t>();
      token.content = entry.at("content").get<std::string>();
      token.special = entry.value("special", false);
      token.lstrip = entry.value("lstrip", false);
      token.rstrip = entry.value("rstrip", false);
      token.single_word = entry.value("single_word", false);
      token.normalized = entry.value("normalized", !token.special);
    } catch (const nlohmann::json::exception& e) {
      DI_THROW(name, ": added_tokens entry ", entry.dump(), ": ", e.what());
    }
    if (token.id < 0) DI_THROW(name, ": added token \"", token.content, "\" has a negative id");
    if (token.content.empty()) continue;
    max_id = std::max(max_id, token.id);
    impl->added_tokens.push_back(std::move(token));
  }
  impl->vocab_size = max_id + 1;
  const auto size = static_cast<std::size_t>(impl->vocab_size);
  impl->tokens.assign(size, std::string());
  impl->bytes.assign(size, std::string());
  impl->flags.assign(size, 0);
  for (const auto& [token, id] : impl->model.vocab()) {
    impl->tokens[static_cast<std::size_t>(id)] = token;
    impl->token_ids.emplace(token, id);
  }
  for (const AddedToken& token : impl->added_tokens) {
    const auto id = static_cast<std::size_t>(token.id);
    impl->tokens[id] = token.content;
    impl->token_ids[token.content] = token.id;
    impl->flags[id] =
        static_cast<uint8_t>(TokenizerImpl::kAdded | (token.special ? TokenizerImpl::kSpecial : 0));
  }
  for (std::size_t id = 0; id < size; ++id)
    impl->bytes[id] = byte_level_decode_token(impl->tokens[id]);

  // HF matches special tokens first, then the others, each group in file order.
  std::vector<std::string> raw_patterns;
  std::vector<const AddedToken*> raw_tokens;
  std::vector<std::string> normalized_patterns;
  std::vector<const AddedToken*> normalized_tokens;
  for (const bool special_pass : {true, false}) {
    for (const AddedToken& token : impl->added_tokens) {
      if (token.special != special_pass) continue;
      if (token.normalized) {
        normalized_patterns.push_back(impl->normalizer ? impl->normalizer->apply(token.content)
                                                       : token.content);
        normalized_tokens.push_back(&token);
      } else {
        raw_patterns.push_back(token.content);
        raw_tokens.push_back(&token);
      }
    }
  }
  impl->raw_matcher = AddedTokenMatcher(std::move(raw_patterns), std::move(raw_tokens));
  impl->normalized_matcher =
      AddedTokenMatcher(std::move(normalized_patterns), std::move(normalized_tokens));
  return impl;
}

thread_local PreTokenizeScratch t_scratch;

}  // namespace

void TokenizerImpl::encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
  PreTokenizeScratch& scratch = t_scratch;
  std::vector<std::string_view> pieces{text};
  pre_tokenizer->split(pieces, scratch);
  for (std::string_view piece : pieces) model.encode(piece, ids);
  scratch.arena.clear();
}

void TokenizerImpl::encode_into(std::string_view input, bool add_special_tokens, bool parse_special,
                                std::vector<int32_t>& ids) const {
  std::string repaired;
  std::string_view text = input;
  if (!is_valid_utf8(input)) {
    repaired = utf8_lossy(input);
    text = repaired;
  }
  if (add_special_tokens) ids.insert(ids.end(), prefix_ids.begin(), prefix_ids.end());
  std::vector<Segment> segments;
  raw_matcher.split(text, !parse_special, segments);
  std::vector<Segment> inner;
  for (const Segment& segment : segments) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    std::string_view piece = text.substr(segment.begin, segment.end - segment.begin);
    std::string normalized;
    if (normalizer) {
      normalized = normalizer->apply(piece);
      piece = normalized;
    }
    inner.clear();
    normalized_matcher.split(piece, !parse_special, inner);
    for (const Segment& part : inner) {
      if (part.id >= 0) {
        ids.push_back(part.id);
      } else {
        encode_plain(piece.substr(part.begin, part.end - part.begin), ids);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids.begin(), suffix_ids.end());
}

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  return Tokenizer(load_tokenizer_json(tokenizer_json));
}

Tokenizer Tokenizer::from_dir(const std::filesystem::path& dir) {
  const auto json_path = dir / "tokenizer.json";
  if (!std::filesystem::exists(json_path)) {
    DI_THROW(dir.string(), ": no tokenizer.json in this directory");
  }
  auto impl = load_tokenizer_json(json_path);
  const auto config_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    const nlohmann::json config = read_json(config_path);
    auto token_id = [&](const char* field) -> std::optional<int32_t> {
      if (!config.contains(field) || config[field].is_null()) return std::nullopt;
      const auto& value = config[field];
      const std::string content =
          value.is_string() ? value.get<std::string>() : value.value("content", std::string());
      auto it = impl->token_ids.find(content);
      if (it == impl->token_ids.end()) {
        DI_THROW(config_path.string(), ": ", field, " \"", content, "\" is not in the vocabulary");
      }
      return it->second;
    };
    impl->bos = token_id("bos_token");
    impl->eos = token_id("eos_token");
    if (config.value("add_bos_token", false) && impl->bos && impl->prefix_ids.empty()) {
      impl->prefix_ids.push_back(*impl->bos);
    }
    if (config.value("add_eos_token", false) && impl->eos && impl->suffix_ids.empty()) {
      impl->suffix_ids.push_back(*impl->eos);
    }
    if (config.contains("chat_template") && config["chat_template"].is_string()) {
      impl->chat_template = config["chat_template"].get<std::string>();
    }
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens,
                                       bool parse_special_tokens) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode_into(text, add_special_tokens, parse_special_tokens, ids);
  return ids;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(std::span<const std::string> texts,
                                                          bool add_special_tokens,
                                                          unsigned num_threads) const {
  std::vector<std::vector<int32_t>> results(texts.size());
  if (num_threads == 0) num_threads = std::max(1u, std::thread::hardware_concurrency());
  num_threads = static_cast<unsigned>(std::min<std::size_t>(num_threads, texts.size()));
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i = next.fetch_add(1); i < texts.size(); i = next.fetch_add(1)) {
      results[i] = encode(texts[i], add_special_tokens);
    }
  };
  if (num_threads <= 1) {
    work();
    return results;
  }
  std::vector<std::thread> threads;
  std::exception_ptr failure;
  std::mutex failure_mutex;
  for (unsigned t = 0; t < num_threads; ++t) {
    threads.emplace_back([&] {
      try {
        work();
      } catch (...) {
        std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next.store(texts.size());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (failure) std::rethrow_exception(failure);
  return results;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0) DI_THROW("decode: id ", id, " at position ", i, " is negative");
    // Ids past the tokenizer's vocabulary decode to nothing, as in HF tokenizers: models pad
    // their embedding rows (DeepSeek-V4.1: 129,280 rows for 128,815 tokens) and can sample them.
    if (id >= impl_->vocab_size) continue;
    if (skip_special_tokens &&
        (impl_->flags[static_cast<std::size_t>(id)] & TokenizerImpl::kSpecial)) {
      continue;
    }
    bytes += impl_->bytes[static_cast<std::size_t>(id)];
  }
  return is_valid_utf8(bytes) ? bytes : utf8_lossy(bytes);
}

int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size)
    DI_THROW("token_bytes: id ", id, " is outside the vocabulary");
  return impl_->bytes[static_cast<std::size_t>(id)];
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= impl_->vocab_size)
    DI_THROW("id_to_token: id ", id, " is outside the vocabulary");
  return impl_->tokens[static_cast<std::size_t>(id)];
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->token_ids.find(std::string(token));
  if (it == impl_->token_ids.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size &&
         (impl_->flags[static_cast<std::size_t>(id)] & TokenizerImpl::kSpecial);
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size &&
         (impl_->flags[static_cast<std::size_t>(id)] & TokenizerImpl::kAdded);
}

std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos;
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos;
}
const std::optional<std::string>& Tokenizer::chat_template() const {
  return impl_->chat_template;
}

}  // namespace deepinfer::tokenizer
