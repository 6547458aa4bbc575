"""The same V4.1-Flash layer GEMMs in PyTorch on the GPU (eager and torch.compile), for
docs/BENCHMARKS.md next to cuda_layer_bench. BF16 weights (PyTorch has no FP8 32x32
block-scaled or FP4 GEMM); random data.

  python3 bench/cuda/torch_layers.py        (run by bench/cuda/run_device_bench.sh)

- "dense chain": every dense linear of one layer in order (wq_a -> wq_b, wkv, grouped wo_a,
  wo_b, gate, shared expert w1|w3 -> SwiGLU -> w2, indexer wq_b, compressor wkv|wgate), with the
  attention itself left out (its output stands in as the wq_b result).
- "routed MoE": top-6 of 384 experts, a per-expert loop (eager; the loop's data-dependent shapes
  break torch.compile graphs, so only eager is timed).
"""
import json
import os
import statistics

import torch
import torch.nn.functional as F

HIDDEN, HEADS, HEAD_DIM, Q_LORA = 5120, 64, 512, 1280
O_GROUPS, O_LORA, EXPERTS, MOE_INTER, TOP_K = 8, 1024, 384, 2304, 6
INDEX_HEADS, INDEX_DIM = 32, 128
BATCHES = [1, 16, 64, 256, 8192]
dev = torch.device("cuda")
bf16 = torch.bfloat16


def weight(out, inp):
    return (torch.randn(out, inp, device=dev, dtype=bf16) * 0.02)


def time_ms(fn, min_ms=300):
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    first = max(start.elapsed_time(stop), 1e-3)
    inner = max(1, min(200, int(2.0 / first)))
    rounds = max(3, min(25, int(min_ms / (first * inner))))
    times = []
    for _ in range(rounds):
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / inner)
    return statistics.median(times)


W = {
    "wq_a": weight(Q_LORA, HIDDEN),
    "wq_b": weight(HEADS * HEAD_DIM, Q_LORA),
    "wkv": weight(HEAD_DIM, HIDDEN),
    "wo_a": weight(O_GROUPS * O_LORA, HEADS * HEAD_DIM // O_GROUPS).view(
        O_GROUPS, O_LORA, HEADS * HEAD_DIM // O_GROUPS),
    "wo_b": weight(HIDDEN, O_GROUPS * O_LORA),
    "gate": weight(EXPERTS, HIDDEN),
    "shared_w13": weight(2 * MOE_INTER, HIDDEN),
    "shared_w2": weight(HIDDEN, MOE_INTER),
    "index_wq_b": weight(INDEX_HEADS * INDEX_DIM, Q_LORA),
    "compressor": weight(2 * HEAD_DIM, HIDDEN),
}
dense_bytes = sum(w.numel() * 2 for w in W.values())


def dense_chain(x):
    qr = F.linear(x, W["wq_a"])
    q = F.linear(qr, W["wq_b"])
    kv = F.linear(x, W["wkv"])
    o = torch.einsum("mgi,goi->mgo", q.view(-1, O_GROUPS, HEADS * HEAD_DIM // O_GROUPS), W["wo_a"])
    y = F.linear(o.reshape(-1, O_GROUPS * O_LORA), W["wo_b"])
    logits = F.linear(x, W["gate"])
    gate_up = F.linear(x, W["shared_w13"])
    g, u = gate_up.chunk(2, dim=-1)
    shared = F.linear(F.silu(g) * u, W["shared_w2"])
    iq = F.linear(qr, W["index_wq_b"])
    comp = F.linear(x, W["compressor"])
    return y + shared, kv, logits, iq, comp


compiled_chain = torch.compile(dense_chain, dynamic=False)

w13 = torch.randn(EXPERTS, 2 * MOE_INTER, HIDDEN, device=dev, dtype=bf16) * 0.02
w2 = torch.randn(EXPERTS, HIDDEN, MOE_INTER, device=dev, dtype=bf16) * 0.02


def routed_moe(x, experts, counts):
    # x rows already grouped by expert (counts per expert, host list).
    outs, start = [], 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        h = F.linear(x[start:start + c], w13[e])
        g, u = h.chunk(2, dim=-1)
        outs.append(F.linear(F.silu(g) * u, w2[e]))
        start += c
    return torch.cat(outs)


records = []
print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; dense weights "
      f"{dense_bytes / 1e6:.0f} MB bf16")
for m in BATCHES:
    x = torch.randn(m, HIDDEN, device=dev, dtype=bf16)
    flops = 2 * m * dense_bytes / 2
    eager = time_ms(lambda: dense_chain(x))
    compiled = time_ms(lambda: compiled_chain(x))
    for impl, ms in (("eager", eager), ("torch.compile", compiled)):
        print(f"dense chain  {impl:14s} {m:5d} {ms:9.4f} ms {dense_bytes / ms * 1e-6:7.0f} GB/s "
              f"{flops / ms * 1e-9:7.1f} TFLOP/s")
        records.append({"part": "dense chain", "impl": impl, "batch": m, "ms": ms})
    gen = torch.Generator().manual_seed(m)
    routing = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(m)])
    counts = torch.bincount(routing.flatten(), minlength=EXPERTS).tolist()
    xr = torch.randn(m * TOP_K, HIDDEN, device=dev, dtype=bf16)
    ms = time_ms(lambda: routed_moe(xr, routing, counts))
    active = sum(c > 0 for c in counts)
    moe_bytes = active * 3 * MOE_INTER * HIDDEN * 2
    moe_flops = 2 * m * TOP_K * 3 * MOE_INTER * HIDDEN
    print(f"routed MoE   {'eager loop':14s} {m:5d} {ms:9.4f} ms {moe_bytes / ms * 1e-6:7.0f} GB/s "
          f"{moe_flops / ms * 1e-9:7.1f} TFLOP/s ({active} experts)")
    records.append({"part": "routed MoE", "impl": "eager loop", "batch": m, "ms": ms})

out = os.environ.get("OUT")
if out:
    with open(os.path.join(out, "torch_layers.json"), "w") as f:
        json.dump(records, f, indent=1)
