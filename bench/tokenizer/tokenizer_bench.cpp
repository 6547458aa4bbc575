// Encoding throughput of deepinfer's tokenizer on a file of documents (one JSON string per
// line), single thread and all threads. run_bench.py runs this and HF tokenizers on the same
// text and prints both; the figures are recorded in docs/TOKENIZER.md.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_DIR DOCUMENTS.jsonl [repeats]\n", argv[0]);
    return 2;
  }
  const auto tokenizer = deepinfer::tokenizer::Tokenizer::from_dir(argv[1]);
  const int repeats = argc > 3 ? std::stoi(argv[3]) : 3;
  std::vector<std::string> documents;
  std::ifstream file(argv[2]);
  std::string line;
  std::size_t bytes = 0;
  while (std::getline(file, line)) {
    documents.push_back(nlohmann::json::parse(line).get<std::string>());
    bytes += documents.back().size();
  }
  auto best_seconds = [&](auto&& run) {
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const auto start = std::chrono::steady_clock::now();
      run();
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
  };
  std::size_t tokens = 0;
  const double single = best_seconds([&] {
    tokens = 0;
    for (const auto& doc : documents) tokens += tokenizer.encode(doc, false).size();
  });
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  const double all = best_seconds([&] { (void)tokenizer.encode_batch(documents, false, threads); });
  std::printf(
      "{\"documents\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"threads\": %u, "
      "\"single_thread_mb_s\": %.2f, \"all_threads_mb_s\": %.2f}\n",
      documents.size(), bytes, tokens, threads, bytes / single / 1e6, bytes / all / 1e6);
  return 0;
}
