"""VitBit INT8 GEMM (``EdgeVitBitGemm``): packed weights, the core split, and the packed-field layout.

The node computes, for X fp16 or fp32 ``[..., K]`` and int8 weights ``W [N, K]`` with per-output-channel
scales (exact semantics in :mod:`edgesdk.reference.vitbit_gemm`)::

    q   = clip(round_half_even(float32(X) / float32(x_scale)), -128, 127)      # int8, NaN -> 0
    acc = q @ W^T                                                               # exact integer
    y   = float32(acc) * (float32(x_scale) * w_scale[n])  (+ bias[n]) (GELU)   # fp32, no FMA
    Y   = y cast to y_dtype, or to X's dtype where y_dtype is ""

X may also be int8: q itself, already quantized with ``x_scale`` (the output of the graph's QuantizeLinear,
which TensorRT can fuse into the layer producing X, while a plugin cannot absorb it). Such a node must set
``y_dtype`` ("float16" or "float32"); for a float X, ``y_dtype`` is "" or X's dtype.

Stored tensors (node inputs after X, in order; the last only when ``has_bias`` == 1)::

    weight   int8    [N, K16]  K16 = K rounded up to 16 (16-byte rows for cp.async); pad columns are 0
    w_scale  float32 [N]       > 0, finite
    bias     float32 [N]       finite

The weights are stored once, as int8, whatever ``bits`` is (4, 5 or 8: the value range the weights
obey). No float copy is stored: the FP-core warps convert int8 on chip (exactly, by the 2^23 magic-number
trick), so a float copy would cost 4 bytes per weight for no measured gain.

The split of the GEMM between cores (VitBit's m and n) is not part of the stored format: it is a
tactic, :class:`CoreSplit`, chosen per layer at build time. Every block tile of output columns is cut
into a tensor-core share (mma.sync m16n8k32), an INT-core share (``dp4a`` on 4 x int8 words for 8-bit
weights, or packed 16-bit fields for 4/5-bit weights, :func:`field_layout`) and an FP-core share
(int8 converted to fp32, FFMA, flushed to int32 every :func:`fp_chunk` values of K). All three are exact.

Integer bounds (the kernel accumulates in int32):
    |q * w| <= 128 * 128 = 2^14, so |acc| <= K * 2^14. The largest value, K * 2^14 (all q = w = -128),
    fits in int32 iff K * 2^14 <= 2^31 - 1, i.e. K <= (2^31 - 1) // 2^14 = 131071 (= :data:`K_MAX`;
    K = 2^31 / 128^2 = 131072 would overflow by one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgesdk.errors import FormatError

OP_TYPE = "EdgeVitBitGemm"
TENSOR_NAMES: tuple[str, ...] = ("weight", "w_scale", "bias")
ATTRIBUTES: dict[str, type] = {
    "n": int,          # output features N
    "k": int,          # input features K (X's last dim)
    "bits": int,       # weight value range: 8 -> [-128, 127], 5 -> [-16, 15], 4 -> [-8, 7]
    "x_scale": float,  # calibrated per-tensor activation scale (> 0)
    "has_bias": int,   # 1 -> a bias input follows w_scale
    "gelu": int,       # 1 -> exact (erf) GELU after the bias (fc1)
    "y_dtype": str,    # Y's dtype: "float16" / "float32" (required for an int8 X), "" = X's dtype
}
#: Attributes a node may omit (nodes written before they existed), with their value then.
ATTRIBUTE_DEFAULTS: dict[str, object] = {"y_dtype": ""}
#: dtypes of X: float (quantized on chip with x_scale) or int8 (already quantized with x_scale).
X_DTYPES = ("float16", "float32", "int8")
Y_DTYPES = ("float16", "float32")
SUPPORTED_BITS = (4, 5, 8)
K_ALIGN = 16
K_MAX = (2**31 - 1) // (128 * 128)  # 131071: int32 accumulation cannot overflow (module docstring)
N_MAX = 2**24


def k_padded(k: int) -> int:
    """Row length of the stored weight: ``k`` rounded up to a multiple of 16 bytes."""
    return -(-int(k) // K_ALIGN) * K_ALIGN


def weight_range(bits: int) -> tuple[int, int]:
    """Inclusive int range of ``bits``-bit signed weights."""
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


# --------------------------------------------------------------------------------------------------
# Packed fields for the INT-core share with sub-8-bit weights.
#
# VitBit's policy (paper Fig. 3) sizes a field for the product of two b-bit values (2b bits): 6-8 bits ->
# 2 per register, 5 bits -> 3, <= 4 bits -> 4, and it never accumulates more than one product per field.
# Our activations are int8, so a product of a b-bit weight and an int8 activation needs b + 8 bits
# (max |w q| = 2^(b-1) * 2^7 = 2^(b+6), reached only positively by (-2^(b-1)) * (-128)); for b in {4, 5}
# that is 12-13 bits, so the same rule ("a field holds a whole product plus headroom") gives two 16-bit
# fields per 32-bit register. A register holds the weights of two adjacent output columns:
#
#     P = w[n0] + 2^16 * w[n1]          (mod 2^32)
#
# and one 32-bit multiply-add ``acc += q * P`` (mod 2^32) does two MACs: acc = v0 + 2^16 v1 (mod 2^32),
# with v_j the partial dot products of column n_j.
#
# Extraction (exact): if v0, v1 are in [-2^15, 2^15), then v0 = sext16(acc & 0xffff) and
# v1 = (int32)(acc - v0) >> 16. Proof: acc - v0 = 2^16 v1 (mod 2^32) and 2^16 v1 is in [-2^31, 2^31), so
# the int32 value of (acc - v0) is exactly 2^16 v1 and the arithmetic shift is exact; v0 is the unique
# representative of acc mod 2^16 in [-2^15, 2^15). Wraparound of acc itself is harmless.
#
# Bound: after T multiply-adds, v_j lies in [-T * 2^(b-1) * 127, T * 2^(b+6)], so it is safe while
# T * 2^(b+6) <= 2^15 - 1:  T = floor(32767 / 2^(b+6)) = 31 for b = 4, 15 for b = 5 (and 1 for b = 8,
# which is why 8-bit weights use dp4a: 4 exact MACs per instruction into a full int32).
# The kernel extracts into int32 accumulators every T values of K ("flush_every").
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldLayout:
    """How the INT-core share packs sub-8-bit weights: ``fields`` per 32-bit word, ``field_bits`` each,
    extracted every ``flush_every`` multiply-adds (the proven bound)."""

    bits: int
    fields: int
    field_bits: int
    flush_every: int


def field_layout(bits: int) -> FieldLayout:
    """Packed-field layout for ``bits``-bit weights times int8 activations (see the proof above)."""
    if bits not in (4, 5):
        raise FormatError(f"packed fields are defined for 4- and 5-bit weights, not {bits}-bit",
                          "use bits=8 (dp4a path) or quantize the weights to 4 or 5 bits")
    max_product = 1 << (bits + 6)
    return FieldLayout(bits=bits, fields=2, field_bits=16, flush_every=((1 << 15) - 1) // max_product)


def pack_fields(w: np.ndarray, bits: int) -> np.ndarray:
    """Pack weights ``[N, K]`` into uint32 words ``[ceil(N/2), K]``: word ``[j, k]`` holds
    ``w[2j, k] + 2^16 * w[2j+1, k]`` (mod 2^32); an odd last column pairs with 0."""
    field_layout(bits)
    w = np.asarray(w)
    lo, hi = weight_range(bits)
    if w.ndim != 2 or not np.issubdtype(w.dtype, np.integer) or w.size and (w.min() < lo or w.max() > hi):
        raise FormatError(f"pack_fields needs integer weights [N, K] in [{lo}, {hi}]",
                          f"quantize the weights to {bits} bits first")
    w = w.astype(np.int64)
    if w.shape[0] % 2:
        w = np.concatenate([w, np.zeros((1, w.shape[1]), np.int64)])
    return ((w[0::2] + (w[1::2] << 16)) & 0xFFFFFFFF).astype(np.uint32)


def unpack_fields(words: np.ndarray, n: int) -> np.ndarray:
    """Inverse of :func:`pack_fields` for one multiply-add's worth of fields: int64 ``[n, K]``."""
    acc = np.asarray(words, dtype=np.uint32)
    v0, v1 = extract_fields(acc)
    out = np.empty((2 * acc.shape[0],) + acc.shape[1:], np.int64)
    out[0::2], out[1::2] = v0, v1
    return out[:n]


