#include "tokenizer/chat_encoding.h"

#include <cstdio>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kDsml = "｜DSML｜";
constexpr std::string_view kUser = "<｜User｜>";
constexpr std::string_view kAssistant = "<｜Assistant｜>";
constexpr std::string_view kSystem = "<｜System｜>";  // V4.1 only
constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";

const std::unordered_map<std::string, std::string>& task_tokens() {
  static const std::unordered_map<std::string, std::string> tokens = {
      {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};
  return tokens;
}

constexpr std::string_view kV4EffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

constexpr std::string_view kResponseFormatPrefix =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

// The names that differ between the two DSML dialects.
struct Dialect {
  bool v41;
  std::string calls_block;  // "tool_calls" (V4) / " calls" (V4.1)
  std::string invoke;       // "invoke" / " invoke"
  std::string parameter;    // "parameter" / " parameter"
};

Dialect dialect(ChatFormat format) {
  if (format == ChatFormat::kDeepSeekV41) return {true, " calls", " invoke", " parameter"};
  return {false, "tool_calls", "invoke", "parameter"};
}

std::string tools_prompt(const Dialect& d, const std::string& schemas) {
  const std::string dsml(kDsml);
  const std::string block = "<" + dsml + d.calls_block + ">";
  const std::string block_end = "</" + dsml + d.calls_block + ">";
  const std::string invoke = "<" + dsml + d.invoke;
  const std::string invoke_end = "</" + dsml + d.invoke + ">";
  std::string s =
      "## Tools\n\nYou have access to a set of tools to help answer the user's question. "
      "You can invoke tools by writing a \"" +
      block + "\" block like the following:\n\n";
  s += block + "\n";
  s += invoke + " name=\"$TOOL_NAME\">\n";
  s += "<" + dsml + d.parameter +
       " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + dsml + d.parameter +
       ">\n...\n";
  s += invoke_end + "\n";
  s += invoke + " name=\"$TOOL_NAME2\">\n...\n";
  s += invoke_end + "\n" + block_end + "\n\n";
  s += "String parameters should be specified as is and set `string=\"true\"`. For all other types "
       "(numbers, booleans, arrays, objects), pass the value in JSON format and set "
       "`string=\"false\"`.\n\n";
  s +=
      "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
      "inside <think>...</think> BEFORE any tool calls or final response.\n\n";
  s += "Otherwise, output directly after </think> with tool calls or final response.\n\n";
  s += "### Available Tool Schemas\n\n" + schemas + "\n\n";
  s += "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
       "calls.\n";
  return s;
}

void dump_string(std::string& out, const std::string& s) {
  out.push_back('"');
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", static_cast<unsigned char>(c));
          out += buffer;
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

void dump(std::string& out, const Json& value) {
  switch (value.type()) {
    case Json::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        dump_string(out, key);
        out += ": ";
        dump(out, item);
      }
      out.push_back('}');
      break;
    }
    case Json::value_t::array: {
      out.push_back('[');
      for (std::size_t i = 0; i < value.size(); ++i) {
        if (i) out += ", ";
        dump(out, value[i]);
      }
      out.push_back(']');
      break;
    }
    case Json::value_t::string:
      dump_string(out, value.get_ref<const std::string&>());
      break;
    case Json::value_t::boolean:
      out += value.get<bool>() ? "true" : "false";
      break;
    case Json::value_t::null:
      out += "null";
      break;
    default:
      out += value.dump();
      break;  // numbers: shortest round-trip, as Python's repr
  }
}

std::string str_field(const Json& msg, const char* key) {
  if (!msg.contains(key) || msg[key].is_null()) return {};
  if (!msg[key].is_string()) DI_THROW("field \"", key, "\" must be a string");
  return msg[key].get<std::string>();
}

bool truthy(const Json& msg, const char* key) {
  if (!msg.contains(key) || msg[key].is_null()) return false;
  const Json& v = msg[key];
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_array() || v.is_object() || v.is_string())
    return !v.empty() && !(v.is_string() && v.get_ref<const std::string&>().empty());
  if (v.is_number()) return v != 0;
  return true;
}

std::string role_of(const Json& msg) {
  return msg.value("role", std::string());
}

