#!/usr/bin/env python3
"""Exploration (session 35, issue 4): is the sparse KV kernels' decode faster on the bitmap linear's weights?

Issue 4's kernel (tactic 1) decodes per *position*: each lane expands two bit positions of every 8 x 8 tile into
an mma fragment (~21 warp-instructions per tile at any sparsity; docs/bitmap_linear.md, rounds 4-13). The sparse
KV kernels decode per *kept value*: a lane scatters one fixed-size record (bitmap + values) into a dense tile in
shared memory, and ldmatrix feeds mma. Their records have a fixed size because every token keeps the same count.
This tool measures that decode on linear weights pruned the same way, *balanced*: every 8 x 8 tile keeps exactly
``keep`` of its 64 weights (its largest magnitudes), the records of ``tools/bitmap_balanced.cu``.

Per layer of issue 4's benchmark with K % 128 == 0, balanced sparsity 0.30 / 0.50 / 0.70 (keep 45 / 32 / 19) and
M 1 / 4 / 8 / 16, on the same pruned W: cuBLAS fp16 dense (torch.mm), tactic 1 on W packed in format v1 (the shipped
kernel), and the prototype (configurations: 4, 8 or 16 warps per block splitting K, records 1-2 steps ahead, one
block per strip pair or a persistent grid) on two packings of the records: ``bal``, positions stored in ascending
order, and ``bals`` (keep 19 and 45, which have a padding half), each record's store order ``x`` chosen offline by
:func:`schedule` against the scatter's bank conflicts (as the KV compressor does, docs/sparse_kv.md session 33).
Every output is first checked against a float64 reference (Y poisoned with NaN before each checked call); timings
are CUDA-graph replays over weight copies cycled through 4 x L2 (``--rotate``), medians (bench/_common.time_graph).

``--ablate``: instead, timing-only builds (``BAL_ABL`` in the .cu; wrong results) of one configuration beside the
full kernel, at 70 %, M = 1 and 8: no zero fill; no scatter stores; conflict-free stores (with and without their
address waiting for the walk); stores at fixed positions; no record loads; no ldmatrix / mma; and the full kernel
on scheduled records. In ``no_scatter`` and ``no_stores`` nothing consumes the value words (an empty asm emits no
instruction), so their loads are never waited for: those two read faster than the memory can (4.4 TB/s on an
H100) and bound only what removing the stores could give; ``conflict_free`` waits for them.

Usage: python tools/bitmap_balanced_explore.py [--quick] [--ablate] [--out NAME]
Writes bench/results/NAME.json (default bitmap_balanced_explore_<commit>.json).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SRC = ROOT / "tools" / "bitmap_balanced.cu"
KEEPS = {0.3: 45, 0.5: 32, 0.7: 19}  # sparsity -> kept weights per 64 (1 - keep / 64 = 0.297, 0.5, 0.703)
CONFIGS = {19: [(4, 3), (8, 2), (8, 3), (16, 2)], 32: [(4, 2), (8, 2), (16, 2)],
           45: [(4, 2), (8, 2), (16, 2)]}  # keep -> (warps per block, record ring depth); 16 warps only for M <= 8
MS = (1, 4, 8, 16)
TILE_STRIDE = 144  # bytes per tile slot in the kernel (kTileStride)


def copies(nbytes: int, l2: int, rotate: float) -> int:
    """Copies of an operand that a timing loop cycles through: together at least ``rotate`` x L2 (at least 2)."""
    return int(min(512, max(2, -(-int(rotate * l2) // max(nbytes, 1)))))


def record_bytes(keep: int) -> int:
    return 8 + 2 * ((keep + 3) & ~3)


def store_banks(pos: np.ndarray, x: np.ndarray, keep: int, slot: np.ndarray) -> np.ndarray:
    """Banks of the kernel's scatter stores, in issue order, for records of kept positions ``pos`` [..., keep]
    (ascending) stored in order ``x`` [...] (broadcast) into tile slot ``slot``: the values follow ascending c' =
    position ^ x; the ascending walk takes the keep // 2 lowest c', the descending one the others from the top, and
    the kernel interleaves them (descending first). Bank of position b in slot s: (36 s + b // 2) % 32."""
    a = keep // 2
    cs = np.sort(pos ^ x[..., None], axis=-1)
    order = []
    for k in range(keep - a):
        order.append(keep - 1 - k)
        if k < a:
            order.append(k)
    true = cs[..., order] ^ x[..., None]
    return (36 * slot[..., None] + (true >> 1)) % 32


def wavefronts(banks: np.ndarray) -> np.ndarray:
    """Shared-memory wavefronts of each step's scatter: ``banks`` [steps, 32 lanes, stores] -> the sum over store
    instructions of the busiest bank's count (the lanes' tiles never share a word)."""
    steps, _, keep = banks.shape
    cnt = np.zeros((steps, keep, 32), dtype=np.int16)
    np.add.at(cnt, (np.arange(steps)[:, None, None], np.arange(keep)[None, None, :], banks), 1)
    return cnt.max(axis=2).sum(axis=1)


def schedule(pos: np.ndarray, keep: int, passes: int = 2) -> np.ndarray:
    """Store order x (even, 0..62) per record of ``pos`` [steps, 32 lanes, keep] that keeps the scatter's bank
    conflicts low: lanes in turn (then ``passes`` more rounds) take the x that adds the fewest wavefronts
    (sum over store instructions of the busiest bank's count) to the other lanes' stores of the same step."""
    steps = pos.shape[0]
    cands = np.arange(0, 64, 2)
    tables = [store_banks(pos[:, lane][:, None, :], np.broadcast_to(cands, (steps, cands.size)), keep,
                          np.full((steps, cands.size), lane)) for lane in range(32)]  # [steps, cand, keep]
    cnt = np.zeros((steps, keep * 32), dtype=np.int16)  # [step, store j * 32 + bank]
    chosen = np.full((steps, 32), -1)
    rows = np.arange(steps)[:, None]
    flat = [np.arange(keep) * 32 + tb for tb in tables]  # [steps, cand, keep]
    for _ in range(1 + passes):
        for lane in range(32):
            fl = flat[lane]
            if chosen[0, lane] >= 0:  # a lane's stores hit one bank per j: plain indexing adds each once
                cnt[rows, fl[np.arange(steps), chosen[:, lane]]] -= 1
            cur = cnt.reshape(steps, keep, 32).max(axis=2)  # [steps, keep]
            hit = cnt[np.arange(steps)[:, None, None], fl]  # [steps, cand, keep]
            cost = np.maximum(cur[:, None, :], hit + 1).sum(axis=2)  # [steps, cand]
            c = cost.argmin(axis=1)
            chosen[:, lane] = c
            cnt[rows, fl[np.arange(steps), c]] += 1
    return cands[chosen], cnt.reshape(steps, keep, 32).max(axis=2).sum(axis=1)


def balanced(k: int, n: int, keep: int, seed: int, sched: bool = False):
    """Random normal fp16 W [n, k] with every 8 x 8 tile pruned to its ``keep`` largest magnitudes; returns
    (W pruned, dense fp16), the records in the kernel's chunk-major order (uint8) and the modelled scatter
    wavefronts per step (mean). ``sched``: each record in the store order ``schedule`` picks (its x in the last
    padding half; needs keep % 4 != 0)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k), dtype=np.float32).astype(np.float16)
    perm = tile_columns(k)
    w = w[:, perm]  # tile t's columns 8 t .. 8 t + 7 in the kernel's order
    s_, kt = n // 8, k // 8
    t = w.reshape(s_, 8, kt, 8).transpose(0, 2, 1, 3).reshape(s_, kt, 64)  # [strip, k-tile, bit 8 r + c]
    idx = np.argpartition(-np.abs(t.astype(np.float32)), keep - 1, axis=2)[..., :keep]
    pos = np.sort(idx, axis=2)  # kept bit positions, ascending = the values' order
    mask = np.zeros(t.shape, dtype=bool)
    np.put_along_axis(mask, pos, True, axis=2)
    # steps: [pair, step i, lane = 2 (t % 16) + s]
    by_step = pos.reshape(s_ // 2, 2, kt // 16, 16, keep).transpose(0, 2, 3, 1, 4).reshape(-1, 32, keep)
    if sched:
        assert keep % 4, "no padding half for the store order"
        xs, wf = schedule(by_step.astype(np.int64), keep)
    else:
        xs = np.zeros(by_step.shape[:2], dtype=np.int64)
        wf = None
    if wf is None:
        wf = wavefronts(store_banks(by_step.astype(np.int64), xs, keep, np.broadcast_to(np.arange(32), xs.shape)))
    wf_mean = float(wf.mean())
    x = xs.reshape(s_ // 2, kt // 16, 16, 2).transpose(0, 3, 1, 2).reshape(s_, kt)  # back to [strip, k-tile]
    stored = pos ^ x[..., None]
    so = np.argsort(stored, axis=2)
    bits = np.bitwise_or.reduce(np.left_shift(np.uint64(1), stored.astype(np.uint64)), axis=2)
    vals = np.take_along_axis(np.take_along_axis(t, pos, axis=2), so, axis=2)  # ascending stored position
    r = record_bytes(keep)
    rec = np.zeros((s_, kt, r), dtype=np.uint8)
    rec[..., :8] = bits.astype("<u8").view(np.uint8).reshape(s_, kt, 8)
    rec[..., 8:8 + 2 * keep] = vals.astype("<f2").view(np.uint8).reshape(s_, kt, 2 * keep)
    if sched:
        rec[..., r - 2:] = x.astype("<u2").view(np.uint8).reshape(s_, kt, 2)
    # record (p KT + t) * 2 + s, then chunk-major in groups of 16 records
    rec = rec.reshape(s_ // 2, 2, kt, r).transpose(0, 2, 1, 3).reshape(-1, 16, r // 8, 8)
    rec = np.ascontiguousarray(rec.transpose(0, 2, 1, 3)).reshape(-1)
    wpv = (t * mask).reshape(s_, kt, 8, 8).transpose(0, 2, 1, 3).reshape(n, k)
    wp = np.empty_like(wpv)
    wp[:, perm] = wpv
    return wp, rec, wf_mean


def tile_columns(k: int) -> np.ndarray:
    """The input channel of column c of k-tile t: t = 16 i + 2 q + h (step i, k16 step q, half h), c = 2 j + e ->
    128 i + 32 j + 4 q + 2 h + e, so that the lane of X quarter j finds its B pairs in 32 contiguous columns."""
    t = np.arange(k // 8)[:, None]
    c = np.arange(8)[None, :]
    i, q, h = t // 16, (t % 16) // 2, t % 2
    j, e = c // 2, c % 2
    return (128 * i + 32 * j + 4 * q + 2 * h + e).reshape(-1)


def _job(job):
    from edgesdk.formats import bitmap_linear as fmt

    k, n, s, seed = job
    keep = KEEPS[s]
    wp, rec, wf = balanced(k, n, keep, seed)
    sets = {"bal": (rec, wf)}
    if keep % 4:  # a padding half for the store order
        wp2, rec2, wf2 = balanced(k, n, keep, seed, sched=True)
        assert np.array_equal(wp, wp2)
        sets["bals"] = (rec2, wf2)
    p = fmt.BitmapLinearWeights.pack(wp.astype(np.float32), "float16")
    return job, wp, sets, p.node_attributes(), p.to_tensors(), p.nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4096 x 4096 and 4096 x 11008 only")
    ap.add_argument("--ablate", action="store_true", help="timing ablations of one configuration (see above)")
    ap.add_argument("--rotate", type=float, default=4.0,
                    help="weight copies cycled through per timing, together this many times L2 (default 4)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.ablate:
        return ablate(args)

    import torch

    import bench.bench_bitmap_linear as bbl
    from bench._common import git_commit, meta, print_table, time_graph, write_results
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import bitmap_linear as kbl

    shapes = [(k, n) for (k, n) in bbl.SHAPES if k % 128 == 0 and n % 16 == 0]
    if args.quick:
        shapes = shapes[:2]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    kern = {(keep, nw, dp, mb): _cuda.get_kernel(SRC, f"bal_k{keep}_w{nw}_d{dp}_m{mb}")
            for keep, cf in CONFIGS.items() for nw, dp in cf for mb in (1, 2) if mb == 1 or nw < 16}
    cu = _cuda._driver()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    t0 = time.time()
    jobs = [(k, n, s, 1000 * i + int(10 * s)) for i, (k, n) in enumerate(shapes) for s in KEEPS]
    rows, bad = [], 0
    rows_note = "grid: one block per strip pair, or (_pers) as many as fit the GPU at once, each looping over pairs"
    with ProcessPoolExecutor(8) as ex:
        for (k, n, s, _), wp, sets, attrs, tens, nb_v1 in ex.map(_job, jobs):
            keep = KEEPS[s]
            nb = sets["bal"][0].nbytes
            nrec = copies(nb, l2, args.rotate)
            dsets = {}
            for var, (rec, _) in sets.items():
                d0 = torch.from_numpy(rec).cuda()
                dsets[var] = [d0] + [d0.clone() for _ in range(nrec - 1)]
            base = [torch.from_numpy(v).cuda() for v in tens.values()]
            nv1 = copies(nb_v1, l2, args.rotate)
            v1 = [base] + [[t.clone() for t in base] for _ in range(nv1 - 1)]
            wd = torch.from_numpy(wp).cuda()
            nd = copies(wd.numel() * 2, l2, args.rotate)
            wds = [wd] + [wd.clone() for _ in range(nd - 1)]
            w64 = wp.astype(np.float64)
            for m in MS:
                xh = np.random.default_rng(k + m).uniform(-1, 1, (m, k)).astype(np.float16)
                ref = xh.astype(np.float64) @ w64.T
                x = torch.from_numpy(xh).cuda()
                y = torch.empty(m, n, device="cuda", dtype=torch.float16)
                tol = 2e-3 * np.abs(ref) + 2e-3 * np.abs(ref).max()

                def ok(label):
                    torch.cuda.synchronize()
                    got = y.cpu().numpy().astype(np.float64)
                    good = bool(np.all(np.abs(got - ref) <= tol))
                    if not good:
                        print(f"BAD {label} {k}x{n} s={s} M={m}: max err {np.nanmax(np.abs(got - ref)):.3g}",
                              flush=True)
                    return good

                row = {"K": k, "N": n, "M": m, "sparsity": s, "keep": keep, "record_bytes": record_bytes(keep),
                       "bytes_balanced": nb, "bytes_v1": nb_v1, "bytes_dense": 2 * n * k,
                       **{f"{var}_model_wavefronts": wf for var, (_, wf) in sets.items()}}
                it = [0]

                def dense():
                    torch.mm(x, wds[it[0] % nd].t(), out=y)
                    it[0] += 1

                y.fill_(float("nan"))
                dense()
                row["ok_cublas"] = ok("cublas")
                row["cublas_us"] = time_graph(dense, inner=nd, reps=10)
                j = [0]

                def t1():
                    kbl.launch(attrs, "float16", m, [x.data_ptr(), *[t.data_ptr() for t in v1[j[0] % nv1]]],
                               [y.data_ptr()], torch.cuda.current_stream().cuda_stream, 1)
                    j[0] += 1

                y.fill_(float("nan"))
                t1()
                row["ok_t1"] = ok("t1")
                row["t1_us"] = time_graph(t1, inner=nv1, reps=10)
                mb = 1 if m <= 8 else 2
                for var, recs in dsets.items():
                    for nw, dp in CONFIGS[keep]:
                        if (keep, nw, dp, mb) not in kern:
                            continue
                        kk = kern[(keep, nw, dp, mb)]
                        smem = nw * 2 * 32 * TILE_STRIDE + nw * 1024
                        kk.set_max_dynamic_smem(smem)
                        per_sm = int(_cuda.check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                            kk.function, 32 * nw, smem)))
                        for grid in sorted({n // 16, min(n // 16, per_sm * sms)}):
                            lab = f"{var}_w{nw}_d{dp}" + ("_pers" if grid < n // 16 else "")
                            c = [0]

                            def bal(kk=kk, smem=smem, grid=grid, recs=recs):
                                kk.launch((grid,), (32 * nw,),
                                          [ctypes.c_void_p(x.data_ptr()),
                                           ctypes.c_void_p(recs[c[0] % nrec].data_ptr()),
                                           ctypes.c_void_p(y.data_ptr()), ctypes.c_int(m), ctypes.c_int(k),
                                           ctypes.c_int(n)],
                                          torch.cuda.current_stream().cuda_stream, smem)
                                c[0] += 1

                            y.fill_(float("nan"))
                            bal()
                            row[f"ok_{lab}"] = ok(lab)
                            bad += not row[f"ok_{lab}"]
                            row[f"{lab}_us"] = time_graph(bal, inner=nrec, reps=10)
                            row[f"{lab}_grid"] = grid
                    best = min((k_[:-3] for k_ in row if k_.startswith(f"{var}_w") and k_.endswith("_us")),
                               key=lambda lab: row[f"{lab}_us"])
                    row[f"{var}_us"], row[f"{var}_config"] = row[f"{best}_us"], best
                row["bal_best_us"] = min(row.get("bals_us", 1e9), row["bal_us"])
                row["t1_speedup"] = row["cublas_us"] / row["t1_us"]
                row["bal_speedup"] = row["cublas_us"] / row["bal_us"]
                row["bal_best_speedup"] = row["cublas_us"] / row["bal_best_us"]
                if "bals_us" in row:
                    row["bals_speedup"] = row["cublas_us"] / row["bals_us"]
                    row["sched_gain"] = row["bal_us"] / row["bals_us"]
                row["bal_vs_t1"] = row["t1_us"] / row["bal_us"]
                row["bal_best_vs_t1"] = row["t1_us"] / row["bal_best_us"]
                row["bal_GBps"] = (nb + 2 * m * (k + n)) / row["bal_best_us"] / 1e3
                row["t1_GBps"] = (nb_v1 + 2 * m * (k + n)) / row["t1_us"] / 1e3
                rows.append(row)
                print(f"{k}x{n} s={s} M={m}: cuBLAS {row['cublas_us']:.1f} t1 {row['t1_us']:.1f} "
                      f"bal {row['bal_us']:.1f} sched {row.get('bals_us', float('nan')):.1f} us", flush=True)
            dsets = v1 = wds = None
            torch.cuda.empty_cache()
    cols = ["K", "N", "M", "sparsity", "cublas_us", "t1_us", "bal_us", "bals_us", "t1_speedup", "bal_best_speedup",
            "bal_best_vs_t1"]
    print_table(rows, cols)
    summary = []
    for s in KEEPS:
        sel = [r for r in rows if r["sparsity"] == s and r["K"] * r["N"] >= 4 * 1024 * 1024]
        if sel:
            med = lambda key, rs=sel: statistics.median(r[key] for r in rs if key in r) if any(key in r for r in rs) else None  # noqa: E731
            summary.append({"sparsity": s, "rows": len(sel),
                            "median_t1_speedup": med("t1_speedup"),
                            "median_bal_speedup": med("bal_speedup"), "median_bals_speedup": med("bals_speedup"),
                            "median_best_speedup": med("bal_best_speedup"),
                            "min_best_speedup": min(r["bal_best_speedup"] for r in sel),
                            "median_best_vs_t1": med("bal_best_vs_t1"), "median_sched_gain": med("sched_gain"),
                            "M<=8 median_best_speedup": med("bal_best_speedup", [r for r in sel if r["M"] <= 8])})
            print(summary[-1])
    print(f"outputs not matching the reference: {bad}; {time.time() - t0:.0f} s")
    name = args.out or f"bitmap_balanced_explore_{git_commit()}"
    print("wrote", write_results(name, rows, meta({"summary": summary, "bad_outputs": bad, "rotate_l2": args.rotate,
                                                    "note": "balanced pruning (exactly keep of every 8 x 8 tile); "
                                                            "tools/bitmap_balanced.cu vs tactic 1 (format v1 of the "
                                                            "same W) vs cuBLAS fp16 (the same W dense); "
                                                            "speedup = cuBLAS time / ours; " + rows_note})))


ABLATIONS = {"full": 0, "no_zero_fill": 1, "no_scatter": 2, "conflict_free": 4, "no_record_loads": 8,
             "no_mma": 16, "cf_no_zero_fill": 5, "no_stores": 3, "cf_dependent": 32, "fixed_positions": 64}


def ablate(args) -> None:
    import torch

    from bench._common import git_commit, meta, print_table, time_graph, write_results
    from edgesdk.kernels import _cuda

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    keep, nw, dp = 19, 8, 2
    rows = []
    for k, n in [(4096, 4096), (11008, 4096), (4096, 11008)]:
        _, rec, _ = balanced(k, n, keep, 7)
        _, rec_s, _ = balanced(k, n, keep, 7, sched=True)
        nrec = copies(rec.nbytes, l2, args.rotate)
        plain = [torch.from_numpy(rec).cuda()]
        plain += [plain[0].clone() for _ in range(nrec - 1)]
        sched = [torch.from_numpy(rec_s).cuda()]
        sched += [sched[0].clone() for _ in range(nrec - 1)]
        for m in (1, 8):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            y = torch.empty(m, n, device="cuda", dtype=torch.float16)
            row = {"K": k, "N": n, "M": m, "sparsity": 0.7, "config": f"k{keep}_w{nw}_d{dp}_m1"}
            for lab, a in [*ABLATIONS.items(), ("scheduled", 0)]:
                kk = _cuda.get_kernel(SRC, f"bal_k{keep}_w{nw}_d{dp}_m1", (f"-DBAL_ABL={a}",))
                smem = nw * 2 * 32 * TILE_STRIDE + nw * 1024
                c = [0]
                recs = sched if lab == "scheduled" else plain

                def bal(kk=kk, smem=smem, recs=recs):
                    kk.launch((n // 16,), (32 * nw,),
                              [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(recs[c[0] % nrec].data_ptr()),
                               ctypes.c_void_p(y.data_ptr()), ctypes.c_int(m), ctypes.c_int(k), ctypes.c_int(n)],
                              torch.cuda.current_stream().cuda_stream, smem)
                    c[0] += 1

                row[f"{lab}_us"] = statistics.median(time_graph(bal, inner=nrec, reps=10) for _ in range(3))
            for lab in [*ABLATIONS, "scheduled"]:
                row[f"{lab}_speedup"] = row["full_us"] / row[f"{lab}_us"]
            rows.append(row)
            print(row, flush=True)
        plain = sched = None
        torch.cuda.empty_cache()
    print_table(rows, ["K", "N", "M"] + [f"{lab}_us" for lab in [*ABLATIONS, "scheduled"]])
    name = args.out or f"bitmap_balanced_ablate_{git_commit()}"
    print("wrote", write_results(name, rows, meta({"rotate_l2": args.rotate, "note": "timing-only builds (BAL_ABL) of one configuration, "
                                                            "one block per strip pair; speedup = full / variant; "
                                                            "full = plain records, scheduled = the full kernel on "
                                                            "records in a scheduled store order"})))


if __name__ == "__main__":
    main()
