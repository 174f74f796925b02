"""What `edgesdk build --kernels auto` (with ``--measure``) keeps for the ViT-B/16 INT8 linears: the
``EdgeVitBitGemm`` plugin (tactic 1, quantize + GEMM) or the dense INT8 Q/DQ layer (cuBLAS int8 × int8 → int32
standing in for TensorRT's INT8 GEMM, without its epilogue), timed by the build's own
:func:`edgesdk.kernels.vitbit_gemm.measure_vs_dense` and decided by :func:`edgesdk.rewrite.choose.decide_measured`.

    python tools/vitbit_gemm_autochoice.py [--green 16] [--json bench/results/vitbit_gemm_autochoice.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgesdk.formats.vitbit_gemm import VitBitWeights  # noqa: E402
from edgesdk.kernels import _cuda  # noqa: E402
from edgesdk.kernels.vitbit_gemm import measure_vs_dense  # noqa: E402
from edgesdk.rewrite.choose import MEASURE_MARGIN, decide_measured  # noqa: E402

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]  # (K, N) of ViT-B/16: qkv, proj, fc1, fc2
MS = [197, 197 * 8, 197 * 32]


def run(label: str) -> list[dict]:
    rows = []
    for i, (k, n) in enumerate(SHAPES):
        rng = np.random.default_rng(i)
        p = VitBitWeights.pack(rng.integers(-127, 128, (n, k), dtype=np.int8),
                               rng.uniform(1e-3, 1e-2, n).astype(np.float32), 8,
                               bias=rng.standard_normal(n).astype(np.float32), x_scale=0.02)
        for m in MS:
            meas = measure_vs_dense(p, m)
            kernel, _ = decide_measured(meas)
            rows.append({"ctx": label, "K": k, "N": n, "M": m, **meas, "choice": kernel if kernel != "none"
                         else meas["dense"], "vitbit_vs_dense": meas["dense_us"] / meas["vitbit_us"]})
            r = rows[-1]
            print(f"{label:7s} {k:5d}x{n:<5d} M={m:5d}: vitbit {r['vitbit_us']:8.2f}  dense {r['dense_us']:8.2f} "
                  f"({r['dense']})  -> {r['choice']} ({r['vitbit_vs_dense']:.2f}x)", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--green", type=int, default=0, help="also run on a green context of this many SMs")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "vitbit_gemm_autochoice.json")
    args = ap.parse_args(argv)
    _cuda.init()
    facts = _cuda.device_facts()
    rows = run("full")
    if args.green:
        with _cuda.in_green_context(args.green) as sms:
            rows += run(f"green{sms}")
    from bench._common import meta, write_json

    info = meta({"tool": "tools/vitbit_gemm_autochoice.py", "gpu": facts, "margin": MEASURE_MARGIN,
                 "method": "edgesdk.kernels.vitbit_gemm.measure_vs_dense (CUDA graph of >= 16 launches over operand "
                           "copies rotated beyond 2x L2, median of 6 replays); decision by decide_measured"})
    print(f"wrote {write_json(args.json, rows, info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
