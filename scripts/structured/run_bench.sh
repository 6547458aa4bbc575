#!/usr/bin/env bash
# Builds and runs the structured-output benchmark next to xgrammar on this machine, alternating
# the two engines for ROUNDS rounds (each replays every schema's token sequence REPS times), then
# prints the medians over the rounds as a markdown table with ours/xgrammar ratios. Alternating
# keeps a loaded (shared) machine's slow periods from favouring one side.
# xgrammar needs torch + transformers; set XGRAMMAR_PYTHON to an interpreter that has them
# (default: python3). Usage: [ROUNDS=5] [REPS=5] scripts/structured/run_bench.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${1:-build-bench}
ROUNDS=${ROUNDS:-5}
REPS=${REPS:-5}
SHARED=${DEEPINFER_SHARED_DIR:-$PWD/../shared}
# An existing build directory is used as configured (it needs -DDEEPINFER_BUILD_BENCH=ON).
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_BUILD_BENCH=ON \
    -DDEEPINFER_BUILD_TESTS=OFF -DDEEPINFER_SHARED_DIR="$SHARED" >/dev/null
fi
cmake --build "$BUILD_DIR" --target structured_bench -j2
OUT="$BUILD_DIR/structured_bench_results"
rm -rf "$OUT" && mkdir -p "$OUT"
echo "== CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round: deepinfer"
  "$BUILD_DIR/bench/structured/structured_bench" bench/structured/schemas.json \
    "$OUT/token_sequences.json" "$REPS" "$OUT/ours_$round.json"
  echo "== round $round: xgrammar"
  "${XGRAMMAR_PYTHON:-python3}" bench/structured/xgrammar_bench.py bench/structured/schemas.json \
    "$OUT/token_sequences.json" "$SHARED/data/tokenizers/deepseek_v3" "$REPS" "$OUT/xgrammar_$round.json"
done
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 scripts/structured/summarize_bench.py "$OUT"
