#!/usr/bin/env python3
"""Encodes the same large mixed text with deepinfer and with HF tokenizers (PyPI), single thread
and all threads, and prints MB/s for both.

    python3 bench/tokenizer/run_bench.py --bench build/bench/tokenizer/tokenizer_bench \
        --tokenizer ../shared/data/tokenizers/deepseek_v3 [--mb 20]

The text is the valid-UTF-8 part of the test corpus (scripts/tokenizer/corpus.py: prose from the
vocabulary, many scripts, CJK, emoji, code, digits, whitespace runs), repeated up to --mb MB.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "tokenizer"))
from corpus import generate_corpus  # noqa: E402

HF_SNIPPET = r"""
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
docs = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
size = sum(len(d.encode()) for d in docs)
best = 1e30
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); tok.encode_batch(docs, add_special_tokens=False); best = min(best, time.perf_counter() - t)
print(json.dumps({"mb_s": size / best / 1e6}))
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    words = [t for t in (tok.decode([i]) for i in range(tok.get_vocab_size())) if t and "\ufffd" not in t]
    docs = []
    for raw in generate_corpus(words, random_count=5000):
        try:
            docs.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    base = list(docs)
    while sum(len(d.encode()) for d in docs) < args.mb * 1e6:
        docs += base
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
        path = f.name
    ours = json.loads(subprocess.check_output([args.bench, args.tokenizer, path, str(args.repeats)]))
    hf = {}
    for label, threads in (("single", "1"), ("all", str(os.cpu_count()))):
        env = dict(os.environ, RAYON_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="true")
        out = subprocess.check_output([sys.executable, "-c", HF_SNIPPET, os.path.join(args.tokenizer, "tokenizer.json"),
                                       path, str(args.repeats)], env=env)
        hf[label] = json.loads(out)["mb_s"]
    os.unlink(path)
    print(f"text: {ours['bytes'] / 1e6:.1f} MB in {ours['documents']} documents, {ours['tokens']} tokens; "
          f"{ours['threads']} hardware threads")
    print(f"single thread: deepinfer {ours['single_thread_mb_s']:.2f} MB/s, HF tokenizers {hf['single']:.2f} MB/s, "
          f"ratio {ours['single_thread_mb_s'] / hf['single']:.2f}x")
    print(f"all threads:   deepinfer {ours['all_threads_mb_s']:.2f} MB/s, HF tokenizers {hf['all']:.2f} MB/s, "
          f"ratio {ours['all_threads_mb_s'] / hf['all']:.2f}x")


if __name__ == "__main__":
    main()
