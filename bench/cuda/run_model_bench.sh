#!/usr/bin/env bash
# Runs the whole-model benchmark on the GPU machine (the device tool's `run`, repo root as the
# working directory) from what bench/cuda/stage.sh staged in build-perf/device/. Output in $OUT
# (./device-out by hand): model_bench.txt (progress lines, tables) and model_bench.json.
#
# The FP8 peak for the prefill roofline: $FP8_PEAK_TFLOPS, else the figure cuda_layer_bench
# measured into $OUT/layer_bench.json earlier in the same run, else the program's default
# (docs/BENCHMARKS.md's 1448). Extra arguments go to the program (e.g. --mix first --layers 4).
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
BIN=${BIN:-$PWD/build-perf/device}
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
peak=${FP8_PEAK_TFLOPS:-}
if [ -z "$peak" ] && [ -f "$OUT/layer_bench.json" ]; then
  peak=$(grep -o '"fp8_tflops": [0-9.]*' "$OUT/layer_bench.json" | head -1 | awk '{print $2}')
fi
echo "== cuda_model_bench (FP8 peak: ${peak:-program default})"
timeout "${MODEL_BENCH_TIMEOUT:-120}" "$BIN/cuda_model_bench" --json "$OUT/model_bench.json" \
  ${peak:+--fp8-peak-tflops "$peak"} "$@" 2>&1 | tee "$OUT/model_bench.txt"
status=${PIPESTATUS[0]}
echo "== cuda_model_bench exit status $status (0: every case ran with finite logits)"
exit "$status"
