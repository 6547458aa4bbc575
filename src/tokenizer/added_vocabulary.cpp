#include "tokenizer/added_vocabulary.h"

#include <utf8proc.h>

#include <algorithm>

#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

// Rust regex's Unicode \w: alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

std::size_t previous_char_start(std::string_view text, std::size_t end) {
  std::size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

bool ends_with_word(std::string_view text) {
  if (text.empty()) return false;
  std::size_t pos = previous_char_start(text, text.size());
  return is_word_char(decode_utf8(text, pos));
}

bool starts_with_word(std::string_view text) {
  if (text.empty()) return false;
  std::size_t pos = 0;
  return is_word_char(decode_utf8(text, pos));
}

// Start of the whitespace run that ends `text` (text.size() if none).
std::size_t leftmost_space_at_end(std::string_view text) {
  std::size_t end = text.size();
  while (end > 0) {
    const std::size_t start = previous_char_start(text, end);
    std::size_t pos = start;
    if (!is_unicode_whitespace(decode_utf8(text, pos))) break;
    end = start;
  }
  return end;
}

// Length of the whitespace run that starts `text`.
std::size_t rightmost_space_at_start(std::string_view text) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t next = pos;
    if (!is_unicode_whitespace(decode_utf8(text, next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<std::string> patterns,
                                     std::vector<const AddedToken*> tokens)
    : tokens_(std::move(tokens)) {
  nodes_.emplace_back();
  pattern_lengths_.resize(patterns.size());
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    const std::string& pattern = patterns[i];
    pattern_lengths_[i] = pattern.size();
    if (pattern.empty()) continue;
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
    int32_t node = 0;
    for (const char c : pattern) {
      const auto byte = static_cast<unsigned char>(c);
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_[static_cast<std::size_t>(node)].children.emplace_back(byte, next);
        nodes_.emplace_back();
      }
      node = next;
    }
    // Identical patterns: the first one wins, as in the Aho-Corasick automaton HF builds.
    if (nodes_[static_cast<std::size_t>(node)].pattern < 0) {
      nodes_[static_cast<std::size_t>(node)].pattern = static_cast<int32_t>(i);
    }
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  for (const auto& [b, next] : nodes_[static_cast<std::size_t>(node)].children) {
    if (b == byte) return next;
  }
  return -1;
}

void AddedTokenMatcher::split(std::string_view text, bool skip_special,
                              std::vector<Segment>& segments) const {
  std::size_t start_offset = 0;
  std::size_t search = 0;
  const std::size_t size = text.size();
  while (search < size && !tokens_.empty()) {
    // Leftmost position where some pattern matches, longest pattern there.
    int32_t found = -1;
    std::size_t match_begin = 0;
    for (std::size_t s = search; s < size; ++s) {
      if (!first_byte_[static_cast<unsigned char>(text[s])]) continue;
      int32_t node = 0;
      for (std::size_t i = s; i < size; ++i) {
        node = child(node, static_cast<unsigned char>(text[i]));
        if (node < 0) break;
        if (nodes_[static_cast<std::size_t>(node)].pattern >= 0) {
          found = nodes_[static_cast<std::size_t>(node)].pattern;
        }
      }
      if (found >= 0) {
        match_begin = s;
        break;
      }
    }
    if (found < 0) break;
    std::size_t begin = match_begin;
    std::size_t stop = match_begin + pattern_lengths_[static_cast<std::size_t>(found)];
    search = stop;  // matches never overlap, whatever happens to this one
    const AddedToken& token = *tokens_[static_cast<std::size_t>(found)];
    if (skip_special && token.special) continue;
    if (token.single_word) {
      const bool start_space = begin == 0 || !ends_with_word(text.substr(0, begin));
      const bool stop_space = stop == size || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) begin = std::max(leftmost_space_at_end(text.substr(0, begin)), start_offset);
    if (token.rstrip) stop += rightmost_space_at_start(text.substr(stop));
    if (start_offset < begin) segments.push_back({start_offset, begin, -1});
    segments.push_back({begin, stop, token.id});
    start_offset = stop;
  }
  if (start_offset < size) segments.push_back({start_offset, size, -1});
}

}  // namespace deepinfer::tokenizer
