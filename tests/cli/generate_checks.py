#!/usr/bin/env python3
"""End-to-end checks of `deepinfer generate` and `deepinfer bench` on the embedded default model.

usage: generate_checks.py CLI SOURCE_DIR WORK_DIR CHECK

Oracles are independent of the engine: Python's `re` for regex constraints, the `jsonschema`
package for JSON Schema constraints, the checkpoint that `make-checkpoint --seed 0` writes for
the in-memory default model, and each request run alone for batches. Exit 77 = skipped.
"""
import json
import os
import re
import subprocess
import sys

CLI, SOURCE_DIR, WORK_DIR, CHECK = sys.argv[1:5]
MODEL_SOURCE = os.path.join(SOURCE_DIR, "models", "default")


def run(args, env=None, stdin=None, expect=0):
    full_env = dict(os.environ)
    full_env.pop("DEEPINFER_HF_MODEL_DIR", None)
    full_env.update(env or {})
    proc = subprocess.run([CLI, "--log-level", "warn"] + args, input=stdin, capture_output=True,
                          text=True, env=full_env, timeout=120)
    if proc.returncode != expect:
        sys.exit(f"{' '.join(args)} exited {proc.returncode}, expected {expect}:\n"
                 f"{proc.stderr}\n{proc.stdout}")
    return proc.stdout


def results(stdout):
    """The JSON lines of --json output, without the timing fields."""
    out = []
    for line in stdout.splitlines():
        item = json.loads(line)
        item.pop("ttft_s", None)
        item.pop("latency_s", None)
        out.append(item)
    return out


PROMPTS = ["--prompt", "The capital of France is", "--prompt", "def fibonacci(n):",
           "--prompt-ids", "5,6,7,8"]


def check_default_model_is_seed0_checkpoint():
    model_dir = os.path.join(WORK_DIR, "default-model-seed0")
    if not os.path.exists(os.path.join(model_dir, "config.json")):
        run(["make-checkpoint", "--config", os.path.join(MODEL_SOURCE, "config.json"), "--seed",
             "0", "--out", model_dir])
        for name in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(MODEL_SOURCE, name), "rb") as src, \
                    open(os.path.join(model_dir, name), "wb") as dst:
                dst.write(src.read())
    flags = PROMPTS + ["--max-tokens", "8", "--seed", "3", "--json"]
    embedded = results(run(["generate"] + flags))
    written = results(run(["generate", "--model", model_dir] + flags))
    assert embedded == written, (embedded, written)
    assert all(len(r["outputs"][0]["token_ids"]) > 0 for r in embedded)


def check_threads_and_async_do_not_change_outputs():
    flags = PROMPTS + ["--max-tokens", "6", "--temperature", "0.8", "--seed", "11", "--n", "2",
                       "--json", "--max-num-batched-tokens", "7"]
    first = results(run(["generate"] + flags, env={"DEEPINFER_CPU_THREADS": "1",
                                                     "DEEPINFER_NUM_THREADS": "1"}))
    second = results(run(["generate", "--no-async"] + flags, env={"DEEPINFER_CPU_THREADS": "2",
                                                                   "DEEPINFER_NUM_THREADS": "2"}))
    assert first == second, (first, second)
    assert len(first[0]["outputs"]) == 2


def check_jsonl_batch_equals_each_alone():
    lines = [
        {"prompt": "Hello there", "sampling_params": {"temperature": 0, "max_tokens": 5}},
        {"prompt_token_ids": [10, 11, 12], "sampling_params": {"seq_seed": 4, "max_tokens": 7}},
        {"messages": [{"role": "user", "content": "Hi!"}],
         "sampling_params": {"seq_seed": 9, "max_tokens": 4, "top_k": 5}},
        {"messages": [{"role": "wizard", "content": "Hi!"}]},
        {"prompt": "x", "sampling_params": {"temperature": -1}},
    ]
    path = os.path.join(WORK_DIR, "requests.jsonl")
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    batch = results(run(["generate", "--input", path, "--json", "--no-progress"], expect=1))
    assert len(batch) == len(lines)
    assert "wizard" in batch[3]["error"], batch[3]
    assert "temperature" in batch[4]["error"], batch[4]
    for i in (1, 2):
        alone_path = os.path.join(WORK_DIR, f"alone{i}.jsonl")
        with open(alone_path, "w") as f:
            f.write(json.dumps(lines[i]) + "\n")
        alone = results(run(["generate", "--input", alone_path, "--json"]))[0]
        assert "error" not in batch[i], batch[i]
        assert batch[i]["outputs"] == alone["outputs"], (batch[i], alone)


