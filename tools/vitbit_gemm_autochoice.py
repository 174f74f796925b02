"""What `edgesdk build --kernels auto` (with ``--measure``) keeps for the ViT-B/16 INT8 linears: the
``EdgeVitBitGemm`` plugin (tactic 1) or the dense INT8 Q/DQ layer (cuBLAS int8 × int8 → int32 standing in for
TensorRT's INT8 GEMM, without its epilogue), timed by the build's own
:func:`edgesdk.kernels.vitbit_gemm.measure_vs_dense` and decided by :func:`edgesdk.rewrite.choose.decide_measured`.
Both node inputs side by side: int8 X (``--vitbit-input int8``, the default: the GEMM alone, X already quantized
by the graph's QuantizeLinear) and float16 X (``--vitbit-input float``: the plugin's quantize kernel + GEMM).

    python tools/vitbit_gemm_autochoice.py [--green 16] [--x-dtypes int8,float16]
        [--json bench/results/vitbit_gemm_autochoice.json]
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


def run(label: str, x_dtypes: list[str]) -> list[dict]:
    rows = []
    for i, (k, n) in enumerate(SHAPES):
        rng = np.random.default_rng(i)
        p = VitBitWeights.pack(rng.integers(-127, 128, (n, k), dtype=np.int8),
                               rng.uniform(1e-3, 1e-2, n).astype(np.float32), 8,
                               bias=rng.standard_normal(n).astype(np.float32), x_scale=0.02)
        p8 = VitBitWeights.pack(p.w_q(), p.w_scale, 8, bias=p.bias, x_scale=p.x_scale, y_dtype="float16")
        for m in MS:
            for xd in x_dtypes:
                meas = measure_vs_dense(p8 if xd == "int8" else p, m, xd)
                kernel, _ = decide_measured(meas)
                rows.append({"ctx": label, "K": k, "N": n, "M": m, **meas, "choice": kernel if kernel != "none"
                             else meas["dense"], "vitbit_vs_dense": meas["dense_us"] / meas["vitbit_us"]})
                r = rows[-1]
                print(f"{label:7s} {k:5d}x{n:<5d} M={m:5d} X {xd:7s}: vitbit {r['vitbit_us']:8.2f}  dense "
                      f"{r['dense_us']:8.2f} ({r['dense']})  -> {r['choice']} ({r['vitbit_vs_dense']:.2f}x)", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--green", type=int, default=0, help="also run on a green context of this many SMs")
    ap.add_argument("--x-dtypes", default="int8,float16", help="node inputs to time: int8 and/or float16")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "vitbit_gemm_autochoice.json")
    args = ap.parse_args(argv)
    x_dtypes = [d for d in args.x_dtypes.split(",") if d]
    _cuda.init()
    facts = _cuda.device_facts()
    rows = run("full", x_dtypes)
    if args.green:
        with _cuda.in_green_context(args.green) as sms:
            rows += run(f"green{sms}", x_dtypes)
    from bench._common import meta, write_json

    info = meta({"tool": "tools/vitbit_gemm_autochoice.py", "gpu": facts, "margin": MEASURE_MARGIN,
                 "method": "edgesdk.kernels.vitbit_gemm.measure_vs_dense (CUDA graph of >= 16 launches over operand "
                           "copies rotated beyond 2x L2, median of 6 replays); decision by decide_measured"})
    print(f"wrote {write_json(args.json, rows, info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
