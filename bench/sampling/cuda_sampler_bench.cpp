// Wall time of one CudaSampler::sample call (pack + upload, kernel, download, wait) at
// V = 129280 for several batch sizes and parameter sets, median of 30 calls after 3 warm-up
// calls, and the CPU Sampler (one thread) on the same rows for scale.
//   cuda_sampler_bench            (prints a markdown table)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/cuda/cuda_runtime.h"
#include "sampling/cuda_sampler.h"
#include "sampling/sampler.h"

namespace ds = deepinfer::sampling;

namespace {

constexpr int64_t kVocab = 129280;

struct Config {
  const char* name;
  deepinfer::SamplingParams params;
};

template <typename Call>
double median_ms(int repeats, Call call) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main() {
  std::vector<Config> configs(5);
  configs[0].name = "greedy";
  configs[0].params.temperature = 0.0f;
  configs[1].name = "T=1, no filter";
  configs[2].name = "T=0.7 top_k=50 top_p=0.9";
  configs[2].params.temperature = 0.7f;
  configs[2].params.top_k = 50;
  configs[2].params.top_p = 0.9f;
  configs[3].name = "T=1 top_p=0.95";
  configs[3].params.top_p = 0.95f;
  configs[4].name = "T=1 top_p=0.95 + penalties, logprobs=5";
  configs[4].params.top_p = 0.95f;
  configs[4].params.repetition_penalty = 1.1f;
  configs[4].params.frequency_penalty = 0.2f;
  configs[4].params.logprobs = 5;

  std::mt19937_64 rng(1);
  // Logits like a language model's: a few tokens far above a wide normal bulk.
  std::normal_distribution<float> bulk(0.0f, 2.0f);
  std::vector<int32_t> prompt(2000);
  std::vector<int32_t> output(200);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % kVocab);
  for (auto& t : output) t = static_cast<int32_t>(rng() % kVocab);
  const std::vector<int32_t> eos = {1};

  std::printf(
      "| rows | params | GPU ms / call | CPU ms / call (1 thread) |\n| --- | --- | --- | --- |\n");
  for (const int rows : {1, 8, 64, 256}) {
    std::vector<float> logits(static_cast<size_t>(rows) * kVocab);
    for (float& v : logits) v = bulk(rng);
    for (int r = 0; r < rows; ++r) {
      for (int k = 0; k < 20; ++k)
        logits[static_cast<size_t>(r) * kVocab + rng() % kVocab] += 12.0f;
    }
    deepinfer::Tensor host = deepinfer::Tensor::empty(deepinfer::DType::kF32, {rows, kVocab});
    std::memcpy(host.data<float>(), logits.data(), logits.size() * sizeof(float));
    const deepinfer::Tensor device = deepinfer::cuda::to_device(host);
    for (const Config& config : configs) {
      std::vector<ds::SamplerRow> batch(static_cast<size_t>(rows));
      for (int r = 0; r < rows; ++r) {
        batch[static_cast<size_t>(r)] = {
            &config.params, static_cast<uint64_t>(r), 0, prompt, output, {}, eos};
      }
      ds::CudaSampler gpu;
      for (int i = 0; i < 3; ++i) gpu.sample(device, batch);
      const double gpu_ms = median_ms(30, [&] { gpu.sample(device, batch); });
      ds::Sampler cpu;
      const double cpu_ms =
          median_ms(rows <= 8 ? 5 : 1, [&] { cpu.sample(logits, kVocab, batch); });
      std::printf("| %d | %s | %.3f | %.2f |\n", rows, config.name, gpu_ms, cpu_ms);
    }
  }
  return 0;
}
