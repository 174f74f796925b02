"""Bitmap-sparse KV cache (MUSTAFAR): per-token magnitude pruning, compressed records, dense window.

The numpy twin of ``plugins/sparse_kv/sparse_kv.cu``: every byte the GPU kernels write is defined
here, and :class:`SparseKVCache` reproduces the GPU's prefill/append exactly so tests compare bytes.

Pruning
-------
Per token and per KV head, K and V rows (``head_dim`` channels) keep the ``keep`` channels of largest
magnitude, ``keep = head_dim - round(sparsity · head_dim)`` (:func:`keep_count`). Magnitude is compared
on the fp16 bit pattern with the sign cleared (``bits & 0x7fff``: monotone in ``|x|``, ``-0 == +0``);
ties are kept in channel order (lower channel first), so exactly ``keep`` channels survive per token.
The most recent tokens (the dense **window**, default 32, MUSTAFAR's setting) stay dense.

Record layout (one token of one KV head, little-endian, ``R = head_dim / 8 + 2 · KP`` bytes)
---------------------------------------------------------------------------------------------
``uint64 bitmap[head_dim / 64]`` -- 64-element tiles along the channels of one token; bit ``c % 64`` of
word ``c // 64`` is set iff channel ``c`` is kept; exactly ``keep`` bits are set.
``fp16 values[KP]`` -- the kept values in channel order, then zeros up to ``KP = round_up(keep, 4)``.

**Store order** (``head_dim = 64`` records with padding, ``keep % 4 != 0``; session 33): the last half of the record
holds a permutation ``x`` (``0 ≤ x < 64``, the half's other bits zero). The bitmap and the values are then stored in
the order of ``c' = c ^ x``: bit ``c'`` is set iff channel ``c' ^ x`` is kept, and the values follow ascending ``c'``.
``x = 0`` is the plain record above. A decoder walks the stored bitmap as before and puts each value at channel
``c' ^ x``, so ``x`` chooses the order in which a GPU lane stores its values into a tile row, and with it the
shared-memory banks it hits at each store. The compressor picks ``x`` per record to spread the 32 records one warp
decodes together over the banks (:func:`schedule_records`); ``head_dim = 128`` records keep ``x = 0`` (zero padding).

Layout choice (vs the paper's K tiles along tokens of one channel): per-token pruning makes every
record the same size, so there is no per-tile offset array (MUSTAFAR's offsets + padding cost it ~15 %
of dense), a record is found from its token index alone (the attention kernel splits tokens across blocks with
no index), and appending a group of tokens is writing ``A`` records.

In memory the records of one (sequence, KV head) are stored in **groups of 16 tokens, chunk-major**: 8-byte unit
``k`` of the record of token ``t`` (its bytes ``8 k … 8 k + 7``; ``R`` is a multiple of 8) lies at byte
``16 R · (t // 16) + 128 k + 8 · (t % 16)`` (:func:`records_to_physical`; the record capacity is a multiple of
16). The 16 lanes of a GPU warp that load unit ``k`` of a tile's 16 records then read 128 contiguous bytes, where
token-major records had them read 8 bytes every ``R`` (session 30: 1.03× median, up to 1.07×, on issue 7's shapes).
The attention kernels decompress one record per lane (K and V into 16-token tensor-core tiles; the older tactic 0 computes K as a sparse
dot product per token). Bytes per token and head at d = 64:
70 % → 48 (0.375 of dense fp16), 50 % → 72 (0.5625), 0 % → 136 (1.0625).

Cache of one sequence after ``L`` tokens (per KV head, for K and V alike)
-------------------------------------------------------------------------
tokens ``[0, n_comp)`` are records (array ``[B, Hkv, record_capacity, R]`` uint8, each ``[record_capacity, R]`` row
in the chunk-major groups above: :func:`records_to_logical` gives ``rec[t]``);
tokens ``[n_comp, L)`` are dense fp16 rows in a ring of ``C = window + group`` slots, token ``t`` in
slot ``t % C`` (array ``[B, Hkv, C, head_dim]``);
``n_comp = ((L - window) // group) · group`` once ``L ≥ window + group``, else 0
(:meth:`SparseKVConfig.n_compressed`): whenever the window reaches ``window + group`` tokens its
oldest ``group`` tokens are pruned and appended as records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgesdk.errors import EdgeSDKError, FormatError

TILE = 64  # channels per bitmap word
GROUP_TOKENS = 16  # records stored chunk-major per group of this many tokens
CHUNK = 8  # bytes per unit of a record in a group
HEAD_DIMS = (64, 128)
MAX_GQA_GROUP = 8  # query heads per KV head the attention kernel serves (mma rows 0..7)
_FIX = "rebuild the cache with edgesdk.formats.sparse_kv.SparseKVCache (prefill/append)"

#: Keeps whose records the compressor schedules (``head_dim = 64``, 48-byte records: the register kernels', whose
#: store order :data:`STORE_STEPS` models), when both K and V have one.
SCHEDULED_KEEPS = (17, 18, 19)
#: The value index of each of the 20 stores of one record in the pipelined kernels' decode (``RegDecode64``: values
#: 0-9 ascending over the stored bitmap, ``keep - 1`` .. 10 descending, interleaved; 19-17 only where < keep).
STORE_STEPS = (19, 0, 18, 1, 17, 2, 16, 3, 15, 4, 14, 5, 13, 6, 12, 7, 11, 8, 10, 9)
#: Banks between consecutive rows of a decoded tile (rows of 64 + 8 halfs = 36 words): row r starts at bank 4 r.
ROW_BANK_STEP = 4
#: Permutations the compressor tries (even ones: x and x ^ 1 hit the same banks).
SCHEDULE_CANDIDATES = tuple(range(0, 64, 2))
#: A prefill schedules every record; an append schedules its group only once the sequence holds this many tokens.
#: Scheduling a 32-token group costs ≈ 16 µs more than compressing it (the choice is sequential over the tile's 32
#: records; H200, session 33), which is > 8 % of a dense decode step when spread over the group's 32 steps at short
#: context; from 16k on it was ≤ 7.2 % on issue 7's shapes (H200), and there the pipelined kernels that gain run.
SCHEDULE_APPEND_FROM = 16384


def keep_count(head_dim: int, sparsity: float) -> int:
    """Channels kept per token: ``head_dim - round(sparsity · head_dim)`` (round half up).

    Args:
        head_dim (int): Channels per head.
        sparsity (float): Fraction pruned, in ``[0, 1)``.

    Returns:
        int: Kept channels per token, ``1 … head_dim``.
    """
    if not 0.0 <= float(sparsity) < 1.0:
        raise EdgeSDKError(f"KV sparsity {sparsity!r} is outside [0, 1)",
                           "pass a fraction such as 0.5 or 0.7 (0 = dense)")
    return max(1, head_dim - int(np.floor(float(sparsity) * head_dim + 0.5)))


def n_compressed(length: int, window: int, group: int) -> int:
    """Tokens held as records after ``length`` tokens: whenever the dense part reaches ``window + group``
    tokens, its oldest ``group`` are compressed."""
    return ((length - window) // group) * group if length >= window + group else 0


def padded_keep(keep: int) -> int:
    """Stored value slots per record: ``round_up(keep, 4)`` (records stay 8-byte aligned)."""
    return -(-keep // 4) * 4


def record_bytes(head_dim: int, keep: int) -> int:
    """Bytes of one compressed token: ``head_dim / 8`` (bitmap) ``+ 2 · round_up(keep, 4)``."""
    return head_dim // 8 + 2 * padded_keep(keep)


def magnitude_key(x: np.ndarray) -> np.ndarray:
    """fp16 magnitude as an integer key (``bits & 0x7fff``), the order the GPU selects by."""
    return (np.ascontiguousarray(x, dtype=np.float16).view(np.uint16) & 0x7FFF).astype(np.int32)


def prune_mask(x: np.ndarray, keep: int) -> np.ndarray:
    """Boolean mask ``[..., d]`` of the ``keep`` largest-magnitude channels of each row (ties: lower
    channel first)."""
    key = magnitude_key(x)
    d = key.shape[-1]
    order = np.argsort(-key, axis=-1, kind="stable")[..., :keep]
    mask = np.zeros(key.shape, dtype=bool)
    if keep > d:
        raise EdgeSDKError(f"keep={keep} exceeds head_dim={d}", "use edgesdk.formats.sparse_kv.keep_count")
    np.put_along_axis(mask, order, True, axis=-1)
    return mask


def prune(x: np.ndarray, keep: int) -> np.ndarray:
    """``x`` (fp16 ``[..., d]``) with all but the ``keep`` largest-magnitude channels per row zeroed."""
    x = np.asarray(x, dtype=np.float16)
    return np.where(prune_mask(x, keep), x, np.float16(0))


def compress(x: np.ndarray, keep: int) -> np.ndarray:
    """Compress rows ``x`` (fp16 ``[..., d]``, d in 64/128) into records ``uint8 [..., R]``."""
    x = np.asarray(x, dtype=np.float16)
    d = x.shape[-1]
    if d % TILE:
        raise EdgeSDKError(f"head_dim {d} is not a multiple of {TILE}", "use head_dim 64 or 128")
    lead = x.shape[:-1]
    rows = x.reshape(-1, d)
    mask = prune_mask(rows, keep)
    n = rows.shape[0]
    kp = padded_keep(keep)
    bits = np.packbits(mask, axis=-1, bitorder="little")  # [n, d/8]: byte j bit i = channel 8j + i
    vals = np.zeros((n, kp), dtype=np.float16)
    vals[:, :keep] = rows[mask].reshape(n, keep)  # row-major boolean indexing keeps channel order
    out = np.concatenate([bits,
                          vals.astype("<f2").view(np.uint8).reshape(n, 2 * kp)], axis=1)
    return out.reshape(*lead, record_bytes(d, keep))


def decompress(records: np.ndarray, head_dim: int, keep: int) -> np.ndarray:
    """Records ``uint8 [..., R]`` → dense pruned rows fp16 ``[..., head_dim]``; validates every record.

    Raises:
        FormatError: wrong record size, a bitmap without exactly ``keep`` bits, nonzero padding.
    """
    records = np.asarray(records)
    r = record_bytes(head_dim, keep)
    if records.dtype not in (np.uint8, np.int8) or records.ndim < 1 or records.shape[-1] != r:
        raise FormatError(f"sparse_kv records have shape {records.shape} / dtype {records.dtype}; expected "
                          f"uint8 [..., {r}] for head_dim={head_dim}, keep={keep}", _FIX)
    lead = records.shape[:-1]
    raw = np.ascontiguousarray(records).view(np.uint8).reshape(-1, r)
    n = raw.shape[0]
    words = head_dim // TILE
    mask = np.unpackbits(raw[:, : head_dim // 8], axis=-1, bitorder="little").astype(bool)
    counts = mask.sum(axis=-1)
    bad = np.nonzero(counts != keep)[0]
    if bad.size:
        raise FormatError(f"sparse_kv record {int(bad[0])} has {int(counts[bad[0]])} bitmap bits set; "
                          f"every record keeps exactly {keep} of {head_dim} channels ({bad.size} bad records)",
                          _FIX)
    vals = raw[:, words * 8:].copy().view("<f2").astype(np.float16)
    pad = vals[:, keep:].view(np.uint16).copy()
    x = np.zeros(n, np.int64)
    if _carries_order(head_dim, keep):
        x = pad[:, -1].astype(np.int64)
        bad = np.nonzero(x >= TILE)[0]
        if bad.size:
            raise FormatError(f"sparse_kv record {int(bad[0])} has {int(x[bad[0]])} in its last padding half, the "
                              f"store order x; it must be < {TILE} (the half's other bits zero)", _FIX)
        pad[:, -1] = 0
    if pad.size and np.any(pad != 0):
        row = int(np.nonzero(np.any(pad != 0, axis=1))[0][0])
        raise FormatError(f"sparse_kv record {row} has nonzero padding after its {keep} values", _FIX)
    out = np.zeros((n, head_dim), dtype=np.float16)
    stored = np.nonzero(mask)[1].reshape(n, keep)  # ascending c' per record
    out[np.arange(n)[:, None], stored ^ x[:, None]] = vals[:, :keep]
    return out.reshape(*lead, head_dim)


def _carries_order(head_dim: int, keep: int) -> bool:
    """Whether records of this geometry hold a store order ``x`` in their last half."""
    return head_dim == TILE and keep % 4 != 0


def record_order(records: np.ndarray, head_dim: int, keep: int) -> np.ndarray:
    """The store order ``x`` of each record ``uint8 [..., R]`` (0 where the geometry carries none)."""
    records = np.asarray(records, np.uint8)
    if not _carries_order(head_dim, keep):
        return np.zeros(records.shape[:-1], np.int64)
    return records[..., -2:].copy().view("<u2")[..., 0].astype(np.int64)


def reorder_records(records: np.ndarray, head_dim: int, keep: int, x) -> np.ndarray:
    """Plain records (``x = 0``) ``uint8 [..., R]`` → the same records stored in order ``x`` (per record)."""
    records = np.asarray(records, np.uint8)
    x = np.broadcast_to(np.asarray(x, np.int64), records.shape[:-1]).reshape(-1)
    if np.any(x != 0) and not _carries_order(head_dim, keep):
        raise EdgeSDKError(f"records of head_dim={head_dim}, keep={keep} carry no store order",
                           "only head_dim 64 records with keep % 4 != 0 do")
    raw = records.reshape(-1, records.shape[-1])
    n = raw.shape[0]
    bits = np.unpackbits(raw[:, :8], axis=-1, bitorder="little").astype(bool)
    ch = np.nonzero(bits)[1].reshape(n, keep)
    order = np.argsort(ch ^ x[:, None], axis=-1, kind="stable")
    vals = raw[:, 8:].copy().view("<u2")
    nv = vals.copy()
    nv[:, :keep] = np.take_along_axis(vals[:, :keep], order, -1)
    if _carries_order(head_dim, keep):
        nv[:, -1] = x
    nbits = np.take_along_axis(bits, np.arange(TILE)[None, :] ^ x[:, None], -1)
    out = np.concatenate([np.packbits(nbits, axis=-1, bitorder="little"), nv.view(np.uint8)], axis=1)
    return out.reshape(records.shape)


def store_banks(records: np.ndarray, keep: int, rows) -> np.ndarray:
    """The bank of each of the :data:`STORE_STEPS` stores (−1: none) of d = 64 records ``uint8 [..., R]`` decoded
    into tile rows ``rows`` (broadcast to the records' leading shape), as the pipelined kernels store them."""
    records = np.asarray(records, np.uint8)
    lead = records.shape[:-1]
    raw = records.reshape(-1, records.shape[-1])
    n = raw.shape[0]
    bits = np.unpackbits(raw[:, :8], axis=-1, bitorder="little").astype(bool)
    stored = np.nonzero(bits)[1].reshape(n, keep)
    x = record_order(raw, TILE, keep)
    rows = np.broadcast_to(np.asarray(rows, np.int64), lead).reshape(-1)
    out = np.full((n, len(STORE_STEPS)), -1, np.int64)
    for s, v in enumerate(STORE_STEPS):
        if v < keep:
            out[:, s] = (ROW_BANK_STEP * rows + ((stored[:, v] ^ x) >> 1)) % 32
    return out.reshape(*lead, len(STORE_STEPS))


def _bank_counts(banks: np.ndarray) -> np.ndarray:
    """Stores per (step, bank) of banks ``[..., n, steps]`` → ``[..., steps, 32]``."""
    oh = (banks[..., None] == np.arange(32)).astype(np.int64)  # [..., n, steps, 32]
    return oh.sum(axis=-3)


def _candidate_banks(records: np.ndarray, keep: int, row: int, xs: np.ndarray) -> np.ndarray:
    """:func:`store_banks` of plain d = 64 records ``uint8 [..., R]`` in tile row ``row`` as if stored in each order of
    ``xs``: ``[..., len(xs), steps]``, without building the reordered records."""
    lead = records.shape[:-1]
    bits = np.unpackbits(records[..., :8], axis=-1, bitorder="little").astype(bool)
    ch = np.nonzero(bits.reshape(-1, TILE))[1].reshape(*lead, 1, keep)  # kept channels, ascending
    real = np.sort(ch ^ xs[:, None], axis=-1) ^ xs[:, None]  # the channel of stored value i, per order
    on = [v < keep for v in STORE_STEPS]
    banks = np.full((*lead, len(xs), len(STORE_STEPS)), -1, np.int64)
    banks[..., on] = (ROW_BANK_STEP * row + (real[..., [v for v in STORE_STEPS if v < keep]] >> 1)) % 32
    return banks


def schedules(head_dim: int, keep_k: int, keep_v: int) -> bool:
    """Whether the compressor schedules these records' store order (:func:`schedule_records`)."""
    return head_dim == TILE and keep_k in SCHEDULED_KEEPS and keep_v in SCHEDULED_KEEPS


def schedule_records(k_log: np.ndarray, v_log: np.ndarray, keep_k: int, keep_v: int, t_lo: int, t_hi: int) -> None:
    """Give the plain records of tokens ``[t_lo, t_hi)`` their store order, in place (logical records
    ``uint8 [H, slots, R]`` of one sequence; tokens below ``t_lo`` are already scheduled).

    Per 16-token tile the pipelined kernels decode K of tokens 0-15 (lanes 0-15) and V of the same tokens (lanes
    16-31) together, one value per lane and store instruction; a store instruction takes as many shared-memory
    wavefronts as its busiest bank has stores. In token order, K then V, each record takes the ``x`` of
    :data:`SCHEDULE_CANDIDATES` that adds the fewest wavefronts to the tile's records before it (counted from
    :func:`store_banks`); ties go to the smaller ``x``. Greedy and causal, so appending a group gives the bytes a
    prefill of the same tokens gives (where appends schedule: :data:`SCHEDULE_APPEND_FROM`).
    ``sparse_kv_prefill`` / ``sparse_kv_append`` do the same on the GPU.
    """
    if t_hi <= t_lo:
        return
    H = k_log.shape[0]
    xs = np.asarray(SCHEDULE_CANDIDATES, np.int64)
    j0 = t_lo // GROUP_TOKENS
    tiles = np.arange(j0, (t_hi - 1) // GROUP_TOKENS + 1)  # tiles are independent: all of them at once
    counts = np.zeros((H, len(tiles), len(STORE_STEPS), 32), np.int64)
    r0 = t_lo - GROUP_TOKENS * j0  # the first tile's records before t_lo count
    for log, keep in ((k_log, keep_k), (v_log, keep_v)):
        if r0:
            counts[:, 0] += _bank_counts(store_banks(log[:, t_lo - r0:t_lo], keep, np.arange(r0)))
    for r in range(GROUP_TOKENS):  # token r of every tile, in token order, K then V
        ts = GROUP_TOKENS * tiles + r
        sel = np.nonzero((ts >= t_lo) & (ts < t_hi))[0]
        if not sel.size:
            continue
        tt = ts[sel]
        for log, keep in ((k_log, keep_k), (v_log, keep_v)):
            rec = log[:, tt]  # plain records [H, n, R]
            banks = _candidate_banks(rec, keep, r, xs)  # [H, n, 32, steps]
            c = counts[:, sel]  # [H, n, steps, 32]
            hit = np.take_along_axis(c[:, :, None], np.maximum(banks, 0)[..., None], -1)[..., 0]
            cost = ((banks >= 0) & (hit + 1 > c.max(-1)[:, :, None])).sum(-1)  # added wavefronts [H, n, 32]
            best = cost.argmin(-1)  # first minimum: the smallest x
            log[:, tt] = reorder_records(rec, TILE, keep, xs[best])
            counts[:, sel] += _bank_counts(np.take_along_axis(banks, best[..., None, None], 2))


@dataclass(frozen=True)
class SparseKVConfig:
    """Geometry and policy of one attention layer's sparse KV cache.

    Args:
        head_dim (int): Channels per head, 64 or 128.
        num_q_heads (int): Query heads.
        num_kv_heads (int): KV heads; ``num_q_heads / num_kv_heads`` (GQA group) must be ≤ 8.
        k_sparsity (float): Fraction of each K row pruned, ``[0, 1)``.
        v_sparsity (float): Fraction of each V row pruned, ``[0, 1)``.
        capacity (int): Maximum tokens per sequence.
        window (int): Dense local window of the most recent tokens (≥ 1; MUSTAFAR: 32).
        group (int): Tokens compressed at once when the window overflows (≥ 1).
    """

    head_dim: int
    num_q_heads: int
    num_kv_heads: int
    k_sparsity: float
    v_sparsity: float
    capacity: int
    window: int = 32
    group: int = 32
    keep_k: int = field(init=False)
    keep_v: int = field(init=False)

    def __post_init__(self):
        if self.head_dim not in HEAD_DIMS:
            raise EdgeSDKError(f"sparse_kv head_dim {self.head_dim} is not supported",
                               f"use one of {HEAD_DIMS} (the kernels are instantiated for these)")
        if self.num_kv_heads < 1 or self.num_q_heads % self.num_kv_heads:
            raise EdgeSDKError(f"{self.num_q_heads} query heads are not a multiple of {self.num_kv_heads} KV heads",
                               "pass the model's num_attention_heads and num_key_value_heads")
        if self.num_q_heads // self.num_kv_heads > MAX_GQA_GROUP:
            raise EdgeSDKError(f"GQA group {self.num_q_heads // self.num_kv_heads} > {MAX_GQA_GROUP} query heads "
                               "per KV head", "split the heads into several calls of ≤ 8 query heads per KV head")
        if self.window < 1 or self.group < 1 or self.capacity < 1:
            raise EdgeSDKError(f"sparse_kv window={self.window}, group={self.group}, capacity={self.capacity}",
                               "window, group and capacity must all be ≥ 1")
        object.__setattr__(self, "keep_k", keep_count(self.head_dim, self.k_sparsity))
        object.__setattr__(self, "keep_v", keep_count(self.head_dim, self.v_sparsity))

    @property
    def gqa(self) -> int:
        """Query heads per KV head."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def ring(self) -> int:
        """Dense ring slots per (sequence, KV head): ``window + group``."""
        return self.window + self.group

    @property
    def rk(self) -> int:
        """K record bytes."""
        return record_bytes(self.head_dim, self.keep_k)

    @property
    def rv(self) -> int:
        """V record bytes."""
        return record_bytes(self.head_dim, self.keep_v)

    @property
    def record_capacity(self) -> int:
        """Record slots per (sequence, KV head): ``n_compressed(capacity)`` rounded up to whole 16-token groups."""
        return -(-max(1, self.n_compressed(self.capacity)) // GROUP_TOKENS) * GROUP_TOKENS

    def n_compressed(self, length: int) -> int:
        """Tokens held as records after ``length`` tokens."""
        return n_compressed(length, self.window, self.group)

    def kv_bytes(self, length: int) -> int:
        """Bytes of K and V holding ``length`` tokens of one (sequence, KV head): records + window rows."""
        nc = self.n_compressed(length)
        return nc * (self.rk + self.rv) + (length - nc) * 2 * 2 * self.head_dim

    def memory_ratio(self, length: int) -> float:
        """:meth:`kv_bytes` over dense fp16 K and V of the same tokens."""
        return self.kv_bytes(length) / (length * 2 * 2 * self.head_dim)

    def check_lengths(self, lens: np.ndarray, what: str = "lens") -> np.ndarray:
        """Validated int32 lengths (0 ≤ L ≤ capacity)."""
        lens = np.asarray(lens)
        if lens.ndim != 1 or not np.issubdtype(lens.dtype, np.integer):
            raise EdgeSDKError(f"sparse_kv {what} must be a 1-D integer array, got {lens.dtype} {lens.shape}",
                               "pass one length per sequence")
        if lens.size and (lens.min() < 0 or lens.max() > self.capacity):
            raise EdgeSDKError(f"sparse_kv {what} {lens.tolist()} outside [0, capacity={self.capacity}]",
                               "raise SparseKVConfig.capacity or stop the sequence earlier")
        return lens.astype(np.int32)


def _grouped(shape: tuple[int, ...]) -> tuple[int, ...]:
    *lead, cap, r = shape
    if cap % GROUP_TOKENS:
        raise FormatError(f"sparse_kv records of shape {tuple(shape)}: {cap} record slots, not a multiple of "
                          f"{GROUP_TOKENS} (records are stored in groups of {GROUP_TOKENS} tokens)",
                          "allocate SparseKVConfig.record_capacity slots (state_shapes gives every state shape)")
    if r % CHUNK:
        raise FormatError(f"sparse_kv records of shape {tuple(shape)}: {r} bytes per record, not a multiple of "
                          f"{CHUNK}", "use SparseKVConfig.rk / rv (record_bytes) as the last dimension")
    return (*lead, cap // GROUP_TOKENS, GROUP_TOKENS, r // CHUNK, CHUNK)


def records_to_physical(records: np.ndarray) -> np.ndarray:
    """Records in token order ``[..., slots, R]`` → the stored layout (same shape): per group of 16 slots,
    8-byte unit ``k`` of slot ``t`` at ``128 k + 8 t`` of the group's ``16 R`` bytes."""
    records = np.asarray(records)
    g = _grouped(records.shape)
    return np.ascontiguousarray(records.reshape(g).swapaxes(-3, -2)).reshape(records.shape)


def records_to_logical(stored: np.ndarray) -> np.ndarray:
    """The stored layout ``[..., slots, R]`` → records in token order (``[..., t, :]`` is token t's record)."""
    stored = np.asarray(stored)
    *lead, ng, gt, nu, ch = _grouped(stored.shape)
    return np.ascontiguousarray(stored.reshape(*lead, ng, nu, gt, ch).swapaxes(-3, -2)).reshape(stored.shape)


def _put_record(stored: np.ndarray, b: int, t: int, recs: np.ndarray) -> None:
    """Write token t's records of sequence b (``[Hkv, R]``) into the stored layout in place."""
    B, H, cap, r = stored.shape
    view = stored.reshape(B, H, cap // GROUP_TOKENS, r // CHUNK, GROUP_TOKENS, CHUNK)
    view[b, :, t // GROUP_TOKENS, :, t % GROUP_TOKENS, :] = recs.reshape(H, r // CHUNK, CHUNK)


@dataclass
class SparseKVCache:
    """Host (numpy) model of the GPU cache: the same arrays, bytes and update rules.

    Attributes:
        config (SparseKVConfig): Geometry.
        k_rec, v_rec (np.ndarray): ``uint8 [B, Hkv, record_capacity, rk / rv]``, the stored (chunk-major) layout:
            the device's bytes; :func:`records_to_logical` gives the records in token order.
        k_ring, v_ring (np.ndarray): ``fp16 [B, Hkv, window + group, head_dim]``.
        lens (np.ndarray): ``int32 [B]`` tokens per sequence.
    """

    config: SparseKVConfig
    k_rec: np.ndarray
    v_rec: np.ndarray
    k_ring: np.ndarray
    v_ring: np.ndarray
    lens: np.ndarray

    @classmethod
    def empty(cls, config: SparseKVConfig, batch: int) -> "SparseKVCache":
        """A cache of ``batch`` empty sequences (arrays zero-filled)."""
        c, h = config, config.num_kv_heads
        return cls(c, np.zeros((batch, h, c.record_capacity, c.rk), np.uint8),
                   np.zeros((batch, h, c.record_capacity, c.rv), np.uint8),
                   np.zeros((batch, h, c.ring, c.head_dim), np.float16),
                   np.zeros((batch, h, c.ring, c.head_dim), np.float16), np.zeros(batch, np.int32))

    @classmethod
    def prefill(cls, config: SparseKVConfig, k: np.ndarray, v: np.ndarray, lens) -> "SparseKVCache":
        """Cache of prompts: ``k``/``v`` fp16 ``[B, Hkv, S, head_dim]``, ``lens[b] ≤ S`` valid tokens."""
        c = config
        k = np.asarray(k, np.float16)
        v = np.asarray(v, np.float16)
        if k.shape != v.shape or k.ndim != 4 or k.shape[1] != c.num_kv_heads or k.shape[3] != c.head_dim:
            raise EdgeSDKError(f"prefill K {k.shape} / V {v.shape} do not match [B, {c.num_kv_heads}, S, "
                               f"{c.head_dim}]", "pass K and V as [batch, kv_heads, tokens, head_dim] fp16")
        lens = c.check_lengths(lens)
        if lens.shape[0] != k.shape[0] or (lens.size and lens.max() > k.shape[2]):
            raise EdgeSDKError(f"prefill lens {lens.tolist()} do not fit K/V of {k.shape[2]} tokens, batch {k.shape[0]}",
                               "one length per sequence, each ≤ the tokens given")
        cache = cls.empty(c, k.shape[0])
        k_log, v_log = records_to_logical(cache.k_rec), records_to_logical(cache.v_rec)
        for b, L in enumerate(lens.tolist()):
            nc = c.n_compressed(L)
            k_log[b, :, :nc] = compress(k[b, :, :nc], c.keep_k)
            v_log[b, :, :nc] = compress(v[b, :, :nc], c.keep_v)
            if schedules(c.head_dim, c.keep_k, c.keep_v):
                schedule_records(k_log[b], v_log[b], c.keep_k, c.keep_v, 0, min(nc, k_log.shape[2]))
            for t in range(nc, L):
                cache.k_ring[b, :, t % c.ring] = k[b, :, t]
                cache.v_ring[b, :, t % c.ring] = v[b, :, t]
        cache.k_rec[:] = records_to_physical(k_log)
        cache.v_rec[:] = records_to_physical(v_log)
        cache.lens[:] = lens
        return cache

    def append(self, k_new: np.ndarray, v_new: np.ndarray) -> None:
        """Append one token per sequence (``fp16 [B, Hkv, head_dim]``), compressing a group when the
        window reaches ``window + group`` tokens (what ``sparse_kv_append`` does on the GPU)."""
        c = self.config
        if int(self.lens.max(initial=0)) + 1 > c.capacity:
            raise EdgeSDKError(f"sparse_kv cache is full (capacity {c.capacity})", "raise SparseKVConfig.capacity")
        self.lens += 1
        for b, L in enumerate(self.lens.tolist()):
            self.k_ring[b, :, (L - 1) % c.ring] = k_new[b]
            self.v_ring[b, :, (L - 1) % c.ring] = v_new[b]
            if L >= c.window + c.group and (L - c.window) % c.group == 0:
                t_lo, t_hi = L - c.window - c.group, min(L - c.window, self.k_rec.shape[2])
                for t in range(t_lo, t_hi):
                    _put_record(self.k_rec, b, t, compress(self.k_ring[b, :, t % c.ring], c.keep_k))
                    _put_record(self.v_rec, b, t, compress(self.v_ring[b, :, t % c.ring], c.keep_v))
                if schedules(c.head_dim, c.keep_k, c.keep_v) and t_hi > t_lo and L >= SCHEDULE_APPEND_FROM:
                    k_log, v_log = records_to_logical(self.k_rec[b]), records_to_logical(self.v_rec[b])
                    schedule_records(k_log, v_log, c.keep_k, c.keep_v, t_lo, t_hi)
                    self.k_rec[b] = records_to_physical(k_log)
                    self.v_rec[b] = records_to_physical(v_log)

    def dense(self) -> tuple[np.ndarray, np.ndarray]:
        """Pruned dense K, V ``fp16 [B, Hkv, max(lens), head_dim]`` (zeros past each length); validates
        every record in use."""
        c = self.config
        B, H = self.k_rec.shape[:2]
        T = int(self.lens.max(initial=0))
        k = np.zeros((B, H, T, c.head_dim), np.float16)
        v = np.zeros_like(k)
        k_log, v_log = records_to_logical(self.k_rec), records_to_logical(self.v_rec)
        for b, L in enumerate(self.lens.tolist()):
            nc = c.n_compressed(L)
            if nc > self.k_rec.shape[2]:
                raise FormatError(f"sequence {b}: {nc} compressed tokens exceed the {self.k_rec.shape[2]} "
                                  "record slots", _FIX)
            k[b, :, :nc] = decompress(k_log[b, :, :nc], c.head_dim, c.keep_k)
            v[b, :, :nc] = decompress(v_log[b, :, :nc], c.head_dim, c.keep_v)
            for t in range(nc, L):
                k[b, :, t] = self.k_ring[b, :, t % c.ring]
                v[b, :, t] = self.v_ring[b, :, t % c.ring]
        return k, v


# --- The graph node: EdgeSparseKVAttention (edgesdk.rewrite.sparse_kv puts one per attention layer) -------------
#
# One node per layer takes the layer's new tokens (q after RoPE, k after RoPE, v: ``[B, H, S, head_dim]``), the
# layer's cache state and the cached lengths, and gives the attention output and the updated state. Each of the S
# tokens is one decode step, in order: append token i (``sparse_kv_append``: ring row, and a group compressed when
# the window is full), then attend query i over the cache that now holds it (decode attention). So the node
# computes exactly what the kernels compute for S steps, a prompt included (token by token).
#
# State outputs have the shapes and dtypes of the state inputs; output 1 + i replaces input 3 + i (TensorRT
# aliases them: the cache is updated in place). Records travel as int8 (TensorRT takes UINT8 only at network I/O;
# same bytes), windows as fp16, ``lengths`` int32 ``[B]`` = tokens cached *after* the call (each sequence takes
# all S tokens, so ``lengths[b] >= S``).

OP_TYPE = "EdgeSparseKVAttention"
ATTRIBUTES: dict[str, type] = {"head_dim": int, "num_q_heads": int, "num_kv_heads": int, "k_sparsity": float,
                               "v_sparsity": float, "capacity": int, "window": int, "group": int, "scale": float}
INPUT_NAMES: tuple[str, ...] = ("q", "k", "v", "k_records", "v_records", "k_window", "v_window", "lengths")
STATE_NAMES: tuple[str, ...] = ("k_records", "v_records", "k_window", "v_window")
OUTPUT_NAMES: tuple[str, ...] = ("out",) + STATE_NAMES
STATE_DTYPES: dict[str, str] = {"k_records": "int8", "v_records": "int8", "k_window": "float16",
                                "v_window": "float16"}
#: Graph input holding the cached lengths after the call, shared by every layer's node.
LENGTHS_INPUT = "kv_lengths"


def state_io_names(layer: int) -> tuple[list[str], list[str]]:
    """``(inputs, outputs)``: the graph I/O names of layer ``layer``'s cache state (``past_sparse_kv.N.k_records``
    → ``present_sparse_kv.N.k_records``, ...)."""
    return ([f"past_sparse_kv.{layer}.{s}" for s in STATE_NAMES], [f"present_sparse_kv.{layer}.{s}" for s in STATE_NAMES])


def node_attributes(config: SparseKVConfig, scale: float) -> dict:
    """The node's attributes for ``config`` and the score scale."""
    c = config
    return {"head_dim": c.head_dim, "num_q_heads": c.num_q_heads, "num_kv_heads": c.num_kv_heads,
            "k_sparsity": float(c.k_sparsity), "v_sparsity": float(c.v_sparsity), "capacity": c.capacity,
            "window": c.window, "group": c.group, "scale": float(scale)}


def config_from_attributes(attrs: dict) -> tuple[SparseKVConfig, float]:
    """``(config, scale)`` of a node's attributes (strings of numbers accepted, as ONNX Runtime's Python ops pass
    floats); raises :class:`~edgesdk.errors.FormatError` naming a missing or malformed one."""
    fix = "rewrite the model with edgesdk.rewrite.sparse_kv (edgesdk kv-sparsify)"
    vals = {}
    for name, typ in ATTRIBUTES.items():
        if name not in attrs:
            raise FormatError(f"{OP_TYPE}: attribute {name!r} is missing", fix)
        v = attrs[name]
        try:
            vals[name] = typ(float(v)) if typ is float else int(v)
        except (TypeError, ValueError):
            raise FormatError(f"{OP_TYPE}: attribute {name!r} = {v!r} is not a number", fix) from None
    for k in ("k_sparsity", "v_sparsity"):  # stored as float32 (0.7 -> 0.699999988): back to what was asked
        vals[k] = round(vals[k], 6)
    scale = vals.pop("scale")
    if not np.isfinite(scale) or scale <= 0:
        raise FormatError(f"{OP_TYPE}: scale {scale} must be a positive number", fix)
    return SparseKVConfig(**vals), scale


def state_shapes(config: SparseKVConfig, batch: int) -> dict[str, tuple[int, ...]]:
    """Shape of each state tensor for ``batch`` sequences."""
    c, h = config, config.num_kv_heads
    return {"k_records": (batch, h, c.record_capacity, c.rk), "v_records": (batch, h, c.record_capacity, c.rv),
            "k_window": (batch, h, c.ring, c.head_dim), "v_window": (batch, h, c.ring, c.head_dim)}
