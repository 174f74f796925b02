"""ONNX Runtime op ``EdgeBitmapLinear``: the node through :mod:`edgesdk.reference.bitmap_linear`.

Validates the packed tensors (:meth:`BitmapLinearWeights.from_tensors`) on every call, then
computes ``Y = X · Wᵀ · scales + bias`` in float64 and rounds once to X's dtype: the exact value
the kernel's fp32 accumulation approximates (``reference.bitmap_linear.tolerance`` bounds the gap).
"""

from __future__ import annotations

from edgesdk.formats import bitmap_linear as fmt
from edgesdk.formats.bitmap_linear import BitmapLinearWeights
from edgesdk.ort._pyop import register
from edgesdk.reference.bitmap_linear import bitmap_linear

INPUT_TYPES = ["dt_int8", "dt_int8", "dt_int32", "dt_float", "dt_float"]  # bitmaps values offsets scales bias


def forward(x, attrs: dict, tensors: dict):
    """Y for X (fp16/fp32) from the node's attributes and tensors."""
    return bitmap_linear(x, BitmapLinearWeights.from_tensors(attrs, tensors))


register(fmt, INPUT_TYPES, forward, BitmapLinearWeights.from_tensors)
