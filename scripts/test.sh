#!/usr/bin/env bash
# Installs dependencies, builds and runs every test: the suite (with the CUDA backend compiled in
# where nvcc exists), the Python tests, and the CPU suite under AddressSanitizer +
# UndefinedBehaviorSanitizer. GPU-only tests skip where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install_deps.sh

# Where nvcc exists the main build includes the CUDA backend: one build both compiles the CUDA
# sources (warnings as errors) and runs the whole suite; GPU-only tests skip without a GPU.
# A separate CUDA build would compile the whole C++ tree a third time.
CUDA_FLAGS=()
if command -v nvcc >/dev/null && [[ "${DEEPINFER_SKIP_CUDA_BUILD:-0}" != "1" ]]; then
  CUDA_FLAGS=(-DDEEPINFER_CUDA=ON)
fi

echo "== build (${CUDA_FLAGS[*]:-CPU only}) and tests"
# DEEPINFER_PYTHON: the Python tests below import the extension from this build (no second
# library build through pip); the interpreter is the one that runs pytest.
# DEEPINFER_UNITY_BUILD: a clean build's cost is mostly the same header-only library code
# (nlohmann/json, CLI11, GoogleTest) compiled again in every file; unity batches compile it once
# per batch (CMakeLists.txt).
BUILD_DIR=build ./scripts/build.sh "${CUDA_FLAGS[@]}" -DDEEPINFER_PYTHON=ON -DDEEPINFER_UNITY_BUILD=ON \
  -DPython_EXECUTABLE="$(python3 -c 'import sys; print(sys.executable)')"
ctest --test-dir build --output-on-failure --parallel "$(nproc)"

if compgen -G "tests/python/test_*.py" >/dev/null; then
  echo "== Python tests"
  DEEPINFER_BUILD_DIR="$PWD/build" python3 -m pytest -q tests/python
fi

if [[ "${DEEPINFER_SKIP_SANITIZERS:-0}" != "1" ]]; then
  echo "== ASan/UBSan build and tests"
  # -O1: the model and engine tests run real forwards; -O0 under ASan would dominate CI time.
  # No examples: no test runs them.
  BUILD_DIR=build-asan BUILD_TYPE=Debug ./scripts/build.sh -DDEEPINFER_SANITIZE=ON -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
    -DDEEPINFER_UNITY_BUILD=ON -DDEEPINFER_BUILD_EXAMPLES=OFF
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    DEEPINFER_SANITIZER_BUILD=1 ctest --test-dir build-asan --output-on-failure --parallel "$(nproc)"
fi

echo "== all tests passed"
