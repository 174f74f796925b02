#!/usr/bin/env bash
# Nsight Compute warp-state (stall reasons per issued instruction) profile of decode tactics, M = 1, fp16 and int8
# values (third launch of each case). Writes CSV files under $OUT.
# TACTICS (default "1"); round 6 ran TACTICS="1 66" at commit 7b501aa (tactic 66 = the _xg kernels, removed
# since), results in bench/results/bitmap_linear_ncu_r6_7b501aa_*.csv.
# ABLATE (default "": production only): BL_ABLATE variants of tools/bitmap_linear_ablate.py to profile beside
# production, e.g. ABLATE="7 24" (copies only, no copies); SHAPE (default 4096x4096), SPARSITY (default 0.5).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rc=0
for vd in float16 int8; do
  for t in ${TACTICS:-1}; do
    for v in prod ${ABLATE:-}; do
      extra=(); [ "$v" = prod ] || extra=(--ablate "$v")
      f="$OUT/ncu_t${t}_${vd}_${v}.csv"
      ncu --kernel-name regex:bitmap_dec --launch-skip 2 --launch-count 1 --csv --page details \
        --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats \
        --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
        --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
        python3 tools/bitmap_linear_profile.py --cases "${SHAPE:-4096x4096}:1:${SPARSITY:-0.5}:$vd" --tactic $t "${extra[@]}" \
        > "$f" 2>&1 || rc=1
      echo "== t$t $vd variant $v"
      grep -E "case |Duration|Issued Warp|No Eligible|Warp Cycles Per Issued|stalled_(short_scoreboard|long_scoreboard|wait|mio_throttle|lg_throttle|math_pipe|not_selected|barrier|no_instruction)" "$f" | head -16
    done
  done
done
exit $rc
