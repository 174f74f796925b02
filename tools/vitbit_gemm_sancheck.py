#!/usr/bin/env python3
"""Run chosen EdgeVitBitGemm tactics once on a small odd shape and check them against the numpy reference;
meant to run under ``compute-sanitizer --tool memcheck|racecheck`` (small, so the sanitizer is quick).

    python tools/vitbit_gemm_sancheck.py 1 2 3 ...      (default: the tc2 tactics 1-9, 24-29)

VITBIT_PERSIST_CAP=N caps the grid of the persistent tactics (30-34) so that each block walks many tiles.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))

import numpy as np  # noqa: E402

from edgesdk.kernels import vitbit_gemm as K  # noqa: E402
from edgesdk.reference import vitbit_gemm as R  # noqa: E402
from test_vitbit_gemm import _layer, _x_full_range, run  # noqa: E402


def main() -> int:
    rng = np.random.default_rng(3)
    K.PERSISTENT_GRID_CAP = int(os.environ.get("VITBIT_PERSIST_CAP", "0")) or None
    bad = 0
    for (m, k, n, dt) in [(201, 200, 77, np.float16), (70, 328, 136, np.float32), (33, 1000, 72, np.float16)]:
        p = _layer(rng, n, k, bias=True)
        x = _x_full_range(rng, (m, k), p.x_scale, dt)
        ref = R.vitbit_gemm(x, p)
        ts = [int(t) for t in sys.argv[1:]] or [t for t in K.valid_tactics(p.node_attributes(), m) if t < 10 or 24 <= t <= 29]
        for t in ts:
            if t not in K.valid_tactics(p.node_attributes(), m):
                continue
            ok = np.array_equal(run(p, x, t), ref)
            bad += not ok
            print(f"M={m} K={k} N={n} {dt.__name__} tactic {t}: {'exact' if ok else 'MISMATCH'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
