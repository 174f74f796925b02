"""Build a TensorRT engine (``model.plan``) from a rewritten ONNX model, and check plans before loading.

The build follows ``../shared/TRT_NOTES.md`` §3/§6: ONNX parser, a **strongly typed** network (the
one precision path on TensorRT 10.3, 10.16 and 11.x: Q/DQ decide the types), edgesdk's Python
plugin creators registered before parsing, builder settings from the device profile, a timing
cache file reused across builds, optional DLA with GPU fallback, and the plan written atomically.

Without TensorRT, :func:`build_engine` returns ``built=False`` with a plain reason; nothing is
faked. Everything here that touches TensorRT has never been run where it was written (no TensorRT
could be installed); ``tools/trt_smoke.py`` is the first thing to run it.

Inputs read from the pipeline's objects (``edgesdk.devices.DeviceProfile``,
``edgesdk.config.BuildConfig``; read by attribute name, so this module does not import them):

* ``config.workspace_mb`` or else ``device.workspace_mb``: TensorRT workspace memory-pool limit.
* ``device.compute_capability`` (``"8.7"``; also ``"sm_87"``, ``(8, 7)``, ``87``): the target; a build
  on a GPU of another compute capability is refused (plans are not portable).
* ``profile`` (input name → ``{"min", "opt", "max"}``, what ``edgesdk build`` resolved from ``--shape``,
  ``--min-shape``, ``--max-shape``: :func:`edgesdk.onnx_io.shape_ranges`); without it ``config.shape_hints``
  (input name → full shape) gives the opt shape, min has batch 1, max has batch ``max(opt, config.max_batch or 8)``.
* optional ``config.dla_core`` (int or None): build for this DLA core with GPU fallback.
* optional ``config.builder_optimization_level`` (int 0-5, default 3).
* optional ``config.timing_cache`` (path): timing cache file; default
  ``$EDGESDK_CACHE/trt/timing-<trt>-sm<XY>.cache`` (``~/.cache/edgesdk``), shared by all builds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from edgesdk.errors import EdgeSDKError

PLAN_NAME = "model.plan"


def _tensorrt():
    """The ``tensorrt`` module, or None where it is not installed."""
    try:
        import tensorrt as trt
    except ImportError:
        return None
    return trt


def normalize_cc(value: Any) -> str | None:
    """Compute capability as ``"X.Y"`` from ``"8.7"``, ``"sm_87"``, ``(8, 7)``, ``87`` or ``"87"``.

    Raises:
        EdgeSDKError: the value is not a compute capability.
    """
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return f"{int(value[0])}.{int(value[1])}"
    s = str(value).strip().lower().removeprefix("sm_").removeprefix("sm")
    if "." in s:
        major, _, minor = s.partition(".")
        if major.isdigit() and minor.isdigit():
            return f"{int(major)}.{int(minor)}"
    elif s.isdigit() and len(s) >= 2:
        return f"{int(s[:-1])}.{int(s[-1])}"
    raise EdgeSDKError(f"{value!r} is not a compute capability",
                       "write it as '8.7', 'sm_87' or (8, 7)")


def gpu_info() -> dict:
    """CUDA driver version and compute capability of device 0 (``None`` each where no GPU answers)."""
    info: dict[str, str | None] = {"cuda": None, "compute_capability": None}
    try:
        from edgesdk.kernels._cuda import _driver, check, current_arch, gpu_available

        if not gpu_available():
            return info
        v = int(check(_driver().cuDriverGetVersion()))
        info["cuda"] = f"{v // 1000}.{(v % 1000) // 10}"
        info["compute_capability"] = normalize_cc(current_arch())
    except Exception as e:  # no driver, no cuda-python: report nothing rather than guess, but say why
        info["gpu_error"] = f"{type(e).__name__}: {e}"
    return info


def tensorrt_info() -> dict:
    """``{"tensorrt": version | "absent", "cuda": ..., "compute_capability": ...}`` of this machine."""
    trt = _tensorrt()
    return {"tensorrt": trt.__version__ if trt else "absent", **gpu_info()}


def _atomic_write(path: Path, data: bytes | memoryview) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def default_timing_cache(trt_version: str, cc: str | None, sm_count: int | None = None) -> Path:
    """One cache per TensorRT version, GPU kind (compute capability and SM count: AGX Orin, Orin NX and Orin Nano
    are all sm_87) and edgesdk version (whose plugins' tactics the cache times)."""
    from edgesdk import __version__

    root = Path(os.environ.get("EDGESDK_CACHE", Path.home() / ".cache" / "edgesdk"))
    sm = (cc or "unknown").replace(".", "")
    sms = f"-{sm_count}sm" if sm_count else ""
    return root / "trt" / f"timing-{trt_version}-sm{sm}{sms}-edgesdk{__version__}.cache"


def build_engine(onnx_path: Path, out_dir: Path, device: Any, config: Any, profile: dict | None = None) -> dict:
    """Parse ``onnx_path`` with TensorRT's ONNX parser and write ``out_dir/model.plan``.

    Args:
        onnx_path (Path): The rewritten ONNX model (plugin nodes in domain ``edgesdk``).
        out_dir (Path): The build folder; ``model.plan`` is written there (temp name + ``os.replace``).
        device (DeviceProfile): Reads ``workspace_mb`` and ``compute_capability``.
        config (BuildConfig): Reads ``workspace_mb``, ``shape_hints``, and where present
            ``dla_core``, ``builder_optimization_level``, ``timing_cache``, ``max_batch``.
        profile (dict | None): The optimization profile, input name → ``{"min", "opt", "max"}`` full shapes
            (report.json ``model.profile``); None: from ``config`` as :func:`profile_shapes` says.

    Returns:
        dict: ``built`` (bool), ``reason`` (str or None: why nothing was built), ``plan`` (str path or
        None), ``tensorrt`` (version or ``"absent"``), ``cuda`` (driver CUDA version or None),
        ``compute_capability`` (``"X.Y"`` of the GPU the plan is for, or None), ``details`` (dict:
        build seconds, timing cache, DLA use, notes). The first six go into the manifest; loading
        checks them (:func:`check_plan_compatible`).
    """
    info = tensorrt_info()
    result: dict[str, Any] = {"built": False, "reason": None, "plan": None, **info, "details": {}}
    trt = _tensorrt()
    if trt is None:
        result["reason"] = ("TensorRT is not installed on this machine, so no engine was built. "
                            "Run the same build on the Jetson "
                            "(JetPack 6.1+/7.2) or any machine with TensorRT >= 10.3.")
        return result
    if info["compute_capability"] is None:
        why = f" ({info['gpu_error']})" if info.get("gpu_error") else ""
        result["reason"] = (f"TensorRT is installed but no CUDA GPU answers{why}, so no engine was built. On "
                            "JetPack 6 install cuda-python 12.x (`pip install 'cuda-python>=12.6,<13'`).")
        return result
    mismatch = target_mismatch(device, info["compute_capability"])
    if mismatch:
        result["reason"] = mismatch
        return result
    try:
        details = _build(trt, Path(onnx_path), Path(out_dir), device, config, info, profile)
    except EdgeSDKError as e:
        result["reason"] = str(e)
        return result
    except Exception as e:  # a TensorRT/bindings/plugin error: report it, keep the verified ONNX build
        result["reason"] = (f"TensorRT failed while building the engine: {type(e).__name__}: {e}. "
                            "Run tools/trt_smoke.py to test each plugin on its own and report its log.")
        (Path(out_dir) / PLAN_NAME).unlink(missing_ok=True)  # a failed build ships no plan
        return result
    result.update(built=True, plan=str(Path(out_dir) / PLAN_NAME), details=details)
    return result


def target_mismatch(device: Any, here_cc: str | None) -> str | None:
    """Why a plan built on this GPU would not run on the profile's target (None if it would)."""
    target = normalize_cc(getattr(device, "compute_capability", None))
    if target is None or target == here_cc:
        return None
    return (f"the device profile targets compute capability {target} but this GPU is {here_cc}; "
            "TensorRT plans only run on the GPU kind they were built on, so build on the target device")


def _build(trt, onnx_path: Path, out_dir: Path, device, config, info: dict, profile: dict | None = None) -> dict:
    from edgesdk.trt.registry import register_plugins

    t0 = time.perf_counter()
    notes: list[str] = []
    logger = trt.Logger(trt.Logger.WARNING)
    register_plugins()  # before parsing: the parser looks plugin creators up by name/version/namespace
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EdgeSDKError(f"TensorRT's ONNX parser rejected {onnx_path.name}: {errors}",
                           "check that the plugin nodes carry plugin_version/plugin_namespace and "
                           "that the TensorRT version is >= 10.3")

    cfg = builder.create_builder_config()
    if uses_sparse_kv(onnx_path):
        # EdgeSparseKVAttention writes its cache state in place (aliased plugin I/O, TensorRT >= 10.3)
        cfg.set_preview_feature(trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03, True)
    workspace_mb = int(getattr(config, "workspace_mb", None) or getattr(device, "workspace_mb"))
    cfg.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    level = getattr(config, "builder_optimization_level", None)
    cfg.builder_optimization_level = 3 if level is None else int(level)

    cache_path = getattr(config, "timing_cache", None)
    cache_path = Path(cache_path) if cache_path else default_timing_cache(
        trt.__version__, info["compute_capability"], _sm_count())
    try:
        data = cache_path.read_bytes() if cache_path.exists() else b""
    except OSError as e:
        data = b""
        notes.append(f"timing cache {cache_path} unreadable ({e}): started a fresh one")
    try:
        cache = cfg.create_timing_cache(data)
    except Exception:  # noqa: BLE001 - a damaged file may raise rather than give None
        cache = None
    # set_timing_cache returns False for a cache of another device (all Orin modules are sm_87) and
    # create_timing_cache None for a damaged file: either way, time the tactics again from an empty cache
    if cache is None or not cfg.set_timing_cache(cache, ignore_mismatch=False):
        notes.append(f"timing cache {cache_path} was not usable here (another GPU or a damaged file): "
                     "started a fresh one, which replaces it")
        cfg.set_timing_cache(cfg.create_timing_cache(b""), ignore_mismatch=False)

    dla_core = getattr(config, "dla_core", None)
    used_dla = None
    if dla_core is not None:
        if builder.num_DLA_cores > int(dla_core):
            cfg.default_device_type = trt.DeviceType.DLA
            cfg.DLA_core = int(dla_core)
            cfg.set_flag(trt.BuilderFlag.GPU_FALLBACK)
            used_dla = int(dla_core)
        else:
            notes.append(f"DLA core {dla_core} asked for but this GPU has {builder.num_DLA_cores} "
                         "DLA cores; built for the GPU only")

    opt_profile = _profile(builder, network, config, profile)
    if opt_profile is not None:
        cfg.add_optimization_profile(opt_profile)

    plan = builder.build_serialized_network(network, cfg)
    if plan is None:
        raise EdgeSDKError(f"TensorRT could not build an engine for {onnx_path.name} (see the "
                           "TensorRT log above)",
                           "run tools/trt_smoke.py to test each plugin on its own, then report the log")
    timing = cfg.get_timing_cache()  # None if no cache is set
    try:  # a cache that cannot be saved costs the next build its tactic timing, nothing else
        if timing is not None:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(cache_path, memoryview(timing.serialize()))
    except OSError as e:
        notes.append(f"timing cache not saved to {cache_path} ({e}): the next build times the tactics again")
    out_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(out_dir / PLAN_NAME, memoryview(plan))  # last: the plan exists only for a build that finished
    return {"build_s": round(time.perf_counter() - t0, 2), "timing_cache": str(cache_path),
            "workspace_mb": workspace_mb, "dla_core": used_dla, "notes": notes}


def uses_sparse_kv(onnx_path: Path) -> bool:
    """Whether the ONNX model has ``EdgeSparseKVAttention`` nodes (read without its external data)."""
    import onnx

    from edgesdk.formats.sparse_kv import OP_TYPE

    return any(n.op_type == OP_TYPE for n in onnx.load(str(onnx_path), load_external_data=False).graph.node)


def _sm_count() -> int | None:
    try:
        from edgesdk.kernels._cuda import device_facts

        return int(device_facts()["sm_count"])
    except Exception:  # the cache name is then per compute capability only
        return None


def _profile(builder, network, config, given=None):
    """One optimization profile for inputs with dynamic dims; None if all inputs are static."""
    shapes = {}
    for i in range(network.num_inputs):
        t = network.get_input(i)
        shapes[t.name] = tuple(t.shape)
    ranges = profile_shapes(shapes, dict(getattr(config, "shape_hints", None) or {}),
                            int(getattr(config, "max_batch", None) or 8), given)
    if not ranges:
        return None
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in ranges.items():
        profile.set_shape(name, lo, opt, hi)
    return profile


def profile_shapes(shapes: dict[str, tuple], hints: dict[str, list], max_batch: int = 8,
                   given: dict[str, dict] | None = None) -> dict:
    """``{input: (min, opt, max)}`` for every input with a dynamic (-1) dim.

    ``given`` (input → ``{"min", "opt", "max"}``, report.json ``model.profile``) decides where it names the input.
    Else the leading dim may be dynamic (batch: min 1, opt from the hint or 1, max ``max(opt,
    max_batch)``); other dynamic dims take the hint's value.

    Raises:
        EdgeSDKError: a non-leading dynamic dim without a hint, or a hint or given range that contradicts the model.
    """
    out = {}
    for name, shape in shapes.items():
        if all(d >= 0 for d in shape):
            continue
        if given and name in given:
            r = given[name]
            lo, opt, hi = (tuple(int(d) for d in r[k]) for k in ("min", "opt", "max"))
            if any(len(x) != len(shape) or any(d >= 0 and d != v for d, v in zip(shape, x)) for x in (lo, opt, hi)):
                raise EdgeSDKError(f"the optimization profile of {name!r} ({list(lo)} .. {list(hi)}) does not fit "
                                   f"the model's {list(shape)}", "rebuild from the original model with edgesdk build")
            out[name] = (lo, opt, hi)
            continue
        hint = hints.get(name)
        if hint is not None and (len(hint) != len(shape) or any(
                d >= 0 and d != h for d, h in zip(shape, hint))):
            raise EdgeSDKError(f"shape hint {name}={list(hint)} does not fit the model's {list(shape)}",
                               "give a full shape with the model's fixed dims, e.g. --shape x:1x3x224x224")
        if hint is None:
            if any(d < 0 for d in shape[1:]):
                raise EdgeSDKError(f"input {name!r} has dynamic dims besides the batch: {list(shape)}",
                                   f"give its shape: --shape {name}:" + "x".join(
                                       "N" if d < 0 else str(d) for d in shape))
            hint = [1, *shape[1:]]
        opt = tuple(int(h) for h in hint)
        if shape[0] < 0:
            lo, hi = (1, *opt[1:]), (max(opt[0], max_batch), *opt[1:])
        else:
            lo = hi = opt
        out[name] = (lo, opt, hi)
    return out


def engine_record(manifest: dict) -> dict | None:
    """The TensorRT fields a build recorded in ``manifest`` (top level or under ``"engine"``)."""
    for rec in (manifest.get("engine"), manifest):
        if isinstance(rec, dict) and "tensorrt" in rec and "compute_capability" in rec:
            return rec
    return None


def check_plan_compatible(recorded: dict, current: dict | None = None) -> None:
    """Refuse a plan built by another TensorRT version or for another compute capability.

    Args:
        recorded (dict): ``tensorrt`` and ``compute_capability`` as written at build time.
        current (dict): The same for this machine; default :func:`tensorrt_info`.

    Raises:
        EdgeSDKError: they differ, naming both and saying to rebuild.
    """
    current = tensorrt_info() if current is None else current
    built_trt, here_trt = str(recorded.get("tensorrt")), str(current.get("tensorrt"))
    built_cc = normalize_cc(recorded.get("compute_capability"))
    here_cc = normalize_cc(current.get("compute_capability"))
    rebuild = ("rebuild the engine on this machine: edgesdk build <model.onnx> --device <profile> "
               "(plans are tied to one TensorRT version and one GPU kind)")
    if built_trt in ("absent", "None"):
        raise EdgeSDKError("this build folder has no TensorRT engine (it was built without TensorRT)",
                           rebuild)
    if recorded.get("built") is False:  # TensorRT was there but the build failed: a plan here was never verified
        raise EdgeSDKError(f"the manifest says the engine build failed ({recorded.get('reason') or 'no reason'}), "
                           "so the plan beside it is not one edgesdk built and verified", rebuild)
    if here_trt == "absent":
        raise EdgeSDKError(f"the plan needs TensorRT {built_trt}, which is not installed here",
                           "install TensorRT (JetPack ships it) or use backend='onnxruntime'")
    if _version_key(built_trt) != _version_key(here_trt):
        raise EdgeSDKError(f"the plan was built with TensorRT {built_trt}; this machine has {here_trt}",
                           rebuild)
    if built_cc != here_cc:
        raise EdgeSDKError(f"the plan was built for compute capability {built_cc}; this GPU is {here_cc}",
                           rebuild)


def _version_key(v: str) -> tuple:
    """``"10.3.0.26"`` → ``(10, 3, 0)``: plans are tied to major.minor.patch."""
    parts = []
    for p in v.split(".")[:3]:
        parts.append(int(p) if p.isdigit() else p)
    return tuple(parts)