def extract_fields(acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(v0, v1) from packed uint32 accumulators, exactly as the kernel does it (valid within the bound)."""
    acc = np.asarray(acc, dtype=np.uint32).astype(np.int64)
    v0 = ((acc & 0xFFFF) ^ 0x8000) - 0x8000
    d = (acc - v0) & 0xFFFFFFFF
    v1 = ((d ^ 0x80000000) - 0x80000000) >> 16
    return v0, v1


def fp_chunk(bits: int = 8) -> int:
    """FP-core share: values of K summed in fp32 before flushing to int32.

    fp32 represents every integer of magnitude <= 2^24, so FFMA accumulation of integer products is
    exact while every partial sum stays within 2^24. With |q w| <= 2^(bits+6), a chunk of
    2^24 / 2^(bits+6) = 2^(18-bits) values is safe: 1024 for 8-bit weights (128 * 128 * 1024 = 2^24
    exactly; the issue's 2^24/127^2 = 1040 forgets (-128)(-128)), 16384 for 4-bit.
    """
    if bits not in SUPPORTED_BITS:
        raise FormatError(f"unsupported bits={bits}", f"use one of {SUPPORTED_BITS}")
    return 1 << (18 - bits)


@dataclass(frozen=True)
class CoreSplit:
    """Columns of one block tile given to each core type (VitBit's m = tc / (int + fp), n ~ int : fp).

    The output's N columns are cut into block tiles of ``tc + int_ + fp`` columns; inside a tile, the
    first ``tc`` columns go to tensor-core warps, the next ``int_`` to INT-core warps, the last ``fp`` to
    FP-core warps. A tactic, not a stored property: every split gives the same, exact result.
    """

    tc: int
    int_: int = 0
    fp: int = 0

    @property
    def width(self) -> int:
        return self.tc + self.int_ + self.fp

    def roles(self, n: int) -> np.ndarray:
        """Role of each of ``n`` output columns: 0 tensor core, 1 INT core, 2 FP core."""
        c = np.arange(n) % self.width
        return np.where(c < self.tc, 0, np.where(c < self.tc + self.int_, 1, 2)).astype(np.int8)


# --------------------------------------------------------------------------------------------------
# Packed weights
# --------------------------------------------------------------------------------------------------


def _fail(problem: str, fix: str) -> FormatError:
    return FormatError(f"EdgeVitBitGemm: {problem}", fix)


def _check_x_scale(x_scale) -> float:
    s = np.float32(x_scale)
    if not (np.isfinite(s) and s > 0 and s >= np.finfo(np.float32).tiny):
        raise _fail(f"x_scale must be a positive, normal float32, got {x_scale!r}",
                    "recalibrate the activation scale of this layer")
    return float(s)


def _check_y_dtype(y_dtype) -> str:
    if isinstance(y_dtype, bytes):
        y_dtype = y_dtype.decode()
    if y_dtype not in ("",) + Y_DTYPES:
        raise _fail(f"y_dtype must be '', 'float16' or 'float32', got {y_dtype!r}",
                    "rewrite the node with edgesdk")
    return str(y_dtype)


def _check_dims(n, k) -> tuple[int, int]:
    if not (isinstance(n, (int, np.integer)) and 1 <= n <= N_MAX):
        raise _fail(f"n must be an int in [1, {N_MAX}], got {n!r}", "fix the layer's output size")
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= K_MAX):
        raise _fail(f"k must be an int in [1, {K_MAX}] (int32 accumulation bound), got {k!r}",
                    "split the layer along K into several GEMMs")
    return int(n), int(k)


@dataclass
class VitBitWeights:
    """Packed weights and attributes of one ``EdgeVitBitGemm`` node.

    Attributes:
        weight (np.ndarray): int8 ``[n, k_padded(k)]``, pad columns zero.
        w_scale (np.ndarray): float32 ``[n]`` per-output-channel scales.
        bias (np.ndarray | None): float32 ``[n]`` or None.
        k (int): input features.
        bits (int): weight bit width (4, 5 or 8).
        x_scale (float): per-tensor activation scale.
        gelu (bool): fused GELU after the bias.
        y_dtype (str): Y's dtype ("float16"/"float32"; required for an int8 X), "" = X's dtype.
    """

    weight: np.ndarray
    w_scale: np.ndarray
    bias: np.ndarray | None
    k: int
    bits: int = 8
    x_scale: float = 1.0
    gelu: bool = False
    y_dtype: str = ""
    _validated: bool = field(default=False, repr=False)

    def __post_init__(self):
        if not self._validated:
            self._validate()
            self._validated = True

    @property
    def n(self) -> int:
        return int(self.weight.shape[0])

    @classmethod
    def pack(cls, w_q: np.ndarray, w_scale: np.ndarray, bits: int = 8, *, bias: np.ndarray | None = None,
             x_scale: float = 1.0, gelu: bool = False, y_dtype: str = "") -> "VitBitWeights":
        """Pack int weights ``w_q [N, K]`` (values within ``bits`` bits) with scales ``w_scale [N]``.

        Raises:
            FormatError: on wrong shapes, dtypes, ranges, non-finite or non-positive scales.
        """
        w_q = np.asarray(w_q)
        if w_q.ndim != 2 or not np.issubdtype(w_q.dtype, np.integer):
            raise _fail(f"w_q must be a 2-D integer array [N, K], got {w_q.dtype} {w_q.shape}",
                        "pass the quantized weights (e.g. from quantize_weights)")
        n, k = _check_dims(*w_q.shape)
        if bits not in SUPPORTED_BITS:
            raise _fail(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}", "choose 4, 5 or 8")
        lo, hi = weight_range(bits)
        if w_q.min() < lo or w_q.max() > hi:
            raise _fail(f"weights outside the {bits}-bit range [{lo}, {hi}] "
                        f"(min {w_q.min()}, max {w_q.max()})", f"requantize to {bits} bits or raise bits")
        weight = np.zeros((n, k_padded(k)), np.int8)
        weight[:, :k] = w_q
        ws = np.asarray(w_scale, dtype=np.float32).reshape(-1) if np.ndim(w_scale) else None
        b = None if bias is None else np.asarray(bias, dtype=np.float32).reshape(-1)
        if ws is None:
            raise _fail("w_scale must be an array [N]", "pass one scale per output channel")
        return cls(weight=weight, w_scale=ws, bias=b, k=k, bits=int(bits), x_scale=_check_x_scale(x_scale),
                   gelu=bool(gelu), y_dtype=_check_y_dtype(y_dtype))

    def _validate(self) -> None:
        w = self.weight
        if not isinstance(w, np.ndarray) or w.dtype != np.int8 or w.ndim != 2:
            raise _fail(f"weight must be int8 [N, K16], got {getattr(w, 'dtype', type(w))} "
                        f"{getattr(w, 'shape', '')}", "repack the layer with VitBitWeights.pack")
        n, k = _check_dims(w.shape[0], self.k)
        if self.bits not in SUPPORTED_BITS:
            raise _fail(f"bits must be one of {SUPPORTED_BITS}, got {self.bits!r}", "choose 4, 5 or 8")
        if w.shape[1] != k_padded(k):
            raise _fail(f"weight has {w.shape[1]} columns, expected k rounded up to 16 = {k_padded(k)}",
                        "repack the layer; the weight tensor does not match attribute k")
        if k < w.shape[1] and np.any(w[:, k:]):
            raise _fail("weight pad columns (beyond k) are not zero", "repack the layer: the tensor is corrupted")
        lo, hi = weight_range(self.bits)
        if w.size and (int(w.min()) < lo or int(w.max()) > hi):
            raise _fail(f"weight values outside the {self.bits}-bit range [{lo}, {hi}]",
                        "repack with the right bits attribute: the tensor is corrupted or mislabelled")
        s = self.w_scale
        if not isinstance(s, np.ndarray) or s.dtype != np.float32 or s.shape != (n,):
            raise _fail(f"w_scale must be float32 [{n}], got {getattr(s, 'dtype', type(s))} "
                        f"{getattr(s, 'shape', '')}", "pass one float32 scale per output channel")
        if not np.all(np.isfinite(s) & (s > 0)):
            raise _fail("w_scale has non-finite or non-positive values", "recompute the per-channel scales")
        if self.bias is not None:
            b = self.bias
            if not isinstance(b, np.ndarray) or b.dtype != np.float32 or b.shape != (n,):
                raise _fail(f"bias must be float32 [{n}], got {getattr(b, 'dtype', type(b))} "
                            f"{getattr(b, 'shape', '')}", "pass one float32 bias per output channel")
            if not np.all(np.isfinite(b)):
                raise _fail("bias has non-finite values", "check the model's bias initializer")
        self.x_scale = _check_x_scale(self.x_scale)
        self.y_dtype = _check_y_dtype(self.y_dtype)

    @property
    def alpha(self) -> np.ndarray:
        """Dequantization factor per column: ``float32(x_scale) * w_scale`` (one fp32 rounding)."""
        return (np.float32(self.x_scale) * self.w_scale).astype(np.float32)

    @property
    def nbytes(self) -> int:
        """All bytes stored for the layer (weights with padding, scales, bias)."""
        return int(self.weight.nbytes + self.w_scale.nbytes + (0 if self.bias is None else self.bias.nbytes))

    def w_q(self) -> np.ndarray:
        """The int8 weights ``[N, K]`` without padding."""
        return self.weight[:, : self.k]

    def unpack(self) -> np.ndarray:
        """Dense float32 weights ``[N, K]`` = w_q * w_scale[n]."""
        return (self.w_q().astype(np.float32) * self.w_scale[:, None]).astype(np.float32)

    def node_attributes(self) -> dict:
        return {"n": self.n, "k": int(self.k), "bits": int(self.bits), "x_scale": float(self.x_scale),
                "has_bias": int(self.bias is not None), "gelu": int(bool(self.gelu)), "y_dtype": self.y_dtype}

    def to_tensors(self) -> dict[str, np.ndarray]:
        t = {"weight": self.weight, "w_scale": self.w_scale}
        if self.bias is not None:
            t["bias"] = self.bias
        return t

    @classmethod
    def from_tensors(cls, attrs: dict, tensors: dict[str, np.ndarray]) -> "VitBitWeights":
        """Rebuild from node attributes and input tensors, validating everything.

        Raises:
            FormatError: naming the missing/mistyped attribute or tensor, or the inconsistency found.
        """
        a = validate_attributes(attrs)
        names = TENSOR_NAMES if a["has_bias"] else TENSOR_NAMES[:-1]
        missing = [t for t in names if t not in tensors]
        if missing:
            raise _fail(f"missing tensor(s) {missing}", f"the node needs inputs {list(names)} after X")
        weight = np.asarray(tensors["weight"])
        if weight.dtype != np.int8 or weight.shape != (a["n"], k_padded(a["k"])):
            raise _fail(f"weight must be int8 [{a['n']}, {k_padded(a['k'])}], got {weight.dtype} {weight.shape}",
                        "the weight initializer does not match attributes n/k: repack the layer")
        return cls(weight=weight, w_scale=np.asarray(tensors["w_scale"]),
                   bias=np.asarray(tensors["bias"]) if a["has_bias"] else None, k=a["k"], bits=a["bits"],
                   x_scale=a["x_scale"], gelu=bool(a["gelu"]), y_dtype=a["y_dtype"])


def validate_attributes(attrs: dict) -> dict:
    """Check node attributes (types per :data:`ATTRIBUTES`, ranges); returns a clean dict.

    Extra keys ``plugin_version`` / ``plugin_namespace`` (added by the rewrite) are ignored.
    """
    out = {}
    for name, typ in ATTRIBUTES.items():
        if name not in attrs and name not in ATTRIBUTE_DEFAULTS:
            raise _fail(f"missing attribute {name!r}", f"the node needs attributes {list(ATTRIBUTES)}")
        v = attrs.get(name, ATTRIBUTE_DEFAULTS.get(name))
        if isinstance(v, bytes):
            v = v.decode()
        if typ is str and not isinstance(v, str):
            raise _fail(f"attribute {name!r} must be a string, got {v!r}", "rewrite the node with edgesdk")
        if typ is int and not (isinstance(v, (int, np.integer)) and not isinstance(v, bool)):
            raise _fail(f"attribute {name!r} must be an int, got {v!r}", "rewrite the node with edgesdk")
        if typ is float and not isinstance(v, (float, int, np.floating, np.integer)):
            raise _fail(f"attribute {name!r} must be a float, got {v!r}", "rewrite the node with edgesdk")
        out[name] = typ(v)
    _check_dims(out["n"], out["k"])
    if out["bits"] not in SUPPORTED_BITS:
        raise _fail(f"bits must be one of {SUPPORTED_BITS}, got {out['bits']}", "choose 4, 5 or 8")
    for flag in ("has_bias", "gelu"):
        if out[flag] not in (0, 1):
            raise _fail(f"attribute {flag!r} must be 0 or 1, got {out[flag]}", "rewrite the node with edgesdk")
    out["x_scale"] = _check_x_scale(out["x_scale"])
    out["y_dtype"] = _check_y_dtype(out["y_dtype"])
    return out


def check_x_dtype(x_dtype: str, attrs: dict) -> str:
    """Y's dtype for an X of ``x_dtype`` (validated attributes); FormatError if the pair is not allowed."""
    y = attrs["y_dtype"]
    if x_dtype not in X_DTYPES:
        raise _fail(f"X must be one of {X_DTYPES}, got {x_dtype}",
                    "cast X to float16/float32, or feed the int8 output of the layer's QuantizeLinear")
    if x_dtype == "int8" and not y:
        raise _fail("an int8 X needs attribute y_dtype (float16 or float32)",
                    "rewrite the model with edgesdk (it sets y_dtype on int8-input nodes)")
    if x_dtype != "int8" and y and y != x_dtype:
        raise _fail(f"X is {x_dtype} but attribute y_dtype is {y} (a float X gives Y in its own dtype)",
                    f"cast X to {y}, or rewrite the node")
    return y or x_dtype


def output_shape(x_shape: tuple[int, ...], attrs: dict) -> tuple[int, ...]:
    """Y's shape ``[..., N]`` for X ``[..., K]`` (rank >= 2); raises FormatError on a K mismatch."""
    a = validate_attributes(attrs)
    if len(x_shape) < 2:
        raise _fail(f"X must have rank >= 2, got shape {tuple(x_shape)}", "reshape X to [..., K]")
    if x_shape[-1] not in (a["k"], -1, None) and not isinstance(x_shape[-1], str):
        raise _fail(f"X's last dim is {x_shape[-1]}, attribute k is {a['k']}", "feed X with K features")
    return tuple(x_shape[:-1]) + (a["n"],)


def quantize_weights(w: np.ndarray, bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel quantization of float weights ``[N, K]``.

    Returns ``(w_q int8 [N, K] in [-(2^(b-1)-1), 2^(b-1)-1], w_scale float32 [N])``; an all-zero row
    gets scale 1.
    """
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 2 or not np.all(np.isfinite(w)):
        raise _fail(f"weights must be finite [N, K], got shape {w.shape}", "check the layer's initializer")
    qmax = (1 << (bits - 1)) - 1
    amax = np.abs(w).max(axis=1)
    scale = np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)
    w_q = np.clip(np.rint(w / scale.astype(np.float64)[:, None]), -qmax, qmax).astype(np.int8)
    return w_q, scale
