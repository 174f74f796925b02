#!/usr/bin/env bash
# Round-3 GPU run for vitbit_gemm (one device call): GPU tests of the operator, compute-sanitizer memcheck
# on the new kernels (in-kernel split-K 50; the 8-warp 64 x 64 tactics 38-40 of the 07:48Z run were removed
# afterwards as dominated) and the persistent kernels
# whose epilogue was factored out (30, 33), then the ViT-B benchmark of the tensor-core-only tactics (tc2, tp, tk, the default
# tactic 1) and two hybrids beside the baselines, full GPU and 16-SM green context.
# Usage (repository root, on the GPU machine): OUT=dir bash tools/vitbit_gemm_gpu_round3.sh
set -uo pipefail
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.txt"
timeout ${VITBIT_TEST_TIMEOUT:-150} python3 -m pytest -q tests/gpu/test_vitbit_gemm.py > "$OUT/test_vitbit_gemm.txt" 2>&1
echo "pytest rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/test_vitbit_gemm.txt"
tail -5 "$OUT/test_vitbit_gemm.txt"
VITBIT_PERSIST_CAP=2 timeout 60 compute-sanitizer --tool memcheck python3 tools/vitbit_gemm_sancheck.py 30 33 50 \
  > "$OUT/memcheck.txt" 2>&1
echo "memcheck rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/memcheck.txt"
tail -3 "$OUT/memcheck.txt"
VITBIT_BENCH_TACTICS=${VITBIT_BENCH_TACTICS:-1,3,5,9,25,26,27,28,29,30,31,33,34,50,18,22} \
  VITBIT_BENCH_NAME=${VITBIT_BENCH_NAME:-vitbit_gemm_r3} \
  timeout ${VITBIT_BENCH_TIMEOUT:-300} python3 bench/bench_vitbit_gemm.py > "$OUT/bench.txt" 2>&1
echo "bench rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/bench.txt"
tail -30 "$OUT/bench.txt"
cp bench/results/${VITBIT_BENCH_NAME:-vitbit_gemm_r3}*.json "$OUT"/ 2>/dev/null
