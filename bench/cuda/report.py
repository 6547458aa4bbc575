"""Markdown tables from cuda_layer_bench's JSON (for docs/BENCHMARKS.md).

  python3 bench/cuda/report.py layer_bench.json
"""
import json
import sys
from collections import defaultdict

data = json.load(open(sys.argv[1]))
roof = data["roofline"]
print(f"GPU: {data['gpu']} ({data['sms']} SMs). Rooflines: HBM read {roof['read_gbps']:.0f} GB/s, "
      f"copy {roof['copy_gbps']:.0f} GB/s (read+write), cudaMemcpy D2D {roof['memcpy_d2d_gbps']:.0f} "
      f"GB/s; cuBLASLt 8192^3 FP8 {roof['fp8_tflops']:.0f} TFLOP/s, BF16 {roof['bf16_tflops']:.0f} "
      f"TFLOP/s\n")

by_section = defaultdict(list)
for r in data["records"]:
    by_section[r["section"]].append(r)

for section, records in by_section.items():
    batches = sorted({r["batch"] for r in records})
    print(f"### {section}: time in µs (% of the roofline floor, its bound)\n")
    print("| " + " | ".join(["op", "impl"] + [f"b{b}" for b in batches]) + " |")
    print("|" + " --- |" * (2 + len(batches)))
    rows = defaultdict(dict)
    order = []
    for r in records:
        key = (r["name"], r["impl"])
        if key not in rows:
            order.append(key)
        rows[key][r["batch"]] = r
    for key in order:
        cells = []
        for b in batches:
            r = rows[key].get(b)
            if r is None:
                cells.append("–")
                continue
            pct = 100 * r["floor_ms"] / r["ms"]
            bound = "HBM" if r["bound"] == "HBM" else "TC"
            cells.append(f"{r['ms'] * 1e3:.1f} ({pct:.0f}% {bound})")
        print(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    print()
