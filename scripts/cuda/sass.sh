#!/usr/bin/env bash
# The SASS of a CUDA object or program built here (no GPU needed), e.g. to count a kernel's
# instructions a loop iteration:
#   scripts/cuda/sass.sh build-perf/CMakeFiles/deepinfer.dir/src/ops/cuda/moe_prefill_wgmma.cu.o \
#     'prefill_wgmma_kernel' > /tmp/wgmma.sass
# The toolkit here has nvcc and ptxas but not cuobjdump / nvdisasm: they come from NVIDIA's PyPI
# wheels (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm), unpacked once into .cache/cuda-tools.
# The second argument (a grep -E pattern) keeps only the functions whose mangled name matches.
set -euo pipefail
cd "$(dirname "$0")/../.."
object=${1:?usage: scripts/cuda/sass.sh OBJECT_OR_PROGRAM [FUNCTION_PATTERN]}
pattern=${2:-}
tools=$PWD/.cache/cuda-tools
if [ ! -x "$tools/bin/cuobjdump" ] || [ ! -x "$tools/bin/nvdisasm" ]; then
  mkdir -p "$tools/wheels" "$tools/bin"
  python3 -m pip download --no-deps -q -d "$tools/wheels" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
  for wheel in "$tools"/wheels/*.whl; do
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
      "$wheel" "$tools/unpacked"
  done
  for tool in cuobjdump nvdisasm; do
    cp "$(find "$tools/unpacked" -name "$tool" -type f | head -1)" "$tools/bin/$tool"
    chmod +x "$tools/bin/$tool"
  done
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
object=$(realpath "$object")
(cd "$work" && "$tools/bin/cuobjdump" -xelf all "$object" >/dev/null)
PATH=$tools/bin:$PATH "$tools/bin/cuobjdump" -sass "$work"/*.cubin |
  if [ -n "$pattern" ]; then
    awk -v pattern="$pattern" '/Function :/ { keep = ($0 ~ pattern) } keep'
  else
    cat
  fi
