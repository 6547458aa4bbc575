#!/usr/bin/env bash
# Configures and builds deepinfer into BUILD_DIR (default build/); extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
cmake --build "$BUILD_DIR" --parallel "$(nproc)" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
