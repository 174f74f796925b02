#!/usr/bin/env python3
"""Benchmark: sparse_kv decode attention vs dense fp16 decode attention, compression per group.

Shapes (issue 7): Llama-3.2-1B-like (32 q, 8 kv, d 64) and SmolLM2-135M-like (9 q, 3 kv, d 64), batch
1/4/16, context 1k/4k/16k/32k, sparsity 0.5/0.7 (K and V). Side by side in one run: torch
``scaled_dot_product_attention`` (fp16, GQA), a Triton flash-decoding kernel (``bench/triton_decode.py``: split
over tokens, the GQA group as one ``tl.dot`` operand; fastest of its configurations and split counts per shape,
each checked against SDPA's output first), our dense kernels (``dense_decode_attention``: tactic 0, the split
kernel, and tactics 1-5, the streaming kernels of the sparse cache on a plain fp16 cache; each checked against SDPA
too), and the sparse kernel. "Best dense" is the fastest of the three dense ones. Our kernels are timed for every
tactic (``t0_full``… per tactic) at the heuristic split size, twice it and (streaming tactics) half of it; the
fastest is kept (what a tactic selector would pick; ``ts_*`` and ``tactic_*`` record it). Caches are replicated
and rotated so every call reads beyond L2. Compression: one ``append`` call that compresses a group of
32 tokens (all heads, all sequences) and writes the new token.

Full GPU: CUDA-graph replays (``bench._common.time_graph``). 16-SM green context: our kernels in a
driver-level CUDA graph on a green-context stream, and so is the Triton kernel (eagerly where capture is refused:
``graph_error_green16``); SDPA eagerly on that stream (``timing_*`` says so; where a Triton launch fails there,
``error_green16`` records why).

Usage: python bench/bench_sparse_kv.py [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench._common import meta, print_table, time_graph, write_results  # noqa: E402
from edgesdk.errors import EdgeSDKError  # noqa: E402
from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402
from edgesdk.kernels import _cuda  # noqa: E402
from edgesdk.kernels import sparse_kv as ks  # noqa: E402

MODELS = {"llama3.2-1b": (32, 8, 64), "smollm2-135m": (9, 3, 64)}
BATCHES = (1, 4, 16)
CONTEXTS = (1024, 4096, 16384, 32768)
SPARSITIES = (0.5, 0.7)
ROTATE_BYTES = 160 << 20  # > 3x the H100/H200 L2
# Up to 512 copies (was 64, under which SmolLM2-like B = 1 at 4k, 70 %, a 1.2 MB cache, rotated 76 MB: 1.3x an
# H200's L2 instead of ROTATE_BYTES; at 1k, caches of 0.3-2.1 MB, sparse and dense, rotated 20-134 MB)
MAX_COPIES = 512
DENSE = ("sdpa", "dense_cuda", "triton_fd")  # the dense baselines: "best dense" is the fastest of these

try:
    from bench import triton_decode as TRITON
except ImportError as _e:  # Triton absent: the benchmark runs without that baseline and says so
    print(f"Triton flash-decoding baseline unavailable: {_e!r}")
    TRITON = None


def copies_for(nbytes: int) -> int:
    return max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES / max(1, nbytes))))


class Timer:
    """Times a callable ``fn(i, stream)`` (i = rotation index) on the full GPU or a green context."""

    def __init__(self, green: bool):
        from cuda.bindings import driver as cu

        self.cu = cu
        self.green = green
        self.prim = _cuda.check(cu.cuCtxGetCurrent())
        if green:
            self.ctx, self.sms = _cuda.green_context(16)
            _cuda.check(cu.cuCtxSetCurrent(self.ctx))
            self.stream = int(_cuda.check(cu.cuStreamCreate(1)))
            _cuda.check(cu.cuCtxSetCurrent(self.prim))
            self.torch_stream = torch.cuda.ExternalStream(self.stream)
        else:
            self.ctx, self.sms = self.prim, torch.cuda.get_device_properties(0).multi_processor_count
            self.torch_stream = torch.cuda.Stream()
            self.stream = self.torch_stream.cuda_stream

    def ours(self, fn, n_rot: int, inner: int, reps: int = 10, green_ctx_current: bool = True) -> float:
        """Median µs per call of our launches (CUDA graph of ``inner`` calls). On the green context the graph is
        captured on its stream with the green context current (our launchers load their kernels per context), or,
        with ``green_ctx_current=False``, with the primary context current (launchers that keep the primary
        context's kernels, such as Triton's, as their eager calls on that stream do)."""
        cu = self.cu
        if not self.green:
            it = iter(range(1 << 30))
            return time_graph(lambda: fn(next(it) % n_rot, self.stream), inner=inner, reps=reps,
                              stream=self.torch_stream)
        if green_ctx_current:
            _cuda.check(cu.cuCtxSetCurrent(self.ctx))
        try:
            st = cu.CUstream(self.stream)
            for i in range(3):
                fn(i % n_rot, self.stream)
            _cuda.check(cu.cuStreamSynchronize(st))
            _cuda.check(cu.cuStreamBeginCapture(st, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED))
            try:
                for i in range(inner):
                    fn(i % n_rot, self.stream)
            except BaseException:
                cu.cuStreamEndCapture(st)  # leave the stream usable for the next timing
                raise
            graph = _cuda.check(cu.cuStreamEndCapture(st))
            exe = _cuda.check(cu.cuGraphInstantiate(graph, 0))
            e0, e1 = _cuda.check(cu.cuEventCreate(0)), _cuda.check(cu.cuEventCreate(0))
            _cuda.check(cu.cuGraphLaunch(exe, st))
            times = []
            for _ in range(reps):
                _cuda.check(cu.cuEventRecord(e0, st))
                _cuda.check(cu.cuGraphLaunch(exe, st))
                _cuda.check(cu.cuEventRecord(e1, st))
                _cuda.check(cu.cuEventSynchronize(e1))
                times.append(_cuda.check(cu.cuEventElapsedTime(e0, e1)) * 1000.0 / inner)
            for h in (e0, e1):
                cu.cuEventDestroy(h)
            cu.cuGraphExecDestroy(exe)
            cu.cuGraphDestroy(graph)
            return statistics.median(times)
        finally:
            _cuda.check(cu.cuCtxSetCurrent(self.prim))

    def torch_op(self, fn, n_rot: int, inner: int, reps: int = 10) -> tuple[float, str]:
        """Median µs per call of a torch op: CUDA graph on the full GPU, eager on the green stream."""
        if not self.green:
            it = iter(range(1 << 30))
            return time_graph(lambda: fn(next(it) % n_rot), inner=inner, reps=reps, stream=self.torch_stream), "graph"
        s = self.torch_stream
        with torch.cuda.stream(s):
            for i in range(3):
                fn(i % n_rot)
            times = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(s)
                for i in range(inner):
                    fn(i % n_rot)
                b.record(s)
                b.synchronize()
                times.append(a.elapsed_time(b) * 1000.0 / inner)
        return statistics.median(times), "eager"


def split_sizes(tactic: int, ts0: int, cap: int) -> list[int]:
    """Split sizes timed per tactic: the heuristic's ``ts0``, twice it and, for the streaming kernels (whose split
    landscape is bumpy: waves), half of it."""
    sizes = {ts0, min(cap, 2 * ts0)}
    if tactic != ks.SPLIT_V1:
        unit = 16 * ks.WIDE_WARPS.get(tactic, ks.WARPS2)
        sizes.add(max(unit, ts0 // (2 * unit) * unit))
    return sorted(sizes)


def check_against(call, out, ref, t, what: str, green_ctx_current: bool = True) -> None:
    """Run ``call`` once on the timer's stream with ``out`` poisoned; its output must match SDPA's ``ref``. On the
    green context the call runs with that context current (our launchers), or not (``green_ctx_current=False``:
    Triton's), as :meth:`Timer.ours` times it."""
    with torch.cuda.stream(t.torch_stream):
        out.fill_(float("nan"))
    t.torch_stream.synchronize()
    if t.green and green_ctx_current:
        _cuda.check(t.cu.cuCtxSetCurrent(t.ctx))
    try:
        call()
        _cuda.check(t.cu.cuStreamSynchronize(t.cu.CUstream(t.stream)))
    finally:
        if t.green and green_ctx_current:
            _cuda.check(t.cu.cuCtxSetCurrent(t.prim))
    err = (out.float() - ref.float()).abs().max().item()
    if not err <= 2e-2:  # NaN fails too
        raise RuntimeError(f"{what}: max |diff| vs SDPA {err}")


def dense_inputs(hq, hkv, d, B, ctx):
    """Seeded random fp16 K, V ``[B, Hkv, ctx, d]``, q ``[B, Hq, d]`` and ``lens`` (all ``ctx``) on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(ctx + B)
    k = torch.randn((B, hkv, ctx, d), device="cuda", dtype=torch.float16, generator=gen)
    v = torch.randn((B, hkv, ctx, d), device="cuda", dtype=torch.float16, generator=gen)
    q = torch.randn((B, hq, d), device="cuda", dtype=torch.float16, generator=gen)
    return k, v, q, torch.full((B,), ctx, dtype=torch.int32, device="cuda")


def sparse_caches(cfg, B, ctx, k, v, lens):
    """K and V compressed by ``ks.prefill`` into a cache, and enough copies of it to read beyond L2 per rotation:
    (list of (k_rec, v_rec, k_ring, v_ring) tensors, list of their ``CachePtrs``)."""
    hkv, d = cfg.num_kv_heads, cfg.head_dim
    mk = lambda r: torch.empty((B, hkv, cfg.record_capacity, r), device="cuda", dtype=torch.uint8)  # noqa: E731
    k_rec, v_rec = mk(cfg.rk), mk(cfg.rv)
    k_ring = torch.empty((B, hkv, cfg.ring, d), device="cuda", dtype=torch.float16)
    v_ring = torch.empty_like(k_ring)
    ptr = ks.CachePtrs(k_rec.data_ptr(), v_rec.data_ptr(), k_ring.data_ptr(), v_ring.data_ptr(), lens.data_ptr())
    ks.prefill(cfg, B, ctx, k.data_ptr(), v.data_ptr(), ptr, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    n_sp = copies_for(cfg.kv_bytes(ctx) * B * hkv)
    caches = [(k_rec, v_rec, k_ring, v_ring)] + [tuple(x.clone() for x in (k_rec, v_rec, k_ring, v_ring))
                                                 for _ in range(n_sp - 1)]
    return caches, [ks.CachePtrs(*(x.data_ptr() for x in c), lens.data_ptr()) for c in caches]


def time_sdpa(k, v, q):
    """Median µs per call of torch ``scaled_dot_product_attention`` (fp16, GQA) of one query per sequence over the
    dense cache ``k``, ``v`` (copies rotated beyond L2; full GPU, CUDA graph)."""
    dense_bytes = 4 * k.numel()
    n = copies_for(dense_bytes)
    kc = [k] + [k.clone() for _ in range(n - 1)]
    vc = [v] + [v.clone() for _ in range(n - 1)]
    q4 = q[:, :, None, :]
    it = [0]

    def sdpa():
        i = it[0] % n
        torch.nn.functional.scaled_dot_product_attention(q4, kc[i], vc[i], enable_gqa=True)
        it[0] += 1

    return time_graph(sdpa, inner=max(20 if dense_bytes < (64 << 20) else 8, n), reps=10)


def time_default(cfg, B, ctx, q, cptr, out, inner):
    """Median µs per call of ``decode_attention`` with its default tactic and split, over the rotated caches
    ``cptr`` (full GPU, CUDA graph); ``out`` holds the last call's result."""
    _, ns = ks.plan_cache(cfg, B, ctx)
    ws = torch.zeros(ks.workspace_bytes(cfg.num_q_heads, cfg.head_dim, B, ns) // 4, device="cuda")  # counters zeroed
    j = [0]

    def call():
        ks.decode_attention(cfg, B, ctx, q.data_ptr(), cptr[j[0] % len(cptr)], out.data_ptr(), ws.data_ptr(),
                            torch.cuda.current_stream().cuda_stream)
        j[0] += 1

    return time_graph(call, inner=max(inner, len(cptr)), reps=10)


def bench_shape(timers, model, hq, hkv, d, B, ctx, rows, quick):
    G = hq // hkv
    dense_bytes = 2 * B * hkv * ctx * d * 2
    n_dense = copies_for(dense_bytes)
    inner = 20 if dense_bytes < (64 << 20) else 8
    inner_d = max(inner, n_dense)
    k, v, q, lens = dense_inputs(hq, hkv, d, B, ctx)
    gen = torch.Generator(device="cuda").manual_seed(ctx + B + 1)  # the append's new token (below)
    kc = [k] + [k.clone() for _ in range(n_dense - 1)]
    vc = [v] + [v.clone() for _ in range(n_dense - 1)]
    out = torch.empty((B, hq, d), device="cuda", dtype=torch.float16)
    base = {"model": model, "batch": B, "context": ctx}
    res: dict[str, dict] = {}
    for t in timers:
        tag = "green16" if t.green else "full"
        # torch SDPA, dense fp16, GQA
        q4 = q[:, :, None, :]

        def sdpa(i):
            torch.nn.functional.scaled_dot_product_attention(q4, kc[i], vc[i], enable_gqa=True)

        us, how = t.torch_op(sdpa, n_dense, inner_d)
        res.setdefault("sdpa", {})[tag] = us
        res["sdpa"]["timing_" + tag] = how
        ref = torch.nn.functional.scaled_dot_product_attention(q4, k, v, enable_gqa=True)[:, :, 0]
        # a Triton flash-decoding kernel (bench/triton_decode.py): fastest configuration x split count
        if TRITON is not None:
            try:
                best = None
                for ns, cfg, fused in itertools.product(TRITON.split_counts(B, hkv, ctx, t.sms), TRITON.CONFIGS,
                                                        (False, True)):
                    fd = TRITON.FlashDecode(hq, hkv, d, B, ctx, ns, cfg, fused=fused)

                    def tri_once(fd=fd):
                        with torch.cuda.stream(t.torch_stream):
                            fd(q, k, v, lens, out)

                    check_against(tri_once, out, ref, t, f"Triton flash-decoding {cfg}, {ns} splits, fused {fused}",
                                  green_ctx_current=False)

                    def tri(i, stream, fd=fd):
                        with torch.cuda.stream(t.torch_stream):
                            fd(q, kc[i], vc[i], lens, out)

                    try:
                        us, how = t.ours(tri, n_dense, inner_d, green_ctx_current=False), "graph"
                    except Exception as e:  # noqa: BLE001 - a graph on the green stream refused: eager, and why
                        res.setdefault("triton_fd", {})["graph_error_" + tag] = repr(e)[-300:]
                        us, how = t.torch_op(lambda i, fd=fd: fd(q, kc[i], vc[i], lens, out), n_dense, inner_d)
                    if best is None or us < best[0]:
                        best = (us, fd.ns, cfg, fused, how)
                row = res.setdefault("triton_fd", {})
                (row[tag], row["splits_" + tag], row["config_" + tag], row["fused_" + tag],
                 row["timing_" + tag]) = best[:5]
            except Exception as e:  # noqa: BLE001 - recorded: e.g. a green context the Triton launcher cannot use
                msg = repr(e)
                msg = msg if len(msg) < 600 else msg[:200] + " ... " + msg[-400:]  # a compile error's tail says why
                res.setdefault("triton_fd", {})["error_" + tag] = msg
        # our dense kernels: the split kernel (tactic 0) and the streaming kernels (1-4) on the plain cache, each
        # output checked against SDPA's before it is timed
        best = None
        row = res.setdefault("dense_cuda", {})
        for tactic in ks.TACTICS:
            ts0, _ = ks.plan_dense(d, hq, hkv, B, ctx, sms=t.sms, tactic=tactic)
            cap = ks.max_tokens_per_split(d, G, 0, 0) if tactic == ks.SPLIT_V1 else ks.MAX_TOKENS_PER_SPLIT2
            for ts in split_sizes(tactic, ts0, cap):
                _, ns = ks.plan_dense(d, hq, hkv, B, ctx, tokens_per_split=ts, tactic=tactic)
                ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")  # counters zeroed

                def dense(i, stream, ts=ts, ws=ws, tactic=tactic):
                    ks.dense_decode_attention(d, hq, hkv, B, ctx, ctx, q.data_ptr(), kc[i].data_ptr(),
                                              vc[i].data_ptr(), lens.data_ptr(), out.data_ptr(), ws.data_ptr(), stream,
                                              tokens_per_split=ts, tactic=tactic)

                try:
                    check_against(lambda: dense(0, t.stream), out, ref, t, f"dense tactic {tactic}, split {ts}")
                except EdgeSDKError as e:  # e.g. 16 warps' shared memory over this device's limit
                    row[f"error_t{tactic}_{tag}"] = str(e)[:300]
                    break
                us = t.ours(dense, n_dense, inner_d)
                row[f"t{tactic}_{tag}"] = min(us, row.get(f"t{tactic}_{tag}", math.inf))
                if best is None or us < best[0]:
                    best = (us, ts, tactic)
        row[tag], row["ts_" + tag], row["tactic_" + tag] = best
    del kc[1:], vc[1:]
    for s in SPARSITIES:
        cfg = SparseKVConfig(d, hq, hkv, s, s, ctx + 1)
        caches, cptr = sparse_caches(cfg, B, ctx, k, v, lens)
        n_sp = len(caches)
        name = f"sparse{s}"
        row = res.setdefault(name, {})
        row["kv_ratio"] = cfg.memory_ratio(ctx)
        row["kv_ratio_allocated"] = (sum(x.numel() for x in caches[0]) * 1.0) / (2 * B * hkv * ctx * d * 2)
        for t in timers:
            tag = "green16" if t.green else "full"
            best = None
            for tactic in ks.TACTICS:
                ts0, _ = ks.plan_cache(cfg, B, ctx, sms=t.sms, tactic=tactic)
                cap = (ks.max_tokens_per_split(d, G, cfg.rk, cfg.rv) if tactic == ks.SPLIT_V1
                       else ks.MAX_TOKENS_PER_SPLIT2)
                for ts in split_sizes(tactic, ts0, cap):
                    _, ns = ks.plan_cache(cfg, B, ctx, tokens_per_split=ts, tactic=tactic)
                    ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")  # counters zeroed

                    def sparse(i, stream, ts=ts, ws=ws, tactic=tactic):
                        ks.decode_attention(cfg, B, ctx, q.data_ptr(), cptr[i], out.data_ptr(), ws.data_ptr(), stream,
                                            tokens_per_split=ts, tactic=tactic)

                    us = t.ours(sparse, n_sp, max(inner, n_sp))
                    row[f"t{tactic}_{tag}"] = min(us, row.get(f"t{tactic}_{tag}", math.inf))
                    if best is None or us < best[0]:
                        best = (us, ts, tactic)
            row[tag], row["ts_" + tag], row["tactic_" + tag] = best
            # Compression of one group: lens chosen so that this append compresses 32 tokens.
            L = cfg.window + cfg.group * ((ctx - cfg.window) // cfg.group)
            lens_c = torch.full((B,), L, dtype=torch.int32, device="cuda")
            kn = torch.randn((B, hkv, d), device="cuda", dtype=torch.float16, generator=gen)
            cp = [c._replace(lens=lens_c.data_ptr()) for c in cptr]

            def comp(i, stream):
                ks.append(cfg, B, kn.data_ptr(), kn.data_ptr(), cp[i], stream)

            row["compress_group_us_" + tag] = t.ours(comp, n_sp, max(inner, n_sp))
        caches = cptr = None  # free before the next sparsity
    torch.cuda.synchronize()
    for name, r in res.items():
        row = dict(base, variant=name, **r)
        for tag in ("full", "green16"):
            best_dense = min(res[n].get(tag, math.inf) for n in DENSE if n in res)
            if tag in r:
                row["vs_best_dense_" + tag] = r[tag] / best_dense
            if "compress_group_us_" + tag in r:
                row["compress_vs_dense_" + tag] = r["compress_group_us_" + tag] / best_dense
        rows.append(row)


def profile_once(model: str = "llama3.2-1b", B: int = 4, ctx: int = 16384, s: float = 0.7) -> None:
    """One launch of the sparse and of the dense attention, nothing else (for Nsight Compute)."""
    hq, hkv, d = MODELS[model]
    k = torch.randn((B, hkv, ctx, d), device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    q = torch.randn((B, hq, d), device="cuda", dtype=torch.float16)
    lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    out = torch.empty((B, hq, d), device="cuda", dtype=torch.float16)
    cfg = SparseKVConfig(d, hq, hkv, s, s, ctx + 1)
    nr = cfg.record_capacity
    rec = [torch.empty((B, hkv, nr, r), device="cuda", dtype=torch.uint8) for r in (cfg.rk, cfg.rv)]
    ring = [torch.empty((B, hkv, cfg.ring, d), device="cuda", dtype=torch.float16) for _ in range(2)]
    ptr = ks.CachePtrs(rec[0].data_ptr(), rec[1].data_ptr(), ring[0].data_ptr(), ring[1].data_ptr(), lens.data_ptr())
    stream = torch.cuda.current_stream().cuda_stream
    ks.prefill(cfg, B, ctx, k.data_ptr(), v.data_ptr(), ptr, stream)
    _, ns = ks.plan_cache(cfg, B, ctx)
    _, nd = ks.plan_dense(d, hq, hkv, B, ctx)
    ws = torch.empty(ks.workspace_bytes(hq, d, B, max(ns, nd)) // 4, device="cuda")
    ks.decode_attention(cfg, B, ctx, q.data_ptr(), ptr, out.data_ptr(), ws.data_ptr(), stream)
    ks.dense_decode_attention(d, hq, hkv, B, ctx, ctx, q.data_ptr(), k.data_ptr(), v.data_ptr(), lens.data_ptr(),
                              out.data_ptr(), ws.data_ptr(), stream)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one model, batch 1 and 4, contexts 1k and 16k")
    ap.add_argument("--no-green", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="launch the sparse (0.7) and dense attention once each on Llama B=4 16k (for ncu)")
    a = ap.parse_args()
    torch.cuda.init()
    _cuda.init()
    if a.profile:
        profile_once()
        return
    timers = [Timer(False)]
    if not a.no_green:
        try:
            timers.append(Timer(True))
        except Exception as e:  # noqa: BLE001 - reported, the full-GPU run still counts
            print(f"green context unavailable: {e!r}")
    models = dict(list(MODELS.items())[:1]) if a.quick else MODELS
    rows: list[dict] = []
    t0 = time.time()
    info = meta({"green_sms": timers[1].sms if len(timers) > 1 else None, "rotate_bytes": ROTATE_BYTES,
                 "note": "us per decode-attention call (attention + split merge); our kernels (sparse, and dense_cuda "
                         "= dense_decode_attention): best of every tactic (tN_* per tactic) at the heuristic split, "
                         "twice it and (streaming tactics) half of it; triton_fd: best configuration x split count "
                         "x merge kind; vs_best_dense = time / the fastest of sdpa, triton_fd, dense_cuda; compress = "
                         "one append that compresses a 32-token group"})
    name = "sparse_kv" + ("_quick" if a.quick else "")
    for model, (hq, hkv, d) in models.items():
        for B in ((1, 4) if a.quick else BATCHES):
            for ctx in ((1024, 16384) if a.quick else CONTEXTS):
                bench_shape(timers, model, hq, hkv, d, B, ctx, rows, a.quick)
                print(f"{model} B={B} ctx={ctx} done at {time.time() - t0:.0f} s", flush=True)
                write_results(name, rows, dict(info, partial=True))  # a cut-short run still leaves its rows
                torch.cuda.empty_cache()
    info["seconds"] = round(time.time() - t0, 1)
    path = write_results(name, rows, info)
    print_table(rows, ["model", "batch", "context", "variant", "full", "vs_best_dense_full", "tactic_full", "green16",
                       "vs_best_dense_green16", "tactic_green16", "kv_ratio", "compress_vs_dense_full"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
