// DeepSeek V4 / V4.1 chat prompt format (system, user, assistant, tool and developer messages;
// thinking and chat modes; reasoning effort; tool schemas and DSML tool calls; tasks) and the
// parser that turns a completion back into reasoning_content, content and OpenAI tool calls.
//
// Behaviour follows DeepSeek's published encoding_dsv4.py (V4 release, MIT) and the V4.1
// encoder of SGLang (python/sglang/srt/entrypoints/openai/encoding_dsv41.py); see
// docs/TOKENIZER.md. Messages are OpenAI-style JSON objects; key order is preserved because
// tool schemas and arguments are re-serialized into the prompt as Python's json.dumps would.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace deepinfer::tokenizer {

enum class ChatFormat { kDeepSeekV4, kDeepSeekV41 };
enum class ThinkingMode { kChat, kThinking };

struct ChatEncodeOptions {
  ChatFormat format = ChatFormat::kDeepSeekV41;
  ThinkingMode thinking_mode = ThinkingMode::kThinking;
  // V4: unset, "high" or "max". V4.1: unset (= "high"), "low", "high", "xhigh", "max" or an
  // integer 1..100 given as a JSON number.
  nlohmann::ordered_json reasoning_effort = nullptr;
  bool drop_thinking = true;
  bool add_bos_token = true;
};

// Renders the prompt text (special tokens as text: encode it with parse_special_tokens on).
// Throws Error naming the message index and field for malformed input.
std::string encode_chat(const nlohmann::ordered_json& messages, const ChatEncodeOptions& options);

// {"role": "assistant", "content", "reasoning_content", "tool_calls": [OpenAI tool calls]}.
// `text` is the completion including the final end-of-sentence token; throws Error when it
// does not follow the format.
nlohmann::ordered_json parse_completion(std::string_view text, ChatFormat format,
                                        ThinkingMode thinking_mode);

// Python json.dumps(value, ensure_ascii=False) formatting (", " and ": " separators).
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace deepinfer::tokenizer
