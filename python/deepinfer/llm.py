"""LLM: vLLM's offline-inference calls over the C++ engine (deepinfer._deepinfer.LLM)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Union

from . import _deepinfer
from ._deepinfer import EngineArgs, Error, RequestOutput, SamplingParams

# A prompt as vLLM takes it: text, token ids, {"prompt": text} or {"prompt_token_ids": ids}.
PromptType = Union[str, Sequence[int], Mapping[str, Any]]
Message = Mapping[str, Any]


class LLM(_deepinfer.LLM):
    """An engine loaded with a model, as vLLM's ``LLM``.

    ``LLM()`` loads DEEPINFER_HF_MODEL_DIR, else the embedded default model;
    ``LLM(model="/path/to/checkpoint", max_model_len=1024, max_num_seqs=16, seed=0)`` takes
    any EngineArgs field as a keyword. Loading and generation release the GIL; one call runs
    at a time per LLM.
    """

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        super().__init__(EngineArgs(model=model, **engine_args))

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
    ) -> list[RequestOutput]:
        """Generates for every prompt and returns one RequestOutput each, in prompt order.

        ``sampling_params``: one for all prompts, one per prompt, or None (SamplingParams()).
        Raises deepinfer.Error naming the prompt when a prompt or its parameters are invalid.
        """
        batch = _prompt_batch(prompts, prompt_token_ids)
        outputs = self._generate(batch, _params_per_prompt(sampling_params, len(batch)))
        _raise_first_error(outputs)
        return outputs

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        thinking: bool = False,
        reasoning_effort: str = "",
    ) -> list[RequestOutput]:
        """Generates the assistant's reply to one conversation (a list of {"role", "content"}
        dicts) or to each of a list of conversations, with the DeepSeek chat encoding.
        ``thinking`` selects DeepSeek's thinking mode; ``reasoning_effort`` is "", "low",
        "high", "xhigh" or "max" (thinking mode only)."""
        batch = _conversation_batch(messages)
        outputs = self._generate(
            batch, _params_per_prompt(sampling_params, len(batch)), thinking, reasoning_effort
        )
        _raise_first_error(outputs)
        return outputs

    def stream(
        self,
        prompts: PromptType | Sequence[PromptType] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        prompt_token_ids: Sequence[int] | Sequence[Sequence[int]] | None = None,
    ) -> Iterator[RequestOutput]:
        """Streams output deltas as the engine produces them.

        Yields RequestOutputs holding only what is new for that request since its previous
        delta (``outputs[i].text`` / ``token_ids`` / ``logprobs``); the last delta of a request
        has ``finished`` True and its finish_reason. ``request_id`` is the prompt's index as a
        str. Use it in a ``with`` block (or call ``close()``) to abort what is left when
        stopping early; generate() cannot run on this LLM until the stream is done or closed.
        """
        batch = _prompt_batch(prompts, prompt_token_ids)
        return self._stream(batch, _params_per_prompt(sampling_params, len(batch)))

    def chat_stream(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        thinking: bool = False,
        reasoning_effort: str = "",
    ) -> Iterator[RequestOutput]:
        """stream() for conversations, as chat() takes them."""
        batch = _conversation_batch(messages)
        return self._stream(
            batch, _params_per_prompt(sampling_params, len(batch)), thinking, reasoning_effort
        )


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and all(
        isinstance(item, int) or hasattr(item, "__index__") for item in value
    )


def _one_prompt(prompt: Any, index: int) -> str | list[int]:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Mapping):
        unknown = set(prompt) - {"prompt", "prompt_token_ids"}
        if unknown or len(prompt) != 1:
            raise Error(
                f"prompts[{index}]: a prompt dict has exactly one of the keys 'prompt' (text) "
                f"or 'prompt_token_ids', got {sorted(prompt)}"
            )
        return _one_prompt(prompt.get("prompt", prompt.get("prompt_token_ids")), index)
    if _is_token_ids(prompt):
        return [int(token) for token in prompt]
    raise Error(
        f"prompts[{index}] must be a str, a list of token ids or a dict with 'prompt' or "
        f"'prompt_token_ids', got {type(prompt).__name__}"
    )


def _prompt_batch(prompts: Any, prompt_token_ids: Any) -> list[str | list[int]]:
    if prompt_token_ids is not None:
        if prompts is not None:
            raise Error("give prompts or prompt_token_ids, not both")
        prompts = prompt_token_ids
    if prompts is None:
        raise Error("no prompts: pass prompts (text or token ids) or prompt_token_ids")
    # A single prompt (text, one dict, or one list of ids) is a batch of one, as in vLLM.
    if isinstance(prompts, (str, Mapping)) or (_is_token_ids(prompts) and len(prompts) > 0):
        prompts = [prompts]
    if not isinstance(prompts, Iterable):
        raise Error(f"prompts must be a prompt or a list of prompts, got {type(prompts).__name__}")
    return [_one_prompt(prompt, index) for index, prompt in enumerate(prompts)]


def _conversation_batch(messages: Any) -> list[list[Message]]:
    if isinstance(messages, Sequence) and messages and isinstance(messages[0], Mapping):
        messages = [messages]  # one conversation
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
        raise Error(
            "messages must be a conversation (a list of {'role', 'content'} dicts) or a list "
            f"of conversations, got {type(messages).__name__}"
        )
    return [list(conversation) for conversation in messages]


def _params_per_prompt(sampling_params: Any, num_prompts: int) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * num_prompts
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * num_prompts
    params = list(sampling_params)
    if len(params) != num_prompts or not all(isinstance(p, SamplingParams) for p in params):
        raise Error(
            f"sampling_params must be one SamplingParams or a list of one per prompt: "
            f"{num_prompts} prompts, got {len(params)} items"
        )
    return params


def _raise_first_error(outputs: list[RequestOutput]) -> None:
    for index, output in enumerate(outputs):
        if output.error is not None:
            raise Error(f"prompts[{index}]: {output.error}")
