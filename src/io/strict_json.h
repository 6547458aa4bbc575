// JSON parsing for checkpoint files that refuses what nlohmann accepts silently: a repeated
// key in one object (nlohmann keeps the last), which in a checkpoint means two definitions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace deepinfer {

struct DuplicateKey {
  int depth = 0;  // 1 for a key of the top-level object
  std::string key;
};

// Parses `text`; returns false and fills `duplicate` with the first repeated key if there is
// one. Throws nlohmann::json::exception on malformed JSON (the caller adds the file name).
bool parse_json_without_duplicates(std::string_view text, nlohmann::json& result,
                                   DuplicateKey& duplicate);

}  // namespace deepinfer
