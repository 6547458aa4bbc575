#!/usr/bin/env bash
# Nsight Compute, one "detailed" profile per launch configuration of the kernels whose demangled
# name matches KERNEL_REGEX, while a program staged by scripts/cuda/stage_device_build.sh (in
# BIN) runs. On the GPU machine:
#   BIN=$PWD/build-perf/device OUT=... bench/cuda/ncu_profile.sh NAME KERNEL_REGEX PROGRAM [ARGS...]
# Output: $OUT/ncu_NAME.txt. NCU_TIMEOUT (seconds, default 200) bounds the run; environment
# variables the program reads pass through. The presets: profile_prefill_tiles.sh,
# profile_decode_small.sh.
set -uo pipefail
name=${1:?usage: ncu_profile.sh NAME KERNEL_REGEX PROGRAM [ARGS...]}
kernels=${2:?usage: ncu_profile.sh NAME KERNEL_REGEX PROGRAM [ARGS...]}
program=${3:?usage: ncu_profile.sh NAME KERNEL_REGEX PROGRAM [ARGS...]}
shift 3
BIN=${BIN:-$PWD/build-perf/device}
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || find /usr/local/cuda/bin /opt/nvidia/nsight-compute -name ncu -type f 2>/dev/null | head -1)
echo "ncu: $NCU ($($NCU --version | tail -1))"
timeout "${NCU_TIMEOUT:-200}" "$NCU" --kernel-name-base demangled --kernel-name "regex:$kernels" \
  --filter-mode per-launch-config --launch-count 1 --set detailed \
  "$BIN/$program" "$@" >"$OUT/ncu_$name.txt" 2>&1
echo "ncu exit status $?; profiled launches: $(grep -cE '^  [A-Za-z_].*\(' "$OUT/ncu_$name.txt")"