// OpenAI tool messages become <tool_result> blocks of a user message (neither format has a
// tool role); consecutive user turns merge into one.
Json merge_tool_messages(const Json& messages, bool v41) {
  Json merged = Json::array();
  for (const Json& original : messages) {
    Json msg = original;
    const std::string role = role_of(msg);
    if (role == "tool") {
      Json block = {{"type", "tool_result"},
                    {"tool_use_id", msg.value("tool_call_id", Json(""))},
                    {"content", msg.value("content", Json(""))}};
      if (!merged.empty() && role_of(merged.back()) == "user" &&
          merged.back().contains("content_blocks")) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        merged.push_back({{"role", "user"}, {"content_blocks", Json::array({block})}});
      }
    } else if (role == "user") {
      Json blocks;
      if (v41 && msg.contains("content_blocks") && !msg["content_blocks"].is_null()) {
        blocks = msg["content_blocks"];
      } else {
        blocks = Json::array({{{"type", "text"}, {"text", msg.value("content", Json(""))}}});
      }
      const bool can_merge = !merged.empty() && role_of(merged.back()) == "user" &&
                             merged.back().contains("content_blocks") &&
                             (!merged.back().contains("task") || merged.back()["task"].is_null());
      if (can_merge) {
        for (const Json& b : blocks) merged.back()["content_blocks"].push_back(b);
      } else if (v41) {
        msg["content_blocks"] = blocks;
        merged.push_back(std::move(msg));
      } else {
        Json fresh = {{"role", "user"},
                      {"content", msg.value("content", Json(""))},
                      {"content_blocks", blocks}};
        for (const char* key : {"task", "wo_eos", "mask"}) {
          if (msg.contains(key)) fresh[key] = msg[key];
        }
        merged.push_back(std::move(fresh));
      }
    } else {
      merged.push_back(std::move(msg));
    }
  }
  return merged;
}

void sort_tool_results_by_call_order(Json& messages) {
  std::unordered_map<std::string, int> order;
  for (Json& msg : messages) {
    const std::string role = role_of(msg);
    if (role == "assistant" && truthy(msg, "tool_calls")) {
      order.clear();
      int index = 0;
      for (const Json& call : msg["tool_calls"]) {
        std::string id;
        if (call.contains("id") && call["id"].is_string()) id = call["id"].get<std::string>();
        if (id.empty() && call.contains("function") && call["function"].contains("id") &&
            call["function"]["id"].is_string()) {
          id = call["function"]["id"].get<std::string>();
        }
        if (!id.empty()) order[id] = index;
        ++index;
      }
    } else if (role == "user" && truthy(msg, "content_blocks")) {
      std::vector<Json> results;
      for (const Json& b : msg["content_blocks"]) {
        if (b.value("type", std::string()) == "tool_result") results.push_back(b);
      }
      if (results.size() > 1 && !order.empty()) {
        auto rank = [&](const Json& b) {
          const std::string id = b.contains("tool_use_id") && b["tool_use_id"].is_string()
                                     ? b["tool_use_id"].get<std::string>()
                                     : std::string();
          auto it = order.find(id);
          return it == order.end() ? 0 : it->second;
        };
        std::stable_sort(results.begin(), results.end(),
                         [&](const Json& a, const Json& b) { return rank(a) < rank(b); });
        std::size_t next = 0;
        for (Json& b : msg["content_blocks"]) {
          if (b.value("type", std::string()) == "tool_result") b = results[next++];
        }
      }
    }
  }
}

int last_user_index(const Json& messages, bool v41) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    const std::string role = role_of(messages[static_cast<std::size_t>(i)]);
    if (role == "user" || role == "developer" || (v41 && role == "system" && i > 0)) return i;
  }
  return -1;
}

Json drop_thinking_messages(const Json& messages, bool v41) {
  const int last_user = last_user_index(messages, v41);
  Json result = Json::array();
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string role = role_of(messages[i]);
    const bool keep = role == "user" || role == "system" || role == "tool" ||
                      role == "latest_reminder" || role == "direct_search_results";
    if (keep || static_cast<int>(i) >= last_user) {
      result.push_back(messages[i]);
    } else if (role == "assistant") {
      Json copy = messages[i];
      copy.erase("reasoning_content");
      result.push_back(std::move(copy));
    }
  }
  return result;
}

