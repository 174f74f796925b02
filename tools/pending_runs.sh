#!/usr/bin/env bash
# The GPU runs that the issues' notes list as not yet run (session 46, 2026-12-08), one stage per device call
# (each well inside the device tool's 10 minutes). Result files are named after the GPU it runs on (h100 / h200)
# and the commit, so a run given another GPU than asked for is not mistaken for the one asked for.
#   stage 1: issue 4's measured choice with the fixed timer (tools/bitmap_linear_autochoice.py, full GPU and 16 SMs;
#            ~4 min on an H100) and the GPU tests of the measured choice and of the VitBit GEMM
#   stage 2: issue 5's tactic-1 A/B (every tactic beside tactic 1 as run, ViT-B/16 x M = 197 x 1..32) and its
#            benchmark (bench/bench_vitbit_gemm.py; ~4 min on an H100)
#   stage 3: issue 7's benchmark with the new copy cap (bench/bench_sparse_kv.py)
# Usage (repository root, on the GPU machine):
#   OUT=dir EDGESDK_COMMIT=$(git rev-parse --short HEAD) [VITBIT_TRITON_SM80=DIR] bash tools/pending_runs.sh STAGE
# (VITBIT_TRITON_SM80: the PTX tools/vitbit_gemm_triton_sm80.py builds, on any machine with triton; without it the
# benchmark skips that column)
set -uo pipefail
stage=${1:?usage: bash tools/pending_runs.sh 1|2|3}
command -v nvidia-smi > /dev/null || { echo "no nvidia-smi here: run this on the GPU machine"; exit 2; }
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
C=${EDGESDK_COMMIT:-$(git rev-parse --short HEAD)}
export EDGESDK_COMMIT=$C
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in *H200*) G=h200 ;; *H100*) G=h100 ;; *) G=$(echo "$name" | tr -c 'A-Za-z0-9\n' '_' | tr 'A-Z' 'a-z') ;; esac
echo "GPU: $name (files tagged $G), commit $C" | tee -a "$OUT/log"
case "$stage" in
1)
  timeout 330 python3 tools/bitmap_linear_autochoice.py --green 16 --workers "$(nproc)" \
    --json "$OUT/bitmap_linear_autochoice_${G}_$C.json" 2>&1 | tail -14 | tee -a "$OUT/log"
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_measure_choice_gpu.py \
    tests/gpu/test_vitbit_gemm.py 2>&1 | tail -5 | tee -a "$OUT/log"
  ;;
2)
  timeout 150 python3 tools/vitbit_gemm_explore.py --tactics 1,3,29,30,31,33,34,50,60,71,72,73,82 \
    --shapes 768:2304,768:768,768:3072,3072:768 --batches 1,2,4,8,16,32 --name "ab_$G" 2>&1 | tail -3 | tee -a "$OUT/log"
  VITBIT_BENCH_NAME="vitbit_gemm_${G}_$C" timeout 300 python3 bench/bench_vitbit_gemm.py 2>&1 | tail -30 | tee -a "$OUT/log"
  cp "bench/results/vitbit_gemm_explore_ab_${G}_$C.json" "bench/results/vitbit_gemm_${G}_$C.json" "$OUT"/ 2>/dev/null
  ;;
3)
  timeout 560 python3 bench/bench_sparse_kv.py 2>&1 | tail -40 | tee -a "$OUT/log"
  cp bench/results/sparse_kv.json "$OUT/sparse_kv_${G}_$C.json" 2>/dev/null
  ;;
*) echo "unknown stage $stage (1, 2 or 3)"; exit 2 ;;
esac
