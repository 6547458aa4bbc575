// Matcher invariants against a brute-force oracle: the mask must equal "accept_token succeeds"
// for every token; every allowed token keeps the document completable; rollback restores the
// exact mask; stop tokens only when complete.
#include <gtest/gtest.h>

#include <random>

#include "structured/grammar_matcher.h"
#include "test_vocab.h"

namespace deepinfer::structured {
namespace {

using testing::small_vocab;

bool bit(const std::vector<uint32_t>& mask, size_t id) {
  return (mask[id / 32] >> (id % 32)) & 1u;
}

std::vector<uint32_t> mask_of(GrammarMatcher& m) {
  std::vector<uint32_t> mask(m.grammar().vocab().mask_words());
  m.fill_next_token_bitmask(mask);
  return mask;
}

// Walks randomly under the mask, checking the mask against accept_token for every token.
void check_walks(const GrammarSpec& spec, int walks, int max_steps, uint32_t seed) {
  auto vocab = small_vocab();
  CompiledGrammar grammar = compile_grammar(spec, vocab);
  std::mt19937 rng(seed);
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(grammar);
    for (int step = 0; step < max_steps && !m.is_terminated(); ++step) {
      auto mask = mask_of(m);
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < vocab->vocab_size(); ++id) {
        bool ok = m.accept_token(static_cast<int32_t>(id));
        ASSERT_EQ(ok, bit(mask, id))
            << "token " << id << " '" << vocab->bytes(static_cast<int32_t>(id)) << "' at step "
            << step;
        if (ok) {
          // No allowed token may lead to a dead state.
          auto next = mask_of(m);
          bool any = std::any_of(next.begin(), next.end(), [](uint32_t word) { return word != 0; });
          ASSERT_TRUE(any || m.is_terminated()) << "token " << id << " leads to a dead state";
          m.rollback(1);
          ASSERT_EQ(mask_of(m), mask) << "rollback did not restore the mask";
          allowed.push_back(static_cast<int32_t>(id));
        }
      }
      ASSERT_EQ(bit(mask, 0), m.is_complete())
          << "stop token must be allowed exactly when complete";
      ASSERT_FALSE(allowed.empty());
      // Prefer the stop token and short tokens so walks finish.
      int32_t pick = allowed[rng() % allowed.size()];
      if (bit(mask, 0) && rng() % 3 == 0) pick = 0;
      ASSERT_TRUE(m.accept_token(pick));
    }
  }
}

TEST(Matcher, MaskEqualsAcceptanceForJsonSchema) {
  GrammarSpec spec;
  spec.type = GrammarType::kJsonSchema;
  spec.text = R"({"type":"object","properties":{"name":{"type":"string","maxLength":3},
    "a":{"type":"array","items":{"enum":[1,"x",null]},"maxItems":2},"n":{"type":"integer","minimum":-5,"maximum":12}},
    "required":["n"],"additionalProperties":false})";
  check_walks(spec, 6, 25, 1);
}

TEST(Matcher, MaskEqualsAcceptanceWhenARuleHasManyReturnNodes) {
  // 80 string properties: the shared string rule returns to more places than the mask cache
  // analyses per return node, so its context-dependent tokens are all parsed at run time.
  std::string properties;
  for (int i = 0; i < 80; ++i) {
    properties +=
        std::string(i ? "," : "") + "\"p" + std::to_string(i) + "\":{\"type\":\"string\"}";
  }
  GrammarSpec spec;
  spec.type = GrammarType::kJsonSchema;
  spec.text = "{\"type\":\"object\",\"properties\":{" + properties +
              "},\"required\":[\"p0\",\"p1\"],\"additionalProperties\":false}";
  check_walks(spec, 3, 25, 5);
}

TEST(Matcher, MaskEqualsAcceptanceForRegexAndEbnf) {
  check_walks({GrammarType::kRegex, "(ab|[0-9]{1,3}\\.)+\"?", {}, {}}, 5, 12, 2);
  check_walks({GrammarType::kEbnf,
               "root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [a-c]+ | root",
               {},
               {}},
              5, 15, 3);
  check_walks({GrammarType::kAnyJson, "", {}, {}}, 4, 15, 4);
}

TEST(Matcher, RollbackRestoresMultipleTokensAndTermination) {
  auto vocab = small_vocab();
  CompiledGrammar grammar = compile_grammar({GrammarType::kRegex, "abc(d|e)", {}, {}}, vocab);
  GrammarMatcher m(grammar);
  auto initial = mask_of(m);
  auto id_of = [&](const std::string& text) {
    for (size_t id = 0; id < vocab->vocab_size(); ++id) {
      if (vocab->bytes(static_cast<int32_t>(id)) == text &&
          vocab->is_ordinary(static_cast<int32_t>(id)))
        return static_cast<int32_t>(id);
    }
    return -1;
  };
  ASSERT_TRUE(m.accept_token(id_of("abc")));
  EXPECT_FALSE(m.is_complete());
  EXPECT_FALSE(m.accept_token(0));
  ASSERT_TRUE(m.accept_token(id_of("d")));
  EXPECT_TRUE(m.is_complete());
  ASSERT_TRUE(m.accept_token(0));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.accept_token(id_of("d")));
  m.rollback(2);
  EXPECT_FALSE(m.is_terminated());
  EXPECT_FALSE(m.is_complete());
  ASSERT_TRUE(m.accept_token(id_of("e")));
  m.rollback(2);
  EXPECT_EQ(mask_of(m), initial);
  EXPECT_THROW(m.rollback(1), Error);
  EXPECT_FALSE(m.accept_token(1)) << "special tokens are never allowed";
  EXPECT_FALSE(m.accept_token(2)) << "empty rows are never allowed";
}

TEST(Matcher, EmptyLanguageIsAnErrorUnlessAllowed) {
  GrammarSpec spec{
      GrammarType::kJsonSchema, R"({"type":"integer","minimum":5,"maximum":4})", {}, {}};
  EXPECT_THROW(compile_grammar(spec, small_vocab()), Error);
  CompileOptions options;
  options.allow_empty_language = true;
  GrammarMatcher m(compile_grammar(spec, small_vocab(), options));
  auto mask = mask_of(m);
  EXPECT_TRUE(std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; }));
}

}  // namespace
}  // namespace deepinfer::structured
