"""What the ``EdgeSparseKVAttention`` node's step costs over the bare kernels (``edgesdk.kernels.sparse_kv.run_node``).

Per decode step (one new token, CUDA-graph replays, medians), side by side in one run:

* ``node``: ``run_node`` with S = 1, what the TensorRT plugin's ``enqueue`` launches (append, which also zeroes the
  merge counters, and attention; the lengths read from the node's input; before session 26 a third kernel set the
  lengths and zeroed the counters);
* ``kernels``: ``append`` + ``decode_attention`` alone on the same cache (the lengths already set), as
  ``bench/bench_sparse_kv.py`` times attention;
* ``sdpa``: torch's ``scaled_dot_product_attention`` on a dense fp16 cache of the same length (context only);
* ``node_s16``: one call of 16 new tokens (a prompt chunk), per token.

Each replay repeats the same step (same lengths), so the cache does not grow while timed. The caches are not
rotated beyond L2 (they are at most ~25 MB here): these figures are for the node's overhead (``node`` - ``kernels``),
not for the attention's speed, which ``bench_sparse_kv.py`` measures with rotation.

    python bench/bench_sparse_kv_node.py     # -> bench/results/sparse_kv_node.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench._common import meta, print_table, time_graph, write_results  # noqa: E402
from edgesdk.formats import sparse_kv as f  # noqa: E402
from edgesdk.kernels import _cuda  # noqa: E402
from edgesdk.kernels import sparse_kv as ks  # noqa: E402

MODELS = {"SmolLM2-135M-like": (9, 3, 64), "Llama-3.2-1B-like": (32, 8, 64)}


def bench(model, hq, hkv, d, B, ctx, sparsity, rows):
    cfg = f.SparseKVConfig(d, hq, hkv, sparsity, sparsity, capacity=ctx + 64)
    rng = np.random.default_rng(0)
    k0 = torch.from_numpy((rng.standard_normal((B, hkv, ctx, d))).astype(np.float16)).cuda()
    v0 = torch.from_numpy((rng.standard_normal((B, hkv, ctx, d))).astype(np.float16)).cuda()
    shapes = f.state_shapes(cfg, B)
    state = [torch.zeros(shapes[s], dtype=torch.int8 if f.STATE_DTYPES[s] == "int8" else torch.float16,
                         device="cuda") for s in f.STATE_NAMES]
    lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    cache = ks.CachePtrs(*(t.data_ptr() for t in state), lens.data_ptr())
    stream = torch.cuda.current_stream().cuda_stream
    ks.prefill(cfg, B, ctx, k0.data_ptr(), v0.data_ptr(), cache, stream)
    del k0, v0
    tactic, ws_bytes = ks.node_plan(cfg, B)
    ws = torch.zeros(ws_bytes, dtype=torch.uint8, device="cuda")
    q = torch.randn(B, hq, 16, d, dtype=torch.float16, device="cuda")
    kn = torch.randn(B, hkv, 16, d, dtype=torch.float16, device="cuda")
    vn = torch.randn(B, hkv, 16, d, dtype=torch.float16, device="cuda")
    out = torch.empty_like(q)
    ptrs = [t.data_ptr() for t in state]
    after1 = torch.full((B,), ctx + 1, dtype=torch.int32, device="cuda")
    after16 = torch.full((B,), ctx + 16, dtype=torch.int32, device="cuda")
    q1, k1, v1, o1 = (t[:, :, :1].contiguous() for t in (q, kn, vn, out))

    def node():
        ks.run_node(cfg, 0.125, B, 1, q1.data_ptr(), k1.data_ptr(), v1.data_ptr(), ptrs, ptrs, after1.data_ptr(),
                    o1.data_ptr(), ws.data_ptr(), torch.cuda.current_stream().cuda_stream, tactic=tactic)

    def node16():
        ks.run_node(cfg, 0.125, B, 16, q.data_ptr(), kn.data_ptr(), vn.data_ptr(), ptrs, ptrs, after16.data_ptr(),
                    out.data_ptr(), ws.data_ptr(), torch.cuda.current_stream().cuda_stream, tactic=tactic)

    lens.fill_(ctx + 1)
    ks.init_workspace(ws.data_ptr(), B, hq, stream)

    def kernels():
        s = torch.cuda.current_stream().cuda_stream
        ks.append(cfg, B, k1.data_ptr(), v1.data_ptr(), cache, s)
        ks.decode_attention(cfg, B, cfg.capacity, q1.data_ptr(), cache, o1.data_ptr(), ws.data_ptr(), s,
                            scale=0.125, tactic=tactic)

    kd = torch.randn(B, hkv, ctx + 1, d, dtype=torch.float16, device="cuda")
    vd = torch.randn_like(kd)
    g = hq // hkv
    qs = torch.randn(B, hq, 1, d, dtype=torch.float16, device="cuda")

    def sdpa():
        torch.nn.functional.scaled_dot_product_attention(qs, kd, vd, enable_gqa=g > 1)

    r = {"model": model, "batch": B, "context": ctx, "sparsity": sparsity, "tactic": tactic}
    r["kernels_us"] = time_graph(kernels)
    r["node_us"] = time_graph(node)
    r["node_s16_us_per_token"] = time_graph(node16, inner=5) / 16
    r["sdpa_us"] = time_graph(sdpa)
    r["node_overhead_us"] = r["node_us"] - r["kernels_us"]
    r["node_vs_kernels"] = r["node_us"] / r["kernels_us"]
    rows.append(r)


def main():
    torch.cuda.init()
    _cuda.init()
    rows: list[dict] = []
    t0 = time.time()
    for model, (hq, hkv, d) in MODELS.items():
        for B in (1, 4):
            for ctx in (4096, 16384):
                bench(model, hq, hkv, d, B, ctx, 0.7, rows)
                torch.cuda.empty_cache()
    info = meta({"note": "us per decode step; node = run_node (S=1), kernels = append + decode_attention, "
                         "node_s16 = one call of 16 tokens / 16; caches not rotated (overhead only)",
                 "seconds": round(time.time() - t0, 1)})
    path = write_results("sparse_kv_node", rows, info)
    print_table(rows, ["model", "batch", "context", "tactic", "kernels_us", "node_us", "node_overhead_us",
                       "node_vs_kernels", "node_s16_us_per_token", "sdpa_us"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
