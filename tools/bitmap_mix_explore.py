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
        part = fmt.BitmapLinearWeights.pack(w[nd:], vd)
        dense = raw[:nd].astype(np.float16 if vd == "float16" else np.int8)
        out[nd] = ((part.node_attributes(), part.to_tensors(), part.nbytes), dense, full.scales[:nd].copy())
    return (k, n, vd, s), raw, full.scales.copy(), full.nbytes, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default=",".join(f"{k}x{n}" for k, n in LAYERS))
    ap.add_argument("--ms", default="1,4")
    ap.add_argument("--alphas", default="0,0.0625,0.125,0.1875,0.25,0.375")
    ap.add_argument("--dense-blocks", type=int, default=1, help="dense-kernel blocks per SM (128 threads each)")
    ap.add_argument("--dense", choices=("reg", "stream"), default="stream",
                    help="dense-row kernel: reg (round 1: loads into registers) or stream (round 2: cp.async ring)")
    ap.add_argument("--tactics", default="1,60", help="EdgeBitmapLinear tactics for the sparse rows")
    ap.add_argument("--green", type=int, default=0,
                    help="run on a green context of this many SMs (cuBLAS, tactic 1/60 and the stream kernel; no "
                         "cuBLAS dense-row variant)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--groups", default="",
                    help="instead: dense groups inside the bitmap format, every E-th 64-column group of every strip "
                         "stored with all bits set (explicit zeros), comma-separated E values (0 = none), timed with "
                         "the X-staged kernel (tactic 60's configuration) and its _xsd build (dense-group path)")
    args = ap.parse_args(argv)
    if args.groups:
        return run_groups(args)
    if args.green:
        return run_green(args)

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
        nds = sorted({min(n - 16, 16 * round(a * n / 16)) for a in alphas})
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

    tactics = [int(t) for t in args.tactics.split(",")]
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
                amax = np.abs(ref).max()
                x = torch.from_numpy(x_np).cuda()
                y = torch.empty(m, n, device="cuda", dtype=torch.float16)
                vn = "f16" if vd == "float16" else "i8"
                if args.dense == "stream":
                    kd, dsmem = _cuda.get_kernel(SRC, f"mix_stream_{vn}_m{m}"), 4 * 6 * 4 * 512
                else:
                    kd, dsmem = _cuda.get_kernel(SRC, f"mix_dense_{vn}_m{m}_u{8 if m == 1 else 4}"), 0

                def cub(i):
                    torch.mm(x, wd[i % nd_cub].t(), out=y)

                t_cub = gtime(cub, nd_cub)
                wall = torch.from_numpy(raw.astype(np.float16 if vd == "float16" else np.int8)).cuda()
                nda = bbl._copies(wall.numel() * itemsize, l2)
                walls = [wall] + [wall.clone() for _ in range(nda - 1)]
                sc_all = torch.from_numpy(scales_full).cuda()

                def dense_launch(wlist, sc, rows_, yptr, st, i):
                    kd.launch((sms * args.dense_blocks,), (128,),
                              [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(wlist[i % len(wlist)].data_ptr()),
                               ctypes.c_void_p(sc.data_ptr()), ctypes.c_void_p(yptr), ctypes.c_int(rows_),
                               ctypes.c_int(k), ctypes.c_int(n)], st, dsmem)

                y.fill_(float("nan"))
                dense_launch(walls, sc_all, n, y.data_ptr(), torch.cuda.current_stream().cuda_stream, 0)
                torch.cuda.synchronize()
                err_all = float(np.abs(y.double().cpu().numpy() - ref).max() / amax)
                assert err_all < 2e-3, f"dense kernel check failed {k}x{n} {vd} M={m}: {err_all}"
                t_dall = gtime(lambda i: dense_launch(walls, sc_all, n, y.data_ptr(), s0.cuda_stream, i), nda)
                walls = wall = None
                full = {}
                for nd in sorted(splits):
                    part, dense, sc_d = splits[nd]
                    nb = n - nd
                    yb = torch.empty(m, max(nb, 1), device="cuda", dtype=torch.float16)
                    yd = torch.empty(m, max(nd, 1), device="cuda", dtype=torch.float16)
                    attrs, tens, pbytes = part
                    base = [torch.from_numpy(v).cuda() for v in tens.values()]
                    ncp = bbl._copies(pbytes, l2)
                    pcopies = [base] + [[t.clone() for t in base] for _ in range(ncp - 1)]
                    dbytes = nd * k * itemsize
                    ndc = bbl._copies(max(dbytes, 1), l2)
                    if nd:
                        dbase = torch.from_numpy(dense).cuda()
                        dcopies = [dbase] + [dbase.clone() for _ in range(ndc - 1)]
                        scd = torch.from_numpy(sc_d).cuda()
                        # the same rows through cuBLAS (fp16 rows only; a slice of the rotated dense copies)
                        wdp = [w[:nd] for w in wd] if vd == "float16" else None
                    inner = max(ncp, ndc)

                    def bl(st, i, tac):
                        c = pcopies[i % ncp]
                        kbl.launch(attrs, "float16", m, [x.data_ptr(), *[t.data_ptr() for t in c]],
                                   [yb.data_ptr()], st, tac)

                    def dl(st, i):
                        dense_launch(dcopies, scd, nd, y.data_ptr(), st, i)

                    def dcub(st, i):
                        torch.mm(x, wdp[i % nd_cub].t(), out=yd)  # on torch's current stream (set by caller)

                    # check both parts (poisoned outputs), every bitmap tactic
                    st = torch.cuda.current_stream().cuda_stream
                    err = 0.0
                    for tac in tactics:
                        y.fill_(float("nan"))
                        yb.fill_(float("nan"))
                        bl(st, 0, tac)
                        if nd:
                            dl(st, 0)
                        torch.cuda.synchronize()
                        if nd:
                            err = max(err, float(np.abs(y[:, :nd].double().cpu().numpy() - ref[:, :nd]).max() / amax))
                        err = max(err, float(np.abs(yb[:, :nb].double().cpu().numpy() - ref[:, nd:]).max() / amax))
                    assert err < 2e-3, f"check failed {k}x{n} {vd} {s} M={m} nd={nd}: {err}"

                    row = {"K": k, "N": n, "M": m, "values": vd, "sparsity": s, "alpha": round(nd / n, 4),
                           "nd": nd, "dense_kernel": args.dense, "cublas_us": t_cub, "dense_all_us": t_dall,
                           "bytes": pbytes + dbytes + 4 * nd, "max_rel_err": err}
                    if nd:
                        row["dpart_us"] = gtime(lambda i: dl(s0.cuda_stream, i), inner)
                        if wdp is not None:
                            row["dpart_cublas_us"] = gtime(lambda i: dcub(None, i), inner)
                    for tac in tactics:
                        row[f"b{tac}_us"] = gtime(lambda i, tac=tac: bl(s0.cuda_stream, i, tac), inner)
                        if nd == 0:
                            full[tac] = row[f"b{tac}_us"]
                            row[f"conc{tac}_us"] = row[f"b{tac}_us"]
                            continue

                        def conc(i, tac=tac):
                            s1.wait_stream(s0)
                            bl(s0.cuda_stream, i, tac)
                            dl(s1.cuda_stream, i)
                            s0.wait_stream(s1)

                        row[f"conc{tac}_us"] = gtime(conc, inner)
                        if wdp is not None and tac == tactics[-1]:
                            def concc(i, tac=tac):
                                s1.wait_stream(s0)
                                bl(s0.cuda_stream, i, tac)
                                with torch.cuda.stream(s1):
                                    dcub(None, i)
                                s0.wait_stream(s1)

                            row[f"conc{tac}_cublas_us"] = gtime(concc, inner)
                    for tac in tactics:
                        row[f"bitmap{tac}_us"] = full[tac]
                        row[f"speedup_conc{tac}"] = t_cub / row[f"conc{tac}_us"]
                        row[f"speedup_bitmap{tac}"] = t_cub / full[tac]
                    row["conc_us"] = min(row[f"conc{t}_us"] for t in tactics)
                    row["speedup_conc"] = t_cub / row["conc_us"]
                    row["speedup_bitmap"] = max(row[f"speedup_bitmap{t}"] for t in tactics)
                    rows.append(row)
                    print(" ".join(f"{kk}={v:.2f}" if isinstance(v, float) else f"{kk}={v}" for kk, v in row.items()
                                   if kk not in ("bytes", "dense_kernel")), flush=True)
                    pcopies = dcopies = wdp = None
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


