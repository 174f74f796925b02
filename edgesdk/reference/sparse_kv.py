"""float64 ground truth for ``sparse_kv`` decode attention (one new query per sequence, GQA, ragged).

The kernel computes attention over the *pruned* cache, so the reference takes the pruned dense K/V
(:meth:`edgesdk.formats.sparse_kv.SparseKVCache.dense`) and is exact up to fp16 rounding of inputs.
"""

from __future__ import annotations

import numpy as np


def decode_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, lens, scale: float | None = None) -> np.ndarray:
    """softmax(q · kᵀ · scale) · v per sequence over its first ``lens[b]`` tokens, in float64.

    Args:
        q (np.ndarray): ``[B, Hq, d]``.
        k (np.ndarray): ``[B, Hkv, T, d]``; query head ``i`` reads KV head ``i // (Hq / Hkv)``.
        v (np.ndarray): ``[B, Hkv, T, d]``.
        lens (array-like): ``[B]`` tokens per sequence (≤ T). A sequence of length 0 gives zeros.
        scale (float | None): Score scale, default ``1 / sqrt(d)``.

    Returns:
        np.ndarray: ``[B, Hq, d]`` float64.
    """
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    B, Hq, d = q.shape
    g = Hq // k.shape[1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    out = np.zeros((B, Hq, d))
    for b, L in enumerate(np.asarray(lens).tolist()):
        if L <= 0:
            continue
        kb = np.repeat(k[b, :, :L], g, axis=0)  # [Hq, L, d]
        vb = np.repeat(v[b, :, :L], g, axis=0)
        s = np.einsum("hd,htd->ht", q[b], kb) * scale
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[b] = np.einsum("ht,htd->hd", p, vb) / p.sum(axis=1, keepdims=True)
    return out


def cache_attention(cache, q: np.ndarray, scale: float | None = None) -> np.ndarray:
    """:func:`decode_attention` over a :class:`~edgesdk.formats.sparse_kv.SparseKVCache`."""
    k, v = cache.dense()
    return decode_attention(q, k, v, cache.lens, scale)
