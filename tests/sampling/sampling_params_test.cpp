// SamplingParams validation and JSON parsing: every rejection names the field and the value.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer {
namespace {

std::string validation_error(const SamplingParams& params) {
  try {
    params.validate();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

std::string parse_error(const std::string& text) {
  try {
    sampling_params_from_json(text);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

TEST(SamplingParams, DefaultsAndBoundariesAreValid) {
  EXPECT_NO_THROW(SamplingParams{}.validate());
  const std::vector<std::function<void(SamplingParams&)>> valid = {
      [](SamplingParams& p) { p.temperature = 0.0f; },
      [](SamplingParams& p) { p.top_p = 1.0f; },
      [](SamplingParams& p) { p.top_p = 1e-6f; },
      [](SamplingParams& p) { p.top_k = -1; },
      [](SamplingParams& p) { p.top_k = 0; },
      [](SamplingParams& p) { p.top_k = 1; },
      [](SamplingParams& p) { p.min_p = 1.0f; },
      [](SamplingParams& p) { p.presence_penalty = -2.0f; },
      [](SamplingParams& p) { p.frequency_penalty = 2.0f; },
      [](SamplingParams& p) { p.max_tokens.reset(); },
      [](SamplingParams& p) { p.min_tokens = 16; },
      [](SamplingParams& p) { p.logprobs = 0; },
      [](SamplingParams& p) {
        p.so_args = StructuredOutputArgs{"any_json", ""};
      },
      [](SamplingParams& p) {
        p.so_args = StructuredOutputArgs{"regex", "[a-z]+"};
      },
  };
  for (size_t i = 0; i < valid.size(); ++i) {
    SamplingParams params;
    valid[i](params);
    EXPECT_EQ(validation_error(params), "") << "case " << i;
  }
}

struct BadCase {
  std::function<void(SamplingParams&)> mutate;
  std::string field;
  std::string value;
};

TEST(SamplingParams, ValidationNamesFieldAndValue) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<BadCase> cases = {
      {[](SamplingParams& p) { p.n = 0; }, "n", "got 0"},
      {[](SamplingParams& p) { p.temperature = -0.5f; }, "temperature", "got -0.5"},
      {[&](SamplingParams& p) { p.temperature = nan; }, "temperature", "got nan"},
      {[&](SamplingParams& p) { p.temperature = inf; }, "temperature", "got inf"},
      {[](SamplingParams& p) { p.top_p = 0.0f; }, "top_p", "got 0"},
      {[](SamplingParams& p) { p.top_p = 1.5f; }, "top_p", "got 1.5"},
      {[&](SamplingParams& p) { p.top_p = nan; }, "top_p", "got nan"},
      {[](SamplingParams& p) { p.top_k = -2; }, "top_k", "got -2"},
      {[](SamplingParams& p) { p.min_p = -0.25f; }, "min_p", "got -0.25"},
      {[](SamplingParams& p) { p.min_p = 1.25f; }, "min_p", "got 1.25"},
      {[](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty", "got 0"},
      {[&](SamplingParams& p) { p.repetition_penalty = nan; }, "repetition_penalty", "got nan"},
      {[](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty", "got 2.5"},
      {[](SamplingParams& p) { p.frequency_penalty = -3.0f; }, "frequency_penalty", "got -3"},
      {[](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens", "got 0"},
      {[](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens", "got -1"},
      {[](SamplingParams& p) { p.min_tokens = 17; }, "min_tokens", "got 17"},
      {[](SamplingParams& p) {
         p.stop = {"ok", ""};
       },
       "stop[1]", "got \"\""},
      {[](SamplingParams& p) {
         p.stop_token_ids = {3, -5};
       },
       "stop_token_ids[1]", "got -5"},
      {[](SamplingParams& p) { p.logprobs = -1; }, "logprobs", "got -1"},
      {[](SamplingParams& p) {
         p.so_args = StructuredOutputArgs{"xml", "<a/>"};
       },
       "so_args.schema_type", "got \"xml\""},
      {[](SamplingParams& p) {
         p.so_args = StructuredOutputArgs{"json", ""};
       },
       "so_args.schema", "got \"\""},
      {[](SamplingParams& p) {
         p.so_args = StructuredOutputArgs{"any_json", "{}"};
       },
       "so_args.schema", "got \"{}\""},
  };
  for (const auto& c : cases) {
    SamplingParams params;
    c.mutate(params);
    const std::string message = validation_error(params);
    EXPECT_NE(message.find(c.field + " must be"), std::string::npos) << message;
    EXPECT_NE(message.find(c.value), std::string::npos) << message;
  }
}

TEST(SamplingParams, ParsesEveryFieldFromJson) {
  const SamplingParams params = sampling_params_from_json(R"({
      "n": 3, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
      "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
      "max_tokens": 128, "min_tokens": 4, "stop": ["\n\n", "END"], "stop_token_ids": [1, 2],
      "ignore_eos": true, "seq_seed": 18446744073709551615, "logprobs": 5,
      "skip_special_tokens": false,
      "so_args": {"schema_type": "json", "schema": {"type": "object"}}})");
  EXPECT_EQ(params.n, 3);
  EXPECT_EQ(params.temperature, 0.7f);
  EXPECT_EQ(params.top_p, 0.9f);
  EXPECT_EQ(params.top_k, 40);
  EXPECT_EQ(params.min_p, 0.05f);
  EXPECT_EQ(params.repetition_penalty, 1.1f);
  EXPECT_EQ(params.presence_penalty, 0.5f);
  EXPECT_EQ(params.frequency_penalty, -0.5f);
  EXPECT_EQ(params.max_tokens, 128);
  EXPECT_EQ(params.min_tokens, 4);
  EXPECT_EQ(params.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(params.stop_token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(params.ignore_eos);
  EXPECT_EQ(params.seq_seed, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(params.logprobs, 5);
  EXPECT_FALSE(params.skip_special_tokens);
  ASSERT_TRUE(params.so_args.has_value());
  EXPECT_EQ(params.so_args->schema_type, "json");
  EXPECT_EQ(params.so_args->schema, R"({"type":"object"})");

  // Absent keys keep the defaults; null clears an optional; "stop" may be one string.
  const SamplingParams sparse = sampling_params_from_json(R"({"stop": "###", "max_tokens": null})");
  EXPECT_EQ(sparse.stop, (std::vector<std::string>{"###"}));
  EXPECT_FALSE(sparse.max_tokens.has_value());
  EXPECT_EQ(sparse.temperature, SamplingParams{}.temperature);
  EXPECT_EQ(sampling_params_from_json("{}"), SamplingParams{});
}

TEST(SamplingParams, JsonRoundTrip) {
  SamplingParams params;
  params.n = 2;
  params.temperature = 0.7f;
  params.top_p = 0.95f;
  params.top_k = -1;
  params.min_p = 0.1f;
  params.repetition_penalty = 1.3f;
  params.presence_penalty = -1.25f;
  params.frequency_penalty = 0.3f;
  params.max_tokens.reset();
  params.min_tokens = 2;
  params.stop = {"a\"b", "\\n"};
  params.stop_token_ids = {7};
  params.ignore_eos = true;
  params.seq_seed = 1234567890123ull;
  params.logprobs = 0;
  params.skip_special_tokens = false;
  params.so_args = StructuredOutputArgs{"ebnf", "root ::= \"x\""};
  const std::string text = sampling_params_to_json(params);
  EXPECT_EQ(sampling_params_from_json(text), params) << text;
  EXPECT_NE(text.find("\"temperature\":0.7"), std::string::npos) << text;
  EXPECT_EQ(sampling_params_from_json(sampling_params_to_json(SamplingParams{})), SamplingParams{});
}

TEST(SamplingParams, JsonErrorsNameTheKey) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {R"({"temprature": 0.5})", {"unknown key \"temprature\""}},
      {R"({"so_args": {"schema_type": "regex", "schema": "a", "flags": 1}})",
       {"unknown key \"so_args.flags\""}},
      {R"({"so_args": {"schema": "a"}})", {"so_args needs \"schema_type\""}},
      {R"({"temperature": "hot"})", {"temperature must be a number", "\"hot\""}},
      {R"({"n": 1.5})", {"n must be an integer", "1.5"}},
      {R"({"top_k": 5000000000})", {"top_k must be an integer that fits in 32 bits"}},
      {R"({"stop": 5})", {"stop must be a string or an array of strings"}},
      {R"({"stop": ["a", 5]})", {"stop[1] must be a string"}},
      {R"({"stop_token_ids": [1, "2"]})", {"stop_token_ids[1] must be an integer"}},
      {R"({"seq_seed": -1})", {"seq_seed must be an integer in [0, 2^64)", "-1"}},
      {R"({"ignore_eos": 1})", {"ignore_eos must be true or false"}},
      {R"({"so_args": "json"})", {"so_args must be an object"}},
      {R"({"so_args": {"schema_type": "json", "schema": 3}})", {"so_args.schema must be"}},
      {R"({"temperature": -1})", {"temperature must be >= 0", "got -1"}},
      {R"({"so_args": {"schema_type": "yaml", "schema": "a"}})",
       {"so_args.schema_type must be", "\"yaml\""}},
      {R"([1, 2])", {"must be a JSON object"}},
      {R"({"n": )", {"not valid JSON"}},
  };
  for (const auto& [text, needles] : cases) {
    const std::string message = parse_error(text);
    ASSERT_FALSE(message.empty()) << text;
    for (const auto& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos) << text << " -> " << message;
    }
  }
}

}  // namespace
}  // namespace deepinfer
