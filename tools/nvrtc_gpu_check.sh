#!/usr/bin/env bash
# The GPU kernel tests with the plugins compiled by NVRTC instead of nvcc: what the launchers do where nvcc is not
# found (a JetPack venv without /usr/local/cuda/bin, an image with cuda-python's wheels only).
#   1. NVRTC of the machine's cuda-python (CUDA 13 on the lent H100s);
#   2. NVRTC 12.6 (JetPack 6's CUDA) from NVIDIA's wheels, with cuda-python 12.9 in a folder ahead of the
#      machine's on PYTHONPATH, when WHEELS12 names a folder holding cuda_python, cuda_bindings, cuda_pathfinder,
#      nvidia_cuda_nvrtc_cu12 and nvidia_cuda_runtime_cu12 wheels.
# Usage on a GPU machine: OUT=out [ONLY=machine|12.6] bash tools/nvrtc_gpu_check.sh [pytest args; default: the
# kernel test files]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out-nvrtc}; mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}  # the interpreter that has edgesdk, torch and pytest
tests=("$@")
[ ${#tests[@]} -eq 0 ] && tests=(tests/gpu/test_bitmap_linear.py tests/gpu/test_vitbit_gemm.py tests/gpu/test_sparse_kv.py
                                 tests/gpu/test_runtime_device_arrays.py tests/test_nvrtc.py)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# no nvcc anywhere the launchers look: PATH without CUDA's bin, CUDA_HOME with the headers only
mkdir -p "$work/cuda13"
ln -s "${CUDA_HOME:-/usr/local/cuda}/include" "$work/cuda13/include"
nopath=$(tr ':' '\n' <<<"$PATH" | grep -v -i cuda | paste -sd:)
rc=0
run() {  # label, python, extra env...
  local label=$1 py=$2; shift 2
  env "$@" PATH="$nopath" EDGESDK_CACHE="$work/cache-$label" "$py" - <<'EOF' | tee "$OUT/compiler_$label.txt"
import os
import cuda.bindings
from edgesdk.kernels import _cuda
cid = _cuda.compiler_id()
print("compiler:", cid, "| find_nvcc:", _cuda.find_nvcc(), "| cuda.bindings", cuda.bindings.__version__,
      cuda.bindings.__file__)
assert cid.startswith("nvrtc "), cid
want = os.environ.get("WANT_NVRTC")
assert want is None or cid == f"nvrtc {want}", (cid, want)
EOF
  [ "${PIPESTATUS[0]}" -eq 0 ] || { rc=1; return; }
  env "$@" PATH="$nopath" EDGESDK_CACHE="$work/cache-$label" "$py" -m pytest -q -n 4 -p no:cacheprovider \
      "${tests[@]}" 2>&1 | tee "$OUT/test_$label.txt" | tail -5
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
}
[ "${ONLY:-machine}" = machine ] && run nvrtc-machine "$(command -v "$PYTHON")" CUDA_HOME="$work/cuda13"
if [ -n "${WHEELS12:-}" ] && [ "${ONLY:-12.6}" = 12.6 ]; then
  # a --target folder first on PYTHONPATH (a venv would not see the packages of a venv-based interpreter)
  "$PYTHON" -m pip install -q --no-deps --no-index --target "$work/cu12" "$WHEELS12"/*.whl
  # cuda.pathfinder looks for libnvrtc in the site-packages' NVIDIA wheels first (the machine's CUDA 13 one) and
  # takes one already loaded before that: every process (pytest's workers too) loads 12.6's first
  mkdir -p "$work/preload"
  printf 'import ctypes, os\nctypes.CDLL(os.environ["NVRTC12"], mode=ctypes.RTLD_GLOBAL)\n' \
      > "$work/preload/sitecustomize.py"
  run nvrtc-12.6 "$(command -v "$PYTHON")" WANT_NVRTC=12.6 PYTHONPATH="$work/preload:$work/cu12${PYTHONPATH:+:$PYTHONPATH}" \
      NVRTC12="$work/cu12/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" \
      CUDA_HOME="$work/cu12/nvidia/cuda_runtime" \
      LD_LIBRARY_PATH="$work/cu12/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
exit $rc
