#include "io/strict_json.h"

#include <unordered_set>
#include <vector>

namespace deepinfer {

bool parse_json_without_duplicates(std::string_view text, nlohmann::json& result,
                                   DuplicateKey& duplicate) {
  using Json = nlohmann::json;
  std::vector<std::unordered_set<std::string>> open_objects;
  bool found = false;
  Json::parser_callback_t track_keys = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!found && !open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get<std::string>()).second) {
          found = true;
          duplicate = {depth, parsed.get<std::string>()};
        }
        break;
      default:
        break;
    }
    return true;
  };
  result = Json::parse(text.begin(), text.end(), track_keys);
  return !found;
}

}  // namespace deepinfer
