"""Numpy ground truth for ``EdgeBitmapLinear``: ``Y = X · Wᵀ (· scales) + bias`` in float64.

The CUDA kernel (``plugins/bitmap_linear``) multiplies fp16 X (fp32 X is split into two fp16 parts,
``hi + lo``) by the stored fp16/int8 values on tensor cores: every product is exact in fp32 and
products are accumulated in fp32; the per-channel scale and the bias are applied in fp32, then Y is
rounded to X's dtype. :func:`tolerance` bounds the difference from this float64 reference:

* ``2⁻¹⁰ · |ref|``: rounding Y to fp16 (2⁻¹¹ relative) with a factor 2 margin; for fp32 Y it also
  covers the fp32 epilogue.
* ``2⁻¹⁶ · Σₖ |x·w|``: fp32 accumulation over K terms (random-walk error ≈ √K · 2⁻²⁴ ≪ 2⁻¹⁶ for
  K ≤ 64 k) and, for fp32 X, the ``hi + lo`` split (2⁻²² relative per element).
* for fp16 X, inputs are exact; fp32 X is split exactly only within the fp16 range (|x| < 65504),
  so fp32 X outside that range is not supported by the kernel.
"""

from __future__ import annotations

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.formats.bitmap_linear import BitmapLinearWeights


def _check_x(x: np.ndarray, weights: BitmapLinearWeights) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in (np.float16, np.float32) or x.ndim < 2 or x.shape[-1] != weights.k:
        raise EdgeSDKError(f"EdgeBitmapLinear: X must be float16/float32 [..., {weights.k}] (rank >= 2), "
                           f"got {x.dtype} {x.shape}", "feed the layer input with K as its last dimension")
    return x


def bitmap_linear(x: np.ndarray, weights: BitmapLinearWeights, bias: np.ndarray | None = None,
                  out_dtype=None) -> np.ndarray:
    """Reference ``EdgeBitmapLinear``.

    Args:
        x (np.ndarray): float16 or float32 ``[..., K]``, rank ≥ 2.
        weights (BitmapLinearWeights): Packed weights.
        bias (np.ndarray | None): float ``[N]``; defaults to ``weights.bias``.
        out_dtype: dtype of Y; defaults to X's dtype. ``np.float64`` returns the exact value.

    Returns:
        np.ndarray: ``[..., N]``, computed in float64 and cast to ``out_dtype``.
    """
    x = _check_x(x, weights)
    bias = weights.bias if bias is None else np.asarray(bias)
    x64 = x.reshape(-1, weights.k).astype(np.float64)
    y = (x64 @ weights.raw_values().T) * weights.scales.astype(np.float64)
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64).reshape(-1)
    return y.reshape(*x.shape[:-1], weights.n).astype(out_dtype or x.dtype)


def tolerance(x: np.ndarray, weights: BitmapLinearWeights, bias: np.ndarray | None = None) -> np.ndarray:
    """Per-element allowed ``|kernel - reference|`` for Y (see the module docstring)."""
    x = _check_x(x, weights)
    ref = bitmap_linear(x, weights, bias, out_dtype=np.float64)
    absx = np.abs(x.reshape(-1, weights.k).astype(np.float64))
    mag = (absx @ np.abs(weights.raw_values()).T) * weights.scales.astype(np.float64)
    # fp16 Y: subnormal spacing 2**-24 is the smallest absolute rounding step.
    floor = 2.0**-24 if x.dtype == np.float16 else 1e-30
    return 2.0**-10 * np.abs(ref) + 2.0**-16 * mag.reshape(ref.shape) + floor
