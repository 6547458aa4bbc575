#!/usr/bin/env bash
# Builds the CUDA test programs here and stages them in build-cuda/device/ (stripped, with the
# CUDA runtime they link), small enough to travel to the GPU machine:
#   scripts/cuda/stage_device_build.sh   then   run (carry: ["build-cuda/device"])
#   command: scripts/cuda/run_device_tests.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_CUDA=ON \
  -DDEEPINFER_BUILD_TESTS=ON -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build build-cuda -j"${JOBS:-2}" --target backend_ops_test ${EXTRA_TARGETS:-}
rm -rf build-cuda/device && mkdir -p build-cuda/device
for program in build-cuda/tests/ops/backend_ops_test ${EXTRA_PROGRAMS:-}; do
  strip -o "build-cuda/device/$(basename "$program")" "$program"
done
cp -L "$(ldd build-cuda/tests/ops/backend_ops_test | awk '/libcudart/ {print $3}')" build-cuda/device/
du -sh build-cuda/device
