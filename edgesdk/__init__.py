"""edgesdk: quantized and sparse transformers on Jetson AGX Orin through TensorRT."""

__version__ = "0.1.0"

from edgesdk.errors import EdgeSDKError  # noqa: E402,F401

_LAZY = {"Engine": "edgesdk.runtime"}  # name → module; imported on first use


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'edgesdk' has no attribute {name!r}")


__all__ = ["EdgeSDKError", "Engine", "__version__"]


def __dir__():  # tab completion lists the lazy names too
    return sorted(set(globals()) | set(_LAZY))
