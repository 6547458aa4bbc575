// Owns the model's state slots (created once, at start-up) and the token capacity of the
// state pool. Accounting is exact: a running request holds one slot and `reserved` tokens of
// capacity, equal to the length its state reaches after the steps planned so far.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/request.h"

namespace deepinfer::engine {

class StateManager {
 public:
  // `capacity_tokens` is shared by all slots (<= num_slots * max_tokens_per_slot).
  StateManager(int32_t num_slots, int64_t max_tokens_per_slot, int64_t capacity_tokens);

  int32_t num_slots() const { return static_cast<int32_t>(slot_owner_.size()); }
  int32_t free_slots() const { return static_cast<int32_t>(free_slots_.size()); }
  int64_t capacity_tokens() const { return capacity_tokens_; }
  int64_t free_tokens() const { return capacity_tokens_ - used_tokens_; }
  int64_t max_tokens_per_slot() const { return max_tokens_per_slot_; }

  // Gives `request` a slot when it has none; returns false (changing nothing) when no slot is
  // free. The caller resets the model state of a newly assigned slot.
  bool acquire_slot(Request& request);
  // Grows the request's reservation to `length` tokens; false (changing nothing) when the pool
  // or the slot cannot hold it.
  bool reserve(Request& request, int64_t length);
  // Frees the slot and the reservation of `request`.
  void release(Request& request);

  int64_t reserved(const Request& request) const;

 private:
  int64_t max_tokens_per_slot_;
  int64_t capacity_tokens_;
  int64_t used_tokens_ = 0;
  std::vector<int32_t> free_slots_;     // LIFO, lowest slot on top at start
  std::vector<int64_t> slot_reserved_;  // by slot
  std::vector<const Request*> slot_owner_;
};

}  // namespace deepinfer::engine
