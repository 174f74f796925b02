#!/usr/bin/env python3
"""Markdown tables of ``docs/bitmap_linear.md`` from the committed benchmark JSON (no GPU needed).

Reads ``bench/results/bitmap_linear.json`` and ``bitmap_linear_green16.json`` (written by
``bench/bench_bitmap_linear.py``) and prints: the per-layer table (default tactic: µs, speed-up vs cuBLAS
fp16 of the same run, GB/s on the format's bytes; Coruscant rows as stored; 16-SM context) and the
medians over the layers with K·N ≥ 4M, by M, worst and best case.

Usage: python tools/bitmap_linear_table.py [--results bench/results] [--label default]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIG = 4 * 1024 * 1024


def _index(rows):
    return {(r["K"], r["N"], r["M"], r["kernel"], r["sparsity"]): r for r in rows}


def medians(rows, vd, sp, label):
    sel = [r for r in rows if r["kernel"] == f"bitmap_{vd}_{label}" and r["sparsity"] == sp]
    big = [r for r in sel if r["K"] * r["N"] >= BIG]
    by_m = [statistics.median(r["speedup"] for r in big if r["M"] == m) for m in sorted({r["M"] for r in big})]
    return (statistics.median(r["speedup"] for r in big), by_m, min(r["speedup"] for r in sel),
            max(r["speedup"] for r in sel))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--label", default="default", help="row label of our kernel (default, best, t49, ...)")
    a = ap.parse_args(argv)
    full = json.loads((a.results / "bitmap_linear.json").read_text())
    green = json.loads((a.results / "bitmap_linear_green16.json").read_text())
    ix, gx = _index(full["rows"]), _index(green["rows"])
    lab = a.label
    print(f"{full['meta']['device']}, {full['meta']['date']}, commit {full['meta']['commit']}\n")
    print("| K | N | M | cuBLAS µs (GB/s) | fp16 30 % | fp16 50 % | fp16 70 % | int8 50 % | int8 70 % "
          "| Coruscant 50 % / 70 % (04:08Z) | 16-SM ctx: cuBLAS / fp16 50 % / int8 50 % |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k, n in full["meta"]["shapes_KN"]:
        for m in full["meta"]["M"]:
            cb = ix[(k, n, m, "cublas_fp16", 0.0)]
            cells = [f"{cb['us']:.1f} ({cb['GBps']:.0f})"]
            for vd, s in (("float16", 0.3), ("float16", 0.5), ("float16", 0.7), ("int8", 0.5), ("int8", 0.7)):
                r = ix[(k, n, m, f"bitmap_{vd}_{lab}", s)]
                cells.append(f"{r['us']:.1f} ({r['speedup']:.2f}×, {r['GBps']:.0f})")
            pub = [ix.get((k, n, m, "coruscant_fp16", s)) for s in (0.5, 0.7)]
            cells.append(" / ".join(f"{p['us']:.1f}" for p in pub) if all(pub) else "–")
            g = gx[(k, n, m, "cublas_fp16", 0.0)]
            g16, g8 = gx[(k, n, m, f"bitmap_float16_{lab}", 0.5)], gx[(k, n, m, f"bitmap_int8_{lab}", 0.5)]
            cells.append(f"{g['us']:.1f} / {g16['us']:.1f} ({g16['speedup']:.2f}×) / {g8['us']:.1f} ({g8['speedup']:.2f}×)")
            print(f"| {k} | {n} | {m} | " + " | ".join(cells) + " |")
    print("\n| values | sparsity | full GPU median (K·N ≥ 4M, all M) | by M = 1 / 2 / 4 / 8 / 16 | worst case "
          "(all shapes, M) | best case | 16-SM median |")
    print("|---|---|---|---|---|---|---|")
    for vd in ("float16", "int8"):
        for sp in (0.3, 0.5, 0.7):
            med, by_m, lo, hi = medians(full["rows"], vd, sp, lab)
            gmed = medians(green["rows"], vd, sp, lab)[0]
            print(f"| {vd} | {round(sp * 100)} % | {med:.2f}× | {' / '.join(f'{v:.2f}' for v in by_m)} | {lo:.2f}× "
                  f"| {hi:.2f}× | {gmed:.2f}× |")
    pub = [r for r in full["rows"] if r["kernel"] == "coruscant_fp16" and r.get("ours_fp16_vs_published")]
    if pub:
        v = [r["ours_fp16_vs_published"] for r in pub]
        print(f"\nCoruscant: {len(v)} cases; ours (tactic 1) faster in {sum(x > 1 for x in v)}, "
              f"{min(v):.2f}–{max(v):.1f}× its speed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
