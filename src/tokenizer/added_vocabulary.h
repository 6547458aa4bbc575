// Added tokens (special or not) are cut out of the text before pre-tokenization, with HF's
// rules: leftmost-longest matching, single_word boundaries, lstrip/rstrip whitespace
// absorption, and two passes — non-normalized tokens on the raw text, normalized ones on
// each normalized remainder.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = true;
};

// A segment of a text: either an added token (id >= 0) or plain text to tokenize (id == -1).
struct Segment {
  std::size_t begin;
  std::size_t end;
  int32_t id;
};

// Leftmost-longest multi-pattern matcher over one set of added tokens (a byte trie).
class AddedTokenMatcher {
 public:
  // `patterns[i]` is matched and reported as `tokens[i]`.
  AddedTokenMatcher(std::vector<std::string> patterns, std::vector<const AddedToken*> tokens);
  AddedTokenMatcher() = default;

  // HF's AddedVocabulary::find_matches: covers the whole text with segments.
  // `skip_special` drops matches of special tokens (HF's encode_special_tokens).
  void split(std::string_view text, bool skip_special, std::vector<Segment>& segments) const;
  bool empty() const { return tokens_.empty(); }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t pattern = -1;
  };
  int32_t child(int32_t node, unsigned char byte) const;

  std::vector<Node> nodes_;
  std::vector<std::size_t> pattern_lengths_;
  std::vector<const AddedToken*> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace deepinfer::tokenizer
