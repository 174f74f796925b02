"""TensorRT plugin for ``EdgeBitmapLinear`` (slice ``bitmap_linear``): the class pair from :mod:`edgesdk.trt.plugins`.

Shape, dtype, format, field and tactic logic: :mod:`edgesdk.trt._logic`; launch:
``edgesdk.kernels.bitmap_linear.launch``. Register with :func:`edgesdk.trt.registry.register_plugins`.
"""

from __future__ import annotations

OP = "bitmap_linear"


def plugin_classes():
    """``(EdgeBitmapLinearPlugin, EdgeBitmapLinearPluginCreator)`` (needs TensorRT)."""
    from edgesdk.trt.plugins import plugin_classes as make

    return make(OP)
