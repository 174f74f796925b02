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


def attention_steps(cache, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None = None) -> np.ndarray:
    """``S`` decode steps per sequence, as the kernels run them (the ``EdgeSparseKVAttention`` node): for each new
    token i, append it to ``cache`` (updated in place) and attend query i over the cache that now holds it.

    Args:
        cache: :class:`~edgesdk.formats.sparse_kv.SparseKVCache` holding the tokens before these.
        q (np.ndarray): ``[B, Hq, S, d]``, used rounded to fp16 (the kernel's dtype).
        k, v (np.ndarray): ``[B, Hkv, S, d]``, cached in fp16.

    Returns:
        np.ndarray: ``[B, Hq, S, d]`` float64.
    """
    from edgesdk.formats.sparse_kv import prune

    c = cache.config
    q16 = np.asarray(q, np.float16)
    k16 = np.asarray(k, np.float16)
    v16 = np.asarray(v, np.float16)
    B, _, S, d = q16.shape
    out = np.zeros(q16.shape, np.float64)
    # The pruned dense K/V kept current step by step (decompress(compress(x)) == prune(x), checked by the
    # format's tests), instead of decompressing every record at every step.
    dk, dv = cache.dense()
    T = int(cache.lens.max(initial=0)) + S
    kk = np.zeros((B, c.num_kv_heads, T, d), np.float16)
    vv = np.zeros_like(kk)
    kk[:, :, :dk.shape[2]], vv[:, :, :dv.shape[2]] = dk, dv
    for i in range(S):
        before = cache.lens.copy()
        cache.append(k16[:, :, i], v16[:, :, i])
        for b, (L0, L) in enumerate(zip(before.tolist(), cache.lens.tolist())):
            kk[b, :, L0], vv[b, :, L0] = k16[b, :, i], v16[b, :, i]
            n0, n1 = c.n_compressed(L0), c.n_compressed(L)
            if n1 > n0:  # a group left the window: it is read pruned from now on
                kk[b, :, n0:n1] = prune(kk[b, :, n0:n1], c.keep_k)
                vv[b, :, n0:n1] = prune(vv[b, :, n0:n1], c.keep_v)
        out[:, :, i] = decode_attention(q16[:, :, i], kk, vv, cache.lens, scale)
    return out
