"""Launchers for the bitmap-sparse KV cache (``plugins/sparse_kv/sparse_kv.cu``): raw pointers + stream.

API for the LLM runtime and the ``EdgeSparseKVAttention`` node's plugin. Every call launches on the caller's stream, allocates
nothing, never synchronises and compiles only on the first use of a (kernel, context), so a decode
step can be captured in a CUDA graph. Cache arrays (:class:`CachePtrs`) are laid out exactly as
:class:`edgesdk.formats.sparse_kv.SparseKVCache` describes; the caller owns them and ``lens``
(``int32 [B]`` on the device, tokens per sequence *including* the token being appended).

- :func:`prefill` — prompts ``[B, Hkv, S, d]`` fp16 → records for ``[0, n_comp)`` + dense ring.
- :func:`append` — one new K/V token per sequence (``[B, Hkv, d]``); compresses the window's oldest
  ``group`` tokens when it reaches ``window + group``. Update ``lens`` (+1) *before* calling.
- :func:`decode_attention` — one query per sequence ``[B, Hq, d]`` fp16 → ``out [B, Hq, d]`` fp16,
  split over tokens (flash-decoding) into a caller-preallocated workspace
  (:func:`workspace_bytes`), then merged. Tactics: :data:`STREAM` (warp-streaming flash
  attention with K and V decompressed into tensor-core tiles, then the merge kernel), :data:`STREAM_FUSED`
  (the same, merge in the last block; zero the workspace counters once with :func:`init_workspace`),
  :data:`WIDE_FUSED` / :data:`WIDE16_FUSED` (:data:`STREAM_FUSED` with 8 / 16 warps per block and about one
  block per SM, d = 64: few tiles per SM),
  :data:`SPLIT_V1` (the first kernel); default (``tactic=None``): :func:`default_tactic`. Measured per shape in ``docs/sparse_kv.md``.
- :func:`dense_decode_attention` — the same kernels on a plain dense fp16 cache (the dense baseline,
  tactic :data:`SPLIT_V1` by default).
- :func:`run_node` — one call of the graph node (S new tokens = S steps of ``append`` + ``decode_attention``, the
  lengths kept on the device), with :func:`node_plan` for its workspace.
"""

from __future__ import annotations

import ctypes
import math
import struct
import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.formats import sparse_kv as _fmt
from edgesdk.formats.sparse_kv import STATE_DTYPES, SparseKVConfig, schedules, state_shapes
from edgesdk.kernels import _cuda

SOURCE = "sparse_kv/sparse_kv.cu"
THREADS = 256  # attention block of tactic 0 (SPLIT_V1)
WARPS = THREADS // 32
THREADS2 = 128  # attention block of tactics 1 and 2 (warp-streaming)
WARPS2 = THREADS2 // 32
STAGES2 = 3  # cp.async stages per warp (tactics 1, 2)
TILE2 = 16  # tokens per warp tile (tactics 1, 2)

#: Attention tactics. SPLIT_V1: one thread per token for K (sparse dot product), V tiles decompressed
#: per warp, block-wide softmax, then the merge kernel. STREAM: warp-streaming flash attention (K and V
#: decompressed into tensor-core tiles, online softmax per warp), then the merge kernel. STREAM_FUSED:
#: STREAM with the merge done by the last block of each (sequence, KV head): one launch. WIDE_FUSED,
#: WIDE16_FUSED (d = 64): STREAM_FUSED with 8 or 16 warps per block and about one block per SM (:func:`plan`).
#: STREAM_K (d = 64): WIDE16_FUSED's kernels over equal shares of all (sequence, KV head) pairs' tiles, one block per
#: SM, a block's share running across pair boundaries (stream-K: one wave whatever the pair count; :func:`plan`).
SPLIT_V1, STREAM, STREAM_FUSED, WIDE_FUSED, WIDE16_FUSED, STREAM_K = 0, 1, 2, 3, 4, 5
TACTICS = (SPLIT_V1, STREAM, STREAM_FUSED, WIDE_FUSED, WIDE16_FUSED, STREAM_K)
WIDE_WARPS = {WIDE_FUSED: 8, WIDE16_FUSED: 16}  # warps per block of the wide tactics
FUSED_TACTICS = (STREAM_FUSED, WIDE_FUSED, WIDE16_FUSED, STREAM_K)
ORIN_SMEM_OPTIN = 163 * 1024  # shared memory per block on sm_87 (the limit assumed where no device is asked)
COMP_THREADS = 512  # prefill / append block: one warp per token of a 16-token tile
COMP_WARPS = COMP_THREADS // 32
#: The compressor gives d = 64 records of keep 17-19 (K and V) their store order (session 33; format:
#: ``schedule_records``). False: plain records (x = 0), for A/B measurements; the attention kernels read both.
SCHEDULE_RECORDS = True
_LOG2E = 1.4426950408889634
_DENSE_WINDOW = 1 << 30  # window so large that nothing is ever compressed


class CachePtrs(NamedTuple):
    """Device pointers of one layer's cache (see :class:`~edgesdk.formats.sparse_kv.SparseKVCache`)."""

    k_rec: int
    v_rec: int
    k_ring: int
    v_ring: int
    lens: int


def gqa_pad(g: int) -> int:
    """Query heads per KV head rounded up to a kernel instantiation (1, 2, 4 or 8)."""
    for gp in (1, 2, 4, 8):
        if g <= gp:
            return gp
    raise EdgeSDKError(f"GQA group {g} > 8 is not supported by sparse_kv", "use ≤ 8 query heads per KV head")


#: Shared memory one attention block may use: ≥ 2 blocks per SM on Orin (164 KB), 3 on H100/H200.
SMEM_BUDGET = 64 * 1024
MAX_TOKENS_PER_SPLIT = 1024


