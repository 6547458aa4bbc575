# Sourced by the scripts that run on the GPU machine (the device tool's `run`, repo root as
# working directory) over the programs scripts/cuda/stage_device_build.sh staged: sets OUT
# (./device-out unless given; created) and BIN (build-cuda/device unless given), puts the CUDA
# runtime and libraries staged in BIN on the library path, and links the checkout path the
# model tests were compiled with to this checkout (they read tests/data through it).
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
BIN=${BIN:-$PWD/build-cuda/device}
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
if [ -f "$BIN/compiled_source_dir" ]; then
  compiled=$(cat "$BIN/compiled_source_dir")
  if [ "$compiled" != "$PWD" ] && [ ! -e "$compiled" ]; then
    mkdir -p "$(dirname "$compiled")" && ln -s "$PWD" "$compiled"
  fi
fi

# check NAME SECONDS COMMAND...: runs COMMAND into $OUT/NAME.log with a time limit, adds a line
# to $OUT/summary.txt, and sets failed=1 unless it exited 0.
check() {
  local name=$1 seconds=$2
  shift 2
  timeout "$seconds" "$@" >"$OUT/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status, $(grep -c 'Failure' "$OUT/$name.log") failed assertions" |
    tee -a "$OUT/summary.txt"
  [ "$status" = 0 ] || failed=1
}
