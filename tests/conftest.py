import pytest


def _gpu() -> bool:
    try:
        from edgesdk.kernels._cuda import gpu_available
        return gpu_available()
    except Exception:
        return False


def _trt() -> bool:
    try:
        import tensorrt  # noqa: F401
        return True
    except Exception:
        return False


HAVE_GPU = _gpu()
HAVE_TRT = _trt()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU and cuda-python; none here (run tools/gpu_check.sh on a GPU machine)")
    skip_trt = pytest.mark.skip(reason="needs TensorRT, which cannot be installed on this machine (run tools/trt_smoke.py on a Jetson)")
    for item in items:
        if "gpu" in item.keywords and not HAVE_GPU:
            item.add_marker(skip_gpu)
        if "trt" in item.keywords and not HAVE_TRT:
            item.add_marker(skip_trt)
