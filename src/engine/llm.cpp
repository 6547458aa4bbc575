#include "deepinfer/llm.h"

#include "core/error.h"
#include "engine/engine.h"
#include "engine/model_runner.h"

namespace deepinfer {

struct LLM::Impl {
  EngineArgs args;
  std::unique_ptr<engine::Engine> engine;
};

LLM::LLM(const EngineArgs& args) : LLM(args, engine::make_model_runner(args.resolved())) {}

LLM::LLM(const EngineArgs& args, std::unique_ptr<engine::ModelRunner> runner)
    : impl_(std::make_unique<Impl>()) {
  impl_->args = args.resolved();
  impl_->engine = std::make_unique<engine::Engine>(impl_->args, std::move(runner));
}

LLM::~LLM() = default;
LLM::LLM(LLM&&) noexcept = default;
LLM& LLM::operator=(LLM&&) noexcept = default;

const EngineArgs& LLM::args() const {
  return impl_->args;
}

std::vector<RequestOutput> LLM::generate(const std::vector<std::vector<int32_t>>& prompt_token_ids,
                                         const SamplingParams& params) {
  return generate(prompt_token_ids, std::vector<SamplingParams>(prompt_token_ids.size(), params));
}

std::vector<RequestOutput> LLM::generate(const std::vector<std::vector<int32_t>>& prompt_token_ids,
                                         const std::vector<SamplingParams>& params) {
  if (params.size() != prompt_token_ids.size()) {
    DI_THROW("generate: ", prompt_token_ids.size(), " prompts but ", params.size(),
             " SamplingParams; give one, or one per prompt");
  }
  engine::Engine& engine = *impl_->engine;
  std::vector<std::string> ids;
  ids.reserve(prompt_token_ids.size());
  for (size_t i = 0; i < prompt_token_ids.size(); ++i) {
    ids.push_back(engine.add_request(prompt_token_ids[i], params[i]));
  }
  engine.run_to_completion();
  std::vector<RequestOutput> outputs;
  outputs.reserve(ids.size());
  for (const auto& id : ids) {
    outputs.push_back(engine.output(id));
    engine.release(id);
  }
  return outputs;
}

}  // namespace deepinfer
