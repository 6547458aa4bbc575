// One error policy: exceptions carrying actionable messages at API boundaries
// (checkpoint, config, request, grammar, CLI); DI_CHECK for internal invariants.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace deepinfer {

// Thrown for anything a user can fix: a bad file, config, request, grammar or flag.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Thrown when an internal invariant breaks: a bug in deepinfer, not in the input.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

// Constrained to printable parts so that unqualified concat() calls in other libraries
// (nanobind builds signatures with one) that find this one by argument-dependent lookup do not
// pick it for their own types.
template <typename... Parts>
  requires requires(std::ostream& stream, Parts&&... parts) { (stream << ... << parts); }
std::string concat(Parts&&... parts) {
  std::ostringstream stream;
  (stream << ... << std::forward<Parts>(parts));
  return stream.str();
}

}  // namespace deepinfer

#define DI_THROW(...) throw ::deepinfer::Error(::deepinfer::concat(__VA_ARGS__))

#define DI_CHECK(condition, ...)                                                            \
  do {                                                                                      \
    if (!(condition)) [[unlikely]] {                                                        \
      throw ::deepinfer::InternalError(::deepinfer::concat(                                 \
          __FILE__, ":", __LINE__, ": check failed: " #condition " " __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                       \
  } while (false)
