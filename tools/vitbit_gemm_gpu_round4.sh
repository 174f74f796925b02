#!/usr/bin/env bash
# Round-4 GPU run for vitbit_gemm (one device call): GPU tests of the operator, compute-sanitizer memcheck
# and racecheck on the stream-K tactics (35, 36) and the in-kernel split-K tactic (50) with the persistent
# grid capped to 3 blocks (every split / fixup path runs), then the ViT-B benchmark of the chosen tactics
# beside the baselines, full GPU and 16-SM green context.
# Ran at commits 24bee18 (call 1) and 908d831 (call 2, VITBIT_SKIP_SAN=1 VITBIT_BENCH_SK_DIAG=1
# VITBIT_BENCH_TACTICS=1,30,35,36); tactics 35/36 were removed afterwards (docs/vitbit_gemm.md, round 4), so
# on later commits the sanitizer and bench steps skip them (sancheck and the bench only run valid tactics).
# Usage (repository root, on the GPU machine): OUT=dir bash tools/vitbit_gemm_gpu_round4.sh
set -uo pipefail
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$OUT/gpu.txt"
timeout ${VITBIT_TEST_TIMEOUT:-200} python3 -m pytest -q tests/gpu/test_vitbit_gemm.py > "$OUT/test_vitbit_gemm.txt" 2>&1
echo "pytest rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/test_vitbit_gemm.txt"
tail -8 "$OUT/test_vitbit_gemm.txt"
if [ -z "${VITBIT_SKIP_SAN:-}" ]; then
  VITBIT_PERSIST_CAP=3 timeout 60 compute-sanitizer --tool memcheck python3 tools/vitbit_gemm_sancheck.py 35 36 50 \
    > "$OUT/memcheck.txt" 2>&1
  echo "memcheck rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/memcheck.txt"
  grep -E "exact|MISMATCH|ERROR SUMMARY" "$OUT/memcheck.txt" | tail -12
  VITBIT_PERSIST_CAP=3 timeout 120 compute-sanitizer --tool racecheck python3 tools/vitbit_gemm_sancheck.py 35 50 \
    > "$OUT/racecheck.txt" 2>&1
  echo "racecheck rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/racecheck.txt"
  grep -E "exact|MISMATCH|RACECHECK SUMMARY|hazard" "$OUT/racecheck.txt" | tail -12
fi
VITBIT_BENCH_TACTICS=${VITBIT_BENCH_TACTICS:-1,29,30,33,35,36,50} \
  VITBIT_BENCH_NAME=${VITBIT_BENCH_NAME:-vitbit_gemm_r4_explore} \
  timeout ${VITBIT_BENCH_TIMEOUT:-240} python3 bench/bench_vitbit_gemm.py > "$OUT/bench.txt" 2>&1
echo "bench rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/bench.txt"
tail -4 "$OUT/bench.txt"
cp bench/results/${VITBIT_BENCH_NAME:-vitbit_gemm_r4_explore}*.json "$OUT"/ 2>/dev/null
