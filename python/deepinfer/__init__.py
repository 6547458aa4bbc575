"""deepinfer: offline inference for DeepSeek-V4.1 (Python bindings of the C++ engine).

    from deepinfer import LLM, SamplingParams
    llm = LLM()                                   # the embedded default model
    params = SamplingParams(temperature=0.8, max_tokens=32, seed=1)
    for output in llm.generate(["The capital of France is"], params):
        print(output.outputs[0].text)

Names and behaviour follow vLLM's offline API. Bad arguments raise deepinfer.Error, a
ValueError whose message names the field.
"""

import os as _os
from pathlib import Path as _Path

# An installed wheel carries the embedded default model's files; tell the library where they are
# (a source build finds them in its own tree).
_PACKAGED_MODEL = _Path(__file__).resolve().parent / "models" / "default"
if (_PACKAGED_MODEL / "config.json").exists():
    _os.environ.setdefault("DEEPINFER_DEFAULT_MODEL_DIR", str(_PACKAGED_MODEL))

from ._deepinfer import (  # noqa: E402
    CompletionOutput,
    EngineArgs,
    Error,
    FinishReason,
    Logprob,
    PositionLogprobs,
    RequestOutput,
    RequestTimings,
    SamplingParams,
    __version__,
)
from .llm import LLM

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineArgs",
    "Error",
    "FinishReason",
    "Logprob",
    "PositionLogprobs",
    "RequestOutput",
    "RequestTimings",
    "SamplingParams",
    "__version__",
]
