// Subcommands of the tokenizer layer: line-oriented hooks for cross-checks against HF.
//   deepinfer tokenize --tokenizer DIR [--no-special]   JSON string per line -> JSON id array
//   deepinfer detokenize --tokenizer DIR [--skip-special] JSON id array per line -> JSON string
//   deepinfer engram-map --tokenizer DIR                {"compressed_vocab": N, "map": [...]}
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "tokenizer/engram_map.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

struct TokenizerOptions {
  std::string dir;
  bool no_special = false;
  bool skip_special = false;
};

void run_tokenize(const TokenizerOptions& options) {
  const auto tokenizer = tokenizer::Tokenizer::from_dir(options.dir);
  std::string line;
  for (std::size_t line_number = 1; std::getline(std::cin, line); ++line_number) {
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      DI_THROW("stdin line ", line_number, ": not valid JSON: ", e.what());
    }
    if (!value.is_string()) DI_THROW("stdin line ", line_number, ": expected a JSON string");
    const auto ids = tokenizer.encode(value.get_ref<const std::string&>(), !options.no_special);
    std::cout << nlohmann::json(ids).dump() << '\n';
  }
}

void run_detokenize(const TokenizerOptions& options) {
  const auto tokenizer = tokenizer::Tokenizer::from_dir(options.dir);
  std::string line;
  for (std::size_t line_number = 1; std::getline(std::cin, line); ++line_number) {
    std::vector<int32_t> ids;
    try {
      ids = nlohmann::json::parse(line).get<std::vector<int32_t>>();
    } catch (const nlohmann::json::exception& e) {
      DI_THROW("stdin line ", line_number, ": expected a JSON array of token ids: ", e.what());
    }
    try {
      std::cout << nlohmann::json(tokenizer.decode(ids, options.skip_special)).dump() << '\n';
    } catch (const Error& e) {
      DI_THROW("stdin line ", line_number, ": ", e.what());
    }
  }
}

void run_engram_map(const TokenizerOptions& options) {
  const auto tokenizer = tokenizer::Tokenizer::from_dir(options.dir);
  const auto map = tokenizer::build_compressed_token_map(tokenizer);
  nlohmann::json out;
  out["compressed_vocab"] = map.compressed_vocab_size;
  out["map"] = map.lookup;
  std::cout << out.dump() << '\n';
}

}  // namespace

void register_tokenizer_commands(CLI::App& app) {
  auto options = std::make_shared<TokenizerOptions>();

  auto* tokenize = app.add_subcommand(
      "tokenize", "Encode text: one JSON string per stdin line -> one JSON array of ids per line");
  tokenize->add_option("--tokenizer", options->dir, "Directory with tokenizer.json")->required();
  tokenize->add_flag("--no-special", options->no_special,
                     "Do not add BOS/EOS or post-processor tokens");
  tokenize->callback([options] { run_tokenize(*options); });

  auto* detokenize = app.add_subcommand(
      "detokenize", "Decode ids: one JSON array of ids per stdin line -> one JSON string per line");
  detokenize->add_option("--tokenizer", options->dir, "Directory with tokenizer.json")->required();
  detokenize->add_flag("--skip-special", options->skip_special, "Drop special tokens");
  detokenize->callback([options] { run_detokenize(*options); });

  auto* engram =
      app.add_subcommand("engram-map", "Print the engram compressed-vocabulary map as JSON");
  engram->add_option("--tokenizer", options->dir, "Directory with tokenizer.json")->required();
  engram->callback([options] { run_engram_map(*options); });
}

}  // namespace deepinfer::cli
