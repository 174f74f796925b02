#!/usr/bin/env bash
# Round-6 GPU step for bitmap_linear (one call of the device tool): GPU tests of the two-groups-per-issue
# kernels (_xg, tactics 66-69), compute-sanitizer memcheck on them, then timing side by side.
# Usage: bash tools/bitmap_linear_gpu_round6.sh STEP
#   STEP=explore: tests + memcheck + tools/bitmap_linear_explore.py (tactic 1 vs TACTICS vs cuBLAS, SHAPES, MS,
#                 sparsities SP, both value dtypes)
#   STEP=final:   GPU tests of the operator (subset) + memcheck + the full benchmark (BENCH_ARGS)
# Expects EDGESDK_COMMIT, EDGESDK_CACHE and OUT set by the caller.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
step=${1:-explore}
T=tests/gpu/test_bitmap_linear.py
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u +%FT%TZ
rc=0
if [ "$step" = explore ]; then
  ids=()
  for t in ${EVERY:-66 67 68 69}; do for m in 1 7 9 16 33 70; do ids+=("$T::test_every_tactic[$m-$t]"); done; done
  python3 -m pytest -q "${ids[@]}" "$T::test_matches_reference_xs" "$T::test_decode_v2_long_k_odd_strips" \
    -k "${SEL:-every_tactic or (long_k and (-66] or -67] or -68] or -69])) or (reference_xs and 66-)}" 2>&1 | tail -4 || rc=1
  date -u +%FT%TZ
  mc=()
  for id in ${MEMCHECK:-1-66 9-68 16-69}; do mc+=("$T::test_every_tactic[$id]"); done
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -x \
    "${mc[@]}" 2>&1 | tail -4 || rc=1
  date -u +%FT%TZ
  python3 tools/bitmap_linear_explore.py --shapes "${SHAPES:-4096x4096,4096x11008,11008x4096,2048x5632,896x4864}" \
    --m "${MS:-1,8,16}" --s "${SP:-0.5,0.7}" --vd float16,int8 --tactics "${TACTICS:-1,66}" \
    --json "$OUT/bitmap_linear_explore_r6.json" || rc=1
else
  python3 -m pytest -q "$T" -k "${TESTS_K:-not every_tactic or -1] or -60] or -66] or -67] or -68] or -69]}" 2>&1 | tail -4 || rc=1
  date -u +%FT%TZ
  mc=()
  for id in ${MEMCHECK:-1-1 16-1 9-66}; do mc+=("$T::test_every_tactic[$id]"); done
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -x \
    "${mc[@]}" 2>&1 | tail -4 || rc=1
  date -u +%FT%TZ
  python3 bench/bench_bitmap_linear.py ${BENCH_ARGS:-} || rc=1
  cp bench/results/bitmap_linear*.json "$OUT"/ 2>/dev/null || true
fi
date -u +%FT%TZ
exit $rc
