#!/usr/bin/env python3
"""How strongly does a golden fixture's dense comparison see a semantic error? (docs/GOLDEN.md,
"Dense-only fixtures at full strength".) Reruns HF on a committed fixture with one deliberate
error at a time and prints, per error, the largest logit change over the fixture tolerance
(1e-3 max|logit|): an engine making that error would miss the fixture by about as much.

  python scripts/golden/sensitivity.py CFG --hf-src DIR

Errors: every attention sink zeroed; the MoE selection pinned to two experts per layer the way
golden_configs.ROUTING_PIN_BIAS pins it (what an engine ignoring the per-token choice would
compute, up to which two experts); the gate temperature ignored (set to 1).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as g  # noqa: E402
from golden_configs import ROUTING_PIN_BIAS  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--golden", type=Path, default=Path(__file__).resolve().parents[2] / "tests/data/golden")
    ap.add_argument("--hf-src", type=Path, required=True)
    a = ap.parse_args()
    fx = g.load_fixture(a.golden / a.config, a.hf_src, None)
    base = fx.run_hf()
    tol = 1e-3 * max(float(x.abs().max()) for x in base)
    params = dict(fx.hf_model.named_parameters())

    def change_over_tol(edit):
        saved = {n: p.detach().clone() for n, p in params.items()}
        with torch.no_grad():
            edit()
            moved = fx.run_hf()
            for n, p in params.items():
                p.copy_(saved[n])
        return max(float((x - y).abs().max()) for x, y in zip(moved, base)) / tol

    def zero_sinks():
        for n, p in params.items():
            if n.endswith("attn_sink"):
                p.zero_()

    def pin_routing():
        top_k = fx.hf_model.config.num_experts_per_tok
        for n, p in params.items():
            if n.endswith("gate.bias"):
                layer = int(n.split(".layers.")[1].split(".")[0])
                for j in range(top_k):
                    p[(top_k * layer + j) % p.numel()] += ROUTING_PIN_BIAS

    report = dict(tol=tol, attn_sinks_zeroed=change_over_tol(zero_sinks), routing_pinned=change_over_tol(pin_routing))
    routers = [m for m in fx.hf_model.modules() if getattr(m, "gate_temp", 1.0) != 1.0]
    if routers:
        temp = routers[0].gate_temp

        def ignore_temp():
            for m in routers:
                m.gate_temp = 1.0

        report["gate_temp_ignored"] = change_over_tol(ignore_temp)
        for m in routers:
            m.gate_temp = temp
    print(a.config, json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
