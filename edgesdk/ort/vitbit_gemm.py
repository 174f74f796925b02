"""ONNX Runtime op ``EdgeVitBitGemm``: the node through :mod:`edgesdk.reference.vitbit_gemm`.

On-chip quantization of X with ``x_scale``, exact integer GEMM (int64 here, int32 on the GPU),
fp32 epilogue, Y in X's dtype: bit-exact with every kernel tactic.
"""

from __future__ import annotations

from edgesdk.formats import vitbit_gemm as fmt
from edgesdk.formats.vitbit_gemm import VitBitWeights
from edgesdk.ort._pyop import register
from edgesdk.reference.vitbit_gemm import forward

INPUT_TYPES = ["dt_int8", "dt_float", "dt_float"]  # weight w_scale bias

register(fmt, INPUT_TYPES, forward, VitBitWeights.from_tensors)