std::string dsml_arguments(const Dialect& d, const Json& arguments_field) {
  Json arguments;
  if (d.v41) {
    arguments = arguments_field.is_string() ? Json::parse(arguments_field.get<std::string>())
                                            : arguments_field;
    if (!arguments.is_object()) DI_THROW("tool call function.arguments must be a JSON object");
  } else {
    // V4 keys a value that is not a JSON string of an object as one "arguments" parameter.
    bool parsed = false;
    if (arguments_field.is_string()) {
      try {
        arguments = Json::parse(arguments_field.get<std::string>());
        parsed = true;
      } catch (const Json::parse_error&) {
      }
    }
    if (!parsed) arguments = Json{{"arguments", arguments_field}};
    if (!arguments.is_object()) DI_THROW("tool call function.arguments must be a JSON object");
  }
  std::string out;
  bool first = true;
  const std::string dsml(kDsml);
  for (const auto& [key, value] : arguments.items()) {
    if (!first) out += "\n";
    first = false;
    out += "<" + dsml + d.parameter + " name=\"" + key + "\" string=\"" +
           (value.is_string() ? "true" : "false") + "\">";
    out += value.is_string() ? value.get<std::string>() : python_json_dumps(value);
    out += "</" + dsml + d.parameter + ">";
  }
  return out;
}

std::string render_tools(const Dialect& d, const Json& tools) {
  std::string schemas;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    if (i) schemas += "\n";
    if (!tools[i].contains("function")) DI_THROW("tools[", i, "] has no \"function\" object");
    schemas += python_json_dumps(tools[i]["function"]);
  }
  return tools_prompt(d, schemas);
}

std::string effort_prompt(const Dialect& d, std::size_t index, bool thinking, const Json& effort) {
  if (!d.v41) {
    if (!effort.is_null() && effort != "max" && effort != "high") {
      DI_THROW("reasoning_effort ", effort.dump(),
               " is not valid for DeepSeek-V4 (null, \"high\", \"max\")");
    }
    return index == 0 && thinking && effort == "max" ? std::string(kV4EffortMax) : std::string();
  }
  int budget = 50;  // V4.1 default "high"
  if (effort.is_number_integer() && effort.get<int64_t>() >= 1 && effort.get<int64_t>() <= 100) {
    budget = effort.get<int>();
  } else if (effort.is_string()) {
    const std::string name = effort.get<std::string>();
    if (name == "low")
      budget = 25;
    else if (name == "high")
      budget = 50;
    else if (name == "xhigh")
      budget = 75;
    else if (name == "max")
      budget = 100;
    else
      DI_THROW("reasoning_effort \"", name,
               "\" is not valid for DeepSeek-V4.1 (low, high, xhigh, max or 1..100)");
  } else if (!effort.is_null()) {
    DI_THROW("reasoning_effort ", effort.dump(),
             " is not valid for DeepSeek-V4.1 (low, high, xhigh, max or 1..100)");
  }
  if (index != 0 || !thinking) return {};
  return "Reasoning Effort: " + std::to_string(budget) +
         " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
}