def pack_dense_groups(w: np.ndarray, vd: str, every: int):
    """Format-v1 bytes of ``w`` in which every ``every``-th full 64-column group (0 = none) of every strip
    stores all 8 x 64 positions of its real rows (bits set for zeros too). The v1 invariant "bit set iff the
    value is nonzero" does not hold for those groups, so this bypasses the format's validation; the
    decode kernels read such groups correctly (a set bit with a zero value adds zero)."""
    from edgesdk.formats import bitmap_linear as fmt

    ref = fmt.BitmapLinearWeights.pack(w, vd)
    n, k = w.shape
    s, g = fmt.geometry(n, k)
    raw = ref.raw_values()
    vals = raw.astype(np.float16 if vd == "float16" else np.int8)
    padded = np.zeros((s * fmt.STRIP, g * fmt.GROUP_K), dtype=vals.dtype)
    padded[:n, :k] = vals
    real = np.zeros((s * fmt.STRIP, g * fmt.GROUP_K), dtype=bool)
    real[:n, :k] = True
    tiles = fmt._tile_view(padded, s, g)
    mask = tiles != 0
    if every:
        dg = np.zeros(g, dtype=bool)
        dg[::every] = True
        dg &= (np.arange(g) + 1) * fmt.GROUP_K <= k
        rt = fmt._tile_view(real, s, g)
        mask[:, dg] |= rt[:, dg]
    bitmaps = np.packbits(mask, axis=-1, bitorder="little").view("<u8").reshape(-1)
    counts = mask.reshape(s * g, -1).sum(axis=1, dtype=np.int64)
    a = fmt.value_align(vd)
    offsets = np.zeros(s * g + 1, dtype=np.int64)
    np.cumsum(-(-counts // a) * a, out=offsets[1:])
    values = np.zeros(int(offsets[-1]), dtype=vals.dtype)
    values[fmt._value_slots(offsets, counts)] = tiles[mask]
    return fmt.BitmapLinearWeights(n, k, vd, bitmaps, values, offsets.astype(np.int32), ref.scales.copy()), raw


def _groups_job(job):
    k, n, vd, s, evs, seed = job
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k), dtype=np.float32)
    w[rng.random((n, k), dtype=np.float32) < s] = 0
    out = {}
    raw = None
    for e in evs:
        p, raw = pack_dense_groups(w, vd, e)
        out[e] = (p.node_attributes(), p.to_tensors(), p.nbytes)
    return (k, n, vd, s), raw.astype(np.float32), out


