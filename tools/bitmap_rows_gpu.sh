#!/usr/bin/env bash
# Round-8 GPU step for bitmap_linear (one call of the device tool): GPU tests of the row-walk kernel,
# compute-sanitizer memcheck on a subset, then tools/bitmap_rows_explore.py (EXPLORE_ARGS) into $OUT.
# Expects EDGESDK_COMMIT, EDGESDK_CACHE and OUT set by the caller.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
T=tests/gpu/test_bitmap_rows.py
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
date -u +%FT%TZ
rc=0
python3 -m pytest -q -x "$T" 2>&1 | tail -4 || rc=1
date -u +%FT%TZ
PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -x \
  "$T::test_rows_every_config[8-16]" "$T::test_rows_every_config[32-4]" "$T::test_rows_matches_reference[int8-0.7]" \
  "$T::test_rows_matches_reference[float16-0.0]" 2>&1 | tail -4 || rc=1
date -u +%FT%TZ
python3 tools/bitmap_rows_explore.py ${EXPLORE_ARGS:-} --json "$OUT/bitmap_rows_explore.json" || rc=1
date -u +%FT%TZ
exit $rc
