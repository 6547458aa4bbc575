// `deepinfer generate`: prompts, token ids or chat conversations through the engine.
//
//   deepinfer generate [--model DIR] --prompt TEXT [--prompt TEXT ...]      (--prompt - : stdin)
//   deepinfer generate --prompt-ids "1,2,3" --chat '[{"role":"user","content":"Hi"}]'
//   deepinfer generate --input requests.jsonl      (one request per line, "-" for stdin)
//
// A JSONL line is an object with one of "prompt" (text), "prompt_token_ids" or "messages"
// (OpenAI-style chat), and optionally "sampling_params" (SamplingParams fields, applied over
// the flags' values). Text output streams to the terminal when there is one request; a batch
// file shows a progress bar on stderr. --json prints one JSON object per request instead.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cmd_generate_options.h"
#include "commands.h"
#include "core/error.h"
#include "deepinfer/llm.h"
#include "sampling/sampling_params_json.h"

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

Conversation parse_conversation(const nlohmann::json& messages, const std::string& where) {
  if (!messages.is_array()) DI_THROW(where, ": chat messages must be a JSON array");
  Conversation conversation;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& message = messages[i];
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string() ||
        (message.contains("content") && !message["content"].is_string())) {
      DI_THROW(where, ": message ", i, " must be an object with a string \"role\" and \"content\"");
    }
    conversation.push_back({message["role"].get<std::string>(), message.value("content", "")});
  }
  return conversation;
}

std::string read_all(std::istream& in) {
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct Options {
  EngineFlags engine;
  std::vector<std::string> prompts;
  std::vector<std::string> prompt_ids;
  std::vector<std::string> chats;
  std::string input;
  SamplingParams params;
  int32_t max_tokens = 16;
  uint64_t seed = 0;
  bool seeded = false;
  std::string regex;
  std::string json_schema;
  std::string grammar;
  bool any_json = false;
  std::string sampling_params_json;
  ChatOptions chat;
  bool json = false;
  bool no_stream = false;
  bool no_progress = false;
};

// One request of the batch; `error` set when its line could not even be read.
struct Job {
  std::optional<Prompt> prompt;
  SamplingParams params;
  std::optional<std::string> error;
};

SamplingParams base_params(const Options& options) {
  SamplingParams params = options.params;
  params.max_tokens = options.max_tokens;
  if (options.seeded) params.seq_seed = options.seed;
  const int constraints = !options.regex.empty() + !options.json_schema.empty() +
                          !options.grammar.empty() + options.any_json;
  if (constraints > 1)
    DI_THROW("give at most one of --regex, --json-schema, --grammar, --any-json");
  if (!options.regex.empty()) params.so_args = StructuredOutputArgs{"regex", options.regex};
  if (!options.json_schema.empty())
    params.so_args = StructuredOutputArgs{"json", options.json_schema};
  if (!options.grammar.empty()) params.so_args = StructuredOutputArgs{"ebnf", options.grammar};
  if (options.any_json) params.so_args = StructuredOutputArgs{"any_json", ""};
  if (!options.sampling_params_json.empty()) {
    params = sampling_params_from_json(options.sampling_params_json);
  }
  params.validate();
  return params;
}

Job job_from_line(const std::string& line, const SamplingParams& base, const std::string& where) {
  Job job;
  try {
    const auto object = nlohmann::json::parse(line);
    if (!object.is_object()) DI_THROW(where, ": a request line must be a JSON object");
    int kinds = 0;
    if (object.contains("prompt")) {
      if (!object["prompt"].is_string()) DI_THROW(where, ": \"prompt\" must be a string");
      job.prompt = object["prompt"].get<std::string>();
      ++kinds;
    }
    if (object.contains("prompt_token_ids")) {
      job.prompt = object["prompt_token_ids"].get<std::vector<int32_t>>();
      ++kinds;
    }
    if (object.contains("messages")) {
      job.prompt = parse_conversation(object["messages"], where);
      ++kinds;
    }
    if (kinds != 1) {
      DI_THROW(where, ": give exactly one of \"prompt\", \"prompt_token_ids\", \"messages\"");
    }
    job.params = base;
    if (object.contains("sampling_params")) {
      if (!object["sampling_params"].is_object()) {
        DI_THROW(where, ": \"sampling_params\" must be an object");
      }
      auto merged = nlohmann::json::parse(sampling_params_to_json(base));
      merged.update(object["sampling_params"]);
      job.params = sampling_params_from_json_value(merged);
    }
  } catch (const nlohmann::json::exception& error) {
    job.error = concat(where, ": ", error.what());
  } catch (const Error& error) {
    job.error = error.what();
  }
  return job;
}

std::vector<Job> collect_jobs(const Options& options) {
  const SamplingParams base = base_params(options);
  std::vector<Job> jobs;
  for (const auto& text : options.prompts) {
    jobs.push_back({text == "-" ? read_all(std::cin) : text, base, std::nullopt});
  }
  for (const auto& ids : options.prompt_ids) jobs.push_back({parse_ids(ids), base, std::nullopt});
  for (const auto& chat : options.chats) {
    nlohmann::json messages;
    try {
      messages = nlohmann::json::parse(chat);
    } catch (const nlohmann::json::exception& error) {
      DI_THROW("--chat: not JSON: ", error.what());
    }
    jobs.push_back({parse_conversation(messages, "--chat"), base, std::nullopt});
  }
  if (!options.input.empty()) {
    std::ifstream file;
    if (options.input != "-") {
      file.open(options.input);
      if (!file) DI_THROW("--input: cannot open ", options.input);
    }
    std::istream& in = options.input == "-" ? std::cin : file;
    std::string line;
    for (int64_t number = 1; std::getline(in, line); ++number) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      jobs.push_back(job_from_line(line, base, concat(options.input, ":", number)));
    }
  }
  if (jobs.empty()) DI_THROW("no prompt: pass --prompt, --prompt-ids, --chat or --input");
  return jobs;
}

