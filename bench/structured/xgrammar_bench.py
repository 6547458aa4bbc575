#!/usr/bin/env python3
"""xgrammar on the same schemas, vocabulary and token sequences as structured_bench.

Usage: xgrammar_bench.py schemas.json token_sequences.json /path/to/deepseek_v3
Measures compile time (fresh compiler, cache off, 2 threads), per-token mask time (median, p99)
and compiled-grammar memory, printing the same table as structured_bench.
"""
import importlib.metadata
import json
import statistics
import sys
import time

import torch
import xgrammar as xgr
from transformers import AutoTokenizer


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * (len(values) - 1) + 0.5))]


def main():
    schemas = {c["name"]: c for c in json.load(open(sys.argv[1]))}
    sequences = json.load(open(sys.argv[2]))
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[3])
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=129280)
    print(f"xgrammar {importlib.metadata.version('xgrammar')}, torch {torch.__version__}, threads=2")
    print(f"{'schema':20s} {'compile_ms':>10s} {'mask_med_us':>10s} {'mask_p99_us':>10s} {'tokens':>8s} {'grammar_KB':>10s}")
    for seq in sequences:
        schema = json.dumps(schemas[seq["name"]]["schema"])
        compile_ms = []
        for _ in range(3):
            compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
            t0 = time.perf_counter()
            compiled = compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"), strict_mode=False)
            compile_ms.append((time.perf_counter() - t0) * 1e3)
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
        mask_us = []
        for token in seq["tokens"]:
            t0 = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            mask_us.append((time.perf_counter() - t0) * 1e6)
            if not matcher.accept_token(token):
                raise SystemExit(f"{seq['name']}: xgrammar rejects token {token}")
        memory = compiled.memory_size_bytes / 1024 if hasattr(compiled, "memory_size_bytes") else float("nan")
        print(f"{seq['name']:20s} {statistics.median(compile_ms):10.1f} {statistics.median(mask_us):10.1f} "
              f"{percentile(mask_us, 0.99):10.1f} {len(seq['tokens']):8d} {memory:10.0f}")


if __name__ == "__main__":
    main()
