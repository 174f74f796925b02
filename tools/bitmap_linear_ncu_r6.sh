#!/usr/bin/env bash
# Nsight Compute warp-state (stall reasons per issued instruction) profile of decode tactics on 4096², 50 %,
# M = 1, fp16 and int8 values (third launch of each case). Writes CSV files under $OUT.
# TACTICS (default "1"); round 6 ran TACTICS="1 66" at commit 7b501aa (tactic 66 = the _xg kernels, removed
# since), results in bench/results/bitmap_linear_ncu_r6_7b501aa_*.csv.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
rc=0
for vd in float16 int8; do
  for t in ${TACTICS:-1}; do
    ncu --kernel-name regex:bitmap_dec --launch-skip 2 --launch-count 1 --csv --page details \
      --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats \
      --section Occupancy --section LaunchStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      python3 tools/bitmap_linear_profile.py --cases "4096x4096:1:0.5:$vd" --tactic $t > "$OUT/ncu_t${t}_${vd}.csv" 2>&1 || rc=1
    grep -E "case |stalled|Stall|Warp Cycles Per Issued|Issued Warp|Eligible|Executed Instructions\"|Duration" "$OUT/ncu_t${t}_${vd}.csv" | head -40
  done
done
exit $rc
