#!/usr/bin/env python3
"""Is a golden fixture a well-posed pass/fail target? (docs/GOLDEN.md, "Well-posed released
comparison".) Reruns one oracle on a committed fixture under QuantizerPerturbation (every
quantizer input times 1 +- REL, random sign per element), twice with its top-k selections free
and twice with them replayed from the unperturbed run, and prints:

  drift_over_tol         largest logit change / tolerance (1e-3 max|logit|), selections free
  frozen_drift_over_tol  the same with every MoE / indexer / candidate selection frozen
  changed_selections     per site, selections that picked another set under the perturbation
  min_margin             per site, the smallest gap between the k-th and (k+1)-th value

  python scripts/golden/stability.py CFG --oracle fp32act --hf-src DIR --ref-src DIR [--rel 2**-23]

Experiments on a fixture in memory, without regenerating: --pin-experts B adds B to the selection
bias of two experts per layer (both oracles); --branch-gain G scales every wo_b and w2 through
its ue8m0 scale (the released tensors, so the fp32act oracle only).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as g  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--oracle", choices=("hf", "fp32act"), default="fp32act")
    ap.add_argument("--golden", type=Path, default=Path(__file__).resolve().parents[2] / "tests/data/golden")
    ap.add_argument("--hf-src", type=Path, required=True)
    ap.add_argument("--ref-src", type=Path, required=True)
    ap.add_argument("--rel", type=float, default=g.QuantizerPerturbation.REL)
    ap.add_argument("--pin-experts", type=float, default=0.0)
    ap.add_argument("--branch-gain", type=float, default=1.0, help="experiment: scale wo_b and every w2, a power of two (fp32act only)")
    a = ap.parse_args()
    fx = g.load_fixture(a.golden / a.config, a.hf_src, a.ref_src)
    if a.pin_experts:
        for name, t in fx.tensors.items():
            if name.endswith("gate.bias"):
                layer = int(name.split(".")[1])
                t.zero_()
                t[(2 * layer) % t.numel()] += a.pin_experts
                t[(2 * layer + 1) % t.numel()] += a.pin_experts
        fx.load_into_hf()
    if a.branch_gain != 1.0:
        for name, t in fx.tensors.items():
            if name.endswith(("wo_b.scale", "w2.scale")):
                fx.tensors[name] = (t.float() * a.branch_gain).to(t.dtype)
    run = fx.run_hf if a.oracle == "hf" else fx.run_fp32act
    with g.TopkTieDetector(record=True) as det:
        base = run()
    report = dict(det.summary(), **g.perturbation_drift(run, base, fx.mdl_mod, fx.ref_model, det.recording, rel=a.rel))
    print(a.config, a.oracle, json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
