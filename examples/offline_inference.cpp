// Offline inference with the C++ API on the embedded default model (or DEEPINFER_HF_MODEL_DIR):
// text prompts, token ids, a chat, a regex-constrained request, and a streamed generation.
//
//   ./build/examples/offline_inference
//
// The default model has random weights: its text is noise by design.
#include <cstdio>
#include <string>
#include <vector>

#include "deepinfer/llm.h"

int main() {
  deepinfer::EngineArgs args;  // empty model: DEEPINFER_HF_MODEL_DIR, else the default model
  args.max_model_len = 256;
  deepinfer::LLM llm(args);

  deepinfer::SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 12;
  deepinfer::SamplingParams seeded;
  seeded.temperature = 0.8f;
  seeded.top_p = 0.95f;
  seeded.seq_seed = 1234;
  seeded.max_tokens = 12;
  seeded.n = 2;
  seeded.stop = {"\n"};
  deepinfer::SamplingParams constrained = seeded;
  constrained.n = 1;
  constrained.max_tokens = 32;
  constrained.so_args = deepinfer::StructuredOutputArgs{"regex", "[A-Z][a-z]{2,8} [0-9]{2}"};

  const std::vector<deepinfer::Prompt> prompts = {
      std::string("The capital of France is"),
      std::vector<int32_t>{10, 11, 12},
      deepinfer::Conversation{{"system", "You are terse."}, {"user", "Name a color."}},
      std::string("Name and age:"),
  };
  const auto outputs = llm.generate(prompts, {greedy, seeded, greedy, constrained});
  for (const auto& out : outputs) {
    if (out.error) {
      std::printf("request %s failed: %s\n", out.request_id.c_str(), out.error->c_str());
      continue;
    }
    for (const auto& completion : out.outputs) {
      std::printf("request %s.%d: \"%s\" (%s, %zu tokens)\n", out.request_id.c_str(),
                  completion.index, completion.text.c_str(),
                  deepinfer::finish_reason_name(completion.finish_reason),
                  completion.token_ids.size());
    }
  }

  // Streaming: text arrives as tokens are generated.
  std::printf("streamed: ");
  auto stream = llm.stream({std::string("Once upon a time")}, {seeded});
  while (auto deltas = stream.next()) {
    for (const auto& delta : *deltas) {
      for (const auto& part : delta.outputs) std::printf("[%d]%s", part.index, part.text.c_str());
    }
    std::fflush(stdout);
  }
  std::printf("\n");
  return 0;
}
