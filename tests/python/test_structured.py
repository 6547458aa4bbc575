"""so_args through the Python API: every output is checked by an independent oracle, Python's
`re.fullmatch` for regexes and the `jsonschema` package for JSON schemas (the model has random
weights, so only the constraint makes the outputs valid)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from deepinfer import SamplingParams

PROMPTS = ["Order number:", "def f(x):", [10, 11, 12], [42]]


@pytest.mark.parametrize("pattern", [r"[a-z]{2,6}-[0-9]{2,4}", r"(yes|no|maybe)( indeed)?", r"-?[1-9][0-9]{0,5}"])
def test_regex_outputs_fullmatch(llm, pattern):
    params = [SamplingParams(temperature=1.0, max_tokens=40, seed=seed,
                             so_args={"schema_type": "regex", "schema": pattern})
              for seed in range(len(PROMPTS))]
    for output in llm.generate(PROMPTS, params):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", completion
        assert re.fullmatch(pattern, completion.text), completion.text


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_json_schema_outputs_validate(llm):
    params = [SamplingParams(temperature=0.7, max_tokens=64, seed=seed,
                             so_args={"schema_type": "json", "schema": SCHEMA})
              for seed in range(len(PROMPTS))]
    for output in llm.generate(PROMPTS, params):
        completion = output.outputs[0]
        assert completion.finish_reason == "stop", completion
        jsonschema.validate(json.loads(completion.text), SCHEMA)


def test_malformed_schema_raises(llm):
    params = SamplingParams(max_tokens=4, so_args={"schema_type": "regex", "schema": "(unclosed"})
    with pytest.raises(ValueError, match="regex|unclosed|parenthes"):
        llm.generate("x", params)
