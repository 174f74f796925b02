#!/usr/bin/env python3
"""Experiment: records with 6-bit channel indices instead of the bitmap (d = 64), timed against the shipped format.

Session 14's profile put about half of the streaming kernel's instructions in the record decode, 9.5 SASS
instructions per kept value for the bit walk (``FLO``, clear, word switch, address, store), one dependent chain per
record. Session 15 costed a record that stores each kept value's channel as a 6-bit index instead (no chain; about
4.5 instructions per value) and did not build it. This tool builds it as an experiment:

* index record (``decode_row64_idx`` in ``plugins/sparse_kv/sparse_kv.cu``): ``KP = round_up(keep, 4)`` fp16 values
  in channel order, then ``ceil(KP / 5)`` 32-bit words of five 6-bit channel indices, zero bytes to a multiple of 8;
  slots ``keep .. KP - 1`` repeat the last kept value and channel. d = 64: 56 bytes at 70 % (bitmap: 48), 96 at 50 %
  (bitmap: 72);
* the records are converted from the shipped cache (``ks.prefill``) on the GPU (:func:`to_index_records`; checked on
  the CPU against the format's own decompression first, :func:`self_check`);
* per shape (issue 7's 18 at >= 4k, 70 % and 50 %), the streaming kernels on both record kinds with the same plan: the
  default's tactic and split, and each of tactics 1-4 at the benchmark's split sizes (``split_sizes``); outputs of the
  two kinds compared on every plan (the dense tiles they decode are the same, so they must be bit-identical); CUDA-graph
  replays over caches rotated beyond L2, kinds taking turns over ``--rounds`` rounds, medians.

Usage: python tools/sparse_kv_index.py [--rounds N] [--out NAME] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from edgesdk.formats.sparse_kv import SparseKVConfig, compress, decompress, keep_count  # noqa: E402


def index_record_bytes(keep: int) -> int:
    kp = (keep + 3) // 4 * 4
    return 2 * kp + (4 * -(-kp // 5) + 7) // 8 * 8


def to_index_records(rec: torch.Tensor, keep: int, chunk: int = 1 << 20) -> torch.Tensor:
    """uint8 ``[..., 8 + 2 KP]`` bitmap records (d = 64) → uint8 ``[..., index_record_bytes(keep)]`` index records.
    Records without ``keep`` set bits (unused capacity) give garbage indices; no kernel reads them."""
    kp = (keep + 3) // 4 * 4
    nw = -(-kp // 5)
    ri = index_record_bytes(keep)
    assert rec.shape[-1] == 8 + 2 * kp, (rec.shape, keep)
    flat = rec.reshape(-1, rec.shape[-1])
    out = torch.zeros((flat.shape[0], ri), dtype=torch.uint8, device=rec.device)
    ar = torch.arange(64, device=rec.device)
    for a in range(0, flat.shape[0], chunk):
        x = flat[a:a + chunk]
        n = x.shape[0]
        bm = x[:, :8].contiguous().view(torch.int64)[:, 0]
        bits = (bm[:, None] >> ar) & 1
        ch = torch.where(bits.bool(), ar, ar + 64).sort(dim=1).values[:, :keep] & 63
        vals = x[:, 8:8 + 2 * kp].contiguous().view(torch.int16)[:, :keep]
        ch = torch.cat([ch, ch[:, keep - 1:].expand(n, kp - keep)], 1)
        vals = torch.cat([vals, vals[:, keep - 1:].expand(n, kp - keep)], 1)
        idx = torch.zeros((n, 5 * nw), dtype=torch.int64, device=rec.device)
        idx[:, :kp] = ch
        idx = idx.view(n, nw, 5)
        words = sum(idx[:, :, m] << (6 * m) for m in range(5)).to(torch.int32)
        out[a:a + n, :2 * kp] = vals.contiguous().view(torch.uint8)
        out[a:a + n, 2 * kp:2 * kp + 4 * nw] = words.contiguous().view(torch.uint8)
    return out.reshape(*rec.shape[:-1], ri)


def decode_index_records(rec: np.ndarray, keep: int) -> np.ndarray:
    """numpy: index records ``[N, R]`` → dense fp16 rows ``[N, 64]`` (the kernel's decode, for the self-check)."""
    kp = (keep + 3) // 4 * 4
    nw = -(-kp // 5)
    vals = rec[:, :2 * kp].copy().view(np.float16)
    words = rec[:, 2 * kp:2 * kp + 4 * nw].copy().view(np.uint32).astype(np.int64)
    rows = np.zeros((rec.shape[0], 64), np.float16)
    for j in range(kp):
        c = (words[:, j // 5] >> (6 * (j % 5))) & 63
        rows[np.arange(rec.shape[0]), c] = vals[:, j]
    return rows


def self_check() -> None:
    """Index records made by :func:`to_index_records` decode to the rows the bitmap records decompress to."""
    rng = np.random.default_rng(7)
    for s in (0.7, 0.5, 0.3, 0.9, 0.0):
        keep = keep_count(64, s)
        x = rng.standard_normal((301, 64)).astype(np.float16)
        x[3, :] = x[3, 0]  # ties: every magnitude equal
        x[4, :] = -x[4, :]
        rec = compress(x, keep)
        want = decompress(rec, 64, keep)
        got = decode_index_records(to_index_records(torch.from_numpy(rec), keep, chunk=64).numpy(), keep)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), f"index records differ at sparsity {s}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="two shapes, default plan only")
    args = ap.parse_args()
    self_check()
    print("self-check passed (index records decode to the bitmap records' rows)", flush=True)

    from bench._common import meta, print_table, time_graph, write_results
    from bench.bench_sparse_kv import MODELS, dense_inputs, sparse_caches, split_sizes
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import sparse_kv as ks

    shipped_kernel = ks._kernel

    def index_kernel(name, max_smem_carveout=False):
        return shipped_kernel(name.replace("sparse_kv_attn2_", "sparse_kv_attn2i_"), max_smem_carveout)

    stream = torch.cuda.Stream()
    raw = stream.cuda_stream
    rows = []
    out_name = args.out or f"sparse_kv_index_{meta()['commit']}"
    shapes = [(m, b, c) for m in MODELS for b in (1, 4, 16) for c in (4096, 16384, 32768)]
    if args.quick:
        shapes = [("llama3.2-1b", 16, 32768), ("smollm2-135m", 1, 4096)]
    for model, B, ctx in shapes:
        hq, hkv, d = MODELS[model]
        k, v, q, lens = dense_inputs(hq, hkv, d, B, ctx)
        for s in (0.7, 0.5):
            cfg = SparseKVConfig(d, hq, hkv, s, s, ctx + 1)
            caches, cptr = sparse_caches(cfg, B, ctx, k, v, lens)
            ri = index_record_bytes(cfg.keep_k)
            ki, vi = to_index_records(caches[0][0], cfg.keep_k), to_index_records(caches[0][1], cfg.keep_v)
            icaches = [(ki, vi)] + [(ki.clone(), vi.clone()) for _ in range(len(caches) - 1)]
            iptr = [c._replace(k_rec=x[0].data_ptr(), v_rec=x[1].data_ptr()) for c, x in zip(cptr, icaches)]
            geo = {"bitmap": ks._geometry(cfg), "index": ks._geometry(cfg)[:6] + (ri, ri)}
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
                for kind in ("bitmap", "index"):
                    p = ks._Plan(ks._ATT_PTRS)
                    rec_kb = geo[kind][6]
                    ks._kernel = index_kernel if kind == "index" else shipped_kernel
                    try:
                        p.launches = ks._attention_launches(d, hq, hkv, B, ctx, geo[kind], rec_kb, rec_kb, None, None,
                                                            ts, tactic, None, p.addr)
                    finally:
                        ks._kernel = shipped_kernel
                    p.extra["parts"] = 4 * ks._counter_words(B, hq)
                    ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
                    o = torch.full((B, hq, d), float("nan"), dtype=torch.float16, device="cuda")
                    calls[(tactic, ts, kind)] = (p, ws, o, iptr if kind == "index" else cptr)
            torch.cuda.synchronize()  # conversion, workspaces and poisoned outputs (default stream) before `stream`
            it = iter(range(1 << 30))

            def call(key):
                p, ws, o, ptrs = calls[key]
                c = ptrs[next(it) % len(ptrs)]
                p.set(q.data_ptr(), ws.data_ptr(), ws.data_ptr() + p.extra["parts"], c.lens, c.k_rec, c.v_rec,
                      c.k_ring, c.v_ring, o.data_ptr())
                _cuda.launch_all(p.launches, raw)

            for key in calls:
                call(key)
            stream.synchronize()
            for tactic, ts in plans:
                a, b_ = calls[(tactic, ts, "bitmap")][2], calls[(tactic, ts, "index")][2]
                assert not torch.isnan(a).any(), f"{model} B={B} {ctx} {s}: bitmap output has NaN"
                assert torch.equal(a.view(torch.int16), b_.view(torch.int16)), \
                    f"{model} B={B} {ctx} {s} tactic {tactic} split {ts}: index output differs from bitmap's"
            times = {key: [] for key in calls}
            n_rot = len(cptr)
            for _ in range(args.rounds):
                for key in calls:
                    times[key].append(time_graph(lambda key=key: call(key), inner=max(20, n_rot), reps=10,
                                                 stream=stream))
            med = {key: statistics.median(v) for key, v in times.items()}
            best = {kind: min((med[(t, ts, kind)], t, ts) for t, ts in plans) for kind in ("bitmap", "index")}
            row = {"model": model, "batch": B, "context": ctx, "sparsity": s, "record_bytes": cfg.rk,
                   "index_record_bytes": ri, "default_tactic": st, "default_split": ts0,
                   "bitmap_default": med[(st, ts0, "bitmap")], "index_default": med[(st, ts0, "index")],
                   "bitmap_best": best["bitmap"][0], "bitmap_best_plan": best["bitmap"][1:],
                   "index_best": best["index"][0], "index_best_plan": best["index"][1:],
                   "plans": {f"t{t}_{ts}_{kind}": med[(t, ts, kind)] for t, ts, kind in calls}}
            row["speedup_default"] = row["bitmap_default"] / row["index_default"]
            row["speedup_best"] = row["bitmap_best"] / row["index_best"]
            rows.append(row)
            print({k_: v_ for k_, v_ in row.items() if k_ != "plans"}, flush=True)
            path = write_results(out_name, rows, meta({"rounds": args.rounds}))  # after every shape: partial runs
            caches = cptr = icaches = iptr = calls = None
            torch.cuda.empty_cache()
    print_table(rows, ["model", "batch", "context", "sparsity", "default_tactic", "bitmap_default", "index_default",
                       "speedup_default", "bitmap_best", "index_best", "speedup_best"])
    for s in (0.7, 0.5):
        sp = [r["speedup_default"] for r in rows if r["sparsity"] == s]
        sb = [r["speedup_best"] for r in rows if r["sparsity"] == s]
        if sp:
            print(f"sparsity {s}: default plan median {statistics.median(sp):.3f} ({min(sp):.3f}-{max(sp):.3f}); "
                  f"best plan median {statistics.median(sb):.3f} ({min(sb):.3f}-{max(sb):.3f})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
