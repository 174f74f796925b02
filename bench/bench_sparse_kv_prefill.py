"""A prompt into the sparse KV cache, per attention layer: through the node (decode steps) vs a dense prefill.

Side by side in one run, batch 1, per prompt of P tokens from an empty cache (CUDA-graph replays, medians):

* ``node``: one ``run_node`` call of P new tokens (what the TensorRT plugin does with a prompt: P decode steps,
  each appending and attending over the sparse cache so far);
* ``dense``: what a dense prefill engine plus the hand-over costs for the same layer: causal
  ``scaled_dot_product_attention`` over the P tokens (fp16, GQA) and ``kernels.sparse_kv.prefill`` compressing their
  K and V into the state (``compress``: that kernel alone).

Only the attention and the cache are timed (the layer's linears cost the same in both; a dense prefill engine runs
them on P rows at once, the node path as P calls of one row in a real decode loop, which favours the dense prefill
further). ``Decoder(prefill=...)`` is the host-side form of the dense path (``edgesdk/generate.py``).

    python bench/bench_sparse_kv_prefill.py     # -> bench/results/sparse_kv_prefill.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench._common import meta, print_table, time_graph, write_results  # noqa: E402
from edgesdk.formats import sparse_kv as f  # noqa: E402
from edgesdk.kernels import _cuda  # noqa: E402
from edgesdk.kernels import sparse_kv as ks  # noqa: E402

MODELS = {"SmolLM2-135M-like": (9, 3, 64), "Llama-3.2-1B-like": (32, 8, 64)}


def bench(model, hq, hkv, d, prompt, sparsity, rows):
    cfg = f.SparseKVConfig(d, hq, hkv, sparsity, sparsity, capacity=prompt + 64)
    shapes = f.state_shapes(cfg, 1)
    state = [torch.zeros(shapes[s], dtype=torch.int8 if f.STATE_DTYPES[s] == "int8" else torch.float16,
                         device="cuda") for s in f.STATE_NAMES]
    lens = torch.full((1,), prompt, dtype=torch.int32, device="cuda")
    cache = ks.CachePtrs(*(t.data_ptr() for t in state), lens.data_ptr())
    ptrs = [t.data_ptr() for t in state]
    q = torch.randn(1, hq, prompt, d, dtype=torch.float16, device="cuda")
    k = torch.randn(1, hkv, prompt, d, dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    tactic, ws_bytes = ks.node_plan(cfg, 1)
    ws = torch.zeros(ws_bytes, dtype=torch.uint8, device="cuda")
    after = torch.full((1,), prompt, dtype=torch.int32, device="cuda")

    def node():
        ks.run_node(cfg, 0.125, 1, prompt, q.data_ptr(), k.data_ptr(), v.data_ptr(), ptrs, ptrs, after.data_ptr(),
                    out.data_ptr(), ws.data_ptr(), torch.cuda.current_stream().cuda_stream, tactic=tactic)

    def compress():
        ks.prefill(cfg, 1, prompt, k.data_ptr(), v.data_ptr(), cache, torch.cuda.current_stream().cuda_stream)

    def dense():
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq > hkv)
        compress()

    r = {"model": model, "prompt": prompt, "sparsity": sparsity, "tactic": tactic}
    r["node_us"] = time_graph(node, inner=1, reps=5, warmup=1)
    r["dense_prefill_us"] = time_graph(dense, inner=5)
    r["compress_us"] = time_graph(compress, inner=5)
    r["node_us_per_token"] = r["node_us"] / prompt
    r["node_vs_dense"] = r["node_us"] / r["dense_prefill_us"]
    rows.append(r)


def main():
    torch.cuda.init()
    _cuda.init()
    rows: list[dict] = []
    t0 = time.time()
    for model, (hq, hkv, d) in MODELS.items():
        for prompt in (128, 512, 2048):
            bench(model, hq, hkv, d, prompt, 0.7, rows)
            torch.cuda.empty_cache()
    info = meta({"note": "us per attention layer for a prompt of P tokens from an empty cache, batch 1: node = one "
                         "run_node call of P tokens; dense_prefill = causal SDPA over P + kernels.sparse_kv.prefill",
                 "seconds": round(time.time() - t0, 1)})
    path = write_results("sparse_kv_prefill", rows, info)
    print_table(rows, ["model", "prompt", "tactic", "node_us", "node_us_per_token", "dense_prefill_us",
                       "compress_us", "node_vs_dense"])
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
