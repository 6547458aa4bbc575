#!/usr/bin/env python3
"""xgrammar on the same schemas, vocabulary and token sequences as structured_bench.

Usage: xgrammar_bench.py schemas.json token_sequences.json /path/to/deepseek_v3 [reps] [results.json]
Measures compile time (fresh compiler, cache off, 2 threads), per-token mask time (median, p99)
and compiled-grammar memory, printing the same table as structured_bench. The token sequence is
replayed `reps` times with a fresh matcher each time; median and p99 are medians over the runs.
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
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    results = []
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[3])
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=129280)
    print(f"xgrammar {importlib.metadata.version('xgrammar')}, torch {torch.__version__}, threads=2")
    print(f"{'schema':20s} {'compile_ms':>10s} {'mask_med_us':>10s} {'mask_p99_us':>10s} {'tokens':>8s} {'grammar_KB':>10s} {'call_us':>10s}")
    for seq in sequences:
        schema = json.dumps(schemas[seq["name"]]["schema"])
        compile_ms = []
        for _ in range(max(3, reps)):
            compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
            t0 = time.perf_counter()
            compiled = compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"), strict_mode=False)
            compile_ms.append((time.perf_counter() - t0) * 1e3)
        bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
        run_median, run_p99 = [], []
        for _ in range(reps):
            matcher = xgr.GrammarMatcher(compiled)
            mask_us = []
            for token in seq["tokens"]:
                t0 = time.perf_counter()
                matcher.fill_next_token_bitmask(bitmask)
                mask_us.append((time.perf_counter() - t0) * 1e6)
                if not matcher.accept_token(token):
                    raise SystemExit(f"{seq['name']}: xgrammar rejects token {token}")
            run_median.append(percentile(mask_us, 0.5))
            run_p99.append(percentile(mask_us, 0.99))
        # The cost of crossing the Python binding once (a trivial matcher call), included in every
        # mask time above: reported so the comparison can be read net of it.
        call_us = []
        for _ in range(200):
            t0 = time.perf_counter()
            matcher.is_terminated()
            call_us.append((time.perf_counter() - t0) * 1e6)
        memory = compiled.memory_size_bytes / 1024 if hasattr(compiled, "memory_size_bytes") else float("nan")
        result = {"name": seq["name"], "compile_ms": statistics.median(compile_ms),
                  "mask_median_us": percentile(run_median, 0.5), "mask_p99_us": percentile(run_p99, 0.5),
                  "tokens": len(seq["tokens"]), "grammar_kb": memory,
                  "binding_call_us": statistics.median(call_us)}
        results.append(result)
        print(f"{seq['name']:20s} {result['compile_ms']:10.2f} {result['mask_median_us']:10.2f} "
              f"{result['mask_p99_us']:10.1f} {len(seq['tokens']):8d} {memory:10.0f} {result['binding_call_us']:10.2f}")
    if len(sys.argv) > 5:
        with open(sys.argv[5], "w") as out:
            json.dump(results, out)


if __name__ == "__main__":
    main()
