// The engram's n-gram hashing: the prime bucket layout of each engram layer's table, the
// per-layer hash multipliers, and the hash ids of the n-grams ending at each position.
//
// Source: DeepSeek's reference inference/engram.py (EngramLayout, compute_hash_multipliers,
// NgramHashState) and HF's modular_deepseek_v41.py (same algorithm). The multipliers come from
// numpy's `default_rng(10007 * layer_id).integers(0, bound, size=max_ngram_size)`; this file
// reproduces numpy's SeedSequence, PCG64 and 64-bit Lemire bounded draw bit for bit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "model/deepseek_v41/config.h"

namespace deepinfer::deepseek_v41 {

// numpy.random.default_rng(seed).integers(0, high, size=count, dtype=np.int64) for
// high > 2^32 (the range every engram multiplier bound falls in).
std::vector<int64_t> numpy_default_rng_integers(uint64_t seed, int64_t high, int64_t count);

// The tokenizer-derived token map as stored next to a checkpoint (engram_token_map.json): a JSON
// array holding the compressed id of every token id. Throws Error naming the file otherwise.
std::vector<int32_t> read_engram_token_map(const std::filesystem::path& path);

class EngramHasher {
 public:
  // token_map: compressed id of every token id (the tokenizer-derived table); its distinct
  // count must equal engram_compressed_vocab_size.
  EngramHasher(const DeepseekV41TextConfig& config, std::vector<int32_t> token_map);

  int64_t layers() const { return static_cast<int64_t>(layer_ids_.size()); }
  int64_t columns() const { return columns_; }  // (max_ngram - 1) * n_heads
  int64_t max_ngram() const { return max_ngram_; }
  int32_t compressed_id(int32_t token) const;
  int32_t pad_id() const { return pad_id_; }
  // Rows an engram layer's table must have (sum of its primes).
  int64_t table_rows(int64_t engram_index) const {
    return table_rows_[static_cast<size_t>(engram_index)];
  }
  const std::vector<int64_t>& multipliers(int64_t engram_index) const {
    return multipliers_[static_cast<size_t>(engram_index)];
  }

  // Hash ids [layers, columns] for the n-grams ending at a position, given the compressed ids
  // of that position and the max_ngram - 1 before it (window[0] = the position itself,
  // window[s] = s positions back, -1 where the sequence has not started).
  void hash(std::span<const int32_t> window, std::span<int64_t> out) const;

 private:
  std::vector<int64_t> layer_ids_;
  int64_t max_ngram_ = 0;
  int64_t heads_ = 0;
  int64_t columns_ = 0;
  std::vector<int32_t> token_map_;
  int32_t pad_id_ = 0;
  std::vector<std::vector<int64_t>> primes_;       // [layer][(n-1) * heads + head]
  std::vector<std::vector<int64_t>> offsets_;      // same layout
  std::vector<std::vector<int64_t>> multipliers_;  // [layer][shift]
  std::vector<int64_t> table_rows_;
};

}  // namespace deepinfer::deepseek_v41