def run_groups(args) -> int:
    """Dense groups inside the format, decoded by ldmatrix (``_xsd``) instead of the per-tile decode."""
    import torch

    import bench.bench_bitmap_linear as bbl
    from bench._common import git_commit, meta, print_table, write_json
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import bitmap_linear as kbl

    layers = [tuple(int(v) for v in s.split("x")) for s in args.layers.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    evs = [int(v) for v in args.groups.split(",")]
    torch.zeros(1, device="cuda")
    _cuda.init()
    cu = _cuda._driver()
    props = torch.cuda.get_device_properties(0)
    sms, l2 = props.multi_processor_count, props.L2_cache_size
    ctx = _cuda.current_context()
    smem_sm = kbl._smem_per_sm(ctx)
    jobs = [(k, n, vd, s, evs, 7000 + 31 * i + int(10 * s) + (vd == "int8"))
            for i, (k, n) in enumerate(layers) for vd, s in CASES]
    with ProcessPoolExecutor(12) as ex:
        packed = {r[0]: r[1:] for r in ex.map(_groups_job, jobs)}
    print(f"packed {len(packed)} layer cases", flush=True)
    timer = bbl.GraphTimer(cu, _cuda.check)
    st = torch.cuda.Stream()
    sti = st.cuda_stream
    rows = []
    for (k, n) in layers:
        nd_cub = bbl._copies(n * k * 2, l2)
        wd = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(nd_cub)]
        for vd, s in CASES:
            raw, parts = packed[(k, n, vd, s)]
            for m in ms:
                x_np = np.random.default_rng(k + m).uniform(-1, 1, (m, k)).astype(np.float16)
                ref = (x_np.astype(np.float64) @ raw.T) * parts[evs[0]][1]["scales"].astype(np.float64)
                amax = np.abs(ref).max()
                x = torch.from_numpy(x_np).cuda()
                y = torch.empty(m, n, device="cuda", dtype=torch.float16)
                it = [0]

                def cub():
                    torch.mm(x, wd[it[0] % nd_cub].t(), out=y)
                    it[0] += 1

                with torch.cuda.stream(st):
                    t_cub = timer(cub, sti, nd_cub)
                c = kbl.config(n, k, m, "float16", vd, kbl.XS_HEURISTIC, sms, True, smem_sm)
                kern = {v: _cuda.get_kernel(kbl.SOURCE, c["name"] + v) for v in ("", "d")}
                for kk in kern.values():
                    _cuda.check(cu.cuFuncSetAttribute(kk.function, cu.CUfunction_attribute.
                                                      CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100))
                for e in evs:
                    attrs, tens, nb = parts[e]
                    base = [torch.from_numpy(v).cuda() for v in tens.values()]
                    ncp = bbl._copies(nb, l2)
                    copies = [base] + [[t.clone() for t in base] for _ in range(ncp - 1)]
                    row = {"K": k, "N": n, "M": m, "values": vd, "sparsity": s, "every": e,
                           "dense_group_fraction": 0.0 if not e else len(range(0, k // 64, e)) / -(-k // 64),
                           "bytes": nb, "cublas_us": t_cub, "kernel": c["name"]}
                    variants = {"t1": None, "xs": kern[""], "xsd": kern["d"]}
                    for vname, kf in variants.items():
                        j = [0]

                        def launch(kf=kf, j=j):
                            cc = copies[j[0] % ncp]
                            if kf is None:
                                kbl.launch(attrs, "float16", m, [x.data_ptr(), *[t.data_ptr() for t in cc]],
                                           [y.data_ptr()], sti, 1)
                            else:
                                kf.launch(c["grid"], c["block"],
                                          [x.data_ptr(), *[t.data_ptr() for t in cc[:4]], 0, y.data_ptr(),
                                           ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k), ctypes.c_int(c["ks"]),
                                           ctypes.c_int(c["spb"])], sti, c["smem"])
                            j[0] += 1

                        y.fill_(float("nan"))
                        torch.cuda.synchronize()
                        launch()
                        _cuda.check(cu.cuStreamSynchronize(cu.CUstream(sti)))
                        err = float(np.abs(y.double().cpu().numpy() - ref).max() / amax)
                        assert err < 2e-3, f"groups check failed {k}x{n} {vd} {s} M={m} every={e} {vname}: {err}"
                        with torch.cuda.stream(st):
                            row[f"{vname}_us"] = timer(launch, sti, ncp)
                        row[f"{vname}_err"] = err
                    for vname in variants:
                        row[f"speedup_{vname}"] = t_cub / row[f"{vname}_us"]
                    rows.append(row)
                    print(f"{k}x{n} M={m} {vd} {s} every={e} ({row['dense_group_fraction']:.3f}): cublas {t_cub:.1f} "
                          f"t1 {row['t1_us']:.1f} xs {row['xs_us']:.1f} xsd {row['xsd_us']:.1f} -> "
                          f"{row['speedup_xsd']:.2f}x (t1 {row['speedup_t1']:.2f}x)", flush=True)
                    copies = None
                torch.cuda.empty_cache()
        wd = None
        torch.cuda.empty_cache()
    summary = []
    for vd, s in CASES:
        for m in ms:
            sel = [r for r in rows if r["values"] == vd and r["sparsity"] == s and r["M"] == m]
            for e in evs:
                se = [r for r in sel if r["every"] == e]
                if se:
                    summary.append({"values": vd, "sparsity": s, "M": m, "every": e,
                                    "t1": statistics.median(r["speedup_t1"] for r in se),
                                    "xs": statistics.median(r["speedup_xs"] for r in se),
                                    "xsd": statistics.median(r["speedup_xsd"] for r in se)})
    print_table(summary, list(summary[0]))
    out = args.out or ROOT / "bench" / "results" / f"bitmap_dense_groups_{git_commit()}.json"
    write_json(out, rows, meta({"tool": "tools/bitmap_mix_explore.py --groups", "summary": summary}))
    print(f"wrote {out}")
    return 0


def run_green(args) -> int:
    """The stream-kernel split on a green context (``--green SMS``): every timing by driver-API graph capture
    on a stream of that context; the concurrent variant forks onto a second stream with events."""
    import torch

    import bench.bench_bitmap_linear as bbl
    from bench._common import git_commit, meta, print_table, write_json
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import bitmap_linear as kbl

    layers = [tuple(int(v) for v in s.split("x")) for s in args.layers.split(",")]
    ms = [int(v) for v in args.ms.split(",")]
    alphas = [float(v) for v in args.alphas.split(",")]
    tactics = [int(t) for t in args.tactics.split(",")]
    torch.zeros(1, device="cuda")
    _cuda.init()
    cu, ck = _cuda._driver(), _cuda.check
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    prim = ck(cu.cuCtxGetCurrent())
    gctx, gsms = _cuda.green_context(args.green)
    ck(cu.cuCtxSetCurrent(gctx))
    s0, s1 = ck(cu.cuStreamCreate(1)), ck(cu.cuStreamCreate(1))
    ev0, ev1 = ck(cu.cuEventCreate(2)), ck(cu.cuEventCreate(2))  # CU_EVENT_DISABLE_TIMING
    ck(cu.cuCtxSetCurrent(prim))
    s0i, s1i = int(s0), int(s1)
    timer = bbl.GraphTimer(cu, ck)
    jobs = []
    for i, (k, n) in enumerate(layers):
        nds = sorted({min(n - 16, 16 * round(a * n / 16)) for a in alphas})
        for vd, s in CASES:
            jobs.append((k, n, vd, s, nds, 7000 + 31 * i + int(10 * s) + (vd == "int8")))
    with ProcessPoolExecutor(12) as ex:
        packed = {r[0]: r[1:] for r in ex.map(_split, jobs)}
    rows = []

    def in_green(fn):
        def run():
            ck(cu.cuCtxSetCurrent(gctx))
            try:
                fn()
            finally:
                ck(cu.cuCtxSetCurrent(prim))
        return run

    for (k, n) in layers:
        nd_cub = bbl._copies(n * k * 2, l2)
        wd = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(nd_cub)]
        for vd, s in CASES:
            raw, scales_full, _, splits = packed[(k, n, vd, s)]
            itemsize = 2 if vd == "float16" else 1
            vn = "f16" if vd == "float16" else "i8"
            for m in ms:
                x_np = np.random.default_rng(k + m).uniform(-1, 1, (m, k)).astype(np.float16)
                ref = (x_np.astype(np.float64) @ raw.T) * scales_full.astype(np.float64)
                amax = np.abs(ref).max()
                x = torch.from_numpy(x_np).cuda()
                y = torch.empty(m, n, device="cuda", dtype=torch.float16)
                ck(cu.cuCtxSetCurrent(gctx))
                kd = _cuda.get_kernel(SRC, f"mix_stream_{vn}_m{m}")
                ck(cu.cuCtxSetCurrent(prim))
                it = [0]

                def cub():
                    torch.mm(x, wd[it[0] % nd_cub].t(), out=y)
                    it[0] += 1

                with torch.cuda.stream(torch.cuda.ExternalStream(s0i)):
                    t_cub = timer(cub, s0i, nd_cub)
                full = {}
                for nd in sorted(splits):
                    (attrs, tens, pbytes), dense, sc_d = splits[nd]
                    nb = n - nd
                    yb = torch.empty(m, nb, device="cuda", dtype=torch.float16)
                    base = [torch.from_numpy(v).cuda() for v in tens.values()]
                    ncp = bbl._copies(pbytes, l2)
                    pcopies = [base] + [[t.clone() for t in base] for _ in range(ncp - 1)]
                    dbytes = nd * k * itemsize
                    ndc = bbl._copies(max(dbytes, 1), l2)
                    if nd:
                        dbase = torch.from_numpy(dense).cuda()
                        dcopies = [dbase] + [dbase.clone() for _ in range(ndc - 1)]
                        scd = torch.from_numpy(sc_d).cuda()
                    inner = max(ncp, ndc)
                    cnt = [0]

                    def bl(st, tac):
                        c = pcopies[cnt[0] % ncp]
                        kbl.launch(attrs, "float16", m, [x.data_ptr(), *[t.data_ptr() for t in c]],
                                   [yb.data_ptr()], st, tac)

                    def dl(st):
                        kd.launch((gsms,), (128,), [ctypes.c_void_p(x.data_ptr()),
                                  ctypes.c_void_p(dcopies[cnt[0] % ndc].data_ptr()), ctypes.c_void_p(scd.data_ptr()),
                                  ctypes.c_void_p(y.data_ptr()), ctypes.c_int(nd), ctypes.c_int(k), ctypes.c_int(n)],
                                  st, 4 * 6 * 4 * 512)

                    err = 0.0
                    for tac in tactics:
                        y.fill_(float("nan"))
                        yb.fill_(float("nan"))
                        torch.cuda.synchronize()
                        in_green(lambda: (bl(s0i, tac), dl(s0i) if nd else None))()
                        ck(cu.cuStreamSynchronize(s0))
                        if nd:
                            err = max(err, float(np.abs(y[:, :nd].double().cpu().numpy() - ref[:, :nd]).max() / amax))
                        err = max(err, float(np.abs(yb.double().cpu().numpy() - ref[:, nd:]).max() / amax))
                    assert err < 2e-3, f"green check failed {k}x{n} {vd} {s} M={m} nd={nd}: {err}"
                    row = {"K": k, "N": n, "M": m, "values": vd, "sparsity": s, "alpha": round(nd / n, 4), "nd": nd,
                           "sms": gsms, "cublas_us": t_cub, "bytes": pbytes + dbytes + 4 * nd, "max_rel_err": err}

                    def step(fn):
                        def run():
                            fn()
                            cnt[0] += 1
                        return in_green(run)

                    if nd:
                        row["dpart_us"] = timer(step(lambda: dl(s0i)), s0i, inner)
                    for tac in tactics:
                        row[f"b{tac}_us"] = timer(step(lambda tac=tac: bl(s0i, tac)), s0i, inner)
                        if nd == 0:
                            full[tac] = row[f"conc{tac}_us"] = row[f"b{tac}_us"]
                            continue

                        def conc(tac=tac):
                            ck(cu.cuEventRecord(ev0, s0))
                            ck(cu.cuStreamWaitEvent(s1, ev0, 0))
                            bl(s0i, tac)
                            dl(s1i)
                            ck(cu.cuEventRecord(ev1, s1))
                            ck(cu.cuStreamWaitEvent(s0, ev1, 0))

                        row[f"conc{tac}_us"] = timer(step(conc), s0i, inner)
                    for tac in tactics:
                        row[f"bitmap{tac}_us"] = full[tac]
                        row[f"speedup_conc{tac}"] = t_cub / row[f"conc{tac}_us"]
                    row["conc_us"] = min(row[f"conc{t}_us"] for t in tactics)
                    row["speedup_conc"] = t_cub / row["conc_us"]
                    row["speedup_bitmap"] = max(t_cub / full[t] for t in tactics)
                    rows.append(row)
                    print(" ".join(f"{kk}={v:.2f}" if isinstance(v, float) else f"{kk}={v}" for kk, v in row.items()
                                   if kk != "bytes"), flush=True)
                    pcopies = dcopies = None
                torch.cuda.empty_cache()
        wd = None
        torch.cuda.empty_cache()
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
    out = args.out or ROOT / "bench" / "results" / f"bitmap_mix_explore_green{gsms}_{git_commit()}.json"
    write_json(out, rows, meta({"tool": "tools/bitmap_mix_explore.py --green", "summary": summary, "sms": gsms}))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
