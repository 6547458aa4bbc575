// Property tests with the DeepSeek vocabulary: random walks under the mask until completion
// always yield documents that the Python `jsonschema` package validates; every sampled allowed
// token keeps the document completable and every sampled disallowed token is rejected. Also the
// mask against accept_token (a plain byte-level parse, no mask cache) over the whole vocabulary
// at every step of walks through nested and recursive schemas, where tokens close strings and
// objects across several rules.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <unistd.h>

#include "structured/grammar_matcher.h"
#include "test_vocab.h"

namespace deepinfer::structured {
namespace {

const char* kSchemas[] = {
    // function-call arguments
    R"({"type":"object","properties":{"location":{"type":"string","maxLength":20},"unit":{"enum":["celsius","fahrenheit"]},
       "days":{"type":"integer","minimum":1,"maximum":14}},"required":["location"],"additionalProperties":false})",
    // nested objects with optional members and numbers
    R"({"type":"object","properties":{"user":{"type":"object","properties":{"id":{"type":"integer"},"score":{"type":"number","exclusiveMinimum":-1.5,"maximum":99.25},
       "tags":{"type":"array","items":{"type":"string","minLength":1,"maxLength":4},"maxItems":3}},"required":["id"],"additionalProperties":false},
       "ok":{"type":"boolean"},"note":{"type":["string","null"],"maxLength":6}},"required":["user","ok"],"additionalProperties":false})",
    // arrays of enums and prefixItems
    R"({"type":"array","prefixItems":[{"const":"head"},{"type":"integer","multipleOf":5}],"items":{"enum":["red","green",1.5,null,{"k":[1,2]}]},"minItems":2,"maxItems":6})",
    // string patterns and formats
    R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]{3}-\\d{2,4}$"},"mail":{"type":"string","format":"email","maxLength":24},
       "day":{"type":"string","format":"date"},"id":{"type":"string","format":"uuid"}},"required":["code","day"],"additionalProperties":false})",
    // recursive tree
    R"({"$defs":{"node":{"type":"object","properties":{"name":{"type":"string","maxLength":8},"children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},
       "required":["name"],"additionalProperties":false}},"$ref":"#/$defs/node"})",
    // unions, anyOf, patternProperties, additional properties with a schema
    R"({"anyOf":[{"type":"object","patternProperties":{"^x_":{"type":"integer"}},"additionalProperties":{"type":"string","maxLength":3},"propertyNames":{"maxLength":5}},
       {"type":"array","items":{"type":"number","minimum":0,"maximum":1}}]})",
    // allOf merge and oneOf with disjoint branches
    R"({"allOf":[{"properties":{"a":{"type":"integer","minimum":0}},"required":["a"]},{"properties":{"a":{"maximum":9},"b":{"oneOf":[{"type":"string","maxLength":3},{"type":"integer"}]}}}],
       "additionalProperties":false})",
};

bool bit(const std::vector<uint32_t>& mask, size_t id) {
  return (mask[id / 32] >> (id % 32)) & 1u;
}

std::string json_escape(const std::string& text) {
  return nlohmann::json(text).dump();
}

