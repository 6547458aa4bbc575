// DeepSeek V4 / V4.1 chat prompts and completion parsing, compared with the reference encoders'
// output on our own conversations (tests/data/tokenizer/chat_expected.json, produced by
// scripts/tokenizer/make_chat_expected.py from DeepSeek's encoding_dsv4.py and SGLang's
// encoding_dsv41.py).
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "tokenizer/chat_encoding.h"

namespace deepinfer::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

Json load_cases() {
  std::ifstream file(std::string(DEEPINFER_SOURCE_DIR) +
                     "/tests/data/tokenizer/chat_expected.json");
  EXPECT_TRUE(file) << "missing tests/data/tokenizer/chat_expected.json";
  return Json::parse(file);
}

ChatFormat format_of(const Json& c) {
  return c["format"] == "v4" ? ChatFormat::kDeepSeekV4 : ChatFormat::kDeepSeekV41;
}
ThinkingMode mode_of(const Json& c) {
  return c["thinking_mode"] == "thinking" ? ThinkingMode::kThinking : ThinkingMode::kChat;
}

TEST(ChatEncoding, PromptsEqualTheReferenceEncoders) {
  const Json cases = load_cases();
  int checked = 0;
  for (const Json& c : cases) {
    if (!c.contains("messages")) continue;
    ChatEncodeOptions options;
    options.format = format_of(c);
    options.thinking_mode = mode_of(c);
    options.reasoning_effort = c["reasoning_effort"];
    options.drop_thinking = c["drop_thinking"].get<bool>();
    const std::string label = c["format"].get<std::string>() + "/" + c["name"].get<std::string>() +
                              " mode=" + c["thinking_mode"].get<std::string>() +
                              " effort=" + c["reasoning_effort"].dump() +
                              " drop=" + c["drop_thinking"].dump();
    if (c.contains("error")) {
      EXPECT_THROW(encode_chat(c["messages"], options), Error) << label;
    } else {
      EXPECT_EQ(encode_chat(c["messages"], options), c["prompt"].get<std::string>()) << label;
    }
    ++checked;
  }
  EXPECT_GE(checked, 200);
}

TEST(ChatEncoding, CompletionsParseLikeTheReference) {
  const Json cases = load_cases();
  int checked = 0;
  for (const Json& c : cases) {
    if (!c.contains("parse")) continue;
    const std::string text = c["parse"].get<std::string>();
    if (c.contains("error")) {
      EXPECT_THROW(parse_completion(text, format_of(c), mode_of(c)), Error) << text;
    } else {
      EXPECT_EQ(parse_completion(text, format_of(c), mode_of(c)), c["parsed"]) << text;
    }
    ++checked;
  }
  EXPECT_GE(checked, 18);
}

TEST(ChatEncoding, EncodeThenParseRecoversTheAssistantTurn) {
  // The assistant turn rendered by the encoder is exactly what the parser accepts back.
  const Json messages = Json::parse(R"([
    {"role": "user", "content": "q", "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    {"role": "assistant", "reasoning_content": "why", "content": "text",
     "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": \"x\", \"b\": [1, 2]}"}}]}])");
  for (const ChatFormat format : {ChatFormat::kDeepSeekV4, ChatFormat::kDeepSeekV41}) {
    ChatEncodeOptions options;
    options.format = format;
    const std::string prompt = encode_chat(messages, options);
    const std::string marker = "<｜Assistant｜><think>";
    const std::size_t start = prompt.find(marker);
    ASSERT_NE(start, std::string::npos);
    const Json parsed =
        parse_completion(prompt.substr(start + marker.size()), format, ThinkingMode::kThinking);
    EXPECT_EQ(parsed["reasoning_content"], "why");
    EXPECT_EQ(parsed["content"], "text");
    ASSERT_EQ(parsed["tool_calls"].size(), 1u);
    EXPECT_EQ(parsed["tool_calls"][0]["function"]["name"], "f");
    EXPECT_EQ(Json::parse(parsed["tool_calls"][0]["function"]["arguments"].get<std::string>()),
              Json::parse(R"({"a": "x", "b": [1, 2]})"));
  }
}

}  // namespace
}  // namespace deepinfer::tokenizer
