"""Compile CUDA sources from ``plugins/`` once, cache the cubin, launch on the caller's stream.

Shared by every operator's launcher (``edgesdk/kernels/<op>.py``) and so by the TensorRT plugins'
``enqueue``: a launch does no device allocation and no host synchronisation, so it can be
captured in a CUDA graph.

Compilation: ``nvcc -cubin -arch=sm_XY`` with the nvcc on PATH or else ``$CUDA_HOME/bin/nvcc``
(default ``/usr/local/cuda``, where JetPack puts it without adding it to PATH; the same compiler CI uses
for the resource table), else NVRTC from cuda-python with ``$CUDA_HOME/include``. Cubins are cached on
disk under ``$EDGESDK_CACHE`` (default ``~/.cache/edgesdk/cubin``) keyed by the sha256 of source,
headers, options, architecture and compiler version; modules and functions are cached per process and
per CUDA context. For the sources in :data:`SPLIT_COMPILE` both compilers run their optimisation passes on every
CPU this process may use (``--split-compile``, :func:`compile_threads`): same SASS, less wall time for a first
compile.

Launch path (the per-call host cost TensorRT pays outside CUDA graphs): a launcher resolves its
kernels once per (layer, M, tactic, context) into :class:`Launch` records, whose
:class:`ArgBlock` holds the kernel parameters as ctypes values plus the ``void*[]`` of their
addresses; a call only rewrites the pointer slots in place (:meth:`ArgBlock.set_pointers`) and calls
``cuLaunchKernel`` (:func:`launch_all`). Arg blocks are mutated per call, so launchers keep them
per thread (:func:`thread_cache`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from edgesdk.errors import EdgeSDKError

#: The CUDA sources: ``edgesdk/_plugins`` in an installed wheel, ``plugins/`` of the repository otherwise.
PLUGINS_DIR = next((d for d in (Path(__file__).resolve().parents[1] / "_plugins",
                                Path(__file__).resolve().parents[2] / "plugins") if (d / "common").is_dir()),
                   Path(__file__).resolve().parents[2] / "plugins")

_lock = threading.Lock()
_modules: dict[tuple, Any] = {}
_functions: dict[tuple, "Kernel"] = {}


_cu = None


def _driver():
    """The ``cuda.bindings.driver`` module (imported once)."""
    global _cu
    if _cu is not None:
        return _cu
    try:
        from cuda.bindings import driver  # cuda-python >= 12.6
    except ImportError:  # pragma: no cover - depends on the machine
        try:
            from cuda import cuda as driver  # older cuda-python layout
        except ImportError as e:
            raise EdgeSDKError(
                "cuda-python is not installed, so edgesdk cannot launch its CUDA kernels",
                "pip install 'edgesdk[gpu]' (cuda-python matching your CUDA major version)",
            ) from e
    _cu = driver
    return driver


def check(result):
    """Unwrap a cuda-python ``(err, *values)`` tuple; raise with the error's name on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise RuntimeError(f"CUDA driver call failed: {name} ({int(err)})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


_initialized = False


def init() -> None:
    """cuInit and make the device's primary context current if none is (idempotent)."""
    global _initialized
    cu = _driver()
    if not _initialized:
        check(cu.cuInit(0))
        _initialized = True
    ctx = check(cu.cuCtxGetCurrent())
    if ctx is None or int(ctx) == 0:
        dev = check(cu.cuDeviceGet(0))
        ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
        check(cu.cuCtxSetCurrent(ctx))


def current_context() -> int:
    """The current CUcontext as an int (one ``cuCtxGetCurrent``; :func:`init` first if none is current)."""
    cu = _driver()
    err, ctx = cu.cuCtxGetCurrent()
    if int(err) != 0 or int(ctx) == 0:  # not initialised yet, or no context current
        init()
        ctx = check(cu.cuCtxGetCurrent())
    return int(ctx)


_ctx_facts: dict[tuple[int, str], int] = {}


