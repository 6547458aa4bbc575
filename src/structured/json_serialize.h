// Canonical compact serialization of JSON values, the form the engine's compact whitespace
// policy accepts: no whitespace, strings escaped only where JSON requires it (" \ and control
// characters, short escapes where they exist, else \u00xx), numbers in positional notation
// (no exponent), and object keys ordered by a caller-provided rank (schema property order).
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace deepinfer::structured {

using Json = nlohmann::ordered_json;

// Returns a rank for a key (smaller first); keys of equal rank keep their input order.
using KeyRank = std::function<size_t(const std::string& key)>;

std::string serialize_json(const Json& value, const KeyRank& rank = nullptr);
std::string serialize_json_string(const std::string& text);
// Positional decimal text of a JSON number: integers exactly, floats shortest round-trip.
std::string number_text(const Json& number);

}  // namespace deepinfer::structured
