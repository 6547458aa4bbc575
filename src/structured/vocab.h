// The vocabulary as the grammar engine sees it: each token id's bytes, plus which ids end the
// sequence (allowed only when the document is complete) and which are special (never allowed).
// VocabIndex sorts the tokens by bytes so mask computation walks shared prefixes once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::structured {

struct TokenizerVocab {
  std::vector<std::string> token_bytes;  // indexed by id; empty for ids without text
  std::vector<int32_t> stop_token_ids;
  std::vector<int32_t> special_token_ids;
};

class VocabIndex {
 public:
  explicit VocabIndex(TokenizerVocab vocab);

  size_t vocab_size() const { return vocab_.token_bytes.size(); }
  size_t mask_words() const { return (vocab_size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return vocab_.token_bytes[static_cast<size_t>(id)]; }
  // Ordinary (non-special, non-empty) token ids in lexicographic byte order.
  const std::vector<int32_t>& sorted_ids() const { return sorted_ids_; }
  // The bytes of sorted_ids()[i], stored contiguously in sorted order so that walks over the
  // sorted vocabulary read memory sequentially.
  std::string_view sorted_bytes(size_t i) const {
    return {sorted_blob_.data() + subtree_offset_[i], subtree_offset_[i + 1] - subtree_offset_[i]};
  }
  // The sorted indices of the tokens starting with byte b are [first_byte_begin(b),
  // first_byte_begin(b + 1)), for b in 0..255.
  uint32_t first_byte_begin(unsigned b) const { return first_byte_begin_[b]; }
  // lcp()[i]: bytes shared by sorted_ids()[i-1] and sorted_ids()[i] (0 for i == 0).
  const std::vector<uint32_t>& lcp() const { return lcp_; }
  // The first sorted index after i whose token does not share the first depth + 1 bytes of
  // token i (the end of i's trie subtree at that depth); depth < length of token i.
  uint32_t subtree_end(size_t i, size_t depth) const {
    return subtree_end_[subtree_offset_[i] + depth];
  }
  const std::vector<int32_t>& stop_ids() const { return vocab_.stop_token_ids; }
  bool is_ordinary(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < ordinary_.size() &&
           ordinary_[static_cast<size_t>(id)];
  }
  bool is_stop(int32_t id) const;

 private:
  TokenizerVocab vocab_;
  std::vector<int32_t> sorted_ids_;
  std::vector<uint32_t> lcp_;
  std::vector<uint8_t> ordinary_;
  std::vector<uint32_t> subtree_offset_;  // prefix sums of sorted token lengths
  std::string sorted_blob_;
  std::vector<uint32_t> first_byte_begin_;  // 257 entries
  std::vector<uint32_t> subtree_end_;
};

}  // namespace deepinfer::structured
