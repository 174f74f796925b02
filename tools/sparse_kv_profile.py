#!/usr/bin/env python3
"""Launch the sparse_kv decode attention (70 %, default or ``--tactic`` and its split) a few times per shape, for ncu.

    ncu --clock-control none --metrics ... --csv python tools/sparse_kv_profile.py llama:16:32768 llama:1:4096

Each shape: one compressed cache built by the prefill kernel from random fp16 K/V (never zeros), then
``--calls`` decode-attention calls (attention + merge kernel). Prints the plan (split, splits) and the
number of (token, KV head) pairs so per-token figures can be derived from the counters."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402
from edgesdk.kernels import sparse_kv as ks  # noqa: E402
from sparse_kv_explore import MODELS, random_problem  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="+", help="model:B:ctx")
    ap.add_argument("--sparsity", type=float, default=0.7)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--tactic", type=int, default=None, help="decode-attention tactic (default: default_tactic's)")
    ap.add_argument("--source", default=None, help="another sparse_kv.cu to build the kernels from")
    a = ap.parse_args()
    if a.source:
        ks.SOURCE = str(Path(a.source).resolve())
    st = torch.cuda.Stream()
    sp = st.cuda_stream
    for shape in a.shapes:
        model, B, ctx = shape.split(":")
        B, ctx = int(B), int(ctx)
        hq, hkv, d = MODELS[model]
        k, v, q, lens, out = random_problem(model, B, ctx)
        cfg = SparseKVConfig(d, hq, hkv, a.sparsity, a.sparsity, ctx + 1)
        mk = lambda r: torch.empty((B, hkv, cfg.record_capacity, r), device="cuda", dtype=torch.uint8)  # noqa: E731
        bufs = (mk(cfg.rk), mk(cfg.rv), torch.empty((B, hkv, cfg.ring, d), device="cuda", dtype=torch.float16),
                torch.empty((B, hkv, cfg.ring, d), device="cuda", dtype=torch.float16))
        cache = ks.CachePtrs(*(x.data_ptr() for x in bufs), lens.data_ptr())
        torch.cuda.synchronize()  # k, v, lens come from torch's current stream; the prefill runs on sp
        ks.prefill(cfg, B, ctx, k.data_ptr(), v.data_ptr(), cache, sp)
        ts, ns = ks.plan_cache(cfg, B, ctx, tactic=a.tactic)
        ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
        with torch.cuda.stream(st):
            for _ in range(a.calls):
                ks.decode_attention(cfg, B, ctx, q.data_ptr(), cache, out.data_ptr(), ws.data_ptr(), sp,
                                    tactic=a.tactic)
        st.synchronize()
        ref = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]
        print(json.dumps(dict(shape=shape, tactic=a.tactic, tokens_per_split=ts, splits=ns, token_heads=B * hkv * ctx,
                              n_comp=cfg.n_compressed(ctx),
                              finite=bool(torch.isfinite(out).all().item()),
                              max_abs_vs_dense_unpruned=(out.float() - ref.float()).abs().max().item())), flush=True)


if __name__ == "__main__":
    main()
