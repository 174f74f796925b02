#!/usr/bin/env python3
"""Round-4 table (stream-K tail, a negative result) from the two exploration runs:
bench/results/vitbit_gemm_r4_streamk_24bee18.json (tactics 1, 29, 30, 33, 35, 36, 50) and
bench/results/vitbit_gemm_r4_streamk_908d831.json (1, 30, 35, 36 + the ts kernel with every tile
data-parallel, "dp-only"). Times in us (median of 7 bursts of 20 launches, 4 weight rotations).

    python tools/vitbit_gemm_table_r4.py
"""

from __future__ import annotations

import json
from pathlib import Path

R = Path(__file__).resolve().parents[1] / "bench" / "results"


def load(name: str) -> dict:
    d = json.loads((R / name).read_text())
    out: dict = {}
    for r in d["rows"]:
        if "us" in r:
            out.setdefault((r["config"], r["K"], r["N"], r["M"]), {})[r["variant"]] = r["us"]
    return out


def pick(v: dict, prefix: str, diag: bool = False) -> float:
    x = [us for k, us in v.items() if k.startswith(prefix) and ("(diag)" in k) == diag]
    return x[0] if x else float("nan")


def main() -> None:
    a, b = load("vitbit_gemm_r4_streamk_24bee18.json"), load("vitbit_gemm_r4_streamk_908d831.json")
    print("| config | K | N | M | _int_mm | t30 tp_128x128 | t35 (DP + 2-round SK) | t36 (DP + 1-round SK) | "
          "ts dp-only | t30 / ts dp-only | t30 / t35 | best old TC-only (tactic) | best old / best SK |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in a:
        v, w = a[key], b.get(key, {})
        old = {k: us for k, us in v.items() if k.startswith("ours gemm t") and " t35 " not in k
               and " t36 " not in k and "repeat" not in k and " t1 " not in k}
        bo = min(old, key=old.get)
        t30, t35, t36 = pick(v, "ours gemm t30 "), pick(v, "ours gemm t35 "), pick(v, "ours gemm t36 ")
        dp = pick(w, "ours gemm t35 ", diag=True)
        t30b = pick(w, "ours gemm t30 ")
        print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {pick(v, 'torch._int_mm'):.1f} | {t30:.1f} | "
              f"{t35:.1f} | {t36:.1f} | {dp:.1f} | {t30b / dp:.2f} | {t30 / t35:.2f} | "
              f"{old[bo]:.1f} (t{bo.split()[2][1:]}) | {old[bo] / min(t35, t36):.2f} |")


if __name__ == "__main__":
    main()
