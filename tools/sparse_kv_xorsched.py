#!/usr/bin/env python3
"""Records whose store order is scheduled against the scatter's bank conflicts (session 33, an experiment).

Session 32's ablation found the pipelined kernels' tile bound by the bank conflicts of the decode's scatter: the 32
lanes of a warp each store one value of their own K or V row per instruction, into a bank that depends on the
value's channel, ≈ 3 wavefronts per store instruction where 1 would do. The order in which a lane stores its values
follows the bitmap (RegDecode64: values 0-9 ascending, 10-19 descending), so it is fixed by the data.

Here the compressor chooses it. A record may store its bitmap and values in a permuted channel order: bit ``c'`` of
the stored bitmap says that channel ``c' ^ x`` is kept, values in ascending ``c'``, with ``x`` (6 bits) in the last
padding half (records of keep < 20 at d = 64 have one). The decoder walks the stored bitmap as before and stores at
``c' ^ x`` (one more ``LOP3`` per value on one of the two walks). Per 16-token tile (the 32 records one warp decodes
together: K of tokens 0-15 on lanes 0-15, V on 16-31) ``x`` of each record is chosen by coordinate descent on the
tile's modelled wavefronts: the sum over the 20 store instructions of the busiest bank's count of stores.

The transform runs in torch on the GPU over a cache that ``ks.prefill`` made; the register kernels built from ``--alt``
(the XOR-aware decoders) run on the transformed cache, the shipped kernels on the original, on the same plans (tactic 4
at the benchmark's split sizes, tactic 5 with ``--tactic5``), outputs compared bit for bit, CUDA-graph replays over
caches rotated beyond L2, kinds taking turns over ``--rounds`` rounds, medians. Kind ``alt0``: the XOR-aware kernels
on the original cache (x = 0 everywhere): the decoder's extra instructions alone.

Usage: python tools/sparse_kv_xorsched.py --alt FILE [--rounds N] [--iters N] [--tactic5] [--out NAME]
       [--shapes MODEL:B:CTX,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402

# RegDecode64's store order: the value index of each of its 20 store instructions (19-17 predicated on keep)
STEPS = (19, 0, 18, 1, 17, 2, 16, 3, 15, 4, 14, 5, 13, 6, 12, 7, 11, 8, 10, 9)
ROW_BANK_STEP = 4  # tile rows of 72 halfs: row r starts 4 r banks on (K and V tiles alike)


def to_logical(rec: torch.Tensor) -> torch.Tensor:
    B, H, cap, R = rec.shape
    return rec.view(B, H, cap // 16, R // 8, 16, 8).permute(0, 1, 2, 4, 3, 5).reshape(B, H, cap, R)


def to_physical(rec: torch.Tensor) -> torch.Tensor:
    B, H, cap, R = rec.shape
    return rec.view(B, H, cap // 16, 16, R // 8, 8).permute(0, 1, 2, 4, 3, 5).reshape(B, H, cap, R).contiguous()


def _sched_chunk(recs: torch.Tensor, keep: int, iters: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """recs uint8 [T, 32, R] (lanes: K rows 0-15, V rows 16-31) → (new recs, wavefronts per tile before, after)."""
    T, NL, R = recs.shape
    dev = recs.device
    c64 = torch.arange(64, device=dev)
    bits = ((recs[..., :8].long()[..., c64 // 8] >> (c64 % 8)) & 1).bool()  # [T, 32, 64]
    valid = bits.sum(-1) == keep
    ch = torch.where(bits, c64, 64 + c64).sort(-1).values[..., :keep]  # kept channels ascending [T, 32, keep]
    X = torch.arange(64, device=dev)
    cx = ch[:, :, None, :] ^ X[None, None, :, None]  # [T, 32, 64, keep]
    s = cx.sort(-1).values ^ X[None, None, :, None]  # real channel of stored value i
    row = (torch.arange(NL, device=dev) % 16) * ROW_BANK_STEP
    steps = torch.tensor([v if v < keep else 0 for v in STEPS], device=dev)
    active = torch.tensor([v < keep for v in STEPS], device=dev)
    banks = (row[None, :, None, None] + (s[..., steps] >> 1)) % 32  # [T, 32, 64, 20]
    banks = torch.where(active & valid[:, :, None, None], banks, -1).to(torch.int16)
    ar = torch.arange(T, device=dev)
    cur = torch.zeros((T, NL), dtype=torch.long, device=dev)

    def add(lane: int, sign: int) -> None:
        b = banks[ar, lane, cur[:, lane]].long()  # [T, 20]
        counts.scatter_add_(2, b.clamp(min=0)[..., None], (sign * (b >= 0).long())[..., None])

    counts = torch.zeros((T, len(STEPS), 32), dtype=torch.long, device=dev)
    for lane in range(NL):
        add(lane, 1)
    before = counts.max(-1).values.sum(-1)
    for _ in range(iters):
        for lane in range(NL):
            add(lane, -1)
            m = counts.max(-1).values  # [T, 20]
            cand = banks[:, lane].long()  # [T, 64, 20]
            g = torch.gather(counts[:, None].expand(T, 64, len(STEPS), 32), 3, cand.clamp(min=0)[..., None])[..., 0]
            cost = torch.where(cand >= 0, torch.maximum(m[:, None], g + 1), m[:, None]).sum(-1)  # [T, 64]
            cur[:, lane] = torch.where(valid[:, lane], cost.argmin(-1), 0)
            add(lane, 1)
    after = counts.max(-1).values.sum(-1)
    # the records in the chosen order
    x = cur  # [T, 32]
    order = (ch ^ x[..., None]).argsort(-1)
    vals = recs[..., 8:].contiguous().view(torch.int16)  # [T, 32, R/2 - 4]
    newv = vals.clone()
    newv[..., :keep] = vals[..., :keep].gather(-1, order)
    if keep < vals.shape[-1]:
        newv[..., -1] = x.to(torch.int16)
    nbits = bits.gather(-1, c64[None, None, :] ^ x[..., None]).long()  # stored bit c' = kept(c' ^ x)
    nbm = (nbits.view(T, NL, 8, 8) << torch.arange(8, device=dev)).sum(-1).to(torch.uint8)
    out = torch.cat([nbm, newv.view(torch.uint8)], -1)
    out = torch.where(valid[..., None], out, recs)
    return out, before, after


def xor_schedule(k_rec: torch.Tensor, v_rec: torch.Tensor, keep: int, iters: int = 3, chunk: int = 4096):
    """Physical K and V record arrays [B, H, cap, 48] → transformed copies and the modelled wavefronts per tile
    (mean before, mean after)."""
    kl, vl = to_logical(k_rec), to_logical(v_rec)
    B, H, cap, R = kl.shape
    recs = torch.stack([kl.reshape(-1, 16, R), vl.reshape(-1, 16, R)], 1).reshape(-1, 32, R)
    outs, bef, aft = [], [], []
    for i in range(0, recs.shape[0], chunk):
        o, b, a = _sched_chunk(recs[i:i + chunk], keep, iters)
        outs.append(o)
        bef.append(b)
        aft.append(a)
    out = torch.cat(outs).view(-1, 2, 16, R)
    nk = to_physical(out[:, 0].reshape(B, H, cap, R))
    nv = to_physical(out[:, 1].reshape(B, H, cap, R))
    b, a = torch.cat(bef).double(), torch.cat(aft).double()
    return nk, nv, b.mean().item(), a.mean().item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--alt", required=True, help="sparse_kv.cu whose register kernels decode x (the XOR)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--tactic5", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default=None, help="model:B:ctx,...")
    args = ap.parse_args()

    from bench._common import meta, print_table, time_graph, write_results
    from bench.bench_sparse_kv import MODELS, dense_inputs, sparse_caches, split_sizes
    from edgesdk.kernels import sparse_kv as ks

    alt = str(Path(args.alt).resolve())
    kinds = ("ship", "xor", "alt0")
    stream = torch.cuda.Stream()
    raw = stream.cuda_stream
    rows = []
    out_name = args.out or f"sparse_kv_xorsched_{meta()['commit']}"
    shapes = [(m, b, c) for m in MODELS for b in (1, 4, 16) for c in (4096, 16384, 32768)]
    if args.shapes:
        shapes = [(m, int(b), int(c)) for m, b, c in (x.split(":") for x in args.shapes.split(","))]
    for model, B, ctx in shapes:
        hq, hkv, d = MODELS[model]
        k, v, q, lens = dense_inputs(hq, hkv, d, B, ctx)
        cfg = SparseKVConfig(d, hq, hkv, 0.7, 0.7, ctx + 1)
        assert cfg.keep_k == cfg.keep_v and ks.uses_register_records(d, cfg.rk, cfg.rv, 16)
        caches, cptr = sparse_caches(cfg, B, ctx, k, v, lens)
        t0 = time.perf_counter()
        nk, nv, wf0, wf1 = xor_schedule(caches[0][0], caches[0][1], cfg.keep_k, args.iters)
        torch.cuda.synchronize()
        t_sched = time.perf_counter() - t0
        xc = [(nk, nv, c[2], c[3]) if i == 0 else (nk.clone(), nv.clone(), c[2], c[3]) for i, c in enumerate(caches)]
        xptr = [ks.CachePtrs(*(t.data_ptr() for t in c), lens.data_ptr()) for c in xc]
        plans = []
        tw = [ks.WIDE16_FUSED] + ([ks.STREAM_K] if args.tactic5 else [])
        for tactic in tw:
            ts0, _ = ks.plan_cache(cfg, B, ctx, tactic=tactic)
            plans += [(tactic, ts) for ts in split_sizes(tactic, ts0, ks.MAX_TOKENS_PER_SPLIT2)
                      if ts % 256 == 0 and (tactic, ts) not in plans]
        calls = {}
        for tactic, ts in plans:
            _, ns = ks.plan_cache(cfg, B, ctx, tokens_per_split=ts, tactic=tactic)
            for kind in kinds:
                p = ks._Plan(ks._ATT_PTRS)
                saved = ks.SOURCE
                ks.SOURCE = saved if kind == "ship" else alt
                try:
                    p.launches = ks._attention_launches(d, hq, hkv, B, ctx, ks._geometry(cfg), cfg.rk, cfg.rv,
                                                        None, None, ts, tactic, None, p.addr)
                finally:
                    ks.SOURCE = saved
                p.extra["parts"] = 4 * ks._counter_words(B, hq)
                ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
                o = torch.full((B, hq, d), float("nan"), dtype=torch.float16, device="cuda")
                calls[(tactic, ts, kind)] = (p, ws, o, xptr if kind == "xor" else cptr)
        torch.cuda.synchronize()
        it = iter(range(1 << 30))

        def call(key):
            p, ws, o, ptrs = calls[key]
            c = ptrs[next(it) % len(ptrs)]
            p.set(q.data_ptr(), ws.data_ptr(), ws.data_ptr() + p.extra["parts"], c.lens, c.k_rec, c.v_rec,
                  c.k_ring, c.v_ring, o.data_ptr())
            ks._cuda.launch_all(p.launches, raw)

        for key in calls:
            call(key)
        stream.synchronize()
        for tactic, ts in plans:
            a = calls[(tactic, ts, "ship")][2]
            assert not torch.isnan(a).any(), f"{model} B={B} {ctx}: NaN"
            for kind in kinds[1:]:
                assert torch.equal(a.view(torch.int16), calls[(tactic, ts, kind)][2].view(torch.int16)), \
                    f"{model} B={B} {ctx} tactic {tactic} split {ts}: {kind} differs from the shipped kernels"
        times = {key: [] for key in calls}
        for _ in range(args.rounds):
            for key in calls:
                times[key].append(time_graph(lambda key=key: call(key), inner=max(20, len(cptr)), reps=10,
                                             stream=stream))
        med = {key: statistics.median(t) for key, t in times.items()}
        row = {"model": model, "batch": B, "context": ctx, "wavefronts_per_tile_model": [wf0, wf1],
               "schedule_s": t_sched,
               "plans": {f"t{t}_{ts}_{kind}": med[(t, ts, kind)] for t, ts, kind in calls},
               "pipelined": {f"t{t}_{ts}": ks.uses_pipelined_records(ts, 16) for t, ts in plans}}
        for kind in kinds:
            row[f"{kind}_best"] = min(med[(t, ts, kind)] for t, ts in plans)
        row["speedup_best_xor"] = row["ship_best"] / row["xor_best"]
        row["speedup_best_alt0"] = row["ship_best"] / row["alt0_best"]
        row["speedup_pipelined_xor"] = [med[(t, ts, "ship")] / med[(t, ts, "xor")] for t, ts in plans
                                        if ks.uses_pipelined_records(ts, 16)]
        row["speedup_pipelined_alt0"] = [med[(t, ts, "ship")] / med[(t, ts, "alt0")] for t, ts in plans
                                         if ks.uses_pipelined_records(ts, 16)]
        rows.append(row)
        print({k_: v_ for k_, v_ in row.items() if k_ != "plans"}, flush=True)
        path = write_results(out_name, rows, meta({"rounds": args.rounds, "iters": args.iters,
                                                   "alt_source": Path(alt).name}))
        calls = cptr = xptr = xc = caches = None
        torch.cuda.empty_cache()
    print_table(rows, ["model", "batch", "context", "ship_best", "xor_best", "alt0_best", "speedup_best_xor",
                       "speedup_best_alt0"])
    for kind in ("xor", "alt0"):
        v = [s for r in rows for s in r[f"speedup_pipelined_{kind}"]]
        if v:
            print(f"{kind}: pipelined plans, shipped ÷ {kind}: median {statistics.median(v):.3f} "
                  f"({min(v):.3f}-{max(v):.3f}), {len(v)} plans")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
