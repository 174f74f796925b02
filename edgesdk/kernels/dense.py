"""Dense linear on the GPU through cuBLAS (``ctypes``): the baseline a plugin must beat.

``edgesdk build --measure`` times each bitmap-sparse candidate layer against the dense layer it would
replace, on the GPU the build runs on. TensorRT runs a dense MatMul with its own kernels, which this
module cannot reach without TensorRT; cuBLAS (``cublasGemmEx``, the library behind
``torch.nn.functional.linear``) stands in for them, as it does in the benchmarks.

``Y[m, n] = X[m, k] · W[n, k]ᵀ``, row-major, one call:

* fp16: X, W, Y fp16, fp32 accumulation (``CUBLAS_COMPUTE_32F``);
* int8: X, W int8, Y int32, exact (``CUBLAS_COMPUTE_32I``) — the dense alternative of an INT8 Q/DQ layer.

The library is found through ``$EDGESDK_CUBLAS`` (a path), the loader (``libcublas.so``), the NVIDIA
pip wheels (``nvidia/*/lib``) and the CUDA toolkit (``$CUDA_HOME``, ``/usr/local/cuda``, JetPack's
``/usr/lib/aarch64-linux-gnu``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading
from pathlib import Path

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.kernels import _cuda

# cudaDataType_t, cublasComputeType_t, cublasOperation_t, cublasGemmAlgo_t (cuBLAS API reference)
CUDA_R_16F, CUDA_R_8I, CUDA_R_32I = 2, 3, 10
COMPUTE_32F, COMPUTE_32I = 68, 72
OP_N, OP_T = 0, 1
GEMM_DEFAULT = -1
STATUS_NOT_SUPPORTED = 15

_lib = None
_lock = threading.Lock()
_handles: dict[int, ctypes.c_void_p] = {}  # per CUDA context


def _candidates() -> list[str]:
    out = []
    if os.environ.get("EDGESDK_CUBLAS"):
        out.append(os.environ["EDGESDK_CUBLAS"])
    found = ctypes.util.find_library("cublas")
    if found:
        out.append(found)
    for base in sys.path:
        out += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libcublas.so*")), reverse=True)
    roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    for r in filter(None, roots):
        out += sorted(glob.glob(os.path.join(r, "lib64", "libcublas.so*")), reverse=True)
        out += sorted(glob.glob(os.path.join(r, "targets", "*", "lib", "libcublas.so*")), reverse=True)
    out += sorted(glob.glob("/usr/lib/aarch64-linux-gnu/libcublas.so*"), reverse=True)
    out += sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libcublas.so*"), reverse=True)
    return out


def _load():
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        try:
            p = Path(path)
            if p.is_absolute():  # load its cublasLt neighbour first: a toolkit dir is not on the loader path
                for lt in sorted(p.parent.glob("libcublasLt.so*"), reverse=True):
                    ctypes.CDLL(str(lt))  # satisfies libcublas's DT_NEEDED by soname
                    break
            lib = ctypes.CDLL(path)
            lib.cublasGemmEx  # noqa: B018 - the symbol must exist
        except (OSError, AttributeError) as e:
            tried.append(f"{path}: {e}")
            continue
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cublasGemmEx.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _lib = lib
        return lib
    raise EdgeSDKError("cuBLAS (libcublas.so) was not found, so the dense baseline cannot be timed"
                       + (f" (tried: {'; '.join(tried[:4])})" if tried else ""),
                       "install the CUDA toolkit's cuBLAS (JetPack has it) or `pip install nvidia-cublas`, or "
                       "point EDGESDK_CUBLAS at libcublas.so; or build with --measure off")


def _handle(stream: int) -> ctypes.c_void_p:
    lib = _load()
    ctx = _cuda.current_context()
    with _lock:
        h = _handles.get(ctx)
        if h is None:
            h = ctypes.c_void_p()
            st = lib.cublasCreate_v2(ctypes.byref(h))
            if st != 0:
                raise RuntimeError(f"cublasCreate failed with status {st}")
            _handles[ctx] = h
    st = lib.cublasSetStream_v2(h, ctypes.c_void_p(int(stream)))
    if st != 0:
        raise RuntimeError(f"cublasSetStream failed with status {st}")
    return h


def linear(x: int, w: int, y: int, m: int, n: int, k: int, dtype: str, stream: int) -> int:
    """Enqueue ``Y = X · Wᵀ`` (device pointers, row-major; ``dtype`` ``"float16"`` or ``"int8"``, Y int32
    for int8). Returns the cuBLAS status (0 = done; 15 = this shape/type is not supported)."""
    h = _handle(stream)
    if dtype == "float16":
        a, b = ctypes.c_float(1.0), ctypes.c_float(0.0)
        ab_type, c_type, compute = CUDA_R_16F, CUDA_R_16F, COMPUTE_32F
    elif dtype == "int8":
        a, b = ctypes.c_int32(1), ctypes.c_int32(0)
        ab_type, c_type, compute = CUDA_R_8I, CUDA_R_32I, COMPUTE_32I
    else:
        raise ValueError(f"dtype {dtype!r}: float16 or int8")
    # column-major view: Yᵀ (n × m, ld n) = op_T(W as k × n, ld k) · (Xᵀ as k × m, ld k)
    return _load().cublasGemmEx(h, OP_T, OP_N, n, m, k, ctypes.byref(a), ctypes.c_void_p(int(w)), ab_type, k,
                                ctypes.c_void_p(int(x)), ab_type, k, ctypes.byref(b), ctypes.c_void_p(int(y)),
                                c_type, n, compute, GEMM_DEFAULT)


def time_us(n: int, k: int, m: int, dtype: str = "float16", stream: int | None = None, seed: int = 0,
            w: np.ndarray | None = None) -> float | None:
    """GPU µs of one dense ``Y = X · Wᵀ`` on the current device: random X and W (or ``w``), W copies
    rotated beyond 2 × L2, calls captured in a CUDA graph, median of replays. For int8: None when cuBLAS
    cannot run the shape here (status ≠ 0 on the first call: e.g. k % 4 ≠ 0)."""
    rng = np.random.default_rng(seed)
    if dtype == "float16":
        xs = rng.standard_normal((m, k)).astype(np.float16)
        ws = (w if w is not None else rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16)
        ybytes = 2 * m * n
    else:
        xs = rng.integers(-127, 128, (m, k), dtype=np.int8)
        ws = (w if w is not None else rng.integers(-127, 128, (n, k))).astype(np.int8)
        ybytes = 4 * m * n

    def call(ins, outs, _ws, st):
        status = linear(ins[0], ins[1], outs[0], m, n, k, dtype, st)
        if status != 0 and dtype == "float16":
            raise RuntimeError(f"cublasGemmEx failed with status {status} ({dtype}, m={m}, n={n}, k={k})")
        # int8: not supported (15), or no int8 kernel that launches here (13 seen on a 16-SM green context)
        return status

    return _cuda.time_layer_us([ws], xs, ybytes, call, stream=stream)
