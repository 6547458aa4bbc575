#include "structured/json_serialize.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/error.h"
#include "structured/utf8_ranges.h"

namespace deepinfer::structured {

std::string serialize_json_string(const std::string& text) {
  std::string out = "\"";
  for (size_t pos = 0; pos < text.size();) {
    uint32_t cp;
    if (!decode_utf8(text, pos, cp)) DI_THROW("string is not valid UTF-8");
    out += encode_code_point(cp, TextEncoding::kJsonString);
  }
  out += '"';
  return out;
}

std::string number_text(const Json& number) {
  if (number.is_number_integer()) return number.dump();
  double value = number.get<double>();
  if (!std::isfinite(value)) DI_THROW("non-finite number cannot be serialized as JSON");
  char buffer[512];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::fixed);
  if (result.ec != std::errc()) DI_THROW("number too long to serialize");
  return std::string(buffer, result.ptr);
}

std::string serialize_json(const Json& value, const KeyRank& rank) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return value.get<bool>() ? "true" : "false";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return number_text(value);
    case Json::value_t::string:
      return serialize_json_string(value.get<std::string>());
    case Json::value_t::array: {
      std::string out = "[";
      bool first = true;
      for (const auto& item : value) {
        if (!first) out += ',';
        first = false;
        out += serialize_json(item, rank);
      }
      return out + "]";
    }
    case Json::value_t::object: {
      std::vector<std::pair<std::string, const Json*>> items;
      for (auto it = value.begin(); it != value.end(); ++it)
        items.emplace_back(it.key(), &it.value());
      if (rank) {
        std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) {
          return rank(a.first) < rank(b.first);
        });
      }
      std::string out = "{";
      bool first = true;
      for (const auto& [key, item] : items) {
        if (!first) out += ',';
        first = false;
        out += serialize_json_string(key);
        out += ':';
        out += serialize_json(*item, rank);
      }
      return out + "}";
    }
    default:
      DI_THROW("cannot serialize a binary or discarded JSON value");
  }
}

}  // namespace deepinfer::structured
