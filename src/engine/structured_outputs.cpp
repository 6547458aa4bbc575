#include "engine/structured_outputs.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"

namespace deepinfer::engine {
namespace {

uint64_t fnv1a(uint64_t hash, std::string_view bytes) {
  for (const char c : bytes) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

structured::TokenizerVocab tokenizer_vocab(const tokenizer::Tokenizer& tokenizer,
                                           int64_t model_vocab,
                                           std::span<const int32_t> stop_token_ids) {
  structured::TokenizerVocab vocab;
  vocab.token_bytes.resize(static_cast<size_t>(model_vocab));
  vocab.stop_token_ids.assign(stop_token_ids.begin(), stop_token_ids.end());
  const int32_t known =
      std::min<int32_t>(tokenizer.vocab_size(), static_cast<int32_t>(model_vocab));
  for (int32_t id = 0; id < known; ++id) {
    const bool is_stop =
        std::find(stop_token_ids.begin(), stop_token_ids.end(), id) != stop_token_ids.end();
    if (tokenizer.is_special(id) && !is_stop) {
      vocab.special_token_ids.push_back(id);
    } else {
      vocab.token_bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
    }
  }
  return vocab;
}

std::mutex cache_mutex;

}  // namespace

std::shared_ptr<const structured::VocabIndex> vocab_index_for(
    const tokenizer::Tokenizer& tokenizer, int64_t model_vocab,
    std::span<const int32_t> stop_token_ids) {
  structured::TokenizerVocab vocab = tokenizer_vocab(tokenizer, model_vocab, stop_token_ids);
  // Keyed by content: two tokenizers with the same tokens share one index.
  uint64_t key = 0xcbf29ce484222325ULL;
  for (const auto& bytes : vocab.token_bytes) key = fnv1a(fnv1a(key, bytes), "\x1f");
  for (int32_t id : vocab.stop_token_ids) key = fnv1a(key, "s" + std::to_string(id));
  for (int32_t id : vocab.special_token_ids) key = fnv1a(key, "x" + std::to_string(id));
  static std::map<uint64_t, std::weak_ptr<const structured::VocabIndex>> cache;
  std::lock_guard lock(cache_mutex);
  if (auto found = cache[key].lock()) return found;
  auto index = std::make_shared<const structured::VocabIndex>(std::move(vocab));
  cache[key] = index;
  return index;
}

structured::CompiledGrammar compile_structured_output(
    const StructuredOutputArgs& so_args,
    const std::shared_ptr<const structured::VocabIndex>& vocab) {
  using Key = std::tuple<const structured::VocabIndex*, std::string, std::string>;
  static std::map<Key, structured::CompiledGrammar> cache;
  constexpr size_t kMaxCachedGrammars = 64;
  const Key key{vocab.get(), so_args.schema_type, so_args.schema};
  {
    std::lock_guard lock(cache_mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  structured::GrammarSpec spec;
  spec.type = structured::parse_grammar_type(so_args.schema_type);
  spec.text = so_args.schema;
  if (spec.type == structured::GrammarType::kAnyJson && !spec.text.empty()) {
    DI_THROW("so_args: schema_type 'any_json' takes no schema, got ", spec.text.size(),
             " bytes of one");
  }
  // One thread: the engine compiles on its own thread while the worker runs the forward.
  structured::CompiledGrammar grammar = structured::compile_grammar(spec, vocab, {1, false});
  std::lock_guard lock(cache_mutex);
  // The vocabulary pointer in the key stays valid: the cached grammar holds the index.
  if (cache.size() >= kMaxCachedGrammars) cache.erase(cache.begin());
  cache.emplace(key, grammar);
  return grammar;
}

}  // namespace deepinfer::engine