def smem_bytes(head_dim: int, g: int, tokens_per_split: int, rk: int, rv: int) -> int:
    """Dynamic shared memory of the attention kernel (mirrors ``AttnSmem`` in the .cu)."""
    gp = gqa_pad(g)
    o = 2 * head_dim * gp + 4 * gp * (tokens_per_split + 8) + 4 * WARPS * gp + 4 * 2 * gp + 4 * WARPS * gp * head_dim
    o = -(-o // 16) * 16
    o += -(-tokens_per_split * rk // 16) * 16 + -(-tokens_per_split * rv // 16) * 16
    return o + WARPS * 16 * (head_dim + 8) * 2


def max_tokens_per_split(head_dim: int, g: int, rk: int, rv: int) -> int:
    """Largest split (multiple of 64, ≤ 1024) whose shared memory fits :data:`SMEM_BUDGET` (at least 64)."""
    ts = MAX_TOKENS_PER_SPLIT
    while ts > 64 and smem_bytes(head_dim, g, ts, rk, rv) > SMEM_BUDGET:
        ts -= 64
    return ts


def smem_optin() -> int:
    """Largest dynamic shared memory per block of the current device (opt-in; asked once per context)."""
    return _cuda.context_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")


def sm_count() -> int:
    """SMs of the current context: a green context's share, else the device's (asked once per context)."""
    return _cuda.context_sm_count()


def smem_bytes2(head_dim: int, rk: int, rv: int, warps: int = WARPS2) -> int:
    """Dynamic shared memory of the warp-streaming kernel (tactics 1, 2) with ``warps`` warps per block: per
    warp two ``[16][d + 8]`` fp16 tiles and :data:`STAGES2` record stages (mirrors ``attn2_split`` in the .cu)."""
    r16 = lambda x: -(-x // 16) * 16  # noqa: E731
    return warps * (2 * TILE2 * (head_dim + 8) * 2 + STAGES2 * (r16(TILE2 * rk) + r16(TILE2 * rv)))


def smem_bytes_dense2(head_dim: int, warps: int = WARPS2) -> int:
    """Dynamic shared memory of the dense streaming kernel (:func:`dense_decode_attention`, tactics 1-5): per warp
    :data:`STAGES2` slots of two ``[16][d + 8]`` fp16 tiles (mirrors ``attn2_split<..., DENSE>`` in the .cu)."""
    return warps * STAGES2 * 2 * TILE2 * (head_dim + 8) * 2


def _warps(head_dim: int, tactic: int, warps: int | None) -> int:
    """Warps per block of a streaming tactic (checked)."""
    if tactic in WIDE_WARPS or tactic == STREAM_K:
        w = WIDE_WARPS.get(tactic, 16)
        if head_dim != 64 or warps not in (None, w):
            raise EdgeSDKError(f"sparse_kv tactic {tactic} (WIDE_FUSED / WIDE16_FUSED / STREAM_K) at d = {head_dim} "
                               f"with warps={warps}", f"it exists for d = 64 with {w} warps; use tactic 2 elsewhere")
        return w
    if warps in (None, WARPS2):
        return WARPS2
    if warps not in (8, 16) or head_dim != 64 or tactic == SPLIT_V1:
        raise EdgeSDKError(f"sparse_kv attention with {warps} warps per block (d = {head_dim}, tactic {tactic})",
                           "8 or 16 warps exist for d = 64 and tactics 1, 2 only; else leave warps at 4")
    return warps


#: Largest split of the warp-streaming kernel (its shared memory does not depend on the split).
MAX_TOKENS_PER_SPLIT2 = 8192
#: Blocks of 16 warps (tactic 4, or tactics 1-2 with ``warps=16``) decode d = 64 records of exactly this many bytes
#: (keep 17-20 of 64 channels: sparsity 0.69-0.73, the 70 % setting) from registers when both record arrays are 16-byte
#: aligned (``sparse_kv_attn2r_*_w16``: each lane loads its own K or V record two tiles ahead, no shared-memory staging;
#: session 28, ``docs/sparse_kv.md``). Smaller blocks and other record sizes keep the staged kernels: records in
#: registers take 123 registers, so 4- or 8-warp blocks would fit 16 warps per SM instead of 24 (slower, measured).
REG_RECORD_BYTES = 48
#: False: the staged kernels everywhere (for measurements); set it before a call shape's first call.
REGISTER_RECORDS = True
#: Register-record blocks whose warps walk at least this many 16-token tiles (tokens per split / 256) take the pipelined
#: kernels (``sparse_kv_attn2p_*_w16``: two tile pairs per warp, the decode of tile i + 1 spliced into the multiply of
#: tile i; same bits). Measured against the unpipelined ones per tiles per warp (session 29, ``docs/sparse_kv.md``):
#: medians 0.96-1.00x at 1-4 tiles, 1.00-1.02x at 5-6, 1.03-1.05x at 7-10, 1.07-1.12x from 12 on.
PIPE_MIN_TILES_PER_WARP = 6
#: False: never the pipelined kernels (for measurements); set it before a call shape's first call.
PIPELINED_RECORDS = True
#: Tactic 4 with register records (48-byte records, 16 warps, d = 64) on a GPU of at least :data:`WIDE_MIN_SMS` SMs
#: splits by the wave model of :func:`_wave_split` instead of one wave capped at :data:`MAX_TOKENS_PER_SPLIT2`, up to
#: this many tokens per split (session 31, ``docs/sparse_kv.md``).
MAX_TOKENS_PER_SPLIT_WAVE = 1 << 20
#: :func:`_wave_split`'s fixed cost of a wave of blocks, in 16-token tiles per warp (launch, the first records' latency,
#: the block merge and the hand-over: ≈ 8 µs at ≈ 1.4 µs per tile, session 30's timelines). Fit on issue 7's shapes
#: (every value in 4-5.5 picks the fastest measured plan on all of them), checked on 14 others (session 31).
WAVE_COST_TILES = 5.0


def plan(head_dim: int, num_q_heads: int, num_kv_heads: int, rk: int, rv: int, batch: int, max_len: int,
         sms: int | None = None, tokens_per_split: int | None = None, tactic: int | None = None,
         warps: int | None = None) -> tuple[int, int]:
    """(tokens per split, number of splits) for ``max_len`` tokens. ``rk``/``rv``: record bytes (0 for a
    dense cache). ``tactic=None``: the one :func:`default_tactic` picks. ``warps``: warps per block of
    tactics 1, 2 (4, or 8 / 16 at d = 64: measurement; the wide tactics have theirs).

    Tactic 0: about 4 blocks per SM in total, at least 128 tokens per split, at most
    :func:`max_tokens_per_split`. Tactics 1, 2: each warp of a split walks ``k`` 16-token tiles one after
    the other (``tokens_per_split = 64 k``), so ``k`` trades the serial latency of one warp (about
    1.5 µs per tile on a lightly loaded H100) against the number of blocks and partials to merge.
    ``k = round(sqrt(t) / 1.6)`` with ``t`` = 16-token tiles per SM (``B · Hkv · ⌈max_len / 16⌉ / sms``),
    at least 1, at most :data:`MAX_TOKENS_PER_SPLIT2` / 64: the fit of the split sweep in
    ``bench/results/sparse_kv_sweep_73df276.json`` (best measured ``k``: 2 at t = 6 and 16, 4 at 47,
    8 at 124 and 186, 6–12 at 248, 21–42 at 1986).

    :data:`WIDE_FUSED` / :data:`WIDE16_FUSED` (W = 8 / 16 warps): the fewest tiles per warp ``k``
    (``tokens_per_split = 16 W k``) whose grid ``B · Hkv · ⌈max_len / 16 W k⌉`` fits one block per SM: few
    splits to merge, all of them in flight
    (``bench/results/sparse_kv_warps*.json``, ``docs/sparse_kv.md``, session 25); at most
    :data:`MAX_TOKENS_PER_SPLIT2`. Except :data:`WIDE16_FUSED` with 48-byte records (the register-record kernels) on
    ≥ :data:`WIDE_MIN_SMS` SMs: :func:`_wave_split`'s plan, up to :data:`MAX_TOKENS_PER_SPLIT_WAVE` tokens per split
    (session 31)."""
    if tactic is None:
        tactic = default_tactic(head_dim, num_q_heads, num_kv_heads, batch, max_len, sms, tokens_per_split, rk=rk, rv=rv)
    if tactic not in TACTICS:
        raise EdgeSDKError(f"sparse_kv tactic {tactic!r} is unknown", f"use one of {TACTICS}")
    warps = _warps(head_dim, tactic, warps)
    if tactic == STREAM_K:
        return _plan_stream_k(batch * num_kv_heads, max_len, sms, tokens_per_split)
    g = num_q_heads // num_kv_heads
    cap = max_tokens_per_split(head_dim, g, rk, rv) if tactic == SPLIT_V1 else MAX_TOKENS_PER_SPLIT2
    wave = tactic == WIDE16_FUSED and head_dim == 64 and rk == rv == REG_RECORD_BYTES  # the register records' plans
    if wave:
        cap = MAX_TOKENS_PER_SPLIT_WAVE
    if tokens_per_split is None:
        sms = sms or sm_count()
        if wave and sms >= WIDE_MIN_SMS:
            tokens_per_split = _wave_split(batch * num_kv_heads, sms, max_len)
        elif tactic == SPLIT_V1:
            want = math.ceil(max(1, max_len) * batch * num_kv_heads / (4 * sms))
            tokens_per_split = min(cap, max(128, -(-want // 64) * 64))
        elif tactic in WIDE_WARPS:
            tokens_per_split = _one_wave_split(batch * num_kv_heads, sms, max_len, TILE2 * warps)
        else:
            tiles_per_sm = batch * num_kv_heads * math.ceil(max(1, max_len) / TILE2) / sms
            k = max(1, round(math.sqrt(tiles_per_sm) / 1.6))
            tokens_per_split = min(cap // (TILE2 * warps) * TILE2 * warps, TILE2 * warps * k)
    unit = 64 if tactic == SPLIT_V1 else TILE2 * warps
    if tokens_per_split % unit or not unit <= tokens_per_split <= cap:
        raise EdgeSDKError(f"tokens_per_split={tokens_per_split} must be a multiple of {unit} in [{unit}, {cap}]",
                           "leave it None for the heuristic")
    return tokens_per_split, max(1, math.ceil(max(1, max_len) / tokens_per_split))


def _one_wave_split(pairs: int, sms: int, max_len: int, unit: int) -> int:
    """Tokens per split of the wide tactics (``unit`` = 16 tokens per warp): the fewest whose grid fits one block per
    SM, at most :data:`MAX_TOKENS_PER_SPLIT2`."""
    per_seq = max(1, sms // max(1, pairs))  # splits per (sequence, KV head) in one wave
    return min(MAX_TOKENS_PER_SPLIT2 // unit * unit, unit * max(1, math.ceil(max(1, max_len) / (unit * per_seq))))


def _wave_split(pairs: int, sms: int, max_len: int, warps: int = 16) -> int:
    """Tokens per split of tactic 4 with register records: for each wave count w, the most splits per (sequence, KV
    head) pair whose blocks fit w waves of one block per SM; of those plans the one that :data:`WAVE_COST_TILES` prices
    lowest, ``waves · (WAVE_COST_TILES + tiles per warp)`` (ties: fewer waves). One split per pair when the pairs
    alone fill the waves; splits beyond :data:`MAX_TOKENS_PER_SPLIT2` where fewer waves pay (session 31: Llama-like
    B = 8, 24000 tokens: 98.0 µs with 8192-token splits in 2 waves, 71.5 µs with 12032 in one, H100)."""
    unit = TILE2 * warps
    units = -(-max(1, max_len) // unit)
    best = None
    for w in range(1, -(-pairs // sms) + 6):
        s = min(units, max(1, w * sms // pairs))
        ts = unit * -(-units // s)
        waves = -(-pairs * -(-max(1, max_len) // ts) // sms)
        cost = waves * (WAVE_COST_TILES + ts // TILE2 // warps)
        if best is None or cost < best[0]:
            best = (cost, ts)
        if s == units:
            break
    return best[1]


def stream_k_blocks(pairs: int, max_len: int, tokens_per_split: int) -> tuple[int, int, int]:
    """Stream-K geometry: ``(tiles per pair, blocks, most segments of one pair)`` when ``pairs`` pairs of
    ``⌈max_len / 16⌉`` tiles are cut into equal shares of about ``tokens_per_split / 16`` tiles, block i taking tiles
    ``[i T / nb, (i + 1) T / nb)`` of all T in a row (``attn2_entry`` in the .cu computes the same)."""
    tpp = -(-max(1, max_len) // TILE2)
    total = pairs * tpp
    nb = max(1, min(total, -(-total * TILE2 // tokens_per_split)))
    most = 0
    for p in range(pairs):
        first = ((p * tpp + 1) * nb - 1) // total
        last = (((p + 1) * tpp) * nb - 1) // total
        most = max(most, last - first + 1)
    return tpp, nb, most


def _plan_stream_k(pairs: int, max_len: int, sms: int | None, tokens_per_split: int | None) -> tuple[int, int]:
    """:func:`plan` of :data:`STREAM_K`: ``(tokens per block, most segments of a pair)``; by default one block per SM
    (``tokens_per_split`` = 16 · ⌈T / SMs⌉ for T tiles in all; a multiple of 16 when given)."""
    total = pairs * -(-max(1, max_len) // TILE2)
    if tokens_per_split is None:
        tokens_per_split = TILE2 * -(-total // min(total, sms or sm_count()))
    if tokens_per_split % TILE2 or tokens_per_split < TILE2:
        raise EdgeSDKError(f"tokens_per_split={tokens_per_split} for STREAM_K must be a positive multiple of {TILE2}",
                           "leave it None for one block per SM")
    return tokens_per_split, stream_k_blocks(pairs, max_len, tokens_per_split)[2]


#: :func:`default_tactic`: tactic 2 (fused merge) while the 16-token tiles per SM stay at most this
#: and its split count at most :data:`FUSED_MAX_SPLITS` (one merge pass), else tactic 1.
FUSED_MAX_TILES_PER_SM = 100
FUSED_MAX_SPLITS = 32


#: :func:`default_tactic` at d = 64: :data:`WIDE_FUSED` while the 16-token tiles per SM stay at most
#: WIDE_MAX_TILES_PER_SM; :data:`WIDE16_FUSED` up to WIDE16_MAX_TILES_PER_SM where its shared memory fits and
#: the tile model (:func:`_tile_cost`, MERGE_COST per split) prices it below tactic 1's split.
WIDE_MAX_TILES_PER_SM = 75
#: ... except that from this many tiles per SM on, records that 16-warp blocks decode from registers
#: (:func:`uses_register_records`) take :data:`WIDE16_FUSED` there too (session 28: 1.05-1.15x tactic 3 on the H100
#: shapes with 30-75 tiles per SM; below, 0.94-1.07x).
REG_WIDE16_MIN_TILES_PER_SM = 30
WIDE16_MAX_TILES_PER_SM = 1000
MERGE_COST = 0.5
#: ... where tactic 4's plan takes the pipelined register-record kernels (:func:`uses_pipelined_records`), the tile model
#: prices its tiles at this fraction of tactic 1's and WIDE16_MAX_TILES_PER_SM does not apply (session 29: fit on 8
#: H100 shapes above 75 tiles per SM; on 31 unseen ones it changed 13 defaults, 1.074x median, 0.987-1.332x).
REG_PIPE_TILE_COST = 0.72
#: ... and only on GPUs with at least this many SMs: the rule was fit and validated on 132-SM GPUs; on the 16-SM
#: green context (Orin's SM count) it lost up to 0.76x on short contexts (docs/sparse_kv.md, session 25).
WIDE_MIN_SMS = 100


def _tile_cost(pairs: int, sms: int, tokens_per_split: int, splits: int) -> float:
    """Model of a streaming plan's time in tiles: the blocks one SM gets (``⌈pairs · splits / sms⌉``) times the
    tiles each runs (``tokens_per_split / 16``), plus MERGE_COST per split of a (sequence, KV head) for the merge."""
    return math.ceil(pairs * splits / sms) * tokens_per_split / TILE2 + MERGE_COST * splits


def default_tactic(head_dim: int, num_q_heads: int, num_kv_heads: int, batch: int, max_len: int,
                   sms: int | None = None, tokens_per_split: int | None = None, wide: bool = True,
                   rk: int | None = None, rv: int | None = None) -> int:
    """The tactic of a call without one: :data:`STREAM_FUSED` when ``B · Hkv · ⌈max_len / 16⌉ / sms ≤ 100``
    and its plan has ≤ 32 splits (its merge tail is then one L2 round trip), else :data:`STREAM`. Fit to
    the full benchmark at commit ``ddda89f`` (``bench/results/sparse_kv.json``, H100, 48 sparse rows,
    full GPU; each tactic's time the best of its heuristic split, twice and half of it): on the 22 rows it
    gives to tactic 2, tactic 2 took 0.90–0.98× tactic 1's time, except Llama B = 4, 4k at 50 % (1.015×)
    and B = 16, 1k at 50 % (0.999×); of the 26 rows it gives to tactic 1, tactic 2 was faster on 7, by
    ≤ 1.3 % but on SmolLM2 B = 1, 16k at 70 % (0.967×). Before all that, at d = 64 with no forced split:
    :data:`WIDE_FUSED` when the tiles per SM are ≤ :data:`WIDE_MAX_TILES_PER_SM`; else, with the record sizes
    ``rk``/``rv`` given, :data:`WIDE16_FUSED` up to :data:`WIDE16_MAX_TILES_PER_SM` tiles per SM where its
    shared memory fits the device (:data:`ORIN_SMEM_OPTIN` when ``sms`` is given instead of asked) and
    :func:`_tile_cost` prices its plan below tactic 1's; both only with at least :data:`WIDE_MIN_SMS` SMs (not on
    an Orin's 16). Records that 16-warp blocks decode from registers take :data:`WIDE16_FUSED` instead of
    :data:`WIDE_FUSED` from :data:`REG_WIDE16_MIN_TILES_PER_SM` tiles per SM (session 28); where tactic 4's plan takes
    the pipelined kernels, :func:`_tile_cost` prices its tiles at :data:`REG_PIPE_TILE_COST` and the
    :data:`WIDE16_MAX_TILES_PER_SM` limit does not apply (session 29). Where that leaves tactic 1, register records
    and at most one (sequence, KV head) pair per SM, tactic 4 is priced again at :func:`_wave_split`'s plan (if that
    takes the pipelined kernels) and taken if lower (session 31: 1.12x / 1.13x median over 14 unseen shapes, H100 /
    H200). ``wide=False``: the rule before them. Fit to
    ``bench/results/sparse_kv_warps_h200_e1a9128.json`` and ``…_h100_a07d27a.json`` (36 shapes at ≥ 4k each)
    and checked on shapes it was not fit on (``docs/sparse_kv.md``, session 25)."""
    smem = ORIN_SMEM_OPTIN if sms else None
    sms = sms or sm_count()
    tiles_per_sm = batch * num_kv_heads * math.ceil(max(1, max_len) / TILE2) / sms
    wave_wins = False  # tactic 4 at _wave_split's plan priced below tactic 1's (session 31; used where tactic 1 is left)
    if wide and head_dim == 64 and tokens_per_split is None and sms >= WIDE_MIN_SMS:
        if tiles_per_sm <= WIDE_MAX_TILES_PER_SM:
            if (tiles_per_sm >= REG_WIDE16_MIN_TILES_PER_SM and rk is not None and rv is not None
                    and uses_register_records(64, rk, rv, WIDE_WARPS[WIDE16_FUSED])
                    and smem_bytes2(64, rk, rv, WIDE_WARPS[WIDE16_FUSED]) + 16 <= (smem or smem_optin())):
                return WIDE16_FUSED
            return WIDE_FUSED
        pairs = batch * num_kv_heads
        if (rk is not None and rv is not None
                and smem_bytes2(64, rk, rv, WIDE_WARPS[WIDE16_FUSED]) + 16 <= (smem or smem_optin())):
            # priced at the one-wave split (the rule was fit so; tactic 4 then runs _wave_split's where that applies)
            ts16 = _one_wave_split(pairs, sms, max_len, TILE2 * WIDE_WARPS[WIDE16_FUSED])
            wide16 = (ts16, math.ceil(max(1, max_len) / ts16))
            pipe = (uses_register_records(64, rk, rv, WIDE_WARPS[WIDE16_FUSED])
                    and uses_pipelined_records(wide16[0], WIDE_WARPS[WIDE16_FUSED]))
            narrow = plan(64, num_q_heads, num_kv_heads, rk, rv, batch, max_len, sms, tactic=STREAM)
            if tiles_per_sm <= WIDE16_MAX_TILES_PER_SM or pipe:
                if (REG_PIPE_TILE_COST if pipe else 1.0) * _tile_cost(pairs, sms, *wide16) < _tile_cost(pairs, sms,
                                                                                                      *narrow):
                    return WIDE16_FUSED
            if uses_register_records(64, rk, rv, WIDE_WARPS[WIDE16_FUSED]) and pairs <= sms:
                tsw = _wave_split(pairs, sms, max_len)
                wave_wins = (uses_pipelined_records(tsw, WIDE_WARPS[WIDE16_FUSED])
                             and REG_PIPE_TILE_COST * _tile_cost(pairs, sms, tsw, math.ceil(max(1, max_len) / tsw))
                             < _tile_cost(pairs, sms, *narrow))
    if tiles_per_sm > FUSED_MAX_TILES_PER_SM:
        return WIDE16_FUSED if wave_wins else STREAM
    _, ns = plan(head_dim, num_q_heads, num_kv_heads, 0, 0, batch, max_len, sms, tokens_per_split, STREAM_FUSED)
    return STREAM_FUSED if ns <= FUSED_MAX_SPLITS else (WIDE16_FUSED if wave_wins else STREAM)


def plan_cache(cfg: SparseKVConfig, batch: int, max_len: int, sms: int | None = None,
               tokens_per_split: int | None = None, tactic: int | None = None,
               warps: int | None = None) -> tuple[int, int]:
    """:func:`plan` for a sparse cache (what :func:`decode_attention` uses)."""
    return plan(cfg.head_dim, cfg.num_q_heads, cfg.num_kv_heads, cfg.rk, cfg.rv, batch, max_len, sms,
                tokens_per_split, tactic, warps)


def plan_dense(head_dim: int, num_q_heads: int, num_kv_heads: int, batch: int, max_len: int, sms: int | None = None,
               tokens_per_split: int | None = None, tactic: int = SPLIT_V1) -> tuple[int, int]:
    """:func:`plan` for a dense cache (what :func:`dense_decode_attention` uses)."""
    return plan(head_dim, num_q_heads, num_kv_heads, 0, 0, batch, max_len, sms, tokens_per_split, tactic)


def _counter_words(batch: int, num_q_heads: int) -> int:
    return -(-batch * num_q_heads // 4) * 4


def workspace_bytes(num_q_heads: int, head_dim: int, batch: int, num_splits: int) -> int:
    """Bytes of the workspace: ``uint32`` merge counters ``[round_up(B · Hq, 4)]`` (tactic 2), then the
    split partials ``B · Hq · splits · (d + 2)`` float32. Zero the counters once with
    :func:`init_workspace` before the first fused call; the kernel resets them after each use."""
    return 4 * (_counter_words(batch, num_q_heads) + batch * num_q_heads * num_splits * (head_dim + 2))


def init_workspace(workspace: int, batch: int, num_q_heads: int, stream: int) -> None:
    """Zero the merge counters at the start of ``workspace`` (once, before its first use; async on ``stream``)."""
    cu = _cuda._driver()
    _cuda.check(cu.cuMemsetD32Async(int(workspace), 0, _counter_words(batch, num_q_heads), stream))


_carveout_set: set[int] = set()


def _kernel(name: str, max_smem_carveout: bool = False) -> _cuda.Kernel:
    k = _cuda.get_kernel(SOURCE, name)
    if max_smem_carveout and id(k) not in _carveout_set:
        # Prefer the largest shared-memory carveout so 3 attention blocks (≤ 64 KB each) fit an SM.
        cu = _cuda._driver()
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        _cuda.check(cu.cuFuncSetAttribute(k.function, attr, 100))
        _carveout_set.add(id(k))
    return k


def _i(x: int) -> ctypes.c_int:
    return ctypes.c_int(int(x))


def _p(x: int) -> ctypes.c_void_p:
    return ctypes.c_void_p(int(x))


def _cache_args(cfg: SparseKVConfig, c: CachePtrs) -> list:
    return [_p(c.lens), _p(c.k_rec), _p(c.v_rec), _p(c.k_ring), _p(c.v_ring), _i(cfg.num_kv_heads),
            _i(cfg.record_capacity), _i(cfg.ring), _i(cfg.window), _i(cfg.group), _i(cfg.keep_k),
            _i(cfg.keep_v), _i(cfg.rk), _i(cfg.rv)]


def _schedule_arg(cfg: SparseKVConfig, append: bool = False) -> ctypes.c_int:
    """The kernels' ``sched``: 0 = plain records; prefill: schedule; append: schedule from this sequence length on
    (:data:`edgesdk.formats.sparse_kv.SCHEDULE_APPEND_FROM`, read when the launch is planned)."""
    if not (SCHEDULE_RECORDS and schedules(cfg.head_dim, cfg.keep_k, cfg.keep_v)):
        return _i(0)
    return _i(max(1, _fmt.SCHEDULE_APPEND_FROM) if append else 1)


def prefill(cfg: SparseKVConfig, batch: int, src_tokens: int, k_src: int, v_src: int, cache: CachePtrs,
            stream: int) -> None:
    """Compress prompts: ``k_src``/``v_src`` fp16 ``[B, Hkv, src_tokens, d]``, ``lens[b] ≤ src_tokens``
    (device) → records of tokens ``[0, n_comp)`` and ring rows of ``[n_comp, lens[b])``."""
    if batch < 1 or src_tokens < 1:
        raise EdgeSDKError(f"sparse_kv prefill of batch {batch}, {src_tokens} tokens", "pass batch ≥ 1 and tokens ≥ 1")
    k = _kernel(f"sparse_kv_prefill_d{cfg.head_dim}")
    k.launch((math.ceil(src_tokens / COMP_WARPS), cfg.num_kv_heads, batch), (COMP_THREADS,),
             [_p(k_src), _p(v_src), _i(src_tokens), *_cache_args(cfg, cache), _schedule_arg(cfg)], stream)


def append(cfg: SparseKVConfig, batch: int, k_new: int, v_new: int, cache: CachePtrs, stream: int) -> None:
    """Append token ``lens[b] - 1`` (``k_new``/``v_new`` fp16 ``[B, Hkv, d]``) of every sequence with
    ``lens[b] > 0``; compress a group where the window is full. Raise ``lens`` first."""
    key = ("append", cfg, batch, _cuda.current_context())
    plans = _cuda.thread_cache(_tls)
    p = plans.get(key)
    if p is None:
        if batch < 1:
            raise EdgeSDKError(f"sparse_kv append of batch {batch}", "pass batch ≥ 1")
        p = _Plan(_APPEND_PTRS)
        p.launches = [_append_launch(cfg, batch, p.addr)]
        plans[key] = p
    p.set(k_new, v_new, cache.lens, cache.k_rec, cache.v_rec, cache.k_ring, cache.v_ring)
    _cuda.launch_all(p.launches, _cuda.raw_stream(stream))


#: Pointer arguments of one append, in the order of its plan's slots.
_APPEND_PTRS = ("k_new", "v_new", "lens", "k_rec", "v_rec", "k_ring", "v_ring")


def _append_launch(cfg: SparseKVConfig, batch: int, slot: dict, n_counters: int = 0) -> _cuda.Launch:
    """The append kernel's launch; with ``n_counters`` > 0 it also zeroes that many merge counters at the address in
    ``slot["counters"]`` (the node's one-token call)."""
    k = _kernel(f"sparse_kv_append_d{cfg.head_dim}")
    args = [slot[n] for n in _APPEND_PTRS] + [_i(v) for v in (cfg.num_kv_heads, *_geometry(cfg))]
    args += [slot["counters"] if n_counters else ctypes.c_void_p(0), _i(n_counters), _schedule_arg(cfg, append=True)]
    # block i: the group's tokens in the i-th 16-token tile they touch (one more tile than whole ones when unaligned)
    return k.plan((math.ceil(cfg.group / COMP_WARPS) + 1, cfg.num_kv_heads, batch), (COMP_THREADS,),
                  _cuda.ArgBlock(args))


COMBINE_THREADS = 256  # merge kernel (tactics 0, 1): one block per (sequence, query head), splits spread over its threads


#: Pointer arguments of one attention call, in the order of its plan's slots.
_ATT_PTRS = ("q", "ws", "parts", "lens", "k_rec", "v_rec", "k_ring", "v_ring", "out")
_tls = threading.local()  # per-thread launch plans (their pointer slots are written per call)


class _Plan:
    """The launches of one call shape, resolved once per thread and CUDA context: kernel handles, grids, shared
    memory and argument blocks whose pointer parameters live in ``slots`` (rewritten per call by :meth:`set`)."""

    __slots__ = ("slots", "addr", "_pack", "launches", "extra")

    def __init__(self, names: Sequence[str]):
        self.slots, addr = _cuda.ArgBlock.pointer_slots(len(names))
        self.addr = dict(zip(names, addr))
        self._pack = struct.Struct(f"={len(names)}Q").pack_into
        self.launches: list = []
        self.extra: dict = {}

    def set(self, *ptrs: int) -> None:
        self._pack(self.slots, 0, *ptrs)


def _attention_launches(head_dim: int, hq: int, hkv: int, batch: int, max_len: int, geometry: Sequence[int],
                        rk: int, rv: int, scale: float | None, sms: int | None, tokens_per_split: int | None,
                        tactic: int | None, warps: int | None, slot: dict, dense: bool = False,
                        aligned: bool = True) -> list:
    """Launch records of one attention call; ``slot`` maps the names of :data:`_ATT_PTRS` to the addresses of
    the pointer slots the kernels read their pointers from. ``dense``: the streaming tactics on a plain fp16 cache
    (``sparse_kv_dense2_*``). ``aligned``: the record arrays start on 16-byte boundaries (see
    :func:`uses_register_records`)."""
    g = hq // hkv
    if tactic is None:
        tactic = default_tactic(head_dim, hq, hkv, batch, max_len, sms, tokens_per_split, rk=rk, rv=rv)
    warps = _warps(head_dim, tactic, warps)
    ts, ns = plan(head_dim, hq, hkv, rk, rv, batch, max_len, sms, tokens_per_split, tactic, warps)
    scale = (1.0 / math.sqrt(head_dim) if scale is None else float(scale)) * _LOG2E
    grid, sk = (ns, hkv, batch), 0
    ts_arg = ts
    if tactic == STREAM_K:  # grid of nb blocks; the kernel takes -(tiles per pair) and the batch (attn2_entry)
        tpp, nb, _ = stream_k_blocks(batch * hkv, max_len, ts)
        grid, sk, ts_arg = (nb, 1, 1), batch, -tpp
    common = [slot["lens"], slot["k_rec"], slot["v_rec"], slot["k_ring"], slot["v_ring"], _i(hkv), _i(g),
              *(_i(v) for v in geometry), _i(ts_arg), _i(ns), ctypes.c_float(scale)]
    if tactic == SPLIT_V1:
        ka = _kernel(f"sparse_kv_attn_d{head_dim}_g{gqa_pad(g)}", max_smem_carveout=True)
        launches = [ka.plan((ns, hkv, batch), (THREADS,), _cuda.ArgBlock([slot["q"], slot["parts"], *common]),
                            smem_bytes(head_dim, g, ts, rk, rv))]
    else:
        suffix = "" if warps == WARPS2 else f"_w{warps}"
        smem = smem_bytes_dense2(head_dim, warps) if dense else smem_bytes2(head_dim, rk, rv, warps)
        if smem > smem_optin():
            raise EdgeSDKError(f"sparse_kv tactic {tactic} with {warps} warps needs {smem} bytes of shared memory per "
                               f"block; this device allows {smem_optin()}", "use a tactic with fewer warps per block")
        kind = "dense2" if dense else "attn2" if not uses_register_records(head_dim, rk, rv, warps, aligned) else \
            "attn2p" if uses_pipelined_records(ts, warps) else "attn2r"
        suffix += "_sk" if tactic == STREAM_K else ""
        ka = _kernel(f"sparse_kv_{kind}_d{head_dim}_g{gqa_pad(g)}{suffix}", max_smem_carveout=True)
        fused = _i(1 if tactic in FUSED_TACTICS else 0)
        launches = [ka.plan(grid, (32 * warps,),
                            _cuda.ArgBlock([slot["q"], slot["ws"], *common, slot["out"], fused, _i(sk)]), smem)]
        if tactic in FUSED_TACTICS:
            return launches
    kc = _kernel(f"sparse_kv_combine_d{head_dim}")
    launches.append(kc.plan((batch * hq,), (COMBINE_THREADS,),
                            _cuda.ArgBlock([slot["parts"], slot["lens"], slot["out"], _i(hq), _i(ts), _i(ns)])))
    return launches


def uses_register_records(head_dim: int, rk: int, rv: int, warps: int, aligned: bool = True) -> bool:
    """Whether a streaming block of ``warps`` warps decodes these records from registers (:data:`REG_RECORD_BYTES`;
    ``aligned``: both record arrays start on a 16-byte boundary)."""
    return REGISTER_RECORDS and aligned and head_dim == 64 and warps == 16 and rk == rv == REG_RECORD_BYTES


def uses_pipelined_records(tokens_per_split: int, warps: int) -> bool:
    """Whether a register-record block (:func:`uses_register_records`) takes the pipelined kernel: each warp walks at
    least :data:`PIPE_MIN_TILES_PER_WARP` tiles of the split."""
    return PIPELINED_RECORDS and tokens_per_split // (16 * warps) >= PIPE_MIN_TILES_PER_WARP


def _geometry(cfg: SparseKVConfig) -> tuple[int, ...]:
    return (cfg.record_capacity, cfg.ring, cfg.window, cfg.group, cfg.keep_k, cfg.keep_v, cfg.rk, cfg.rv)


def _check_attention(cfg: SparseKVConfig, batch: int, max_len: int, tokens_per_split, tactic, warps) -> None:
    """The argument checks that need no device (run before the first driver call of a new call shape)."""
    if not 1 <= max_len <= cfg.capacity or batch < 1:
        raise EdgeSDKError(f"sparse_kv decode_attention: max_len={max_len}, batch={batch}",
                           f"max_len must be in [1, capacity={cfg.capacity}] and batch ≥ 1")
    if tactic is not None:
        if tokens_per_split is None:
            if tactic not in TACTICS:
                raise EdgeSDKError(f"sparse_kv tactic {tactic!r} is unknown", f"use one of {TACTICS}")
            _warps(cfg.head_dim, tactic, warps)
        else:  # with both given, plan() asks no device
            plan(cfg.head_dim, cfg.num_q_heads, cfg.num_kv_heads, cfg.rk, cfg.rv, batch, max_len, 1,
                 tokens_per_split, tactic, warps)


def _attention_plan(cfg: SparseKVConfig, batch: int, max_len: int, scale, sms, tokens_per_split, tactic,
                    warps, aligned: bool = True) -> _Plan:
    p = _Plan(_ATT_PTRS)
    p.launches = _attention_launches(cfg.head_dim, cfg.num_q_heads, cfg.num_kv_heads, batch, max_len, _geometry(cfg),
                                     cfg.rk, cfg.rv, scale, sms, tokens_per_split, tactic, warps, p.addr,
                                     aligned=aligned)
    p.extra["parts"] = 4 * _counter_words(batch, cfg.num_q_heads)
    return p


def decode_attention(cfg: SparseKVConfig, batch: int, max_len: int, q: int, cache: CachePtrs, out: int,
                     workspace: int, stream: int, scale: float | None = None, sms: int | None = None,
                     tokens_per_split: int | None = None, tactic: int | None = None, warps: int | None = None) -> None:
    """``out[b, i] = softmax(q[b, i] · Kᵀ · scale) · V`` over the ``lens[b]`` cached tokens of sequence b.

    Args:
        cfg (SparseKVConfig): Cache geometry.
        batch (int): Sequences.
        max_len (int): Upper bound of ``lens`` (host-known, e.g. the capacity); fixes the split grid,
            so one CUDA graph serves growing lengths.
        q (int): fp16 ``[B, Hq, d]``; query head ``i`` uses KV head ``i // (Hq / Hkv)``.
        cache (CachePtrs): The cache (records, rings, lens).
        out (int): fp16 ``[B, Hq, d]``; sequences of length 0 get zeros.
        workspace (int): ``workspace_bytes(Hq, d, B, plan(...)[1])`` bytes, preallocated; its counters
            zeroed once by :func:`init_workspace` (tactic 2, which the default may pick).
        stream (int): CUDA stream.
        scale (float | None): Score scale, default ``1 / sqrt(d)``.
        sms (int | None): SM count for the split heuristic (default: the device's).
        tokens_per_split (int | None): Force the split size (multiple of 64; of 16 warps for tactics 1-3).
        tactic (int | None): one of :data:`TACTICS` or None (default: :func:`default_tactic`).
        warps (int | None): Warps per block of tactics 1 and 2 (default 4; 8 or 16 at d = 64, for measurements).
    """
    plans = _cuda.thread_cache(_tls)
    aligned = not (cache.k_rec | cache.v_rec) & 15
    key = ("attn", cfg, batch, max_len, scale, sms, tokens_per_split, tactic, warps, REGISTER_RECORDS,
           PIPELINED_RECORDS, PIPE_MIN_TILES_PER_WARP, aligned)
    per_ctx = plans.get(key)
    if per_ctx is None:  # a new call shape: check it before any driver call
        _check_attention(cfg, batch, max_len, tokens_per_split, tactic, warps)
        per_ctx = plans[key] = {}
    ctx = _cuda.current_context()
    p = per_ctx.get(ctx)
    if p is None:
        p = per_ctx[ctx] = _attention_plan(cfg, batch, max_len, scale, sms, tokens_per_split, tactic, warps, aligned)
    p.set(q, workspace, workspace + p.extra["parts"], cache.lens, cache.k_rec, cache.v_rec, cache.k_ring, cache.v_ring,
          out)
    _cuda.launch_all(p.launches, _cuda.raw_stream(stream))


def dense_decode_attention(head_dim: int, num_q_heads: int, num_kv_heads: int, batch: int, capacity: int,
                           max_len: int, q: int, k: int, v: int, lens: int, out: int, workspace: int,
                           stream: int, scale: float | None = None, sms: int | None = None,
                           tokens_per_split: int | None = None, tactic: int = SPLIT_V1) -> None:
    """Dense fp16 decode attention on the same split kernels (the benchmark's hand-written dense baseline): ``k``/``v``
    fp16 ``[B, Hkv, capacity, d]``. Tactic 0 is the split kernel of :data:`SPLIT_V1`; tactics 1-5 the streaming
    kernels (``sparse_kv_dense2_*``): each warp's 16-token K and V tiles copied by ``cp.async`` straight into the
    tiles ``ldmatrix`` reads, :data:`STAGES2` deep, no decode; 1 with the merge kernel, 2-5 with the fused merge
    (zero the workspace's counters once with :func:`init_workspace`), 3-5 with 8 / 16 warps per block (d = 64), 5
    stream-K (:data:`STREAM_K`)."""
    gqa_pad(num_q_heads // num_kv_heads)
    if head_dim not in (64, 128) or not 1 <= max_len <= capacity:
        raise EdgeSDKError(f"dense_decode_attention: head_dim={head_dim}, max_len={max_len}, capacity={capacity}",
                           "head_dim 64 or 128, 1 ≤ max_len ≤ capacity")
    key = ("dense", head_dim, num_q_heads, num_kv_heads, batch, capacity, max_len, scale, sms, tokens_per_split, tactic,
           _cuda.current_context())
    plans = _cuda.thread_cache(_tls)
    p = plans.get(key)
    if p is None:
        p = _Plan(_ATT_PTRS)
        # No records (nothing is ever compressed): record sizes 0.
        geometry = (1, capacity, _DENSE_WINDOW, 1, 1, 1, 0, 0)
        p.launches = _attention_launches(head_dim, num_q_heads, num_kv_heads, batch, max_len, geometry, 0, 0, scale,
                                         sms, tokens_per_split, tactic, None, p.addr, dense=True)
        p.extra["parts"] = 4 * _counter_words(batch, num_q_heads)
        plans[key] = p
    p.set(q, workspace, workspace + p.extra["parts"], lens, 0, 0, k, v, out)
    _cuda.launch_all(p.launches, _cuda.raw_stream(stream))


# --------------------------------------------------------------------------------------------------------------------
# The EdgeSparseKVAttention node (edgesdk.formats.sparse_kv, "The graph node"): S new tokens = S decode steps.

_ALIGN = 256


def _up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def node_plan(cfg: SparseKVConfig, batch: int, sms: int | None = None, tactic: int | None = None) -> tuple[int, int]:
    """``(tactic, workspace bytes)`` of :func:`run_node` for ``batch`` sequences (split grid for ``capacity``)."""
    if tactic is None:
        tactic = default_tactic(cfg.head_dim, cfg.num_q_heads, cfg.num_kv_heads, batch, cfg.capacity, sms, rk=cfg.rk,
                                rv=cfg.rv)
    _, ns = plan_cache(cfg, batch, cfg.capacity, sms, tactic=tactic)
    rows_q, rows_kv = batch * cfg.num_q_heads, batch * cfg.num_kv_heads
    nbytes = (_up(workspace_bytes(cfg.num_q_heads, cfg.head_dim, batch, ns)) + _up(4 * batch)
              + 2 * _up(2 * rows_q * cfg.head_dim) + 2 * _up(2 * rows_kv * cfg.head_dim))
    return tactic, nbytes


#: Pointer arguments of one node call, in the order of its plan's slots: workspace parts, the node's tensors, the
#: state, and (S > 1) out at the last token.
_NODE_PTRS = ("lengths", "lens", "ws", "parts", "q", "k", "v", "out", "k_rec", "v_rec", "k_ring", "v_ring",
              "q_src", "k_src", "v_src", "o_dst", "o_last")


def _node_plan(cfg: SparseKVConfig, scale: float, batch: int, S: int, sms: int | None, tactic: int | None,
               aligned: bool = True) -> _Plan:
    """The launches of one step of a :func:`run_node` call shape in ``launches``; S > 1: ``extra["last"]`` copies the
    last step's output, and the step index is the ``c_int`` ``extra["step"]``, read by the step kernel.

    S = 1: append (which also zeroes the merge counters), attention, straight on the node's tensors and lengths (the
    cached lengths are the lengths after the call). S > 1: ``sparse_kv_node_step`` (lengths, token i of q, k, v into
    the workspace, the previous step's output row back into out), append, attention into the workspace row.
    Workspace layout: merge counters and split partials, then lens, then (S > 1) one token's q, out, k, v."""
    d, hq, hkv = cfg.head_dim, cfg.num_q_heads, cfg.num_kv_heads
    tactic, _ = node_plan(cfg, batch, sms, tactic)
    _, ns = plan_cache(cfg, batch, cfg.capacity, sms, tactic=tactic)
    p = _Plan(_NODE_PTRS)
    a = p.addr
    off = {"parts": 4 * _counter_words(batch, hq), "lens": _up(workspace_bytes(hq, d, batch, ns))}
    off["q"] = off["lens"] + _up(4 * batch)
    off["o"] = off["q"] + _up(2 * batch * hq * d)
    off["k"] = off["o"] + _up(2 * batch * hq * d)
    off["v"] = off["k"] + _up(2 * batch * hkv * d)
    rows_q, rows_kv = batch * hq, batch * hkv
    counters = _counter_words(batch, hq) if tactic in FUSED_TACTICS else 0
    attention = _attention_launches(d, hq, hkv, batch, cfg.capacity, _geometry(cfg), cfg.rk, cfg.rv, scale, sms,
                                    None, tactic, None, {n: a[n] for n in _ATT_PTRS}, aligned=aligned)
    append = _append_launch(cfg, batch, {"k_new": a["k"], "v_new": a["v"], "lens": a["lens"], "k_rec": a["k_rec"],
                                         "v_rec": a["v_rec"], "k_ring": a["k_ring"], "v_ring": a["v_ring"],
                                         "counters": a["ws"]}, counters if S == 1 else 0)
    p.extra.update(offsets=off, state_bytes=[int(np.prod(shape)) * (1 if STATE_DTYPES[name] == "int8" else 2)
                                             for name, shape in state_shapes(cfg, batch).items()])
    if S == 1:
        p.launches = [append, *attention]
        return p
    step = ctypes.c_int(0)
    items = max(batch, counters) + 2 * (rows_q + rows_kv) * (d // 4)
    prep = _kernel("sparse_kv_node_step").plan(
        (min(-(-items // 128), 1024),), (128,),
        _cuda.ArgBlock([a["lengths"], a["lens"], _i(batch), a["ws"], _i(counters), a["q_src"], a["k_src"], a["v_src"],
                        a["o_dst"], a["q"], a["k"], a["v"], a["out"], _i(rows_q), _i(rows_kv), _i(d), _i(S), step]))
    last = _kernel("sparse_kv_token_copy").plan(
        (min(max(1, rows_q * d // 4 // 128), 1024),), (128,),
        _cuda.ArgBlock([a["out"], a["o_last"], _i(rows_q), _i(d), ctypes.c_longlong(d), ctypes.c_longlong(S * d)]))
    p.launches = [prep, append, *attention]
    p.extra.update(step=step, last=[last])
    return p


def run_node(cfg: SparseKVConfig, scale: float, batch: int, new_tokens: int, q: int, k: int, v: int,
             state_in: Sequence[int], state_out: Sequence[int], lengths: int, out: int, workspace: int,
             stream: int, sms: int | None = None, tactic: int | None = None) -> None:
    """One call of the node on the device: for each of the ``new_tokens`` tokens, ``append`` it and run
    ``decode_attention`` for its query (what :func:`edgesdk.reference.sparse_kv.attention_steps` computes).

    Args:
        q (int): fp16 ``[B, Hq, S, d]``; ``k``, ``v``: fp16 ``[B, Hkv, S, d]``; ``out``: fp16 ``[B, Hq, S, d]``.
        state_in, state_out: device pointers of ``k_records, v_records, k_window, v_window`` before and after (the
            same buffers where TensorRT aliases them; else the inputs are copied to the outputs first).
        lengths (int): int32 ``[B]``, tokens cached after the call (each ≥ S; device).
        workspace (int): :func:`node_plan` bytes; nothing in it needs to survive between calls.
    """
    if batch < 1 or new_tokens < 1:
        raise EdgeSDKError(f"sparse_kv node call of batch {batch}, {new_tokens} new tokens",
                           "pass batch >= 1 and at least one new token")
    S = new_tokens
    aligned = not (int(state_out[0]) | int(state_out[1])) & 15
    key = ("node", cfg, scale, batch, S, sms, tactic, REGISTER_RECORDS, PIPELINED_RECORDS, PIPE_MIN_TILES_PER_WARP,
           aligned, _cuda.current_context())
    plans = _cuda.thread_cache(_tls)
    p = plans.get(key)
    if p is None:
        p = plans[key] = _node_plan(cfg, scale, batch, S, sms, tactic, aligned)
    if any(int(a) != int(b) for a, b in zip(state_in, state_out)):
        cu = _cuda._driver()
        for src, dst, nbytes in zip(state_in, state_out, p.extra["state_bytes"]):
            if int(src) != int(dst):
                _cuda.check(cu.cuMemcpyDtoDAsync(int(dst), int(src), nbytes, stream))
    ws, off = int(workspace), p.extra["offsets"]
    lens = ws + off["lens"]
    k_rec, v_rec, k_ring, v_ring = (int(x) for x in state_out)
    q, k, v, out = int(q), int(k), int(v), int(out)
    stream = _cuda.raw_stream(stream)
    if S == 1:  # the kernels read the node's lengths as the cached lengths
        p.set(int(lengths), int(lengths), ws, ws + off["parts"], q, k, v, out, k_rec, v_rec, k_ring, v_ring, 0, 0, 0, 0,
              0)
        _cuda.launch_all(p.launches, stream)
        return
    p.set(int(lengths), lens, ws, ws + off["parts"], ws + off["q"], ws + off["k"], ws + off["v"], ws + off["o"],
          k_rec, v_rec, k_ring, v_ring, q, k, v, out, out + 2 * (S - 1) * cfg.head_dim)
    step = p.extra["step"]
    for i in range(S):
        step.value = i
        _cuda.launch_all(p.launches, stream)
    _cuda.launch_all(p.extra["last"], stream)
