#!/usr/bin/env python3
"""Records stored in an order chosen against the scatter's bank conflicts (session 33): A/B of the shipped kernels.

Session 32's ablation found the pipelined kernels' tile bound by the bank conflicts of the decode's scatter: the 32
lanes of a warp each store one value of their own K or V row per instruction, into a bank set by the value's channel,
≈ 3 wavefronts per store instruction where 1 would do. Since session 33 a d = 64 record of keep 17-19 carries a
store order x (format: ``edgesdk.formats.sparse_kv``, "Store order") that the compressor picks per 16-token tile
(``schedule_records``; ``sparse_kv_prefill`` / ``sparse_kv_append`` on the GPU), and the decoders put the value of
stored channel c' at channel c' ^ x.

Kinds, on the same plans (the default's, tactic 4 at the benchmark's split sizes, tactic 5 with ``--tactic5``):
``sched``: the shipped kernels on a cache the shipped prefill scheduled; ``plain``: the shipped kernels on a cache of
plain records (``ks.SCHEDULE_RECORDS = False``: the decoders' extra instructions alone); ``prev`` (with ``--prev
FILE``, the kernel source before session 33): the old kernels on the plain cache. Outputs compared bit for bit (the
decoded tiles are the same), CUDA-graph replays over caches rotated beyond L2, kinds taking turns over ``--rounds``
rounds, medians. Each row also has the modelled wavefronts per tile (``store_banks``) of both caches' first 64
tiles, and the prefill time of each.

The first version of this tool (commit f417c15, ``tools/sparse_kv_xorsched.py``) transformed caches in torch by
coordinate descent and timed an ``--alt`` build; its results are ``bench/results/sparse_kv_xorsched_8daee11.json``.

Usage: python tools/sparse_kv_schedule.py [--prev FILE] [--rounds N] [--tactic5] [--out NAME]
       [--validation | --shapes MODEL:B:CTX,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from edgesdk.formats import sparse_kv as f  # noqa: E402
from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402


def modelled_wavefronts(k_rec: torch.Tensor, v_rec: torch.Tensor, keep_k: int, keep_v: int, tiles: int = 64) -> float:
    """Mean over the first ``tiles`` 16-token tiles of sequence 0, head 0 of the busiest bank's stores per store
    instruction, summed over the 20 instructions (``store_banks``)."""
    kl = f.records_to_logical(k_rec[:1, :1, :16 * tiles].cpu().numpy())[0, 0]
    vl = f.records_to_logical(v_rec[:1, :1, :16 * tiles].cpu().numpy())[0, 0]
    out = []
    for t0 in range(0, kl.shape[0] // 16 * 16, 16):
        banks = np.concatenate([f.store_banks(kl[t0:t0 + 16], keep_k, np.arange(16)),
                                f.store_banks(vl[t0:t0 + 16], keep_v, np.arange(16))])
        out.append(f._bank_counts(banks).max(-1).sum())
    return float(np.mean(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prev", default=None, help="the sparse_kv.cu before session 33 (kind prev, plain cache)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tactic5", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--validation", action="store_true", help="tools/sparse_kv_regrec.py's VALIDATION shapes")
    ap.add_argument("--shapes", default=None, help="model:B:ctx,...")
    args = ap.parse_args()

    from bench._common import meta, print_table, time_graph, write_results
    from bench.bench_sparse_kv import MODELS, dense_inputs, sparse_caches, split_sizes
    from edgesdk.kernels import sparse_kv as ks
    from tools.sparse_kv_regrec import VALIDATION, VALIDATION_MODELS, issue7_shapes, parse_shapes

    kinds = ("sched", "plain") + (("prev",) if args.prev else ())
    stream = torch.cuda.Stream()
    raw = stream.cuda_stream
    rows = []
    out_name = args.out or f"sparse_kv_schedule_{meta()['commit']}"
    shapes = VALIDATION if args.validation else issue7_shapes(MODELS)
    if args.shapes:
        shapes = parse_shapes(args.shapes)
    models = dict(MODELS, **VALIDATION_MODELS)
    for model, B, ctx in shapes:
        hq, hkv, d = models[model]
        k, v, q, lens = dense_inputs(hq, hkv, d, B, ctx)
        cfg = SparseKVConfig(d, hq, hkv, 0.7, 0.7, ctx + 1)
        assert f.schedules(d, cfg.keep_k, cfg.keep_v) and ks.uses_register_records(d, cfg.rk, cfg.rv, 16)
        built, prefill_s = {}, {}
        for kind, on in (("sched", True), ("plain", False)):
            saved, ks.SCHEDULE_RECORDS = ks.SCHEDULE_RECORDS, on
            try:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                built[kind] = sparse_caches(cfg, B, ctx, k, v, lens)
                prefill_s[kind] = time.perf_counter() - t0  # includes the copies for rotation
            finally:
                ks.SCHEDULE_RECORDS = saved
        wf = {kind: modelled_wavefronts(built[kind][0][0][0], built[kind][0][0][1], cfg.keep_k, cfg.keep_v)
              for kind in built}
        st = ks.default_tactic(d, hq, hkv, B, ctx, rk=cfg.rk, rv=cfg.rv)
        ts_def, _ = ks.plan_cache(cfg, B, ctx, tactic=st)
        plans = [(st, ts_def)]
        for tactic in [ks.WIDE16_FUSED] + ([ks.STREAM_K] if args.tactic5 else []):
            ts0, _ = ks.plan_cache(cfg, B, ctx, tactic=tactic)
            plans += [(tactic, ts) for ts in split_sizes(tactic, ts0, ks.MAX_TOKENS_PER_SPLIT2)
                      if ts % 256 == 0 and (tactic, ts) not in plans]
        calls = {}
        for tactic, ts in plans:
            _, ns = ks.plan_cache(cfg, B, ctx, tokens_per_split=ts, tactic=tactic)
            for kind in kinds:
                p = ks._Plan(ks._ATT_PTRS)
                saved = ks.SOURCE
                ks.SOURCE = str(Path(args.prev).resolve()) if kind == "prev" else saved
                try:
                    p.launches = ks._attention_launches(d, hq, hkv, B, ctx, ks._geometry(cfg), cfg.rk, cfg.rv,
                                                        None, None, ts, tactic, None, p.addr)
                finally:
                    ks.SOURCE = saved
                p.extra["parts"] = 4 * ks._counter_words(B, hq)
                ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
                o = torch.full((B, hq, d), float("nan"), dtype=torch.float16, device="cuda")
                calls[(tactic, ts, kind)] = (p, ws, o, built["sched" if kind == "sched" else "plain"][1])
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
            a = calls[(tactic, ts, "plain")][2]
            assert not torch.isnan(a).any(), f"{model} B={B} {ctx}: NaN"
            for kind in kinds:
                assert torch.equal(a.view(torch.int16), calls[(tactic, ts, kind)][2].view(torch.int16)), \
                    f"{model} B={B} {ctx} tactic {tactic} split {ts}: {kind} differs from plain"
        times = {key: [] for key in calls}
        n_rot = len(built["plain"][1])
        for _ in range(args.rounds):
            for key in calls:
                times[key].append(time_graph(lambda key=key: call(key), inner=max(20, n_rot), reps=10,
                                             stream=stream))
        med = {key: statistics.median(t) for key, t in times.items()}
        pipe = [(t, ts) for t, ts in plans if ks.uses_pipelined_records(ts, 16)]
        row = {"model": model, "batch": B, "context": ctx, "default_plan": [st, ts_def],
               "wavefronts_per_tile_model": wf, "prefill_and_copies_s": prefill_s,
               "plans": {f"t{t}_{ts}_{kind}": med[(t, ts, kind)] for t, ts, kind in calls},
               "pipelined_plans": [f"t{t}_{ts}" for t, ts in pipe]}
        for kind in kinds:
            row[f"{kind}_default"] = med[(st, ts_def, kind)]
            row[f"{kind}_best"] = min(med[(t, ts, kind)] for t, ts in plans)
        for base in kinds[1:]:
            row[f"speedup_default_vs_{base}"] = row[f"{base}_default"] / row["sched_default"]
            row[f"speedup_best_vs_{base}"] = row[f"{base}_best"] / row["sched_best"]
            row[f"speedup_pipelined_vs_{base}"] = [med[(t, ts, base)] / med[(t, ts, "sched")] for t, ts in pipe]
            row[f"speedup_other_vs_{base}"] = [med[(t, ts, base)] / med[(t, ts, "sched")] for t, ts in plans
                                               if (t, ts) not in pipe]
        rows.append(row)
        print({k_: v_ for k_, v_ in row.items() if k_ != "plans"}, flush=True)
        path = write_results(out_name, rows, meta({"rounds": args.rounds,
                                                   "prev_source": Path(args.prev).name if args.prev else None}))
        calls = built = None
        torch.cuda.empty_cache()
    cols = ["model", "batch", "context"] + [f"{k}_best" for k in kinds] + \
        [f"speedup_{w}_vs_{b}" for b in kinds[1:] for w in ("default", "best")]
    print_table(rows, cols)
    for base in kinds[1:]:
        for what in ("pipelined", "other"):
            v = [s for r in rows for s in r[f"speedup_{what}_vs_{base}"]]
            if v:
                print(f"{base} ÷ sched, {what} plans: median {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f}), "
                      f"{len(v)} plans")
        v = [r[f"speedup_best_vs_{base}"] for r in rows]
        print(f"{base} ÷ sched, best plan per shape: median {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})")
    w0 = [r["wavefronts_per_tile_model"]["plain"] for r in rows]
    w1 = [r["wavefronts_per_tile_model"]["sched"] for r in rows]
    print(f"modelled wavefronts per tile: plain {statistics.mean(w0):.1f}, scheduled {statistics.mean(w1):.1f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
