#!/usr/bin/env python3
"""Layer-by-layer comparison of the engine with the golden oracles (docs/GOLDEN.md, "Diagnosis").

Dumps every decoder layer's output hc streams of a committed fixture from an oracle, through the
same path the generator uses (HF: one-shot prefill through its cache; reference: fp32act), and
compares them with the engine's (`deepinfer forward --mode prefill --dump-layers FILE`):

  deepinfer forward --model tests/data/golden/CFG/hf --tokens tests/data/golden/CFG/tokens.txt \\
      --engram-token-map tests/data/golden/CFG/engram_token_map.json --out /tmp/l.st --dump-layers /tmp/ours.st
  python scripts/golden/dump_layers.py CFG --oracle hf --hf-src DIR --ref-src DIR --ours /tmp/ours.st

Prints, per layer, max |ours - oracle| over all positions and the first position beyond 1e-4.
--save FILE keeps the oracle's dump (`layerN` [tokens, hc * hidden], `logits`).
"""

import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import generate as g  # noqa: E402


def oracle_dump(fixture: Path, oracle: str, hf_src: Path, ref_src: Path):
    fx = g.load_fixture(fixture, hf_src, ref_src if oracle != "hf" else None)
    dumps = {}

    def keep(layer, streams):
        dumps.setdefault(layer, []).append(streams[0].float().flatten(1).clone())

    if oracle == "hf":
        for i, layer in enumerate(fx.hf_model.model.layers):
            layer.register_forward_hook(lambda mod, inp, out, i=i: keep(i, out[0]))
        logits = fx.run_hf()
    else:
        block_forward = fx.ref_model.Block.forward

        def hooked(self, x, *a, **k):
            out = block_forward(self, x, *a, **k)
            keep(self.layer_id, out[0])
            return out

        fx.ref_model.Block.forward = hooked
        try:
            logits = fx.run_reference(oracle)
        finally:
            fx.ref_model.Block.forward = block_forward
    out = {"logits": torch.cat(logits).contiguous()}
    for i, parts in dumps.items():
        out[f"layer{i}"] = torch.cat(parts).contiguous()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--oracle", choices=("hf", "fp32act", "bf16"), default="hf")
    ap.add_argument("--golden", type=Path, default=Path(__file__).resolve().parents[2] / "tests/data/golden")
    ap.add_argument("--hf-src", type=Path, required=True)
    ap.add_argument("--ref-src", type=Path)
    ap.add_argument("--ours", type=Path, help="the engine's --dump-layers file")
    ap.add_argument("--save", type=Path)
    a = ap.parse_args()
    dump = oracle_dump(a.golden / a.config, a.oracle, a.hf_src, a.ref_src)
    if a.save:
        save_file(dump, str(a.save))
    if a.ours:
        ours = load_file(str(a.ours))
        for i in range(len(dump) - 1):
            diff = (ours[f"layer{i}"] - dump[f"layer{i}"]).abs().amax(dim=1)
            bad = (diff > 1e-4).nonzero().flatten()
            first = int(bad[0]) if len(bad) else -1
            print(f"layer {i}: max |ours - {a.oracle}| {float(diff.max()):.3g}, rows > 1e-4: {len(bad)}, first row {first}")


if __name__ == "__main__":
    main()
