#!/usr/bin/env bash
# ncu profile of the tp and tc2 tensor-core kernels on two ViT-B shapes (round 3, step 1): stall reasons
# (WarpStateStats), issue / tensor-pipe utilisation (ComputeWorkloadAnalysis, SchedulerStats), occupancy.
# Usage (repository root, GPU machine): OUT=dir bash tools/vitbit_gemm_ncu.sh [extra "K N M TACTICS..." jobs]
set -uo pipefail
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats"
JOBS=("768 2304 6304 30 1" "768 768 197 33 25 3" "$@")
i=0
for job in "${JOBS[@]}"; do
  [ -n "$job" ] || continue
  ncu -f -o "/tmp/ncu_$i" -k regex:vitbit_gemm_ $SECTIONS python3 tools/vitbit_gemm_profile.py $job > "$OUT/ncu_$i.log" 2>&1
  echo "ncu job '$job' rc=$?"
  ncu -i "/tmp/ncu_$i.ncu-rep" --page details > "$OUT/ncu_${i}_details.txt" 2>&1
  ncu -i "/tmp/ncu_$i.ncu-rep" --page raw --csv 2>/dev/null | python3 -c "
import csv, sys
rows = list(csv.reader(sys.stdin))
if len(rows) < 3: sys.exit(0)
hdr = rows[0]
keep = [j for j, h in enumerate(hdr) if h in ('Kernel Name',) or any(s in h for s in (
    'warp_latency_issue_stalled', 'pipe_tensor', 'imma', 'issue_active', 'inst_executed.avg.per_cycle_active',
    'warps_active.avg.per_cycle', 'gpu__time_duration.sum', 'sm__throughput', 'registers', 'cycles_elapsed.max'))]
for r in rows[2:]:
    print('---', r[hdr.index('Kernel Name')] if 'Kernel Name' in hdr else '?')
    for j in keep:
        v = r[j]
        try:
            if float(v.replace(',', '')) == 0: continue
        except ValueError:
            pass
        print(f'  {hdr[j]} = {v} {rows[1][j]}')
" > "$OUT/ncu_${i}_raw.txt"
  i=$((i+1))
done
