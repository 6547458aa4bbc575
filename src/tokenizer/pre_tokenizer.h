// HF pre-tokenizers of the byte-level family: Sequence, Split (regex or literal, every split
// behaviour, invert) and ByteLevel (optional GPT-2 regex, add_prefix_space). The ByteLevel
// byte -> character spelling itself is implicit: the BPE works on raw bytes directly.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/regex.h"

namespace deepinfer::tokenizer {

struct PreTokenizeScratch {
  std::vector<std::string_view> next;
  std::vector<Span> matches;
  std::deque<std::string> arena;  // owns text created by add_prefix_space
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their finer split; empty pieces are dropped, as HF does.
  virtual void split(std::vector<std::string_view>& pieces, PreTokenizeScratch& scratch) const = 0;
  // Whether this step (or one inside it) is the ByteLevel pre-tokenizer.
  virtual bool has_byte_level() const { return false; }
};

// `origin` names the JSON field for error messages; a null spec gives nullptr.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& spec,
                                                 const std::string& origin);

}  // namespace deepinfer::tokenizer