def context_attribute(name: str, ctx: int | None = None) -> int:
    """``CU_DEVICE_ATTRIBUTE_<name>`` of the current context's device, asked of the driver once per (context,
    attribute); ``ctx``: the current context where the caller has it already (the cache key)."""
    ctx = current_context() if ctx is None else int(ctx)
    v = _ctx_facts.get((ctx, name))
    if v is None:
        cu = _driver()
        dev = check(cu.cuCtxGetDevice())
        v = _ctx_facts[(ctx, name)] = int(check(cu.cuDeviceGetAttribute(
            getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}"), dev)))
    return v


def context_sm_count(ctx: int | None = None) -> int:
    """SMs of the current context: a green context's share, else the device's; asked once per context (``ctx``: the
    current context where the caller has it already)."""
    ctx = current_context() if ctx is None else int(ctx)
    v = _ctx_facts.get((ctx, "sm_count"))
    if v is None:
        cu = _driver()
        try:
            v = int(check(cu.cuCtxGetDevResource(cu.CUcontext(ctx), cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)
                          ).sm.smCount)
        except Exception:  # older drivers / bindings without device resources
            v = 0
        if v <= 0:
            v = context_attribute("MULTIPROCESSOR_COUNT", ctx)
        _ctx_facts[(ctx, "sm_count")] = v
    return v


def current_arch() -> str:
    """``sm_XY`` of the current device."""
    cu = _driver()
    init()
    dev = check(cu.cuCtxGetDevice())
    A = cu.CUdevice_attribute
    major = check(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    return f"sm_{major}{minor}"


def _cache_dir() -> Path:
    d = Path(os.environ.get("EDGESDK_CACHE", Path.home() / ".cache" / "edgesdk")) / "cubin"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _cuda_home() -> str:
    return os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"


def find_nvcc() -> str | None:
    """The nvcc :func:`compile_cubin` uses: on PATH, else ``$CUDA_HOME/bin/nvcc``; None: NVRTC is used."""
    nvcc = shutil.which("nvcc")
    if nvcc:
        return nvcc
    home = Path(_cuda_home()) / "bin" / "nvcc"
    return str(home) if home.is_file() and os.access(home, os.X_OK) else None


@functools.lru_cache(maxsize=None)
def _nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"\bV(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc
        major, minor = check(nvrtc.nvrtcVersion())
        return f"{major}.{minor}"
    except Exception:  # no NVRTC: compile_cubin raises with the fix
        return "unavailable"


def compiler_id(compiler: str | None = None) -> str:
    """``nvcc <version>`` or ``nvrtc <major.minor>``: what :func:`compile_cubin` would compile with (``compiler``:
    None = the default choice, ``"nvcc"`` or ``"nvrtc"``)."""
    nvcc = find_nvcc() if compiler in (None, "nvcc") else None
    if compiler == "nvcc" and nvcc is None:
        raise RuntimeError("nvcc is neither on PATH nor in $CUDA_HOME/bin")
    return f"nvcc {_nvcc_version(nvcc)}" if nvcc else f"nvrtc {_nvrtc_version()}"


def cubin_path(source_path: Path, arch: str, options: Sequence[str] = (), compiler: str | None = None) -> Path:
    """Where :func:`compile_cubin` keeps the cubin of ``source_path`` for ``arch`` (its key covers the source, the
    headers beside it and in ``plugins/common``, the arch, the options and the compiler with its version: a cache
    filled by another toolkit, e.g. in a container image, is not taken for this one's)."""
    source_path = Path(source_path)
    src = source_path.read_bytes()
    # Headers next to the source take part in the key.
    hdrs = b"".join(p.read_bytes() for p in sorted(source_path.parent.glob("*.cuh")))
    common = sorted(PLUGINS_DIR.glob("common/*.cuh"))
    hdrs += b"".join(p.read_bytes() for p in common)
    key = hashlib.sha256(src + hdrs + arch.encode() + "\0".join(options).encode()
                         + b"\0" + compiler_id(compiler).encode()).hexdigest()[:32]
    return _cache_dir() / f"{source_path.stem}-{arch}-{key}.cubin"


#: Sources compiled with ``--split-compile`` (:func:`compile_threads` threads): those whose kernels come out the same
#: as from one thread, machine code, registers and shared memory alike (``tools/split_compile_check.py``, with 2 and 16
#: threads, nvcc 13.0 and NVRTC 13.0 / 12.6, sm_87 and sm_90; ``docs/jetson.md``), so the option is left out of the
#: cache key. Not ``sparse_kv.cu``: split compilation changes the code of 48 of its 72 kernels, whose speed was
#: measured compiled whole.
SPLIT_COMPILE = frozenset({"bitmap_linear.cu", "vitbit_gemm.cu"})


def compile_threads() -> int:
    """Threads nvcc and NVRTC may use for a source in :data:`SPLIT_COMPILE`: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def compile_cubin(source_path: Path, arch: str, options: Sequence[str] = (), compiler: str | None = None) -> bytes:
    """Compile one ``.cu`` file to a cubin for ``arch`` (cached on disk). ``compiler``: None (nvcc where
    :func:`find_nvcc` finds one, else NVRTC), ``"nvcc"`` or ``"nvrtc"``."""
    if compiler not in (None, "nvcc", "nvrtc"):
        raise ValueError(f"compiler must be None, 'nvcc' or 'nvrtc', not {compiler!r}")
    source_path = Path(source_path)
    src = source_path.read_bytes()
    cached = cubin_path(source_path, arch, options, compiler)
    if cached.exists():
        return cached.read_bytes()
    inc = [f"-I{source_path.parent}", f"-I{PLUGINS_DIR}"]
    threads = compile_threads() if source_path.name in SPLIT_COMPILE else 1
    nvcc = find_nvcc() if compiler in (None, "nvcc") else None
    if nvcc:
        with tempfile.TemporaryDirectory() as td:
            out = Path(td) / "k.cubin"
            cmd = [nvcc, "-cubin", f"-arch={arch}", "-O3", "-std=c++17", *inc, *options,
                   *([f"--split-compile={threads}"] if threads > 1 else []), "-o", str(out), str(source_path)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"nvcc failed for {source_path.name}:\n{r.stderr}")
            data = out.read_bytes()
    else:
        data = _nvrtc_compile(src, source_path.name, arch,
                              [*inc, *options, *([f"-split-compile={threads}"] if threads > 1 else [])])
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, cached)
    return data


def _headers_major(include: Path) -> int | None:
    """CUDA major version of the headers in ``include`` (``CUDA_VERSION`` in ``cuda.h``), None if unknown."""
    try:
        m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", (include / "cuda.h").read_text(errors="replace"))
    except OSError:
        return None
    return int(m.group(1)) // 1000 if m else None


def cuda_include_dir(nvrtc_major: int) -> Path | None:
    """The CUDA headers NVRTC compiles against (``cuda_fp16.h``): of ``$CUDA_HOME/include`` and the pip wheels'
    (``nvidia/cu13/include``, ``nvidia/cuda_runtime/include`` for 12), the first of NVRTC's major version, else
    the first there is."""
    dirs = [Path(_cuda_home()) / "include"]
    try:
        import nvidia  # namespace package of NVIDIA's CUDA wheels

        subs = [f"cu{nvrtc_major}/include"] + (["cuda_runtime/include"] if nvrtc_major == 12 else [])
        dirs += [Path(base) / sub for base in nvidia.__path__ for sub in subs]
    except ImportError:
        pass
    dirs = [d for d in dirs if (d / "cuda_fp16.h").is_file()]
    return next((d for d in dirs if _headers_major(d) == nvrtc_major), dirs[0] if dirs else None)


def _nvrtc_compile(src: bytes, name: str, arch: str, options: Sequence[str]) -> bytes:
    from cuda.bindings import nvrtc

    major, _ = check(nvrtc.nvrtcVersion())
    inc = cuda_include_dir(major)
    if inc is None:
        raise RuntimeError(f"NVRTC {major}.x needs the CUDA headers (cuda_fp16.h) and found none in "
                           f"{_cuda_home()}/include: set CUDA_HOME to the CUDA toolkit, or pip install "
                           f"the CUDA runtime wheel of NVRTC's version (nvidia-cuda-runtime-cu{major} for 12, "
                           f"nvidia-cuda-runtime for 13)")
    opts = [f"--gpu-architecture={arch}", "-std=c++17", f"-I{inc}", *options]
    prog = check(nvrtc.nvrtcCreateProgram(src, name.encode(), 0, [], []))
    try:
        err = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])[0]
        if int(err) != 0:
            size = check(nvrtc.nvrtcGetProgramLogSize(prog))
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC failed for {name}:\n{log.decode(errors='replace')}")
        size = check(nvrtc.nvrtcGetCUBINSize(prog))
        cubin = b" " * size
        check(nvrtc.nvrtcGetCUBIN(prog, cubin))
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@dataclass
class Kernel:
    """A loaded ``extern "C"`` kernel; ``launch`` takes ctypes-typed arguments."""

    function: Any
    name: str
    max_dynamic_smem: int = 0
    static_smem: int | None = None  # the kernel's own __shared__ bytes (queried on first need)

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        if nbytes > self.max_dynamic_smem:
            cu = _driver()
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            check(cu.cuFuncSetAttribute(self.function, attr, nbytes))
            self.max_dynamic_smem = nbytes

    def launch(self, grid, block, args: Sequence[Any], stream: int = 0, smem: int = 0) -> None:
        """Launch on ``stream`` (a raw ``cudaStream_t`` as int, or a CUstream).

        ``args`` are ctypes values (``ctypes.c_void_p(ptr)``, ``ctypes.c_int(n)``, ``ctypes.c_float(s)``),
        in the kernel's parameter order. Nothing is allocated on the device and nothing synchronises.
        """
        launch = self.plan(grid, block, args, smem)
        launch_all((launch,), raw_stream(stream))

    def plan(self, grid, block, args: Sequence[Any], smem: int = 0) -> "Launch":
        """A reusable :class:`Launch` of this kernel (sets the shared-memory opt-in attribute now where the
        kernel's static shared memory plus ``smem`` exceeds 48 KB).

        ``args``: an :class:`ArgBlock`, or values as for :meth:`launch` (ints are taken as pointers).
        """
        if smem > 0 and self.static_smem is None:
            cu = _driver()
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
            self.static_smem = int(check(cu.cuFuncGetAttribute(attr, self.function)))
        if smem > 0 and smem + self.static_smem > 48 * 1024:  # static + dynamic above 48 KB needs the opt-in
            self.set_max_dynamic_smem(smem)
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (tuple(block) + (1, 1))[:3]
        block_ = args if isinstance(args, ArgBlock) else ArgBlock(
            [a if isinstance(a, ctypes._SimpleCData) else ctypes.c_void_p(int(a)) for a in args])
        return Launch(self.function, gx, gy, gz, bx, by, bz, smem, block_.address, block_)


class ArgBlock:
    """Kernel parameters as ctypes values and the ``void*[]`` of their addresses (``kernelParams``).

    ``values`` are ctypes values, or ints taken as the address of a parameter's memory (a pointer
    slot from :meth:`pointer_slots`). ``pointers`` (optional) is a ``uint64[]`` whose slots some parameters point into (see
    :meth:`set_pointers`): built once, rewritten in place per call, so a launch allocates nothing.
    The driver copies the parameters when ``cuLaunchKernel`` is called (also under graph capture),
    so a block may be reused as soon as that call returns, but not by two threads at once.
    """

    __slots__ = ("values", "pointers", "_pack", "_array", "address")

    def __init__(self, values: Sequence[Any], pointers: Any = None):
        self.values = tuple(values)
        self.pointers = pointers
        self._pack = struct.Struct(f"={len(pointers)}Q").pack_into if pointers is not None else None
        self._array = (ctypes.c_void_p * max(1, len(self.values)))(
            *(v if isinstance(v, int) else ctypes.addressof(v) for v in self.values))
        self.address = ctypes.addressof(self._array)

    @staticmethod
    def pointer_slots(n: int):
        """``n`` uint64 pointer slots, and the address of each (to pass as a parameter of :class:`ArgBlock`)."""
        slots = (ctypes.c_uint64 * n)()
        base = ctypes.addressof(slots)
        return slots, [base + 8 * i for i in range(n)]

    def set_pointers(self, *ptrs: int) -> None:
        """Write ``ptrs`` into the pointer slots (one C call)."""
        self._pack(self.pointers, 0, *ptrs)


class Launch(NamedTuple):
    """One prepared ``cuLaunchKernel``: function, grid, block, dynamic smem, ``kernelParams`` address."""

    function: Any
    gx: int
    gy: int
    gz: int
    bx: int
    by: int
    bz: int
    smem: int
    params: int
    args: ArgBlock  # keeps the parameter memory alive


def raw_stream(stream):
    """A stream as :func:`launch_all` takes it: a raw ``cudaStream_t`` int, or a CUstream as it is."""
    if isinstance(stream, int):
        return stream
    return stream if isinstance(stream, _driver().CUstream) else int(stream)


def launch_all(launches: Sequence[Launch], stream) -> None:
    """``cuLaunchKernel`` each of ``launches`` in order on ``stream`` (raw ``cudaStream_t`` int or CUstream)."""
    lk = _driver().cuLaunchKernel
    for f, gx, gy, gz, bx, by, bz, smem, params, _ in launches:
        err = lk(f, gx, gy, gz, bx, by, bz, smem, stream, params, 0)[0]
        if int(err) != 0:
            check((err,))


def thread_cache(local: threading.local, limit: int = 4096) -> dict:
    """This thread's plan dict in ``local`` (cleared when it reaches ``limit`` entries)."""
    d = getattr(local, "plans", None)
    if d is None or len(d) >= limit:
        d = local.plans = {}
    return d


def get_kernel(source: str | Path, name: str, options: Sequence[str] = ()) -> Kernel:
    """Load ``extern "C"`` kernel ``name`` from ``plugins/<source>`` for the current device.

    Compiled once per (source, options, arch), loaded once per context.
    """
    ctx = current_context()
    fkey = (source if isinstance(source, str) else str(source), name, tuple(options), ctx)
    k = _functions.get(fkey)
    if k is not None:
        return k
    cu = _driver()
    path = Path(source)
    if not path.is_absolute():
        path = PLUGINS_DIR / path
    with _lock:
        k = _functions.get(fkey)
        if k is not None:
            return k
        arch = current_arch()
        mkey = (str(path), tuple(options), ctx)
        mod = _modules.get(mkey)
        if mod is None:
            cubin = compile_cubin(path, arch, options)
            mod = check(cu.cuModuleLoadData(cubin))
            _modules[mkey] = mod
        fn = check(cu.cuModuleGetFunction(mod, name.encode()))
        k = Kernel(fn, name)
        _functions[fkey] = k
        return k


def green_context(sm_count: int = 16, rest: bool = False):
    """A CUcontext limited to ``sm_count`` SMs (the "Orin proxy" on an H100/H200).

    Returns ``(context, actual_sm_count)``; with ``rest=True`` also a second green context of the SMs left over,
    ``((context, sms), (rest_context, rest_sms))`` (``tools/orin_bw_proxy.py`` loads the memory from it). Make a
    context current with ``cuCtxSetCurrent`` before loading kernels into it; modules are cached per context.
    """
    cu = _driver()
    init()
    dev = check(cu.cuCtxGetDevice())
    res = check(cu.cuDeviceGetDevResource(dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
    r = cu.cuDevSmResourceSplitByCount(1, res, 0, sm_count)
    if int(r[0]) != 0:
        raise RuntimeError(f"cuDevSmResourceSplitByCount failed: {r[0]}")
    groups = r[1]
    g = groups[0] if isinstance(groups, (list, tuple)) else groups

    def make(part):
        desc = check(cu.cuDevResourceGenerateDesc([part], 1))
        gctx = check(cu.cuGreenCtxCreate(desc, dev, cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
        return check(cu.cuCtxFromGreenCtx(gctx)), int(part.sm.smCount)

    return (make(g), make(r[-1])) if rest else make(g)


class in_green_context:
    """``with in_green_context(16) as sms:`` runs the block with a green context of ``sm_count`` SMs current
    (:func:`green_context`; ``sms`` = the SMs it got), then makes the previous context current again."""

    def __init__(self, sm_count: int = 16):
        self.sm_count = sm_count

    def __enter__(self) -> int:
        cu = _driver()
        self.prev = current_context()
        ctx, sms = green_context(self.sm_count)
        check(cu.cuCtxSetCurrent(ctx))
        return sms

    def __exit__(self, *exc) -> None:
        cu = _driver()
        check(cu.cuCtxSetCurrent(cu.CUcontext(self.prev)))


def gpu_available() -> bool:
    """True when cuda-python imports and a CUDA device answers (used by tests to skip)."""
    try:
        cu = _driver()
        if int(cu.cuInit(0)[0]) != 0:
            return False
        n = cu.cuDeviceGetCount()
        return int(n[0]) == 0 and n[1] > 0
    except Exception:
        return False


# ------------------------------------------------------------------------------- device timing
# Used where edgesdk measures on the GPU it runs on (the ``--measure`` kernel choice of `edgesdk
# build`, tools): buffers from cuMemAlloc, launches captured in a CUDA graph, medians of replays.
class DeviceBuffer:
    """A ``cuMemAlloc`` allocation (freed by :meth:`free` or on leaving a ``with`` block)."""

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.ptr = check(_driver().cuMemAlloc(self.nbytes))

    def __int__(self) -> int:
        return int(self.ptr)

    def __enter__(self) -> "DeviceBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def upload(self, a) -> "DeviceBuffer":
        """Copy the bytes of numpy array ``a`` to the start of the buffer (synchronous)."""
        import numpy as np

        a = np.ascontiguousarray(a)
        if a.nbytes > self.nbytes:
            raise ValueError(f"upload of {a.nbytes} bytes into a {self.nbytes}-byte buffer")
        if a.nbytes:
            check(_driver().cuMemcpyHtoD(self.ptr, a.ctypes.data, a.nbytes))
        return self

    def download(self, shape, dtype):
        """The first bytes of the buffer as a numpy array of ``shape`` and ``dtype`` (synchronous)."""
        import numpy as np

        out = np.empty(shape, dtype)
        check(_driver().cuMemcpyDtoH(out.ctypes.data, self.ptr, out.nbytes))
        return out

    def poison(self) -> None:
        """Fill with 0xFF bytes (NaN in fp16 and fp32)."""
        check(_driver().cuMemsetD8(self.ptr, 0xFF, self.nbytes))

    def free(self) -> None:
        if self.ptr is not None:
            check(_driver().cuMemFree(self.ptr))
            self.ptr = None


def device_facts() -> dict:
    """Name, ``sm_XY``, SM count of the current context and L2 bytes of the current device."""
    cu = _driver()
    init()
    dev = check(cu.cuCtxGetDevice())
    A = cu.CUdevice_attribute
    name = check(cu.cuDeviceGetName(64, dev))
    name = (name.split(b"\0")[0].decode() if isinstance(name, bytes) else str(name))
    try:
        res = check(cu.cuCtxGetDevResource(cu.CUcontext(current_context()),
                                           cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
        sms = int(res.sm.smCount)
    except Exception:  # drivers / bindings without green-context resources
        sms = int(check(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)))
    return {"name": name, "arch": current_arch(), "sm_count": sms,
            "l2_bytes": int(check(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev)))}


def graph_time_us(launch_once, count: int, stream, samples: int = 7) -> float:
    """GPU µs per call of ``launch_once(i)`` (i = 0 .. count - 1, e.g. rotating over weight copies):
    the ``count`` calls are captured once in a CUDA graph (global capture mode, so a host sync or an
    allocation inside fails), the graph is replayed ``samples`` times between events, and the median
    over the replays after the first (warm-up) is returned."""
    import statistics

    cu = _driver()
    check(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    try:
        for i in range(count):
            launch_once(i)
    finally:
        graph = check(cu.cuStreamEndCapture(stream))
    exe = check(cu.cuGraphInstantiate(graph, 0))
    check(cu.cuGraphDestroy(graph))
    start, end = check(cu.cuEventCreate(0)), check(cu.cuEventCreate(0))
    try:
        times = []
        for _ in range(max(2, samples)):
            check(cu.cuEventRecord(start, stream))
            check(cu.cuGraphLaunch(exe, stream))
            check(cu.cuEventRecord(end, stream))
            check(cu.cuEventSynchronize(end))
            times.append(check(cu.cuEventElapsedTime(start, end)) * 1e3 / count)
    finally:
        for e in (start, end):
            check(cu.cuEventDestroy(e))
        check(cu.cuGraphExecDestroy(exe))
    return float(statistics.median(times[1:]))


#: The most operand copies a timing loop rotates through (each one launch in the timed graph), as the benchmarks
#: (bench/bench_bitmap_linear.py). It was 64, so a small compressed layer could stay in an H100's or H200's L2
#: while the dense layer it is compared with did not: 1536 x 576 with int8 values at 70 % (395 KB) got 64 copies,
#: 25 MB of the H100's 50 MB L2, cuBLAS's fp16 W (1.8 MB) 57 copies, 100 MB. 512 covers 2 x L2 from 246 KB operands
#: on an H200 (60 MB L2), every layer of issue 4's benchmark; on an Orin (4 MB L2) 64 already covered 128 KB and up.
ROTATION_MOST = 512


def rotation_copies(nbytes: int, l2_bytes: int, limit_bytes: int = 1 << 30, most: int = ROTATION_MOST) -> int:
    """How many copies of an ``nbytes`` operand a timing loop rotates through so that consecutive
    calls never find it in L2: enough for 2 × L2, at least 2, at most ``most`` and ``limit_bytes``."""
    want = -(-2 * max(l2_bytes, 1) // max(nbytes, 1)) + 1
    return int(max(2, min(want, most, max(2, limit_bytes // max(nbytes, 1)))))


def time_layer_us(tensors, x, y_bytes: int, call, workspace_bytes: int = 0, stream=None) -> float | None:
    """GPU µs of one call of a layer whose operands are ``tensors`` (numpy arrays: weights, scales, ...):
    the tensors are uploaded in :func:`rotation_copies` copies (a model's layers do not stay in L2 between
    calls), X (numpy) once, Y and the workspace allocated; ``call(inputs, outputs, workspace, stream)`` —
    ``inputs`` = [X, *tensors] device pointers — runs once outside capture (compilation, planning; a
    non-zero return value there, e.g. a library status, makes this return None), then
    :func:`graph_time_us` over the copies."""
    cu = _driver()
    init()
    nbytes = sum(int(t.nbytes) for t in tensors)
    copies = rotation_copies(nbytes, device_facts()["l2_bytes"])
    own = stream is None
    st = check(cu.cuStreamCreate(1)) if own else stream
    bufs = []
    try:
        xd = DeviceBuffer(x.nbytes).upload(x)
        yd = DeviceBuffer(y_bytes)
        ws = DeviceBuffer(workspace_bytes) if workspace_bytes else None
        bufs += [b for b in (xd, yd, ws) if b is not None]
        sets = []
        for _ in range(copies):
            ds = [DeviceBuffer(t.nbytes).upload(t) for t in tensors]
            bufs += ds
            sets.append([int(xd), *(int(d) for d in ds)])
        wsp = int(ws) if ws is not None else 0
        status = call(sets[0], [int(yd)], wsp, int(st))
        if status:
            return None
        check(cu.cuStreamSynchronize(st))
        return graph_time_us(lambda i: call(sets[i % copies], [int(yd)], wsp, int(st)), max(copies, 16), st)
    finally:
        check(cu.cuStreamSynchronize(st))
        for b in bufs:
            b.free()
        if own:
            check(cu.cuStreamDestroy(st))
