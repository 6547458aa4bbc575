"""bench/cuda/trace_report.py on a hand-written cuda_model_bench JSON: kernel names shortened
(C++ signatures with anonymous namespaces, template arguments holding parentheses and nested
templates; cuBLASLt's plain names kept), kernels ordered by total time, shares of the step, the
--case filter, and clear failures for a bad filter or no matching case."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "cuda" / "trace_report.py"
_spec = importlib.util.spec_from_file_location("trace_report", SCRIPT)
trace_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trace_report)


@pytest.mark.parametrize(
    "name, short",
    [
        ("void deepinfer::ops::cuda::(anonymous namespace)::split_tile_kernel<1>"
         "(deepinfer::ops::cuda::(anonymous namespace)::DenseArgs)", "split_tile_kernel<1>"),
        ("void deepinfer::ops::cuda::(anonymous namespace)::quantize_rows_kernel"
         "<(deepinfer::ops::cuda::CodeLayout)0>(deepinfer::cuda::DeviceRows<float const>, "
         "unsigned char*, unsigned char*, long)",
         "quantize_rows_kernel<(deepinfer::ops::cuda::CodeLayout)0>"),
        ("deepinfer::ops::cuda::(anonymous namespace)::rope_kernel(deepinfer::cuda::DeviceRows"
         "<float>, long, long, int, int const*, float const*, bool)", "rope_kernel"),
        ("void ns::outer<ns::Shape<2, 4> >(ns::Args)", "outer<ns::Shape<2, 4> >"),
        ("nvjet_sm90_tss_320x128_64x3_1x2_h_bz_coopB_TNT", "nvjet_sm90_tss_320x128_64x3_1x2_h_bz_coopB_TNT"),
    ],
)
def test_short_names(name: str, short: str) -> None:
    assert trace_report.short_name(name) == short


def bench_json(tmp_path: Path) -> Path:
    trace = {
        "span_us": 2500.0, "gpu_busy_us": 2000.0, "gpu_idle_us": 500.0,
        "kernels": [
            {"name": "void a::small_kernel(int)", "count": 4, "total_us": 100.0},
            {"name": "void a::big_kernel<3>(int)", "count": 10, "total_us": 1000.0},
            {"name": "nvjet_gemm", "count": 1, "total_us": 400.0},
        ],
    }
    data = {"decode": [
        {"batch": 1, "context": 4096, "status": "ok", "step_ms": 2.0, "trace": trace},
        {"batch": 256, "context": 32768, "status": "ok", "step_ms": 20.0},
        {"batch": 16, "context": 4096, "status": "failed: out of memory", "step_ms": 0.0},
    ]}
    path = tmp_path / "model_bench.json"
    path.write_text(json.dumps(data))
    return path


def test_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert trace_report.main([str(bench_json(tmp_path)), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert ("decode b1 ctx 4096: 2.00 ms a step; trace span 2.50 ms, GPU busy 2.00, idle 0.50"
            in out)
    rows = [line for line in out.splitlines() if line.startswith("| `")]
    # Largest total first, --top 2 of 3; share = total / step (2000 us).
    assert rows == ["| `big_kernel<3>` | 10 | 1000 | 100.0 | 50.0% |",
                    "| `nvjet_gemm` | 1 | 400 | 400.0 | 20.0% |"]
    assert "decode b256 ctx 32768: 20.00 ms a step (no trace)" in out
    assert "b16" not in out  # a failed case has no step time to report


def test_case_filter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = bench_json(tmp_path)
    assert trace_report.main([str(path), "--case", "256x32768"]) == 0
    out = capsys.readouterr().out
    assert "b256" in out and "b1 " not in out
    assert trace_report.main([str(path), "--case", "2x3"]) == 1
    assert "no decode case" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        trace_report.main([str(path), "--case", "256-32768"])
    assert "is not BATCHxCONTEXT" in capsys.readouterr().err