std::string render_message(const Dialect& d, std::size_t index, const Json& messages, bool thinking,
                           bool drop_thinking, const Json& effort) {
  const Json& msg = messages[index];
  const int last_user = last_user_index(messages, d.v41);
  const std::string role = role_of(msg);
  const std::string content = str_field(msg, "content");
  const bool has_tools = truthy(msg, "tools");
  const bool has_format = truthy(msg, "response_format");

  std::string prompt;
  const std::string effort_text = effort_prompt(d, index, thinking, effort);
  if (d.v41 && index == 0 && (!effort_text.empty() || role == "system")) prompt += kSystem;
  prompt += effort_text;

  auto append_tools_and_format = [&](std::string& target) {
    if (has_tools) target += "\n\n" + render_tools(d, msg["tools"]);
    if (has_format)
      target +=
          "\n\n" + std::string(kResponseFormatPrefix) + python_json_dumps(msg["response_format"]);
  };

  if (role == "system") {
    if (d.v41 && index > 0) prompt += kSystem;
    prompt += content;
    append_tools_and_format(prompt);
  } else if (role == "developer") {
    if (content.empty()) DI_THROW("a developer message needs non-empty content");
    std::string text = std::string(kUser) + content;
    append_tools_and_format(text);
    prompt += text;
  } else if (role == "user") {
    prompt += kUser;
    if (truthy(msg, "content_blocks")) {
      bool first = true;
      for (const Json& block : msg["content_blocks"]) {
        if (!first) prompt += "\n\n";
        first = false;
        const std::string type = block.value("type", std::string());
        if (type == "text") {
          prompt += block.value("text", std::string());
        } else if (type == "tool_result") {
          const Json& result = block.contains("content") ? block["content"] : Json("");
          std::string text;
          if (result.is_array()) {
            bool first_part = true;
            for (const Json& part : result) {
              if (!first_part) text += "\n\n";
              first_part = false;
              const std::string part_type = part.value("type", std::string());
              text += part_type == "text" ? part.value("text", std::string())
                                          : "[Unsupported " + part_type + "]";
            }
          } else if (result.is_string()) {
            text = result.get<std::string>();
          } else {
            text = python_json_dumps(result);
          }
          prompt += "<tool_result>" + text + "</tool_result>";
        } else if (type == "image" || type == "image_url") {
          DI_THROW("image content blocks are not supported by this text-only encoder");
        } else {
          prompt += "[Unsupported " + type + "]";
        }
      }
    } else {
      prompt += content;
    }
  } else if (role == "latest_reminder") {
    prompt += std::string(kLatestReminder) + content;
  } else if (role == "assistant") {
    std::string calls;
    if (truthy(msg, "tool_calls")) {
      const std::string dsml(kDsml);
      std::string list;
      bool first = true;
      for (const Json& call : msg["tool_calls"]) {
        if (!call.contains("function")) DI_THROW("tool_calls entry has no \"function\" object");
        const Json& function = call["function"];
        if (!first) list += "\n";
        first = false;
        list +=
            "<" + dsml + d.invoke + " name=\"" + function.value("name", std::string()) + "\">\n" +
            dsml_arguments(d, function.contains("arguments") ? function["arguments"] : Json("{}")) +
            "\n</" + dsml + d.invoke + ">";
      }
      calls = "\n\n<" + dsml + d.calls_block + ">\n" + list + "\n</" + dsml + d.calls_block + ">";
    }
    const bool previous_has_task =
        index > 0 && messages[index - 1].contains("task") && !messages[index - 1]["task"].is_null();
    std::string reasoning;
    if (thinking && !previous_has_task && (!drop_thinking || static_cast<int>(index) > last_user)) {
      reasoning = str_field(msg, "reasoning_content") + std::string(kThinkEnd);
    }
    prompt += reasoning + content + calls;
    if (!(msg.contains("wo_eos") && msg["wo_eos"].is_boolean() && msg["wo_eos"].get<bool>()))
      prompt += kEos;
  } else if (role == "tool") {
    DI_THROW("internal: tool messages must have been merged");
  } else {
    DI_THROW("role \"", role,
             "\" is not supported (system, user, assistant, tool, developer, latest_reminder)");
  }

  if (index + 1 < messages.size()) {
    const std::string next = role_of(messages[index + 1]);
    if (next != "assistant" && next != "latest_reminder") return prompt;
  }
  if (msg.contains("task") && !msg["task"].is_null()) {
    const std::string task = msg["task"].get<std::string>();
    auto it = task_tokens().find(task);
    if (it == task_tokens().end()) DI_THROW("task \"", task, "\" is unknown");
    if (task != "action") {
      prompt += it->second;
    } else {
      prompt += kAssistant;
      prompt += thinking ? kThinkStart : kThinkEnd;
      prompt += it->second;
    }
  } else if (role == "user" || role == "developer" || (d.v41 && role == "system" && index > 0)) {
    prompt += kAssistant;
    const bool open_thinking = thinking && (!drop_thinking || static_cast<int>(index) >= last_user);
    prompt += open_thinking ? kThinkStart : kThinkEnd;
  }
  return prompt;
}

// Finds the earliest of `stops` from `index`; returns the text before it.
struct StopHit {
  std::size_t next;
  std::string before;
  std::string stop;  // empty when none matched
};

