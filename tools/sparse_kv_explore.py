#!/usr/bin/env python3
"""Side-by-side timing of the sparse_kv attention tactics on a few shapes (exploration, not the benchmark).

For each shape: torch SDPA (dense fp16, GQA), our dense kernel per tactic, and the sparse (K, V at
``--sparsity``) kernel per tactic and split size. CUDA-graph replays, caches replicated beyond L2 and
rotated (``bench/bench_sparse_kv.py``'s method), medians. Prints one line per variant and writes JSON.

Usage: python tools/sparse_kv_explore.py [--out FILE] [--sparsity 0.7] [--shapes llama:1:4096,...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench._common import meta, time_graph  # noqa: E402
from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402
from edgesdk.kernels import _cuda  # noqa: E402
from edgesdk.kernels import sparse_kv as ks  # noqa: E402

MODELS = {"llama": (32, 8, 64), "smollm": (9, 3, 64)}
ROTATE = 160 << 20


def copies(nbytes: int) -> int:
    return max(1, min(512, math.ceil(ROTATE / max(1, nbytes))))  # as bench/bench_sparse_kv.py's MAX_COPIES


def random_problem(model: str, B: int, ctx: int, device: str = "cuda"):
    """K, V [B, Hkv, ctx, d] and Q [B, Hq, d] fp16 standard normal (generator seeded by the shape), every
    sequence ``ctx`` long, and an output buffer [B, Hq, d]."""
    hq, hkv, d = MODELS[model]
    gen = torch.Generator(device=device).manual_seed(ctx + B)
    k = torch.randn((B, hkv, ctx, d), device=device, dtype=torch.float16, generator=gen)
    v = torch.randn_like(k)
    q = torch.randn((B, hq, d), device=device, dtype=torch.float16, generator=gen)
    lens = torch.full((B,), ctx, dtype=torch.int32, device=device)
    return k, v, q, lens, torch.empty((B, hq, d), device=device, dtype=torch.float16)


def dense_copies(k, v) -> tuple[list, list]:
    """``k`` and ``v`` plus clones, enough that the dense caches rotated through exceed L2."""
    nd = copies(2 * k.numel() * 2)
    return [k] + [k.clone() for _ in range(nd - 1)], [v] + [v.clone() for _ in range(nd - 1)]


def compressed_copies(cfg: SparseKVConfig, B: int, ctx: int, k, v, lens, sp: int) -> tuple[list, list]:
    """Prefill one compressed cache from ``k``/``v`` [B, Hkv, ctx, d] and replicate it beyond L2.

    Returns the tensors (keep them alive) and one ``CachePtrs`` per copy."""
    d, hkv = cfg.head_dim, cfg.num_kv_heads
    mk = lambda r: torch.empty((B, hkv, cfg.record_capacity, r), device="cuda", dtype=torch.uint8)  # noqa: E731
    first = (mk(cfg.rk), mk(cfg.rv), torch.empty((B, hkv, cfg.ring, d), device="cuda", dtype=torch.float16),
             torch.empty((B, hkv, cfg.ring, d), device="cuda", dtype=torch.float16))
    # k, v and lens were written on torch's current stream and the prefill runs on ``sp``: wait for them (without
    # this the prefill of the largest shapes could read k, v and lens while torch was still writing them).
    torch.cuda.synchronize()
    ks.prefill(cfg, B, ctx, k.data_ptr(), v.data_ptr(),
               ks.CachePtrs(*(x.data_ptr() for x in first), lens.data_ptr()), sp)
    torch.cuda.synchronize()
    n = copies(cfg.kv_bytes(ctx) * B * hkv)
    caches = [first] + [tuple(x.clone() for x in first) for _ in range(n - 1)]
    return caches, [ks.CachePtrs(*(x.data_ptr() for x in c), lens.data_ptr()) for c in caches]


def run_shape(model: str, B: int, ctx: int, s: float, rows: list, sms: int) -> None:
    hq, hkv, d = MODELS[model]
    st = torch.cuda.Stream()
    sp = st.cuda_stream
    k, v, q, lens, out = random_problem(model, B, ctx)
    kc, vc = dense_copies(k, v)
    nd = len(kc)
    inner = max(20 if k.numel() * 4 < (64 << 20) else 8, nd)

    def rec(variant, us, **kw):
        rows.append(dict(model=model, batch=B, context=ctx, variant=variant, us=us, **kw))
        print(f"{model:7s} B={B:2d} ctx={ctx:5d} {variant:28s} {us:9.2f} us {kw if kw else ''}", flush=True)

    it = iter(range(1 << 30))
    q4 = q[:, :, None, :]

    def sdpa():
        i = next(it) % nd
        torch.nn.functional.scaled_dot_product_attention(q4, kc[i], vc[i], enable_gqa=True)
    rec("sdpa", time_graph(sdpa, inner=inner, stream=st))
    ref = torch.nn.functional.scaled_dot_product_attention(q4, k, v, enable_gqa=True)[:, :, 0].float()
    for tactic in (ks.SPLIT_V1,):
        ts0, _ = ks.plan_dense(d, hq, hkv, B, ctx, sms=sms, tactic=tactic)
        cap = ks.max_tokens_per_split(d, hq // hkv, 0, 0) if tactic == 0 else ks.MAX_TOKENS_PER_SPLIT2
        for ts in sorted({ts0, min(cap, 2 * ts0)}):
            _, ns = ks.plan_dense(d, hq, hkv, B, ctx, tokens_per_split=ts, tactic=tactic)
            ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
            it = iter(range(1 << 30))

            def fn(ts=ts, ws=ws, tactic=tactic):
                i = next(it) % nd
                ks.dense_decode_attention(d, hq, hkv, B, ctx, ctx, q.data_ptr(), kc[i].data_ptr(), vc[i].data_ptr(),
                                          lens.data_ptr(), out.data_ptr(), ws.data_ptr(), sp, tokens_per_split=ts,
                                          tactic=tactic)
            us = time_graph(fn, inner=inner, stream=st)
            err = (out.float() - ref).abs().max().item()
            rec(f"dense t{tactic} ts{ts}", us, err=err)
    del kc[1:], vc[1:]
    cfg = SparseKVConfig(d, hq, hkv, s, s, ctx + 1)
    _keep, cptr = compressed_copies(cfg, B, ctx, k, v, lens, sp)
    n_sp = len(cptr)
    inner_s = max(inner, n_sp)
    base = None
    for kname, tactic in [("v1", 0), ("attn2", 1), ("attn2", 2)]:
        ts0, _ = ks.plan_cache(cfg, B, ctx, sms=sms, tactic=tactic)
        cap = ks.max_tokens_per_split(d, hq // hkv, cfg.rk, cfg.rv) if tactic == 0 else ks.MAX_TOKENS_PER_SPLIT2
        for ts in sorted({ts0, min(cap, 2 * ts0)}):
            _, ns = ks.plan_cache(cfg, B, ctx, tokens_per_split=ts, tactic=tactic)
            ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
            it = iter(range(1 << 30))

            def fn(ts=ts, ws=ws, tactic=tactic):
                ks.decode_attention(cfg, B, ctx, q.data_ptr(), cptr[next(it) % n_sp], out.data_ptr(), ws.data_ptr(),
                                    sp, tokens_per_split=ts, tactic=tactic)
            us = time_graph(fn, inner=inner_s, stream=st)
            o = out.float().clone()
            if base is None:
                base = o
            rec(f"sparse{s} {kname} t{tactic} ts{ts}", us, ns=ns, diff_vs_t0=(o - base).abs().max().item())


def run_sweep(model: str, B: int, ctx: int, s: float, rows: list, sms: int) -> None:
    """Split-size sweep of tactic 1 beside tactics 0 and 2 at their heuristic splits, plus torch SDPA:
    one shape. (The sweep of commit 73df276, ``bench/results/sparse_kv_sweep_73df276.json``, also timed
    the round-1 serial merge kernel and the branch-loop record decode, since removed.)"""
    hq, hkv, d = MODELS[model]
    st = torch.cuda.Stream()
    sp = st.cuda_stream
    k, v, q, lens, out = random_problem(model, B, ctx)
    kc, vc = dense_copies(k, v)
    nd = len(kc)
    q4 = q[:, :, None, :]
    it = iter(range(1 << 30))

    def rec(variant, us, **kw):
        rows.append(dict(model=model, batch=B, context=ctx, variant=variant, us=us, **kw))
        print(f"{model:7s} B={B:2d} ctx={ctx:5d} {variant:28s} {us:9.2f} us {kw if kw else ''}", flush=True)

    def sdpa():
        i = next(it) % nd
        torch.nn.functional.scaled_dot_product_attention(q4, kc[i], vc[i], enable_gqa=True)
    rec("sdpa", time_graph(sdpa, inner=max(10, nd), reps=7, stream=st))
    del kc[1:], vc[1:]
    cfg = SparseKVConfig(d, hq, hkv, s, s, ctx + 1)
    _keep, cptr = compressed_copies(cfg, B, ctx, k, v, lens, sp)
    n_sp = len(cptr)
    inner = max(10, n_sp)
    base = None
    h1, _ = ks.plan_cache(cfg, B, ctx, sms=sms, tactic=1)
    h0, _ = ks.plan_cache(cfg, B, ctx, sms=sms, tactic=0)
    if B == 1:
        cands = {64, 128, 256, 512, 1024, 2048} | {h1}
    else:
        cands = {min(8192, max(64, int(h1 * f) // 64 * 64)) for f in (0.5, 1, 2)}
    variants = [("t0 heur", 0, h0), (f"t2 ts{h1}", 2, h1)] + [(f"t1 ts{ts}", 1, ts) for ts in sorted(cands)]
    for name, tactic, ts in variants:
        _, ns = ks.plan_cache(cfg, B, ctx, tokens_per_split=ts, tactic=tactic)
        ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
        it2 = iter(range(1 << 30))

        def fn(ts=ts, ws=ws, tactic=tactic):
            ks.decode_attention(cfg, B, ctx, q.data_ptr(), cptr[next(it2) % n_sp], out.data_ptr(), ws.data_ptr(),
                                sp, tokens_per_split=ts, tactic=tactic)
        us = time_graph(fn, inner=inner, reps=7, stream=st)
        o = out.float().clone()
        if base is None:
            base = o
        rec(f"sparse{s} {name}", us, tactic=tactic, ts=ts, ns=ns, heur=ts == h1,
            diff_vs_first=(o - base).abs().max().item())

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sparse_kv_explore.json")
    ap.add_argument("--sparsity", type=float, default=0.7)
    ap.add_argument("--sweep", action="store_true", help="split-size sweep of tactics 1, 2 (run_sweep)")
    ap.add_argument("--shapes", default="llama:1:4096,smollm:1:4096,llama:4:16384,llama:16:32768,smollm:16:32768")
    a = ap.parse_args()
    torch.cuda.init()
    _cuda.init()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows: list[dict] = []
    for spec in a.shapes.split(","):
        m, b, c = spec.split(":")
        if a.sweep:
            run_sweep(m, int(b), int(c), a.sparsity, rows, sms)
        else:
            run_shape(m, int(b), int(c), a.sparsity, rows, sms)
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps({"meta": meta(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
