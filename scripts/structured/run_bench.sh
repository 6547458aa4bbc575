#!/usr/bin/env bash
# Builds and runs the structured-output benchmark next to xgrammar on this machine.
# xgrammar needs torch + transformers; set XGRAMMAR_PYTHON to an interpreter that has them
# (default: python3). Usage: scripts/structured/run_bench.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${1:-build-bench}
SHARED=${DEEPINFER_SHARED_DIR:-$PWD/../shared}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_BUILD_BENCH=ON -DDEEPINFER_BUILD_TESTS=OFF \
  -DDEEPINFER_SHARED_DIR="$SHARED" >/dev/null
cmake --build "$BUILD_DIR" --target structured_bench -j2
echo "== deepinfer (CPU: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
"$BUILD_DIR/bench/structured/structured_bench" bench/structured/schemas.json "$BUILD_DIR/structured_token_sequences.json"
echo "== xgrammar"
"${XGRAMMAR_PYTHON:-python3}" bench/structured/xgrammar_bench.py bench/structured/schemas.json \
  "$BUILD_DIR/structured_token_sequences.json" "$SHARED/data/tokenizers/deepseek_v3"
