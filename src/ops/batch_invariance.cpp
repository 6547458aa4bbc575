#include "ops/batch_invariance.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string_view>

#include "core/error.h"

namespace deepinfer::ops {
namespace {

constexpr int kUnset = -1;
std::atomic<int> policy{kUnset};
std::mutex environment_mutex;

int from_environment() {
  const char* value = std::getenv("DEEPINFER_BATCH_INVARIANT");
  if (value == nullptr || *value == '\0') return 1;
  const std::string_view text(value);
  if (text != "0" && text != "1") {
    DI_THROW("DEEPINFER_BATCH_INVARIANT='", text, "' must be 0 or 1");
  }
  return text == "1" ? 1 : 0;
}

}  // namespace

bool batch_invariant() {
  const int current = policy.load(std::memory_order_acquire);
  if (current != kUnset) return current == 1;
  // A bad value throws on every read until the environment is fixed, not once.
  std::lock_guard lock(environment_mutex);
  if (policy.load(std::memory_order_relaxed) == kUnset) {
    policy.store(from_environment(), std::memory_order_release);
  }
  return policy.load(std::memory_order_relaxed) == 1;
}

void set_batch_invariant(bool on) {
  policy.store(on ? 1 : 0, std::memory_order_release);
}

}  // namespace deepinfer::ops
