"""Benchmark EdgeBitmapLinear vs cuBLAS fp16 dense (torch) on the decode shapes of issue 4.

Side by side in one run: cuBLAS fp16 ``X · Wᵀ`` and our kernel with fp16 and int8 values at 30/50/70 %
random sparsity, M ∈ {1, 2, 4, 8, 16}, nine (K, N) LLM shapes. Each timing is the median over CUDA-graph
replays; a graph holds enough launches over rotated weight copies that one replay touches more than
twice the L2 (so weights come from DRAM, as in decode). GB/s counts each format's own bytes
(packed weights incl. metadata, or dense fp16) plus X and Y. Our kernel is timed with the heuristic
tactic (1) and every tactic; ``best`` is the fastest tactic (what TensorRT's tactic timing picks).
Then the same on a 16-SM green context (the "Orin proxy": Orin's SM count, H100/H200 memory).

Usage: python bench/bench_bitmap_linear.py [--quick] [--no-green]
Writes bench/results/bitmap_linear.json (and bitmap_linear_green16.json).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import meta, print_table, time_graph, write_results  # noqa: E402
from edgesdk.formats import bitmap_linear as fmt  # noqa: E402

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096), (2048, 5632), (5632, 2048), (896, 4864),
          (4864, 896), (576, 1536), (1536, 576)]  # (K, N)
MS = [1, 2, 4, 8, 16]
SPARSITIES = [0.3, 0.5, 0.7]
VDTYPES = ["float16", "int8"]
GREEN_TACTICS = [1, 59]
DECODE_TACTICS = [1, 59, 60, 70, 40, 49]  # default, round-2 default, X-staged heuristics, v2 configurations


CHECK_M = 16  # rows of the sanity-check X


def check_x(k: int) -> np.ndarray:
    """The fp16 X of the output sanity check of every (K, ·) layer (deterministic)."""
    return np.random.default_rng(k).uniform(-1, 1, (CHECK_M, k)).astype(np.float16)


def random_packed(k: int, n: int, s: float, vd: str, seed: int) -> fmt.BitmapLinearWeights:
    """Random normal W [n, k] with a fraction ``s`` pruned at random, packed with ``vd`` values."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k), dtype=np.float32)
    w[rng.random((n, k), dtype=np.float32) < s] = 0
    return fmt.BitmapLinearWeights.pack(w, vd)


def _pack(job):
    p = random_packed(*job)
    k = job[0]
    # float64 reference of the sanity check, computed here (in parallel) from the packed bytes
    ref = (check_x(k).astype(np.float64) @ p.raw_values().T) * p.scales.astype(np.float64)
    return job, p.node_attributes(), p.to_tensors(), p.nbytes, ref


def _pack_all(shapes, workers=12):
    jobs = [(k, n, s, vd, 1000 * i + int(s * 10)) for i, (k, n) in enumerate(shapes)
            for s in SPARSITIES for vd in VDTYPES]
    with ProcessPoolExecutor(workers) as ex:
        return {j[:4]: (a, t, nb, ref) for j, a, t, nb, ref in ex.map(_pack, jobs)}


