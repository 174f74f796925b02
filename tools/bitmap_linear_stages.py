#!/usr/bin/env python3
"""Deeper rings for the X-staged decode kernel (exploration, session 11): right-sized ring slots.

The ablation (``tools/bitmap_linear_ablate.py``) showed that tactic 1 is slower than both its copy
pipeline alone and its compute alone: too little in flight per warp to overlap them. A ring slot holds
a full group's worth of values (512 · itemsize bytes per strip) although a pruned layer's largest group
is far smaller; the ``_xv`` builds take the value area per strip as an argument (VBR = the layer's largest
group, from the offsets), so 4, 6 or 8 stages fit where 3 did. Here each ``_xv`` stage count runs with
tactic 60's (K splits, strip pairs per block) wherever it keeps tactic 60's blocks per SM; cuBLAS fp16,
tactic 1 and tactic 60 side by side, every output checked against float64 with NaN-poisoned Y first.

Timing as ``tools/bitmap_linear_explore.py`` (CUDA graphs over operand copies rotated beyond 2 × L2, median
of 10 replays; ``--rounds R``: the list timed R times in turn, median of the R medians).

Usage: python tools/bitmap_linear_stages.py [--shapes 4096x4096,...] [--m 1,16] [--cases float16:0.5,...]
       [--stages 4,6,8] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import meta, time_graph  # noqa: E402
from bench.bench_bitmap_linear import _copies, random_packed  # noqa: E402


def _pack(job):
    return job, random_packed(*job)


def vbr_bytes(p) -> int:
    """The layer's largest strip-group of values in bytes (a multiple of 16 by the format's padding)."""
    off = np.asarray(p.offsets, dtype=np.int64)
    v = int(np.diff(off).max()) * np.dtype(p.value_dtype).itemsize
    return max(16, -(-v // 16) * 16)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096,4096x11008,11008x4096,2048x5632,5632x2048,896x4864,4864x896")
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--cases", default="float16:0.5,float16:0.7,int8:0.5", help="value dtype:sparsity, ...")
    ap.add_argument("--stages", default="4,6,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    from concurrent.futures import ProcessPoolExecutor

    import torch

    from edgesdk.formats import bitmap_linear as fmt
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import bitmap_linear as kbl

    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    ms = [int(v) for v in a.m.split(",")]
    cases = [(c.split(":")[0], float(c.split(":")[1])) for c in a.cases.split(",")]
    stages = [int(v) for v in a.stages.split(",")]
    jobs = [(k, n, s, vd, 7 * i + int(10 * s)) for i, (k, n) in enumerate(shapes) for vd, s in cases]
    with ProcessPoolExecutor(12) as ex:
        packed = {j[:4]: p for j, p in ex.map(_pack, jobs)}
    torch.zeros(1, device="cuda")
    _cuda.init()
    ctx = _cuda.current_context()
    sms, smem_sm = kbl._sm_count(ctx), kbl._smem_per_sm(ctx)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    cu = _cuda._driver()
    carve = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    info = meta({"tool": "bitmap_linear_stages", "rounds": a.rounds, "stages": stages})
    rows = []

    def write():
        if a.json:
            tmp = a.json.with_suffix(".tmp")
            tmp.write_text(json.dumps({"meta": info, "method": "CUDA graphs over operand copies rotated beyond "
                                       "2 x L2, median of 10 replays, median over rounds; every output checked "
                                       "against float64 (NaN-poisoned Y) first", "rows": rows}, indent=1))
            tmp.replace(a.json)

    def xv_plan(c60, vd, m, st, vbr):
        """The _xv kernel at st stages with tactic 60's (ks, pb, grid), or None if it would lose blocks per SM."""
        mb = 1 if m <= 8 else 2
        warps = c60["block"][0] // 32
        slot60 = c60["smem"] // warps
        slot = st * (2 * (fmt.TILES_PER_GROUP * 8 + vbr + 16) + 1024 * mb) + kbl._DEC_SCRATCH
        bps = lambda sl: min(kbl._MAX_WARPS // warps, smem_sm // (warps * sl + kbl._BLOCK_RESERVED_SMEM))  # noqa: E731
        if warps * slot > kbl._SMEM_LIMIT or bps(slot) < bps(slot60):
            return None
        name = f"bitmap_dec_{kbl._V[vd][0]}_mb{mb}_s{st}_xv"
        kern = _cuda.get_kernel(kbl.SOURCE, name)
        _cuda.check(cu.cuFuncSetAttribute(kern.function, carve, 100))
        slots, addr = _cuda.ArgBlock.pointer_slots(7)
        args = _cuda.ArgBlock([*addr, *(ctypes.c_int(v) for v in (m, c60["n"], c60["k"], c60["ks"], c60["spb"], vbr))],
                              slots)
        return name, kern.plan(c60["grid"], c60["block"], args, warps * slot), bps(slot)

    for (k, n) in shapes:
        nd = _copies(fmt.dense_fp16_bytes(n, k), l2)
        w0 = torch.randn(n, k, device="cuda", dtype=torch.float16)
        wd = [w0] + [w0.clone() for _ in range(nd - 1)]
        for vd, s in cases:
            p = packed[(k, n, s, vd)]
            vbr = vbr_bytes(p)
            base = [torch.from_numpy(v).cuda() for v in p.to_tensors().values()]
            nc = _copies(p.nbytes, l2)
            copies = [base] + [[t.clone() for t in base] for _ in range(nc - 1)]
            attrs = p.node_attributes()
            wq = torch.from_numpy(p.raw_values().astype(np.float64)).cuda()
            sc = torch.from_numpy(p.scales.astype(np.float64)).cuda()
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                y = torch.empty(m, n, device="cuda", dtype=torch.float16)
                xd = x.double()
                ref = (xd @ wq.T) * sc
                tol = 2.0**-10 * ref.abs() + 2.0**-16 * (xd.abs() @ wq.abs().T) * sc + 2.0**-24
                c60 = dict(kbl.config(n, k, m, "float16", vd, 60, sms, True, smem_sm), n=n, k=k)
                row = {"K": k, "N": n, "M": m, "sparsity": s, "vd": vd, "bytes": p.nbytes, "vbr": vbr,
                       "cfg60": f"ks{c60['ks']} pb{c60['spb']} g{c60['grid'][0]} smem{c60['smem']}",
                       "cfg1": kbl.config(n, k, m, "float16", vd, 1, sms, True, smem_sm)["name"]}

                def tac(t):
                    def f(cc):
                        kbl.launch(attrs, "float16", m, [x.data_ptr(), *[q.data_ptr() for q in cc]], [y.data_ptr()],
                                   torch.cuda.current_stream().cuda_stream, t)
                    return f

                variants = {"t1": tac(1), "t60": tac(60)}
                for st in stages:
                    pl = xv_plan(c60, vd, m, st, vbr)
                    if pl is None:
                        continue
                    name, plan, bps = pl
                    row[f"xv{st}_bps"] = bps

                    def f(cc, plan=plan):
                        plan.args.set_pointers(x.data_ptr(), *[q.data_ptr() for q in cc], 0, y.data_ptr())
                        _cuda.launch_all((plan,), torch.cuda.current_stream().cuda_stream)
                    variants[f"xv{st}"] = f
                for nm, f in variants.items():  # exactness first, NaN-poisoned output
                    y.fill_(float("nan"))
                    f(copies[0])
                    torch.cuda.synchronize()
                    bad = int((~((y.double() - ref).abs() <= tol)).sum())
                    if bad:
                        row[f"bad_{nm}"] = bad
                it = [0]

                def dense():
                    torch.mm(x, wd[it[0] % nd].t(), out=y)
                    it[0] += 1

                ts = {nm: [] for nm in ["cublas", *variants]}
                for _ in range(a.rounds):
                    ts["cublas"].append(time_graph(dense, inner=nd, reps=10))
                    for nm, f in variants.items():
                        j = [0]

                        def ours(f=f):
                            f(copies[j[0] % nc])
                            j[0] += 1

                        ts[nm].append(time_graph(ours, inner=nc, reps=10))
                for nm, v in ts.items():
                    row[nm] = round(float(np.median(v)), 3)
                    row[f"{nm}_speedup"] = round(row["cublas"] / row[nm], 3)
                # the timed graphs ran: the last variant's graph left its (exact) output in y
                torch.cuda.synchronize()
                row["last_timed_output_ok"] = bool(((y.double() - ref).abs() <= tol).all())
                rows.append(row)
                print(json.dumps(row), flush=True)
                write()
            copies = base = wq = None
        wd = w0 = None
        torch.cuda.empty_cache()
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