StopHit read_until_stop(std::size_t index, std::string_view text,
                        std::initializer_list<std::string> stops) {
  std::size_t best = std::string_view::npos;
  std::string matched;
  for (const std::string& s : stops) {
    const std::size_t pos = text.find(s, index);
    if (pos != std::string_view::npos && pos < best) {
      best = pos;
      matched = s;
    }
  }
  if (matched.empty())
    return {text.size(), std::string(text.substr(std::min(index, text.size()))), ""};
  return {best + matched.size(), std::string(text.substr(index, best - index)), matched};
}

// Python re `$` also matches before one final newline.
bool ends_with_then_end(std::string_view text, std::string_view tail, std::size_t& cut) {
  for (const std::size_t extra : {std::size_t{0}, std::size_t{1}}) {
    if (text.size() < tail.size() + extra) continue;
    if (extra == 1 && text.back() != '\n') continue;
    if (text.substr(text.size() - extra - tail.size(), tail.size()) == tail) {
      cut = text.size() - extra - tail.size();
      return true;
    }
  }
  return false;
}

std::string lstrip_whitespace(std::string_view text) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t next = pos;
    if (!is_unicode_whitespace(decode_utf8(text, next)) && text[pos] != '\x1c' &&
        text[pos] != '\x1d' && text[pos] != '\x1e' && text[pos] != '\x1f') {
      break;
    }
    pos = next;
  }
  return std::string(text.substr(pos));
}

Json parse_tool_calls(const Dialect& d, std::size_t& index, std::string_view text,
                      std::string& stop) {
  const std::string dsml(kDsml);
  const std::string calls_end = "</" + dsml + d.calls_block + ">";
  const std::string invoke_start = "<" + dsml + d.invoke;
  const std::string invoke_end = "</" + dsml + d.invoke;
  const std::string param_start = "<" + dsml + d.parameter;
  const std::string param_end = "/" + dsml + d.parameter;
  Json calls = Json::array();
  while (index < text.size()) {
    StopHit hit = read_until_stop(index, text, {invoke_start, calls_end});
    index = hit.next;
    stop = hit.stop;
    if (hit.before != ">\n")
      DI_THROW("tool call format error: expected '>\\n' but got '", hit.before, "'");
    if (stop == calls_end) break;
    if (stop.empty()) DI_THROW("tool call format error: missing the end of the tool call block");
    hit = read_until_stop(index, text, {param_start, invoke_end});
    index = hit.next;
    stop = hit.stop;
    const std::string head = lstrip_whitespace(hit.before);
    std::size_t cut = 0;
    if (head.rfind("name=\"", 0) != 0 || !ends_with_then_end(head, "\">\n", cut) || cut < 6) {
      DI_THROW("tool name format error: '", hit.before, "'");
    }
    // Lazy `name="(.*?)">\n$`: the first `">\n` that is followed only by the end.
    std::string name = head.substr(6, cut - 6);
    std::vector<std::pair<std::string, std::pair<std::string, bool>>> arguments;
    while (stop == param_start) {
      hit = read_until_stop(index, text, {param_end});
      index = hit.next;
      stop = hit.stop;
      const std::string& p = hit.before;
      const std::string prefix = " name=\"";
      std::size_t value_end = 0;
      if (p.rfind(prefix, 0) != 0 || !ends_with_then_end(p, "<", value_end)) {
        DI_THROW("parameter format error: '", p, "'");
      }
      std::size_t split = std::string::npos;
      bool is_string = false;
      std::size_t value_begin = 0;
      for (std::size_t pos = prefix.size(); pos < p.size(); ++pos) {
        for (const bool candidate : {true, false}) {
          const std::string marker =
              std::string("\" string=\"") + (candidate ? "true" : "false") + "\">";
          if (p.compare(pos, marker.size(), marker) == 0 && pos + marker.size() <= value_end) {
            split = pos;
            is_string = candidate;
            value_begin = pos + marker.size();
            break;
          }
        }
        if (split != std::string::npos) break;
      }
      if (split == std::string::npos) DI_THROW("parameter format error: '", p, "'");
      std::string key = p.substr(prefix.size(), split - prefix.size());
      for (const auto& existing : arguments) {
        if (existing.first == key) DI_THROW("duplicate parameter name: '", key, "'");
      }
      arguments.push_back({key, {p.substr(value_begin, value_end - value_begin), is_string}});
      hit = read_until_stop(index, text, {param_start, invoke_end});
      index = hit.next;
      stop = hit.stop;
      if (hit.before != ">\n")
        DI_THROW("parameter format error: expected '>\\n' but got '", hit.before, "'");
    }
    std::string json = "{";
    for (std::size_t i = 0; i < arguments.size(); ++i) {
      if (i) json += ", ";
      json += python_json_dumps(Json(arguments[i].first)) + ": ";
      json += arguments[i].second.second ? python_json_dumps(Json(arguments[i].second.first))
                                         : arguments[i].second.first;
    }
    json += "}";
    calls.push_back({{"type", "function"}, {"function", {{"name", name}, {"arguments", json}}}});
  }
  return calls;
}

}  // namespace

