"""The top kernels of each decode case in cuda_model_bench's JSON (its CUPTI `trace`), as the
Markdown tables of docs/BENCHMARKS.md: a case's step time, the trace's span, busy and idle GPU
time, then its most expensive kernels with their calls, total and per-call time and share of the
step.

  python3 bench/cuda/trace_report.py model_bench.json [--top N] [--case BATCHxCONTEXT ...]
"""
import argparse
import json
import sys

def short_name(name):
    """"void ns::(anonymous namespace)::name<args>(params)" -> "name<args>" (args as written);
    names that are not C++ signatures (cuBLASLt's "nvjet_..." kernels) as they are."""
    angle = paren = 0
    params = -1
    for i, ch in enumerate(name):
        if ch == "<":
            angle += 1
        elif ch == ">":
            angle -= 1
        elif ch == "(" and angle == 0:
            # "(anonymous namespace)" is part of the qualified name, not the parameter list.
            if name.startswith("(anonymous namespace)", i):
                continue
            params = i
            break
    if params < 0:
        return name
    qualified = name[:params]
    # The unqualified name starts after the last "::" or space outside template arguments.
    angle = 0
    start = 0
    for i, ch in enumerate(qualified):
        if ch == "<":
            angle += 1
        elif ch == ">":
            angle -= 1
        elif angle == 0 and (ch == " " or qualified.startswith("::", i)):
            start = i + (2 if ch == ":" else 1)
    return qualified[start:]


def case_table(case, top):
    trace = case.get("trace")
    title = f"decode b{case['batch']} ctx {case['context']}: {case['step_ms']:.2f} ms a step"
    if not trace:
        return f"{title} (no trace)\n"
    lines = [
        f"{title}; trace span {trace['span_us'] / 1000:.2f} ms, GPU busy "
        f"{trace['gpu_busy_us'] / 1000:.2f}, idle {trace['gpu_idle_us'] / 1000:.2f}",
        "",
        "| kernel | calls | us | us a call | share of the step |",
        "| --- | --- | --- | --- | --- |",
    ]
    step_us = case["step_ms"] * 1000
    kernels = sorted(trace["kernels"], key=lambda k: -k["total_us"])[:top]
    for k in kernels:
        lines.append(f"| `{short_name(k['name'])}` | {k['count']} | {k['total_us']:.0f} | "
                     f"{k['total_us'] / k['count']:.1f} | {100 * k['total_us'] / step_us:.1f}% |")
    return "\n".join(lines) + "\n"


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--case", action="append", default=[],
                        help="BATCHxCONTEXT, e.g. 256x32768 (default: every decode case)")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        data = json.load(f)
    wanted = set()
    for text in args.case:
        try:
            batch, context = (int(part) for part in text.split("x"))
        except ValueError:
            parser.error(f"--case {text!r} is not BATCHxCONTEXT")
        wanted.add((batch, context))
    cases = [c for c in data.get("decode", [])
             if c.get("status") == "ok" and (not wanted or (c["batch"], c["context"]) in wanted)]
    if not cases:
        print("no decode case with a step time matches", file=sys.stderr)
        return 1
    print("\n".join(case_table(c, args.top) for c in cases))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
