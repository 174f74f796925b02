"""A dense fp16 flash-decoding attention in Triton: the "Triton flash-decoding kernel" baseline of issue 7.

One query per sequence, grouped-query attention, a dense cache ``K, V [B, Hkv, T, d]`` (the layout
``bench_sparse_kv.py`` gives SDPA), lengths ``lens [B]`` that may differ per sequence. Two launches, as
flash-decoding: ``_split`` — grid (B·Hkv, splits): each program walks its token range in blocks of
``BLOCK_N`` tokens for all ``G`` query heads of its KV head at once (the heads are the M side of ``tl.dot``,
padded to 16), online softmax in fp32 (base 2), P rounded to fp16 for the P·V product, and writes its partial
(m, l, O) in fp32; ``_combine`` — grid (B·Hq,): merges the splits and writes fp16. Or one launch
(``fused=True``, ``_split_fused``): the last program of each (sequence, KV head) to finish merges. It is not part of
the SDK (Triton is not a runtime dependency); the benchmark times it beside SDPA and our kernels and keeps the
fastest configuration per shape (:data:`CONFIGS` × split counts × merge kind), as an autotuner would.

``TRITON_INTERPRET=1`` runs it on the CPU (``tests/test_triton_decode.py`` checks it there against float64).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

# (BLOCK_N, num_warps, num_stages): the configurations the benchmark tries per shape.
CONFIGS = [(32, 4, 3), (64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3)]
NEG = tl.constexpr(-1.0e30)  # a finite "minus infinity": an empty split leaves m = NEG, l = 0 and merges as nothing


@triton.jit
def _split(Q, K, V, Lens, Wm, Wl, Wo, scale_log2, TS, NS, T,
           HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, GP: tl.constexpr,
           BLOCK_N: tl.constexpr):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    b = bh // HKV
    h = bh % HKV
    L = tl.load(Lens + b)
    start = split * TS
    end = tl.minimum(start + TS, L)
    offs_g = tl.arange(0, GP)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + ((b * HKV + h) * G + offs_g)[:, None] * D + offs_d[None, :], mask=offs_g[:, None] < G, other=0.0)
    m_i = tl.full([GP], NEG, tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, D], tl.float32)
    kbase = K + bh.to(tl.int64) * T * D
    vbase = V + bh.to(tl.int64) * T * D
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        ok = offs_n < end
        k = tl.load(kbase + offs_n[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale_log2
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None]).to(tl.float16)
        l_i = l_i * alpha + tl.sum(p.to(tl.float32), 1)
        v = tl.load(vbase + offs_n[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m_i = m_new
    row = (bh * G + offs_g) * NS + split  # partial of (query head bh·G + g, split)
    gm = offs_g < G
    tl.store(Wm + row, m_i, mask=gm)
    tl.store(Wl + row, l_i, mask=gm)
    tl.store(Wo + row[:, None] * D + offs_d[None, :], acc, mask=gm[:, None])


@triton.jit
def _split_fused(Q, K, V, Lens, Wm, Wl, Wo, Cnt, Out, scale_log2, TS, NS, T,
                 HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, GP: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_S: tl.constexpr, SB: tl.constexpr):
    """``_split``, and the last program of each (sequence, KV head) to finish merges all its splits: one launch.
    ``Cnt`` (int32 per (sequence, KV head), zero before the first call) counts the finished splits; the merging
    program sets it back to zero, so CUDA-graph replays need no reset."""
    _split(Q, K, V, Lens, Wm, Wl, Wo, scale_log2, TS, NS, T, HKV, G, D, GP, BLOCK_N)
    bh = tl.program_id(0)
    tl.debug_barrier()  # every thread's partial stored before the release below (CUTLASS's semaphore pattern)
    old = tl.atomic_add(Cnt + bh, 1, sem="acq_rel", scope="gpu")
    if old == NS - 1:
        tl.store(Cnt + bh, 0)
        offs_g = tl.arange(0, GP)
        offs_d = tl.arange(0, D)
        gm = offs_g < G
        offs_s = tl.arange(0, BLOCK_S)
        okm = gm[:, None] & (offs_s[None, :] < NS)
        rows = (bh * G + offs_g)[:, None] * NS + offs_s[None, :]
        m = tl.load(Wm + rows, mask=okm, other=NEG, cache_modifier=".cg")
        mx = tl.max(m, 1)
        den = tl.zeros([GP], tl.float32)
        num = tl.zeros([GP, D], tl.float32)
        for s0 in range(0, NS, SB):  # the splits in chunks of SB (registers)
            offs_c = s0 + tl.arange(0, SB)
            okc = gm[:, None] & (offs_c[None, :] < NS)
            rc = (bh * G + offs_g)[:, None] * NS + offs_c[None, :]
            mc = tl.load(Wm + rc, mask=okc, other=NEG, cache_modifier=".cg")
            lc = tl.load(Wl + rc, mask=okc, other=0.0, cache_modifier=".cg")
            oc = tl.load(Wo + rc[:, :, None] * D + offs_d[None, None, :], mask=okc[:, :, None], other=0.0,
                         cache_modifier=".cg")
            w = tl.where(okc, tl.exp2(mc - mx[:, None]), 0.0)
            den += tl.sum(w * lc, 1)
            num += tl.sum(w[:, :, None] * oc, 1)
        res = tl.where(den[:, None] > 0, num / den[:, None], 0.0)
        b = bh // HKV
        h = bh % HKV
        tl.store(Out + ((b * HKV + h) * G + offs_g)[:, None] * D + offs_d[None, :], res.to(tl.float16),
                 mask=gm[:, None])


@triton.jit
def _combine(Wm, Wl, Wo, Out, Lens, TS, NS, HQ: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr):
    bq = tl.program_id(0)
    L = tl.load(Lens + bq // HQ)
    ns = tl.minimum(NS, (L + TS - 1) // TS)  # splits past the sequence's length were not written
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, D)
    ok = offs_s < ns
    m = tl.load(Wm + bq * NS + offs_s, mask=ok, other=NEG)
    l = tl.load(Wl + bq * NS + offs_s, mask=ok, other=0.0)
    o = tl.load(Wo + (bq * NS + offs_s)[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
    w = tl.where(ok, tl.exp2(m - tl.max(m, 0)), 0.0)
    den = tl.sum(w * l, 0)
    num = tl.sum(w[:, None] * o, 0)
    res = tl.where(den > 0, num / den, 0.0)  # length 0: zeros
    tl.store(Out + bq * D + offs_d, res.to(tl.float16))


class FlashDecode:
    """Launches of one configuration for one shape; ``__call__`` runs both kernels on torch's current stream.

    Args:
        hq, hkv, d: query heads, KV heads (hq % hkv == 0, hq / hkv ≤ 16), head dim (a power of two ≥ 16).
        batch, max_len: sequences and the longest length the grid must cover (the cache's T).
        splits: programs per (sequence, KV head) along the tokens.
        config: (BLOCK_N, num_warps, num_stages), one of :data:`CONFIGS` or any other.
    """

    def __init__(self, hq: int, hkv: int, d: int, batch: int, max_len: int, splits: int, config=CONFIGS[1],
                 fused: bool = False):
        import torch

        if hq % hkv or hq // hkv > 16:
            raise ValueError(f"{hq} query heads over {hkv} KV heads: the group must divide and be <= 16")
        if d < 16 or d & (d - 1):
            raise ValueError(f"head dim {d}: a power of two >= 16")
        self.hq, self.hkv, self.d, self.B, self.T = hq, hkv, d, batch, max_len
        self.g = hq // hkv
        self.block_n, self.warps, self.stages = config
        bn = self.block_n  # splits start on a block boundary: no partial block but a sequence's last
        self.ts = max(1, math.ceil(math.ceil(max_len / max(1, splits)) / bn)) * bn
        self.ns = math.ceil(max_len / self.ts)
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        self.m = torch.empty(batch * hq * self.ns, dtype=torch.float32, device=dev)
        self.l = torch.empty_like(self.m)
        self.o = torch.empty(batch * hq * self.ns * d, dtype=torch.float32, device=dev)
        self.fused = fused
        self.cnt = torch.zeros(batch * hkv, dtype=torch.int32, device=dev) if fused else None

    def __call__(self, q, k, v, lens, out, scale: float | None = None) -> None:
        """q ``[B, Hq, d]`` fp16, k/v ``[B, Hkv, T, d]`` fp16 contiguous (T = ``max_len``), lens int32 ``[B]``,
        out ``[B, Hq, d]`` fp16."""
        scale = scale if scale is not None else 1.0 / math.sqrt(self.d)
        if self.fused:
            _split_fused[(self.B * self.hkv, self.ns)](
                q, k, v, lens, self.m, self.l, self.o, self.cnt, out, scale * 1.4426950408889634, self.ts, self.ns,
                self.T, HKV=self.hkv, G=self.g, D=self.d, GP=16, BLOCK_N=self.block_n,
                BLOCK_S=max(2, triton.next_power_of_2(self.ns)), SB=8, num_warps=self.warps, num_stages=self.stages)
            return
        _split[(self.B * self.hkv, self.ns)](
            q, k, v, lens, self.m, self.l, self.o, scale * 1.4426950408889634, self.ts, self.ns, self.T,
            HKV=self.hkv, G=self.g, D=self.d, GP=16, BLOCK_N=self.block_n,
            num_warps=self.warps, num_stages=self.stages)
        _combine[(self.B * self.hq,)](
            self.m, self.l, self.o, out, lens, self.ts, self.ns, HQ=self.hq, D=self.d,
            BLOCK_S=max(2, triton.next_power_of_2(self.ns)), num_warps=4)


def split_counts(batch: int, hkv: int, max_len: int, sms: int) -> list[int]:
    """Split counts the benchmark tries: about 1, 2, 4 and 8 programs per SM over the (sequence, KV head) pairs,
    each split at least 64 tokens."""
    out = []
    for per_sm in (1, 2, 4, 8):
        ns = max(1, min(max_len // 64, round(per_sm * sms / max(1, batch * hkv))))
        if ns not in out:
            out.append(ns)
    return out
