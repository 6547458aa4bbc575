#include "structured/vocab.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer::structured {

VocabIndex::VocabIndex(TokenizerVocab vocab) : vocab_(std::move(vocab)) {
  const size_t n = vocab_.token_bytes.size();
  ordinary_.assign(n, 1);
  auto check_id = [&](int32_t id, const char* what) {
    if (id < 0 || static_cast<size_t>(id) >= n)
      DI_THROW(what, " token id ", id, " is outside the vocabulary of ", n);
  };
  for (int32_t id : vocab_.special_token_ids) {
    check_id(id, "special");
    ordinary_[static_cast<size_t>(id)] = 0;
  }
  for (int32_t id : vocab_.stop_token_ids) {
    check_id(id, "stop");
    ordinary_[static_cast<size_t>(id)] = 0;
  }
  for (size_t id = 0; id < n; ++id) {
    if (vocab_.token_bytes[id].empty()) ordinary_[id] = 0;
    if (ordinary_[id]) sorted_ids_.push_back(static_cast<int32_t>(id));
  }
  std::sort(sorted_ids_.begin(), sorted_ids_.end(),
            [&](int32_t a, int32_t b) { return bytes(a) < bytes(b); });
  lcp_.assign(sorted_ids_.size(), 0);
  for (size_t i = 1; i < sorted_ids_.size(); ++i) {
    const std::string& a = bytes(sorted_ids_[i - 1]);
    const std::string& b = bytes(sorted_ids_[i]);
    uint32_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    lcp_[i] = k;
  }
  // next[d]: the nearest later index whose lcp with its predecessor is <= d.
  size_t max_length = 0;
  for (int32_t id : sorted_ids_) max_length = std::max(max_length, bytes(id).size());
  const auto count = static_cast<uint32_t>(sorted_ids_.size());
  std::vector<uint32_t> next(max_length + 1, count);
  subtree_offset_.assign(sorted_ids_.size() + 1, 0);
  for (size_t i = 0; i < sorted_ids_.size(); ++i) {
    subtree_offset_[i + 1] =
        subtree_offset_[i] + static_cast<uint32_t>(bytes(sorted_ids_[i]).size());
  }
  first_byte_begin_.assign(257, count);
  for (size_t i = sorted_ids_.size(); i-- > 0;) {
    first_byte_begin_[static_cast<uint8_t>(bytes(sorted_ids_[i])[0])] = static_cast<uint32_t>(i);
  }
  for (size_t b = 256; b-- > 0;)
    first_byte_begin_[b] = std::min(first_byte_begin_[b], first_byte_begin_[b + 1]);
  sorted_blob_.reserve(subtree_offset_.back());
  for (int32_t id : sorted_ids_) sorted_blob_ += bytes(id);
  subtree_end_.assign(subtree_offset_.back(), count);
  for (size_t i = sorted_ids_.size(); i-- > 0;) {
    size_t length = bytes(sorted_ids_[i]).size();
    for (size_t d = 0; d < length; ++d) subtree_end_[subtree_offset_[i] + d] = next[d];
    for (size_t d = lcp_[i]; d <= max_length; ++d) next[d] = static_cast<uint32_t>(i);
  }
}

bool VocabIndex::is_stop(int32_t id) const {
  return std::find(vocab_.stop_token_ids.begin(), vocab_.stop_token_ids.end(), id) !=
         vocab_.stop_token_ids.end();
}

}  // namespace deepinfer::structured
