#!/usr/bin/env bash
# Nsight Compute on a b1 decode step's small kernels (the hc Sinkhorn finish, attention's chunk
# and combine kernels, the register rmsnorm), one profile per launch configuration, while
# cuda_model_bench runs a 3-layer model (layers 0-2 of the release: a dense, an engram and an
# indexer layer) at batch 1, 4k context. Their CUPTI times (9.5, 14.8, 4.2, 5.5 us a call on the
# H100, docs/BENCHMARKS.md) are well above their bytes' time; this says what they wait on. On the
# GPU machine, from what scripts/cuda/stage_device_build.sh staged with the model bench (BIN):
#   BIN=$PWD/build-perf/device OUT=... bench/cuda/profile_decode_small.sh
# KERNELS (an ncu regex) picks other kernels. Output: $OUT/ncu_decode_small.txt.
set -uo pipefail
BIN=${BIN:-$PWD/build-perf/device}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU ($($NCU --version | tail -1))"
KERNELS=${KERNELS:-hc_mix_finish|sink_attention_mma_chunk|sink_attention_combine|rmsnorm_registers_kernel}
timeout "${NCU_TIMEOUT:-120}" "$NCU" --kernel-name-base demangled --kernel-name "regex:$KERNELS" \
  --filter-mode per-launch-config --launch-count 1 --set detailed \
  "$BIN/cuda_model_bench" --layers 3 --mix first --batches 1 --contexts 4096 --prefill-tokens 0 \
  --time-budget-s 1 --no-trace >"$OUT/ncu_decode_small.txt" 2>&1
echo "ncu exit status $?; profiled launches: $(grep -cE '^  [a-z_].*\(' "$OUT/ncu_decode_small.txt")"
