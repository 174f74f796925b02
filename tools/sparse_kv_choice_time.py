#!/usr/bin/env python3
"""Time of one append that compresses a 32-token group, with and without the store-order choice (session 34).

Session 33's compressor picks each d = 64 record's store order (``compress_tile`` in ``plugins/sparse_kv/
sparse_kv.cu``): warp 0 of a tile's block scores 32 candidate orders per record, record after record. That serial
loop makes a scheduled group cost ≈ 16 µs more than a plain one (B = 1), so appends schedule only from
``SCHEDULE_APPEND_FROM`` tokens on. This tool times the append kernel on the benchmark's caches
(``bench/bench_sparse_kv.py``: prefill, copies rotated beyond L2, CUDA graphs, medians) in three kinds:

* ``sched``: the shipped kernel, every group scheduled (``SCHEDULE_APPEND_FROM`` = 1 when the launch is planned);
* ``plain``: the shipped kernel, plain records (``ks.SCHEDULE_RECORDS = False``);
* ``prev`` (with ``--prev FILE``, another ``sparse_kv.cu``): that source's kernel, every group scheduled.

Session 34 measured rewrites of the loop with it (``bench/results/sparse_kv_choice_*``; docs/sparse_kv.md, "Session
34"); none was adopted.

Before timing, each kind's append runs once on its own copy of the same cache, and the scheduled kinds' records are
compared byte for byte (``sched`` = ``prev``: the same choices), as are the rings of all three.

With ``--prev-any`` the prev source may write other records (an ablation that skips part of the choice): only the
rings are compared then.

``--profile`` only launches the scheduled append three times on the first shape, for Nsight Compute, e.g.
``ncu --kernel-name regex:append_d64 --launch-skip 2 --launch-count 1 --section SourceCounters --page source
--print-source sass --csv python tools/sparse_kv_choice_time.py --profile``.

Usage: python tools/sparse_kv_choice_time.py [--prev FILE [--prev-any]] [--green] [--contexts 1024,...] [--out NAME]
       [--profile]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from edgesdk.formats import sparse_kv as f  # noqa: E402
from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prev", default=None, help="an earlier sparse_kv.cu (kind prev: its append, scheduling)")
    ap.add_argument("--prev-any", action="store_true",
                    help="prev may write other records (an ablation): compare only its rings")
    ap.add_argument("--green", action="store_true", help="also on the 16-SM green context")
    ap.add_argument("--contexts", default="1024,16384")
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", action="store_true",
                    help="for ncu: only launch the sched kind's append 3 times (Llama-like B = 1, first context)")
    args = ap.parse_args()

    from bench._common import meta, print_table, write_results
    from bench.bench_sparse_kv import MODELS, Timer, dense_inputs, sparse_caches
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import sparse_kv as ks

    kinds = ("sched", "plain") + (("prev",) if args.prev else ())
    torch.cuda.init()
    _cuda.init()
    timers = [Timer(False)] + ([Timer(True)] if args.green else [])
    rows = []
    for model, (hq, hkv, d) in MODELS.items():
        for B in (1, 4, 16):
            for ctx in (int(c) for c in args.contexts.split(",")):
                k, v, _, lens = dense_inputs(hq, hkv, d, B, ctx)
                cfg = SparseKVConfig(d, hq, hkv, 0.7, 0.7, ctx + 1)
                assert f.schedules(d, cfg.keep_k, cfg.keep_v)
                caches, cptr = sparse_caches(cfg, B, ctx, k, v, lens)
                L = cfg.window + cfg.group * ((ctx - cfg.window) // cfg.group)  # this append compresses a group
                lens_c = torch.full((B,), L, dtype=torch.int32, device="cuda")
                gen = torch.Generator(device="cuda").manual_seed(ctx + B + 1)
                kn = torch.randn((B, hkv, d), device="cuda", dtype=torch.float16, generator=gen)
                cp = [c._replace(lens=lens_c.data_ptr()) for c in cptr]
                plans = {}

                def plan(kind):
                    key = (kind, _cuda.current_context())
                    if key not in plans:
                        saved = ks.SOURCE, ks.SCHEDULE_RECORDS, f.SCHEDULE_APPEND_FROM
                        ks.SOURCE = str(Path(args.prev).resolve()) if kind == "prev" else saved[0]
                        ks.SCHEDULE_RECORDS, f.SCHEDULE_APPEND_FROM = kind != "plain", 1
                        try:
                            p = ks._Plan(ks._APPEND_PTRS)
                            p.launches = [ks._append_launch(cfg, B, p.addr)]
                        finally:
                            ks.SOURCE, ks.SCHEDULE_RECORDS, f.SCHEDULE_APPEND_FROM = saved
                        plans[key] = p
                    return plans[key]

                def run(kind, c, stream):
                    p = plan(kind)
                    p.set(kn.data_ptr(), kn.data_ptr(), c.lens, c.k_rec, c.v_rec, c.k_ring, c.v_ring)
                    _cuda.launch_all(p.launches, stream)

                if args.profile:
                    for _ in range(3):
                        run("sched", cp[0], torch.cuda.current_stream().cuda_stream)
                    torch.cuda.synchronize()
                    return
                # Once per kind on its own copy of cache 0: the scheduled kinds' bytes must agree.
                out = {}
                for kind in kinds:
                    t = tuple(x.clone() for x in caches[0])
                    run(kind, ks.CachePtrs(*(x.data_ptr() for x in t), lens_c.data_ptr()),
                        torch.cuda.current_stream().cuda_stream)
                    torch.cuda.synchronize()
                    out[kind] = t
                for kind in kinds:
                    for a, b, what in zip(out["sched"], out[kind], ("k_rec", "v_rec", "k_ring", "v_ring")):
                        if (kind == "plain" or (kind == "prev" and args.prev_any)) and what.endswith("rec"):
                            continue
                        # as bytes: ring slots beyond the sequences hold whatever torch.empty gave (NaN patterns too)
                        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), \
                            f"{model} B={B} {ctx}: {kind} {what} differs from sched"
                g0 = L - cfg.window - cfg.group  # the group's first token
                kr = out["sched"][0][:, :, g0:g0 + cfg.group]
                assert not torch.equal(kr, out["plain"][0][:, :, g0:g0 + cfg.group]), "no record was scheduled"
                row = dict(model=model, batch=B, context=ctx, group=cfg.group)
                for t in timers:
                    tag = "green16" if t.green else "full"
                    for kind in kinds:
                        row[f"{kind}_{tag}"] = t.ours(lambda i, s, kind=kind: run(kind, cp[i], s), len(cp),
                                                      max(20, len(cp)))
                    row[f"sched_minus_plain_{tag}"] = row[f"sched_{tag}"] - row[f"plain_{tag}"]
                    if args.prev:
                        row[f"prev_over_sched_{tag}"] = row[f"prev_{tag}"] / row[f"sched_{tag}"]
                rows.append(row)
                print(row, flush=True)
                caches = cptr = cp = out = None
                torch.cuda.synchronize()
    cols = ["model", "batch", "context"] + [c for c in rows[0] if c.endswith(("full", "green16"))]
    print_table(rows, cols)
    name = args.out or f"sparse_kv_choice_time_{meta()['commit']}"
    write_results(name, rows, meta({"what": "µs per append that compresses one 32-token group (70 %); sched: every "
                                    "group's store order chosen; plain: x = 0; prev: --prev source, scheduling",
                                    "prev": args.prev}))


if __name__ == "__main__":
    main()