nlohmann::json completion_json(const CompletionOutput& completion) {
  nlohmann::json out = {{"index", completion.index},
                        {"text", completion.text},
                        {"token_ids", completion.token_ids},
                        {"finish_reason", finish_reason_name(completion.finish_reason)}};
  if (completion.stop_reason) out["stop_reason"] = *completion.stop_reason;
  if (completion.logprobs) {
    nlohmann::json positions = nlohmann::json::array();
    for (const auto& position : *completion.logprobs) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& entry : position.top) top.push_back({entry.token_id, entry.logprob});
      positions.push_back({{"token_id", position.sampled.token_id},
                           {"logprob", position.sampled.logprob},
                           {"top", top}});
    }
    out["logprobs"] = positions;
  }
  return out;
}

nlohmann::json request_json(size_t index, const RequestOutput& out) {
  nlohmann::json line = {{"index", index}, {"prompt_token_ids", out.prompt_token_ids}};
  nlohmann::json completions = nlohmann::json::array();
  for (const auto& completion : out.outputs) completions.push_back(completion_json(completion));
  line["outputs"] = completions;
  if (out.error) line["error"] = *out.error;
  if (out.timings.first_token_s > 0) {
    line["ttft_s"] = out.timings.first_token_s - out.timings.arrival_s;
    line["latency_s"] = out.timings.finished_s - out.timings.arrival_s;
  }
  return line;
}

// Adds a delta's news to the accumulated output of its request.
void merge_delta(RequestOutput& total, const RequestOutput& delta) {
  if (total.request_id.empty()) {
    total.request_id = delta.request_id;
    total.prompt_token_ids = delta.prompt_token_ids;
  }
  total.finished = delta.finished;
  total.error = delta.error;
  total.timings = delta.timings;
  for (const auto& part : delta.outputs) {
    while (total.outputs.size() <= static_cast<size_t>(part.index)) {
      total.outputs.push_back({});
      total.outputs.back().index = static_cast<int32_t>(total.outputs.size() - 1);
    }
    CompletionOutput& into = total.outputs[static_cast<size_t>(part.index)];
    into.text += part.text;
    into.token_ids.insert(into.token_ids.end(), part.token_ids.begin(), part.token_ids.end());
    if (part.logprobs) {
      if (!into.logprobs) into.logprobs.emplace();
      into.logprobs->insert(into.logprobs->end(), part.logprobs->begin(), part.logprobs->end());
    }
    into.finish_reason = part.finish_reason;
    into.stop_reason = part.stop_reason;
  }
}

void print_text(size_t index, const RequestOutput& out, bool show_tokens) {
  if (out.error) {
    std::cout << "[" << index << "] error: " << *out.error << "\n";
    return;
  }
  for (const auto& completion : out.outputs) {
    std::cout << "[" << index;
    if (out.outputs.size() > 1) std::cout << "." << completion.index;
    std::cout << "] ";
    if (show_tokens) {
      for (size_t t = 0; t < completion.token_ids.size(); ++t) {
        std::cout << (t ? "," : "") << completion.token_ids[t];
      }
    } else {
      std::cout << nlohmann::json(completion.text).dump();
    }
    std::cout << "  (" << finish_reason_name(completion.finish_reason) << ")\n";
  }
}

