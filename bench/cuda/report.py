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

# One layer's GEMMs per batch: the floor (each role once: its storage bytes over HBM read, its
# FLOPs over the dtype's peak, the larger), the fastest measured implementation of each role, and
# the same with only our kernels where they exist. Routed experts: the grouped kernel's floor.
print("### one layer's GEMMs (all dense roles + routed experts), µs\n")
print("| batch | floor | fastest of all (x floor) | cuBLASLt dense + our grouped MoE (x floor) "
      "| the model's ops: our linear + moe_experts (x floor) |")
print("| --- | --- | --- | --- | --- |")
batches = sorted({r["batch"] for r in data["records"]})
for b in batches:
    roles = defaultdict(list)
    model_op = None
    for r in data["records"]:
        if r["batch"] != b:
            continue
        if r["section"] == "moe" and r["name"] == "routed total":
            continue
        if r["name"] == "routed moe_experts op":  # the whole op, compared below
            model_op = r
            continue
        roles[r["name"]].append(r)
    floor = fastest = mixed = 0.0
    # The model's path: ops::cuda::linear for every dense role, then the whole moe_experts op.
    model = model_op["ms"] if model_op else float("nan")
    for name, rs in roles.items():
        ours = [r for r in rs if r["impl"].startswith("ours")]
        floor += min(r["floor_ms"] for r in ours) if ours else min(r["floor_ms"] for r in rs)
        fastest += min(r["ms"] for r in rs)
        pick = [r for r in rs if ("cuBLASLt" in r["impl"] and "loop" not in r["impl"])
                or r["impl"] == "ours grouped"]
        mixed += min(r["ms"] for r in pick) if pick else min(r["ms"] for r in rs)
        model += sum(r["ms"] for r in rs if r["impl"].startswith("ours (linear"))
    print(f"| {b} | {floor * 1e3:.1f} | {fastest * 1e3:.1f} ({fastest / floor:.2f}x) | "
          f"{mixed * 1e3:.1f} ({mixed / floor:.2f}x) | {model * 1e3:.1f} ({model / floor:.2f}x) |")
