#!/usr/bin/env python3
"""Records decoded from registers vs staged in shared memory (session 28): the streaming kernels' two record paths,
side by side on the same caches and plans.

Session 28's index records halved the decode's ALU instructions without a gain, and session 10's move of the zero
fill from the shared-memory pipe to the ALUs lost; what was left of the record path in shared memory is the staging:
the records' ``cp.async`` writes and the decode's ``LDS.64`` reads (≈ 41 of ≈ 170 shared-memory wavefronts per
16-token tile, session 14's profile). The register path (``sparse_kv_attn2r_*_w16``, ``decode_row64_reg``: d = 64,
48-byte records, 16-warp blocks) has each lane load its own K or V record with three 16-byte ``ld.global.nc`` two
tiles ahead and decode from registers; the rest of the kernel is the staged one. ``ks.REGISTER_RECORDS = False``
gives the staged kernels.

Per shape (issue 7's 18 at >= 4k; ``--sparsity``, default 0.7): the default's plan and tactic 4 (16-warp blocks, the
only ones that take the register path) at the benchmark's split sizes (``split_sizes``), both paths on the same cache
(``--all-tactics``: tactics 1-3 too, with 16-warp blocks for 1 and 2; ``--alt FILE``, repeatable: further kinds,
the register path built from other versions of ``plugins/sparse_kv/sparse_kv.cu``; ``--timing-only FILE``: the same
without the output check, for ablations; ``--alt-close FILE``: a build whose outputs round differently, compared
within twice the GPU tests' tolerance; ``--pipe-ab``: register records without the pipelined kernels, session 29);
outputs compared on every plan (the decoded tiles are the same, so the bits must be); CUDA-graph replays over caches
rotated beyond L2, the paths taking turns over ``--rounds`` rounds, medians. Speed-up = staged time / register time.

Every row also has the pick of the default rule before session 29 (``prev_rule``; ``pipe_rule_speedup`` = its time ÷
the default's, with the shipped kernels).

``--validation``: other head layouts (GQA groups 1, 2, 7, 8: the g1, g2 and g8 kernels, which issue 7's shapes do
not use) at other batches and lengths (:data:`VALIDATION`). ``--rule-validation``: shapes of 23-63 tiles per SM
(:data:`RULE_VALIDATION`), where ``default_tactic`` gives register records tactic 4 instead of tactic 3 from 30 tiles
per SM on; each row then also has ``rule_speedup`` = tactic 3 at its heuristic split ÷ the default, both with the
shipped kernels.

Usage: python tools/sparse_kv_regrec.py [--rounds N] [--sparsity S] [--all-tactics]
       [--alt FILE ...] [--timing-only FILE ...] [--alt-close FILE ...] [--alt-carveout PCT] [--pipe-ab] [--tactic5]
       [--out NAME] [--quick | --validation | --rule-validation | --shapes MODEL:B:CTX,...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402


# (Hq, Hkv, d): Qwen2.5-0.5B- and TinyLlama-like heads (groups of 7 and 8), multi-head (1) and groups of 2
VALIDATION_MODELS = {"qwen2.5-0.5b": (14, 2, 64), "tinyllama": (32, 4, 64), "mha-12": (12, 12, 64),
                     "gqa2-16": (16, 8, 64)}
VALIDATION = [("qwen2.5-0.5b", 1, 24576), ("qwen2.5-0.5b", 3, 12000), ("qwen2.5-0.5b", 8, 6000),
              ("tinyllama", 2, 16384), ("tinyllama", 6, 9000), ("tinyllama", 12, 30000),
              ("mha-12", 1, 8192), ("mha-12", 4, 20000), ("mha-12", 8, 5000),
              ("gqa2-16", 2, 12288), ("gqa2-16", 5, 7000), ("gqa2-16", 10, 28000)]

# unseen shapes around the register-record rule's 30 tiles per SM (132 SMs): 62, 38, 46.5, 35, 57, 24, 38, 40, 34, 62,
# 46.5, 34, 34, 23 tiles per SM
RULE_VALIDATION = [("llama3.2-1b", 2, 8192), ("llama3.2-1b", 1, 10000), ("smollm2-135m", 2, 16384),
                   ("smollm2-135m", 6, 4096), ("qwen2.5-0.5b", 2, 30000), ("qwen2.5-0.5b", 5, 5000),
                   ("tinyllama", 1, 20000), ("tinyllama", 3, 7000), ("mha-12", 2, 3000), ("gqa2-16", 1, 16384),
                   ("gqa2-16", 3, 4096), ("smollm2-135m", 2, 12000), ("llama3.2-1b", 3, 3000), ("tinyllama", 2, 6000)]


def issue7_shapes(models) -> list[tuple[str, int, int]]:
    """Issue 7's benchmark shapes at >= 4k: every model of ``models`` x batch 1, 4, 16 x 4k, 16k, 32k."""
    return [(m, b, c) for m in models for b in (1, 4, 16) for c in (4096, 16384, 32768)]


