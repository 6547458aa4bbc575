#!/usr/bin/env python3
"""Medians over the rounds of run_bench.sh as a markdown table, with ours/xgrammar ratios.

Usage: summarize_bench.py RESULTS_DIR   (holds ours_N.json and xgrammar_N.json per round)
The ratio columns are medians of the per-round ratios (both engines measured in the same round).
"""
import glob
import json
import os
import statistics
import sys

METRICS = [("compile_ms", "compile ms"), ("mask_median_us", "mask median µs"),
           ("mask_p99_us", "mask p99 µs")]


def load(pattern):
    rounds = {}
    for path in glob.glob(pattern):
        round_id = os.path.basename(path).rsplit("_", 1)[1].split(".")[0]
        rounds[round_id] = {r["name"]: r for r in json.load(open(path))}
    return rounds


def main():
    ours = load(os.path.join(sys.argv[1], "ours_*.json"))
    xgr = load(os.path.join(sys.argv[1], "xgrammar_*.json"))
    round_ids = sorted(set(ours) & set(xgr))
    names = list(ours[round_ids[0]])
    header = ["schema (tokens)"]
    for _, label in METRICS:
        header += [f"ours {label}", f"xgr {label}", "ratio"]
    header += ["ours grammar KB", "xgr grammar KB", "xgr binding call µs"]
    print(f"{len(round_ids)} rounds; ratio = median over rounds of ours/xgrammar (< 1: ours faster)\n")
    print("| " + " | ".join(header) + " |")
    print("| --- |" + " ---: |" * (len(header) - 1))
    for name in names:
        row = [f"{name} ({ours[round_ids[0]][name]['tokens']})"]
        for key, _ in METRICS:
            a = [ours[r][name][key] for r in round_ids]
            b = [xgr[r][name][key] for r in round_ids]
            ratios = [x / y for x, y in zip(a, b)]
            row += [f"{statistics.median(a):.2f}", f"{statistics.median(b):.2f}",
                    f"{statistics.median(ratios):.2f}"]
        calls = [xgr[r][name].get("binding_call_us", float("nan")) for r in round_ids]
        row += [f"{ours[round_ids[0]][name]['grammar_kb']:.0f}", f"{xgr[round_ids[0]][name]['grammar_kb']:.0f}",
                f"{statistics.median(calls):.2f}"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
