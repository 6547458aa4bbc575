// The CUDA backend's run-time switches: every fast path keeps the path before it behind an
// environment variable, so one binary can compare both on the GPU machine (or step around a bad
// one without a rebuild), and tests take either path in one process through ScopedSwitch.
//
// Host-only and header-only on purpose: the CPU tests include it without a CUDA toolchain.
#pragma once

#include <atomic>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "core/error.h"

namespace deepinfer::cuda {

// An integer setting read from the environment variable `name` once (on the first use, not at
// static initialization, so a bad value throws where a caller can see it), overridable for tests
// by ScopedSetting. Values outside [min_value, max_value] or not plain decimal integers throw an
// Error naming the variable and the value. `default_value` may lie outside the range: it then
// means "the environment did not choose" (e.g. an automatic heuristic).
// Construct at namespace scope; the object must outlive every use (it registers its address).
class RuntimeSetting {
 public:
  RuntimeSetting(const char* name, int default_value, int min_value, int max_value)
      : RuntimeSetting(name, default_value, min_value, max_value, /*is_switch=*/false) {}
  ~RuntimeSetting() { unregister(); }
  RuntimeSetting(const RuntimeSetting&) = delete;
  RuntimeSetting& operator=(const RuntimeSetting&) = delete;

  // The test override if one is set, else the environment's value, else the default.
  int value() const {
    const int overridden = override_.load(std::memory_order_relaxed);
    if (overridden != kUnset) return overridden;
    const int cached = from_environment_.load(std::memory_order_acquire);
    if (cached != kUnset) return cached;
    // Not std::call_once: a bad value throws out of the read, and call_once's behaviour after
    // an exception has been unreliable in libstdc++; each later use throws the same Error again.
    std::lock_guard lock(registry_mutex());
    if (from_environment_.load(std::memory_order_relaxed) == kUnset) {
      from_environment_.store(read_environment(), std::memory_order_release);
    }
    return from_environment_.load(std::memory_order_relaxed);
  }

  const char* name() const { return name_; }
  bool is_switch() const { return is_switch_; }

  // Throws an Error unless `value` is one the environment could set.
  void check_value(int value) const {
    if (value < min_value_ || value > max_value_) {
      DI_THROW(name_, "=", value, " is out of range: accepted values are ", min_value_, " to ",
               max_value_);
    }
  }

  // The object registered under `name`; throws an Error naming it when there is none.
  static RuntimeSetting& find(std::string_view name) {
    std::lock_guard lock(registry_mutex());
    const auto found = registry().find(name);
    if (found == registry().end()) DI_THROW("unknown run-time setting ", name);
    return *found->second;
  }

 protected:
  RuntimeSetting(const char* name, int default_value, int min_value, int max_value, bool is_switch)
      : name_(name),
        default_value_(default_value),
        min_value_(min_value),
        max_value_(max_value),
        is_switch_(is_switch) {
    std::lock_guard lock(registry_mutex());
    // Two objects with one name would silently disagree; a static initializer cannot throw to
    // anyone, so the second one is a bug that aborts at load time.
    if (!registry().emplace(name_, this).second) std::abort();
  }

 private:
  friend class ScopedSetting;
  static constexpr int kUnset = INT32_MIN;  // never a valid value: the range is checked

  int read_environment() const {
    const char* setting = std::getenv(name_);
    if (setting == nullptr) return default_value_;
    const std::string_view text(setting);
    int parsed = 0;
    bool digits = !text.empty() && text.size() <= 9;
    for (size_t i = 0; digits && i < text.size(); ++i) {
      const bool minus = i == 0 && text[i] == '-' && text.size() > 1;
      if (minus) continue;
      digits = text[i] >= '0' && text[i] <= '9';
      parsed = parsed * 10 + (text[i] - '0');
    }
    if (digits && text[0] == '-') parsed = -parsed;
    if (!digits || parsed < min_value_ || parsed > max_value_) {
      DI_THROW("environment variable ", name_, "=\"", text, "\" is not accepted: use ",
               is_switch_ ? std::string("0 (off) or 1 (on)")
                          : concat("an integer from ", min_value_, " to ", max_value_),
               ", or leave it unset");
    }
    return parsed;
  }

  void unregister() {
    std::lock_guard lock(registry_mutex());
    const auto found = registry().find(name_);
    if (found != registry().end() && found->second == this) registry().erase(found);
  }

  // Function-local statics: safe whatever order the translation units' namespace-scope objects
  // are constructed in.
  static std::map<std::string_view, RuntimeSetting*>& registry() {
    static std::map<std::string_view, RuntimeSetting*> settings;
    return settings;
  }
  static std::mutex& registry_mutex() {
    static std::mutex mutex;
    return mutex;
  }

  const char* name_;
  int default_value_;
  int min_value_;
  int max_value_;
  bool is_switch_;
  std::atomic<int> override_{kUnset};
  mutable std::atomic<int> from_environment_{kUnset};
};

// A fast path's on/off switch: NAME=0 takes the path before it, NAME=1 (or unset, with an
// on-by-default switch) the fast path. Any other value throws an Error naming the variable.
class RuntimeSwitch : public RuntimeSetting {
 public:
  RuntimeSwitch(const char* name, bool on_by_default)
      : RuntimeSetting(name, on_by_default ? 1 : 0, 0, 1, /*is_switch=*/true) {}

  bool enabled() const { return value() != 0; }
};

// Test API: sets the override of the setting registered as `name` for this object's lifetime
// and restores the previous state (override or none) after, also when the scope unwinds on a
// throw. Unknown names and out-of-range values throw an Error.
class ScopedSetting {
 public:
  ScopedSetting(std::string_view name, int value)
      : setting_(RuntimeSetting::find(name)),
        previous_(setting_.override_.load(std::memory_order_relaxed)) {
    setting_.check_value(value);
    setting_.override_.store(value, std::memory_order_relaxed);
  }
  ~ScopedSetting() { setting_.override_.store(previous_, std::memory_order_relaxed); }
  ScopedSetting(const ScopedSetting&) = delete;
  ScopedSetting& operator=(const ScopedSetting&) = delete;

 protected:
  static std::string_view switch_name(std::string_view name) {
    if (!RuntimeSetting::find(name).is_switch()) {
      DI_THROW("run-time setting ", name, " is not an on/off switch: use ScopedSetting");
    }
    return name;
  }

 private:
  RuntimeSetting& setting_;
  int previous_;
};

// ScopedSetting for an on/off switch: `ScopedSwitch off{"DEEPINFER_ATTENTION_MMA", false};`.
class ScopedSwitch : public ScopedSetting {
 public:
  ScopedSwitch(std::string_view name, bool enabled)
      : ScopedSetting(switch_name(name), enabled ? 1 : 0) {}
};

}  // namespace deepinfer::cuda
