// Offline inference (vLLM-like): LLM(EngineArgs{...}).generate(prompts, params).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "deepinfer/engine_args.h"
#include "deepinfer/outputs.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer {

namespace engine {
class ModelRunner;
}

// One chat message (OpenAI-style). Roles: system, user, assistant, tool, developer (the
// DeepSeek V4.1 chat encoding's); anything else fails that request.
struct ChatMessage {
  std::string role;
  std::string content;
};
using Conversation = std::vector<ChatMessage>;

struct ChatOptions {
  // DeepSeek's thinking mode (the completion starts with reasoning); false: chat mode.
  bool thinking = false;
  // V4.1 reasoning effort: "", "low", "high", "xhigh", "max" (thinking mode only).
  std::string reasoning_effort;
};

// A prompt: text (encoded with the model's tokenizer, special tokens added), token ids, or a
// conversation (rendered with the chat encoding, then encoded).
using Prompt = std::variant<std::string, std::vector<int32_t>, Conversation>;

class OutputStream;

class LLM {
 public:
  // Loads args.model (see EngineArgs: empty means DEEPINFER_HF_MODEL_DIR, else the embedded
  // default model) and its tokenizer, and starts the engine.
  explicit LLM(const EngineArgs& args);
  // Runs the engine on a model runner of the caller's (tests, other backends); the tokenizer
  // is args.tokenizer's, if any (text prompts, stop strings and `text` need one).
  LLM(const EngineArgs& args, std::unique_ptr<engine::ModelRunner> runner);
  ~LLM();
  LLM(LLM&&) noexcept;
  LLM& operator=(LLM&&) noexcept;

  // One output per prompt, in prompt order. Bad prompts or parameters fail only their own
  // output (RequestOutput::error); the others complete. One SamplingParams for all prompts,
  // or one per prompt.
  std::vector<RequestOutput> generate(const std::vector<std::vector<int32_t>>& prompt_token_ids,
                                      const SamplingParams& params = {});
  std::vector<RequestOutput> generate(const std::vector<std::vector<int32_t>>& prompt_token_ids,
                                      const std::vector<SamplingParams>& params);
  // Text prompts.
  std::vector<RequestOutput> generate(const std::vector<std::string>& prompts,
                                      const SamplingParams& params = {});
  std::vector<RequestOutput> generate(const std::vector<std::string>& prompts,
                                      const std::vector<SamplingParams>& params);
  // Any mix of prompt kinds; chat_options apply to the conversations.
  std::vector<RequestOutput> generate(const std::vector<Prompt>& prompts,
                                      const std::vector<SamplingParams>& params,
                                      const ChatOptions& chat_options = {});
  // Chat conversations (vLLM's LLM.chat).
  std::vector<RequestOutput> chat(const std::vector<Conversation>& conversations,
                                  const SamplingParams& params = {},
                                  const ChatOptions& chat_options = {});

  // Streaming: queues the prompts and returns a stream of output deltas (see OutputStream).
  // One stream at a time per LLM; generate() must not be called while it is unfinished.
  OutputStream stream(const std::vector<Prompt>& prompts, const std::vector<SamplingParams>& params,
                      const ChatOptions& chat_options = {});

  // The prompt token ids a prompt becomes (what generate() feeds the engine).
  std::vector<int32_t> encode_prompt(const Prompt& prompt, const ChatOptions& chat_options = {});
  // Text of token ids with the model's tokenizer; throws Error without one.
  std::string decode(const std::vector<int32_t>& token_ids, bool skip_special_tokens = true);
  bool has_tokenizer() const;

  const EngineArgs& args() const;

 private:
  friend class OutputStream;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Deltas of a streaming generation, as the engine produces them. next() runs engine steps
// until some request has news, then returns one RequestOutput per such request holding only
// what is new since its previous delta (outputs[i].text / token_ids / logprobs appended;
// finish_reason, stop_reason and error set on the last delta, `finished` true). nullopt once
// every request has delivered its final delta. Request ids are "0", "1", ... in prompt order.
class OutputStream {
 public:
  ~OutputStream();
  OutputStream(OutputStream&&) noexcept;
  OutputStream& operator=(OutputStream&&) noexcept;

  std::optional<std::vector<RequestOutput>> next();
  // Ends a request of this stream early (FinishReason::kAbort); false when unknown or done.
  bool abort(const std::string& request_id);

 private:
  friend class LLM;
  struct State;
  explicit OutputStream(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace deepinfer
