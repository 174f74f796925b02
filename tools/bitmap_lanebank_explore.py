#!/usr/bin/env python3
"""Exploration (session 36, issue 4): balanced records decoded with no shared-memory bank conflicts.

Round 14 (docs/bitmap_linear.md) measured the sparse KV kernels' decode on *balanced* linear weights (every 8 x 8
tile keeps exactly ``keep`` of 64; ``tools/bitmap_balanced.cu``) and found its limit in the scatter's bank conflicts:
a timing-only build with each lane's stores in its own bank ran 1.7x faster, at the memory's rate.
``tools/bitmap_lanebank.cu`` makes that layout real (lane-owned banks, XOR-diagonal reads; the file's header says
how). This tool packs its records, checks every output against float64 (Y poisoned with NaN first) and times it
beside cuBLAS fp16 (the same W dense), tactic 1 (the same W in format v1) and round 14's prototype (its best
configuration, on its own balanced W of the same shape, seed and keep: its tiles are other column sets, so the
same W cannot be balanced for both).

Per layer of issue 4's benchmark (all 9 have K % 32 == 0 and N % 64 == 0), balanced sparsity 0.30 / 0.50 / 0.70
(keep 45 / 32 / 19), M 1 / 4 / 8 / 16. Configurations: warps per block (KS) and record ring depth as in round 14,
and k-chunks per row group (KY, grid.y; KY > 1 reduces through an fp32 workspace and a ticket) swept; ``lb_rule``
is the configuration each KS's rule picks (fewest waves x (steps per warp + 2)), ``lb`` the fastest of all.
CUDA-graph replays over weight copies cycled through ``--rotate`` x L2, medians (bench/_common.time_graph).

``--modes``: the walks of the .cu, each on its own pruning of the same random W: ``elem`` (WALK 0, any balanced
tile), ``half`` (WALK 1: the tile's even and odd channels balanced separately, so each bitmap word has a fixed count
and its walk needs no switch between words) and ``pair`` (WALK 2: adjacent channels kept or pruned together, one bit
and one 32-bit store per pair; 10 or 16 pairs of 32, i.e. 68.75 % or 50 %); ``elem_splice`` and ``pair_splice``
(70 %): the same walks with step s + 1's zero fill and walk placed between step s's reads and mma. Only the rule's KY
and its neighbours are timed unless ``--ky-all``; ``--sparsities 0.7`` limits the sparsities. ``--ablate`` / ``--profile``: see ablate().

Usage: python tools/bitmap_lanebank_explore.py [--quick] [--modes elem,half,pair] [--rotate 4] [--out NAME]
Writes bench/results/NAME.json (default bitmap_lanebank_explore_<commit>.json).
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
sys.path.insert(0, str(ROOT / "tools"))

SRC = ROOT / "tools" / "bitmap_lanebank.cu"
KEEPS = {0.3: 45, 0.5: 32, 0.7: 19}  # element modes: kept values per 64
PAIR_KEEPS = {0.5: 16, 0.7: 10}  # "pair": kept pairs per 32 (sparsity 0.5, 0.6875)
# mode -> (kernel prefix, WALK of the .cu, {sparsity: keep}, {keep: [(warps per block KS, record ring depth)]},
# pruning / records of lanebank())
MODES = {
    "elem": ("lb", 0, KEEPS, {19: [(4, 3), (8, 2), (8, 3), (16, 2)], 32: [(4, 2), (8, 2), (16, 2)],
                              45: [(4, 2), (8, 2), (16, 2)]}, "elem"),
    "half": ("lbh", 1, {0.5: 32, 0.7: 19}, {19: [(4, 3), (8, 2), (16, 2)], 32: [(4, 2), (8, 2), (16, 2)]}, "half"),
    "pair": ("lbp", 2, PAIR_KEEPS, {10: [(4, 3), (8, 2), (16, 2)], 16: [(4, 2), (8, 2), (16, 2)]}, "pair"),
    # spliced kernels (SPLICE in the .cu: step s + 1's walk between step s's reads and mma), 70 % only
    "elem_splice": ("lbs", 0, {0.7: 19}, {19: [(4, 3), (8, 2), (8, 3)]}, "elem"),
    "pair_splice": ("lbps", 2, {0.7: 10}, {10: [(4, 3), (8, 2), (8, 3)]}, "pair"),
}
CONFIGS = MODES["elem"][3]
KYS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
MS = (1, 4, 8, 16)


def record_bytes(keep: int, mode: str = "elem") -> int:
    if mode == "pair":
        return (4 + 4 * keep + 7) // 8 * 8
    return 8 + 2 * ((keep + 3) & ~3)


def sparsity_of(keep: int, mode: str = "elem") -> float:
    return 1.0 - keep / (32 if mode == "pair" else 64)


def tile_channels() -> np.ndarray:
    """[b, p, e] -> input channel within a step (32 channels) of k-tile b's column pair p, half e:
    8 p + 2 (b ^ p) + e."""
    b, p, e = np.meshgrid(np.arange(4), np.arange(4), np.arange(2), indexing="ij")
    return 8 * p + 2 * (b ^ p) + e


def _tiles(w: np.ndarray) -> np.ndarray:
    """W [n, k] -> tiles [G, s, a, b, 64] in record order; position e * 32 + 4 r + p (the bitmap's bit)."""
    n, k = w.shape
    rg, steps = n // 64, k // 32
    wt = w.reshape(rg, 8, 8, steps, 4, 8).transpose(0, 3, 1, 2, 4, 5)  # [G, s, a, r, p, c8]
    ch = tile_channels() % 8  # channel within the pair's 8 = 2 (b ^ p) + e
    p = np.broadcast_to(np.arange(4)[None, :, None], ch.shape)
    t = wt[:, :, :, :, p, ch]  # [G, s, a, r, b, p, e]
    return t.transpose(0, 1, 2, 4, 6, 3, 5).reshape(rg, steps, 8, 4, 64)  # [G, s, a, b, (e, r, p)]


def _untile(t: np.ndarray, n: int, k: int) -> np.ndarray:
    rg, steps = n // 64, k // 32
    tt = t.reshape(rg, steps, 8, 4, 2, 8, 4).transpose(0, 1, 2, 5, 3, 6, 4)  # [G, s, a, r, b, p, e]
    wt = np.zeros((rg, steps, 8, 8, 4, 8), dtype=t.dtype)  # [G, s, a, r, p, c8]
    ch = tile_channels() % 8
    p = np.broadcast_to(np.arange(4)[None, :, None], ch.shape)
    wt[:, :, :, :, p, ch] = tt
    return wt.transpose(0, 2, 3, 1, 4, 5).reshape(n, k)


def _top(score: np.ndarray, keep: int) -> np.ndarray:
    """Keep-mask of the ``keep`` largest of ``score`` along the last axis."""
    idx = np.argpartition(-score, keep - 1, axis=-1)[..., :keep]
    m = np.zeros(score.shape, dtype=bool)
    np.put_along_axis(m, idx, True, axis=-1)
    return m


def lanebank(k: int, n: int, keep: int, seed: int, mode: str = "elem"):
    """Random normal fp16 W [n, k] pruned per tile (8 rows x the 8 channels of one k-tile): ``elem`` keeps its
    ``keep`` largest magnitudes of 64; ``half`` keeps (keep + 1) // 2 of the 32 even-channel positions (bitmap word
    0) and keep // 2 of the odd ones (word 1); ``pair`` keeps ``keep`` of its 32 pairs of adjacent channels (largest
    |a| + |b|). Returns (W pruned, dense fp16, input channel order) and the records in the kernel's chunk-major
    order (uint8)."""
    assert k % 32 == 0 and n % 64 == 0, "the prototype needs K % 32 == 0 and N % 64 == 0"
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k), dtype=np.float32).astype(np.float16)
    t = _tiles(w)
    a = np.abs(t.astype(np.float32))
    if mode == "elem":
        mask = _top(a, keep)
    elif mode == "half":
        mask = np.concatenate([_top(a[..., :32], (keep + 1) // 2), _top(a[..., 32:], keep // 2)], axis=-1)
    elif mode == "pair":
        words = _top(a[..., :32] + a[..., 32:], keep)  # word w = positions w (low half) and 32 + w (high)
        mask = np.concatenate([words, words], axis=-1)
    else:
        raise ValueError(f"mode {mode!r}: use elem, half or pair")
    r = record_bytes(keep, mode)
    nrec = mask[..., 0].size
    rec = np.zeros((nrec, r), dtype=np.uint8)
    if mode == "pair":
        wbits = mask[..., :32].reshape(nrec, 32)
        bits = (wbits.astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=-1).astype("<u4")
        h = t.reshape(nrec, 64).astype("<f2").view("<u2").astype(np.uint32)
        wv = (h[:, :32] | (h[:, 32:] << 16))  # tile word w = (low half, high half)
        order = np.argsort(~wbits, axis=-1, kind="stable")[:, :keep]  # kept words, ascending
        rec[:, :4] = bits.view(np.uint8).reshape(nrec, 4)
        rec[:, 4:4 + 4 * keep] = np.take_along_axis(wv, order, axis=-1).astype("<u4").view(np.uint8).reshape(
            nrec, 4 * keep)
    else:
        flat = mask.reshape(nrec, 64)
        bits = (flat.astype(np.uint64) << np.arange(64, dtype=np.uint64)).sum(axis=-1).astype("<u8")
        order = np.argsort(~flat, axis=-1, kind="stable")[:, :keep]  # kept positions, ascending
        vals = np.take_along_axis(t.reshape(nrec, 64), order, axis=-1)
        rec[:, :8] = bits.view(np.uint8).reshape(nrec, 8)
        rec[:, 8:8 + 2 * keep] = vals.astype("<f2").view(np.uint8).reshape(nrec, 2 * keep)
    rec = np.ascontiguousarray(rec.reshape(-1, 16, r // 8, 8).transpose(0, 2, 1, 3)).reshape(-1)
    return _untile(t * mask, n, k), rec


def simulate(rec: np.ndarray, x: np.ndarray, k: int, n: int, keep: int, mode: str = "elem") -> np.ndarray:
    """The kernel's data path in numpy, lane by lane (small layers; CPU tests): each lane scatters its record's
    values into its slot of a [32 words x 32 banks] buffer (halves), read k gives lane j word j of slot k ^ j (the
    32 banks are checked distinct), the A and B fragments are assembled as mma.m16n8k16 takes them, and the
    accumulators are stored to the output rows the kernel's epilogue names. Returns Y [M, n] (float64)."""
    r_bytes = record_bytes(keep, mode)
    logical = rec.reshape(-1, r_bytes // 8, 16, 8).transpose(0, 2, 1, 3).reshape(-1, r_bytes)
    m_rows = x.shape[0]
    steps = k // 32
    y = np.zeros((m_rows, n))
    xf = x.astype(np.float64)
    for grp in range(n // 64):
        for s in range(steps):
            buf = np.zeros((32, 32, 2))  # [word, bank = slot, half]
            for lane in range(32):
                rr = logical[(grp * steps + s) * 32 + lane]
                if mode == "pair":
                    bits = int(rr[:4].view("<u4")[0])
                    vals = rr[4:4 + 4 * keep].view("<f2").astype(np.float64).reshape(keep, 2)
                    set_bits = [c for c in range(32) if bits >> c & 1]
                    assert len(set_bits) == keep
                    assert not rr[4 + 4 * keep:].any(), "padding must be zero"
                    for j, c in enumerate(set_bits):
                        assert ((128 * c + 4 * lane) // 4) % 32 == lane  # the lane's own bank
                        buf[c, lane] = vals[j]
                    continue
                bits = int(rr[:8].view("<u8")[0])
                vals = rr[8:8 + 2 * keep].view("<f2").astype(np.float64)
                set_bits = [c for c in range(64) if bits >> c & 1]
                assert len(set_bits) == keep
                if mode == "half":  # the kernel's walks assume these counts per bitmap word
                    assert sum(c < 32 for c in set_bits) == (keep + 1) // 2
                for j, c in enumerate(set_bits):
                    byte = 128 * (c & 31) + 4 * lane + 2 * (c >> 5)  # the walk's address
                    assert (byte // 4) % 32 == lane  # the lane's own bank
                    buf[c & 31, lane, c >> 5] = vals[j]

            def read(kk):
                banks = [((128 * j + 4 * (kk ^ j)) // 4) % 32 for j in range(32)]
                assert len(set(banks)) == 32
                return [buf[j, kk ^ j] for j in range(32)]  # lane j: (low, high)

            for mb in range((m_rows + 7) // 8):
                for hp in range(4):
                    h1, h2 = 2 * hp, 2 * hp + 1
                    d = np.zeros((16, 8))
                    for lp in range(2):
                        l1, l2 = 2 * lp, 2 * lp + 1
                        regs = [read(4 * h1 + l1), read(4 * h2 + l1), read(4 * h1 + l2), read(4 * h2 + l2)]
                        a = np.zeros((16, 16))
                        b = np.zeros((16, 8))
                        for lane in range(32):
                            g, q = lane // 4, lane % 4
                            for reg, (ro, co) in enumerate([(0, 0), (8, 0), (0, 8), (8, 8)]):
                                a[g + ro, co + 2 * q: co + 2 * q + 2] = regs[reg][lane]
                            row = g + 8 * mb
                            for reg, (ro, li) in enumerate([(0, l1), (8, l2)]):
                                if row < m_rows:  # X row g + 8 mb, word li of channels 8 q .. 8 q + 7
                                    b[ro + 2 * q: ro + 2 * q + 2, g] = xf[row, 32 * s + 8 * q + 2 * li:
                                                                           32 * s + 8 * q + 2 * li + 2]
                        d += a @ b
                    for g in range(8):
                        for c in range(8):
                            if 8 * mb + c < m_rows:
                                y[8 * mb + c, 64 * grp + 8 * (h1 ^ g) + g] += d[g, c]
                                y[8 * mb + c, 64 * grp + 8 * (h2 ^ g) + g] += d[g + 8, c]
    return y


def rule_ky(s: int, rg: int, ks: int, per_sm: int, sms: int) -> int:
    """KY with the fewest modelled waves x (steps per warp + 2), the smallest on ties."""
    best = None
    for ky in KYS:
        if s // ky < ks or (ky > 1 and rg * ky > 8 * sms):
            continue
        waves = -(-rg * ky // max(1, per_sm * sms))
        cost = waves * (-(-s // (ky * ks)) + 2)
        if best is None or cost < best[0]:
            best = (cost, ky)
    return best[1] if best else 1


def _job(job):
    import bitmap_balanced_explore as bbe

    from edgesdk.formats import bitmap_linear as fmt

    k, n, s, seed, mode = job
    keep = MODES[mode][2][s]
    wp, rec = lanebank(k, n, keep, seed, MODES[mode][4])
    p = fmt.BitmapLinearWeights.pack(wp.astype(np.float32), "float16")
    old = None
    if mode == "elem" and k % 128 == 0 and n % 16 == 0:
        sched = keep % 4 != 0
        wo, reco, _ = bbe.balanced(k, n, keep, seed, sched=sched)
        old = (wo, reco, "bals" if sched else "bal")
    return job, wp, rec, p.node_attributes(), p.to_tensors(), p.nbytes, old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4096 x 4096 and 4096 x 11008 only")
    ap.add_argument("--rotate", type=float, default=4.0,
                    help="weight copies cycled through per timing, together this many times L2 (default 4)")
    ap.add_argument("--modes", default="elem", help="comma-separated: elem, half, pair (see lanebank())")
    ap.add_argument("--sparsities", default=None, help="comma-separated subset, e.g. 0.7")
    ap.add_argument("--ky-all", action="store_true", help="time every KY, not only the rule's and its neighbours")
    ap.add_argument("--ablate", action="store_true", help="timing-only builds of one configuration (LB_ABL)")
    ap.add_argument("--profile", action="store_true",
                    help="3 launches of one configuration of each kernel (4096 x 11008, 70 %%, M = 1), for ncu")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.ablate or args.profile:
        return ablate(args)

    import torch

    import bench.bench_bitmap_linear as bbl
    import bitmap_balanced_explore as bbe
    from bench._common import git_commit, meta, print_table, time_graph, write_results
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import bitmap_linear as kbl

    shapes = [(k, n) for (k, n) in bbl.SHAPES if k % 32 == 0 and n % 64 == 0]
    if args.quick:
        shapes = shapes[:2]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cu = _cuda._driver()
    modes = args.modes.split(",")
    kern = {(mode, keep, ks, dp, mb): _cuda.get_kernel(SRC, f"{MODES[mode][0]}_k{keep}_w{ks}_d{dp}_m{mb}")
            for mode in modes for keep, cf in MODES[mode][3].items() for ks, dp in cf for mb in (1, 2)}
    old_kern = {(keep, nw, dp, mb): _cuda.get_kernel(bbe.SRC, f"bal_k{keep}_w{nw}_d{dp}_m{mb}")
                for keep, cf in bbe.CONFIGS.items() for nw, dp in cf for mb in (1, 2) if mb == 1 or nw < 16}
    ws = torch.empty(max(KYS) * 16 * max(n for _, n in shapes), device="cuda", dtype=torch.float32)
    cnt = torch.zeros(max(n for _, n in shapes) // 64, device="cuda", dtype=torch.int32)
    t0 = time.time()
    only = {float(v) for v in args.sparsities.split(",")} if args.sparsities else None
    jobs = [(k, n, s, 1000 * i + int(10 * s), mode) for i, (k, n) in enumerate(shapes) for mode in modes
            for s in MODES[mode][2] if only is None or s in only]
    rows, bad = [], 0
    with ProcessPoolExecutor(8) as ex:
        for (k, n, s, _, mode), wp, rec, attrs, tens, nb_v1, old in ex.map(_job, jobs):
            keep = MODES[mode][2][s]
            steps, rg = k // 32, n // 64
            nrec = bbe.copies(rec.nbytes, l2, args.rotate)
            d0 = torch.from_numpy(rec).cuda()
            recs = [d0] + [d0.clone() for _ in range(nrec - 1)]
            base = [torch.from_numpy(v).cuda() for v in tens.values()]
            nv1 = bbe.copies(nb_v1, l2, args.rotate)
            v1 = [base] + [[t.clone() for t in base] for _ in range(nv1 - 1)]
            wd = torch.from_numpy(wp).cuda()
            nd = bbe.copies(wd.numel() * 2, l2, args.rotate)
            wds = [wd] + [wd.clone() for _ in range(nd - 1)]
            if old is not None:
                wo, reco, old_var = old
                o0 = torch.from_numpy(reco).cuda()
                olds = [o0] + [o0.clone() for _ in range(nrec - 1)]
                wo64 = wo.astype(np.float64)
            w64 = wp.astype(np.float64)
            for m in MS:
                xh = np.random.default_rng(k + m).uniform(-1, 1, (m, k)).astype(np.float16)
                ref = xh.astype(np.float64) @ w64.T
                x = torch.from_numpy(xh).cuda()
                y = torch.empty(m, n, device="cuda", dtype=torch.float16)

                def ok(label, ref=ref):
                    torch.cuda.synchronize()
                    got = y.cpu().numpy().astype(np.float64)
                    tol = 2e-3 * np.abs(ref) + 2e-3 * np.abs(ref).max()
                    good = bool(np.all(np.abs(got - ref) <= tol))
                    if not good:
                        print(f"BAD {label} {k}x{n} s={s} M={m}: max err {np.nanmax(np.abs(got - ref)):.3g}",
                              flush=True)
                    return good

                row = {"K": k, "N": n, "M": m, "sparsity": s, "mode": mode, "keep": keep,
                       "sparsity_actual": sparsity_of(keep, MODES[mode][4]),
                       "record_bytes": record_bytes(keep, MODES[mode][4]),
                       "bytes_balanced": rec.nbytes, "bytes_v1": nb_v1, "bytes_dense": 2 * n * k}
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
                bad += not row["ok_t1"]
                row["t1_us"] = time_graph(t1, inner=nv1, reps=10)
                mb = 1 if m <= 8 else 2
                rule_best = None
                for ks, dp in MODES[mode][3][keep]:
                    kk = kern[(mode, keep, ks, dp, mb)]
                    smem = 128 + ks * 8192
                    kk.set_max_dynamic_smem(smem)
                    per_sm = int(_cuda.check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                        kk.function, 32 * ks, smem)))
                    rky = rule_ky(steps, rg, ks, per_sm, sms)
                    near = KYS[max(0, KYS.index(rky) - 1):KYS.index(rky) + 2]
                    for ky in KYS:
                        if steps // ky < ks or (ky > 1 and rg * ky > 8 * sms) or not (args.ky_all or ky in near):
                            continue
                        lab = f"lb_w{ks}_d{dp}_y{ky}"
                        c = [0]

                        def lb(kk=kk, smem=smem, ky=ky, ks=ks):
                            kk.launch((rg, ky), (32 * ks,),
                                      [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(recs[c[0] % nrec].data_ptr()),
                                       ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(ws.data_ptr()),
                                       ctypes.c_void_p(cnt.data_ptr()), ctypes.c_int(m), ctypes.c_int(k),
                                       ctypes.c_int(n)], torch.cuda.current_stream().cuda_stream, smem)
                            c[0] += 1

                        y.fill_(float("nan"))
                        lb()
                        row[f"ok_{lab}"] = ok(lab)
                        bad += not row[f"ok_{lab}"]
                        row[f"{lab}_us"] = time_graph(lb, inner=nrec, reps=10)
                        if ky == rky and (rule_best is None or row[f"{lab}_us"] < row[f"{rule_best}_us"]):
                            rule_best = lab
                best = min((k_[:-3] for k_ in row if k_.startswith("lb_w") and k_.endswith("_us")),
                           key=lambda lab: row[f"{lab}_us"])
                row["lb_us"], row["lb_config"] = row[f"{best}_us"], best
                row["lb_rule_us"], row["lb_rule_config"] = row[f"{rule_best}_us"], rule_best
                if old is not None:  # round 14's prototype, best configuration, on its own balanced W
                    yo = xh.astype(np.float64) @ wo64.T
                    for nw, dp in bbe.CONFIGS[keep]:
                        if (keep, nw, dp, mb) not in old_kern:
                            continue
                        kk = old_kern[(keep, nw, dp, mb)]
                        smem = nw * 2 * 32 * bbe.TILE_STRIDE + nw * 1024
                        kk.set_max_dynamic_smem(smem)
                        per_sm = int(_cuda.check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                            kk.function, 32 * nw, smem)))
                        for grid in sorted({n // 16, min(n // 16, per_sm * sms)}):
                            lab = f"old_{old_var}_w{nw}_d{dp}" + ("_pers" if grid < n // 16 else "")
                            c = [0]

                            def bal(kk=kk, smem=smem, grid=grid, nw=nw):
                                kk.launch((grid,), (32 * nw,),
                                          [ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(olds[c[0] % nrec].data_ptr()),
                                           ctypes.c_void_p(y.data_ptr()), ctypes.c_int(m), ctypes.c_int(k),
                                           ctypes.c_int(n)], torch.cuda.current_stream().cuda_stream, smem)
                                c[0] += 1

                            y.fill_(float("nan"))
                            bal()
                            row[f"ok_{lab}"] = ok(lab, yo)
                            bad += not row[f"ok_{lab}"]
                            row[f"{lab}_us"] = time_graph(bal, inner=nrec, reps=10)
                    best_o = min((k_[:-3] for k_ in row if k_.startswith("old_") and k_.endswith("_us")),
                                 key=lambda lab: row[f"{lab}_us"])
                    row["old_us"], row["old_config"] = row[f"{best_o}_us"], best_o
                    row["lb_vs_old"] = row["old_us"] / row["lb_us"]
                    row["old_speedup"] = row["cublas_us"] / row["old_us"]
                row["t1_speedup"] = row["cublas_us"] / row["t1_us"]
                row["lb_speedup"] = row["cublas_us"] / row["lb_us"]
                row["lb_rule_speedup"] = row["cublas_us"] / row["lb_rule_us"]
                row["lb_vs_t1"] = row["t1_us"] / row["lb_us"]
                row["lb_GBps"] = (rec.nbytes + 2 * m * (k + n)) / row["lb_us"] / 1e3
                row["cublas_GBps"] = (2 * n * k + 2 * m * (k + n)) / row["cublas_us"] / 1e3
                rows.append(row)
                print(f"{mode} {k}x{n} s={s} M={m}: cuBLAS {row['cublas_us']:.1f} t1 {row['t1_us']:.1f} "
                      f"old {row.get('old_us', float('nan')):.1f} lb {row['lb_us']:.1f} ({row['lb_config']}) "
                      f"rule {row['lb_rule_us']:.1f} us; {row['lb_GBps']:.0f} GB/s", flush=True)
            recs = v1 = wds = olds = None
            torch.cuda.empty_cache()
    print_table(rows, ["mode", "K", "N", "M", "sparsity", "cublas_us", "t1_us", "old_us", "lb_us", "lb_rule_us",
                       "lb_speedup", "lb_rule_speedup", "lb_vs_old", "lb_GBps"])
    summary = []
    for mode, s in [(mo, s) for mo in modes for s in MODES[mo][2]]:
        sel = [r for r in rows if r["mode"] == mode and r["sparsity"] == s and r["K"] * r["N"] >= 4 * 1024 * 1024]
        if not sel:
            continue

        def med(key, rs=sel):
            v = [r[key] for r in rs if key in r]
            return statistics.median(v) if v else None

        summary.append({"mode": mode, "sparsity": s, "sparsity_actual": sel[0]["sparsity_actual"], "rows": len(sel),
                        "median_t1_speedup": med("t1_speedup"),
                        "median_old_speedup": med("old_speedup"), "median_lb_speedup": med("lb_speedup"),
                        "median_lb_rule_speedup": med("lb_rule_speedup"),
                        "min_lb_speedup": min(r["lb_speedup"] for r in sel),
                        "min_lb_rule_speedup": min(r["lb_rule_speedup"] for r in sel),
                        "median_lb_vs_old": med("lb_vs_old"), "median_lb_vs_t1": med("lb_vs_t1"),
                        "M<=8 median_lb_speedup": med("lb_speedup", [r for r in sel if r["M"] <= 8])})
        print(summary[-1])
    print(f"outputs not matching the reference: {bad}; {time.time() - t0:.0f} s")
    name = args.out or f"bitmap_lanebank_explore_{git_commit()}"
    print("wrote", write_results(name, rows, meta({
        "summary": summary, "bad_outputs": bad, "rotate_l2": args.rotate,
        "note": "balanced pruning (exactly keep of every tile of 8 rows x 8 channels; mode half: per even / odd "
                "channels of the tile; mode pair: keep pairs of adjacent channels of 32); tools/bitmap_lanebank.cu "
                "(lane-owned banks, XOR-diagonal reads) vs tactic 1 (format v1 of the same W) vs cuBLAS fp16 (the "
                "same W dense) vs round 14's tools/bitmap_balanced.cu (best configuration, its own balanced W of "
                "the same shape and keep); speedup = cuBLAS time / ours; lb = fastest (KS, depth, KY), lb_rule = "
                "KY by rule_ky, fastest (KS, depth)"})))


ABLATIONS = {"full": 0, "no_zero_fill": 1, "no_scatter": 2, "no_reads": 4, "no_record_loads": 8, "no_mma": 16,
             "no_scatter_no_reads": 6}
ONEBUF = ("-DLB_ONEBUF", "-DLB_MINB=4")  # one buffer per warp, 64 registers: 4 blocks of 8 warps per SM


def ablate(args) -> None:
    """Timing-only builds (LB_ABL) of lb_k19_w8_d2_m1 at the rule's KY beside round 14's prototype (plain records,
    8 warps, depth 2, one block per strip pair) and its conflict-free timing build (BAL_ABL = 4), 70 %, M = 1 and
    8; medians of 3 timings. ``--profile``: 3 launches each of the full builds on 4096 x 11008, M = 1, no timing."""
    import torch

    import bitmap_balanced_explore as bbe
    from bench._common import git_commit, meta, print_table, time_graph, write_results
    from edgesdk.kernels import _cuda

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cu = _cuda._driver()
    keep, ks, dp = 19, 8, 2
    smem = 128 + ks * 8192
    osmem = ks * 2 * 32 * bbe.TILE_STRIDE + ks * 1024
    layers = [(4096, 11008)] if args.profile else [(4096, 4096), (11008, 4096), (4096, 11008)]
    ws = torch.empty(max(KYS) * 16 * 11008, device="cuda", dtype=torch.float32)
    cnt = torch.zeros(11008 // 64, device="cuda", dtype=torch.int32)
    rows = []
    for k, n in layers:
        _, rec = lanebank(k, n, keep, 7)
        _, reco, _ = bbe.balanced(k, n, keep, 7)
        nrec = bbe.copies(rec.nbytes, l2, args.rotate)
        recs = [torch.from_numpy(rec).cuda()]
        recs += [recs[0].clone() for _ in range(nrec - 1)]
        olds = [torch.from_numpy(reco).cuda()]
        olds += [olds[0].clone() for _ in range(nrec - 1)]
        steps, rg = k // 32, n // 64
        for m in ((1,) if args.profile else (1, 8)):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            y = torch.empty(m, n, device="cuda", dtype=torch.float16)
            row = {"K": k, "N": n, "M": m, "sparsity": 0.7}
            variants = [(lab, "lb", a) for lab, a in ABLATIONS.items()]
            variants += [("onebuf_4blocks", "lb1", 0), ("onebuf_4blocks_no_scatter", "lb1", 2)]
            variants += [("old_full", "old", 0), ("old_conflict_free", "old", 4)]
            if args.profile:
                variants = [("full", "lb", 0), ("onebuf_4blocks", "lb1", 0), ("old_full", "old", 0)]
            for lab, kind, a in variants:
                if kind in ("lb", "lb1"):
                    opts = (f"-DLB_ABL={a}",) + (ONEBUF if kind == "lb1" else ())
                    kk = _cuda.get_kernel(SRC, f"lb_k{keep}_w{ks}_d{dp}_m1", opts)
                    sm_ = 128 + ks * (4096 if kind == "lb1" else 8192)
                    kk.set_max_dynamic_smem(sm_)
                    per_sm = int(_cuda.check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                        kk.function, 32 * ks, sm_)))
                    ky = rule_ky(steps, rg, ks, per_sm, sms)
                    row[f"{lab}_ky"], row[f"{lab}_blocks_per_sm"] = ky, per_sm
                    grid, args_of = (rg, ky), lambda c: [
                        ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(recs[c % nrec].data_ptr()),
                        ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(ws.data_ptr()),
                        ctypes.c_void_p(cnt.data_ptr()), ctypes.c_int(m), ctypes.c_int(k), ctypes.c_int(n)]
                else:
                    kk = _cuda.get_kernel(bbe.SRC, f"bal_k{keep}_w{ks}_d{dp}_m1", (f"-DBAL_ABL={a}",))
                    kk.set_max_dynamic_smem(osmem)
                    grid, sm_, args_of = (n // 16,), osmem, lambda c: [
                        ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(olds[c % nrec].data_ptr()),
                        ctypes.c_void_p(y.data_ptr()), ctypes.c_int(m), ctypes.c_int(k), ctypes.c_int(n)]
                c = [0]

                def run(kk=kk, grid=grid, sm_=sm_, args_of=args_of):
                    kk.launch(grid, (32 * ks,), args_of(c[0]), torch.cuda.current_stream().cuda_stream, sm_)
                    c[0] += 1

                if args.profile:
                    for _ in range(3):
                        run()
                    torch.cuda.synchronize()
                    continue
                row[f"{lab}_us"] = statistics.median(time_graph(run, inner=nrec, reps=10) for _ in range(3))
            if args.profile:
                continue
            for lab, _, _ in variants:
                row[f"{lab}_speedup"] = row["full_us"] / row[f"{lab}_us"]
            rows.append(row)
            print(row, flush=True)
        recs = olds = None
        torch.cuda.empty_cache()
    if args.profile:
        return
    print_table(rows, ["K", "N", "M", "full_ky"] + [f"{lab}_us" for lab in [
        *ABLATIONS, "onebuf_4blocks", "onebuf_4blocks_no_scatter", "old_full", "old_conflict_free"]])
    name = args.out or f"bitmap_lanebank_ablate_{git_commit()}"
    print("wrote", write_results(name, rows, meta({
        "rotate_l2": args.rotate,
        "note": "timing-only builds (LB_ABL) of lb_k19_w8_d2_m1 at rule_ky's KY; old_* = round 14's bal_k19_w8_d2_m1 "
                "(plain records, one block per strip pair), old_conflict_free = its BAL_ABL=4 build; "
                "speedup = full / variant"})))


if __name__ == "__main__":
    main()
