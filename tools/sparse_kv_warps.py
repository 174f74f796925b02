#!/usr/bin/env python3
"""Sparse KV decode attention with 8 or 16 warps per block against the shipped 4 (measurement, not a test).

Tactics 1 and 2 run one split per block; each warp walks k 16-token tiles of it. At batch 1 the kernel is
latency-bound (``tools/speed_of_light.py``: 0.27-0.36 of a pure read's speed), and with 4 warps per block a
short per-warp walk means many splits to merge. Wider blocks keep k small with fewer splits. Per shape
(issue 7's benchmark at >= 4k, 70 % and 50 %), side by side in one run with the benchmark's method
(CUDA-graph replays over caches rotated beyond L2, medians): torch SDPA; the default (tactic None) and the
default rule before WIDE_FUSED (``default_tactic(wide=False)``);
the best of the shipped kernel over tactics 1, 2 and half / the heuristic / twice its split (what
``bench/bench_sparse_kv.py`` reports); and for 8 and 16 warps the best over tactics 1, 2 and k in K_GRID.
Every timed output is compared with the shipped default's (fp32 accumulation order differs: ~1e-3).

``--shapes validation|validation2``: other GQA layouts, batches and lengths (VALIDATION, VALIDATION2). ``--green``: only
the default against the rule before, both planned for 16 SMs, on the 16-SM green context (the Orin proxy).

Usage: python tools/sparse_kv_warps.py [--quick] [--shapes issue|validation|validation2] [--green] [--out DIR]
(writes sparse_kv_warps.json, sparse_kv_warps_<shapes>.json or sparse_kv_warps_green16.json)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

K_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
WIDE = (8, 16)
# Shapes the default rule was not fit on (--shapes validation): other GQA layouts (Qwen2.5-0.5B: 14 q / 2 kv heads,
# TinyLlama: 32 / 4), other batches, lengths that are not powers of two.
VALIDATION = ([("qwen2.5-0.5b", 14, 2, 64, b, c) for b in (1, 2, 8) for c in (6000, 24576)]
              + [("tinyllama-1.1b", 32, 4, 64, b, c) for b in (1, 2, 8) for c in (8192, 20000)]
              + [("llama3.2-1b", 32, 8, 64, b, c) for b in (2, 8) for c in (6000, 12288)]
              + [("smollm2-135m", 9, 3, 64, b, c) for b in (2, 8) for c in (8192, 24576)])
# A second set, drawn after the first had been used to change the WIDE16 rule (session 25): still unseen by the rule.
VALIDATION2 = ([("qwen2.5-0.5b", 14, 2, 64, b, c) for b in (4, 12) for c in (10000, 28000)]
               + [("tinyllama-1.1b", 32, 4, 64, b, c) for b in (3, 6) for c in (5000, 16000)]
               + [("llama3.2-1b", 32, 8, 64, b, c) for b in (3, 12) for c in (4500, 9000)]
               + [("smollm2-135m", 9, 3, 64, b, c) for b in (6, 12) for c in (12000, 30000)])


def shape_rows(model, hq, hkv, d, B, ctx, sparsities):
    import torch

    import bench.bench_sparse_kv as bkv
    from bench._common import time_graph
    from edgesdk.formats.sparse_kv import SparseKVConfig
    from edgesdk.kernels import sparse_kv as ks

    rows = []
    k, v, q, lens = bkv.dense_inputs(hq, hkv, d, B, ctx)
    inner = 20 if 2 * B * hkv * ctx * d * 2 < (64 << 20) else 8
    t_sdpa = bkv.time_sdpa(k, v, q)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for s in sparsities:
        cfg = SparseKVConfig(d, hq, hkv, s, s, ctx + 1)
        caches, cptr = bkv.sparse_caches(cfg, B, ctx, k, v, lens)
        n_sp = len(caches)
        out = torch.empty((B, hq, d), device="cuda", dtype=torch.float16)

        def run(tactic, ts, warps):
            _, ns = ks.plan_cache(cfg, B, ctx, tokens_per_split=ts, tactic=tactic, warps=warps)
            ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
            j = [0]

            def call():
                ks.decode_attention(cfg, B, ctx, q.data_ptr(), cptr[j[0] % n_sp], out.data_ptr(), ws.data_ptr(),
                                    torch.cuda.current_stream().cuda_stream, tokens_per_split=ts, tactic=tactic,
                                    warps=warps)
                j[0] += 1

            us = time_graph(call, inner=max(inner, n_sp), reps=10)
            out.fill_(float("nan"))
            j[0] = 0
            call()
            torch.cuda.synchronize()
            return us, out.clone()

        # the shipped default (out poisoned first: every call writes it)
        out.fill_(float("nan"))
        t_default = bkv.time_default(cfg, B, ctx, q, cptr, out, inner)
        torch.cuda.synchronize()
        y0 = out.clone().float()
        assert torch.isfinite(y0).all()
        # the default rule before WIDE_FUSED (session 24's), timed beside it
        legacy = ks.default_tactic(d, hq, hkv, B, ctx, wide=False)
        ts_legacy, _ = ks.plan_cache(cfg, B, ctx, tactic=legacy)
        t_legacy, y_legacy = run(legacy, ts_legacy, 4)
        new = ks.default_tactic(d, hq, hkv, B, ctx, rk=cfg.rk, rv=cfg.rv)
        ts_new, _ = ks.plan_cache(cfg, B, ctx)
        cand = {}
        for tactic in (ks.STREAM, ks.STREAM_FUSED):
            ts0, _ = ks.plan_cache(cfg, B, ctx, tactic=tactic, warps=4)
            for ts in sorted({ts0, min(ks.MAX_TOKENS_PER_SPLIT2, 2 * ts0), max(64, ts0 // 128 * 64)}):
                cand[(4, tactic, ts)] = run(tactic, ts, 4)
            for w in WIDE:
                for kk in K_GRID:
                    ts = 16 * w * kk
                    if ts > ks.MAX_TOKENS_PER_SPLIT2 or (kk > 1 and ts >= 2 * ctx):
                        continue
                    cand[(w, tactic, ts)] = run(tactic, ts, w)
        worst = max(float((y.float() - y0).abs().max()) for _, y in cand.values())
        assert worst < 2e-2, f"{model} B={B} {ctx} s={s}: an output differs from the default's by {worst}"
        worst = max(worst, float((y_legacy.float() - y0).abs().max()))
        row = {"model": model, "batch": B, "context": ctx, "sparsity": s, "sdpa_us": t_sdpa, "default_us": t_default,
               "default_tactic": new, "default_split": ts_new, "legacy_default_us": t_legacy,
               "legacy_tactic": legacy, "legacy_split": ts_legacy, "default_gain": t_legacy / t_default,
               "default_ratio": t_default / t_sdpa, "legacy_ratio": t_legacy / t_sdpa, "max_abs_diff_vs_default": worst}
        for w in (4, *WIDE):
            best = min((key for key in cand if key[0] == w), key=lambda key: cand[key][0])
            row[f"w{w}_us"], row[f"w{w}_tactic"], row[f"w{w}_split"] = cand[best][0], best[1], best[2]
            row[f"w{w}_ratio"] = cand[best][0] / t_sdpa
        row["best_wide_us"] = min(row[f"w{w}_us"] for w in WIDE)
        row["gain_vs_w4"] = row["w4_us"] / row["best_wide_us"]
        row["gain_vs_default"] = t_default / row["best_wide_us"]
        row["best_ratio"] = min(row["w4_us"], row["best_wide_us"]) / t_sdpa
        row["tiles_per_sm"] = B * hkv * math.ceil(ctx / 16) / sms
        row["all"] = {f"w{a}_t{b}_{c}": cand[(a, b, c)][0] for (a, b, c) in cand}
        rows.append(row)
        caches = cptr = None
    return rows


def green_rows(timer, model, hq, hkv, d, B, ctx, sparsities):
    """On the 16-SM green context (the Orin proxy): the default against the rule before it, both planned for 16 SMs
    (so with Orin's shared-memory limit, see ``default_tactic``); outputs compared."""
    import torch

    import bench.bench_sparse_kv as bkv
    from edgesdk.formats.sparse_kv import SparseKVConfig
    from edgesdk.kernels import sparse_kv as ks

    rows = []
    sms = timer.sms
    k, v, q, lens = bkv.dense_inputs(hq, hkv, d, B, ctx)
    inner = 20 if 4 * B * hkv * ctx * d < (64 << 20) else 8
    for s in sparsities:
        cfg = SparseKVConfig(d, hq, hkv, s, s, ctx + 1)
        caches, cptr = bkv.sparse_caches(cfg, B, ctx, k, v, lens)
        n_sp = len(caches)
        res = {}
        for label, tactic in (("default", ks.default_tactic(d, hq, hkv, B, ctx, sms=sms, rk=cfg.rk, rv=cfg.rv)),
                              ("legacy", ks.default_tactic(d, hq, hkv, B, ctx, sms=sms, wide=False))):
            ts, ns = ks.plan_cache(cfg, B, ctx, sms=sms, tactic=tactic)
            ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
            out = torch.full((B, hq, d), float("nan"), device="cuda", dtype=torch.float16)

            def call(i, stream, tactic=tactic, ts=ts, ws=ws, out=out):
                ks.decode_attention(cfg, B, ctx, q.data_ptr(), cptr[i], out.data_ptr(), ws.data_ptr(), stream,
                                    sms=sms, tokens_per_split=ts, tactic=tactic)

            us = timer.ours(call, n_sp, max(inner, n_sp))
            torch.cuda.synchronize()
            res[label] = (us, tactic, ts, out.float())
        diff = float((res["default"][3] - res["legacy"][3]).abs().max())
        assert diff < 2e-2 and torch.isfinite(res["default"][3]).all(), f"outputs differ by {diff}"
        rows.append({"model": model, "batch": B, "context": ctx, "sparsity": s, "sms": sms,
                     "default_us": res["default"][0], "default_tactic": res["default"][1], "default_split": res["default"][2],
                     "legacy_default_us": res["legacy"][0], "legacy_tactic": res["legacy"][1],
                     "legacy_split": res["legacy"][2], "default_gain": res["legacy"][0] / res["default"][0],
                     "tiles_per_sm": B * hkv * math.ceil(ctx / 16) / sms, "max_abs_diff": diff})
        caches = cptr = None
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--shapes", choices=("issue", "validation", "validation2"), default="issue",
                    help="issue 7's benchmark shapes at >= 4k, or VALIDATION / VALIDATION2 (other shapes)")
    ap.add_argument("--green", action="store_true", help="on the 16-SM green context: the default vs the rule before it "
                    "only (issue shapes at 1k-32k, both validation sets)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    import statistics

    import torch

    import bench.bench_sparse_kv as bkv
    from bench._common import meta, print_table, write_json
    from edgesdk.kernels import _cuda

    torch.zeros(1, device="cuda")
    _cuda.init()
    rows = []
    t0 = time.time()
    if args.green:
        timer = bkv.Timer(green=True)
        shapes = ([(model, hq, hkv, d, B, ctx) for model, (hq, hkv, d) in bkv.MODELS.items() for B in bkv.BATCHES
                   for ctx in (1024, 4096, 16384, 32768)] + VALIDATION + VALIDATION2)
        for model, hq, hkv, d, B, ctx in (shapes[::6] if args.quick else shapes):
            rows += green_rows(timer, model, hq, hkv, d, B, ctx, (0.7, 0.5))
        print_table(rows, ["model", "batch", "context", "sparsity", "tiles_per_sm", "legacy_default_us", "legacy_tactic",
                           "default_us", "default_tactic", "default_split", "default_gain"])
        ch = [r["default_gain"] for r in rows if r["default_tactic"] != r["legacy_tactic"]]
        same = [r["default_gain"] for r in rows if r["default_tactic"] == r["legacy_tactic"]]
        summ = [{"rows": len(rows), "changed": len(ch), "changed_median": statistics.median(ch) if ch else None,
                 "changed_min": min(ch) if ch else None, "changed_max": max(ch) if ch else None,
                 "unchanged_min": min(same) if same else None, "unchanged_max": max(same) if same else None}]
        print_table(summ, list(summ[0]))
        write_json(args.out / "sparse_kv_warps_green16.json", rows, meta({"summary": summ, "sms": timer.sms}))
        return 0
    if args.shapes.startswith("validation"):
        shapes = VALIDATION if args.shapes == "validation" else VALIDATION2
        shapes = shapes[::4] if args.quick else shapes
    else:
        shapes = [(model, hq, hkv, d, B, ctx) for model, (hq, hkv, d) in bkv.MODELS.items()
                  for B in ((1, 16) if args.quick else bkv.BATCHES) for ctx in ((4096,) if args.quick else (4096, 16384, 32768))]
    for model, hq, hkv, d, B, ctx in shapes:
        rows += shape_rows(model, hq, hkv, d, B, ctx, (0.7,) if args.quick else (0.7, 0.5))
        print(f"{model} B={B} {ctx}: {time.time() - t0:.0f} s", flush=True)
    cols = ["model", "batch", "context", "sparsity", "sdpa_us", "legacy_default_us", "default_us", "default_tactic",
            "default_split", "default_gain", "legacy_ratio", "default_ratio", "w4_us", "w8_us", "w8_split", "w16_us",
            "w16_split", "gain_vs_w4", "best_ratio"]
    print_table(rows, cols)
    summ = []
    for s in sorted({r["sparsity"] for r in rows}):
        sel = [r for r in rows if r["sparsity"] == s]
        for B in sorted({r["batch"] for r in sel}):
            g = [r["gain_vs_w4"] for r in sel if r["batch"] == B]
            dg = [r["default_gain"] for r in sel if r["batch"] == B]
            summ.append({"sparsity": s, "batch": B, "rows": len(g), "median_gain_vs_w4": statistics.median(g),
                         "min_gain": min(g), "max_gain": max(g), "default_gain_median": statistics.median(dg),
                         "default_gain_min": min(dg), "default_gain_max": max(dg)})
        dg = [r["default_gain"] for r in sel]
        summ.append({"sparsity": s, "batch": "all", "rows": len(dg), "default_gain_median": statistics.median(dg),
                     "default_gain_min": min(dg), "default_gain_max": max(dg),
                     "default_ratio_max": max(r["default_ratio"] for r in sel),
                     "legacy_ratio_max": max(r["legacy_ratio"] for r in sel)})
    print_table(summ, list(dict.fromkeys(k for r in summ for k in r)))
    name = "sparse_kv_warps.json" if args.shapes == "issue" else f"sparse_kv_warps_{args.shapes}.json"
    write_json(args.out / name, rows, meta({"summary": summ, "k_grid": K_GRID, "shapes": args.shapes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
