#!/usr/bin/env python3
"""Markdown tables for docs/vitbit_gemm.md from bench/results/vitbit_gemm.json and vitbit_gemm_ceiling.json."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

R = Path(__file__).resolve().parents[1] / "bench" / "results"


def main() -> int:
    d = json.loads((R / "vitbit_gemm.json").read_text())
    c = json.loads((R / "vitbit_gemm_ceiling.json").read_text())
    rows = d["rows"]
    summ = [r for r in rows if r.get("variant") == "summary"]

    def tac(name):
        m = re.search(r" t(\d+) (\S+)", name or "")
        return f"t{m.group(1)} {m.group(2)}" if m else "-"

    def tops(r, us):
        return 2 * r["M"] * r["N"] * r["K"] / us / 1e6

    print("| config | K | N | M | _int_mm | Triton sm_90 | Triton sm_80 build | cuBLAS fp16 | ours best TC-only (tactic) "
          "| its TOPS (frac. of ceiling) | first-gen best | new/old | vs _int_mm | vs Triton | vs Triton sm_80 "
          "| best hybrid / best TC |")
    print("|" + "---|" * 16)
    for r in summ:
        cfg = r["config"]
        ceil = c[cfg]["mma_ldm_w64x64"]["best"]["TOPS"]
        t = tops(r, r["best_tc_only_us"])
        print(f"| {cfg} | {r['K']} | {r['N']} | {r['M']} | {r['int_mm_us']:.1f} | {r['triton_us']:.1f} | "
              f"{r['triton_sm80_us']:.1f} | {r['cublas_fp16_us']:.1f} | {r['best_tc_only_us']:.1f} ({tac(r['best_tc_only'])}) | "
              f"{t:.0f} ({t / ceil:.2f}) | {r['best_tc_v1_us']:.1f} | {r['best_tc_v1_us'] / r['best_tc_only_us']:.2f}x | "
              f"{r['speedup_vs_int_mm']:.2f} | {r['speedup_vs_triton']:.2f} | {r['speedup_vs_triton_sm80']:.2f} | "
              f"{r['hybrid_vs_best_tc']:.2f} ({tac(r['best_hybrid'])}) |")
    print()
    print("| config | K | N | M | _int_mm TOPS | 1.5 x _int_mm needs TOPS | mma.sync ceiling reg-only / +ldmatrix | "
          "needed / ceiling (+ldmatrix) | Triton sm_90 TOPS | ours TOPS |")
    print("|" + "---|" * 10)
    for r in summ:
        cfg = r["config"]
        reg = c[cfg]["mma_reg"]["best"]["TOPS"]
        ldm = c[cfg]["mma_ldm_w64x64"]["best"]["TOPS"]
        im = tops(r, r["int_mm_us"])
        print(f"| {cfg} | {r['K']} | {r['N']} | {r['M']} | {im:.0f} | {1.5 * im:.0f} | {reg:.0f} / {ldm:.0f} | "
              f"{1.5 * im / ldm:.2f} | {tops(r, r['triton_us']):.0f} | {tops(r, r['best_tc_only_us']):.0f} |")
    for cfg in ("full", "green16"):
        pk = d["meta"]["peaks_tops"][cfg]
        im = pk["torch._int_mm"]
        print(f"\n{cfg} 8192^3: " + ", ".join(f"{k} {v:.0f}" for k, v in pk.items()) +
              f"; 1.5 x _int_mm = {1.5 * im:.0f} vs ceiling {c[cfg]['mma_reg']['best']['TOPS']:.0f} reg-only / "
              f"{c[cfg]['mma_ldm_w64x64']['best']['TOPS']:.0f} +ldmatrix")
    # hybrids: geometric mean per tactic of best-TC / hybrid
    import math
    by = {}
    for r in rows:
        if r.get("variant", "").startswith("ours gemm t") and " h" in r["variant"] and "us" in r:
            s = next(x for x in summ if x["config"] == r["config"] and x["M"] == r["M"] and x["N"] == r["N"]
                     and x["K"] == r["K"])
            by.setdefault((r["config"], r["variant"]), []).append(s["best_tc_only_us"] / r["us"])
    for cfg in ("full", "green16"):
        g = {k[1]: math.exp(sum(map(math.log, v)) / len(v)) for k, v in by.items() if k[0] == cfg}
        print(f"{cfg}: hybrid geomean best-TC/hybrid range {min(g.values()):.2f}-{max(g.values()):.2f}; best "
              f"{max(g, key=g.get)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
