"""edgesdk: quantized and sparse transformers on Jetson AGX Orin through TensorRT."""

__version__ = "0.1.0"

from edgesdk.errors import EdgeSDKError  # noqa: E402,F401
