#!/usr/bin/env python3
"""Markdown table for docs/vitbit_gemm.md from bench/results/vitbit_gemm_tp.json (round 2: tensor-core-only
tactics, tc2 and persistent tp, beside the baselines) and vitbit_gemm_ceiling.json; the hybrid column comes
from bench/results/vitbit_gemm.json (round 1: the hybrid kernels did not change)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

R = Path(__file__).resolve().parents[1] / "bench" / "results"


def main() -> int:
    d = json.loads((R / "vitbit_gemm_tp.json").read_text())
    c = json.loads((R / "vitbit_gemm_ceiling.json").read_text())
    r1 = json.loads((R / "vitbit_gemm.json").read_text())
    rows = d["rows"]
    summ = [r for r in rows if r.get("variant") == "summary"]
    hyb1 = {(r["config"], r["K"], r["N"], r["M"]): r["best_hybrid_us"] for r in r1["rows"]
            if r.get("variant") == "summary"}

    def key(r):
        return (r["config"], r["K"], r["N"], r["M"])

    us = {}
    for r in rows:
        if "us" in r and r["variant"].startswith("ours gemm t") and "repeat" not in r["variant"]:
            us.setdefault(key(r), {})[r["variant"]] = r["us"]

    def best(k, pred):
        cand = {n: v for n, v in us[k].items() if pred(n)}
        n = min(cand, key=cand.get)
        m = re.search(r" t(\d+) (\S+)", n)
        return cand[n], f"t{m.group(1)} {m.group(2)}"

    print("| config | K | N | M | _int_mm | Triton sm_90 | Triton sm_80 build | cuBLAS fp16 | best tc2 (tactic) "
          "| best persistent (tactic) | tc2 / tp | ours best TC-only: TOPS (frac. of ceiling) | vs _int_mm | vs Triton "
          "| vs Triton sm_80 | best hybrid (round 1) / best TC-only |")
    print("|" + "---|" * 16)
    wins = {"triton": 0, "int_mm": 0, "n": 0}
    for r in summ:
        k = key(r)
        t2, n2 = best(k, lambda n: " tc2_" in n)
        tp, np_ = best(k, lambda n: " tp_" in n)
        b = min(t2, tp)
        ceil = c[r["config"]]["mma_ldm_w64x64"]["best"]["TOPS"]
        tops = 2 * r["M"] * r["N"] * r["K"] / b / 1e6
        wins["n"] += 1
        wins["triton"] += r["triton_us"] >= b
        wins["int_mm"] += r["int_mm_us"] >= b
        print(f"| {r['config']} | {r['K']} | {r['N']} | {r['M']} | {r['int_mm_us']:.1f} | {r['triton_us']:.1f} | "
              f"{r['triton_sm80_us']:.1f} | {r['cublas_fp16_us']:.1f} | {t2:.1f} ({n2}) | {tp:.1f} ({np_}) | "
              f"{t2 / tp:.2f} | {tops:.0f} ({tops / ceil:.2f}) | {r['int_mm_us'] / b:.2f} | {r['triton_us'] / b:.2f} | "
              f"{r['triton_sm80_us'] / b:.2f} | {b / hyb1[k]:.2f} |")
    print(f"\nours >= Triton sm_90 on {wins['triton']} of {wins['n']}; >= _int_mm on {wins['int_mm']} of {wins['n']}")
    for cfg in ("full", "green16"):
        pk = d["meta"]["peaks_tops"][cfg]
        print(f"{cfg} 8192^3: " + ", ".join(f"{k} {v:.0f}" for k, v in pk.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
