#!/usr/bin/env bash
# Builds the GPU benchmark and the CUDA tests here and stages them, stripped, with the CUDA
# runtime they link, in build-perf/device/ (a few MB) for the device tool:
#   bench/cuda/stage.sh   then   run (carry: ["build-perf/device"])
#   command: bench/cuda/run_device_bench.sh   (and bench/cuda/run_model_bench.sh)
# cuBLASLt (hundreds of MB) does not travel: the GPU machine's own copy is used.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
cmake -S . -B build-perf -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_CUDA=ON \
  -DDEEPINFER_BUILD_TESTS=ON -DDEEPINFER_BUILD_BENCH=ON -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build build-perf -j"${JOBS:-2}" --target cuda_layer_bench cuda_model_bench \
  cuda_attention_bench moe_grouped_gemm_test backend_ops_test attention_gpu_test
rm -rf build-perf/device && mkdir -p build-perf/device
for program in build-perf/bench/cuda/cuda_layer_bench build-perf/bench/cuda/cuda_model_bench \
  build-perf/bench/cuda/cuda_attention_bench build-perf/tests/ops/moe_grouped_gemm_test \
  build-perf/tests/ops/backend_ops_test build-perf/tests/ops/attention_gpu_test; do
  strip -o "build-perf/device/$(basename "$program")" "$program"
done
cp -L "$(ldd build-perf/bench/cuda/cuda_layer_bench | awk '/libcudart/ {print $3}')" \
  build-perf/device/
du -sh build-perf/device