TEST(StructuredProperty, RandomWalksValidateWithPythonJsonschema) {
  auto vocab = testing::deepseek_vocab();
  if (!vocab)
    GTEST_SKIP() << "DeepSeek tokenizer not found at " << testing::deepseek_tokenizer_path();
  if (std::system(DEEPINFER_PYTHON " -c \"import jsonschema\" > /dev/null 2>&1") != 0) {
    GTEST_SKIP()
        << "python3 with jsonschema is not available (pip install -r requirements-test.txt)";
  }
  const bool sanitized = std::getenv("DEEPINFER_SANITIZER_BUILD") != nullptr;
  const int walks = sanitized ? 3 : 12;
  const int max_tokens = 160;
  std::filesystem::path out_path =
      std::filesystem::temp_directory_path() /
      ("deepinfer_structured_docs_" + std::to_string(::getpid()) + ".jsonl");
  std::ofstream out(out_path);
  std::mt19937 rng(1234);
  size_t documents = 0;
  for (const char* schema : kSchemas) {
    SCOPED_TRACE(schema);
    CompiledGrammar grammar = compile_grammar({GrammarType::kJsonSchema, schema, {}, {}}, vocab);
    const int32_t stop = vocab->stop_ids()[0];
    std::vector<uint32_t> mask(vocab->mask_words());
    int completed = 0;
    for (int w = 0; w < walks; ++w) {
      GrammarMatcher m(grammar);
      std::string text;
      for (int step = 0; step < max_tokens && !m.is_terminated(); ++step) {
        m.fill_next_token_bitmask(mask);
        std::vector<int32_t> allowed, short_allowed;
        for (size_t id = 0; id < vocab->vocab_size(); ++id) {
          if (!bit(mask, id)) continue;
          allowed.push_back(static_cast<int32_t>(id));
          if (vocab->is_ordinary(static_cast<int32_t>(id)) &&
              vocab->bytes(static_cast<int32_t>(id)).size() <= 2) {
            short_allowed.push_back(static_cast<int32_t>(id));
          }
        }
        ASSERT_FALSE(allowed.empty()) << "dead state after '" << text << "'";
        // Sampled disallowed tokens must be rejected; sampled allowed ones keep a live state.
        for (int probe = 0; probe < 8; ++probe) {
          auto id = static_cast<int32_t>(rng() % vocab->vocab_size());
          bool ok = m.accept_token(id);
          ASSERT_EQ(ok, bit(mask, static_cast<size_t>(id)))
              << "token " << id << " after '" << text << "'";
          if (ok) m.rollback(1);
        }
        int32_t pick;
        if (bit(mask, static_cast<size_t>(stop))) {
          pick = stop;
        } else if (!short_allowed.empty() && rng() % 4 != 0) {
          pick = short_allowed[rng() % short_allowed.size()];
        } else {
          pick = allowed[rng() % allowed.size()];
        }
        ASSERT_TRUE(m.accept_token(pick));
        if (pick != stop) {
          std::vector<uint32_t> next(vocab->mask_words());
          m.fill_next_token_bitmask(next);
          ASSERT_TRUE(
              std::any_of(next.begin(), next.end(), [](uint32_t word) { return word != 0; }))
              << "token " << pick << " led to a dead state after '" << text << "'";
          text += vocab->bytes(pick);
        }
      }
      if (!m.is_terminated()) continue;
      ++completed;
      ++documents;
      out << "{\"schema\":" << nlohmann::json::parse(schema).dump()
          << ",\"document\":" << json_escape(text) << "}\n";
    }
    EXPECT_GT(completed, 0) << "no random walk completed";
  }
  out.close();
  std::string command = std::string(DEEPINFER_PYTHON " ") + DEEPINFER_STRUCTURED_TEST_DIR +
                        "/validate_documents.py " + out_path.string();
  int rc = std::system(command.c_str());
  EXPECT_EQ(rc, 0) << "jsonschema rejected a generated document (see output above); docs in "
                   << out_path;
  if (rc == 0) std::filesystem::remove(out_path);
  EXPECT_GT(documents, 10u);
}

TEST(StructuredProperty, MaskEqualsAcceptanceOverTheWholeVocabulary) {
  auto vocab = testing::deepseek_vocab();
  if (!vocab)
    GTEST_SKIP() << "DeepSeek tokenizer not found at " << testing::deepseek_tokenizer_path();
  const bool sanitized = std::getenv("DEEPINFER_SANITIZER_BUILD") != nullptr;
  const int max_steps = sanitized ? 6 : 40;
  std::mt19937 rng(99);
  for (const char* schema : {kSchemas[1], kSchemas[4], kSchemas[5]}) {
    SCOPED_TRACE(schema);
    CompiledGrammar grammar = compile_grammar({GrammarType::kJsonSchema, schema, {}, {}}, vocab);
    GrammarMatcher m(grammar);
    std::vector<uint32_t> mask(vocab->mask_words());
    std::string text;
    for (int step = 0; step < max_steps && !m.is_terminated(); ++step) {
      m.fill_next_token_bitmask(mask);
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < vocab->vocab_size(); ++id) {
        const auto token = static_cast<int32_t>(id);
        bool ok = m.accept_token(token);
        ASSERT_EQ(ok, bit(mask, id)) << "token " << id << " after '" << text << "'";
        if (!ok) continue;
        m.rollback(1);
        allowed.push_back(token);
      }
      ASSERT_FALSE(allowed.empty()) << "dead state after '" << text << "'";
      // Prefer tokens that leave a string or a container, so walks cross rule boundaries.
      std::vector<int32_t> closing;
      for (int32_t id : allowed) {
        if (!vocab->is_ordinary(id)) continue;
        const std::string& bytes = vocab->bytes(id);
        if (bytes.size() > 1 && bytes.find_first_of("\"]}") != std::string::npos)
          closing.push_back(id);
      }
      int32_t pick = !closing.empty() && rng() % 2 == 0 ? closing[rng() % closing.size()]
                                                        : allowed[rng() % allowed.size()];
      ASSERT_TRUE(m.accept_token(pick));
      if (vocab->is_ordinary(pick)) text += vocab->bytes(pick);
    }
  }
}

}  // namespace
}  // namespace deepinfer::structured
