#!/usr/bin/env python3
"""Compare our logits against a golden fixture with the issue's tolerance rule.

  python scripts/golden/compare_logits.py OURS.safetensors tests/data/golden/<cfg>/logits_hf.safetensors

Both files hold `logits` F32 [total_tokens, vocab] (rows of all requests, request after request)
and `cu_seqlens` I64 [requests + 1]; a file may instead hold one `logits.<i>` tensor per request.

Rule (issue 5): with tol = 1e-3 * max|ref|, every |ours - ref| <= tol, and at every position whose
reference top-two margin exceeds tol the argmax of ours equals the reference argmax.
Exit status 0 when the rule holds, 1 otherwise. Needs only numpy and safetensors.
"""

import argparse
import sys

import numpy as np
from safetensors.numpy import load_file


def load_rows(path):
    t = load_file(path)
    if "logits" in t:
        logits = t["logits"].astype(np.float32)
        cu = t.get("cu_seqlens")
        cu = [0, logits.shape[0]] if cu is None else [int(c) for c in cu]
        return logits, cu
    keys = sorted((k for k in t if k.startswith("logits.")), key=lambda k: int(k.split(".")[1]))
    if not keys:
        sys.exit(f"{path}: no 'logits' tensor (nor 'logits.<i>' tensors)")
    parts = [t[k].astype(np.float32) for k in keys]
    cu = np.cumsum([0] + [p.shape[0] for p in parts]).tolist()
    return np.concatenate(parts), cu


def compare(ours, ref, rel=1e-3):
    """Returns (ok, report dict)."""
    if ours.shape != ref.shape:
        return False, {"error": f"shape {ours.shape} != reference {ref.shape}"}
    if not np.isfinite(ours).all():
        return False, {"error": "non-finite values in ours"}
    tol = rel * float(np.abs(ref).max())
    err = np.abs(ours - ref)
    top2 = np.sort(ref, axis=-1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    decisive = margin > tol
    argmax_bad = decisive & (ours.argmax(-1) != ref.argmax(-1))
    report = {
        "tolerance": tol,
        "max_abs_err": float(err.max()),
        "worst_row": int(err.max(-1).argmax()),
        "decisive_rows": int(decisive.sum()),
        "argmax_mismatches": int(argmax_bad.sum()),
        "first_argmax_mismatch_row": int(np.flatnonzero(argmax_bad)[0]) if argmax_bad.any() else None,
    }
    return bool(err.max() <= tol and not argmax_bad.any()), report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ours")
    ap.add_argument("reference")
    ap.add_argument("--rel", type=float, default=1e-3, help="tolerance relative to max|ref| (default 1e-3)")
    a = ap.parse_args()
    ours, cu_o = load_rows(a.ours)
    ref, cu_r = load_rows(a.reference)
    if cu_o != cu_r:
        print(f"FAIL: request boundaries differ: ours {cu_o} vs reference {cu_r}")
        return 1
    ok, report = compare(ours, ref, a.rel)
    print(("PASS" if ok else "FAIL") + ": " + ", ".join(f"{k}={v}" for k, v in report.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
