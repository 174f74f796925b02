#!/usr/bin/env bash
# Round-2 second GPU run for vitbit_gemm: GPU tests (all), memcheck of the fragment-layout epilogue
# variants 35-37, then the persistent tactics with and without the quad transpose side by side.
set -uo pipefail
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
timeout 80 python3 -m pytest -q tests/gpu/test_vitbit_gemm.py > "$OUT/test_vitbit_gemm.txt" 2>&1
echo "pytest rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/test_vitbit_gemm.txt"
tail -4 "$OUT/test_vitbit_gemm.txt"
VITBIT_PERSIST_CAP=2 timeout 25 compute-sanitizer --tool memcheck python3 tools/vitbit_gemm_sancheck.py 35 36 37 \
  > "$OUT/memcheck.txt" 2>&1
echo "memcheck rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/memcheck.txt"
grep -c "Invalid\|MISMATCH" "$OUT/memcheck.txt"; tail -2 "$OUT/memcheck.txt"
VITBIT_BENCH_TACTICS=${VITBIT_BENCH_TACTICS:-30,31,33,35,36,37} VITBIT_BENCH_NAME=vitbit_gemm_tp_epilogue \
  python3 bench/bench_vitbit_gemm.py > "$OUT/bench_vitbit_gemm_tp_epilogue.txt" 2>&1
echo "bench rc=$? at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/bench_vitbit_gemm_tp_epilogue.txt"
cp bench/results/vitbit_gemm_tp_epilogue*.json "$OUT"/ 2>/dev/null
