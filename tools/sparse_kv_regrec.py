#!/usr/bin/env python3
"""Records decoded from registers vs staged in shared memory (session 28): the streaming kernels' two record paths,
side by side on the same caches and plans.

Session 28's index records halved the decode's ALU instructions without a gain, and session 10's move of the zero
fill from the shared-memory pipe to the ALUs lost; what was left of the record path in shared memory is the staging:
the records' ``cp.async`` writes and the decode's ``LDS.64`` reads (≈ 41 of ≈ 170 shared-memory wavefronts per
16-token tile, session 14's profile). The register path (``sparse_kv_attn2r_*``, ``decode_row64_reg``: d = 64,
records ≤ 48 bytes) has each lane load its own K or V record with 8-byte ``ld.global.nc`` two tiles ahead and decode
from registers; the rest of the kernel is the staged one. ``ks.REG_RECORD_MAX = 0`` gives the staged kernels.

Per shape (issue 7's 18 at >= 4k; ``--sparsity``, default 0.7): the default's plan and tactics 1-4 at the benchmark's
split sizes (``split_sizes``), both paths on the same cache; outputs compared on every plan (the decoded tiles are the
same, so the bits must be); CUDA-graph replays over caches rotated beyond L2, the paths taking turns over ``--rounds``
rounds, medians. Speed-up = staged time / register time.

Usage: python tools/sparse_kv_regrec.py [--rounds N] [--sparsity S] [--out NAME] [--quick]
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--sparsity", type=float, default=0.7)
    ap.add_argument("--quick", action="store_true", help="two shapes, default plan only")
    args = ap.parse_args()

    from bench._common import meta, print_table, time_graph, write_results
    from bench.bench_sparse_kv import MODELS, dense_inputs, sparse_caches, split_sizes
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import sparse_kv as ks

    saved_max = ks.REG_RECORD_MAX
    stream = torch.cuda.Stream()
    raw = stream.cuda_stream
    rows = []
    out_name = args.out or f"sparse_kv_regrec_{meta()['commit']}"
    shapes = [(m, b, c) for m in MODELS for b in (1, 4, 16) for c in (4096, 16384, 32768)]
    if args.quick:
        shapes = [("llama3.2-1b", 16, 32768), ("smollm2-135m", 1, 4096)]
    for model, B, ctx in shapes:
        hq, hkv, d = MODELS[model]
        k, v, q, lens = dense_inputs(hq, hkv, d, B, ctx)
        for s in (args.sparsity,):
            cfg = SparseKVConfig(d, hq, hkv, s, s, ctx + 1)
            caches, cptr = sparse_caches(cfg, B, ctx, k, v, lens)
            assert ks.uses_register_records(d, cfg.rk, cfg.rv), (cfg.rk, cfg.rv)
            st = ks.default_tactic(d, hq, hkv, B, ctx, rk=cfg.rk, rv=cfg.rv)
            ts0, _ = ks.plan_cache(cfg, B, ctx, tactic=st)
            plans = [(st, ts0)]
            if not args.quick:
                for tactic in (ks.STREAM, ks.STREAM_FUSED, ks.WIDE_FUSED, ks.WIDE16_FUSED):
                    t0, _ = ks.plan_cache(cfg, B, ctx, tactic=tactic)
                    plans += [(tactic, ts) for ts in split_sizes(tactic, t0, ks.MAX_TOKENS_PER_SPLIT2)
                              if (tactic, ts) not in plans]
            calls = {}
            for tactic, ts in plans:
                _, ns = ks.plan_cache(cfg, B, ctx, tokens_per_split=ts, tactic=tactic)
                for kind in ("staged", "reg"):
                    p = ks._Plan(ks._ATT_PTRS)
                    saved, ks.REG_RECORD_MAX = ks.REG_RECORD_MAX, (saved_max if kind == "reg" else 0)
                    try:
                        p.launches = ks._attention_launches(d, hq, hkv, B, ctx, ks._geometry(cfg), cfg.rk, cfg.rv,
                                                            None, None, ts, tactic, None, p.addr)
                    finally:
                        ks.REG_RECORD_MAX = saved
                    p.extra["parts"] = 4 * ks._counter_words(B, hq)
                    ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
                    o = torch.full((B, hq, d), float("nan"), dtype=torch.float16, device="cuda")
                    calls[(tactic, ts, kind)] = (p, ws, o)
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
            for tactic, ts in plans:
                a, b_ = calls[(tactic, ts, "staged")][2], calls[(tactic, ts, "reg")][2]
                assert not torch.isnan(a).any(), f"{model} B={B} {ctx} {s}: staged output has NaN"
                assert torch.equal(a.view(torch.int16), b_.view(torch.int16)), \
                    f"{model} B={B} {ctx} {s} tactic {tactic} split {ts}: register-record output differs from the shipped kernel's"
            times = {key: [] for key in calls}
            n_rot = len(cptr)
            for _ in range(args.rounds):
                for key in calls:
                    times[key].append(time_graph(lambda key=key: call(key), inner=max(20, n_rot), reps=10,
                                                 stream=stream))
            med = {key: statistics.median(v) for key, v in times.items()}
            best = {kind: min((med[(t, ts, kind)], t, ts) for t, ts in plans) for kind in ("staged", "reg")}
            row = {"model": model, "batch": B, "context": ctx, "sparsity": s, "record_bytes": cfg.rk,
                   "default_tactic": st, "default_split": ts0,
                   "staged_default": med[(st, ts0, "staged")], "reg_default": med[(st, ts0, "reg")],
                   "staged_best": best["staged"][0], "staged_best_plan": best["staged"][1:],
                   "reg_best": best["reg"][0], "reg_best_plan": best["reg"][1:],
                   "plans": {f"t{t}_{ts}_{kind}": med[(t, ts, kind)] for t, ts, kind in calls}}
            row["speedup_default"] = row["staged_default"] / row["reg_default"]
            row["speedup_best"] = row["staged_best"] / row["reg_best"]
            rows.append(row)
            print({k_: v_ for k_, v_ in row.items() if k_ != "plans"}, flush=True)
            path = write_results(out_name, rows, meta({"rounds": args.rounds}))  # after every shape: partial runs
            cptr = calls = None
            del caches
            torch.cuda.empty_cache()
    print_table(rows, ["model", "batch", "context", "sparsity", "default_tactic", "staged_default", "reg_default",
                       "speedup_default", "staged_best", "reg_best", "speedup_best"])
    for s in (args.sparsity,):
        sp = [r["speedup_default"] for r in rows if r["sparsity"] == s]
        sb = [r["speedup_best"] for r in rows if r["sparsity"] == s]
        if sp:
            print(f"sparsity {s}: default plan median {statistics.median(sp):.3f} ({min(sp):.3f}-{max(sp):.3f}); "
                  f"best plan median {statistics.median(sb):.3f} ({min(sb):.3f}-{max(sb):.3f})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
