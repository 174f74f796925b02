#!/usr/bin/env python3
"""Exploration (not SDK): keep a fraction of a layer's rows dense and stream them *beside* the bitmap
decode kernel, so that DRAM and the SM's integer pipe work at the same time.

Why: EdgeBitmapLinear's decode path is bound by instruction issue and latency (about 7 weights per
SM-clock on the H100, docs/bitmap_linear.md), while a dense GEMV is bound by DRAM. At 70 % sparsity
the bitmap kernel moves 0.37 of the dense bytes but takes 0.82 of cuBLAS's time, so DRAM idles. If
rows [0, N_d) stay dense fp16 (or int8 with per-row scales) and a small dense-GEMV kernel
(``tools/bitmap_mix_explore.cu``: 128 threads, <= 64 registers, no shared memory) streams them on a
second stream while tactic 1 decodes rows [N_d, N), the call could take max(decode of the sparse
rows, bytes of everything) instead of the decode of all rows.

Per layer, M, value type/sparsity and dense fraction alpha (N_d = alpha N rounded to 16 rows), one
run, CUDA graphs, operand copies rotated beyond 2 x L2, medians, every output checked against float64
first (outputs NaN-poisoned):

  cublas      torch.mm fp16 of the whole layer (the benchmark's baseline)
  bitmap      tactic 1 on the whole layer (alpha = 0)
  bpart       tactic 1 on rows [N_d, N) alone
  dpart       the dense kernel on rows [0, N_d) alone
  seq         bpart then dpart on one stream
  conc        bpart and dpart forked onto two streams of one graph (join after each call)
  dense_all   the dense kernel on the whole layer (its bandwidth against cuBLAS)

Usage (GPU): python tools/bitmap_mix_explore.py [--layers 4096x4096,...] [--ms 1,4] [--alphas ...]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SRC = ROOT / "tools" / "bitmap_mix_explore.cu"
LAYERS = [(4096, 4096), (4096, 11008), (11008, 4096), (2048, 5632), (5632, 2048)]  # (K, N)
CASES = [("float16", 0.5), ("float16", 0.7), ("int8", 0.5)]


def _split(job):
    """Pack rows [nd, n) of the pruned random W; the dense rows' stored values and scales."""
    from edgesdk.formats import bitmap_linear as fmt

    k, n, vd, s, nds, seed = job
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k), dtype=np.float32)
    w[rng.random((n, k), dtype=np.float32) < s] = 0
    full = fmt.BitmapLinearWeights.pack(w, vd)
    raw = full.raw_values().astype(np.float32)  # fp16 and int8 values are exact in fp32
    out = {}
    for nd in nds:
        part = fmt.BitmapLinearWeights.pack(w[nd:], vd) if nd < n else None
        dense = raw[:nd].astype(np.float16 if vd == "float16" else np.int8)
        out[nd] = (None if part is None else (part.node_attributes(), part.to_tensors(), part.nbytes),
                   dense, full.scales[:nd].copy())
    return (k, n, vd, s), raw, full.scales.copy(), full.nbytes, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default=",".join(f"{k}x{n}" for k, n in LAYERS))
    ap.add_argument("--ms", default="1,4")
    ap.add_argument("--alphas", default="0,0.125,0.25,0.375,0.5")
    ap.add_argument("--dense-blocks", type=int, default=1, help="dense-kernel blocks per SM (128 threads each)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import torch

    import bench.bench_bitmap_linear as bbl
    from bench._common import git_commit, meta, print_table, write_json
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import bitmap_linear as kbl

    layers = [tuple(int(v) for v in s.split("x")) for s in args.layers.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    alphas = [float(v) for v in args.alphas.split(",")]
    torch.zeros(1, device="cuda")
    _cuda.init()
    props = torch.cuda.get_device_properties(0)
    sms, l2 = props.multi_processor_count, props.L2_cache_size
    jobs = []
    for i, (k, n) in enumerate(layers):
        nds = sorted({min(n, 16 * round(a * n / 16)) for a in alphas})
        for vd, s in CASES:
            jobs.append((k, n, vd, s, nds, 7000 + 31 * i + int(10 * s) + (vd == "int8")))
    with ProcessPoolExecutor(12) as ex:
        packed = {r[0]: r[1:] for r in ex.map(_split, jobs)}
    print(f"packed {len(packed)} layer cases", flush=True)

    rows = []
    s0, s1 = torch.cuda.Stream(), torch.cuda.Stream()

    def gtime(fn, inner, reps=10):
        """median µs per fn(i) call; fn forks onto s1 itself where it wants to."""
        with torch.cuda.stream(s0):
            for i in range(2):
                fn(i)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s0):
                for i in range(inner):
                    fn(i)
            g.replay()
            torch.cuda.synchronize()
            ts = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(s0)
                g.replay()
                b.record(s0)
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1000.0 / inner)
        del g
        return statistics.median(ts)

    for (k, n) in layers:
        dense_fp16 = n * k * 2
        nd_cub = bbl._copies(dense_fp16, l2)
        wd = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(nd_cub)]
        for vd, s in CASES:
            raw, scales_full, full_nbytes, splits = packed[(k, n, vd, s)]
            itemsize = 2 if vd == "float16" else 1
            for m in ms:
                x_np = np.random.default_rng(k + m).uniform(-1, 1, (m, k)).astype(np.float16)
                ref = (x_np.astype(np.float64) @ raw.T) * scales_full.astype(np.float64)
                x = torch.from_numpy(x_np).cuda()
                y = torch.empty(m, n, device="cuda", dtype=torch.float16)
                kname = f"mix_dense_{'f16' if vd == 'float16' else 'i8'}_m{m}_u{8 if m == 1 else 4}"
                kd = _cuda.get_kernel(SRC, kname)
                it = [0]

                def cub(i):
                    torch.mm(x, wd[i % nd_cub].t(), out=y)

                t_cub = gtime(cub, nd_cub)
                # the dense kernel over the whole layer (its bandwidth)
                wall = torch.from_numpy(raw.astype(np.float16 if vd == "float16" else np.int8)).cuda()
                nda = bbl._copies(wall.numel() * itemsize, l2)
                walls = [wall] + [wall.clone() for _ in range(nda - 1)]
                sc_all = torch.from_numpy(scales_full).cuda()

                def dense_launch(wlist, sc, rows_, yptr, st, i):
                    kd.launch((sms * args.dense_blocks,), (128,),
                              [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(wlist[i % len(wlist)].data_ptr()),
                               ctypes.c_void_p(sc.data_ptr()), ctypes.c_void_p(yptr), ctypes.c_int(rows_),
                               ctypes.c_int(k), ctypes.c_int(n)], st)

                y.fill_(float("nan"))
                dense_launch(walls, sc_all, n, y.data_ptr(), torch.cuda.current_stream().cuda_stream, 0)
                torch.cuda.synchronize()
                err_all = float(np.abs(y.double().cpu().numpy() - ref).max() / np.abs(ref).max())
                t_dall = gtime(lambda i: dense_launch(walls, sc_all, n, y.data_ptr(), s0.cuda_stream, i), nda)
                walls = wall = None
                bitmap_full_us = None
                for nd in sorted(splits):
                    part, dense, sc_d = splits[nd]
                    nb = n - nd
                    yb = torch.empty(m, max(nb, 1), device="cuda", dtype=torch.float16)
                    if part is not None:
                        attrs, tens, pbytes = part
                        base = [torch.from_numpy(v).cuda() for v in tens.values()]
                        ncp = bbl._copies(pbytes, l2)
                        pcopies = [base] + [[t.clone() for t in base] for _ in range(ncp - 1)]
                    else:
                        pbytes, ncp, pcopies = 0, 1, None
                    dbytes = nd * k * itemsize
                    if nd:
                        dbase = torch.from_numpy(dense).cuda()
                        ndc = bbl._copies(dbytes, l2)
                        dcopies = [dbase] + [dbase.clone() for _ in range(ndc - 1)]
                        scd = torch.from_numpy(sc_d).cuda()
                    else:
                        ndc, dcopies = 1, None

                    def bl(st, i):
                        if pcopies is not None:
                            c = pcopies[i % ncp]
                            kbl.launch(attrs, "float16", m, [x.data_ptr(), *[t.data_ptr() for t in c]],
                                       [yb.data_ptr()], st, 1)

                    def dl(st, i):
                        if dcopies is not None:
                            dense_launch(dcopies, scd, nd, y.data_ptr(), st, i)

                    # check both parts (poisoned outputs)
                    y.fill_(float("nan"))
                    yb.fill_(float("nan"))
                    st = torch.cuda.current_stream().cuda_stream
                    bl(st, 0)
                    dl(st, 0)
                    torch.cuda.synchronize()
                    amax = np.abs(ref).max()
                    err = 0.0
                    if nd:
                        err = max(err, float(np.abs(y[:, :nd].double().cpu().numpy() - ref[:, :nd]).max() / amax))
                    if nb:
                        err = max(err, float(np.abs(yb[:, :nb].double().cpu().numpy() - ref[:, nd:]).max() / amax))
                    assert err < 2e-3, f"check failed {k}x{n} {vd} {s} M={m} nd={nd}: {err}"
                    inner = max(ncp, ndc)

                    def conc(i):
                        s1.wait_stream(s0)
                        bl(s0.cuda_stream, i)
                        dl(s1.cuda_stream, i)
                        s0.wait_stream(s1)

                    t_b = gtime(lambda i: bl(s0.cuda_stream, i), inner) if nb else 0.0
                    t_d = gtime(lambda i: dl(s0.cuda_stream, i), inner) if nd else 0.0
                    t_seq = gtime(lambda i: (bl(s0.cuda_stream, i), dl(s0.cuda_stream, i)), inner)
                    t_conc = gtime(conc, inner) if nd and nb else t_seq
                    if nd == 0:
                        bitmap_full_us = t_b
                    tot = pbytes + dbytes + nd * 4
                    rows.append({"K": k, "N": n, "M": m, "values": vd, "sparsity": s, "alpha": round(nd / n, 4),
                                 "nd": nd, "cublas_us": t_cub, "dense_all_us": t_dall, "dense_all_err": err_all,
                                 "bitmap_us": bitmap_full_us, "bpart_us": t_b, "dpart_us": t_d, "seq_us": t_seq,
                                 "conc_us": t_conc, "bytes": tot, "GBps_conc": tot / t_conc / 1e3,
                                 "speedup_conc": t_cub / t_conc, "speedup_bitmap": t_cub / bitmap_full_us,
                                 "conc_vs_bitmap": bitmap_full_us / t_conc, "max_rel_err": err})
                    print(f"{k}x{n} M={m} {vd} {s} a={nd / n:.3f}: cublas {t_cub:.1f} bitmap {bitmap_full_us:.1f} "
                          f"b {t_b:.1f} d {t_d:.1f} seq {t_seq:.1f} conc {t_conc:.1f} -> {t_cub / t_conc:.2f}x "
                          f"(bitmap alone {t_cub / bitmap_full_us:.2f}x; dense_all {t_dall:.1f})", flush=True)
                    pcopies = dcopies = None
                torch.cuda.empty_cache()
        wd = None
        torch.cuda.empty_cache()

    # best alpha per (layer, M, case)
    best = {}
    for r in rows:
        key = (r["K"], r["N"], r["M"], r["values"], r["sparsity"])
        if key not in best or r["conc_us"] < best[key]["conc_us"]:
            best[key] = r
    summary = []
    for (vd, s) in CASES:
        for m in ms:
            sel = [b for kk, b in best.items() if kk[3] == vd and kk[4] == s and kk[2] == m]
            if sel:
                summary.append({"values": vd, "sparsity": s, "M": m,
                                "bitmap_median": statistics.median(b["speedup_bitmap"] for b in sel),
                                "best_conc_median": statistics.median(b["speedup_conc"] for b in sel),
                                "best_alpha": ",".join(f"{b['alpha']:.2f}" for b in sel)})
    print_table(summary, list(summary[0]))
    out = args.out or ROOT / "bench" / "results" / f"bitmap_mix_explore_{git_commit()}.json"
    write_json(out, rows, meta({"tool": "tools/bitmap_mix_explore.py", "summary": summary,
                                "dense_blocks_per_sm": args.dense_blocks}))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
