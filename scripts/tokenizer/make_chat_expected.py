#!/usr/bin/env python3
"""Oracle for the chat-encoding tests: runs the reference DeepSeek encoders on our own set of
conversations and completions and writes tests/data/tokenizer/chat_expected.json.

The reference modules are not part of this repository; pass their paths:
  --v4   encoding_dsv4.py from the DeepSeek-V4 release (the `encoding/` folder of the model
         repository; a verbatim copy is in github.com/supermy/ds4rs, encoding/encoding_dsv4.py,
         which passes the release's own encoding/tests).
  --v41  encoding_dsv41.py of SGLang (python/sglang/srt/entrypoints/openai/encoding_dsv41.py).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. 北京"},
        "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                     "filters": {"type": "object"}}}}}


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}


CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hello"}],
    "system_user": [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "reasoning_content": "Greet back.", "content": "Hello! 👋"},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "reasoning_content": "Paris.", "content": "Paris."},
        {"role": "user", "content": "And of Japan? 日本の首都は？"}],
    "tools_round_trip": [
        {"role": "system", "content": "You can use tools.", "tools": [WEATHER_TOOL, SEARCH_TOOL]},
        {"role": "user", "content": "Weather in Beijing and Paris for 3 days?"},
        {"role": "assistant", "reasoning_content": "Two calls needed.", "content": "",
         "tool_calls": [call("c1", "get_weather", {"city": "Beijing", "days": 3}),
                        call("c2", "get_weather", {"city": "Paris", "days": 3})]},
        {"role": "tool", "tool_call_id": "c2", "content": "{\"temp\": 18}"},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 25, \"sky\": \"晴\"}"},
        {"role": "assistant", "reasoning_content": "Summarize.", "content": "Beijing 25°C, Paris 18°C."},
        {"role": "user", "content": "Now search news about \"quotes\" and\nnewlines"}],
    "tool_nested_args": [
        {"role": "user", "content": "search", "tools": [SEARCH_TOOL]},
        {"role": "assistant", "content": "Let me look.",
         "tool_calls": [call("s1", "search", {"query": "a \"b\" \\ c", "filters": {"year": [2023, 2024], "safe": True, "x": None, "f": 1.5}})]},
        {"role": "tool", "tool_call_id": "s1", "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]}],
    "response_format": [
        {"role": "system", "content": "JSON only.", "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
        {"role": "user", "content": "Give me an object."}],
    "developer_and_reminder": [
        {"role": "system", "content": "sys"},
        {"role": "developer", "content": "Search agent instructions", "tools": [SEARCH_TOOL]},
        {"role": "latest_reminder", "content": "Today is 2025-01-01."},
        {"role": "user", "content": "What happened?"}],
    "consecutive_users": [
        {"role": "user", "content": "part one"}, {"role": "user", "content": "part two"}],
    "task_action": [{"role": "user", "content": "Turn on the lights", "task": "action"}],
    "task_title": [{"role": "user", "content": "Summarize: cats", "task": "title"},
                   {"role": "assistant", "content": "Cats"}],
    "mid_system": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": "r"},
        {"role": "system", "content": "New instructions arrive."}],
    "assistant_prefill": [
        {"role": "user", "content": "Write a poem"},
        {"role": "assistant", "reasoning_content": "Think", "content": "Roses", "wo_eos": True}],
    "special_text_in_user": [{"role": "user", "content": "<｜User｜>ignore <think>x</think> ｜DSML｜"}],
    "empty_content": [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
}

V4_OPTIONS = [("thinking", None), ("thinking", "max"), ("thinking", "high"), ("chat", None)]
V41_OPTIONS = [("thinking", None), ("thinking", "low"), ("thinking", "max"), ("thinking", 37), ("chat", None), ("chat", "xhigh")]


def completions(dsml_block, invoke, parameter):
    d = "｜DSML｜"
    eos = "<｜end▁of▁sentence｜>"
    tc = (f"\n\n<{d}{dsml_block}>\n<{d}{invoke} name=\"get_weather\">\n"
          f"<{d}{parameter} name=\"city\" string=\"true\">北京 \"east\"</{d}{parameter}>\n"
          f"<{d}{parameter} name=\"days\" string=\"false\">3</{d}{parameter}>\n</{d}{invoke}>\n"
          f"<{d}{invoke} name=\"search\">\n<{d}{parameter} name=\"filters\" string=\"false\">{{\"a\": [1, 2]}}</{d}{parameter}>\n</{d}{invoke}>\n"
          f"</{d}{dsml_block}>")
    return [
        ("thinking", "Simple.</think>2 + 2 = 4." + eos),
        ("thinking", "Need tools.</think>Checking." + tc + eos),
        ("thinking", "</think>" + tc + eos),
        ("chat", "Just text\nwith lines." + eos),
        ("chat", tc + eos),
        ("thinking", "no end of thinking" + eos),
        ("chat", "no eos"),
        ("chat", "bad <think> inside" + eos),
        ("chat", tc + "trailing" + eos),
    ]


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--v4", required=True)
    parser.add_argument("--v41", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    modules = {"v4": load(args.v4, "ref_dsv4"), "v41": load(args.v41, "ref_dsv41")}
    cases = []
    for fmt, options in (("v4", V4_OPTIONS), ("v41", V41_OPTIONS)):
        module = modules[fmt]
        for name, messages in CONVERSATIONS.items():
            for mode, effort in options:
                for drop in (True, False):
                    case = {"format": fmt, "name": name, "thinking_mode": mode, "reasoning_effort": effort,
                            "drop_thinking": drop, "messages": messages}
                    try:
                        case["prompt"] = module.encode_messages(copy.deepcopy(messages), thinking_mode=mode,
                                                                drop_thinking=drop, reasoning_effort=effort)
                    except Exception as error:  # noqa: BLE001 - the oracle records refusals too
                        case["error"] = type(error).__name__
                    cases.append(case)
        block, invoke, parameter = ("tool_calls", "invoke", "parameter") if fmt == "v4" else (" calls", " invoke", " parameter")
        for mode, text in completions(block, invoke, parameter):
            case = {"format": fmt, "parse": text, "thinking_mode": mode}
            try:
                case["parsed"] = module.parse_message_from_completion_text(text, thinking_mode=mode)
            except Exception as error:  # noqa: BLE001
                case["error"] = type(error).__name__
            cases.append(case)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=0)
    print(f"{len(cases)} cases, {sum('error' in c for c in cases)} refusals -> {args.out}")


if __name__ == "__main__":
    main()
