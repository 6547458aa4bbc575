// Validation and JSON form of SamplingParams. Rules follow vLLM's SamplingParams checks and
// the OpenAI API ranges; every message names the field and the offending value so that a
// client can fix its request without reading our code.
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "deepinfer/sampling_params.h"
#include "sampling/sampling_params_json.h"

namespace deepinfer {
namespace {

constexpr std::string_view kSchemaTypes = "\"regex\", \"json\", \"ebnf\" or \"any_json\"";

[[noreturn]] void fail_field(std::string_view field, std::string_view requirement,
                             const std::string& value) {
  DI_THROW("invalid sampling params: ", field, " must be ", requirement, ", got ", value);
}

std::string show(float value) {
  if (std::isnan(value)) return "nan";
  return concat(value);
}

void check_finite(std::string_view field, float value) {
  if (!std::isfinite(value)) fail_field(field, "a finite number", show(value));
}

}  // namespace

bool SamplingParams::is_greedy() const {
  return temperature < kGreedyTemperature;
}

void SamplingParams::validate() const {
  if (n < 1) fail_field("n", ">= 1", concat(n));
  check_finite("temperature", temperature);
  if (temperature < 0.0f) fail_field("temperature", ">= 0 (0 means greedy)", show(temperature));
  check_finite("top_p", top_p);
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail_field("top_p", "in (0, 1]", show(top_p));
  if (top_k < -1) fail_field("top_k", ">= 1, or 0 or -1 to disable it", concat(top_k));
  check_finite("min_p", min_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) fail_field("min_p", "in [0, 1]", show(min_p));
  check_finite("repetition_penalty", repetition_penalty);
  if (!(repetition_penalty > 0.0f)) {
    fail_field("repetition_penalty", "> 0 (1 disables it)", show(repetition_penalty));
  }
  check_finite("presence_penalty", presence_penalty);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    fail_field("presence_penalty", "in [-2, 2]", show(presence_penalty));
  }
  check_finite("frequency_penalty", frequency_penalty);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    fail_field("frequency_penalty", "in [-2, 2]", show(frequency_penalty));
  }
  if (max_tokens && *max_tokens < 1) {
    fail_field("max_tokens", ">= 1 (or null for the model's maximum length)", concat(*max_tokens));
  }
  if (min_tokens < 0) fail_field("min_tokens", ">= 0", concat(min_tokens));
  if (max_tokens && min_tokens > *max_tokens) {
    fail_field("min_tokens", concat("<= max_tokens (", *max_tokens, ")"), concat(min_tokens));
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) fail_field(concat("stop[", i, "]"), "a non-empty string", "\"\"");
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    if (stop_token_ids[i] < 0) {
      fail_field(concat("stop_token_ids[", i, "]"), "a token id >= 0", concat(stop_token_ids[i]));
    }
  }
  if (logprobs && *logprobs < 0) {
    fail_field("logprobs", ">= 0 (or null for none)", concat(*logprobs));
  }
  if (so_args) {
    const std::string& type = so_args->schema_type;
    if (type == "regex" || type == "json" || type == "ebnf") {
      if (so_args->schema.empty()) {
        fail_field("so_args.schema", concat("non-empty for schema_type \"", type, "\""), "\"\"");
      }
    } else if (type == "any_json") {
      if (!so_args->schema.empty()) {
        fail_field("so_args.schema", "empty for schema_type \"any_json\"",
                   concat("\"", so_args->schema, "\""));
      }
    } else {
      fail_field("so_args.schema_type", kSchemaTypes, concat("\"", type, "\""));
    }
  }
}

namespace {

using nlohmann::json;

[[noreturn]] void fail_type(std::string_view key, std::string_view expected, const json& value) {
  DI_THROW("invalid sampling params: ", key, " must be ", expected, ", got ", value.type_name(),
           " ", value.dump());
}

int32_t to_int32(std::string_view key, const json& value) {
  if (!value.is_number_integer()) fail_type(key, "an integer", value);
  if (value.is_number_unsigned()) {
    const auto v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      fail_type(key, "an integer that fits in 32 bits", value);
    }
    return static_cast<int32_t>(v);
  }
  const auto v = value.get<int64_t>();
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    fail_type(key, "an integer that fits in 32 bits", value);
  }
  return static_cast<int32_t>(v);
}

float to_float(std::string_view key, const json& value) {
  if (!value.is_number()) fail_type(key, "a number", value);
  return static_cast<float>(value.get<double>());
}

bool to_bool(std::string_view key, const json& value) {
  if (!value.is_boolean()) fail_type(key, "true or false", value);
  return value.get<bool>();
}

std::string to_string(std::string_view key, const json& value) {
  if (!value.is_string()) fail_type(key, "a string", value);
  return value.get<std::string>();
}

StructuredOutputArgs to_so_args(const json& value) {
  if (!value.is_object()) fail_type("so_args", "an object {\"schema_type\", \"schema\"}", value);
  StructuredOutputArgs args;
  bool has_type = false;
  for (const auto& [key, item] : value.items()) {
    if (key == "schema_type") {
      args.schema_type = to_string("so_args.schema_type", item);
      has_type = true;
    } else if (key == "schema") {
      // A JSON Schema is naturally written inline as an object (or true/false).
      if (!item.is_string() && !item.is_object() && !item.is_boolean()) {
        fail_type("so_args.schema", "a string, or an object for a JSON Schema", item);
      }
      args.schema = item.is_string() ? item.get<std::string>() : item.dump();
    } else {
      DI_THROW("invalid sampling params: unknown key \"so_args.", key,
               "\" (accepted: schema_type, schema)");
    }
  }
  if (!has_type) DI_THROW("invalid sampling params: so_args needs \"schema_type\": ", kSchemaTypes);
  return args;
}

}  // namespace

