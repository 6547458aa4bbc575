#!/usr/bin/env bash
# Builds deepinfer and runs its main job on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh
BUILD_DIR=build ./scripts/build.sh
./build/deepinfer info
