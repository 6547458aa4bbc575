// Offline inference (vLLM-like): LLM(EngineArgs{...}).generate(prompts, params).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "deepinfer/engine_args.h"
#include "deepinfer/outputs.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer {

namespace engine {
class ModelRunner;
}

class LLM {
 public:
  // Loads the checkpoint of args.model (see EngineArgs) and starts the engine.
  explicit LLM(const EngineArgs& args);
  // Runs the engine on a model runner of the caller's (tests, other backends).
  LLM(const EngineArgs& args, std::unique_ptr<engine::ModelRunner> runner);
  ~LLM();
  LLM(LLM&&) noexcept;
  LLM& operator=(LLM&&) noexcept;

  // One output per prompt, in prompt order. Bad prompts or parameters fail only their own
  // output (RequestOutput::error); the others complete.
  std::vector<RequestOutput> generate(const std::vector<std::vector<int32_t>>& prompt_token_ids,
                                      const SamplingParams& params = {});
  // One SamplingParams per prompt.
  std::vector<RequestOutput> generate(const std::vector<std::vector<int32_t>>& prompt_token_ids,
                                      const std::vector<SamplingParams>& params);

  const EngineArgs& args() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer
