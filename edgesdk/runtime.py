"""``edgesdk.Engine``: run a build folder (or a ``model.plan``) from Python.

Example::

    import numpy as np, edgesdk

    with edgesdk.Engine("build/digits") as engine:            # TensorRT (the default)
        y = engine.infer({"x": np.zeros((1, 1, 8, 8), np.float32)})["logits"]

    cpu = edgesdk.Engine("build/digits", backend="onnxruntime")  # ONNX Runtime on the CPU

Backends:
    * ``"tensorrt"``: deserializes ``model.plan`` (after checking the TensorRT version and compute
      capability recorded in ``manifest.json``), one execution context and one CUDA stream per
      engine, pinned host buffers and async copies on discrete GPUs, mapped (zero-copy) host
      buffers on Jetson's integrated GPU, optional CUDA-graph replay (``cuda_graph=True``;
      re-captured whenever shapes or device addresses change, so it pays for static shapes).
      Inputs may be numpy arrays or device arrays (``__cuda_array_interface__``: used in place,
      no copy; the engine waits on the array's stream). Outputs are numpy arrays.
    * ``"onnxruntime"``: the build folder's rewritten ONNX model through
      :func:`edgesdk.ort.make_session` (CPU, plugin nodes through their numpy reference ops). Only
      when asked: asking for TensorRT where it is missing raises, it never falls back silently.
      Opened from a build folder, it holds inputs to the optimization profile the build gave TensorRT
      (batch 1 .. ``--max-batch``; :attr:`Engine.profile`), so what runs on the CPU runs on the Jetson.

Thread safety: one ``Engine`` may be shared by threads; :meth:`Engine.infer` calls are serialized
by a lock (one context, one stream, one set of buffers). For parallel inference create one
``Engine`` per thread (TensorRT shares nothing between them but the GPU). :meth:`Engine.close`
(or the ``with`` block) releases the stream, buffers, context and engine; an engine is closed at
garbage collection too, but robotics nodes should close it on shutdown explicitly.

The TensorRT backend has never run where it was written (no TensorRT there);
``tools/trt_smoke.py`` exercises it first.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import threading
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.trt.engine import PLAN_NAME  # the one definition: the build writes it

BACKENDS = ("tensorrt", "onnxruntime")
MANIFEST_NAME = "manifest.json"
ONNX_NAMES = ("model.onnx",)

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
              "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(int32)": np.int32,
              "tensor(int64)": np.int64, "tensor(bool)": np.bool_}


class TensorInfo(NamedTuple):
    """An input or output: name, shape (``-1`` for a dynamic dimension; None where the model does not say even
    the rank) and numpy dtype."""

    name: str
    shape: tuple[int, ...] | None
    dtype: np.dtype


class BuildFolder(NamedTuple):
    """The files of one build: any may be None."""

    plan: Path | None
    onnx: Path | None
    manifest: dict | None


def find_build(path: str | Path) -> BuildFolder:
    """Locate ``model.plan``, the rewritten ONNX and ``manifest.json`` from a folder or a file.

    Raises:
        EdgeSDKError: the path does not exist or holds none of them.
    """
    if not isinstance(path, (str, Path)):
        raise EdgeSDKError(f"the path is a {type(path).__name__}, not a str or Path",
                           "pass a build folder written by `edgesdk build` or a .plan file")
    p = Path(path)
    if not p.exists():
        raise EdgeSDKError(f"{p} does not exist", "pass a build folder written by `edgesdk build` or a .plan file")
    folder = p if p.is_dir() else p.parent
    manifest = None
    if (folder / MANIFEST_NAME).is_file():
        try:
            manifest = json.loads((folder / MANIFEST_NAME).read_text())
        except ValueError as e:
            raise EdgeSDKError(f"{folder / MANIFEST_NAME} is not valid JSON ({e})",
                               "rebuild the folder with `edgesdk build`") from e
    if p.is_file():
        if p.suffix == ".onnx":
            return BuildFolder(None, p, manifest)
        return BuildFolder(p, _find_onnx(folder), manifest)
    plan = p / PLAN_NAME
    onnx = _find_onnx(p)
    if not plan.is_file() and onnx is None:
        several = sorted(q.name for q in p.glob("*.onnx"))
        if len(several) > 1:
            raise EdgeSDKError(f"{p} holds several ONNX models ({', '.join(several)}) and no {ONNX_NAMES[0]}",
                               "pass the .onnx file to run")
        raise EdgeSDKError(f"{p} holds neither {PLAN_NAME} nor an ONNX model",
                           "pass the output folder of `edgesdk build`")
    return BuildFolder(plan if plan.is_file() else None, onnx, manifest)


def _find_onnx(folder: Path) -> Path | None:
    for name in ONNX_NAMES:
        if (folder / name).is_file():
            return folder / name
    found = sorted(folder.glob("*.onnx"))
    return found[0] if len(found) == 1 else None


class Engine:
    """Run a build folder: ``infer({name: array}) -> {name: array}``.

    Args:
        path (str | Path): A build folder (``edgesdk build`` output), a ``.plan`` file, or for the
            ONNX Runtime backend an ``.onnx`` file.
        backend (str): ``"tensorrt"`` (default) or ``"onnxruntime"``.
        cuda_graph (bool): TensorRT only: capture the engine's launch in a CUDA graph and replay it
            while shapes and addresses stay the same. Default False.
        threads (int | None): ONNX Runtime only: intra-op threads (default: ORT's choice).

    Attributes:
        inputs, outputs (tuple[TensorInfo, ...]): Names, shapes (-1: dynamic) and dtypes.
        profile (dict | None): For a build folder, input name -> (min, opt, max) shape of the optimization profile
            the build gave TensorRT (batch 1 .. ``--max-batch``); :meth:`infer` refuses shapes outside it with
            either backend (ONNX Runtime: checked here, so that what runs on the CPU runs on the Jetson; TensorRT:
            by the engine, on a shape change only). None for a bare .onnx/.plan file.

    Raises:
        EdgeSDKError: unknown backend, missing files, TensorRT missing, or a plan built for
            another TensorRT version or GPU (the message says to rebuild).
    """

    def __init__(self, path: str | Path, backend: str = "tensorrt", *, cuda_graph: bool = False,
                 threads: int | None = None):
        self._lock = threading.Lock()
        self._closed, self._impl = True, None  # open only once a backend is up: close() at GC after a failure is a no-op
        if not isinstance(path, (str, Path)):
            raise EdgeSDKError(f"the path is a {type(path).__name__}, not a str or Path",
                               "pass a build folder written by `edgesdk build` or a .plan file")
        if backend not in BACKENDS:
            raise EdgeSDKError(f"unknown backend {backend!r}", f"use one of {', '.join(BACKENDS)}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise EdgeSDKError(f"threads={threads!r} is not a thread count", "pass an int >= 1, or None for ORT's choice")
        self.backend = backend
        self.path = Path(path)
        self.profile: dict[str, tuple[tuple, tuple, tuple]] | None = None
        build = find_build(path)
        if backend == "onnxruntime":
            if build.onnx is None:
                raise EdgeSDKError(f"no ONNX model found for {path}",
                                   f"pass the build folder (holding {ONNX_NAMES[0]}) or the .onnx file")
            if cuda_graph:
                raise EdgeSDKError("cuda_graph=True needs the TensorRT backend", "drop cuda_graph")
            self._impl = _OrtBackend(build.onnx, threads)
            self.profile = _build_profile(_build_report(build.onnx), self._impl.inputs)
        else:
            if build.plan is None and self.path.suffix == ".onnx":
                beside = self.path.parent / PLAN_NAME
                raise EdgeSDKError(f"{path} is an ONNX model; the TensorRT backend runs a plan",
                                   f"pass the build folder or {beside}" if beside.is_file() else
                                   "pass a build folder with a model.plan, or use Engine(path, backend='onnxruntime')")
            if build.plan is None:
                raise EdgeSDKError(f"no {PLAN_NAME} in {path}: the build ran without TensorRT",
                                   "run `edgesdk build` on a machine with TensorRT (the Jetson), or "
                                   "use Engine(path, backend='onnxruntime')")
            report = _build_report(build.plan)
            self._impl = _TrtBackend(build.plan, build.manifest, cuda_graph, _built_dla_core(report))
            self.profile = _build_profile(report, self._impl.inputs)
        self.inputs: tuple[TensorInfo, ...] = tuple(self._impl.inputs)
        self.outputs: tuple[TensorInfo, ...] = tuple(self._impl.outputs)
        self._closed = False

    def infer(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run once. ``feeds`` maps every input name to a numpy array or a device array.

        Returns:
            dict[str, np.ndarray]: Every output by name (fresh arrays, owned by the caller).

        Raises:
            EdgeSDKError: missing/unknown inputs, wrong dtype, rank or shape.
        """
        with self._lock:
            if self._closed:
                raise EdgeSDKError("this Engine is closed", "create a new Engine")
            if not isinstance(feeds, Mapping):
                raise EdgeSDKError(f"infer takes a dict of input name -> array, not a {type(feeds).__name__}",
                                   "feed {" + ", ".join(f"{t.name!r}: array" for t in self.inputs) + "}")
            _check_names(self.inputs, feeds)
            if self.profile and self.backend == "onnxruntime":  # TensorRT holds its engine to the profile itself
                _check_profile(self.profile, feeds)
            return self._impl.infer(feeds)

    def close(self) -> None:
        """Release the stream, buffers, execution context and engine (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._impl is not None:
                self._impl.close()
                self._impl = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}{list(t.shape) if t.shape is not None else '[?]'}:{t.dtype}" for t in self.inputs)
        return f"Engine({str(self.path)!r}, backend={self.backend!r}, inputs=[{ins}])"


def _check_names(inputs: list[TensorInfo], feeds: Mapping[str, Any]) -> None:
    want = {t.name for t in inputs}
    missing, extra = sorted(want - set(feeds)), sorted(set(feeds) - want)
    if missing or extra:
        raise EdgeSDKError(f"inputs do not match the model: missing {missing}, unknown {extra}",
                           f"feed exactly {sorted(want)}")


def _build_report(model_path: Path) -> dict | None:
    """report.json of the build folder whose plan or processed ONNX model is ``model_path``, or None (any other
    file, or a damaged report)."""
    from edgesdk.report import REPORT_NAME

    try:
        report = json.loads((model_path.parent / REPORT_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or model_path.name not in (report.get("processed_model", ONNX_NAMES[0]),
                                                               PLAN_NAME):
        return None
    return report


def _build_profile(report: dict | None, inputs) -> dict | None:
    """The optimization profile ``edgesdk build`` gave TensorRT (from its report), or None without a report."""
    from edgesdk.trt.engine import profile_shapes

    if report is None:
        return None  # not a build folder: ONNX Runtime takes any shape
    config = report.get("config") or {}
    shapes = {t.name: t.shape for t in inputs if t.shape is not None}
    try:
        return profile_shapes(shapes, config.get("shape_hints") or {}, int(config.get("max_batch") or 8),
                              (report.get("model") or {}).get("profile"))
    except EdgeSDKError:
        return None


def _built_dla_core(report: dict | None) -> int | None:
    """The DLA core the build put the engine on (report.json ``engine.details.dla_core``), or None."""
    core = (((report or {}).get("engine") or {}).get("details") or {}).get("dla_core")
    return core if isinstance(core, int) else None


def _check_profile(profile: dict, feeds: Mapping[str, Any]) -> None:
    for name, (lo, _, hi) in profile.items():
        a = feeds[name]
        shape = tuple(int(d) for d in (a.__cuda_array_interface__["shape"] if hasattr(
            a, "__cuda_array_interface__") and not isinstance(a, np.ndarray) else np.shape(a)))
        if len(shape) == len(lo) and any(d < l or d > h for d, l, h in zip(shape, lo, hi)):
            raise EdgeSDKError(f"input {name!r} shape {shape} is outside the build's optimization profile "
                               f"{tuple(lo)} .. {tuple(hi)} (TensorRT would refuse it on the Jetson)",
                               f"split the batch, or rebuild with --max-batch {shape[0]}" if shape[0] > hi[0]
                               else "feed a shape inside the profile, or rebuild with --min-shape/--max-shape "
                               "covering it")


def _check_array(t: TensorInfo, shape: tuple, dtype: np.dtype) -> None:
    if np.dtype(dtype) != t.dtype:
        raise EdgeSDKError(f"input {t.name!r} is {np.dtype(dtype)}, the model takes {t.dtype}",
                           f"convert it first, e.g. {t.name}.astype(np.{t.dtype.type.__name__})")
    if t.shape is None:  # the model does not say its rank
        return
    if len(shape) != len(t.shape) or any(d >= 0 and d != s for d, s in zip(t.shape, shape)):
        raise EdgeSDKError(f"input {t.name!r} has shape {tuple(shape)}, the model takes {t.shape} "
                           "(-1 = any size)", "reshape the input")


def _host_array(t: TensorInfo, a: Any) -> np.ndarray:
    """A C-contiguous host array for input ``t`` (device arrays are copied to the host)."""
    if hasattr(a, "__cuda_array_interface__") and not isinstance(a, np.ndarray):
        iface = a.__cuda_array_interface__
        shape, dtype = tuple(iface["shape"]), np.dtype(iface["typestr"])
        _check_array(t, shape, dtype)
        ptr = _contiguous_ptr(t.name, iface)
        host = np.empty(shape, dtype)
        from edgesdk.kernels._cuda import _driver, check, init

        init()
        cu = _driver()
        if iface.get("stream"):
            check(cu.cuStreamSynchronize(cu.CUstream(int(iface["stream"]))))
        if host.nbytes:
            check(cu.cuMemcpyDtoH(host.ctypes.data, cu.CUdeviceptr(ptr), host.nbytes))
        return host
    a = np.asarray(a)
    _check_array(t, a.shape, a.dtype)
    return np.ascontiguousarray(a)


def _contiguous_ptr(name: str, iface: dict) -> int:
    shape, itemsize = tuple(iface["shape"]), np.dtype(iface["typestr"]).itemsize
    strides = iface.get("strides")
    if strides is not None:
        want, acc = [], itemsize
        for d in reversed(shape):
            want.append(acc)
            acc *= d
        if tuple(strides) != tuple(reversed(want)) and int(np.prod(shape)) > 1:
            raise EdgeSDKError(f"device input {name!r} is not C-contiguous (strides {strides})",
                               "pass a contiguous array (e.g. .contiguous() / cupy.ascontiguousarray)")
    return int(iface["data"][0])


_FOREIGN_MODULES = ("onnx", "onnxruntime", "onnxruntime_extensions", "google.protobuf")


@contextlib.contextmanager
def _foreign_errors(problem: str, fix: str):
    """ONNX, ONNX Runtime and protobuf raise their own exception types (a file that is not ONNX, a kernel that
    fails on the given inputs): as EdgeSDKError, with the library's words."""
    try:
        yield
    except EdgeSDKError:
        raise
    except Exception as e:
        module = type(e).__module__ or ""
        if not any(module == m or module.startswith(m + ".") for m in _FOREIGN_MODULES):
            raise
        detail = " ".join(str(e).split()) or type(e).__name__
        raise EdgeSDKError(f"{problem} ({type(e).__name__}: {detail})", fix) from None


# ------------------------------------------------------------------------------------------------
# ONNX Runtime
# ------------------------------------------------------------------------------------------------


class _OrtBackend:
    def __init__(self, onnx_path: Path, threads: int | None):
        from edgesdk.ort import make_session

        with _foreign_errors(f"ONNX Runtime cannot load {onnx_path}",
                             "rebuild the folder with `edgesdk build` (or re-export the .onnx)"):
            self.session = make_session(onnx_path, threads=threads)
        self.inputs = [self._info(i) for i in self.session.get_inputs()]
        self.outputs = [self._info(o) for o in self.session.get_outputs()]

    @staticmethod
    def _info(arg) -> TensorInfo:
        if arg.type not in _ORT_TYPES:
            raise EdgeSDKError(f"tensor {arg.name!r} has type {arg.type}, which edgesdk does not feed",
                               "export the model with float, int or bool inputs and outputs")
        if not arg.shape:  # ORT gives [] both for a scalar and for a tensor of unknown rank: ORT checks the rank
            return TensorInfo(arg.name, None, np.dtype(_ORT_TYPES[arg.type]))
        shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape)
        return TensorInfo(arg.name, shape, np.dtype(_ORT_TYPES[arg.type]))

    def infer(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        host = {t.name: _host_array(t, feeds[t.name]) for t in self.inputs}
        shapes = ", ".join(f"{k} {'x'.join(map(str, v.shape))}" for k, v in host.items())
        with _foreign_errors(f"ONNX Runtime failed on inputs {shapes}",
                             "check the inputs' shapes and values against Engine.inputs (and Engine.profile)"):
            outs = self.session.run([o.name for o in self.outputs], host)
        return {o.name: np.asarray(v) for o, v in zip(self.outputs, outs)}

    def close(self) -> None:
        self.session = None


# ------------------------------------------------------------------------------------------------
# TensorRT
# ------------------------------------------------------------------------------------------------


class _Buffer:
    """Memory of one I/O tensor: pinned host + device memory, or one mapped host buffer (Jetson)."""

    def __init__(self, cu, mapped: bool):
        self.cu, self.mapped = cu, mapped
        self.capacity, self.host, self.device, self.view = 0, 0, 0, None

    def ensure(self, nbytes: int) -> None:
        from edgesdk.kernels._cuda import check

        if nbytes <= self.capacity:
            return
        self.free()
        cu, cap = self.cu, max(int(nbytes), 256)
        if self.mapped:
            self.host = int(check(cu.cuMemHostAlloc(cap, cu.CU_MEMHOSTALLOC_DEVICEMAP)))
            self.device = int(check(cu.cuMemHostGetDevicePointer(self.host, 0)))
        else:
            self.host = int(check(cu.cuMemHostAlloc(cap, 0)))
            self.device = int(check(cu.cuMemAlloc(cap)))
        self.capacity = cap
        self.view = np.ctypeslib.as_array((ctypes.c_ubyte * cap).from_address(self.host))

    def free(self) -> None:
        from edgesdk.kernels._cuda import check

        if self.capacity:
            self.view = None
            if not self.mapped:
                check(self.cu.cuMemFree(self.cu.CUdeviceptr(self.device)))
            check(self.cu.cuMemFreeHost(self.host))
        self.capacity, self.host, self.device = 0, 0, 0


class _TrtBackend:
    def __init__(self, plan: Path, manifest: dict | None, cuda_graph: bool, dla_core: int | None = None):
        from edgesdk.trt.engine import check_plan_compatible, engine_record

        record = engine_record(manifest) if manifest else None
        if record is not None:  # refuse another TensorRT version / GPU before touching the plan
            check_plan_compatible(record)
        try:
            import tensorrt as trt
        except ImportError as e:
            raise EdgeSDKError("backend='tensorrt' needs TensorRT, which is not installed here",
                               "install TensorRT >= 10.3 (JetPack 6.1+ ships it), or ask for "
                               "Engine(path, backend='onnxruntime') explicitly") from e
        from edgesdk.kernels._cuda import _driver, check, init
        from edgesdk.trt.registry import register_plugins
        register_plugins()  # before deserializing: Python plugin creators live in this process
        self.trt, self.cu, self.check = trt, _driver(), check
        cu = self.cu
        init()
        self.cu_ctx = check(cu.cuCtxGetCurrent())
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        if dla_core is not None:  # an engine built for a DLA core runs on that core (IRuntime::setDLACore)
            self.runtime.DLA_core = int(dla_core)
        self.engine = self.runtime.deserialize_cuda_engine(plan.read_bytes())
        if self.engine is None:
            raise EdgeSDKError(f"TensorRT {trt.__version__} could not load {plan} (see its log above)",
                               "rebuild the engine on this machine with `edgesdk build`: plans are tied "
                               "to one TensorRT version and one GPU kind")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise EdgeSDKError(f"TensorRT could not create an execution context for {plan} (see its log above; "
                               "often too little free GPU memory)", "free GPU memory (other engines, processes) "
                               "and retry, or rebuild with a smaller --workspace-mb")
        self.inputs, self.outputs = [], []
        for i in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(i)
            try:
                dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
            except TypeError:  # bf16, fp8, int4: no numpy type
                raise EdgeSDKError(f"the engine's tensor {name!r} is {self.engine.get_tensor_dtype(name)}, which "
                                   "numpy cannot hold", "export the model with fp32/fp16/int inputs and outputs"
                                   ) from None
            info = TensorInfo(name, tuple(int(d) for d in self.engine.get_tensor_shape(name)), dtype)
            is_input = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
            (self.inputs if is_input else self.outputs).append(info)
        # CUDA objects after the checks that refuse a plan, so that a refusal leaks none
        self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        self.event = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
        dev = check(cu.cuCtxGetDevice())
        self.mapped = bool(check(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_INTEGRATED, dev)))
        self.buffers = {t.name: _Buffer(cu, self.mapped) for t in (*self.inputs, *self.outputs)}
        self.cuda_graph = cuda_graph
        self.graph_exec, self.graph_key = None, None

    def infer(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        cu, check, ctx, stream = self.cu, self.check, self.context, self.stream
        check(cu.cuCtxSetCurrent(self.cu_ctx))  # infer may be called from any thread
        key = []
        for t in self.inputs:
            a = feeds[t.name]
            if hasattr(a, "__cuda_array_interface__") and not isinstance(a, np.ndarray):
                iface = a.__cuda_array_interface__
                shape = tuple(int(d) for d in iface["shape"])
                _check_array(t, shape, np.dtype(iface["typestr"]))
                addr = _contiguous_ptr(t.name, iface)
                if iface.get("stream"):  # the producer's pending work must finish first
                    check(cu.cuEventRecord(self.event, cu.CUstream(int(iface["stream"]))))
                    check(cu.cuStreamWaitEvent(stream, self.event, 0))
            else:
                a = np.asarray(a)
                _check_array(t, a.shape, a.dtype)
                a = np.ascontiguousarray(a)
                shape, buf = a.shape, self.buffers[t.name]
                buf.ensure(a.nbytes)
                buf.view[: a.nbytes] = a.reshape(-1).view(np.uint8)
                if not buf.mapped and a.nbytes:
                    check(cu.cuMemcpyHtoDAsync(cu.CUdeviceptr(buf.device), buf.host, a.nbytes, stream))
                addr = buf.device
            if tuple(ctx.get_tensor_shape(t.name)) != shape and not ctx.set_input_shape(t.name, shape):
                lo, _, hi = self.engine.get_tensor_profile_shape(t.name, 0)
                raise EdgeSDKError(f"input {t.name!r} shape {shape} is outside the engine's profile "
                                   f"{tuple(lo)} .. {tuple(hi)}", "rebuild with a larger max batch")
            ctx.set_tensor_address(t.name, addr)
            key.append((t.name, addr, shape))
        out_shapes = {}
        for t in self.outputs:
            shape = tuple(int(d) for d in ctx.get_tensor_shape(t.name))
            if any(d < 0 for d in shape):
                raise EdgeSDKError(f"output {t.name!r} has a data-dependent shape {shape}",
                                   "edgesdk's runtime needs output shapes known from the input shapes")
            nbytes = int(np.prod(shape)) * t.dtype.itemsize
            buf = self.buffers[t.name]
            buf.ensure(nbytes)
            ctx.set_tensor_address(t.name, buf.device)
            out_shapes[t.name] = (shape, nbytes)
            key.append((t.name, buf.device, shape))
        self._execute(tuple(key))
        if not self.mapped:
            for t in self.outputs:
                buf, nbytes = self.buffers[t.name], out_shapes[t.name][1]
                if nbytes:
                    check(cu.cuMemcpyDtoHAsync(buf.host, cu.CUdeviceptr(buf.device), nbytes, stream))
        check(cu.cuStreamSynchronize(stream))
        return {t.name: self.buffers[t.name].view[: out_shapes[t.name][1]].view(t.dtype)
                .reshape(out_shapes[t.name][0]).copy() for t in self.outputs}

    def _execute(self, key: tuple) -> None:
        cu, check, stream = self.cu, self.check, self.stream
        if not self.cuda_graph:
            if not self.context.execute_async_v3(int(stream)):
                raise EdgeSDKError("TensorRT failed to enqueue the engine (see its log above)",
                                   "run tools/trt_smoke.py to find the failing plugin")
            return
        if key != self.graph_key:
            self._drop_graph()
            # One plain launch first: TensorRT may initialise lazily, which must not be captured.
            if not self.context.execute_async_v3(int(stream)):
                raise EdgeSDKError("TensorRT failed to enqueue the engine (see its log above)",
                                   "run tools/trt_smoke.py to find the failing plugin")
            mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            check(cu.cuStreamBeginCapture(stream, mode))
            ok = self.context.execute_async_v3(int(stream))
            err, graph = cu.cuStreamEndCapture(stream)  # not check(): an invalidated capture is this message
            if not ok or int(err) != 0:
                if int(err) == 0:
                    check(cu.cuGraphDestroy(graph))
                raise EdgeSDKError("TensorRT could not be captured in a CUDA graph"
                                   + (f" (CUDA error {int(err)} at the end of the capture)" if int(err) else ""),
                                   "use Engine(..., cuda_graph=False)")
            self.graph_exec = check(cu.cuGraphInstantiate(graph, 0))
            check(cu.cuGraphDestroy(graph))
            self.graph_key = key
        check(cu.cuGraphLaunch(self.graph_exec, stream))

    def _drop_graph(self) -> None:
        if self.graph_exec is not None:
            self.check(self.cu.cuGraphExecDestroy(self.graph_exec))
        self.graph_exec, self.graph_key = None, None

    def close(self) -> None:
        cu, check = self.cu, self.check
        check(cu.cuCtxSetCurrent(self.cu_ctx))
        check(cu.cuStreamSynchronize(self.stream))
        self._drop_graph()
        for b in self.buffers.values():
            b.free()
        check(cu.cuEventDestroy(self.event))
        check(cu.cuStreamDestroy(self.stream))
        self.context = None  # context before engine before runtime
        self.engine = None
        self.runtime = None
