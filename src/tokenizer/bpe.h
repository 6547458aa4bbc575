// Byte-level BPE: a pre-token's bytes start as one symbol per byte and the adjacent pair with
// the lowest merge rank is merged (leftmost first on ties) until no pair has a merge, exactly
// the order HF tokenizers' priority queue produces.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace deepinfer::tokenizer {

class BpeModel {
 public:
  // Parses the "model" object of tokenizer.json (type "BPE"); throws naming unsupported options.
  static BpeModel from_json(const nlohmann::json& model);

  // Appends the ids of one pre-token given as raw bytes.
  void encode(std::string_view bytes, std::vector<int32_t>& ids) const;

  // Vocabulary of the model itself (byte-level spellings), without added tokens.
  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }
  int32_t max_id() const { return max_id_; }

 private:
  struct MergeSlot {
    uint64_t key = kEmptyKey;
    uint32_t rank = 0;
    int32_t merged_id = 0;
  };
  static constexpr uint64_t kEmptyKey = ~uint64_t{0};

  void insert_merge(int32_t left, int32_t right, uint32_t rank, int32_t merged_id);
  const MergeSlot* find_merge(int32_t left, int32_t right) const;
  void merge_short(std::string_view bytes, std::vector<int32_t>& ids) const;
  void merge_long(std::string_view bytes, std::vector<int32_t>& ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<std::string, int32_t> bytes_to_id_;  // for ignore_merges
  std::vector<int32_t> byte_ids_;                         // id of each single-byte token
  std::vector<MergeSlot> merges_;                         // open addressing, power-of-two size
  uint64_t merge_mask_ = 0;
  int32_t max_id_ = -1;
  bool ignore_merges_ = false;
};

}  // namespace deepinfer::tokenizer
