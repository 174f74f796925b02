"""Bitmap-sparse linear weights (``EdgeBitmapLinear``): pack, unpack, validate, node schema.

"Load as compressed, compute as dense": a weight matrix ``W [N, K]`` (``Y = X · Wᵀ``) is kept as a
bitmap of its nonzeros plus the packed nonzero values, in an order that a GPU warp decodes straight
into ``mma.sync.m16n8k16`` B fragments with one ``__popcll`` per 8×8 tile (``plugins/bitmap_linear``).

Byte layout, format_version 1 (all multi-byte numbers little-endian)
-------------------------------------------------------------------
Geometry: ``S = ceil(N / 8)`` **strips** of 8 output channels (rows of W), ``G = ceil(K / 64)``
**groups** of 64 input channels per strip. A group (8 rows × 64 columns) is 8 **tiles** of 8×8; tile
``t`` of group ``g`` covers columns ``64g + 8t … 64g + 8t + 7``. Rows ``n ≥ N`` and columns ``k ≥ K``
are padding: their bits are always 0 (they cost bitmap bits only).

``bitmaps``  int8 ``[S·G·8·8]``: one uint64 per tile, tiles in order (strip, group, tile). Bit
    ``b = 8·r + c`` of a tile is set iff ``W[8s + r, 64g + 8t + c]`` is stored (r = row in the strip,
    c = column in the tile). In an ``m16n8k16`` B fragment, lane ``l`` holds bits ``2l`` and ``2l+1``
    of the tile, so its value index is ``popcount(bitmap & ((1 << 2l) - 1))``.
``values``   int8 ``[offsets[-1] · itemsize]``: raw bytes of the stored values, fp16 or int8. Each group
    holds the nonzeros of its 8 tiles in tile order, bit order inside a tile, then zero padding up to
    a multiple of 16 bytes (8 fp16 or 16 int8 values), so every group starts 16-byte aligned.
``offsets``  int32 ``[S·G + 1]``: index (in values, not bytes) where each group starts; ``offsets[0] =
    0``, ``offsets[i+1] - offsets[i] = roundup(popcount(group i), 8 or 16)``; the last entry is the
    total. Groups of one strip are contiguous, so a warp streams a strip's K range as one byte range.
``scales``   float32 ``[N]``: per-output-channel scale: ``W[n, k] = scales[n] · value``. Int8 values use
    symmetric per-channel scales (``max|W[n, :]| / 127``); fp16 values use 1.0 unless given.
``bias``     float32 ``[N]``, present iff attribute ``has_bias`` is 1.

A bit is set exactly where the stored value (fp16, or int8 after quantization) is nonzero, so
sparsity 1.0 is all-zero bitmaps and empty values, sparsity 0.0 is dense. Bytes per 64 weights:
8 (bitmap) + nnz · itemsize + padding (< 16 bytes per 512 weights) + 4 / 8 (offset). At random 50 %
sparsity that is ≈ 0.57 of dense fp16 for fp16 values and ≈ 0.32 for int8 values
(:func:`expected_nbytes`). ``docs/bitmap_linear.md`` has a worked example.

ONNX node (domain ``edgesdk``): inputs ``[X, bitmaps, values, offsets, scales, (bias)]``, output ``Y``;
X is fp16 or fp32 ``[..., K]`` (rank ≥ 2), Y has X's dtype and shape ``[..., N]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from edgesdk.errors import FormatError

OP_TYPE = "EdgeBitmapLinear"
DOMAIN = "edgesdk"
FORMAT_VERSION = 1
#: Node inputs after X, in order; ``bias`` (the last) is present only if ``has_bias`` == 1.
TENSOR_NAMES: tuple[str, ...] = ("bitmaps", "values", "offsets", "scales", "bias")
#: Node attributes = TensorRT plugin fields.
ATTRIBUTES: dict[str, type] = {
    "n": int,
    "k": int,
    "value_dtype": str,
    "has_bias": int,
    "format_version": int,
}
VALUE_DTYPES = ("float16", "int8")

STRIP = 8  # rows of W per strip (= n of an m16n8k16 B fragment)
TILE_K = 8  # columns per tile
GROUP_K = 64  # columns per group (8 tiles)
TILES_PER_GROUP = GROUP_K // TILE_K
GROUP_ALIGN_BYTES = 16  # every group's values start 16-byte aligned (cp.async 16 B)
_FIX = "re-pack the weights with edgesdk.formats.bitmap_linear.BitmapLinearWeights.pack"


def geometry(n: int, k: int) -> tuple[int, int]:
    """(strips, groups) = (ceil(n / 8), ceil(k / 64))."""
    return -(-n // STRIP), -(-k // GROUP_K)


def value_align(value_dtype: str) -> int:
    """Values per 16-byte group alignment unit: 8 for fp16, 16 for int8."""
    return GROUP_ALIGN_BYTES // np.dtype(value_dtype).itemsize


def input_names(attrs: dict) -> tuple[str, ...]:
    """The weight inputs a node with ``attrs`` takes after X (``bias`` only if ``has_bias``)."""
    return TENSOR_NAMES if int(attrs.get("has_bias", 0)) else TENSOR_NAMES[:-1]


def output_shape(x_shape: tuple, attrs: dict) -> tuple:
    """Y's shape for X of shape ``[..., K]``."""
    return (*tuple(x_shape)[:-1], int(attrs["n"]))


