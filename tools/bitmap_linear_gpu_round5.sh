#!/usr/bin/env bash
# Round-5 GPU step for bitmap_linear (one device call): GPU tests of the _xs96 tactics, the side-by-side
# explore run (tactic 1 vs 76 on the 9 layers, M = 1 and 16, 50 %, fp16 and int8 values), then
# compute-sanitizer memcheck on three of the new launches. Expects EDGESDK_COMMIT, EDGESDK_CACHE and OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
T=tests/gpu/test_bitmap_linear.py
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u +%FT%TZ
rc=0
ids=()
for t in 76 77 78 79; do for m in 1 7 9 16 33 70; do ids+=("$T::test_every_tactic[$m-$t]"); done; done
timeout 90 python3 -m pytest -q "${ids[@]}" "$T::test_matches_reference_xs" "$T::test_decode_v2_long_k_odd_strips" \
  -k "not (matches_reference_xs or long_k) or -76] or -79] or [76-" 2>&1 | tail -4 || rc=1
date -u +%FT%TZ
timeout 130 python3 tools/bitmap_linear_explore.py \
  --shapes "4096x4096,4096x11008,11008x4096,2048x5632,5632x2048,896x4864,4864x896,576x1536,1536x576" \
  --m 1,16 --s 0.5 --vd float16,int8 --tactics "${TACTICS:-1,76}" --json "$OUT/bitmap_linear_explore_r5.json" || rc=1
date -u +%FT%TZ
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -x \
  "$T::test_every_tactic[1-76]" "$T::test_every_tactic[16-76]" "$T::test_every_tactic[9-79]" 2>&1 | tail -4 || rc=1
date -u +%FT%TZ
exit $rc
