#!/usr/bin/env bash
# One entry point for the GPU machine: build every kernel, run every GPU test, run the benchmarks.
# Usage (on a machine with an NVIDIA GPU):  bash tools/gpu_check.sh [OP ...]
#   OP selects operators by name (bitmap_linear, vitbit_gemm, sparse_kv); default: all.
# Writes logs and JSON under $OUT (default ./out-gpu) and benchmark JSON under bench/results/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
ops=("$@")
sel() { [ ${#ops[@]} -eq 0 ] && return 0; for o in "${ops[@]}"; do [ "$o" = "$1" ] && return 0; done; return 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 tools/compile_kernels.py --arch sm_90 --json "$OUT/kernels.json" | tee "$OUT/kernels.txt"
rc=0
for t in tests/gpu/test_*.py; do
  op=$(basename "$t" .py); op=${op#test_}
  sel "$op" || continue
  python3 -m pytest -q -x "$t" 2>&1 | tee "$OUT/test_$op.txt" || rc=1
done
for b in bench/bench_*.py; do
  op=$(basename "$b" .py); op=${op#bench_}
  sel "$op" || continue
  python3 "$b" 2>&1 | tee "$OUT/bench_$op.txt" || rc=1
  cp bench/results/"$op"*.json "$OUT"/ 2>/dev/null || true
done
exit $rc
