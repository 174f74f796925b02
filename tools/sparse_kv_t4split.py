#!/usr/bin/env python3
"""Tactic 4's split (tokens per split) swept per wave count, beside the default plan (session 31).

Until session 31 tactic 4 (``WIDE16_FUSED``) took the fewest tiles per warp whose grid fits one wave, capped at
:data:`~edgesdk.kernels.sparse_kv.MAX_TOKENS_PER_SPLIT2` tokens; where there are more (sequence, KV head) pairs than
SMs, or the cap cuts the split, it runs several waves, and each wave pays the fixed cost measured by
``tools/sparse_kv_timeline.py``. This tool times, per shape, tactic 4 at the largest number of splits per pair that
fits w waves, for w = 1 … ``--waves`` (the cap lifted for the measurement), beside the default tactic and plan, on
the same caches: CUDA-graph replays over caches rotated beyond L2, all plans taking turns over ``--rounds`` rounds,
medians. Every plan's output is compared with the default's (different splits: equal within fp16 rounding).

Where the default is tactic 4 and its split differs from the one-wave split it took before the wave model
(:func:`~edgesdk.kernels.sparse_kv._wave_split`, session 31), that plan is timed too ("old").

Shapes: issue 7's 18 at 70 % (``--set issue7``; the fit set), 18 others timed in the same run as the fit
(``--set unseen``), 18 drawn after the fit (``--set unseen2``), or 14 whose default is tactic 1 (``--set t1rule``).

Usage: python tools/sparse_kv_t4split.py [--set issue7|unseen|unseen2|t1rule] [--rounds N] [--waves W] [--out NAME]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402

MODELS = {"llama3.2-1b": (32, 8), "smollm2-135m": (9, 3), "qwen2.5-0.5b": (14, 2), "tinyllama": (32, 4),
          "mha-12": (12, 12), "gqa2-16": (16, 8)}
ISSUE7 = [(m, b, c) for m in ("llama3.2-1b", "smollm2-135m") for b in (1, 4, 16) for c in (4096, 16384, 32768)]
# none of issue 7's shapes; other head layouts, batches and lengths, drawn before any timing of this tool
UNSEEN = [("qwen2.5-0.5b", 4, 32768), ("qwen2.5-0.5b", 16, 20000), ("qwen2.5-0.5b", 48, 8192),
          ("tinyllama", 8, 16384), ("tinyllama", 20, 12000), ("tinyllama", 40, 32768),
          ("mha-12", 6, 30000), ("mha-12", 12, 8192), ("mha-12", 24, 16384),
          ("gqa2-16", 8, 24000), ("gqa2-16", 20, 6000), ("gqa2-16", 24, 32768),
          ("llama3.2-1b", 8, 24000), ("llama3.2-1b", 24, 8192), ("llama3.2-1b", 32, 32768),
          ("smollm2-135m", 8, 32768), ("smollm2-135m", 32, 12000), ("smollm2-135m", 64, 16384)]
# drawn after the wave model was fit (seeded draw of shapes whose default is tactic 4: 14 the model changes, 4 it keeps)
UNSEEN2 = [("gqa2-16", 39, 12251), ("gqa2-16", 30, 31707), ("qwen2.5-0.5b", 42, 32768), ("mha-12", 34, 20480),
           ("tinyllama", 47, 32731), ("mha-12", 16, 12251), ("gqa2-16", 33, 28172), ("gqa2-16", 39, 6144),
           ("mha-12", 6, 21467), ("llama3.2-1b", 48, 22491), ("gqa2-16", 33, 32768), ("smollm2-135m", 20, 30720),
           ("gqa2-16", 11, 30720), ("mha-12", 8, 30720), ("smollm2-135m", 11, 9179), ("qwen2.5-0.5b", 17, 12288),
           ("llama3.2-1b", 31, 5120), ("tinyllama", 15, 4620)]
# drawn (seeded) among shapes whose default is tactic 1 and where tactic 4 priced at the wave model's plan would take
# over with at most one block per pair and SM (pairs <= SMs): the candidate rule of session 31 for that choice
T1RULE = [("llama3.2-1b", 9, 10931), ("tinyllama", 24, 18371), ("llama3.2-1b", 9, 17075), ("smollm2-135m", 27, 13251),
          ("tinyllama", 18, 14336), ("mha-12", 5, 19123), ("smollm2-135m", 20, 23552), ("smollm2-135m", 24, 13312),
          ("smollm2-135m", 19, 21171), ("qwen2.5-0.5b", 52, 19456), ("qwen2.5-0.5b", 36, 25267),
          ("smollm2-135m", 34, 25600), ("tinyllama", 11, 32707), ("qwen2.5-0.5b", 36, 28611)]
SPARSITY = 0.7  # 48-byte records: the register-record (and, from 6 tiles per warp, pipelined) kernels


def wave_plans(pairs: int, sms: int, max_len: int, waves: int) -> list[tuple[int, int, int]]:
    """(waves, tokens per split, splits) of tactic 4 with the most splits per pair that fit w waves, w = 1 … waves;
    distinct plans only. Splits are multiples of 256 tokens (16 warps × 16 tokens)."""
    unit = 256
    units = math.ceil(max(1, max_len) / unit)
    seen, out = set(), []
    for w in range(1, waves + 1):
        s = min(units, max(1, (w * sms) // pairs))
        ts = unit * math.ceil(units / s)
        s = math.ceil(max(1, max_len) / ts)
        if ts in seen:
            continue
        seen.add(ts)
        out.append((math.ceil(pairs * s / sms), ts, s))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", choices=("issue7", "unseen", "unseen2", "t1rule"), default="issue7")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--waves", type=int, default=6)
    ap.add_argument("--shapes", default=None, help="model:B:ctx,... instead of --set (models of MODELS)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from bench._common import meta, print_table, time_graph, write_results
    from bench.bench_sparse_kv import dense_inputs, sparse_caches
    from edgesdk.kernels import sparse_kv as ks

    stream = torch.cuda.Stream()
    raw = stream.cuda_stream
    sms = ks.sm_count()
    rows = []
    out_name = args.out or f"sparse_kv_t4split_{'shapes' if args.shapes else args.set}_{meta()['commit']}"
    shapes = {"issue7": ISSUE7, "unseen": UNSEEN, "unseen2": UNSEEN2, "t1rule": T1RULE}[args.set]
    if args.shapes:
        shapes = [(m, int(b), int(c)) for m, b, c in (x.split(":") for x in args.shapes.split(","))]
    cap0 = ks.MAX_TOKENS_PER_SPLIT2
    for model, B, ctx in shapes:
        hq, hkv = MODELS[model]
        d = 64
        k, v, q, lens = dense_inputs(hq, hkv, d, B, ctx)
        cfg = SparseKVConfig(d, hq, hkv, SPARSITY, SPARSITY, ctx + 1)
        caches, cptr = sparse_caches(cfg, B, ctx, k, v, lens)
        del k, v
        default = ks.default_tactic(d, hq, hkv, B, ctx, rk=cfg.rk, rv=cfg.rv)
        dts, dns = ks.plan_cache(cfg, B, ctx)
        heur4 = ks.plan_cache(cfg, B, ctx, tactic=ks.WIDE16_FUSED)
        plans = {"default": (default, dts, dns)}
        if default != ks.STREAM:  # tactic 1 at its heuristic, for the tactic 1 / 4 choice
            plans["t1"] = (ks.STREAM, *ks.plan_cache(cfg, B, ctx, tactic=ks.STREAM))
        old_ts = ks._one_wave_split(B * hkv, sms, ctx, 256) if default == ks.WIDE16_FUSED else None
        if old_ts is not None and old_ts != dts:  # tactic 4's plan before the wave model (one wave, capped)
            plans["old"] = (ks.WIDE16_FUSED, old_ts, math.ceil(ctx / old_ts))
        for w, ts, s in wave_plans(B * hkv, sms, ctx, args.waves):
            plans[f"w{w}_{ts}"] = (ks.WIDE16_FUSED, ts, s)
        calls = {}
        for name, (tactic, ts, ns) in plans.items():
            ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
            o = torch.full((B, hq, d), float("nan"), dtype=torch.float16, device="cuda")
            calls[name] = (tactic, ts, ws, o)
        torch.cuda.synchronize()  # caches, workspaces and poisoned outputs (default stream) before `stream`
        it = iter(range(1 << 30))

        def call(name):
            tactic, ts, ws, o = calls[name]
            c = cptr[next(it) % len(cptr)]
            ks.MAX_TOKENS_PER_SPLIT2 = max(cap0, ts)  # lifted for the measurement only
            try:
                ks.decode_attention(cfg, B, ctx, q.data_ptr(), c, o.data_ptr(), ws.data_ptr(), raw,
                                    tokens_per_split=None if name == "default" else ts,
                                    tactic=None if name == "default" else tactic)  # others forced, "old" too
            finally:
                ks.MAX_TOKENS_PER_SPLIT2 = cap0

        for name in calls:
            call(name)
        stream.synchronize()
        ref = calls["default"][3].float()
        assert not torch.isnan(ref).any(), f"{model} B={B} {ctx}: NaN left by the default"
        diffs = {}
        for name in calls:
            o = calls[name][3].float()
            diffs[name] = (o - ref).abs().max().item()
            assert diffs[name] < 2e-2, f"{model} B={B} {ctx}: plan {name} differs by {diffs[name]}"
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name in calls:
                times[name].append(time_graph(lambda n=name: call(n), inner=max(20, len(cptr)), reps=10,
                                              stream=stream))
        med = {name: statistics.median(t) for name, t in times.items()}
        cands = [{"waves": w, "tokens_per_split": ts, "splits": s, "tiles_per_warp": ts // 256,
                  "us": med[f"w{w}_{ts}"], "max_abs_diff": diffs[f"w{w}_{ts}"]}
                 for w, ts, s in wave_plans(B * hkv, sms, ctx, args.waves)]
        best = min(cands, key=lambda c: c["us"])
        row = {"model": model, "batch": B, "context": ctx, "pairs": B * hkv, "sms": sms,
               "tiles_per_sm": B * hkv * math.ceil(ctx / 16) / sms,
               "default_tactic": default, "default_tokens_per_split": dts, "default_us": med["default"],
               "t4_heuristic_tokens_per_split": heur4[0], "candidates": cands,
               "best_tokens_per_split": best["tokens_per_split"], "best_waves": best["waves"], "best_us": best["us"],
               "default_over_best": med["default"] / best["us"],
               "old_tokens_per_split": old_ts if "old" in med else dts, "old_us": med.get("old", med["default"]),
               "old_over_default": med.get("old", med["default"]) / med["default"],
               "t1_us": med.get("t1", med["default"] if default == ks.STREAM else None)}
        rows.append(row)
        print({k_: v_ for k_, v_ in row.items() if k_ != "candidates"}, flush=True)
        path = write_results(out_name, rows, meta({"rounds": args.rounds, "set": args.set, "sparsity": SPARSITY}))
        del caches
        cptr = calls = None
        torch.cuda.empty_cache()
    print_table(rows, ["model", "batch", "context", "default_tactic", "default_tokens_per_split", "default_us",
                       "old_tokens_per_split", "old_us", "old_over_default", "best_tokens_per_split", "best_us",
                       "default_over_best"])
    ch = [r["old_over_default"] for r in rows if r["old_tokens_per_split"] != r["default_tokens_per_split"]]
    if ch:
        print(f"default (wave model) vs tactic 4 at the one-wave split, where they differ: {len(ch)} shapes, median "
              f"{statistics.median(ch):.3f} ({min(ch):.3f}-{max(ch):.3f})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
