#!/usr/bin/env bash
# Round-4 GPU step for bitmap_linear (one call of the device tool): GPU tests of the changed kernels,
# compute-sanitizer memcheck on them, then timing. Usage: bash tools/bitmap_linear_gpu_round4.sh STEP
#   STEP=explore: decode-kernel tests + memcheck + tools/bitmap_linear_explore.py side by side (tactic lists,
#                 test ids and shapes from EVERY, LONGK, MEMCHECK, TACTICS, SHAPES, MS)
#   STEP=final:   GPU tests of the operator (subset, see below) + memcheck + the full benchmark (BENCH_ARGS)
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
  for t in ${EVERY:-60 61 62 63 64 65 70 71 72 73 74 75}; do for m in 1 7 9 16 33 70; do ids+=("$T::test_every_tactic[$m-$t]"); done; done
  python3 -m pytest -q -x "${ids[@]}" "$T::test_matches_reference_xs" "$T::test_decode_v2_long_k_odd_strips" \
    -k "${LONGK:-not (long_k and not (-1] or -60] or -61] or -63] or -65] or -70] or -71] or -75]))}" 2>&1 | tail -4 || rc=1
  date -u +%FT%TZ
  mc=()
  for id in ${MEMCHECK:-1-60 9-60 16-65 7-70 16-70 9-75}; do mc+=("$T::test_every_tactic[$id]"); done
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -x \
    "${mc[@]}" 2>&1 | tail -4 || rc=1
  date -u +%FT%TZ
  python3 tools/bitmap_linear_explore.py --shapes "${SHAPES:-4096x4096,4096x11008,11008x4096,2048x5632,896x4864}" \
    --m "${MS:-1,8,16}" --s 0.5 --vd float16,int8 --tactics "${TACTICS:-1,59,60,70}" \
    --json "$OUT/bitmap_linear_explore_r4.json" || rc=1
else
  # every test of the file except test_every_tactic of the tactics whose kernels did not change
  python3 -m pytest -q "$T" -k "${TESTS_K:-not every_tactic or -1] or -59] or -60] or -61] or -62] or -63] or -64] or -65] or -70] or -71] or -72] or -73] or -74] or -75]}" 2>&1 | tail -4 || rc=1
  date -u +%FT%TZ
  mc=()
  for id in ${MEMCHECK:-1-60 9-60 16-65 7-70 16-70 9-75 1-1 16-1}; do mc+=("$T::test_every_tactic[$id]"); done
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -x \
    "${mc[@]}" 2>&1 | tail -4 || rc=1
  date -u +%FT%TZ
  python3 bench/bench_bitmap_linear.py ${BENCH_ARGS:-} || rc=1
  cp bench/results/bitmap_linear*.json "$OUT"/ 2>/dev/null || true
fi
date -u +%FT%TZ
exit $rc