def _copies(nbytes: int, l2: int) -> int:
    return int(min(512, max(2, -(-2 * l2 // max(nbytes, 1)))))


class GraphTimer:
    """Median µs per call of CUDA-graph replays on a given stream, via the driver API (any context)."""

    def __init__(self, cu, check):
        self.cu, self.check = cu, check

    def __call__(self, fn, stream: int, inner: int, reps: int = 10) -> float:
        cu, ck = self.cu, self.check
        st = cu.CUstream(stream)
        for _ in range(2):
            fn()
        ck(cu.cuStreamSynchronize(st))
        ck(cu.cuStreamBeginCapture(st, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        for _ in range(inner):
            fn()
        graph = ck(cu.cuStreamEndCapture(st))
        exe = ck(cu.cuGraphInstantiate(graph, 0))
        e0, e1 = ck(cu.cuEventCreate(0)), ck(cu.cuEventCreate(0))
        ck(cu.cuGraphLaunch(exe, st))
        ck(cu.cuStreamSynchronize(st))
        times = []
        for _ in range(reps):
            ck(cu.cuEventRecord(e0, st))
            ck(cu.cuGraphLaunch(exe, st))
            ck(cu.cuEventRecord(e1, st))
            ck(cu.cuEventSynchronize(e1))
            times.append(ck(cu.cuEventElapsedTime(e0, e1)) * 1000.0 / inner)
        cu.cuGraphExecDestroy(exe)
        cu.cuGraphDestroy(graph)
        cu.cuEventDestroy(e0)
        cu.cuEventDestroy(e1)
        return statistics.median(times)


def bench(shapes, ms, packed, l2, tactics, green=None, check_outputs=True, label_tactics=()):
    """Rows of timings. ``green``: (ctx, prim_ctx, stream) to run on a green context.

    Per layer and M: a ``default`` row (tactic 1), a ``best`` row (fastest timed tactic) and a
    ``t<id>`` row for every tactic of ``label_tactics`` (heuristics compared side by side)."""
    import torch

    from edgesdk.kernels import _cuda
    from edgesdk.kernels import bitmap_linear as kbl

    cu = _cuda._driver()
    timer = GraphTimer(cu, _cuda.check)
    rows = []
    for (k, n) in shapes:
        dense_bytes = fmt.dense_fp16_bytes(n, k)
        nd = _copies(dense_bytes, l2)
        gen = torch.Generator(device="cuda").manual_seed(k * n)
        wd = [torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) for _ in range(1)]
        wd = wd + [wd[0].clone() for _ in range(nd - 1)]
        dev = {}
        for s in SPARSITIES:
            for vd in VDTYPES:
                attrs, tens, nb, ref = packed[(k, n, s, vd)]
                base = [torch.from_numpy(v).cuda() for v in tens.values()]
                nc = _copies(nb, l2)
                dev[(s, vd)] = (attrs, [base] + [[t.clone() for t in base] for _ in range(nc - 1)], nb, ref)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            y = torch.empty(m, n, device="cuda", dtype=torch.float16)
            io = 2 * m * (k + n)
            s_int = None if green is None else int(green[2])
            it = [0]

            def dense():
                torch.mm(x, wd[it[0] % nd].t(), out=y)
                it[0] += 1

            if green is None:
                t_dense = time_graph(dense, inner=nd, reps=10)
            else:
                ext = torch.cuda.ExternalStream(s_int)
                with torch.cuda.stream(ext):
                    t_dense = timer(dense, s_int, nd)
            rows.append({"K": k, "N": n, "M": m, "kernel": "cublas_fp16", "sparsity": 0.0, "tactic": "",
                         "us": t_dense, "bytes": dense_bytes + io, "GBps": (dense_bytes + io) / t_dense / 1e3,
                         "speedup": 1.0})
            for (s, vd), (attrs, copies, nb, ref) in dev.items():
                nc = len(copies)
                res = {}
                for tac in tactics:
                    j = [0]

                    def ours(tac=tac):
                        c = copies[j[0] % nc]
                        st = torch.cuda.current_stream().cuda_stream if s_int is None else s_int
                        kbl.launch(attrs, "float16", m, [x.data_ptr(), *[t.data_ptr() for t in c]],
                                   [y.data_ptr()], st, tac)
                        j[0] += 1

                    if green is None:
                        res[tac] = time_graph(ours, inner=nc, reps=10)
                    else:
                        _cuda.check(cu.cuCtxSetCurrent(green[0]))
                        try:
                            res[tac] = timer(ours, s_int, nc)
                        finally:
                            _cuda.check(cu.cuCtxSetCurrent(green[1]))
                if check_outputs and green is None and m == ms[-1]:
                    # every timed tactic on the check X (M = 16, outputs poisoned) vs the float64 reference
                    xc = torch.from_numpy(check_x(k)).cuda()
                    yc = torch.empty(CHECK_M, n, device="cuda", dtype=torch.float16)
                    for tac in tactics:
                        yc.fill_(float("nan"))
                        kbl.launch(attrs, "float16", CHECK_M, [xc.data_ptr(), *[t.data_ptr() for t in copies[0]]],
                                   [yc.data_ptr()], torch.cuda.current_stream().cuda_stream, tac)
                        torch.cuda.synchronize()
                        err = np.abs(yc.double().cpu().numpy() - ref).max() / max(np.abs(ref).max(), 1e-6)
                        assert err < 2e-3, f"bench sanity check failed: rel err {err} for {k}x{n} {s} {vd} tactic {tac}"
                best = min(res, key=res.get)
                for label, tac in (("default", 1), ("best", best), *((f"t{t}", t) for t in label_tactics)):
                    t = res[tac]
                    rows.append({"K": k, "N": n, "M": m, "kernel": f"bitmap_{vd}_{label}", "sparsity": s,
                                 "tactic": tac, "us": t, "bytes": nb + io, "GBps": (nb + io) / t / 1e3,
                                 "speedup": t_dense / t})
        wd = dev = None  # free the copies before the next shape
        torch.cuda.empty_cache()
    return rows


def summarize(rows):
    """Median speed-up over the shapes with K·N ≥ 4M per (kernel, sparsity), and the worst case."""
    out = []
    keys = sorted({(r["kernel"], r["sparsity"]) for r in rows if r["kernel"] != "cublas_fp16"})
    for kern, s in keys:
        sel = [r for r in rows if r["kernel"] == kern and r["sparsity"] == s]
        big = [r["speedup"] for r in sel if r["K"] * r["N"] >= 4 * 1024 * 1024]
        out.append({"kernel": kern, "sparsity": s, "median_speedup_KN>=4M": statistics.median(big) if big else None,
                    "min_speedup_all": min(r["speedup"] for r in sel),
                    "median_GBps": statistics.median(r["GBps"] for r in sel)})
    return out


def published_rows(path: Path, rows: list[dict]) -> list[dict]:
    """Rows of a published kernel timed by an external driver (CSV ``NAME,K,N,M,sparsity,splitk,us,
    bytes,GBps,relerr``, same method: CUDA graphs over rotated copies, median of 10), with the speed-up
    vs our cuBLAS row and vs our default (tactic 1) fp16 kernel at the same (K, N, M, sparsity)."""
    out = []
    for line in path.read_text().splitlines():
        f = line.strip().split(",")
        if len(f) != 10 or not f[1].isdigit():
            continue
        k, n, m, s, us = int(f[1]), int(f[2]), int(f[3]), float(f[4]), float(f[6])
        dense = [r["us"] for r in rows if r["kernel"] == "cublas_fp16" and (r["K"], r["N"], r["M"]) == (k, n, m)]
        ours = [r["us"] for r in rows if r["kernel"] == "bitmap_float16_default" and (r["K"], r["N"], r["M"], r["sparsity"])
                == (k, n, m, s)]
        out.append({"K": k, "N": n, "M": m, "kernel": f"{f[0].lower()}_fp16", "sparsity": s, "tactic": f"splitk{f[5]}",
                    "us": us, "bytes": int(f[7]), "GBps": float(f[8]), "relerr": float(f[9]),
                    "speedup": dense[0] / us if dense else None,
                    "ours_fp16_vs_published": us / ours[0] if ours else None})
    return out


def published_rows_from_json(path: Path, rows: list[dict]) -> tuple[list[dict], dict]:
    """Published-kernel rows of an earlier results JSON (its own timings, date and commit kept), with the
    speed-ups recomputed against this run's cuBLAS and our default (tactic 1) fp16 kernel at the same (K, N, M, s)."""
    import json

    old = json.loads(path.read_text())
    out = []
    for r in old["rows"]:
        if r["kernel"] in ("cublas_fp16",) or r["kernel"].startswith("bitmap_"):
            continue
        key = (r["K"], r["N"], r["M"])
        dense = [q["us"] for q in rows if q["kernel"] == "cublas_fp16" and (q["K"], q["N"], q["M"]) == key]
        ours = [q["us"] for q in rows if q["kernel"] == "bitmap_float16_default" and (q["K"], q["N"], q["M"], q["sparsity"])
                == (*key, r["sparsity"])]
        out.append({**r, "speedup": dense[0] / r["us"] if dense else None,
                    "ours_fp16_vs_published": r["us"] / ours[0] if ours else None,
                    "measured": r.get("measured") or f"{old['meta']['date']} ({old['meta']['commit']})"})
    return out, old["meta"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="three shapes, M ∈ {1, 16}")
    ap.add_argument("--no-green", action="store_true", help="skip the 16-SM green context")
    ap.add_argument("--published", type=Path, help="CSV from an external published-kernel driver to merge")
    ap.add_argument("--published-json", type=Path,
                    help="reuse the published-kernel rows of an earlier results JSON (their date/commit are kept)")
    ap.add_argument("--tactics", default="decode", help="'all', 'decode' (DECODE_TACTICS) or comma-separated ids")
    ap.add_argument("--label-tactics", default="", help="comma-separated timed tactics that also get rows of "
                    "their own (kernel bitmap_<vd>_t<id>), e.g. a second heuristic")
    ap.add_argument("--green-tactics", default=",".join(map(str, GREEN_TACTICS)), help="comma-separated tactics timed on the 16-SM context")
    args = ap.parse_args(argv)
    import torch

    from edgesdk.kernels import _cuda
    from edgesdk.kernels import bitmap_linear as kbl

    shapes = [SHAPES[0], SHAPES[1], SHAPES[6]] if args.quick else SHAPES
    ms = [1, 16] if args.quick else MS
    if args.tactics == "all":
        tactics = kbl.valid_tactics({"n": 1, "k": 1, "value_dtype": "float16"})
    elif args.tactics == "decode":  # heuristic and a spread of decode-path configurations
        tactics = DECODE_TACTICS
    else:
        tactics = [int(t) for t in args.tactics.split(",")]
    labels = [int(t) for t in args.label_tactics.split(",") if t]
    green_tactics = [int(t) for t in args.green_tactics.split(",") if t]
    assert set(labels) <= set(tactics) and 1 in tactics and 1 in green_tactics
    t0 = time.time()
    packed = _pack_all(shapes)
    print(f"packed {len(packed)} layers in {time.time() - t0:.1f} s", flush=True)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    _cuda.init()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    info = meta({"method": "median over 10 CUDA-graph replays; each graph = one call per rotated weight copy, "
                           ">= 2x L2 bytes per replay; GB/s = (format bytes + X + Y) / time",
                 "shapes_KN": shapes, "M": ms, "tactics": tactics})
    t0 = time.time()
    rows = bench(shapes, ms, packed, l2, tactics, label_tactics=labels)
    print(f"full GPU: {time.time() - t0:.1f} s", flush=True)
    cols = ["K", "N", "M", "kernel", "sparsity", "tactic", "us", "GBps", "speedup"]
    print_table([r for r in rows if not r["kernel"].endswith("default")], cols)
    summ = summarize(rows)
    print_table(summ, list(summ[0]))
    if args.published and args.published.exists():
        pub = published_rows(args.published, rows)
        print_table(pub, cols + ["ours_fp16_vs_published"])
        rows += pub
        info["published"] = ("Coruscant SpMM (github.com/dhjoo98/coruscant, built outside this repository for "
                             "sm_90), timed by a separate driver with the same method; its batch must be 1, 4, 8 "
                             "or 16 (padded to 16 columns in memory) and N a multiple of 256")
    if args.published_json and args.published_json.exists():
        pub, pmeta = published_rows_from_json(args.published_json, rows)
        print_table(pub, cols + ["ours_fp16_vs_published"])
        rows += pub
        info["published"] = (pmeta.get("published", "").split("; rows reused")[0]
                             + "; rows reused from an earlier run (date and commit per row, 'measured'), "
                             f"via {pmeta['date']}'s results ({pmeta['device']}); not re-timed in this run")
        if "coruscant_sparsities" in pmeta:
            info["coruscant_sparsities"] = pmeta["coruscant_sparsities"]
    write_results("bitmap_linear", rows, {**info, "summary": summ})
    if args.no_green:
        return 0
    cu = _cuda._driver()
    prim = _cuda.check(cu.cuCtxGetCurrent())
    gctx, sms = _cuda.green_context(16)
    _cuda.check(cu.cuCtxSetCurrent(gctx))
    gstream = _cuda.check(cu.cuStreamCreate(1))
    _cuda.check(cu.cuCtxSetCurrent(prim))
    t0 = time.time()
    grows = bench(shapes, ms, packed, l2, green_tactics, green=(gctx, prim, gstream), check_outputs=False,
                  label_tactics=[t for t in labels if t in green_tactics])
    print(f"green context ({sms} SMs): {time.time() - t0:.1f} s", flush=True)
    print_table([r for r in grows if not r["kernel"].endswith("default")], cols)
    gsum = summarize(grows)
    print_table(gsum, list(gsum[0]))
    write_results("bitmap_linear_green16", grows, {**info, "green_context_sms": sms, "tactics": green_tactics,
                                                   "summary": gsum})
    return 0


if __name__ == "__main__":
    sys.exit(main())
