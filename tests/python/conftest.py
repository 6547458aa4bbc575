"""Shared fixtures of the Python package tests.

The package comes from DEEPINFER_BUILD_DIR/python when that is set (a CMake build with
-DDEEPINFER_PYTHON=ON, as scripts/test.sh makes: CI builds the library once), else from the
installed `deepinfer`. The oracles are the C++ CLI of the same build (`deepinfer generate
--json`, and `deepinfer forward`, which runs the model without the engine) on a checkpoint
the CLI writes from the embedded default model's config.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = Path(os.environ["DEEPINFER_BUILD_DIR"]) if os.environ.get("DEEPINFER_BUILD_DIR") else None
if BUILD_DIR is not None:
    sys.path.insert(0, str(BUILD_DIR / "python"))

import deepinfer  # noqa: E402  (after the path set-up above)

# Short prompts and outputs keep every test well under a few seconds on 2 cores.
MAX_MODEL_LEN = 128


@pytest.fixture(scope="session")
def cli() -> Path:
    """The `deepinfer` CLI of the build the package comes from."""
    if BUILD_DIR is None or not (BUILD_DIR / "deepinfer").exists():
        pytest.skip("the CLI oracle needs DEEPINFER_BUILD_DIR with a built `deepinfer`")
    return BUILD_DIR / "deepinfer"


def run_cli(cli: Path, *args: str) -> str:
    result = subprocess.run([str(cli), *args], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"deepinfer {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


@pytest.fixture(scope="session")
def model_dir(cli: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's config with seed-0 random weights and the DeepSeek tokenizer."""
    directory = tmp_path_factory.mktemp("model")
    default = REPO_ROOT / "models" / "default"
    run_cli(cli, "make-checkpoint", "--config", str(default / "config.json"), "--seed", "0",
            "--out", str(directory))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(default / name, directory / name)
    return directory


@pytest.fixture(scope="session")
def engram_token_map(cli: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The engram map `deepinfer forward` needs (the engine derives it from tokenizer.json)."""
    path = tmp_path_factory.mktemp("engram") / "engram_token_map.json"
    path.write_text(json.dumps(json.loads(run_cli(cli, "engram-map", "--tokenizer", str(model_dir)))["map"]))
    return path


@pytest.fixture(scope="session")
def llm(model_dir: Path) -> deepinfer.LLM:
    # The engine's default (asynchronous) scheduling, as users get it.
    return deepinfer.LLM(model=str(model_dir), max_model_len=MAX_MODEL_LEN)


def cli_generate(cli: Path, model_dir: Path, requests: list[dict], tmp_path: Path) -> list[dict]:
    """`deepinfer generate --json` on JSONL requests ({"prompt" | "prompt_token_ids" |
    "messages", "sampling_params"}), one result object per request in request order."""
    requests_path = tmp_path / "requests.jsonl"
    requests_path.write_text("".join(json.dumps(request) + "\n" for request in requests))
    stdout = run_cli(cli, "generate", "--model", str(model_dir), "--max-model-len",
                     str(MAX_MODEL_LEN), "--input", str(requests_path), "--json", "--no-progress")
    results = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert len(results) == len(requests), stdout
    return sorted(results, key=lambda result: result["index"])
