#!/usr/bin/env python3
"""Markdown table for docs/vitbit_gemm.md from a round-3 benchmark JSON (default
bench/results/vitbit_gemm_r3.json): baselines, tactic 1 (the per-shape default), the best tensor-core-only
tactic, the best hybrid, and the ratios per target; the ceiling from vitbit_gemm_ceiling.json.

    python tools/vitbit_gemm_table_r3.py [results.json]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

R = Path(__file__).resolve().parents[1] / "bench" / "results"


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else R / "vitbit_gemm_r3.json"
    d = json.loads(path.read_text())
    c = json.loads((R / "vitbit_gemm_ceiling.json").read_text())
    rows = d["rows"]
    summ = [r for r in rows if r.get("variant") == "summary"]

    def key(r):
        return (r["config"], r["K"], r["N"], r["M"])

    us: dict = {}
    for r in rows:
        if "us" in r and r["variant"].startswith("ours gemm t") and "repeat" not in r["variant"]:
            us.setdefault(key(r), {})[r["variant"]] = r["us"]

    def label(n):
        m = re.search(r" t(\d+) (\S+)", n)
        return f"t{m.group(1)} {m.group(2)}"

    print("| config | K | N | M | _int_mm | Triton sm_90 | Triton sm_80 build | cuBLAS fp16 | tactic 1 (resolved) "
          "| best TC-only (tactic) | its TOPS (frac. of ceiling) | t1 / best | vs _int_mm | vs Triton "
          "| vs Triton sm_80 | best hybrid / best TC-only |")
    print("|" + "---|" * 16)
    n = {"triton": 0, "int_mm": 0, "int_mm15": 0, "sm80": 0, "all": 0}
    worst_t1 = 1.0
    for r in summ:
        k = key(r)
        b = r["best_tc_only_us"]
        ceil = c[r["config"]]["mma_ldm_w64x64"]["best"]["TOPS"]
        tops = 2 * r["M"] * r["N"] * r["K"] / b / 1e6
        t1 = r["tc1_us"]
        t1n = r["tc1"].split()[-1] if r.get("tc1") else "?"
        worst_t1 = max(worst_t1, t1 / b)
        n["all"] += 1
        n["triton"] += r["triton_us"] >= b
        n["int_mm"] += r["int_mm_us"] >= b
        n["int_mm15"] += r["int_mm_us"] >= 1.5 * b
        n["sm80"] += r["triton_sm80_us"] >= b
        hyb = f"{b / r['best_hybrid_us']:.2f}" if r.get("best_hybrid_us") else "-"
        print(f"| {r['config']} | {r['K']} | {r['N']} | {r['M']} | {r['int_mm_us']:.1f} | {r['triton_us']:.1f} | "
              f"{r['triton_sm80_us']:.1f} | {r['cublas_fp16_us']:.1f} | {t1:.1f} ({t1n}) | {b:.1f} "
              f"({label(r['best_tc_only'])}) | {tops:.0f} ({tops / ceil:.2f}) | {t1 / b:.2f} | "
              f"{r['int_mm_us'] / b:.2f} | {r['triton_us'] / b:.2f} | {r['triton_sm80_us'] / b:.2f} | {hyb} |")
    print(f"\nbest TC-only >= Triton sm_90 on {n['triton']} of {n['all']}; >= _int_mm on {n['int_mm']}; "
          f">= 1.5 x _int_mm on {n['int_mm15']}; >= Triton sm_80 build on {n['sm80']}; "
          f"tactic 1 / best TC-only <= {worst_t1:.3f}")
    for cfg, pk in d["meta"]["peaks_tops"].items():
        if isinstance(pk, dict):
            print(f"{cfg} 8192^3: " + ", ".join(f"{k} {v:.0f}" for k, v in pk.items()))
    print(f"device {d['meta'].get('device')}, date {d['meta'].get('date')}, commit {d['meta'].get('commit')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
