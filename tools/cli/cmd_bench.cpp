// `deepinfer bench`: offline throughput and latency of the engine on a synthetic workload.
//
//   deepinfer bench [--model DIR] --num-requests 64 --input-len 128 --input-len-range 0.5
//                   --output-len 64 --output-len-range 0.5 --seed 0 [--json]
//
// Every request is queued at once (offline), with random token-id prompts and ignore_eos so
// each produces exactly its drawn output length. Lengths are uniform in
// [len * (1 - range), len * (1 + range)], from a generator seeded by --seed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cmd_generate_options.h"
#include "commands.h"
#include "core/error.h"
#include "deepinfer/llm.h"

namespace deepinfer::cli {
namespace {

struct BenchOptions {
  EngineFlags engine;
  int32_t num_requests = 64;
  int32_t input_len = 128;
  double input_len_range = 0.5;
  int32_t output_len = 64;
  double output_len_range = 0.5;
  uint64_t seed = 0;
  float temperature = 1.0f;
  int32_t warmup_requests = 2;
  bool json = false;
};

int32_t draw_length(std::mt19937_64& rng, int32_t mean, double range) {
  const double low = std::max(1.0, std::floor(mean * (1.0 - range)));
  const double high = std::max(low, std::ceil(mean * (1.0 + range)));
  std::uniform_int_distribution<int32_t> length(static_cast<int32_t>(low),
                                                static_cast<int32_t>(high));
  return length(rng);
}

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

nlohmann::json distribution(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  double mean = 0.0;
  for (double v : values) mean += v;
  if (!values.empty()) mean /= static_cast<double>(values.size());
  return {{"mean", mean},
          {"p50", percentile(values, 50)},
          {"p90", percentile(values, 90)},
          {"p99", percentile(values, 99)}};
}

void run_bench(const BenchOptions& options) {
  if (options.num_requests < 1) DI_THROW("--num-requests must be >= 1");
  if (options.input_len < 1 || options.output_len < 1) {
    DI_THROW("--input-len and --output-len must be >= 1");
  }
  if (!(options.input_len_range >= 0 && options.input_len_range < 1) ||
      !(options.output_len_range >= 0 && options.output_len_range < 1)) {
    DI_THROW("--input-len-range and --output-len-range must be in [0, 1)");
  }
  const EngineArgs args = options.engine.resolved();
  const auto load_start = std::chrono::steady_clock::now();
  LLM llm(args);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();

  std::mt19937_64 rng(options.seed);
  // Ordinary token ids: skip the first ids (special tokens in DeepSeek's vocabulary).
  constexpr int32_t kFirstId = 100;
  constexpr int32_t kLastId = 100000;
  std::uniform_int_distribution<int32_t> token(kFirstId, kLastId);
  const auto make_workload = [&](int32_t count, std::vector<std::vector<int32_t>>& prompts,
                                 std::vector<SamplingParams>& params) {
    for (int32_t i = 0; i < count; ++i) {
      std::vector<int32_t> prompt(
          static_cast<size_t>(draw_length(rng, options.input_len, options.input_len_range)));
      for (auto& id : prompt) id = token(rng);
      SamplingParams p;
      p.temperature = options.temperature;
      p.max_tokens = draw_length(rng, options.output_len, options.output_len_range);
      p.ignore_eos = true;
      p.seq_seed = rng();
      prompts.push_back(std::move(prompt));
      params.push_back(p);
    }
  };
  if (options.warmup_requests > 0) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<SamplingParams> params;
    make_workload(options.warmup_requests, prompts, params);
    llm.generate(prompts, params);
  }
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SamplingParams> params;
  make_workload(options.num_requests, prompts, params);

  const auto start = std::chrono::steady_clock::now();
  const std::vector<RequestOutput> outputs = llm.generate(prompts, params);
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  std::vector<double> ttft_ms, tpot_ms, latency_ms;
  for (const auto& out : outputs) {
    if (out.error) DI_THROW("bench request ", out.request_id, " failed: ", *out.error);
    const auto generated = static_cast<int64_t>(out.outputs.at(0).token_ids.size());
    input_tokens += static_cast<int64_t>(out.prompt_token_ids.size());
    output_tokens += generated;
    const RequestTimings& t = out.timings;
    ttft_ms.push_back((t.first_token_s - t.arrival_s) * 1e3);
    latency_ms.push_back((t.finished_s - t.arrival_s) * 1e3);
    if (generated > 1) {
      tpot_ms.push_back((t.finished_s - t.first_token_s) * 1e3 /
                        static_cast<double>(generated - 1));
    }
  }
  const nlohmann::json report = {
      {"num_requests", options.num_requests},
      {"input_tokens", input_tokens},
      {"output_tokens", output_tokens},
      {"elapsed_s", elapsed_s},
      {"load_s", load_s},
      {"requests_per_s", options.num_requests / elapsed_s},
      {"output_tokens_per_s", static_cast<double>(output_tokens) / elapsed_s},
      {"total_tokens_per_s", static_cast<double>(input_tokens + output_tokens) / elapsed_s},
      {"ttft_ms", distribution(ttft_ms)},
      {"tpot_ms", distribution(tpot_ms)},
      {"latency_ms", distribution(latency_ms)},
      {"async_scheduling", llm.args().async_scheduling},
      {"max_num_seqs", llm.args().max_num_seqs},
      {"max_num_batched_tokens", llm.args().max_num_batched_tokens},
  };
  if (options.json) {
    std::cout << report.dump() << "\n";
    return;
  }
  std::printf("requests:        %d (%lld input + %lld output tokens) in %.3f s\n",
              options.num_requests, static_cast<long long>(input_tokens),
              static_cast<long long>(output_tokens), elapsed_s);
  std::printf("throughput:      %.2f requests/s, %.1f output tokens/s, %.1f total tokens/s\n",
              report["requests_per_s"].get<double>(), report["output_tokens_per_s"].get<double>(),
              report["total_tokens_per_s"].get<double>());
  for (const char* key : {"ttft_ms", "tpot_ms", "latency_ms"}) {
    const auto& d = report[key];
    std::printf("%-8s mean %9.2f  p50 %9.2f  p90 %9.2f  p99 %9.2f\n", key, d["mean"].get<double>(),
                d["p50"].get<double>(), d["p90"].get<double>(), d["p99"].get<double>());
  }
}

}  // namespace

void register_bench_command(CLI::App& app) {
  static BenchOptions options;
  auto* command =
      app.add_subcommand("bench", "Offline throughput and latency on a synthetic workload");
  options.engine.add_to(*command);
  command->add_option("--num-requests", options.num_requests, "requests in the workload");
  command->add_option("--input-len", options.input_len, "mean prompt length (tokens)");
  command->add_option("--input-len-range", options.input_len_range,
                      "prompt lengths uniform in len * [1 - r, 1 + r]");
  command->add_option("--output-len", options.output_len, "mean output length (tokens)");
  command->add_option("--output-len-range", options.output_len_range,
                      "output lengths uniform in len * [1 - r, 1 + r]");
  command->add_option("--seed", options.seed, "seed of the workload generator");
  command->add_option("--temperature", options.temperature, "sampling temperature (0: greedy)");
  command->add_option("--warmup-requests", options.warmup_requests, "untimed requests first");
  command->add_flag("--json", options.json, "one JSON object with every figure");
  command->callback([] { run_bench(options); });
}

}  // namespace deepinfer::cli
