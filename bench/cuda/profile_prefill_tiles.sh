#!/usr/bin/env bash
# Nsight Compute on the FP8 prefill tiles (the grouped MoE tile, the dense FP8 tile and, with
# batch invariance off, the MoE wgmma tiles), one profile per launch configuration, while
# cuda_layer_bench runs them at its sizes (LAYER_BENCH_ONLY / LAYER_BENCH_MOE_BATCHES narrow it,
# e.g. LAYER_BENCH_ONLY=moe LAYER_BENCH_MOE_BATCHES=8192). On the GPU
# machine, from what scripts/cuda/stage_device_build.sh staged (BIN):
#   BIN=$PWD/build-perf/device OUT=... bench/cuda/profile_prefill_tiles.sh
# Output: $OUT/ncu_prefill_tiles.txt (ncu's "detailed" sections per profiled launch).
set -uo pipefail
BIN=${BIN:-$PWD/build-perf/device}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU ($($NCU --version | tail -1))"
LAYER_BENCH_SKIP_FMA=1 LAYER_BENCH_FP8_BEFORE=0 timeout "${NCU_TIMEOUT:-200}" "$NCU" \
  --kernel-name-base demangled --kernel-name "regex:prefill_tile_kernel.*(GroupedArgs|DenseArgs)|prefill_wgmma_kernel" \
  --filter-mode per-launch-config --launch-count 1 --set detailed \
  "$BIN/cuda_layer_bench" /tmp/layer_bench_under_ncu.json >"$OUT/ncu_prefill_tiles.txt" 2>&1
echo "ncu exit status $?; profiled launches: $(grep -cE '^  .*prefill_(tile|wgmma)_kernel' "$OUT/ncu_prefill_tiles.txt")"