SamplingParams sampling_params_from_json_value(const json& object) {
  if (!object.is_object()) fail_type("sampling params", "a JSON object", object);
  SamplingParams params;
  for (const auto& [key, value] : object.items()) {
    if (key == "n") {
      params.n = to_int32(key, value);
    } else if (key == "temperature") {
      params.temperature = to_float(key, value);
    } else if (key == "top_p") {
      params.top_p = to_float(key, value);
    } else if (key == "top_k") {
      params.top_k = to_int32(key, value);
    } else if (key == "min_p") {
      params.min_p = to_float(key, value);
    } else if (key == "repetition_penalty") {
      params.repetition_penalty = to_float(key, value);
    } else if (key == "presence_penalty") {
      params.presence_penalty = to_float(key, value);
    } else if (key == "frequency_penalty") {
      params.frequency_penalty = to_float(key, value);
    } else if (key == "max_tokens") {
      params.max_tokens =
          value.is_null() ? std::nullopt : std::optional<int32_t>(to_int32(key, value));
    } else if (key == "min_tokens") {
      params.min_tokens = to_int32(key, value);
    } else if (key == "stop") {
      params.stop.clear();
      if (value.is_string()) {
        params.stop.push_back(value.get<std::string>());
      } else if (value.is_array()) {
        for (size_t i = 0; i < value.size(); ++i) {
          params.stop.push_back(to_string(concat("stop[", i, "]"), value[i]));
        }
      } else if (!value.is_null()) {
        fail_type(key, "a string or an array of strings", value);
      }
    } else if (key == "stop_token_ids") {
      params.stop_token_ids.clear();
      if (!value.is_array() && !value.is_null()) fail_type(key, "an array of integers", value);
      if (value.is_array()) {
        for (size_t i = 0; i < value.size(); ++i) {
          params.stop_token_ids.push_back(to_int32(concat("stop_token_ids[", i, "]"), value[i]));
        }
      }
    } else if (key == "ignore_eos") {
      params.ignore_eos = to_bool(key, value);
    } else if (key == "seq_seed") {
      if (value.is_null()) {
        params.seq_seed.reset();
      } else if (value.is_number_unsigned()) {
        params.seq_seed = value.get<uint64_t>();
      } else {
        fail_type(key, "an integer in [0, 2^64) or null", value);
      }
    } else if (key == "logprobs") {
      params.logprobs =
          value.is_null() ? std::nullopt : std::optional<int32_t>(to_int32(key, value));
    } else if (key == "skip_special_tokens") {
      params.skip_special_tokens = to_bool(key, value);
    } else if (key == "so_args") {
      params.so_args =
          value.is_null() ? std::nullopt : std::optional<StructuredOutputArgs>(to_so_args(value));
    } else {
      DI_THROW("invalid sampling params: unknown key \"", key,
               "\" (accepted: n, temperature, top_p, top_k, min_p, repetition_penalty, "
               "presence_penalty, frequency_penalty, max_tokens, min_tokens, stop, "
               "stop_token_ids, ignore_eos, seq_seed, logprobs, skip_special_tokens, so_args)");
    }
  }
  params.validate();
  return params;
}

SamplingParams sampling_params_from_json(std::string_view json_text) {
  json object;
  try {
    object = json::parse(json_text);
  } catch (const json::parse_error& error) {
    DI_THROW("invalid sampling params: not valid JSON: ", error.what());
  }
  return sampling_params_from_json_value(object);
}

namespace {

// The shortest decimal that reads back as the same float, so that 0.7f prints as 0.7 rather
// than as the double 0.699999988079071. Decimal -> double -> float rounds twice, so the exact
// double is the fallback for the rare value where that changes the float.
json shortest(float value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof(text), value);
  const double parsed = std::stod(std::string(text, result.ptr));
  return static_cast<float>(parsed) == value ? json(parsed) : json(static_cast<double>(value));
}

}  // namespace

std::string sampling_params_to_json(const SamplingParams& params) {
  json object = {
      {"n", params.n},
      {"temperature", shortest(params.temperature)},
      {"top_p", shortest(params.top_p)},
      {"top_k", params.top_k},
      {"min_p", shortest(params.min_p)},
      {"repetition_penalty", shortest(params.repetition_penalty)},
      {"presence_penalty", shortest(params.presence_penalty)},
      {"frequency_penalty", shortest(params.frequency_penalty)},
      {"max_tokens", params.max_tokens ? json(*params.max_tokens) : json(nullptr)},
      {"min_tokens", params.min_tokens},
      {"stop", params.stop},
      {"stop_token_ids", params.stop_token_ids},
      {"ignore_eos", params.ignore_eos},
      {"seq_seed", params.seq_seed ? json(*params.seq_seed) : json(nullptr)},
      {"logprobs", params.logprobs ? json(*params.logprobs) : json(nullptr)},
      {"skip_special_tokens", params.skip_special_tokens},
      {"so_args", params.so_args ? json{{"schema_type", params.so_args->schema_type},
                                        {"schema", params.so_args->schema}}
                                 : json(nullptr)},
  };
  return object.dump();
}

}  // namespace deepinfer
