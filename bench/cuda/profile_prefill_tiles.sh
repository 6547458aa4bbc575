#!/usr/bin/env bash
# Nsight Compute on the FP8 prefill tiles (the grouped MoE tile, the dense FP8 tile and, with
# batch invariance off, the MoE wgmma tiles), one profile per launch configuration, while
# cuda_layer_bench runs them at its sizes (LAYER_BENCH_ONLY / LAYER_BENCH_MOE_BATCHES narrow it,
# e.g. LAYER_BENCH_ONLY=moe LAYER_BENCH_MOE_BATCHES=8192). On the GPU
# machine, from what scripts/cuda/stage_device_build.sh staged (BIN):
#   BIN=$PWD/build-perf/device OUT=... bench/cuda/profile_prefill_tiles.sh
# Output: $OUT/ncu_prefill_tiles.txt (ncu's "detailed" sections per profiled launch).
set -uo pipefail
LAYER_BENCH_SKIP_FMA=1 LAYER_BENCH_FP8_BEFORE=0 "$(dirname "$0")/ncu_profile.sh" prefill_tiles \
  "prefill_tile_kernel.*(GroupedArgs|DenseArgs)|prefill_wgmma_kernel" cuda_layer_bench \
  /tmp/layer_bench_under_ncu.json
