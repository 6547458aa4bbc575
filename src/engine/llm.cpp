#include "deepinfer/llm.h"

#include <filesystem>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

// args.tokenizer, else the model's directory, else (no model) the default model's.
std::optional<tokenizer::Tokenizer> load_tokenizer(const EngineArgs& args, bool default_model) {
  std::filesystem::path dir = args.tokenizer;
  if (dir.empty()) dir = default_model ? engine::default_model_dir() : args.model;
  if (dir.empty()) return std::nullopt;
  if (!std::filesystem::exists(dir / "tokenizer.json")) {
    if (!args.tokenizer.empty()) {
      DI_THROW("EngineArgs.tokenizer: no tokenizer.json in ", dir.string());
    }
    return std::nullopt;  // a checkpoint without a tokenizer still generates token ids
  }
  return tokenizer::Tokenizer::from_dir(dir);
}

}  // namespace

struct LLM::Impl {
  EngineArgs args;
  std::unique_ptr<engine::Engine> engine;
  bool streaming = false;

  const tokenizer::Tokenizer& require_tokenizer(const char* what) const {
    const auto& tok = engine->tokenizer();
    if (!tok)
      DI_THROW(what, " need a tokenizer; the model has no tokenizer.json (EngineArgs.tokenizer)");
    return *tok;
  }

  std::vector<int32_t> encode(const Prompt& prompt, const ChatOptions& chat_options) const {
    if (const auto* ids = std::get_if<std::vector<int32_t>>(&prompt)) return *ids;
    if (const auto* text = std::get_if<std::string>(&prompt)) {
      return require_tokenizer("text prompts").encode(*text, /*add_special_tokens=*/true);
    }
    const auto& conversation = std::get<Conversation>(prompt);
    const auto& tok = require_tokenizer("chat messages");
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    for (const ChatMessage& message : conversation) {
      messages.push_back({{"role", message.role}, {"content", message.content}});
    }
    tokenizer::ChatEncodeOptions options;
    options.thinking_mode =
        chat_options.thinking ? tokenizer::ThinkingMode::kThinking : tokenizer::ThinkingMode::kChat;
    if (!chat_options.reasoning_effort.empty()) {
      options.reasoning_effort = chat_options.reasoning_effort;
    }
    // The rendered text carries BOS and the role tokens as text.
    return tok.encode(tokenizer::encode_chat(messages, options), /*add_special_tokens=*/false,
                      /*parse_special_tokens=*/true);
  }

  // Adds every prompt; a prompt that cannot be encoded fails alone.
  std::vector<std::string> add(const std::vector<Prompt>& prompts,
                               const std::vector<SamplingParams>& params,
                               const ChatOptions& chat_options) {
    if (params.size() != prompts.size()) {
      DI_THROW("generate: ", prompts.size(), " prompts but ", params.size(),
               " SamplingParams; give one, or one per prompt");
    }
    if (streaming) DI_THROW("generate: a stream of this LLM is still unfinished");
    std::vector<std::string> ids;
    ids.reserve(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int32_t> token_ids;
      try {
        token_ids = encode(prompts[i], chat_options);
      } catch (const Error& error) {
        ids.push_back(engine->add_failed_request({}, concat("prompt ", i, ": ", error.what()),
                                                 std::to_string(i)));
        continue;
      }
      ids.push_back(engine->add_request(std::move(token_ids), params[i], std::to_string(i)));
    }
    return ids;
  }

  std::vector<RequestOutput> run(const std::vector<Prompt>& prompts,
                                 const std::vector<SamplingParams>& params,
                                 const ChatOptions& chat_options) {
    const std::vector<std::string> ids = add(prompts, params, chat_options);
    engine->run_to_completion();
    std::vector<RequestOutput> outputs;
    outputs.reserve(ids.size());
    for (const auto& id : ids) {
      outputs.push_back(engine->output(id));
      engine->release(id);
    }
    return outputs;
  }
};

LLM::LLM(const EngineArgs& args) : impl_(std::make_unique<Impl>()) {
  impl_->args = args.resolved();
  auto tokenizer = load_tokenizer(impl_->args, impl_->args.model.empty());
  // The engram map comes from the model's own tokenizer: share it only when it is that one.
  const bool own_tokenizer = impl_->args.tokenizer.empty() && tokenizer.has_value();
  auto runner = engine::make_model_runner(impl_->args, own_tokenizer ? &*tokenizer : nullptr);
  impl_->engine =
      std::make_unique<engine::Engine>(impl_->args, std::move(runner), std::move(tokenizer));
}

LLM::LLM(const EngineArgs& args, std::unique_ptr<engine::ModelRunner> runner)
    : impl_(std::make_unique<Impl>()) {
  impl_->args = args.resolved();
  impl_->engine = std::make_unique<engine::Engine>(impl_->args, std::move(runner),
                                                   load_tokenizer(impl_->args, false));
}

