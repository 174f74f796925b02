#!/usr/bin/env python3
"""Round 8 of EdgeBitmapLinear: the CUDA-core row-walk kernel (``bitmap_rows_*``) side by side with
cuBLAS fp16 and the decode path's tactic 1, for M ≤ 4 (exploration; same method as
``tools/bitmap_linear_explore.py``: CUDA graphs over weight copies rotated beyond 2× L2, medians, the
kernels timed in turn ``--rounds`` times and the median of the medians kept).

Every configuration of ``ROWS_CONFIGS`` (that fits) and the launcher's heuristic are timed; each is first
checked against the float64 reference with outputs poisoned (field ``bad_*``: elements outside tolerance).

Usage: python tools/bitmap_rows_explore.py [--shapes 4096x4096,...] [--m 1,2,4] [--s 0.3,0.5,0.7]
       [--vd float16,int8] [--rounds 2] [--json out.json]
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
from edgesdk.errors import EdgeSDKError  # noqa: E402
from edgesdk.formats import bitmap_linear as fmt  # noqa: E402

LLM = "4096x4096,4096x11008,11008x4096,2048x5632,5632x2048,896x4864,4864x896,576x1536,1536x576"


def _pack(job):
    p = random_packed(*job)
    return job, p, fmt.row_layout(p)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=LLM, help="KxN,...")
    ap.add_argument("--m", default="1,2,4")
    ap.add_argument("--s", default="0.3,0.5,0.7")
    ap.add_argument("--vd", default="float16,int8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ablate", action="store_true",
                    help="also time the heuristic configuration built with EDGESDK_ROWS_ABLATE=1, 2, 3 (wrong results, "
                         "timing only: coalesced values, no X load, no bit walk)")
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
    jobs = [(k, n, s, vd, 7 * i + int(10 * s)) for i, (k, n) in enumerate(shapes) for s in sps for vd in vds]
    with ProcessPoolExecutor(12) as ex:
        packed = {j[:4]: (p, r) for j, p, r in ex.map(_pack, jobs)}
    torch.zeros(1, device="cuda")
    _cuda.init()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    rows = []
    for (k, n) in shapes:
        nd = _copies(fmt.dense_fp16_bytes(n, k), l2)
        w0 = torch.randn(n, k, device="cuda", dtype=torch.float16)
        wd = [w0] + [w0.clone() for _ in range(nd - 1)]
        for s in sps:
            for vd in vds:
                p, lay = packed[(k, n, s, vd)]
                base = [torch.from_numpy(v).cuda() for v in p.to_tensors().values()]
                nc = _copies(p.nbytes, l2)
                copies = [base] + [[t.clone() for t in base] for _ in range(nc - 1)]
                rbase = [torch.from_numpy(np.ascontiguousarray(v)).cuda() for v in lay.tensors()]
                nr = _copies(lay.nbytes, l2)
                rcopies = [rbase] + [[t.clone() for t in rbase] for _ in range(nr - 1)]
                attrs = p.node_attributes()
                wq = torch.from_numpy(p.raw_values().astype(np.float64)).cuda()
                sc = torch.from_numpy(p.scales.astype(np.float64)).cuda()
                for m in ms:
                    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                    y = torch.empty(m, n, device="cuda", dtype=torch.float16)
                    xd = x.double()
                    ref = (xd @ wq.T) * sc
                    tol = 2.0**-10 * ref.abs() + 2.0**-16 * (xd.abs() @ wq.abs().T) * sc + 2.0**-24
                    row = {"K": k, "N": n, "M": m, "sparsity": s, "vd": vd, "bytes": p.nbytes,
                           "rows_bytes": lay.nbytes, "dense_bytes": fmt.dense_fp16_bytes(n, k)}
                    try:
                        heur = kbl.rows_config(n, k, m, vd, lay.nseg, sm_count=sms)
                    except EdgeSDKError:  # does not fit shared memory (K·M too large)
                        heur = None
                    cands = {"cublas": None, "t1": None}
                    if heur is not None:
                        row["heur"] = f"{heur['rpw']}x{heur['ks']}"
                        for rpw, ks in kbl.ROWS_CONFIGS:
                            if kbl.rows_smem(lay.nw, m, rpw, ks) <= kbl._SMEM_LIMIT:
                                cands[f"r{rpw}x{ks}"] = (rpw, ks)
                        if a.ablate:
                            cfg = (32, 16) if "r32x16" in cands else (heur["rpw"], heur["ks"])
                            row["ablate_cfg"] = f"{cfg[0]}x{cfg[1]}"
                            for ab in (1, 2, 3):
                                cands[f"a{ab}"] = cfg
                    it = [0]

                    def call(name, i):
                        if name == "cublas":
                            torch.mm(x, wd[i % nd].t(), out=y)
                        elif name == "t1":
                            cc = copies[i % nc]
                            kbl.launch(attrs, "float16", m, [x.data_ptr(), *[t.data_ptr() for t in cc]],
                                       [y.data_ptr()], stream(), 1)
                        else:
                            cc = rcopies[i % nr]
                            opts = (f"-DEDGESDK_ROWS_ABLATE={name[1:]}",) if name.startswith("a") else ()
                            kbl.launch_rows(lay, m, [x.data_ptr(), *[t.data_ptr() for t in cc]], [y.data_ptr()],
                                            stream(), *cands[name], sm_count=sms, options=opts)

                    for name in cands:  # correctness first (poisoned output)
                        if name == "cublas" or name.startswith("a"):
                            continue
                        y.fill_(float("nan"))
                        call(name, 0)
                        torch.cuda.synchronize()
                        bad = int((~((y.double() - ref).abs() <= tol)).sum())
                        if bad:
                            row[f"bad_{name}"] = bad
                    ts = {name: [] for name in cands}
                    for _ in range(a.rounds):
                        for name in cands:
                            inner = nd if name == "cublas" else nc if name == "t1" else nr

                            def fn(name=name):
                                call(name, it[0])
                                it[0] += 1

                            ts[name].append(time_graph(fn, inner=inner, reps=10))
                    for name, v in ts.items():
                        row[f"{name}_us"] = round(float(np.median(v)), 2)
                    rk = [name for name in cands if name.startswith("r")]
                    if rk:
                        best = min(rk, key=lambda nm: row[f"{nm}_us"])
                        row["rows_best"] = best
                        row["rows_us"] = row[f"{best}_us"]
                        row["rows_heur_us"] = row[f"r{row['heur']}_us"] if f"r{row['heur']}" in cands else None
                        row["x_rows"] = round(row["cublas_us"] / row["rows_us"], 3)
                        row["x_t1"] = round(row["cublas_us"] / row["t1_us"], 3)
                        row["rows_gbps"] = round(lay.nbytes / row["rows_us"] / 1e3, 1)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                copies = rcopies = wq = None
        wd = None
        torch.cuda.empty_cache()
    if a.json:
        a.json.write_text(json.dumps({"meta": meta({"tool": "bitmap_rows_explore", "rounds": a.rounds}),
                                      "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
