// A cheap deterministic model for engine tests: the logits at a position are a hash of the
// whole prefix up to it, so any scheduling bug that feeds a wrong token, position or slot
// changes every later token. State per slot is the prefix hash chain, preallocated.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/error.h"
#include "engine/model_runner.h"

namespace deepinfer::engine::testing {

inline uint64_t toy_mix(uint64_t value) {
  value += 0x9e3779b97f4a7c15ULL;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL;
  return value ^ (value >> 31);
}

inline uint64_t toy_extend(uint64_t prefix_hash, int32_t token) {
  return toy_mix(prefix_hash ^ (static_cast<uint64_t>(token) * 0x100000001b3ULL));
}

// Logits after a prefix whose hash is `hash`, in [-4, 4).
inline void toy_logits(uint64_t hash, std::span<float> out) {
  for (size_t v = 0; v < out.size(); ++v) {
    const uint64_t bits = toy_mix(hash + v * 0xd6e8feb86659fd93ULL) >> 40;
    out[v] = static_cast<float>(bits) / static_cast<float>(1 << 24) * 8.0f - 4.0f;
  }
}

class ToyRunner final : public ModelRunner {
 public:
  ToyRunner(int64_t vocab, std::vector<int32_t> eos, int64_t max_len)
      : vocab_(vocab), eos_(std::move(eos)), max_len_(max_len) {}

  int64_t vocab_size() const override { return vocab_; }
  std::vector<int32_t> eos_token_ids() const override { return eos_; }
  int64_t max_model_len() const override { return max_len_; }
  int64_t state_bytes_per_token() const override { return 8; }

  void allocate_slots(int32_t num_slots, int64_t max_tokens, int64_t) override {
    slots_.assign(static_cast<size_t>(num_slots), Slot{});
    for (auto& slot : slots_) slot.hashes.assign(static_cast<size_t>(max_tokens), 0);
  }
  void reset_slot(int32_t slot) override { slots_.at(static_cast<size_t>(slot)).length = 0; }

  void forward(std::span<const SlotTokens> batch, std::span<const int64_t> logits_rows,
               std::span<float> logits) override {
    DI_CHECK(logits.size() == logits_rows.size() * static_cast<size_t>(vocab_),
             "toy logits buffer does not match the rows");
    int64_t row = 0;
    size_t next_out = 0;
    for (const auto& item : batch) {
      Slot& slot = slots_.at(static_cast<size_t>(item.slot));
      DI_CHECK(slot.length + static_cast<int64_t>(item.tokens.size()) <=
                   static_cast<int64_t>(slot.hashes.size()),
               "toy slot overflow");
      for (int32_t token : item.tokens) {
        DI_CHECK(token >= 0 && token < vocab_, "toy token out of range");
        const uint64_t previous =
            slot.length == 0 ? 0 : slot.hashes[static_cast<size_t>(slot.length - 1)];
        const uint64_t hash = toy_extend(previous, token);
        slot.hashes[static_cast<size_t>(slot.length++)] = hash;
        if (next_out < logits_rows.size() && logits_rows[next_out] == row) {
          toy_logits(hash, logits.subspan(next_out * static_cast<size_t>(vocab_),
                                          static_cast<size_t>(vocab_)));
          ++next_out;
        }
        ++row;
      }
    }
    DI_CHECK(next_out == logits_rows.size(), "toy logits rows are not ascending batch rows");
    forward_calls_ += 1;
  }

  int64_t forward_calls() const { return forward_calls_; }

 private:
  struct Slot {
    std::vector<uint64_t> hashes;
    int64_t length = 0;
  };
  int64_t vocab_;
  std::vector<int32_t> eos_;
  int64_t max_len_;
  std::vector<Slot> slots_;
  int64_t forward_calls_ = 0;
};

}  // namespace deepinfer::engine::testing
