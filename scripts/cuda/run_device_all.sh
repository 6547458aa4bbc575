#!/usr/bin/env bash
# One device call for everything GPU: every GPU test (scripts/cuda/run_device_tests.sh), then the
# benchmarks that were staged next to them (cuda_layer_bench, cuda_attention_bench,
# cuda_model_bench). Here:
#   BUILD_DIR=build-perf EXTRA_TARGETS="cuda_layer_bench cuda_model_bench cuda_attention_bench" \
#     EXTRA_PROGRAMS="build-perf/bench/cuda/cuda_layer_bench ..." scripts/cuda/stage_device_build.sh
# then the device tool's `run` (carry: ["build-perf/device"]) of
#   BIN=$PWD/build-perf/device scripts/cuda/run_device_all.sh
# The device tool returns at most 8 files: the logs go to $OUT/logs and come back packed as
# $OUT/logs.tgz, with the benchmarks' JSON beside it. SKIP_TESTS=1 / SKIP_BENCH=1 run one half;
# the model bench runs twice, the second time with DEEPINFER_BATCH_INVARIANT=0
# (model_bench_variant.json; SKIP_VARIANT_BENCH=1 skips it, VARIANT_BENCH_ARGS its arguments).
set -uo pipefail
OUT=${OUT:-$PWD/device-out}
BIN=${BIN:-$PWD/build-perf/device}
LOGS=$OUT/logs
mkdir -p "$LOGS"
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # The kernel tests' sanitizer runs come after the benchmarks (the longest, least urgent part).
  KERNEL_SANITIZERS=0 OUT=$LOGS BIN=$BIN "$(dirname "$0")/run_device_tests.sh" || status=1
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  lt=$(find /usr/local/cuda*/ /opt -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
  export LD_LIBRARY_PATH=$BIN:$(dirname "${lt:-/nonexistent/x}"):${LD_LIBRARY_PATH:-}
  if [ -x "$BIN/cuda_layer_bench" ]; then
    echo "== cuda_layer_bench"
    timeout ${LAYER_BENCH_TIMEOUT:-120} "$BIN/cuda_layer_bench" "$OUT/layer_bench.json" \
      >"$LOGS/layer_bench.txt" 2>&1 || status=1
    grep -E "^(roofline|moe batch)" "$LOGS/layer_bench.txt" | cut -c1-140
  fi
  if [ -x "$BIN/cuda_attention_bench" ]; then
    echo "== cuda_attention_bench"
    timeout ${ATTENTION_BENCH_TIMEOUT:-60} "$BIN/cuda_attention_bench" "$OUT/attention_bench.json" \
      >"$LOGS/attention_bench.txt" 2>&1 || status=1
    tail -n 20 "$LOGS/attention_bench.txt"
  fi
  if [ -x "$BIN/cuda_model_bench" ]; then
    # The prefill roofline uses the FP8 peak cuda_layer_bench measured in this run.
    peak=$(grep -o '"fp8_tflops": [0-9.]*' "$OUT/layer_bench.json" 2>/dev/null | awk '{print $2}')
    FP8_PEAK_TFLOPS=${peak:-} OUT=$LOGS BIN=$BIN "$(dirname "$0")/../../bench/cuda/run_model_bench.sh" \
      ${MODEL_BENCH_ARGS:-} >/dev/null 2>&1 || status=1
    cp "$LOGS/model_bench.json" "$OUT/" 2>/dev/null
    grep -vE "^\[" "$LOGS/model_bench.txt" | tail -n 60
    # The same cases with batch invariance off (large GEMMs on the kernels chosen by rows).
    if [ "${SKIP_VARIANT_BENCH:-0}" != 1 ]; then
      mkdir -p "$LOGS/variant"
      DEEPINFER_BATCH_INVARIANT=0 FP8_PEAK_TFLOPS=${peak:-} OUT=$LOGS/variant BIN=$BIN \
        "$(dirname "$0")/../../bench/cuda/run_model_bench.sh" ${VARIANT_BENCH_ARGS:-${MODEL_BENCH_ARGS:-}} \
        >/dev/null 2>&1 || status=1
      cp "$LOGS/variant/model_bench.json" "$OUT/model_bench_variant.json" 2>/dev/null
      echo "== cuda_model_bench, DEEPINFER_BATCH_INVARIANT=0"
      grep -vE "^\[" "$LOGS/variant/model_bench.txt" | tail -n 30
    fi
  fi
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  KERNEL_SANITIZERS=only OUT=$LOGS BIN=$BIN "$(dirname "$0")/run_device_tests.sh" || status=1
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
echo "== run_device_all.sh exit status $status"
exit $status