def parse_shapes(spec: str) -> list[tuple[str, int, int]]:
    """``model:B:ctx,...`` (the tools' ``--shapes``) as (model, B, ctx) tuples."""
    return [(m, int(b), int(c)) for m, b, c in (x.split(":") for x in spec.split(","))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--sparsity", type=float, default=0.7, help="0.69-0.73 (48-byte records, the register path's)")
    ap.add_argument("--all-tactics", action="store_true")
    ap.add_argument("--alt", action="append", default=[],
                    help="another sparse_kv.cu: its register kernels as a further kind (repeatable: alt, alt2, ...)")
    ap.add_argument("--timing-only", action="append", default=[],
                    help="like --alt, but its outputs are not compared (ablations; kinds abl, abl2, ...)")
    ap.add_argument("--alt-close", action="append", default=[],
                    help="another build whose outputs round differently (session 44's: a copy of the source with "
                         "bench/results/sparse_kv_alt_kdot_35d0392.patch applied): compared with the staged output "
                         "within twice the GPU tests' tolerance (2e-3 + 4e-3 |x|) instead of bit for bit; the row "
                         "records the largest difference")
    ap.add_argument("--alt-carveout", type=int, default=None,
                    help="with --alt: the preferred shared-memory carveout (percent) of its register kernels")
    ap.add_argument("--tactic5", action="store_true",
                    help="also tactic 5 (STREAM_K) at the benchmark's split sizes (its _sk kernels)")
    ap.add_argument("--pipe-ab", action="store_true",
                    help="a kind 'nopipe': register records without the pipelined kernels (PIPELINED_RECORDS = False)")
    ap.add_argument("--shapes", default=None, help="model:B:ctx,... (models of MODELS and VALIDATION_MODELS)")
    ap.add_argument("--quick", action="store_true", help="two shapes, default plan only")
    ap.add_argument("--validation", action="store_true", help="the VALIDATION shapes instead of issue 7's")
    ap.add_argument("--rule-validation", action="store_true", help="the RULE_VALIDATION shapes (implies --all-tactics)")
    args = ap.parse_args()

    from bench._common import meta, print_table, time_graph, write_results
    from bench.bench_sparse_kv import MODELS, dense_inputs, sparse_caches, split_sizes
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import sparse_kv as ks

    alts = {("alt" if i == 0 else f"alt{i + 1}"): str(Path(f).resolve()) for i, f in enumerate(args.alt)}
    unchecked = {("abl" if i == 0 else f"abl{i + 1}"): str(Path(f).resolve()) for i, f in enumerate(args.timing_only)}
    close = {f"close{i + 1}": str(Path(f).resolve()) for i, f in enumerate(args.alt_close)}
    alts.update(unchecked)
    alts.update(close)
    kinds = ("staged", "reg") + (("nopipe",) if args.pipe_ab else ()) + tuple(alts)
    stream = torch.cuda.Stream()
    raw = stream.cuda_stream
    rows = []
    out_name = args.out or f"sparse_kv_regrec_{meta()['commit']}"
    shapes = issue7_shapes(MODELS)
    if args.quick:
        shapes = [("llama3.2-1b", 16, 32768), ("smollm2-135m", 1, 4096)]
    if args.validation:
        shapes = VALIDATION
    if args.rule_validation:
        shapes, args.all_tactics = RULE_VALIDATION, True
    if args.shapes:
        shapes = parse_shapes(args.shapes)
    models = dict(MODELS, **VALIDATION_MODELS)
    for model, B, ctx in shapes:
        hq, hkv, d = models[model]
        k, v, q, lens = dense_inputs(hq, hkv, d, B, ctx)
        for s in (args.sparsity,):
            cfg = SparseKVConfig(d, hq, hkv, s, s, ctx + 1)
            caches, cptr = sparse_caches(cfg, B, ctx, k, v, lens)
            assert ks.uses_register_records(d, cfg.rk, cfg.rv, 16), (cfg.rk, cfg.rv)
            st = ks.default_tactic(d, hq, hkv, B, ctx, rk=cfg.rk, rv=cfg.rv)
            ts0, _ = ks.plan_cache(cfg, B, ctx, tactic=st)
            plans = [(st, ts0, None)]
            pipe_saved, ks.PIPELINED_RECORDS = ks.PIPELINED_RECORDS, False  # the default rule before session 29's
            try:
                st_prev = ks.default_tactic(d, hq, hkv, B, ctx, rk=cfg.rk, rv=cfg.rv)
            finally:
                ks.PIPELINED_RECORDS = pipe_saved
            ts_prev, _ = ks.plan_cache(cfg, B, ctx, tactic=st_prev)
            if (st_prev, ts_prev, None) not in plans:
                plans.append((st_prev, ts_prev, None))
            if not args.quick:
                tw = [(ks.WIDE16_FUSED, None)]
                if args.all_tactics:
                    tw += [(ks.STREAM, 16), (ks.STREAM_FUSED, 16), (ks.WIDE_FUSED, None)]
                if args.tactic5:
                    tw += [(ks.STREAM_K, None)]
                for tactic, w in tw:
                    t0, _ = ks.plan_cache(cfg, B, ctx, tactic=tactic, warps=w)
                    plans += [(tactic, ts, w) for ts in split_sizes(tactic, t0, ks.MAX_TOKENS_PER_SPLIT2)
                              if (tactic, ts, w) not in plans and ts % (16 * (w or 1)) == 0]
            calls = {}
            for tactic, ts, w in plans:
                _, ns = ks.plan_cache(cfg, B, ctx, tokens_per_split=ts, tactic=tactic, warps=w)
                for kind in kinds:
                    p = ks._Plan(ks._ATT_PTRS)
                    saved = ks.REGISTER_RECORDS, ks.SOURCE, ks.PIPELINED_RECORDS
                    ks.REGISTER_RECORDS = kind != "staged"
                    ks.PIPELINED_RECORDS = kind != "nopipe"
                    ks.SOURCE = alts.get(kind, saved[1])
                    try:
                        p.launches = ks._attention_launches(d, hq, hkv, B, ctx, ks._geometry(cfg), cfg.rk, cfg.rv,
                                                            None, None, ts, tactic, w, p.addr)
                    finally:
                        ks.REGISTER_RECORDS, ks.SOURCE, ks.PIPELINED_RECORDS = saved
                    p.extra["parts"] = 4 * ks._counter_words(B, hq)
                    ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
                    o = torch.full((B, hq, d), float("nan"), dtype=torch.float16, device="cuda")
                    calls[(tactic, ts, w, kind)] = (p, ws, o)
            if args.alt and args.alt_carveout is not None:  # after the plans (the launcher asks for 100)
                cu = _cuda._driver()
                for gp, src, k in ((gp, src, k) for gp in (1, 2, 4, 8) for src in alts.values() for k in "rp"):
                    kern = _cuda.get_kernel(src, f"sparse_kv_attn2{k}_d64_g{gp}_w16")
                    _cuda.check(cu.cuFuncSetAttribute(
                        kern.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                        args.alt_carveout))
            torch.cuda.synchronize()  # workspaces and poisoned outputs (default stream) before `stream`
            it = iter(range(1 << 30))

            def call(key):
                p, ws, o = calls[key]
                c = cptr[next(it) % len(cptr)]
                p.set(q.data_ptr(), ws.data_ptr(), ws.data_ptr() + p.extra["parts"], c.lens, c.k_rec, c.v_rec,
                      c.k_ring, c.v_ring, o.data_ptr())
                _cuda.launch_all(p.launches, raw)

            for key in calls:
                call(key)
            stream.synchronize()
            maxerr = {}
            for tactic, ts, w in plans:
                a = calls[(tactic, ts, w, "staged")][2]
                assert not torch.isnan(a).any(), f"{model} B={B} {ctx} {s}: staged output has NaN"
                for kind in close:
                    o = calls[(tactic, ts, w, kind)][2].float()
                    assert torch.isfinite(o).all(), f"{model} B={B} {ctx} tactic {tactic} split {ts}: {kind} has NaN"
                    err = (o - a.float()).abs()
                    bad = int((err > 2 * (2e-3 + 4e-3 * a.float().abs())).sum())
                    maxerr[kind] = max(maxerr.get(kind, 0.0), float(err.max()))
                    assert bad == 0, (f"{model} B={B} {ctx} tactic {tactic} split {ts} warps {w}: {kind}: {bad} "
                                      f"outputs outside tolerance, worst {float(err.max()):.3g}")
                for kind in (k for k in kinds[1:] if k not in unchecked and k not in close):
                    assert torch.equal(a.view(torch.int16), calls[(tactic, ts, w, kind)][2].view(torch.int16)), \
                        f"{model} B={B} {ctx} {s} tactic {tactic} split {ts} warps {w}: {kind} differs from staged"
            times = {key: [] for key in calls}
            n_rot = len(cptr)
            for _ in range(args.rounds):
                for key in calls:
                    times[key].append(time_graph(lambda key=key: call(key), inner=max(20, n_rot), reps=10,
                                                 stream=stream))
            med = {key: statistics.median(v) for key, v in times.items()}
            row = {"model": model, "batch": B, "context": ctx, "sparsity": s, "record_bytes": cfg.rk,
                   "default_tactic": st, "default_split": ts0,
                   "plans": {f"t{t}_{ts}_w{w or ''}_{kind}": med[(t, ts, w, kind)] for t, ts, w, kind in calls}}
            for kind in kinds:
                best = min((med[(t, ts, w, kind)], t, ts, w) for t, ts, w in plans)
                row[f"{kind}_default"] = med[(st, ts0, None, kind)]
                row[f"{kind}_best"], row[f"{kind}_best_plan"] = best[0], best[1:]
                row[f"{kind}_t4_best"] = min((med[(t, ts, w, kind)] for t, ts, w in plans if t == ks.WIDE16_FUSED),
                                             default=float("nan"))
            for kind, e in maxerr.items():
                row[f"max_abs_diff_{kind}"] = e
            row["prev_rule_tactic"] = st_prev
            row["prev_rule"] = med[(st_prev, ts_prev, None, "reg")]
            row["pipe_rule_speedup"] = row["prev_rule"] / row["reg_default"]  # > 1: the current rule's pick is faster
            ts3 = ks.plan_cache(cfg, B, ctx, tactic=ks.WIDE_FUSED)[0]
            if (ks.WIDE_FUSED, ts3, None, "reg") in med:  # the rule before session 28's: tactic 3 at its split
                row["t3_heuristic"] = med[(ks.WIDE_FUSED, ts3, None, "reg")]
                row["rule_speedup"] = row["t3_heuristic"] / row["reg_default"]
            for kind in kinds[1:]:
                for what in ("default", "best", "t4_best"):
                    row[f"speedup_{what}_{kind}"] = row[f"staged_{what}"] / row[f"{kind}_{what}"]
            rows.append(row)
            print({k_: v_ for k_, v_ in row.items() if k_ != "plans"}, flush=True)
            extra = {"rounds": args.rounds, "alt_sources": {k_: Path(v_).name for k_, v_ in alts.items()},
                     "alt_carveout": args.alt_carveout}
            path = write_results(out_name, rows, meta(extra))  # after every shape: partial runs
            cptr = calls = None
            del caches
            torch.cuda.empty_cache()
    cols = ["model", "batch", "context", "default_tactic", "staged_default", "reg_default", "staged_t4_best",
            "reg_t4_best"] + [f"speedup_{w}_{k}" for k in kinds[1:] for w in ("default", "best", "t4_best")]
    if any("rule_speedup" in r for r in rows):
        cols += ["t3_heuristic", "rule_speedup"]
    cols += ["prev_rule_tactic", "prev_rule", "pipe_rule_speedup"]
    print_table(rows, cols)
    v = [r["rule_speedup"] for r in rows if "rule_speedup" in r and r["default_tactic"] == ks.WIDE16_FUSED]
    if v:
        print(f"default (tactic 4) vs tactic 3 where the default is tactic 4: median {statistics.median(v):.3f} "
              f"({min(v):.3f}-{max(v):.3f}), {len(v)} shapes")
    v = [r["pipe_rule_speedup"] for r in rows if r["prev_rule_tactic"] != r["default_tactic"]]
    if v:
        print(f"default vs the rule before session 29's where they differ: median {statistics.median(v):.3f} "
              f"({min(v):.3f}-{max(v):.3f}), {len(v)} shapes")
    for kind in kinds[1:]:
        for what in ("default", "best", "t4_best"):
            v = [r[f"speedup_{what}_{kind}"] for r in rows]
            if v:
                print(f"{kind} vs staged, {what}: median {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
