"""deepinfer: offline inference for DeepSeek-V4.1 (Python bindings of the C++ engine).

    from deepinfer import LLM, SamplingParams
    llm = LLM()                                   # the embedded default model
    params = SamplingParams(temperature=0.8, max_tokens=32, seed=1)
    for output in llm.generate(["The capital of France is"], params):
        print(output.outputs[0].text)

Names and behaviour follow vLLM's offline API. Bad arguments raise deepinfer.Error, a
ValueError whose message names the field.
"""

from ._deepinfer import (
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