LLM::~LLM() = default;
LLM::LLM(LLM&&) noexcept = default;
LLM& LLM::operator=(LLM&&) noexcept = default;

const EngineArgs& LLM::args() const {
  return impl_->args;
}

namespace {

template <typename T>
std::vector<Prompt> as_prompts(const std::vector<T>& items) {
  return std::vector<Prompt>(items.begin(), items.end());
}

}  // namespace

std::vector<RequestOutput> LLM::generate(const std::vector<std::vector<int32_t>>& prompt_token_ids,
                                         const SamplingParams& params) {
  return generate(prompt_token_ids, std::vector<SamplingParams>(prompt_token_ids.size(), params));
}

std::vector<RequestOutput> LLM::generate(const std::vector<std::vector<int32_t>>& prompt_token_ids,
                                         const std::vector<SamplingParams>& params) {
  return impl_->run(as_prompts(prompt_token_ids), params, {});
}

std::vector<RequestOutput> LLM::generate(const std::vector<std::string>& prompts,
                                         const SamplingParams& params) {
  return generate(prompts, std::vector<SamplingParams>(prompts.size(), params));
}

std::vector<RequestOutput> LLM::generate(const std::vector<std::string>& prompts,
                                         const std::vector<SamplingParams>& params) {
  return impl_->run(as_prompts(prompts), params, {});
}

std::vector<RequestOutput> LLM::generate(const std::vector<Prompt>& prompts,
                                         const std::vector<SamplingParams>& params,
                                         const ChatOptions& chat_options) {
  return impl_->run(prompts, params, chat_options);
}

std::vector<RequestOutput> LLM::chat(const std::vector<Conversation>& conversations,
                                     const SamplingParams& params,
                                     const ChatOptions& chat_options) {
  return impl_->run(as_prompts(conversations),
                    std::vector<SamplingParams>(conversations.size(), params), chat_options);
}

std::vector<int32_t> LLM::encode_prompt(const Prompt& prompt, const ChatOptions& chat_options) {
  return impl_->encode(prompt, chat_options);
}

std::string LLM::decode(const std::vector<int32_t>& token_ids, bool skip_special_tokens) {
  return impl_->require_tokenizer("decode").decode(token_ids, skip_special_tokens);
}

bool LLM::has_tokenizer() const {
  return impl_->engine->tokenizer().has_value();
}

// ---- streaming ----

struct OutputStream::State {
  LLM::Impl* llm = nullptr;
  std::vector<std::string> ids;
  std::vector<bool> done;  // final delta delivered
};

OutputStream::OutputStream(std::unique_ptr<State> state) : state_(std::move(state)) {}
OutputStream::OutputStream(OutputStream&&) noexcept = default;
OutputStream& OutputStream::operator=(OutputStream&&) noexcept = default;

OutputStream::~OutputStream() {
  if (!state_ || !state_->llm) return;
  // Abandoned early: abort what is left so the LLM can be used again.
  engine::Engine& engine = *state_->llm->engine;
  for (const auto& id : state_->ids) engine.abort(id);
  try {
    engine.run_to_completion();
  } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw
  }
  for (const auto& id : state_->ids) engine.release(id);
  state_->llm->streaming = false;
}

std::optional<std::vector<RequestOutput>> OutputStream::next() {
  if (!state_ || !state_->llm) return std::nullopt;
  engine::Engine& engine = *state_->llm->engine;
  while (true) {
    std::vector<RequestOutput> deltas;
    bool all_done = true;
    for (size_t i = 0; i < state_->ids.size(); ++i) {
      if (state_->done[i]) continue;
      if (auto delta = engine.take_delta(state_->ids[i])) {
        if (delta->finished) {
          state_->done[i] = true;
          engine.release(state_->ids[i]);
        }
        deltas.push_back(std::move(*delta));
      }
      all_done = all_done && state_->done[i];
    }
    if (!deltas.empty()) return deltas;
    if (all_done || !engine.has_unfinished()) {
      state_->llm->streaming = false;
      state_->llm = nullptr;
      return std::nullopt;
    }
    engine.step();
  }
}

bool OutputStream::abort(const std::string& request_id) {
  if (!state_ || !state_->llm) return false;
  return state_->llm->engine->abort(request_id);
}

OutputStream LLM::stream(const std::vector<Prompt>& prompts,
                         const std::vector<SamplingParams>& params,
                         const ChatOptions& chat_options) {
  auto state = std::make_unique<OutputStream::State>();
  state->ids = impl_->add(prompts, params, chat_options);
  state->done.assign(state->ids.size(), false);
  state->llm = impl_.get();
  impl_->streaming = true;
  return OutputStream(std::move(state));
}

}  // namespace deepinfer
