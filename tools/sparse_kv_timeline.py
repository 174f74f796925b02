#!/usr/bin/env python3
"""Where a streaming decode-attention call's time goes, block by block (session 30).

Issue 7's benchmark times fall on a line in the tiles each warp walks: from 1 to 32 tiles per warp at one block per SM
(Llama-like B = 1 4k ... B = 4 32k, H100, ``bench/results/sparse_kv.json``) each extra tile per warp costs ≈ 1.4 µs,
and the line meets zero tiles at ≈ 6-8 µs, a quarter of a 30 µs call. This tool says what those microseconds are.

It compiles a copy of ``plugins/sparse_kv/sparse_kv.cu`` with ``SKV_TIMELINE`` defined: thread 0 of each streaming
block then stamps ``%globaltimer`` and ``clock64`` at the phase boundaries of ``attn2_split`` (0 block start, 8 warp 0's
first tile decoded (pipelined kernels), 1 the same after the record buffers moved, 2 warp 0's tiles done, 3 every warp's
tiles done, 4 partials written, 5 the merge hand-over's atomic returned, 6 the last block's merge done; 7 holds the SM)
into a ``__device__`` array (the shipped kernels have no stamps: without the macro the SASS is unchanged). With
stream-K (tactic 5) a block's stamps are those of its last segment. Per shape it runs the default plan (sparse,
``--sparsity``) and our dense streaming kernel (``--dense-tactic``, at its heuristic split) in CUDA graphs of ``--inner`` calls over caches rotated beyond L2,
reads the stamps the last call of each replay left, and reports per phase the median over blocks (µs, from ``clock64``
converted by each block's own ``globaltimer`` / ``clock64`` ratio) and, from ``globaltimer``, the spread of block
starts, when the last block finished its split and when the merge finished, all from the first block's start. Beside
them: the call's time in a CUDA graph with the shipped kernels and with the stamped ones (the stamps' own cost).

``--alt FILE`` (repeatable): another version of the source, stamped and timed beside on the same plan, its output
compared with the shipped kernel's; ``--no-rotate``: every call on the first cache copy. (Session 30's
``--alt-chunked``, which re-laid token-major records chunk-major for an alternative build, went once the format itself
became chunk-major.)

Usage: python tools/sparse_kv_timeline.py [--shapes MODEL:B:CTX,...] [--sparsity S] [--reps N] [--dense-tactic T]
       [--alt FILE ...] [--no-rotate] [--out NAME]
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402

SHAPES = [("llama3.2-1b", 1, 4096), ("llama3.2-1b", 1, 32768), ("llama3.2-1b", 4, 16384), ("llama3.2-1b", 16, 4096),
          ("llama3.2-1b", 16, 32768), ("smollm2-135m", 4, 32768), ("smollm2-135m", 16, 4096)]
PHASES = [("start_to_first_decode", 0, 8), ("start_to_first_tile", 0, 1), ("tiles", 1, 2), ("wait_other_warps", 2, 3),
          ("block_merge", 3, 4), ("hand_over", 4, 5), ("merge", 5, 6)]


def timeline_source(tmp: Path, src: Path | None = None) -> Path:
    """A copy of the kernel source (or of ``src``, another version of it) with SKV_TIMELINE defined, in its own folder
    under ``tmp`` (same file name: the includes resolve as for the real one through the plugins directory)."""
    real = ROOT / "plugins" / "sparse_kv" / "sparse_kv.cu"
    folder = Path(tempfile.mkdtemp(dir=tmp))
    dst = folder / "sparse_kv.cu"
    dst.write_text("#define SKV_TIMELINE 1\n" + Path(src or real).read_text())
    for h in real.parent.glob("*.cuh"):
        shutil.copy(h, folder / h.name)
    return dst


def analyse(st: np.ndarray, nblocks: int, fused: bool) -> dict:
    """One call's stamps ``st[blk, k, (globaltimer, clock)]`` -> phase durations and a few global instants (µs)."""
    st = st[:nblocks].astype(np.float64)
    st = st[st[:, 4, 0] > 0]  # blocks past the sequence's end return before stamping anything but stamp 0
    fused = fused and bool((st[:, 5, 0] > 0).any())  # one split per pair: the block merge writes the output (no 5, 6)
    t0 = st[:, 0, 0].min()
    gt, ck = st[:, :, 0], st[:, :, 1]
    last = 5 if fused else 4
    # one clock for all SMs: the median over blocks of their globaltimer / clock64 ratio (ns per clock)
    ratio = float(np.median((gt[:, last] - gt[:, 0]) / np.maximum(ck[:, last] - ck[:, 0], 1.0)))
    # (the globaltimer's steps are coarse on these GPUs, about 0.1-0.3 µs: durations come from clock64)
    out = {"blocks": int(len(st)), "sms": int(len(np.unique(st[:, 7, 0]))), "clock_ghz": 1.0 / ratio,
           "start_spread": float((gt[:, 0].max() - t0) / 1e3),
           "split_done_last": float((gt[:, 4].max() - t0) / 1e3),
           "split_done_median": float((np.median(gt[:, 4]) - t0) / 1e3)}
    for name, a, b in PHASES:
        if b == 6 or (b == 5 and not fused) or (b == 8 and not (st[:, 8, 1] > 0).all()):
            continue  # stamp 8: pipelined kernels only
        d = (ck[:, b] - ck[:, a]) * ratio / 1e3
        out[name] = float(np.median(d))
        out[name + "_max"] = float(d.max())
    if fused:
        m = st[:, 6, 1] > st[:, 5, 1]  # stamp 6 of this call (a block that was last in an earlier call keeps its own)
        merged = st[m]
        d = (merged[:, 6, 1] - merged[:, 5, 1]) * ratio / 1e3
        out["merge"] = float(np.median(d))
        out["merge_max"] = float(d.max())
        out["end"] = float((merged[:, 6, 0].max() - t0) / 1e3)
        out["hand_over_after_last_split"] = float((gt[:, 5].max() - gt[:, 4].max()) / 1e3)
    else:
        out["end"] = out["split_done_last"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=None, help="model:B:ctx,... (default: SHAPES)")
    ap.add_argument("--sparsity", type=float, default=0.7)
    ap.add_argument("--dense-tactic", type=int, default=4, help="our dense streaming tactic to stamp beside (0: none)")
    ap.add_argument("--reps", type=int, default=15, help="graph replays whose last call's stamps are kept")
    ap.add_argument("--inner", type=int, default=20, help="calls per graph")
    ap.add_argument("--out", default=None)
    ap.add_argument("--alt", action="append", default=[],
                    help="another sparse_kv.cu: its sparse kernels stamped and timed beside (kinds alt, alt2, ...)")
    ap.add_argument("--no-rotate", action="store_true", help="every call on the first cache copy (L2/TLB warm)")
    args = ap.parse_args()

    from bench._common import meta, print_table, time_graph, write_results
    from bench.bench_sparse_kv import MODELS, copies_for, dense_inputs, sparse_caches
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import sparse_kv as ks

    shapes = SHAPES
    if args.shapes:
        shapes = [(m, int(b), int(c)) for m, b, c in (x.split(":") for x in args.shapes.split(","))]
    tmp = Path(tempfile.mkdtemp(prefix="skv_tl_"))
    tl_src = str(timeline_source(tmp))
    alts = {("alt" if i == 0 else f"alt{i + 1}"): (str(Path(f).resolve()), str(timeline_source(tmp, Path(f))))
            for i, f in enumerate(args.alt)}
    cu = _cuda._driver()
    stream = torch.cuda.Stream()
    raw = stream.cuda_stream
    rows = []
    out_name = args.out or f"sparse_kv_timeline_{meta()['commit']}"

    def launches(source, *a, **kw):
        saved = ks.SOURCE
        ks.SOURCE = source
        try:
            return ks._attention_launches(*a, **kw)
        finally:
            ks.SOURCE = saved

    for model, B, ctx in shapes:
        hq, hkv, d = MODELS[model]
        k, v, q, lens = dense_inputs(hq, hkv, d, B, ctx)
        cfg = SparseKVConfig(d, hq, hkv, args.sparsity, args.sparsity, ctx + 1)
        caches, cptr = sparse_caches(cfg, B, ctx, k, v, lens)
        st = ks.default_tactic(d, hq, hkv, B, ctx, rk=cfg.rk, rv=cfg.rv)
        ts, ns = ks.plan_cache(cfg, B, ctx, tactic=st)
        kinds = [("sparse", st, ts, ns, ks.SOURCE, tl_src)]
        kinds += [(name, st, ts, ns, a, t) for name, (a, t) in alts.items()]

        dense_caches = []
        if args.dense_tactic:
            tsd, nsd = ks.plan_dense(d, hq, hkv, B, ctx, tactic=args.dense_tactic)
            kinds.append(("dense", args.dense_tactic, tsd, nsd, ks.SOURCE, tl_src))
            n_rot = copies_for(2 * k.numel() * 2)
            dense_caches = [(k, v)] + [(k.clone(), v.clone()) for _ in range(n_rot - 1)]
        for kind, tactic, ts_, ns_, plain_src, stamped_src in kinds:
            calls = {}
            for src_name, src in (("shipped", plain_src), ("stamped", stamped_src)):
                p = ks._Plan(ks._ATT_PTRS)
                if kind != "dense":
                    p.launches = launches(src, d, hq, hkv, B, ctx, ks._geometry(cfg), cfg.rk, cfg.rv, None, None,
                                          ts_, tactic, None, p.addr)
                else:
                    p.launches = launches(src, d, hq, hkv, B, ctx, (1, ctx, ks._DENSE_WINDOW, 1, 1, 1, 0, 0), 0, 0,
                                          None, None, ts_, tactic, None, p.addr, dense=True)
                p.extra["parts"] = 4 * ks._counter_words(B, hq)
                ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns_) // 4, device="cuda")
                o = torch.full((B, hq, d), float("nan"), dtype=torch.float16, device="cuda")
                calls[src_name] = (p, ws, o)
            it = iter(range(1 << 30))

            def call(name, kind=kind, calls=calls, it=it, dense_caches=dense_caches):
                p, ws, o = calls[name]
                i = 0 if args.no_rotate else next(it)
                if kind != "dense":
                    c = cptr[i % len(cptr)]
                    p.set(q.data_ptr(), ws.data_ptr(), ws.data_ptr() + p.extra["parts"], c.lens, c.k_rec, c.v_rec,
                          c.k_ring, c.v_ring, o.data_ptr())
                else:
                    kk, vv = dense_caches[i % len(dense_caches)]
                    p.set(q.data_ptr(), ws.data_ptr(), ws.data_ptr() + p.extra["parts"], lens.data_ptr(), 0, 0,
                          kk.data_ptr(), vv.data_ptr(), o.data_ptr())
                _cuda.launch_all(p.launches, raw)

            torch.cuda.synchronize()  # caches, workspaces and poisoned outputs (default stream) before `stream`
            for name in calls:
                call(name)
            stream.synchronize()
            assert torch.equal(calls["shipped"][2].view(torch.int16), calls["stamped"][2].view(torch.int16)), \
                f"{model} B={B} {ctx} {kind}: the stamped build's output differs"
            if kind == "sparse":
                ref_out = calls["shipped"][2].clone()
            elif kind in alts:
                assert torch.equal(ref_out.view(torch.int16), calls["shipped"][2].view(torch.int16)), \
                    f"{model} B={B} {ctx} {kind}: output differs from the shipped kernel's"
            t_ship = time_graph(lambda: call("shipped"), inner=args.inner, reps=10, stream=stream)
            t_stamp = time_graph(lambda: call("stamped"), inner=args.inner, reps=10, stream=stream)
            mod = _cuda._modules[(stamped_src, (), _cuda.current_context())]
            dptr, size = _cuda.check(cu.cuModuleGetGlobal(mod, b"skv_timeline"))
            nblocks = ns_ * hkv * B
            host = np.zeros(size // 8, dtype=np.uint64)
            fused = tactic in ks.FUSED_TACTICS
            with torch.cuda.stream(stream):
                call("stamped")
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=stream):
                    for _ in range(args.inner):
                        call("stamped")
            per_call = []
            for _ in range(args.reps):
                _cuda.check(cu.cuMemsetD8Async(dptr, 0, size, raw))
                g.replay()
                stream.synchronize()
                _cuda.check(cu.cuMemcpyDtoH(host.ctypes.data, dptr, size))
                per_call.append(analyse(host.reshape(-1, 16, 2), nblocks, fused))
            row = {"model": model, "batch": B, "context": ctx, "kind": kind, "tactic": tactic, "split": ts_,
                   "splits": ns_, "tiles_per_warp": math.ceil(ts_ / 16 / ks._warps(d, tactic, None)),
                   "graph_us_shipped": t_ship, "graph_us_stamped": t_stamp}
            for key in per_call[0]:
                row[key] = statistics.median(c.get(key, float("nan")) for c in per_call)
            rows.append(row)
            print(row, flush=True)
            path = write_results(out_name, rows, meta({"reps": args.reps, "inner": args.inner,
                                                       "sparsity": args.sparsity, "no_rotate": args.no_rotate,
                                                       "alts": {k: v[0] for k, v in alts.items()}}))
            del g
        del caches
        dense_caches = None
        torch.cuda.empty_cache()
    print_table(rows, ["model", "batch", "context", "kind", "tactic", "tiles_per_warp", "graph_us_shipped",
                       "graph_us_stamped", "start_spread", "start_to_first_tile", "tiles", "wait_other_warps",
                       "block_merge", "split_done_last", "hand_over_after_last_split", "merge", "end"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
