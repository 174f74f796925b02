#!/usr/bin/env bash
# Data for refitting EdgeVitBitGemm's tactic 1 (docs/vitbit_gemm.md, round 10), one device call (4-6 min on an
# H100 by the estimate in that section; not yet run): every tensor-core-only tactic on the layers of ViT-Ti/S/L
# (the fit) and of ViT-B/16 (held out, issue 5's shapes), M = 197 x 1..32, full GPU and 16-SM green context (also
# at Orin's shared-memory carveout and grid, explore --orin), then the GELU builds on the fc1 layers. Each stage
# writes its JSON after every layer, so a stage cut by its timeout keeps what it measured.
# Afterwards, on any machine:
#   python tools/vitbit_gemm_fit_auto.py bench/results/vitbit_gemm_explore_r10fit_C.json \
#       bench/results/vitbit_gemm_explore_r10hold_C.json [--green-kind orin] [--loo] --json bench/results/vitbit_gemm_autofit_C.json
# (the rows record each kernel's resident blocks per SM, which the fit's wave model needs)
# Usage (repository root, on the GPU machine): OUT=dir EDGESDK_COMMIT=$(git rev-parse --short HEAD) bash tools/vitbit_gemm_fit_run.sh
set -uo pipefail
OUT=${OUT:-out-gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
TRAIN=384:1152,384:384,384:1536,1536:384,1024:3072,1024:1024,1024:4096,4096:1024,192:576,192:192,192:768,768:192
HOLD=768:2304,768:768,768:3072,3072:768
T=3,29,30,31,33,34,50,60,71,72,73,82
TO=3,29,30,31,33,34,50,71,72,73,82  # 60 launches two kernels: the tail's carveout is not set, so not at Orin's
B=1,2,4,8,16,32
timeout 330 python3 tools/vitbit_gemm_explore.py --tactics $T --orin --orin-tactics $TO --shapes $TRAIN --batches $B \
  --name r10fit 2>&1 | tee -a "$OUT/log"
timeout 150 python3 tools/vitbit_gemm_explore.py --tactics $T --orin --orin-tactics $TO --shapes $HOLD --batches $B \
  --name r10hold 2>&1 | tee -a "$OUT/log"
timeout 80 python3 tools/vitbit_gemm_explore.py --gelu --tactics $T --shapes 768:3072,384:1536,1024:4096,192:768 \
  --batches 1,8,32,4 --name r10fit 2>&1 | tee -a "$OUT/log"
cp bench/results/vitbit_gemm_explore*r10*.json "$OUT"/ 2>/dev/null || true
