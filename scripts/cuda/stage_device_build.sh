#!/usr/bin/env bash
# Builds the CUDA test programs here and stages them (stripped, with the CUDA runtime they link)
# in $BUILD_DIR/device/, small enough to travel to the GPU machine:
#   scripts/cuda/stage_device_build.sh   then   run (carry: ["build-cuda/device"])
#   command: scripts/cuda/run_device_tests.sh
# BUILD_DIR (default build-cuda) lets several engineers stage from their own build trees;
# EXTRA_TARGETS / EXTRA_PROGRAMS add programs (paths relative to the repository root).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
# The benches' targets exist only with DEEPINFER_BUILD_BENCH (EXTRA_TARGETS names them); only
# the targets built below are compiled.
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_CUDA=ON \
  -DDEEPINFER_BUILD_TESTS=ON -DDEEPINFER_BUILD_BENCH=ON -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
# Every program with GPU tests, and the CLI (the engine script diffs its cpu and nvidia output).
kernel_tests="moe_grouped_gemm_test moe_wgmma_test linear_bf16_mma_test linear_fp8_dense_test
  linear_cublaslt_test attention_gpu_test"
# Only the kernel tests this tree has (they arrive with their kernels).
present=()
for test in $kernel_tests; do
  grep -q "deepinfer_add_test($test " tests/ops/CMakeLists.txt && present+=("$test")
done
cmake --build "$BUILD_DIR" -j"${JOBS:-2}" --target backend_ops_test "${present[@]}" \
  model_gpu_forward_test model_golden_test cuda_sampler_test engine_test deepinfer_cli \
  ${EXTRA_TARGETS:-}
rm -rf "$BUILD_DIR/device" && mkdir -p "$BUILD_DIR/device"
for program in "$BUILD_DIR"/tests/ops/backend_ops_test "${present[@]/#/$BUILD_DIR/tests/ops/}" \
  "$BUILD_DIR"/tests/model/{model_gpu_forward_test,model_golden_test} \
  "$BUILD_DIR/tests/sampling/cuda_sampler_test" "$BUILD_DIR/tests/engine/engine_test" \
  "$BUILD_DIR/deepinfer" ${EXTRA_PROGRAMS:-}; do
  strip -o "$BUILD_DIR/device/$(basename "$program")" "$program"
done
# The CUDA runtime and CUPTI (the model bench's kernel trace), and the libraries the GPU
# machine's image lacks (the tokenizer's).
cp -L $(ldd "$BUILD_DIR"/device/* | awk '/libcudart|libcupti|libutf8proc|libpcre2/ {print $3}' | sort -u) \
  "$BUILD_DIR/device/"
# The model tests read tests/data through the source path compiled into them.
echo "$PWD" >"$BUILD_DIR/device/compiled_source_dir"
du -sh "$BUILD_DIR/device"
