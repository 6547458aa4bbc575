"""SamplingParams and EngineArgs: vLLM's names and defaults, keyword construction, and bad
arguments raising ValueError (deepinfer.Error) with the field named. No model is loaded."""

from __future__ import annotations

import copy
import json
import math
import pickle

import pytest

import deepinfer
from deepinfer import EngineArgs, SamplingParams

# vLLM's SamplingParams defaults (vllm/sampling_params.py) for the fields both have; seq_seed is
# vLLM's `seed`.
VLLM_DEFAULTS = {
    "n": 1,
    "temperature": 1.0,
    "top_p": 1.0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "max_tokens": 16,
    "min_tokens": 0,
    "stop": [],
    "stop_token_ids": [],
    "ignore_eos": False,
    "seq_seed": None,
    "logprobs": None,
    "skip_special_tokens": True,
}

EVERY_FIELD = {
    "n": 2,
    "temperature": 0.5,
    "top_p": 0.75,
    "top_k": 40,
    "min_p": 0.125,
    "repetition_penalty": 1.25,
    "presence_penalty": -0.5,
    "frequency_penalty": 1.5,
    "max_tokens": 33,
    "min_tokens": 3,
    "stop": ["\n\n", "END"],
    "stop_token_ids": [1, 2],
    "ignore_eos": True,
    "seq_seed": 2**64 - 1,
    "logprobs": 5,
    "skip_special_tokens": False,
    "so_args": {"schema_type": "regex", "schema": "[a-z]+"},
}


def test_error_is_a_value_error():
    assert issubclass(deepinfer.Error, ValueError)


def test_defaults_are_vllms():
    params = SamplingParams().to_dict()
    for field, value in VLLM_DEFAULTS.items():
        assert params[field] == value, field
    assert params["top_k"] in (0, -1)  # both mean "off" in vLLM
    assert params["so_args"] is None


def test_every_field_round_trips():
    params = SamplingParams(**EVERY_FIELD)
    assert params.to_dict() == EVERY_FIELD
    for field, value in EVERY_FIELD.items():
        assert getattr(params, field) == value, field
    assert SamplingParams(**params.to_dict()) == params
    assert SamplingParams.from_json(params.to_json()) == params
    assert json.loads(params.to_json()) == EVERY_FIELD
    assert pickle.loads(pickle.dumps(params)) == params
    assert copy.deepcopy(params) == params and params.clone() == params
    assert "top_k=40" in repr(params)


def test_vllm_spellings():
    assert SamplingParams(seed=7).seq_seed == 7
    assert SamplingParams(seq_seed=7).seed == 7
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(max_tokens=None).max_tokens is None
    assert SamplingParams(temperature=0).is_greedy
    assert not SamplingParams(temperature=0.7).is_greedy
    # A JSON schema may be given as a dict; it is kept as JSON text.
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    params = SamplingParams(so_args={"schema_type": "json", "schema": schema})
    assert params.so_args["schema_type"] == "json"
    assert json.loads(params.so_args["schema"]) == schema


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 1.5}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2**40}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
        ({"n": 0}, "n"),
        ({"logprobs": -1}, "logprobs"),
        ({"stop": [""]}, "stop[0]"),
        ({"stop": ["ok", 3]}, "stop[1]"),
        ({"stop_token_ids": [5, -1]}, "stop_token_ids[1]"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"seed": -1}, "seq_seed"),
        ({"seed": 2**64}, "seq_seed"),
        ({"so_args": {"schema_type": "xml", "schema": "<a/>"}}, "so_args.schema_type"),
        ({"so_args": {"schema": "[a-z]"}}, "schema_type"),
        ({"so_args": {"schema_type": "regex", "schema": ""}}, "so_args.schema"),
        ({"so_args": {"schema_type": "regex", "schema": "a", "flags": 1}}, "so_args.flags"),
        ({"so_args": "regex"}, "so_args"),
        ({"temprature": 0.5}, "temprature"),
        ({"temperature": object()}, "temperature"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        SamplingParams(**kwargs)


def test_assignment_validates_and_keeps_the_old_value():
    params = SamplingParams(temperature=0.5)
    params.temperature = 0.25
    assert params.temperature == 0.25
    with pytest.raises(ValueError, match="temperature"):
        params.temperature = -1.0
    assert params.temperature == 0.25
    params.so_args = {"schema_type": "any_json", "schema": ""}
    assert params.so_args == {"schema_type": "any_json", "schema": ""}
    with pytest.raises(ValueError, match="so_args.schema_type"):
        params.so_args = {"schema_type": "yaml", "schema": "x"}


def test_engine_args_keywords_and_defaults():
    args = EngineArgs(model="/some/dir", max_model_len=256, max_num_seqs=4, seed=3,
                      accelerator="cpu", async_scheduling=False, batch_invariant=None)
    assert (args.model, args.max_model_len, args.max_num_seqs, args.seed) == ("/some/dir", 256, 4, 3)
    assert args.accelerator == "cpu" and args.async_scheduling is False
    assert args.batch_invariant is None
    defaults = EngineArgs()
    assert defaults.model == "" and defaults.accelerator is None
    assert "max_num_seqs=64" in repr(defaults)


def test_engine_args_path_like_model(tmp_path):
    assert EngineArgs(model=tmp_path).model == str(tmp_path)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_num_seqs": "many"}, "max_num_seqs"),
        ({"max_num_seqs": 2.5}, "max_num_seqs"),
        ({"max_model_len": 2**40}, "max_model_len"),
        ({"seed": -1}, "seed"),
        ({"async_scheduling": 1}, "async_scheduling"),
        ({"memory_fraction": math.nan}, "memory_fraction"),
        ({"accelerator": "tpu"}, "accelerator"),
        ({"modle": "/x"}, "modle"),
    ],
)
def test_bad_engine_args_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineArgs(**kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_batched_tokens": -1}, "max_num_batched_tokens"),
        ({"memory_fraction": 1.5}, "memory_fraction"),
        ({"max_model_len": -1}, "max_model_len"),
    ],
)
def test_engine_args_values_checked_by_resolved_and_llm(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineArgs(**kwargs).resolved()
    with pytest.raises(ValueError, match=field):
        deepinfer.LLM(model="/nonexistent", **kwargs)


def test_environment_fills_unset_engine_args(monkeypatch, tmp_path):
    monkeypatch.setenv("DEEPINFER_HF_MODEL_DIR", str(tmp_path))
    monkeypatch.setenv("DEEPINFER_ASYNC_SCHEDULING", "0")
    resolved = EngineArgs().resolved()
    assert resolved.model == str(tmp_path)
    assert resolved.async_scheduling is False
    assert resolved.accelerator == "cpu"
    monkeypatch.setenv("DEEPINFER_ACCELERATOR", "abacus")
    with pytest.raises(ValueError, match="DEEPINFER_ACCELERATOR"):
        EngineArgs().resolved()
