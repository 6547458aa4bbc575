// `deepinfer generate`: runs prompts (token ids for now) through the engine.
//
//   deepinfer generate --model DIR --prompt-ids "1,2,3" [--prompt-ids "4,5"] [--max-tokens N]
//                      [--temperature T] [--top-k K] [--top-p P] [--seed S] [--ignore-eos]
//                      [--max-num-seqs N] [--max-num-batched-tokens N] [--max-model-len N]
//                      [--no-async] [--json]
#include <cstdio>
#include <filesystem>
#include <optional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "deepinfer/llm.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  std::stringstream stream(text);
  while (std::getline(stream, item, ',')) {
    const auto begin = item.find_first_not_of(" \t");
    if (begin == std::string::npos) continue;
    try {
      size_t used = 0;
      const long value = std::stol(item.substr(begin), &used);
      if (item.find_first_not_of(" \t", begin + used) != std::string::npos) throw 0;
      ids.push_back(static_cast<int32_t>(value));
    } catch (...) {
      DI_THROW("--prompt-ids '", text, "': '", item, "' is not an integer token id");
    }
  }
  return ids;
}

struct Options {
  EngineArgs args;
  std::vector<std::string> prompt_ids;
  std::vector<std::string> prompts;
  SamplingParams params;
  int32_t max_tokens = 16;
  uint64_t seed = 0;
  bool seeded = false;
  bool no_async = false;
  bool json = false;
};

void run_generate(const Options& options) {
  EngineArgs args = options.args;
  if (options.no_async) args.async_scheduling = false;
  SamplingParams params = options.params;
  params.max_tokens = options.max_tokens;
  if (options.seeded) params.seq_seed = options.seed;
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& text : options.prompt_ids) prompts.push_back(parse_ids(text));
  // Text prompts and text output need the checkpoint's tokenizer.json.
  std::optional<tokenizer::Tokenizer> tokenizer;
  const auto tokenizer_dir = std::filesystem::path(args.resolved().model);
  if (std::filesystem::exists(tokenizer_dir / "tokenizer.json")) {
    tokenizer = tokenizer::Tokenizer::from_dir(tokenizer_dir);
  } else if (!options.prompts.empty()) {
    DI_THROW("--prompt needs a tokenizer.json in ", tokenizer_dir.string(),
             "; pass token ids with --prompt-ids instead");
  }
  for (const auto& text : options.prompts) prompts.push_back(tokenizer->encode(text, true));
  if (prompts.empty()) DI_THROW("no prompt: pass --prompt TEXT or --prompt-ids IDS");
  LLM llm(args);
  const auto outputs = llm.generate(prompts, params);
  bool any_error = false;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& out = outputs[i];
    const auto& completion = out.outputs.at(0);
    any_error = any_error || out.error.has_value();
    if (options.json) {
      nlohmann::json line = {{"prompt_index", i},
                             {"prompt_token_ids", out.prompt_token_ids},
                             {"token_ids", completion.token_ids},
                             {"finish_reason", finish_reason_name(completion.finish_reason)}};
      if (tokenizer) line["text"] = tokenizer->decode(completion.token_ids, true);
      if (out.error) line["error"] = *out.error;
      std::cout << line.dump() << "\n";
      continue;
    }
    std::cout << "[" << i << "] ";
    if (out.error) {
      std::cout << "error: " << *out.error << "\n";
      continue;
    }
    if (tokenizer) {
      std::cout << nlohmann::json(tokenizer->decode(completion.token_ids, true)).dump();
    } else {
      for (size_t t = 0; t < completion.token_ids.size(); ++t) {
        std::cout << (t ? "," : "") << completion.token_ids[t];
      }
    }
    std::cout << "  (" << finish_reason_name(completion.finish_reason) << ")\n";
  }
  if (any_error) DI_THROW("some prompts failed (see above)");
}

}  // namespace

void register_generate_command(CLI::App& app) {
  static Options options;
  auto* command = app.add_subcommand("generate", "Generate tokens with the engine");
  command->add_option("--model", options.args.model,
                      "checkpoint directory (default: DEEPINFER_HF_MODEL_DIR)");
  command->add_option("--prompt", options.prompts,
                      "a text prompt, encoded with the model's tokenizer (repeat for more)");
  command->add_option("--prompt-ids", options.prompt_ids,
                      "a prompt as comma-separated token ids (repeat for more prompts)");
  command->add_option("--max-tokens", options.max_tokens, "most tokens to generate per prompt");
  command->add_option("--temperature", options.params.temperature, "0: greedy");
  command->add_option("--top-k", options.params.top_k, "0: off");
  command->add_option("--top-p", options.params.top_p, "1: off");
  command->add_option("--min-p", options.params.min_p, "0: off");
  command->add_flag("--ignore-eos", options.params.ignore_eos, "keep generating after EOS");
  auto* seed = command->add_option("--seed", options.seed, "seq_seed of every prompt");
  command->add_option("--max-num-seqs", options.args.max_num_seqs, "cap on running requests");
  command->add_option("--max-num-batched-tokens", options.args.max_num_batched_tokens,
                      "token budget per step");
  command->add_option("--max-model-len", options.args.max_model_len,
                      "longest prompt + output (0: the model's maximum)");
  command->add_flag("--no-async", options.no_async, "plan each step after the previous one");
  command->add_flag("--json", options.json, "one JSON object per prompt");
  command->callback([seed] {
    options.seeded = seed->count() > 0;
    run_generate(options);
  });
}

}  // namespace deepinfer::cli
