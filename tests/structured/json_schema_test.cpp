// JSON schema compiler: numeric and string constraints against exact arithmetic oracles,
// unsupported keywords, error messages.
#include <gtest/gtest.h>

#include "structured/automaton.h"
#include "structured/json_schema.h"
#include "structured/stack_pool.h"

namespace deepinfer::structured {
namespace {

bool accepts(const Automaton& automaton, const std::string& text) {
  if (automaton.empty_language) return false;
  StackPool pool(automaton, default_limits(), false);
  int32_t set = pool.step_bytes(pool.initial_set(),
                                {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  return set != kDeadSet && (pool.flags(set) & kCanFinish);
}

Automaton compile(const std::string& schema, JsonSchemaOptions options = {}) {
  return build_automaton(json_schema_to_grammar(std::string_view(schema), options),
                         default_limits());
}

// Numerals for value/100 in [-600, 600]: the minimal form and one with a trailing zero.
struct Numeral {
  std::string text;
  long hundredths;
};
std::vector<Numeral> numerals() {
  std::vector<Numeral> out;
  for (long v = -600; v <= 600; ++v) {
    long a = std::labs(v);
    std::string sign = v < 0 ? "-" : "";
    std::string whole = std::to_string(a / 100);
    long frac = a % 100;
    if (frac == 0) {
      out.push_back({sign + whole, v});
      out.push_back({sign + whole + ".0", v});
    } else {
      std::string f = (frac < 10 ? "0" : "") + std::to_string(frac);
      if (f.back() == '0') f.pop_back();
      out.push_back({sign + whole + "." + f, v});
      out.push_back({sign + whole + "." + f + "0", v});
    }
  }
  return out;
}

std::string decimal(long hundredths) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%s%ld.%02ld", hundredths < 0 ? "-" : "",
                std::labs(hundredths) / 100, std::labs(hundredths) % 100);
  return buffer;
}

TEST(JsonSchemaNumbers, BoundsAgreeWithExactComparison) {
  const long bounds[] = {-250, -5, 0, 3, 150, 500};
  for (long lo : bounds) {
    for (long hi : bounds) {
      for (int kind = 0; kind < 4; ++kind) {
        bool lo_excl = kind & 1, hi_excl = kind & 2;
        std::string schema = std::string("{\"type\":\"number\",\"") +
                             (lo_excl ? "exclusiveMinimum" : "minimum") + "\":" + decimal(lo) +
                             ",\"" + (hi_excl ? "exclusiveMaximum" : "maximum") +
                             "\":" + decimal(hi) + "}";
        SCOPED_TRACE(schema);
        Automaton automaton = compile(schema);
        for (const auto& n : numerals()) {
          bool expected = (lo_excl ? n.hundredths > lo : n.hundredths >= lo) &&
                          (hi_excl ? n.hundredths < hi : n.hundredths <= hi);
          ASSERT_EQ(accepts(automaton, n.text), expected) << n.text;
        }
      }
    }
  }
}

TEST(JsonSchemaNumbers, MultipleOfAgreesWithIntegerArithmetic) {
  for (long step : {1L, 3L, 25L, 50L, 100L, 300L, 7L}) {
    for (const char* type : {"number", "integer"}) {
      std::string schema = std::string("{\"type\":\"") + type +
                           "\",\"multipleOf\":" + decimal(step) + ",\"minimum\":-4.5}";
      SCOPED_TRACE(schema);
      Automaton automaton = compile(schema);
      for (const auto& n : numerals()) {
        bool expected = n.hundredths % step == 0 && n.hundredths >= -450 &&
                        (std::string(type) == "number" || n.hundredths % 100 == 0);
        ASSERT_EQ(accepts(automaton, n.text), expected) << n.text;
      }
    }
  }
}

TEST(JsonSchemaStrings, LengthCountsCodePointsAndEscapes) {
  Automaton automaton = compile(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_FALSE(accepts(automaton, "\"a\""));
  EXPECT_TRUE(accepts(automaton, "\"ab\""));
  EXPECT_TRUE(accepts(automaton, "\"\xc3\xa9\xe2\x82\xac\""));  // two code points, five bytes
  EXPECT_TRUE(accepts(automaton, "\"\\n\\u0041b\""));
  EXPECT_FALSE(accepts(automaton, "\"abcd\""));
  EXPECT_FALSE(accepts(automaton, "\"a\nb\""));  // raw control characters are not JSON
}

TEST(JsonSchemaObjects, PropertyOrderRequiredAndAdditional) {
  Automaton automaton =
      compile(R"({"properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{}},
      "required":["b"],"additionalProperties":{"type":"boolean"}})");
  EXPECT_TRUE(accepts(automaton, R"({"b":"x"})"));
  EXPECT_TRUE(accepts(automaton, R"({"a":1,"b":"x","c":[1,{}]})"));
  EXPECT_TRUE(accepts(automaton, R"({"b":"x","z":true,"y":false})"));
  EXPECT_FALSE(accepts(automaton, R"({"a":1})"));
  EXPECT_FALSE(accepts(automaton, R"({"b":"x","a":1})"))
      << "declared properties follow schema order";
  EXPECT_FALSE(accepts(automaton, R"({"b":"x","z":1})"));
  EXPECT_FALSE(accepts(automaton, R"({"b":"x","a":true})"))
      << "a declared name is not an additional property";
  EXPECT_FALSE(accepts(automaton, R"({"b":"x",})"));
}

TEST(JsonSchemaObjects, FlexibleWhitespaceIsOptIn) {
  JsonSchemaOptions flexible;
  flexible.flexible_whitespace = true;
  const std::string schema = R"({"type":"object","properties":{"a":{"type":"array"}}})";
  EXPECT_FALSE(accepts(compile(schema), "{ \"a\" : [ 1 , 2 ] }"));
  EXPECT_TRUE(accepts(compile(schema, flexible), "{ \"a\" : [ 1 , 2 ] }\n"));
}

TEST(JsonSchemaErrors, UnsupportedKeywordsAreErrorsNamingTheFeature) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"uniqueItems":true})", "uniqueItems"},
      {R"({"not":{"minimum":3}})", "not"},
      {R"({"contains":{"type":"integer"},"maxContains":2})", "maxContains"},
      {R"({"properties":{"a":{}},"minProperties":1})", "minProperties"},
      {R"({"dependentRequired":{"a":["b"]}})", "dependentRequired"},
      {R"({"if":{"type":"string"},"then":{"minLength":2}})", "if"},
      {R"({"oneOf":[{"type":"integer"},{"minimum":2}]})", "oneOf"},
      {R"({"$schema":"https://example.com/custom-meta","type":"string"})", "$schema"},
  };
  for (const auto& [fragment, keyword] : cases) {
    std::string schema = std::string(R"({"properties":{"x":)") + fragment + "}}";
    SCOPED_TRACE(schema);
    try {
      compile(schema);
      ADD_FAILURE() << "no error";
    } catch (const UnsupportedSchemaError& e) {
      EXPECT_EQ(e.feature(), keyword);
      EXPECT_NE(std::string(e.what()).find("#/properties/x"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(compile(
      R"({"uniqueItems":false,"contentMediaType":"text/plain","title":"t","minContains":3})"));
}

TEST(JsonSchemaErrors, BadSchemasNamePositionAndReason) {
  auto message = [](const std::string& schema) {
    try {
      compile(schema);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(R"({"type":"strin"})").find("unknown type 'strin'"), std::string::npos);
  EXPECT_NE(message(R"({"type": "string",})").find("at byte"), std::string::npos);
  EXPECT_NE(message(R"J({"items":{"pattern":"(?=a)"}})J").find("#/items"), std::string::npos);
  EXPECT_NE(message(R"({"$ref":"#/$defs/missing"})").find("does not resolve"), std::string::npos);
  EXPECT_NE(message(R"({"$ref":"https://example.com/s.json"})").find("remote"), std::string::npos);
  EXPECT_NE(message(R"({"minLength":-1})").find("non-negative integer"), std::string::npos);
}

TEST(JsonSchemaRefs, RecursiveTree) {
  Automaton automaton =
      compile(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},
      "$ref":"#/$defs/node"})");
  EXPECT_TRUE(accepts(automaton, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(accepts(automaton, R"({"v":1,"kids":[{"v":2},{"kids":[]}]})"));
}

}  // namespace
}  // namespace deepinfer::structured
