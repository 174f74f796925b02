#!/usr/bin/env python3
"""A STREAM_K default rule (session 30, measured, not adopted) checked on shapes it was not fit on.

The candidate: where ``default_tactic`` gives tactic 4, give tactic 5 (stream-K) instead when :func:`stream_k_wins`
prices it lower (a model of waves and segments fit on issue 7's benchmark). Per shape (:data:`SHAPES`: other head
layouts, batches and lengths, all shapes where the candidate changes the choice) this times both, each at its heuristic split, on the same caches: CUDA-graph
replays over caches rotated beyond L2, the two taking turns over ``--rounds`` rounds, medians; the outputs are compared
(different splits: equal within fp16 rounding, not bit for bit). Speed-up = tactic 4's time ÷ tactic 5's.

Usage: python tools/sparse_kv_streamk_rule.py [--rounds N] [--out NAME]
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
# The model's fixed cost of a wave of blocks and of a block's second segment, in tiles per warp: ≈ 8 and ≈ 5 µs at the
# ≈ 1.4 µs per tile per warp of session 30's block timelines.
SK_WAVE_COST = 5.7
SK_SEGMENT_COST = 3.6


def stream_k_wins(pairs: int, sms: int, max_len: int, tokens_per_split: int, splits: int) -> bool:
    """The candidate's model: tactic 4 (plan ``tokens_per_split``, ``splits``) costs its waves times (a wave's fixed
    cost + the tiles each warp walks); tactic 5 one wave's and one segment's fixed cost + an equal share of all tiles
    per warp."""
    waves = math.ceil(pairs * splits / sms)
    t4 = waves * (SK_WAVE_COST + tokens_per_split / (16 * 16))
    total = pairs * math.ceil(max(1, max_len) / 16)
    t5 = SK_WAVE_COST + SK_SEGMENT_COST + total / (min(sms, total) * 16)
    return t5 < t4


# (model, batch, tokens, sparsity): none of issue 7's 18 shapes
SHAPES = [("llama3.2-1b", 6, 8192, 0.7), ("llama3.2-1b", 12, 4096, 0.7), ("llama3.2-1b", 24, 16384, 0.7),
          ("llama3.2-1b", 8, 32768, 0.5), ("smollm2-135m", 12, 20000, 0.7), ("smollm2-135m", 16, 8192, 0.7),
          ("qwen2.5-0.5b", 24, 12000, 0.7), ("tinyllama", 12, 8192, 0.7), ("tinyllama", 24, 4096, 0.7),
          ("mha-12", 3, 16384, 0.7), ("mha-12", 8, 4096, 0.7), ("mha-12", 16, 24576, 0.7),
          ("gqa2-16", 6, 12000, 0.7), ("gqa2-16", 16, 16384, 0.5)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from bench._common import meta, print_table, time_graph, write_results
    from bench.bench_sparse_kv import dense_inputs, sparse_caches
    from edgesdk.kernels import sparse_kv as ks

    stream = torch.cuda.Stream()
    raw = stream.cuda_stream
    rows = []
    out_name = args.out or f"sparse_kv_streamk_rule_{meta()['commit']}"
    for model, B, ctx, s in SHAPES:
        hq, hkv = MODELS[model]
        d = 64
        k, v, q, lens = dense_inputs(hq, hkv, d, B, ctx)
        cfg = SparseKVConfig(d, hq, hkv, s, s, ctx + 1)
        caches, cptr = sparse_caches(cfg, B, ctx, k, v, lens)
        default = ks.default_tactic(d, hq, hkv, B, ctx, rk=cfg.rk, rv=cfg.rv)
        wide16 = ks.plan_cache(cfg, B, ctx, tactic=ks.WIDE16_FUSED)
        assert default == ks.WIDE16_FUSED and stream_k_wins(B * hkv, ks.sm_count(), ctx, *wide16), \
            f"{model} B={B} {ctx}: the candidate does not change the default there"
        calls = {}
        for tactic in (ks.WIDE16_FUSED, ks.STREAM_K):
            _, ns = ks.plan_cache(cfg, B, ctx, tactic=tactic)
            ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
            o = torch.full((B, hq, d), float("nan"), dtype=torch.float16, device="cuda")
            calls[tactic] = (ws, o)
        torch.cuda.synchronize()  # caches, workspaces and poisoned outputs (default stream) before `stream`
        it = iter(range(1 << 30))

        def call(tactic):
            ws, o = calls[tactic]
            c = cptr[next(it) % len(cptr)]
            ks.decode_attention(cfg, B, ctx, q.data_ptr(), c, o.data_ptr(), ws.data_ptr(), raw, tactic=tactic)

        for tactic in calls:
            call(tactic)
        stream.synchronize()
        a, b = calls[ks.WIDE16_FUSED][1].float(), calls[ks.STREAM_K][1].float()
        assert not torch.isnan(a).any() and not torch.isnan(b).any(), f"{model} B={B} {ctx}: NaN left"
        diff = (a - b).abs().max().item()
        assert diff < 2e-2, f"{model} B={B} {ctx}: tactics 4 and 5 differ by {diff}"
        times = {t: [] for t in calls}
        for _ in range(args.rounds):
            for t in calls:
                times[t].append(time_graph(lambda t=t: call(t), inner=max(20, len(cptr)), reps=10, stream=stream))
        t4, t5 = (statistics.median(times[t]) for t in (ks.WIDE16_FUSED, ks.STREAM_K))
        row = {"model": model, "batch": B, "context": ctx, "sparsity": s, "t4_us": t4, "t5_us": t5,
               "speedup": t4 / t5, "max_abs_diff": diff}
        rows.append(row)
        print(row, flush=True)
        path = write_results(out_name, rows, meta({"rounds": args.rounds}))
        del caches
        cptr = calls = None
        torch.cuda.empty_cache()
    print_table(rows, ["model", "batch", "context", "sparsity", "t4_us", "t5_us", "speedup"])
    v = [r["speedup"] for r in rows]
    print(f"tactic 5 (the candidate) vs tactic 4 (the default): median {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f}), "
          f"{len(v)} shapes")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