def _tile_view(a: np.ndarray, s: int, g: int) -> np.ndarray:
    """[S*8, G*64] → [S, G, tile, 64] in storage order (strip, group, tile, bit = 8·row + col)."""
    return a.reshape(s, STRIP, g, TILES_PER_GROUP, TILE_K).transpose(0, 2, 3, 1, 4).reshape(
        s, g, TILES_PER_GROUP, STRIP * TILE_K)


def _untile(t: np.ndarray, s: int, g: int) -> np.ndarray:
    return t.reshape(s, g, TILES_PER_GROUP, STRIP, TILE_K).transpose(0, 3, 1, 2, 4).reshape(
        s * STRIP, g * GROUP_K)


@dataclass
class BitmapLinearWeights:
    """Packed bitmap-sparse weights of one linear layer (see the module docstring for the layout).

    Attributes:
        n (int): Output channels (rows of W).
        k (int): Input channels (columns of W).
        value_dtype (str): ``"float16"`` or ``"int8"``.
        bitmaps (np.ndarray): uint64 ``[S·G·8]``, one per tile.
        values (np.ndarray): float16 or int8 ``[offsets[-1]]``.
        offsets (np.ndarray): int32 ``[S·G + 1]``.
        scales (np.ndarray): float32 ``[n]``.
        bias (np.ndarray | None): float32 ``[n]`` or None.
    """

    n: int
    k: int
    value_dtype: str
    bitmaps: np.ndarray
    values: np.ndarray
    offsets: np.ndarray
    scales: np.ndarray
    bias: np.ndarray | None = field(default=None)

    # ---------------------------------------------------------------- packing
    @classmethod
    def pack(cls, w: np.ndarray, value_dtype: str = "float16", scales: np.ndarray | None = None,
             bias: np.ndarray | None = None) -> "BitmapLinearWeights":
        """Pack a dense weight matrix whose zeros are the pruned weights.

        Args:
            w (np.ndarray): Float weights ``[N, K]`` (``Y = X · Wᵀ``); exact zeros are not stored.
            value_dtype (str): ``"float16"`` (values rounded to fp16) or ``"int8"`` (symmetric
                per-output-channel quantization, ``round(W / scale)`` clipped to ±127).
            scales (np.ndarray | None): float32 ``[N]`` per-channel scales. For int8 they default to
                ``max|W[n, :]| / 127`` (1.0 for an all-zero row); for fp16 to 1.0 (values are then
                ``W / scale`` rounded to fp16).
            bias (np.ndarray | None): Optional float ``[N]``.

        Returns:
            BitmapLinearWeights: The packed weights.

        Raises:
            FormatError: On a bad shape, dtype, non-finite weights or non-positive scales.
        """
        if value_dtype not in VALUE_DTYPES:
            raise FormatError(f"value_dtype {value_dtype!r} is not supported",
                              f"use one of {VALUE_DTYPES}")
        w = np.asarray(w)
        if w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 1 or w.dtype.kind != "f":
            raise FormatError(f"weights must be a non-empty float matrix [N, K], got {w.dtype} {w.shape}",
                              "pass the layer's weight as [out_features, in_features]")
        if not np.isfinite(w).all():
            raise FormatError("weights contain NaN or Inf", "fix the model's weights before packing")
        n, k = w.shape
        if scales is None:
            if value_dtype == "int8":
                amax = np.abs(w).max(axis=1).astype(np.float64)
                scales = np.where(amax > 0, amax / 127.0, 1.0)
            else:
                scales = np.ones(n)
        scales = np.asarray(scales, dtype=np.float32).reshape(-1)
        if scales.shape != (n,) or not np.isfinite(scales).all() or (scales <= 0).any():
            raise FormatError(f"scales must be {n} finite positive numbers, got shape {scales.shape}",
                              "pass one positive scale per output channel, or none")
        # Divide in w's own precision (at least fp32) and round once to the value dtype.
        q = w if (scales == 1).all() else w / scales.astype(np.result_type(w.dtype, np.float32))[:, None]
        if value_dtype == "int8":
            vals = np.clip(np.rint(q), -127, 127).astype(np.int8)
        else:
            if np.abs(q).max(initial=0.0) > np.finfo(np.float16).max:
                raise FormatError("weights / scales exceed the fp16 range (65504)",
                                  "use value_dtype='int8' or pass larger per-channel scales")
            vals = q.astype(np.float16)
        s, g = geometry(n, k)
        padded = np.zeros((s * STRIP, g * GROUP_K), dtype=vals.dtype)
        padded[:n, :k] = vals
        tiles = _tile_view(padded, s, g)  # [S, G, 8, 64] (a copy in storage order)
        mask = tiles != 0
        bitmaps = np.packbits(mask, axis=-1, bitorder="little").view("<u8").reshape(-1)
        counts = mask.reshape(s * g, -1).sum(axis=1, dtype=np.int64)
        a = value_align(value_dtype)
        offsets = np.zeros(s * g + 1, dtype=np.int64)
        np.cumsum(-(-counts // a) * a, out=offsets[1:])
        if offsets[-1] >= 2**31:
            raise FormatError(f"layer {n}x{k} has too many nonzeros for int32 offsets",
                              "split the layer along its output channels")
        values = np.zeros(int(offsets[-1]), dtype=vals.dtype)
        values[_value_slots(offsets, counts)] = tiles[mask]
        b = None if bias is None else np.asarray(bias, dtype=np.float32).reshape(-1)
        out = cls(n, k, value_dtype, bitmaps, values, offsets.astype(np.int32), scales, b)
        if b is not None:
            out._check_vector("bias", b)
        return out

    def unpack(self) -> np.ndarray:
        """Dense float32 weights ``[N, K]`` (``scales[n] · value``, zeros where pruned)."""
        return (self.raw_values() * self.scales[:, None]).astype(np.float32)

    def raw_values(self) -> np.ndarray:
        """Dense stored values ``[N, K]`` as float64 before scaling (the fp16 or int8 numbers)."""
        s, g = geometry(self.n, self.k)
        mask = np.unpackbits(self.bitmaps.view(np.uint8), bitorder="little").view(bool)
        counts = mask.reshape(s * g, -1).sum(axis=1, dtype=np.int64)
        tiles = np.zeros(mask.size, dtype=np.float64)
        tiles[mask] = self.values[_value_slots(self.offsets.astype(np.int64), counts)]
        return _untile(tiles, s, g)[: self.n, : self.k]

    # ---------------------------------------------------------------- sizes / schema
    @property
    def nbytes(self) -> int:
        """All bytes of the packed layer: bitmaps, values, offsets, scales, bias."""
        return sum(t.nbytes for t in self.to_tensors().values())

    @property
    def density(self) -> float:
        """Fraction of stored (nonzero) weights."""
        return int(np.unpackbits(self.bitmaps.view(np.uint8)).sum()) / (self.n * self.k)

    def node_attributes(self) -> dict:
        """Node attributes / TensorRT plugin fields (``ATTRIBUTES``)."""
        return {"n": self.n, "k": self.k, "value_dtype": self.value_dtype,
                "has_bias": int(self.bias is not None), "format_version": FORMAT_VERSION}

    def to_tensors(self) -> dict[str, np.ndarray]:
        """Node inputs after X: raw bytes as int8, offsets int32, scales/bias float32."""
        t = {
            "bitmaps": self.bitmaps.view(np.int8),
            "values": self.values.view(np.int8),
            "offsets": self.offsets.astype(np.int32),
            "scales": self.scales.astype(np.float32),
        }
        if self.bias is not None:
            t["bias"] = self.bias.astype(np.float32)
        return t

    # ---------------------------------------------------------------- validation
    @classmethod
    def from_tensors(cls, attrs: dict, tensors: dict[str, np.ndarray]) -> "BitmapLinearWeights":
        """Rebuild from node attributes and input tensors, validating everything.

        Checks attribute types and ranges, tensor dtypes and lengths, monotone 16-byte-aligned
        offsets that match each group's popcount, no bits in padding rows/columns, finite positive
        scales and finite bias. Nothing is indexed before its length is checked.

        Raises:
            FormatError: Naming the first inconsistency found.
        """
        for name, typ in ATTRIBUTES.items():
            if name not in attrs:
                raise FormatError(f"{OP_TYPE}: attribute {name!r} is missing", _FIX)
            v = attrs[name]
            if isinstance(v, bytes):
                v = v.decode()
            if typ is int and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                raise FormatError(f"{OP_TYPE}: attribute {name!r} must be an int, got {v!r}", _FIX)
            if typ is str and not isinstance(v, str):
                raise FormatError(f"{OP_TYPE}: attribute {name!r} must be a string, got {v!r}", _FIX)
        n, k = int(attrs["n"]), int(attrs["k"])
        vd = attrs["value_dtype"].decode() if isinstance(attrs["value_dtype"], bytes) else attrs["value_dtype"]
        has_bias, version = int(attrs["has_bias"]), int(attrs["format_version"])
        if version != FORMAT_VERSION:
            raise FormatError(f"{OP_TYPE}: format_version {version} is not supported (this edgesdk reads "
                              f"{FORMAT_VERSION})", "re-pack the weights with this edgesdk version")
        if n < 1 or k < 1:
            raise FormatError(f"{OP_TYPE}: n={n}, k={k} must be positive", _FIX)
        if vd not in VALUE_DTYPES:
            raise FormatError(f"{OP_TYPE}: value_dtype {vd!r} is not one of {VALUE_DTYPES}", _FIX)
        if has_bias not in (0, 1):
            raise FormatError(f"{OP_TYPE}: has_bias must be 0 or 1, got {has_bias}", _FIX)
        names = TENSOR_NAMES if has_bias else TENSOR_NAMES[:-1]
        missing = [t for t in names if t not in tensors]
        if missing:
            raise FormatError(f"{OP_TYPE}: tensors {missing} are missing", _FIX)
        s, g = geometry(n, k)

        def arr(name, dtype, length=None):
            a = np.asarray(tensors[name])
            if a.dtype != np.dtype(dtype):
                raise FormatError(f"{OP_TYPE}: tensor {name!r} must be {np.dtype(dtype).name}, got {a.dtype}",
                                  _FIX)
            a = a.reshape(-1)
            if length is not None and a.size != length:
                raise FormatError(f"{OP_TYPE}: tensor {name!r} has {a.size} elements, expected {length} "
                                  f"for n={n}, k={k}", _FIX)
            return a

        bitmaps = arr("bitmaps", np.int8, s * g * TILES_PER_GROUP * 8).view("<u8").copy()
        offsets = arr("offsets", np.int32, s * g + 1).astype(np.int64)
        scales = arr("scales", np.float32, n).copy()
        bias = arr("bias", np.float32, n).copy() if has_bias else None
        a = value_align(vd)
        d = np.diff(offsets)
        if offsets[0] != 0 or (d < 0).any():
            raise FormatError(f"{OP_TYPE}: offsets must start at 0 and never decrease", _FIX)
        if (d % a).any():
            raise FormatError(f"{OP_TYPE}: group sizes must be multiples of {a} values (16 bytes)", _FIX)
        bits = np.unpackbits(bitmaps.view(np.uint8), bitorder="little").astype(bool)
        counts = bits.reshape(s * g, -1).sum(axis=1, dtype=np.int64)
        bad = np.flatnonzero(d != -(-counts // a) * a)
        if bad.size:
            i = int(bad[0])
            raise FormatError(f"{OP_TYPE}: group {i} (strip {i // g}, group {i % g}) holds {int(d[i])} values "
                              f"but its bitmaps have {int(counts[i])} bits set", _FIX)
        grid = _untile(bits, s, g)
        if grid[n:, :].any() or grid[:, k:].any():
            raise FormatError(f"{OP_TYPE}: bitmaps set bits outside the {n}x{k} matrix (padding)", _FIX)
        itemsize = np.dtype(vd).itemsize
        raw = arr("values", np.int8, int(offsets[-1]) * itemsize).copy()
        values = raw.view(vd)
        out = cls(n, k, vd, bitmaps, values, offsets.astype(np.int32), scales, bias)
        out._check_vector("scales", scales, positive=True)
        if bias is not None:
            out._check_vector("bias", bias)
        if vd == "float16" and not np.isfinite(values).all():
            raise FormatError(f"{OP_TYPE}: values contain NaN or Inf", _FIX)
        return out

    def _check_vector(self, name: str, v: np.ndarray, positive: bool = False) -> None:
        if v.shape != (self.n,) or not np.isfinite(v).all() or (positive and (v <= 0).any()):
            what = "finite positive" if positive else "finite"
            raise FormatError(f"{OP_TYPE}: {name} must be {self.n} {what} float32 numbers", _FIX)


def _value_slots(offsets: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Index in ``values`` of every stored weight, in storage order (skipping group padding)."""
    pad_before = offsets[:-1] - (np.cumsum(counts) - counts)
    return np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(pad_before, counts)


# -------------------------------------------------------------------- byte model
def dense_fp16_bytes(n: int, k: int) -> int:
    """Bytes of the dense fp16 weight matrix (what cuBLAS reads)."""
    return 2 * n * k


def expected_nbytes(n: int, k: int, sparsity: float, value_dtype: str = "float16",
                    has_bias: bool = False) -> float:
    """Expected :attr:`BitmapLinearWeights.nbytes` for i.i.d. random pruning at ``sparsity``.

    Exact expectation over the binomial nonzero count of each group (group padding included).
    """
    s, g = geometry(n, k)
    p = 1.0 - sparsity
    a = value_align(value_dtype)
    item = np.dtype(value_dtype).itemsize

    def padded(cells: int) -> float:  # E[roundup(Binomial(cells, p), a)]
        if p <= 0.0 or cells == 0:
            return 0.0
        if p >= 1.0:
            return float(-(-cells // a) * a)
        j = np.arange(cells + 1)
        logpmf = (np.array([math.lgamma(cells + 1) - math.lgamma(x + 1) - math.lgamma(cells - x + 1)
                            for x in j]) + j * math.log(p) + (cells - j) * math.log1p(-p))
        return float((np.exp(logpmf) * (-(-j // a) * a)).sum())

    rows_last = n - (s - 1) * STRIP
    cols_last = k - (g - 1) * GROUP_K
    vals = ((s - 1) * (g - 1) * padded(STRIP * GROUP_K) + (s - 1) * padded(STRIP * cols_last)
            + (g - 1) * padded(rows_last * GROUP_K) + padded(rows_last * cols_last))
    return (s * g * TILES_PER_GROUP * 8 + vals * item + 4 * (s * g + 1) + 4 * n
            + (4 * n if has_bias else 0))
