// JSON schema -> grammar. Supported keywords, the whitespace policy and property order are
// documented in docs/STRUCTURED_OUTPUTS.md. Anything that cannot be enforced exactly raises
// UnsupportedSchemaError naming the keyword; nothing is silently ignored except annotations and
// keywords unknown to JSON schema (as the specification requires).
#pragma once

#include <string>
#include <string_view>

#include "core/error.h"
#include "structured/grammar.h"
#include "structured/json_serialize.h"
#include "structured/limits.h"

namespace deepinfer::structured {

struct JsonSchemaOptions {
  // Compact (default): no whitespace between tokens. Flexible: any [ \t\n\r]* between tokens.
  bool flexible_whitespace = false;
  // When false, `format` is an annotation (the JSON-Schema-Test-Suite's main directory).
  bool enforce_format = true;
  // Treat an absent additionalProperties as false (what most structured-output users want).
  bool strict_properties = false;
};

class UnsupportedSchemaError : public Error {
 public:
  UnsupportedSchemaError(std::string feature, const std::string& message)
      : Error(message), feature_(std::move(feature)) {}
  const std::string& feature() const { return feature_; }

 private:
  std::string feature_;
};

Grammar json_schema_to_grammar(const Json& schema, const JsonSchemaOptions& options = {},
                               const GrammarLimits& limits = default_limits());
// Parses the schema text first; syntax errors name the byte position.
Grammar json_schema_to_grammar(std::string_view schema_text, const JsonSchemaOptions& options = {},
                               const GrammarLimits& limits = default_limits());
// Any JSON value (the built-in any-JSON mode).
Grammar any_json_grammar(const JsonSchemaOptions& options = {});

// The order in which the compiled grammar expects object keys: property names by first
// appearance in the schema, then all other keys. Use it to serialize instances for matching.
KeyRank schema_key_rank(const Json& schema);

}  // namespace deepinfer::structured
