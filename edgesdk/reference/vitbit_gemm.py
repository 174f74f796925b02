"""Ground truth for ``EdgeVitBitGemm`` (numpy): every kernel tactic and the ORT op match it bit-exactly
(the GELU variant cannot be reproduced by numpy: the kernels' fp16 Y is within 1 ulp of it, ``gelu_h`` in the
plugin source; their fp32 Y, from ``erff``, within 2e-6).

Semantics, step by step (each step is one IEEE fp32 operation, so CUDA reproduces it with ``__fdiv_rn``,
``__float2int_rn``, ``__int2float_rn``, ``__fmul_rn``, ``__fadd_rn``, ``__float2half_rn``)::

    q[m, k]  = clip(rint(float32(x) / float32(x_scale)), -128, 127)       NaN -> 0, +-inf -> 127 / -128
    acc[m,n] = sum_k q[m, k] * w[n, k]                                     exact (int64 here, int32 on GPU)
    alpha[n] = float32(x_scale) * w_scale[n]                               fp32 multiply
    y        = float32(acc) * alpha[n]                                     int -> fp32 rounds to nearest even
    y        = y + bias[n]                                                 if has_bias (separate fp32 add)
    y        = 0.5 * y * (1 + erf(y / sqrt(2)))                            if gelu (float64 here, then fp32)
    Y        = y.astype(y_dtype or X.dtype)                                fp16: round to nearest even

An int8 X is q itself (already quantized with x_scale, e.g. by the graph's QuantizeLinear).
"""

from __future__ import annotations

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.formats.vitbit_gemm import VitBitWeights, check_x_dtype, extract_fields, field_layout, pack_fields


def quantize_activations(x: np.ndarray, x_scale: float) -> np.ndarray:
    """int8 activations: ``clip(rint(float32(x) / float32(x_scale)), -128, 127)``, NaN -> 0."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = np.asarray(x).astype(np.float32) / np.float32(x_scale)
    v = np.where(np.isnan(v), np.float32(0), v)
    return np.clip(np.rint(v), -128, 127).astype(np.int8)


def int_gemm(q: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Exact ``q [M, K] @ w [N, K]^T`` as int64.

    Done in float64 (BLAS): every product and partial sum is an integer of magnitude <= K * 2^14 <= 2^31,
    far below 2^53, so float64 arithmetic is exact whatever the summation order.
    """
    q = np.asarray(q)
    w = np.asarray(w)
    return (q.astype(np.float64) @ w.astype(np.float64).T).astype(np.int64)


def fp16_ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in fp16 units in the last place, both rounded to fp16 (+0 and -0 are the same point; NaN is not
    handled): the measure of the kernels' fp16 GELU, which stays within 1 of :func:`vitbit_gemm`."""
    def key(v):
        i = np.asarray(v, np.float16).view(np.int16).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFF), i)

    return np.abs(key(a) - key(b))


def _erf(v: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover - scipy comes with scikit-learn
        from math import erf as _e

        erf = np.vectorize(_e, otypes=[np.float64])
    return erf(v)


def epilogue(acc: np.ndarray, alpha: np.ndarray, bias: np.ndarray | None, gelu: bool,
             out_dtype=np.float16) -> np.ndarray:
    """Dequantize exact accumulators ``acc [M, N]`` (int) exactly as the kernels do."""
    y = np.asarray(acc).astype(np.float32) * np.asarray(alpha, np.float32)
    if bias is not None:
        y = (y + np.asarray(bias, np.float32)).astype(np.float32)
    if gelu:
        yd = y.astype(np.float64)
        y = (0.5 * yd * (1.0 + _erf(yd / np.sqrt(2.0)))).astype(np.float32)
    return y.astype(out_dtype)


def vitbit_gemm(x: np.ndarray, packed: VitBitWeights) -> np.ndarray:
    """Y = EdgeVitBitGemm(X) for X ``[..., K]``: fp16/fp32 (quantized here with ``x_scale``) or int8 (already
    quantized: q = X). Y has shape ``[..., N]`` and dtype ``packed.y_dtype``, or X's where that is ""."""
    x = np.asarray(x)
    if x.ndim < 2 or x.shape[-1] != packed.k:
        raise EdgeSDKError(f"EdgeVitBitGemm: X must be [..., {packed.k}], got {x.dtype} {x.shape}",
                           "feed the layer its input activations with K features")
    y_dtype = check_x_dtype(x.dtype.name, packed.node_attributes())
    x2 = x.reshape(-1, packed.k)
    q = x2 if x.dtype == np.int8 else quantize_activations(x2, packed.x_scale)
    y = epilogue(int_gemm(q, packed.w_q()), packed.alpha, packed.bias, packed.gelu, np.dtype(y_dtype))
    return y.reshape(x.shape[:-1] + (packed.n,))


def forward(x: np.ndarray, attrs: dict, tensors: dict[str, np.ndarray]) -> np.ndarray:
    """The node from its attributes and tensors (validated): what the ORT op and TRT plugin compute."""
    return vitbit_gemm(x, VitBitWeights.from_tensors(attrs, tensors))


# ------------------------------------------------------------------------------------------------
# Emulations of the CUDA-core shares, to test their exactness bounds on the CPU.
# ------------------------------------------------------------------------------------------------


def field_gemm(q: np.ndarray, w: np.ndarray, bits: int, flush_every: int | None = None) -> np.ndarray:
    """INT-core packed-field GEMM emulated with uint32 wraparound, as the kernel does it.

    Multiply-adds ``acc += q * P`` (mod 2^32) on words P packing two columns, extracting the 16-bit
    fields into int64 totals every ``flush_every`` values of K (default: the proven bound). Equal to
    :func:`int_gemm` whenever ``flush_every`` respects the bound; a larger value may silently be wrong,
    which is what the tests show.
    """
    lay = field_layout(bits)
    t = lay.flush_every if flush_every is None else int(flush_every)
    q = np.asarray(q).astype(np.int64)
    words = pack_fields(w, bits).astype(np.uint64)  # [N2, K]
    m, k = q.shape
    n2 = words.shape[0]
    tot0 = np.zeros((m, n2), np.int64)
    tot1 = np.zeros((m, n2), np.int64)
    acc = np.zeros((m, n2), np.uint64)
    for kk in range(k):
        acc = (acc + (q[:, kk:kk + 1].astype(np.uint64) * words[None, :, kk])) & np.uint64(0xFFFFFFFF)
        if (kk + 1) % t == 0 or kk == k - 1:
            v0, v1 = extract_fields(acc.astype(np.uint32))
            tot0 += v0
            tot1 += v1
            acc[:] = 0
    out = np.empty((m, 2 * n2), np.int64)
    out[:, 0::2], out[:, 1::2] = tot0, tot1
    return out[:, : np.asarray(w).shape[0]]


def fp_gemm(q: np.ndarray, w: np.ndarray, chunk: int) -> np.ndarray:
    """FP-core GEMM emulated: fp32 accumulation of exact products, flushed to int every ``chunk`` K."""
    q = np.asarray(q).astype(np.float32)
    w = np.asarray(w).astype(np.float32)
    m, k = q.shape
    tot = np.zeros((m, w.shape[0]), np.int64)
    acc = np.zeros((m, w.shape[0]), np.float32)
    for kk in range(k):
        acc = (acc + q[:, kk:kk + 1] * w[None, :, kk]).astype(np.float32)
        if (kk + 1) % chunk == 0 or kk == k - 1:
            tot += acc.astype(np.int64)
            acc[:] = 0
    return tot
