#include "tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace deepinfer::tokenizer {
namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

uint64_t mix(uint64_t key) {  // splitmix64 finaliser: cheap and spreads sequential ids
  key ^= key >> 31;
  key *= 0x7fb5d329728ea185ULL;
  key ^= key >> 27;
  key *= 0x81dadef4bc2dd44dULL;
  key ^= key >> 33;
  return key;
}

// Words up to this many bytes merge by rescanning the pair ranks (no allocation, cache
// friendly); longer ones use a heap so a 100 kB run stays O(n log n).
constexpr std::size_t kShortWord = 48;

}  // namespace

void BpeModel::insert_merge(int32_t left, int32_t right, uint32_t rank, int32_t merged_id) {
  const uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    MergeSlot& entry = merges_[slot];
    if (entry.key == kEmptyKey || entry.key == key) {
      entry = {key, rank, merged_id};  // a repeated merge line keeps the later rank, like HF
      return;
    }
  }
}

const BpeModel::MergeSlot* BpeModel::find_merge(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    const MergeSlot& entry = merges_[slot];
    if (entry.key == key) return &entry;
    if (entry.key == kEmptyKey) return nullptr;
  }
}

BpeModel BpeModel::from_json(const nlohmann::json& model) {
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") {
    DI_THROW("tokenizer.json: model.type \"", type,
             "\" is not supported (only byte-level \"BPE\")");
  }
  auto require_null_or_false = [&](const char* field) {
    if (model.contains(field) && !model[field].is_null() && model[field] != false) {
      DI_THROW("tokenizer.json: model.", field, " = ", model[field].dump(),
               " is not supported by the byte-level BPE model");
    }
  };
  require_null_or_false("continuing_subword_prefix");
  require_null_or_false("end_of_word_suffix");
  require_null_or_false("byte_fallback");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0.0) {
    DI_THROW("tokenizer.json: model.dropout = ", model["dropout"].dump(),
             " is not supported (BPE dropout is a training-time option)");
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    DI_THROW("tokenizer.json: model.vocab is missing or not an object");
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    DI_THROW("tokenizer.json: model.merges is missing or not an array");
  }

  BpeModel bpe;
  bpe.ignore_merges_ = model.value("ignore_merges", false);
  bpe.vocab_.reserve(model["vocab"].size());
  for (const auto& [token, id_json] : model["vocab"].items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() > INT32_MAX) {
      DI_THROW("tokenizer.json: model.vocab[\"", token, "\"] = ", id_json.dump(),
               " is not a valid token id");
    }
    const auto id = id_json.get<int32_t>();
    bpe.vocab_.emplace(token, id);
    bpe.max_id_ = std::max(bpe.max_id_, id);
    if (bpe.ignore_merges_ && is_byte_level_spelling(token)) {
      bpe.bytes_to_id_.emplace(byte_level_decode_token(token), id);
    }
  }
  bpe.byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    std::string spelling = byte_level_encode(std::string(1, static_cast<char>(b)));
    auto it = bpe.vocab_.find(spelling);
    if (it != bpe.vocab_.end()) bpe.byte_ids_[static_cast<std::size_t>(b)] = it->second;
  }

  const auto& merges = model["merges"];
  std::size_t capacity = 16;
  while (capacity < merges.size() * 2 + 16) capacity *= 2;
  bpe.merges_.assign(capacity, MergeSlot{});
  bpe.merge_mask_ = capacity - 1;
  uint32_t rank = 0;
  for (const auto& merge : merges) {
    std::string left;
    std::string right;
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      const std::size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        DI_THROW("tokenizer.json: model.merges[", rank, "] = \"", line,
                 "\" is not two tokens separated by one space");
      }
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      DI_THROW("tokenizer.json: model.merges[", rank, "] = ", merge.dump(),
               " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto find_id = [&](const std::string& token, const char* what) {
      auto it = bpe.vocab_.find(token);
      if (it == bpe.vocab_.end()) {
        DI_THROW("tokenizer.json: model.merges[", rank, "]: ", what, " \"", token,
                 "\" is not in model.vocab");
      }
      return it->second;
    };
    const int32_t left_id = find_id(left, "left token");
    const int32_t right_id = find_id(right, "right token");
    const int32_t merged_id = find_id(left + right, "merged token");
    bpe.insert_merge(left_id, right_id, rank, merged_id);
    ++rank;
  }
  return bpe;
}

