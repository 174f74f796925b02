"""TensorRT plugin for ``EdgeVitBitGemm`` (slice ``vitbit_gemm``): the class pair from :mod:`edgesdk.trt.plugins`.

Shape, dtype, format, field and tactic logic: :mod:`edgesdk.trt._logic`; launch:
``edgesdk.kernels.vitbit_gemm.launch``. Register with :func:`edgesdk.trt.registry.register_plugins`.
"""

from __future__ import annotations

OP = "vitbit_gemm"


def plugin_classes():
    """``(EdgeVitBitGemmPlugin, EdgeVitBitGemmPluginCreator)`` (needs TensorRT)."""
    from edgesdk.trt.plugins import plugin_classes as make

    return make(OP)
