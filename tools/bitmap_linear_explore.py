#!/usr/bin/env python3
"""Side-by-side timing of EdgeBitmapLinear tactics vs cuBLAS fp16 on a few decode shapes (exploration).

Same method as ``bench/bench_bitmap_linear.py`` (CUDA graphs over weight copies rotated beyond 2× L2,
median of 10 replays), but every tactic is reported, so kernel variants can be compared in one run.
Each (shape, sparsity, value dtype) is also checked against the float64 reference (outputs poisoned
with NaN) for every tactic at the largest M before it is timed.

Usage: python tools/bitmap_linear_explore.py [--shapes 4096x4096,...] [--m 1,8,16] [--s 0.5]
       [--vd float16,int8] [--tactics 1,22,40] [--rounds R] [--json out.json]
--rounds R times the tactics R times in turn (1, 2, ..., 1, 2, ...) and keeps the median of the R medians
(field t<tactic>; the R medians in r<tactic>), so that slow drifts of the clock hit every tactic alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import meta, time_graph  # noqa: E402
from bench.bench_bitmap_linear import _copies, random_packed  # noqa: E402
from edgesdk.formats import bitmap_linear as fmt  # noqa: E402


def _pack(job):
    return job, random_packed(*job)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096,4096x11008,11008x4096")
    ap.add_argument("--m", default="1,8,16")
    ap.add_argument("--s", default="0.5")
    ap.add_argument("--vd", default="float16,int8")
    ap.add_argument("--tactics", default="1,20,22,27,40,41,44,45,46")
    ap.add_argument("--xs-grid", action="store_true",
                    help="also time the X-staged 16-warp kernel at every (K splits, strip pairs per block) with <= 16 "
                         "warps, as temporary tactics 400+ (the launcher's XS_TACTICS table, extended for this run)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    from concurrent.futures import ProcessPoolExecutor

    import torch

    from edgesdk.kernels import _cuda
    from edgesdk.kernels import bitmap_linear as kbl

    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    ms = [int(v) for v in a.m.split(",")]
    sps = [float(v) for v in a.s.split(",")]
    vds = a.vd.split(",")
    tactics = [int(v) for v in a.tactics.split(",")]
    grid = {}
    if a.xs_grid:  # temporary fixed tactics of the X-staged kernel: K splits x strip pairs per block
        for ks in (1, 2, 3, 4, 6, 8, 12, 16):
            for pb in (1, 2, 4, 8):
                if ks * pb <= 16:
                    grid[400 + len(grid)] = (ks, pb)
        kbl.XS_TACTICS.update(grid)
        tactics += list(grid)
    jobs = [(k, n, s, vd, 7 * i + int(10 * s)) for i, (k, n) in enumerate(shapes) for s in sps for vd in vds]
    with ProcessPoolExecutor(12) as ex:
        packed = {j[:4]: p for j, p in ex.map(_pack, jobs)}
    torch.zeros(1, device="cuda")
    _cuda.init()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for (k, n) in shapes:
        nd = _copies(fmt.dense_fp16_bytes(n, k), l2)
        w0 = torch.randn(n, k, device="cuda", dtype=torch.float16)
        wd = [w0] + [w0.clone() for _ in range(nd - 1)]
        for s in sps:
            for vd in vds:
                p = packed[(k, n, s, vd)]
                base = [torch.from_numpy(v).cuda() for v in p.to_tensors().values()]
                nc = _copies(p.nbytes, l2)
                copies = [base] + [[t.clone() for t in base] for _ in range(nc - 1)]
                attrs = p.node_attributes()
                # float64 reference and tolerance on the GPU (same formula as reference.bitmap_linear)
                wq = torch.from_numpy(p.raw_values().astype(np.float64)).cuda()
                sc = torch.from_numpy(p.scales.astype(np.float64)).cuda()
                for m in ms:
                    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                    y = torch.empty(m, n, device="cuda", dtype=torch.float16)
                    it = [0]

                    def dense():
                        torch.mm(x, wd[it[0] % nd].t(), out=y)
                        it[0] += 1

                    td = time_graph(dense, inner=nd, reps=10)
                    row = {"K": k, "N": n, "M": m, "sparsity": s, "vd": vd, "cublas_us": td, "bytes": p.nbytes}
                    xd = x.double()
                    ref = (xd @ wq.T) * sc
                    tol = 2.0**-10 * ref.abs() + 2.0**-16 * (xd.abs() @ wq.abs().T) * sc + 2.0**-24
                    ts = {tac: [] for tac in tactics}
                    for tac in [t for _ in range(a.rounds) for t in tactics]:
                        c = kbl.config(n, k, m, "float16", vd, tac, 132)
                        y.fill_(float("nan"))
                        kbl.launch(attrs, "float16", m, [x.data_ptr(), *[t.data_ptr() for t in copies[0]]],
                                   [y.data_ptr()], torch.cuda.current_stream().cuda_stream, tac)
                        torch.cuda.synchronize()
                        bad = int((~((y.double() - ref).abs() <= tol)).sum())
                        j = [0]

                        def ours(tac=tac):
                            cc = copies[j[0] % nc]
                            kbl.launch(attrs, "float16", m, [x.data_ptr(), *[t.data_ptr() for t in cc]],
                                       [y.data_ptr()], torch.cuda.current_stream().cuda_stream, tac)
                            j[0] += 1

                        ts[tac].append(time_graph(ours, inner=nc, reps=10))
                        t = float(np.median(ts[tac]))
                        row[f"t{tac}"] = round(t, 2)
                        if a.rounds > 1:
                            row[f"r{tac}"] = [round(v, 2) for v in ts[tac]]
                        row[f"x{tac}"] = round(td / t, 3)
                        row[f"cfg{tac}"] = (f"{c['name'].replace('bitmap_', '')} g{c['grid'][0]} w{c['block'][0] // 32}"
                                            + (f" ks{c['ks']} pb{c['spb']}" if "ks" in c else ""))
                        if bad:
                            row[f"bad{tac}"] = bad
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                copies = wq = None
        wd = None
        torch.cuda.empty_cache()
    if a.json:
        a.json.write_text(json.dumps({"meta": meta({"tool": "bitmap_linear_explore", "rounds": a.rounds, "xs_grid": {
            str(t): list(v) for t, v in grid.items()}}), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
