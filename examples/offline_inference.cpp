// Offline inference with the C++ API: a few token-id prompts, greedy and seeded sampling.
//
//   ./build/deepinfer make-checkpoint --config models/default/config.json --seed 1 --out /tmp/tiny
//   cp models/default/tokenizer*.json /tmp/tiny/
//   DEEPINFER_HF_MODEL_DIR=/tmp/tiny ./build/examples/offline_inference
#include <cstdio>
#include <vector>

#include "deepinfer/llm.h"

int main() {
  deepinfer::EngineArgs args;  // model from DEEPINFER_HF_MODEL_DIR
  args.max_model_len = 256;
  deepinfer::LLM llm(args);

  std::vector<std::vector<int32_t>> prompts = {{10, 11, 12}, {42}, {7, 8, 9, 10, 11}};
  deepinfer::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 8;
  deepinfer::SamplingParams seeded;
  seeded.temperature = 0.8f;
  seeded.top_p = 0.95f;
  seeded.seq_seed = 1234;
  seeded.max_tokens = 8;

  const auto outputs = llm.generate(prompts, {greedy, seeded, greedy});
  for (const auto& out : outputs) {
    if (out.error) {
      std::printf("request %s failed: %s\n", out.request_id.c_str(), out.error->c_str());
      continue;
    }
    std::printf("request %s:", out.request_id.c_str());
    for (int32_t id : out.outputs[0].token_ids) std::printf(" %d", id);
    std::printf("  (%s)\n", deepinfer::finish_reason_name(out.outputs[0].finish_reason));
  }
  return 0;
}
