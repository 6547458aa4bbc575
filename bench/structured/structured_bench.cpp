// Structured-output benchmark: grammar compile time, per-token mask time (median, p99) and
// memory for realistic schemas with the DeepSeek vocabulary (129,280 rows). The token sequence
// for each schema's example document is chosen greedily (longest allowed token matching the
// document text) and written out so xgrammar_bench.py measures the same steps. The sequence is
// replayed `reps` times, each time with a fresh matcher (its lazily built transitions are part of
// the cost), and the per-run median and p99 are reported as medians over the runs.
//
//   structured_bench [schemas.json] [token_sequences_out.json] [reps] [results_out.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "structured/grammar_matcher.h"
#include "structured/hf_vocab.h"
#include "structured/json_serialize.h"

using namespace deepinfer::structured;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  size_t index = std::min(values.size() - 1,
                          static_cast<size_t>(p * static_cast<double>(values.size() - 1) + 0.5));
  return values[index];
}

bool bit(const std::vector<uint32_t>& mask, size_t id) {
  return (mask[id / 32] >> (id % 32)) & 1u;
}

}  // namespace

int main(int argc, char** argv) {
  std::string schemas_path = argc > 1 ? argv[1] : DEEPINFER_BENCH_DIR "/schemas.json";
  std::string sequences_path = argc > 2 ? argv[2] : "structured_token_sequences.json";
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  std::string results_path = argc > 4 ? argv[4] : "";
  std::string tokenizer =
      std::string(DEEPINFER_SHARED_DIR) + "/data/tokenizers/deepseek_v3/tokenizer.json";
  auto start = Clock::now();
  auto vocab = std::make_shared<const VocabIndex>(
      load_hf_byte_level_vocab(tokenizer, 129280,
                               "<\xef\xbd\x9c"
                               "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"));
  std::printf("vocabulary: %zu rows, %zu ordinary tokens, index built in %.1f ms\n",
              vocab->vocab_size(), vocab->sorted_ids().size(), ms_since(start));
  std::ifstream stream(schemas_path);
  if (!stream) {
    std::fprintf(stderr, "cannot open %s\n", schemas_path.c_str());
    return 1;
  }
  Json cases = Json::parse(stream);
  Json sequences = Json::array();
  Json results = Json::array();
  std::printf("%-20s %10s %10s %10s %8s %10s %10s\n", "schema", "compile_ms", "mask_med_us",
              "mask_p99_us", "tokens", "grammar_KB", "matcher_KB");
  for (const auto& c : cases) {
    std::string schema = c["schema"].dump();
    std::vector<double> compile_ms;
    CompiledGrammar grammar;
    for (int rep = 0; rep < std::max(3, reps); ++rep) {
      auto t0 = Clock::now();
      grammar = compile_grammar({GrammarType::kJsonSchema, schema, {}, {}}, vocab);
      compile_ms.push_back(ms_since(t0));
    }
    std::string document = serialize_json(c["document"]);
    GrammarMatcher matcher(grammar);
    std::vector<uint32_t> mask(vocab->mask_words());
    std::vector<double> mask_us;
    std::vector<int32_t> tokens;
    size_t pos = 0;
    while (true) {
      auto t0 = Clock::now();
      matcher.fill_next_token_bitmask(mask);
      mask_us.push_back(ms_since(t0) * 1000.0);
      if (pos == document.size()) {
        int32_t stop = vocab->stop_ids()[0];
        if (!bit(mask, static_cast<size_t>(stop))) {
          std::fprintf(stderr, "%s: document complete but stop token not allowed\n",
                       c["name"].get<std::string>().c_str());
          return 1;
        }
        tokens.push_back(stop);
        matcher.accept_token(stop);
        break;
      }
      int32_t best = -1;
      size_t best_length = 0;
      for (int32_t id : vocab->sorted_ids()) {
        const std::string& bytes = vocab->bytes(id);
        if (bytes.size() > best_length && document.compare(pos, bytes.size(), bytes) == 0 &&
            bit(mask, static_cast<size_t>(id))) {
          best = id;
          best_length = bytes.size();
        }
      }
      if (best < 0) {
        std::fprintf(stderr, "%s: no allowed token continues the document at byte %zu\n",
                     c["name"].get<std::string>().c_str(), pos);
        return 1;
      }
      matcher.accept_token(best);
      tokens.push_back(best);
      pos += best_length;
    }
    std::vector<double> run_median{percentile(mask_us, 0.5)};
    std::vector<double> run_p99{percentile(mask_us, 0.99)};
    for (int rep = 1; rep < reps; ++rep) {
      GrammarMatcher replay(grammar);
      mask_us.clear();
      for (int32_t token : tokens) {
        auto t0 = Clock::now();
        replay.fill_next_token_bitmask(mask);
        mask_us.push_back(ms_since(t0) * 1000.0);
        if (!replay.accept_token(token)) {
          std::fprintf(stderr, "%s: replay rejects token %d\n",
                       c["name"].get<std::string>().c_str(), token);
          return 1;
        }
      }
      run_median.push_back(percentile(mask_us, 0.5));
      run_p99.push_back(percentile(mask_us, 0.99));
    }
    const double median_us = percentile(run_median, 0.5);
    const double p99_us = percentile(run_p99, 0.5);
    results.push_back({{"name", c["name"]},
                       {"compile_ms", percentile(compile_ms, 0.5)},
                       {"mask_median_us", median_us},
                       {"mask_p99_us", p99_us},
                       {"tokens", tokens.size()},
                       {"grammar_kb", static_cast<double>(grammar.memory_bytes()) / 1024.0}});
    std::printf("%-20s %10.2f %10.2f %10.1f %8zu %10.0f %10.0f\n",
                c["name"].get<std::string>().c_str(), percentile(compile_ms, 0.5), median_us,
                p99_us, tokens.size(), static_cast<double>(grammar.memory_bytes()) / 1024.0,
                static_cast<double>(matcher.memory_bytes()) / 1024.0);
    sequences.push_back({{"name", c["name"]}, {"tokens", tokens}});
  }
  std::ofstream(sequences_path) << sequences.dump() << '\n';
  if (!results_path.empty()) std::ofstream(results_path) << results.dump() << '\n';
  return 0;
}
