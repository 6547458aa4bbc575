#include "engine/state_manager.h"

#include <algorithm>

#include "core/error.h"

namespace deepinfer::engine {

StateManager::StateManager(int32_t num_slots, int64_t max_tokens_per_slot, int64_t capacity_tokens)
    : max_tokens_per_slot_(max_tokens_per_slot),
      capacity_tokens_(std::min<int64_t>(capacity_tokens, num_slots * max_tokens_per_slot)),
      slot_reserved_(static_cast<size_t>(num_slots), 0),
      slot_owner_(static_cast<size_t>(num_slots), nullptr) {
  DI_CHECK(num_slots > 0 && max_tokens_per_slot > 0 && capacity_tokens > 0,
           "state pool needs slots and capacity");
  for (int32_t slot = num_slots - 1; slot >= 0; --slot) free_slots_.push_back(slot);
}

bool StateManager::acquire_slot(Request& request) {
  if (request.slot >= 0) return true;
  if (free_slots_.empty()) return false;
  request.slot = free_slots_.back();
  free_slots_.pop_back();
  slot_owner_[static_cast<size_t>(request.slot)] = &request;
  return true;
}

bool StateManager::reserve(Request& request, int64_t length) {
  DI_CHECK(request.slot >= 0 && slot_owner_[static_cast<size_t>(request.slot)] == &request,
           "reserve without a slot");
  int64_t& held = slot_reserved_[static_cast<size_t>(request.slot)];
  if (length <= held) return true;
  if (length > max_tokens_per_slot_ || length - held > free_tokens()) return false;
  used_tokens_ += length - held;
  held = length;
  return true;
}

void StateManager::release(Request& request) {
  if (request.slot < 0) return;
  const auto index = static_cast<size_t>(request.slot);
  DI_CHECK(slot_owner_[index] == &request, "release of a slot the request does not own");
  used_tokens_ -= slot_reserved_[index];
  slot_reserved_[index] = 0;
  slot_owner_[index] = nullptr;
  free_slots_.push_back(request.slot);
  request.slot = -1;
}

int64_t StateManager::reserved(const Request& request) const {
  return request.slot < 0 ? 0 : slot_reserved_[static_cast<size_t>(request.slot)];
}

}  // namespace deepinfer::engine