def check_stdin_streaming_text():
    """A prompt from stdin, streamed to the terminal, prints the text --json reports."""
    streamed = run(["generate", "--prompt", "-", "--max-tokens", "6", "--seed", "2"],
                   stdin="Once upon a time")
    as_json = results(run(["generate", "--prompt", "Once upon a time", "--max-tokens", "6",
                           "--seed", "2", "--json"]))[0]
    assert streamed == as_json["outputs"][0]["text"] + "\n", (streamed, as_json)


def check_regex_constraint():
    pattern = r"[A-Z][a-z]{2,8} (is|was) [0-9]{1,3}\."
    out = results(run(["generate", "--prompt", "Fact:", "--prompt", "Another", "--n", "3",
                       "--max-tokens", "48", "--seed", "5", "--regex", pattern, "--json"]))
    for request in out:
        for completion in request["outputs"]:
            assert completion["finish_reason"] == "stop", completion
            assert re.fullmatch(pattern, completion["text"]), completion["text"]


def check_json_schema_constraint():
    try:
        import jsonschema
    except ImportError:
        sys.exit(77)
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tag": {"enum": ["red", "green"]},
        },
        "required": ["name", "age", "tag"],
        "additionalProperties": False,
    }
    out = results(run(["generate", "--prompt", "JSON:", "--prompt", "{", "--n", "2",
                       "--max-tokens", "96", "--seed", "8", "--temperature", "0.7",
                       "--json-schema", json.dumps(schema), "--json"]))
    for request in out:
        for completion in request["outputs"]:
            assert completion["finish_reason"] == "stop", completion
            jsonschema.validate(json.loads(completion["text"]), schema)
    # A malformed schema fails that request alone.
    lines = [{"prompt": "a", "sampling_params": {"max_tokens": 3}},
             {"prompt": "b", "sampling_params": {"so_args": {"schema_type": "json",
                                                             "schema": "{\"type\": 5"}}}]
    path = os.path.join(WORK_DIR, "bad_schema.jsonl")
    with open(path, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    batch = results(run(["generate", "--input", path, "--json", "--no-progress"], expect=1))
    assert "error" not in batch[0] and "so_args" in batch[1]["error"], batch


def check_bench():
    report = json.loads(run(["bench", "--num-requests", "6", "--input-len", "16", "--output-len",
                             "8", "--seed", "1", "--json", "--warmup-requests", "1"]))
    assert report["num_requests"] == 6
    assert report["output_tokens"] >= 6 * 4
    for key in ("requests_per_s", "output_tokens_per_s"):
        assert report[key] > 0, report
    for key in ("ttft_ms", "tpot_ms"):
        d = report[key]
        assert 0 <= d["p50"] <= d["p90"] <= d["p99"], report


def check_accelerator_errors():
    err = subprocess.run([CLI, "generate", "--prompt-ids", "1,2"], capture_output=True, text=True,
                         env=dict(os.environ, DEEPINFER_ACCELERATOR="tpu"))
    assert err.returncode == 1 and "DEEPINFER_ACCELERATOR" in err.stderr, err.stderr
    # nvidia runs where a CUDA build finds a supported GPU; anywhere else it must say why not.
    run = subprocess.run([CLI, "generate", "--prompt-ids", "1,2", "--max-tokens", "2"],
                         capture_output=True, text=True,
                         env=dict(os.environ, DEEPINFER_ACCELERATOR="nvidia"))
    assert run.returncode == 0 or (run.returncode == 1 and "nvidia" in run.stderr), run.stderr
    err = subprocess.run([CLI, "generate", "--prompt-ids", "1,2"], capture_output=True, text=True,
                         env=dict(os.environ, DEEPINFER_BATCH_INVARIANT="yes"))
    assert err.returncode == 1 and "DEEPINFER_BATCH_INVARIANT" in err.stderr, err.stderr


os.makedirs(WORK_DIR, exist_ok=True)
globals()["check_" + CHECK]()
print(f"{CHECK}: ok")