void BpeModel::encode(std::string_view bytes, std::vector<int32_t>& ids) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    auto it = bytes_to_id_.find(std::string(bytes));
    if (it != bytes_to_id_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  if (bytes.size() == 1) {
    const int32_t id = byte_ids_[static_cast<unsigned char>(bytes[0])];
    if (id < 0)
      DI_THROW("tokenizer: the vocabulary has no token for byte ",
               int(static_cast<unsigned char>(bytes[0])));
    ids.push_back(id);
    return;
  }
  if (bytes.size() <= kShortWord) {
    merge_short(bytes, ids);
  } else {
    merge_long(bytes, ids);
  }
}

void BpeModel::merge_short(std::string_view bytes, std::vector<int32_t>& ids) const {
  int32_t symbols[kShortWord];
  uint32_t ranks[kShortWord];  // ranks[i]: rank of merging symbols[i] with symbols[i + 1]
  int32_t merged[kShortWord];
  constexpr uint32_t kNoMerge = UINT32_MAX;
  std::size_t count = bytes.size();
  for (std::size_t i = 0; i < count; ++i) {
    symbols[i] = byte_ids_[static_cast<unsigned char>(bytes[i])];
    if (symbols[i] < 0)
      DI_THROW("tokenizer: the vocabulary has no token for byte ",
               int(static_cast<unsigned char>(bytes[i])));
  }
  auto update = [&](std::size_t i) {
    const MergeSlot* slot = find_merge(symbols[i], symbols[i + 1]);
    ranks[i] = slot ? slot->rank : kNoMerge;
    merged[i] = slot ? slot->merged_id : -1;
  };
  for (std::size_t i = 0; i + 1 < count; ++i) update(i);
  while (count > 1) {
    std::size_t best = 0;
    uint32_t best_rank = kNoMerge;
    for (std::size_t i = 0; i + 1 < count; ++i) {
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best_rank == kNoMerge) break;
    symbols[best] = merged[best];
    for (std::size_t i = best + 1; i + 1 < count; ++i) {
      symbols[i] = symbols[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --count;
    if (best > 0) update(best - 1);
    if (best + 1 < count) update(best);
  }
  ids.insert(ids.end(), symbols, symbols + count);
}

void BpeModel::merge_long(std::string_view bytes, std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  const auto n = static_cast<int32_t>(bytes.size());
  std::vector<Symbol> symbols(static_cast<std::size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = byte_ids_[static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)])];
    if (id < 0)
      DI_THROW("tokenizer: the vocabulary has no token for byte ",
               int(static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)])));
    symbols[static_cast<std::size_t>(i)] = {id, i - 1, i + 1 < n ? i + 1 : -1, true};
  }
  std::vector<Candidate> storage;
  storage.reserve(static_cast<std::size_t>(n));
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue(std::greater<>{},
                                                                               std::move(storage));
  auto push = [&](int32_t pos) {
    const Symbol& left = symbols[static_cast<std::size_t>(pos)];
    if (left.next < 0) return;
    if (const MergeSlot* slot =
            find_merge(left.id, symbols[static_cast<std::size_t>(left.next)].id)) {
      queue.push({slot->rank, pos, slot->merged_id});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<std::size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<std::size_t>(left.next)];
    const MergeSlot* slot = find_merge(left.id, right.id);
    if (slot == nullptr || slot->merged_id != top.merged_id || slot->rank != top.rank) continue;
    left.id = top.merged_id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[static_cast<std::size_t>(left.next)].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[static_cast<std::size_t>(i)].next) {
    ids.push_back(symbols[static_cast<std::size_t>(i)].id);
  }
}

}  // namespace deepinfer::tokenizer