std::string python_json_dumps(const Json& value) {
  std::string out;
  dump(out, value);
  return out;
}

std::string encode_chat(const Json& input, const ChatEncodeOptions& options) {
  if (!input.is_array()) DI_THROW("chat messages must be a JSON array");
  const Dialect d = dialect(options.format);
  const bool thinking = options.thinking_mode == ThinkingMode::kThinking;
  for (std::size_t i = 0; i < input.size(); ++i) {
    if (!input[i].is_object() || !input[i].contains("role") || !input[i]["role"].is_string()) {
      DI_THROW("messages[", i, "] must be an object with a string \"role\"");
    }
  }
  Json messages = merge_tool_messages(input, d.v41);
  sort_tool_results_by_call_order(messages);
  bool drop = options.drop_thinking;
  for (const Json& m : messages) {
    if (truthy(m, "tools")) drop = false;  // tool use keeps every turn's reasoning
  }
  if (thinking && drop) messages = drop_thinking_messages(messages, d.v41);
  std::string prompt = options.add_bos_token ? std::string(kBos) : std::string();
  for (std::size_t i = 0; i < messages.size(); ++i) {
    try {
      prompt += render_message(d, i, messages, thinking, drop, options.reasoning_effort);
    } catch (const Error& e) {
      DI_THROW("chat message ", i, " (after merging tool messages): ", e.what());
    } catch (const Json::exception& e) {
      DI_THROW("chat message ", i, " (after merging tool messages): ", e.what());
    }
  }
  return prompt;
}

Json parse_completion(std::string_view text, ChatFormat format, ThinkingMode thinking_mode) {
  const Dialect d = dialect(format);
  const std::string calls_start = "\n\n<" + std::string(kDsml) + d.calls_block;
  std::size_t index = 0;
  std::string reasoning;
  if (thinking_mode == ThinkingMode::kThinking) {
    StopHit hit = read_until_stop(index, text, {std::string(kThinkEnd), calls_start});
    if (hit.stop != kThinkEnd) DI_THROW("completion: missing </think> after the reasoning");
    index = hit.next;
    reasoning = hit.before;
  }
  StopHit hit = read_until_stop(index, text, {std::string(kEos), calls_start});
  index = hit.next;
  std::string content = hit.before;
  std::string stop = hit.stop;
  Json calls = Json::array();
  if (stop == calls_start) {
    calls = parse_tool_calls(d, index, text, stop);
    hit = read_until_stop(index, text, {std::string(kEos)});
    if (!hit.before.empty())
      DI_THROW("completion: unexpected text after the tool calls: '", hit.before, "'");
    index = hit.next;
    stop = hit.stop;
  } else if (stop != kEos) {
    DI_THROW("completion: missing the end-of-sentence token");
  }
  if (index != text.size() || !(stop == kEos || stop.empty())) {
    DI_THROW("completion: unexpected text at the end");
  }
  for (std::string_view token : {kBos, kEos, kThinkStart, kThinkEnd, kDsml}) {
    if (content.find(token) != std::string::npos || reasoning.find(token) != std::string::npos) {
      DI_THROW("completion: unexpected special token '", token, "' in the content");
    }
  }
  return Json{{"role", "assistant"},
              {"content", content},
              {"reasoning_content", reasoning},
              {"tool_calls", calls}};
}

}  // namespace deepinfer::tokenizer
