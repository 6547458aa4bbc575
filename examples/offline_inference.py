"""Offline inference with the Python API (vLLM-style), on the embedded default model.

    pip install .                       # from the repository root
    python examples/offline_inference.py

The default model is a tiny DeepSeek-V4.1 with random weights and the real DeepSeek tokenizer:
its text is noise by design. Set DEEPINFER_HF_MODEL_DIR (or pass model=...) for a checkpoint.
"""

from deepinfer import LLM, SamplingParams


def main() -> None:
    llm = LLM(max_model_len=256)  # DEEPINFER_HF_MODEL_DIR, else the embedded default model

    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    greedy = SamplingParams(temperature=0, max_tokens=16)
    seeded = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16, seed=1234)

    print("== generate: greedy, then seeded sampling")
    for params in (greedy, seeded):
        for output in llm.generate(prompts, params):
            completion = output.outputs[0]
            print(f"{output.prompt_token_ids[:6]}... -> {completion.text!r} ({completion.finish_reason})")

    print("== chat")
    conversation = [{"role": "user", "content": "Write a haiku about the sea."}]
    print(repr(llm.chat(conversation, seeded)[0].outputs[0].text))

    print("== stream")
    for delta in llm.stream(prompts[0], seeded):
        print(delta.outputs[0].text, end="", flush=True)
    print()

    print("== structured output (regex)")
    constrained = SamplingParams(max_tokens=32, seed=7, so_args={"schema_type": "regex", "schema": r"[A-Z][a-z]{2,8} [0-9]{1,3}"})
    print(repr(llm.generate("Name and age:", constrained)[0].outputs[0].text))


if __name__ == "__main__":
    main()