class ProgressBar {
 public:
  ProgressBar(size_t total, bool enabled) : total_(total), enabled_(enabled) {}
  void update(size_t done, int64_t tokens) const {
    if (!enabled_) return;
    constexpr size_t kWidth = 30;
    const size_t filled = total_ ? done * kWidth / total_ : kWidth;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu requests, %lld tokens", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, ' ').c_str(), done, total_,
                 static_cast<long long>(tokens));
    if (done == total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  size_t total_;
  bool enabled_;
};

void run_generate(const Options& options) {
  const std::vector<Job> jobs = collect_jobs(options);
  LLM llm(options.engine.resolved());
  std::vector<Prompt> prompts;
  std::vector<SamplingParams> params;
  std::vector<size_t> job_of;  // engine request i -> job index
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].error) continue;
    prompts.push_back(*jobs[i].prompt);
    params.push_back(jobs[i].params);
    job_of.push_back(i);
  }
  std::vector<RequestOutput> results(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].error) results[i].error = jobs[i].error;
  }
  const bool show_tokens = !llm.has_tokenizer();
  // Streaming text to the terminal reads well for one request only.
  const bool stream_text = !options.json && !options.no_stream && jobs.size() == 1 &&
                           prompts.size() == 1 && !show_tokens;
  ProgressBar progress(prompts.size(), !options.input.empty() && !options.no_progress);
  size_t done = 0;
  int64_t tokens = 0;
  OutputStream stream = llm.stream(prompts, params, options.chat);
  while (auto deltas = stream.next()) {
    for (const auto& delta : *deltas) {
      const size_t job = job_of.at(std::stoul(delta.request_id));
      RequestOutput& total = results[job];
      merge_delta(total, delta);
      for (const auto& part : delta.outputs) {
        tokens += static_cast<int64_t>(part.token_ids.size());
        if (stream_text && !part.text.empty()) {
          std::cout << part.text << std::flush;
        }
      }
      if (!delta.finished) continue;
      ++done;
      progress.update(done, tokens);
      if (stream_text) {
        if (total.error) std::cout << "error: " << *total.error;
        std::cout << "\n";
        std::fprintf(stderr, "(%s)\n",
                     total.outputs.empty()
                         ? "error"
                         : finish_reason_name(total.outputs.front().finish_reason));
      }
    }
  }
  bool any_error = false;
  for (size_t i = 0; i < results.size(); ++i) {
    any_error = any_error || results[i].error.has_value();
    if (stream_text) continue;
    if (options.json) {
      std::cout << request_json(i, results[i]).dump() << "\n";
    } else {
      print_text(i, results[i], show_tokens);
    }
  }
  if (any_error) DI_THROW("some requests failed (see above)");
}

}  // namespace

void register_generate_command(CLI::App& app) {
  static Options options;
  auto* command = app.add_subcommand("generate", "Generate text with the engine");
  options.engine.add_to(*command);
  command->add_option("--prompt", options.prompts,
                      "a text prompt (repeat for more; '-' reads one from stdin)");
  command->add_option("--prompt-ids", options.prompt_ids,
                      "a prompt as comma-separated token ids (repeat for more prompts)");
  command->add_option("--chat", options.chats,
                      "a conversation: JSON array of {\"role\", \"content\"} (repeat for more)");
  command->add_option("--input", options.input,
                      "JSONL file of requests, one per line ('-': stdin); see --help above");
  command->add_flag("--thinking", options.chat.thinking, "chat in thinking mode");
  command->add_option("--reasoning-effort", options.chat.reasoning_effort,
                      "low | high | xhigh | max (thinking mode)");
  command->add_option("--max-tokens", options.max_tokens, "most tokens to generate per prompt");
  command->add_option("--n", options.params.n, "completions per prompt");
  command->add_option("--temperature", options.params.temperature, "0: greedy");
  command->add_option("--top-k", options.params.top_k, "0: off");
  command->add_option("--top-p", options.params.top_p, "1: off");
  command->add_option("--min-p", options.params.min_p, "0: off");
  command->add_option("--repetition-penalty", options.params.repetition_penalty, "1: off");
  command->add_option("--presence-penalty", options.params.presence_penalty, "0: off");
  command->add_option("--frequency-penalty", options.params.frequency_penalty, "0: off");
  command->add_option("--min-tokens", options.params.min_tokens, "no stop before this many");
  command->add_option("--stop", options.params.stop, "stop string (repeat for more)");
  command->add_option("--stop-token-ids", options.params.stop_token_ids, "stop token id(s)")
      ->delimiter(',');
  command->add_option("--logprobs", options.params.logprobs, "top log-probabilities per token");
  command->add_flag("--ignore-eos", options.params.ignore_eos, "keep generating after EOS");
  command->add_flag("--keep-special-tokens{false}", options.params.skip_special_tokens,
                    "keep special tokens in the text");
  auto* seed = command->add_option("--seed", options.seed, "seq_seed of every prompt");
  command->add_option("--regex", options.regex, "constrain the output to this regex");
  command->add_option("--json-schema", options.json_schema, "constrain to this JSON Schema");
  command->add_option("--grammar", options.grammar, "constrain to this GBNF grammar");
  command->add_flag("--any-json", options.any_json, "constrain to any JSON value");
  command->add_option("--sampling-params", options.sampling_params_json,
                      "all sampling params as one JSON object (replaces the flags above)");
  command->add_flag("--json", options.json, "one JSON object per request");
  command->add_flag("--no-stream", options.no_stream, "print text when a request finishes");
  command->add_flag("--no-progress", options.no_progress, "no progress bar for --input");
  command->callback([seed] {
    options.seeded = seed->count() > 0;
    run_generate(options);
  });
}

}  // namespace deepinfer::cli
