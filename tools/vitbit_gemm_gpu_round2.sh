#!/usr/bin/env bash
# Round-2 GPU run for vitbit_gemm (one device call): GPU tests, a benchmark of the tensor-core-only
# tactics (tc2 and the persistent tp tactics 30-34) beside the baselines on the full GPU and the 16-SM
# green context, then compute-sanitizer memcheck on the persistent kernels (the run of 970ff88 had no time
# left for racecheck: its barriers are those of tc2, racecheck-clean in round 1).
# Usage (repository root, on the GPU machine): OUT=dir bash tools/vitbit_gemm_gpu_round2.sh
set -uo pipefail
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
timeout 75 python3 -m pytest -q tests/gpu/test_vitbit_gemm.py > "$OUT/test_vitbit_gemm.txt" 2>&1
echo "pytest rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/test_vitbit_gemm.txt"
tail -5 "$OUT/test_vitbit_gemm.txt"
VITBIT_BENCH_TACTICS=${VITBIT_BENCH_TACTICS:-1,2,3,5,24,25,28,29,30,31,32,33,34} VITBIT_BENCH_NAME=vitbit_gemm_tp \
  python3 bench/bench_vitbit_gemm.py > "$OUT/bench_vitbit_gemm_tp.txt" 2>&1
echo "bench rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/bench_vitbit_gemm_tp.txt"
cp bench/results/vitbit_gemm_tp*.json "$OUT"/ 2>/dev/null
VITBIT_PERSIST_CAP=2 timeout 30 compute-sanitizer --tool memcheck python3 tools/vitbit_gemm_sancheck.py 30 31 32 33 34 \
  > "$OUT/memcheck.txt" 2>&1
echo "memcheck rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/memcheck.txt"
tail -3 "$OUT/memcheck.txt"
