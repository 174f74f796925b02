#!/usr/bin/env python3
"""Where a small decode-attention call's time goes: the sparse kernel and the same pipeline on a dense cache, each
with and without the fused split merge, beside a launch of the pure-read kernel with nothing to read.

Issue 7's target (≤ 0.6× the best dense time at 70 %, ≥ 4k) is furthest at batch 1, where both the sparse and the
dense kernels take about twice a pure read of their bytes (``docs/sparse_kv.md``, "Session 27"). Per shape, at the
default tactic and split of each (``default_tactic`` / ``plan``), CUDA-graph replays over caches rotated beyond L2,
medians:

* ``launch``: ``sol_read`` (``tools/speed_of_light.cu``) over 0 bytes, one block: a graph node doing nothing;
* ``sparse`` / ``dense``: ``decode_attention`` / ``dense_decode_attention`` as shipped (the fused merge, one launch);
* ``sparse_nomerge`` / ``dense_nomerge``: the same kernel, grid and split with the merge switched off (``fuse = 0``:
  each block writes its split's partial and exits; the output is not produced, timing only).

The dense kernel's output is checked against SDPA's first (the sparse kernels' against float64 in the GPU tests).

``--ab OLD.cu`` instead times the default sparse call with the kernels of ``OLD.cu`` (another version of
``plugins/sparse_kv/sparse_kv.cu``) against this tree's, same plan, taking turns over ``--rounds`` rounds, on
:data:`SHAPES` and :data:`AB_SHAPES` (or ``--shapes``; models of :data:`MODELS` and :data:`AB_MODELS`); outputs of the
two are compared (max |diff|) before timing.

Usage: python tools/sparse_kv_latency.py [--out FILE] [--ab OLD.cu [--rounds N] [--shapes MODEL:B:CTX,...]]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench._common import meta, print_table, time_graph, write_results  # noqa: E402
from bench.bench_sparse_kv import MODELS, copies_for, dense_inputs, sparse_caches  # noqa: E402
from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402
from edgesdk.kernels import _cuda  # noqa: E402
from edgesdk.kernels import sparse_kv as ks  # noqa: E402

# (model name, Hq, Hkv): models of few KV heads, whose batch-1 calls have the most splits per head
AB_MODELS = {"qwen2.5-0.5b": (14, 2, 64), "tinyllama": (32, 4, 64)}
AB_SHAPES = [("qwen2.5-0.5b", 1, 8192), ("qwen2.5-0.5b", 1, 24576), ("tinyllama", 1, 16384), ("smollm2-135m", 2, 16384),
             ("llama3.2-1b", 2, 8192), ("qwen2.5-0.5b", 4, 12000)]
SHAPES = [("llama3.2-1b", 1, 4096), ("llama3.2-1b", 1, 16384), ("llama3.2-1b", 1, 32768), ("smollm2-135m", 1, 4096),
          ("smollm2-135m", 1, 16384), ("smollm2-135m", 1, 32768), ("llama3.2-1b", 4, 4096), ("smollm2-135m", 4, 4096)]


def nomerge(launches: list) -> list:
    """The attention launch of a fused plan with its last argument (``fuse``) set to 0."""
    launch = launches[0]
    fuse = launch.args.values[-1]  # the parameter array points at these ctypes values
    assert isinstance(fuse, ctypes.c_int) and fuse.value == 1, "not a fused streaming launch"
    fuse.value = 0
    return [launch]


def ab(old_src: str, rounds: int, out_name: str | None, shapes: list | None = None) -> None:
    """The default sparse call with OLD's kernels vs this tree's (same launcher and plan), rounds taking turns."""
    import statistics

    stream = torch.cuda.Stream()
    raw = stream.cuda_stream
    rows = []
    models = dict(MODELS, **AB_MODELS)
    for model, B, ctx in shapes or SHAPES + AB_SHAPES:
        hq, hkv, d = models[model]
        k, v, q, lens = dense_inputs(hq, hkv, d, B, ctx)
        cfg = SparseKVConfig(d, hq, hkv, 0.7, 0.7, ctx + 1)
        caches, cptr = sparse_caches(cfg, B, ctx, k, v, lens)
        n_sp = len(caches)
        st = ks.default_tactic(d, hq, hkv, B, ctx, rk=cfg.rk, rv=cfg.rv)
        _, ns = ks.plan_cache(cfg, B, ctx, tactic=st)
        versions = {}
        for name, src in (("old", old_src), ("new", ks.SOURCE)):
            saved, ks.SOURCE = ks.SOURCE, src
            try:
                p = ks._attention_plan(cfg, B, ctx, None, None, None, st, None)
            finally:
                ks.SOURCE = saved
            ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
            o = torch.full((B, hq, d), float("nan"), dtype=torch.float16, device="cuda")
            versions[name] = (p, ws, o)
        it = iter(range(1 << 30))

        def call(name):
            p, ws, o = versions[name]
            c = cptr[next(it) % n_sp]
            p.set(q.data_ptr(), ws.data_ptr(), ws.data_ptr() + p.extra["parts"], c.lens, c.k_rec, c.v_rec, c.k_ring,
                  c.v_ring, o.data_ptr())
            _cuda.launch_all(p.launches, raw)

        for name in versions:
            call(name)
        stream.synchronize()
        diff = (versions["old"][2].float() - versions["new"][2].float()).abs().max().item()
        assert diff <= 2e-3, f"{model} B={B} {ctx}: old and new kernels differ by {diff}"
        times = {"old": [], "new": []}
        for _ in range(rounds):
            for name in ("old", "new"):
                times[name].append(time_graph(lambda name=name: call(name), inner=max(20, n_sp), reps=10,
                                              stream=stream))
        row = {"model": model, "batch": B, "context": ctx, "tactic": st, "splits": ns,
               "old": statistics.median(times["old"]), "new": statistics.median(times["new"]), "max_diff": diff}
        row["speedup"] = row["old"] / row["new"]
        rows.append(row)
        print(row, flush=True)
        caches = cptr = None
        torch.cuda.empty_cache()
    path = write_results(out_name or "sparse_kv_merge_ab", rows, meta({"old_source": old_src, "rounds": rounds}))
    print_table(rows, ["model", "batch", "context", "tactic", "splits", "old", "new", "speedup", "max_diff"])
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--ab", default=None,
                    help="another sparse_kv.cu: time the default sparse call with its kernels too")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default=None, help="with --ab: MODEL:B:CTX,... instead of the built-in shapes")
    a = ap.parse_args()
    torch.cuda.init()
    _cuda.init()
    if a.ab:
        shapes = [(m, int(b), int(c)) for m, b, c in (x.split(":") for x in a.shapes.split(","))] if a.shapes else None
        ab(str(Path(a.ab).resolve()), a.rounds, Path(a.out).stem if a.out else None, shapes)
        return
    stream = torch.cuda.Stream()
    raw = stream.cuda_stream
    sol = _cuda.get_kernel(ROOT / "tools" / "speed_of_light.cu", "sol_read1")
    dummy = torch.empty(16, dtype=torch.uint8, device="cuda")
    rows = []
    for model, B, ctx in SHAPES:
        hq, hkv, d = MODELS[model]
        k, v, q, lens = dense_inputs(hq, hkv, d, B, ctx)
        out = torch.empty((B, hq, d), device="cuda", dtype=torch.float16)
        n_dense = copies_for(4 * k.numel())
        kc = [k] + [k.clone() for _ in range(n_dense - 1)]
        vc = [v] + [v.clone() for _ in range(n_dense - 1)]
        inner = max(20, n_dense)
        row = {"model": model, "batch": B, "context": ctx}
        args = [ctypes.c_void_p(dummy.data_ptr()), ctypes.c_ulonglong(0), ctypes.c_void_p(dummy.data_ptr()),
                ctypes.c_ulonglong(0)]
        row["launch"] = time_graph(lambda: sol.launch((1,), (256,), args, raw), inner=inner, stream=stream)
        ref = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]

        # dense: the default tactic of the sparse rule for a dense cache (record sizes 0)
        dt = ks.default_tactic(d, hq, hkv, B, ctx, rk=0, rv=0)
        row["dense_tactic"] = dt
        if dt in ks.FUSED_TACTICS:
            _, ns = ks.plan_dense(d, hq, hkv, B, ctx, tactic=dt)
            ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
            it = iter(range(1 << 30))

            def dense():
                i = next(it) % n_dense
                ks.dense_decode_attention(d, hq, hkv, B, ctx, ctx, q.data_ptr(), kc[i].data_ptr(), vc[i].data_ptr(),
                                          lens.data_ptr(), out.data_ptr(), ws.data_ptr(), raw, tactic=dt)

            with torch.cuda.stream(stream):
                out.fill_(float("nan"))
                dense()
            stream.synchronize()
            err = (out.float() - ref.float()).abs().max().item()
            assert err <= 2e-2, f"dense tactic {dt}: max |diff| vs SDPA {err}"
            row["dense"] = time_graph(dense, inner=inner, stream=stream)
            p = ks._Plan(ks._ATT_PTRS)
            p.launches = nomerge(ks._attention_launches(d, hq, hkv, B, ctx, (1, ctx, ks._DENSE_WINDOW, 1, 1, 1, 0, 0),
                                                        0, 0, None, None, None, dt, None, p.addr, dense=True))
            parts = ws.data_ptr() + 4 * ks._counter_words(B, hq)

            def dense_nm():
                i = next(it) % n_dense
                p.set(q.data_ptr(), ws.data_ptr(), parts, lens.data_ptr(), 0, 0, kc[i].data_ptr(), vc[i].data_ptr(),
                      out.data_ptr())
                _cuda.launch_all(p.launches, raw)

            row["dense_nomerge"] = time_graph(dense_nm, inner=inner, stream=stream)
        del kc[1:], vc[1:]

        cfg = SparseKVConfig(d, hq, hkv, 0.7, 0.7, ctx + 1)
        caches, cptr = sparse_caches(cfg, B, ctx, k, v, lens)
        n_sp = len(caches)
        st = ks.default_tactic(d, hq, hkv, B, ctx, rk=cfg.rk, rv=cfg.rv)
        row["sparse_tactic"] = st
        _, ns = ks.plan_cache(cfg, B, ctx, tactic=st)
        ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
        it = iter(range(1 << 30))

        def sparse():
            ks.decode_attention(cfg, B, ctx, q.data_ptr(), cptr[next(it) % n_sp], out.data_ptr(), ws.data_ptr(), raw,
                                tactic=st)

        row["sparse"] = time_graph(sparse, inner=max(20, n_sp), stream=stream)
        if st in ks.FUSED_TACTICS:
            p = ks._attention_plan(cfg, B, ctx, None, None, None, st, None)
            p.launches = nomerge(p.launches)

            def sparse_nm():
                c = cptr[next(it) % n_sp]
                p.set(q.data_ptr(), ws.data_ptr(), ws.data_ptr() + p.extra["parts"], c.lens, c.k_rec, c.v_rec,
                      c.k_ring, c.v_ring, out.data_ptr())
                _cuda.launch_all(p.launches, raw)

            row["sparse_nomerge"] = time_graph(sparse_nm, inner=max(20, n_sp), stream=stream)
        caches = cptr = None
        torch.cuda.empty_cache()
        rows.append(row)
        print(row, flush=True)
    note = __doc__.split("\n\n")[0]
    path = write_results(Path(a.out).stem if a.out else "sparse_kv_latency", rows, meta({"note": note}))
    print_table(rows, ["model", "batch", "context", "launch", "dense_tactic", "dense", "dense_nomerge", "sparse_tactic",
                       "sparse", "sparse_nomerge"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
