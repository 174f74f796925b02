"""``edgesdk build``: the pass pipeline, written into one build folder atomically.

load/validate → quantize (Q/DQ) → rewrite (sparsify, choose kernels, pack, plugin nodes) →
verify (Polygraphy, ONNX Runtime) → TensorRT engine → report + manifest.

The folder is assembled under a temporary name beside its destination and renamed into place
at the end: a failed build leaves nothing behind, and an existing folder is only replaced with
``force``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx

from edgesdk.calibration import load_feeds, past_inputs, random_feeds, sample_tokens
from edgesdk.config import BuildConfig
from edgesdk.devices import DeviceProfile, get_profile
from edgesdk.errors import EdgeSDKError
from edgesdk.inspect import find_linears, quant_state
from edgesdk.manifest import MANIFEST_NAME, make_manifest, tensorrt_version
from edgesdk.onnx_io import (NP_TYPES, _umask, graph_inputs, load_model, model_sha256, opset, save_model, sha256_file, shape_ranges,
                             tensor_dims)
from edgesdk.quantize import check_not_qoperator, quantize_int8, select_layers
from edgesdk.report import REPORT_NAME, write_json

MODEL_NAME = "model.onnx"

# A step reporter: ``step(title)`` is a context manager; inside, ``advance(done, total)`` may be called.
StepFn = Callable[[str], contextlib.AbstractContextManager]


@contextlib.contextmanager
def _quiet_step(title: str) -> Iterator[Callable[[int, int], None]]:
    yield lambda done, total: None


def default_output(model_path: Path) -> Path:
    return Path("out") / Path(model_path).stem


def check_output(out: Path, force: bool, inputs: tuple = (), marker: tuple[str, ...] = (REPORT_NAME, MANIFEST_NAME),
                 what: str = "an edgesdk build folder") -> None:
    """Refuse, before any work, an existing folder without ``force``, and with it any folder that is not one this
    tool wrote (no ``marker`` files; an empty one is fine), one holding an input (``inputs``: the model, the
    calibration file) or the current directory; and an unwritable destination."""
    if out.exists() and not force:
        raise EdgeSDKError(f"output folder {out} already exists.", "pass --force to replace it, or choose another -o.")
    if out.exists() and not out.is_dir():
        raise EdgeSDKError(f"output path {out} exists and is not a folder.", "choose another -o.")
    if out.exists():
        real, cwd = out.resolve(), Path.cwd().resolve()
        if real == cwd or real in cwd.parents or real == Path.home().resolve():
            raise EdgeSDKError(f"--force would delete {out} ({real}), which holds the current directory or is home.",
                               "choose an -o of its own, e.g. -o out/NAME.")
        for i in inputs:
            if i and Path(i).exists() and (real == Path(i).resolve() or real in Path(i).resolve().parents):
                raise EdgeSDKError(f"--force would delete {out}, which holds the input {i}.",
                                   "choose another -o, or move the input out of it first.")
        if any(out.iterdir()) and not all((out / m).is_file() for m in marker):
            raise EdgeSDKError(f"{out} is not {what} (no {'/'.join(marker)}): --force replaces only those.",
                               "choose another -o, or empty or remove that folder yourself.")
    anc = out.parent.resolve()
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir() or not os.access(anc, os.W_OK | os.X_OK):
        raise EdgeSDKError(f"output folder {out} cannot be written ({anc} is not writable).",
                           "choose an -o inside a folder you can write to.")


def io_info(model: onnx.ModelProto) -> dict:
    def desc(vi):
        return {"name": vi.name, "dtype": onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type).lower(),
                "shape": tensor_dims(vi)}

    return {"inputs": [desc(v) for v in graph_inputs(model)], "outputs": [desc(v) for v in model.graph.output]}


def plain_layers(model: onnx.ModelProto, reason: str, skipped: dict[str, str] | None = None) -> list[dict]:
    """Report rows for a model left without plugin kernels (``--kernels none``)."""
    rows = []
    for li in find_linears(model):
        rows.append({"name": li.name, "kind": li.kind, "shape": [li.k, li.n], "quantized": li.quantized,
                     "sparsity": 0.0, "kernel": "none",
                     "bytes_dense": li.n * li.k + 4 * li.n if li.quantized else 2 * li.n * li.k,
                     "bytes_packed": None, "reason": (skipped or {}).get(li.name, reason), "measured": None,
                     "choice": None})
    return rows


def split_feeds(model: onnx.ModelProto, specs: dict, config: BuildConfig,
                longest: dict | None = None) -> tuple[list[dict], list[dict]]:
    """Calibration feeds and verification feeds (the samples after the calibration ones when there are
    enough, else the first ones) from ``config.calibration`` or seeded random data.

    A decoder with a KV cache fed token ids calibrates on token windows as prefills (empty cache, every position;
    :func:`edgesdk.calibration.load_feeds`, ``prefill``) as long as the profile's longest (``longest``: the specs at
    its max shape, else ``specs``), so that activation ranges cover every position the engine will see, and verifies
    on decode steps at the build shape after its own cache, from the text after the calibration windows."""
    need = config.calibration_count + config.verify_count
    if past_inputs(model, specs) and _token_source(config):
        longest = longest or specs
        calib = load_feeds(config.calibration, longest, config.calibration_count, config.seed, model, prefill=True)
        if config.calibration is None:  # random tokens: nothing to hold out
            check = load_feeds(None, specs, config.verify_count, config.seed + 1, model)
            return calib, check
        used = len(calib) * sample_tokens(longest, model)
        try:
            check = load_feeds(config.calibration, specs, config.verify_count, config.seed, model, skip=used)
        except EdgeSDKError:
            raise EdgeSDKError(
                f"{config.calibration} has too few tokens to verify on text the calibration did not see: "
                f"{len(calib)} calibration windows of {sample_tokens(longest, model)} tokens (the profile's longest) "
                f"take {used}, and each verification sample needs {sample_tokens(specs, model)} more.",
                "add text, or lower --calibration-count (or --max-shape, which sets the window).") from None
        return calib, check
    feeds = load_feeds(config.calibration, specs, need, config.seed, model, config.image_mean, config.image_std)
    calib = feeds[: config.calibration_count]
    check = (feeds[config.calibration_count:] or feeds)[: config.verify_count]
    return calib, check


def _token_source(config: BuildConfig) -> bool:
    """The calibration source gives token ids of any length: a ``.txt``, or seeded random data."""
    return config.calibration is None or Path(config.calibration).suffix.lower() == ".txt"


def build_ranges(model: onnx.ModelProto, config: BuildConfig) -> dict[str, tuple[list[int], ...]]:
    """Every input's (min, opt, max) shape from the build's ``--shape``/``--min-shape``/``--max-shape``."""
    return shape_ranges(model, config.shape_hints, config.min_shapes, config.max_shapes, config.max_batch)


def specs_at(model: onnx.ModelProto, ranges: dict, level: int = 1) -> dict:
    """``{input: (shape, dtype)}`` at one level of ``ranges`` (0 min, 1 opt: the build shape, 2 max)."""
    return {vi.name: (list(ranges[vi.name][level]), np.dtype(NP_TYPES[vi.type.tensor_type.elem_type]))
            for vi in graph_inputs(model)}


def longest_specs(model: onnx.ModelProto, ranges: dict) -> dict:
    """The specs at the profile's max shape with the build shape's batch: the longest sequence and KV cache one
    calibration window of a decoder must cover."""
    opt, hi = specs_at(model, ranges, 1), specs_at(model, ranges, 2)
    return {k: ([opt[k][0][0], *hi[k][0][1:]] if hi[k][0] else hi[k][0], hi[k][1]) for k in hi}


def profile_of(model: onnx.ModelProto, ranges: dict) -> dict[str, dict[str, list[int]]]:
    """The TensorRT optimization profile (report.json ``model.profile``): min/opt/max of the inputs with a dynamic
    dim."""
    dynamic = {vi.name for vi in graph_inputs(model) if any(not isinstance(d, int) for d in tensor_dims(vi))}
    return {k: dict(zip(("min", "opt", "max"), v)) for k, v in ranges.items() if k in dynamic}


RANGE_SAMPLES = 2  # verification samples at each of the profile's min and max shapes


def range_feeds(model: onnx.ModelProto, ranges: dict, config: BuildConfig) -> dict[str, list[dict]]:
    """Feeds at the profile's min and max shapes, where they differ from the build shape in more than the batch (a
    longer sequence or KV cache must run through the rewritten graph as the build shape did): from a token-id
    ``--calibration`` (``.txt``, which fits any length; the last samples of it, past those the build calibrates and
    verifies on where there are enough), else seeded random data."""
    out = {}
    for level, label in ((0, "min"), (2, "max")):
        if any(list(r[level][1:]) != list(r[1][1:]) for r in ranges.values()):
            n = min(config.verify_count, RANGE_SAMPLES)
            specs = specs_at(model, ranges, level)
            feeds = []
            if config.calibration and Path(config.calibration).suffix.lower() == ".txt":
                opt, longest = specs_at(model, ranges, 1), longest_specs(model, ranges)
                if past_inputs(model, opt):  # after the calibration windows and the verification samples
                    skip = (config.calibration_count * sample_tokens(longest, model)
                            + config.verify_count * sample_tokens(opt, model))
                    count = n
                else:
                    skip, count = 0, config.calibration_count + config.verify_count + n
                try:
                    have = load_feeds(Path(config.calibration), specs, count, config.seed, model, skip=skip)
                except EdgeSDKError as e:
                    raise EdgeSDKError(f"verifying at the profile's {label} shape: {e.problem}",
                                       f"add tokens to {config.calibration}, or lower --calibration-count or "
                                       f"--{label}-shape.") from None
                feeds = have[-n:]
            out[label] = feeds or random_feeds(specs, n, config.seed + 1 + level, model)
    return out


def engine_step(onnx_path: Path, folder: Path, device: DeviceProfile, config: BuildConfig,
                profile: dict | None = None) -> dict:
    """Build the TensorRT engine through ``edgesdk.trt.engine`` or say why there is none."""
    try:
        from edgesdk.trt.engine import build_engine
    except ImportError as e:
        if importlib.util.find_spec("tensorrt") is None:
            reason = "TensorRT is not installed"
        else:
            reason = f"edgesdk.trt.engine is unavailable ({e})"
        return {"built": False, "reason": reason, "plan": None, "tensorrt": tensorrt_version(), "cuda": None,
                "compute_capability": None}
    if config.workspace_mb:
        device = device.model_copy(update={"workspace_mb": config.workspace_mb})
    return build_engine(onnx_path, folder, device, config, profile)


def build(model_path: Path | str, config: BuildConfig, step: StepFn | None = None) -> dict:
    """Run the whole pipeline on ``model_path`` and write ``config.output``.

    Args:
        model_path: ONNX model (float or Q/DQ).
        config: Build options.
        step: Progress reporter (the CLI passes rich progress bars); None = silent.

    Returns:
        The report (also written as ``report.json`` in the build folder).

    Raises:
        EdgeSDKError: any bad input; nothing is left on disk then.
    """
    t0 = time.time()
    step = step or _quiet_step
    model_path = Path(model_path)
    out = Path(config.output) if config.output else default_output(model_path)
    device = get_profile(config.device)
    if config.dla_core is not None and config.dla_core >= device.dla_cores:
        raise EdgeSDKError(f"--use-dla-core {config.dla_core}: {device.name} has {device.dla_cores} DLA core(s)"
                           f"{'' if device.dla_cores == 0 else f' (0 to {device.dla_cores - 1})'}.",
                           "leave --use-dla-core out to build for the GPU" + (
                               "" if device.dla_cores == 0 else f", or pass 0 to {device.dla_cores - 1}") + ".")
    check_output(out, config.force, inputs=(model_path, config.calibration))
    if config.calibration and Path(config.calibration).exists():  # recorded absolute: `check` runs from anywhere
        config = config.model_copy(update={"calibration": str(Path(config.calibration).resolve())})
    with assembling(out) as tmp:  # before any work: a destination that cannot be written fails at once
        with step("Load and check the model"):
            model = load_model(model_path)
            check_not_qoperator(model, str(model_path))
            if any(n.domain == "edgesdk" for n in model.graph.node):
                raise EdgeSDKError(f"{model_path} is already an edgesdk build (it has edgesdk plugin nodes).",
                                   "build the original model; `edgesdk check` re-verifies a build folder.")
            ranges = build_ranges(model, config)
            specs = specs_at(model, ranges)
            passed_over: dict[str, str] = {}
            linears = find_linears(model, passed_over)
            if not linears:
                said = "; ".join(f"{k}: {v}" for k, v in list(passed_over.items())[:3])
                more = f" (and {len(passed_over) - 3} more)" if len(passed_over) > 3 else ""
                raise EdgeSDKError(f"{model_path} has no linear layers (MatMul/Gemm with a constant weight)"
                                   + (f"; passed over: {said}{more}." if said else "."),
                                   "edgesdk accelerates transformer linears; deploy this model with TensorRT directly.")
            state = quant_state(model)
            model_sha = model_sha256(model_path)

        with step("Read calibration data"):
            calib, check_feeds = split_feeds(model, specs, config, longest_specs(model, ranges))

        notes = ["model already in Q/DQ form: used as is"] if state == "qdq" else []
        if config.verify and any(v is c for v in check_feeds for c in calib):  # split_feeds reused the same feeds
            notes.append(f"verification inputs are calibration samples: {config.calibration} holds no more than the "
                         f"{len(calib)} used to calibrate; give it {config.calibration_count + config.verify_count} "
                         "or more samples (or lower --calibration-count) to verify on held-out data")
        if not config.verify:
            notes.append("verification skipped (--no-verify)")
        quantized, skipped, smoothing = quantize_step(model, linears, state, calib, config, step)

        if config.kernels == "none" and config.sparsity == 0:
            processed, layers = quantized, plain_layers(quantized, "kernels=none", skipped)
        else:
            rewrite_model = _rewrite_fn()
            with step(f"Rewrite linears (kernels={config.kernels}, sparsity={config.sparsity})"):
                processed, layers = rewrite_model(quantized, config, calib, device)

        for r in layers:  # SmoothQuant's alpha of the layer's group (None: not smoothed); the INT8 error comes below
            r.update({"smooth_alpha": (smoothing.get(r["name"]) or (None, None, None))[2], **dict.fromkeys(SQNR_KEYS)})
        verify_rows = []
        if config.verify:
            pruned_ref = None
            if config.sparsity > 0 and config.kernels != "none":
                with step("Prune a dense reference with the same masks (for the verification)"):
                    pruned_ref = pruned_reference(quantized, calib, config, device)
            extra_feeds = range_feeds(model, ranges, config)
            verify_rows = verify_all(model, processed, pruned_ref, check_feeds, config, step, extra_feeds)
            if any(r["quantized"] for r in layers):
                with step("Measure each INT8 layer's error (output SQNR)"):
                    layer_sqnr(layers, quantized, {"build": check_feeds, **extra_feeds},
                               None if state == "qdq" else model, smoothing)

        try:
            with step("Write the build folder"):
                onnx_path = save_model(processed, tmp / MODEL_NAME)
            with step("Build the TensorRT engine"):
                engine = engine_step(onnx_path, tmp, device, config, profile_of(model, ranges))
            if config.verify and engine.get("built"):
                verify_rows = verify_rows + engine_rows(Path(engine["plan"]), processed, check_feeds, config, step,
                                                        extra_feeds)
            report = {
                "edgesdk_report": 1,
                "device": device.model_dump(),
                "model": {"path": str(model_path.resolve()), "sha256": model_sha, "opset": opset(model), "quant_state": state,
                          **io_info(model), "shapes": {k: v[0] for k, v in specs.items()},
                          "profile": profile_of(model, ranges)},
                "processed_model": MODEL_NAME,
                "config": config.model_dump(mode="json"),
                "notes": notes,
                "layers": layers,
                "verify": verify_rows,
                "verified": verified(verify_rows),
                "engine": engine_summary(engine),
                "output": str(out),
                "seconds": round(time.time() - t0, 2),
            }
            extra = {"calibration": config.calibration} if config.calibration and Path(config.calibration).is_file() else {}
            finish_folder(tmp, out, report, model_path.resolve(), model_sha, device, engine, extra)
        except OSError as e:
            raise EdgeSDKError(f"could not write the build folder {out}: {e}",
                               "free disk space, or choose an -o on another disk.") from None
    return report


@contextlib.contextmanager
def assembling(out: Path) -> Iterator[Path]:
    """The hidden temp folder beside ``out`` in which a build folder is assembled (:func:`finish_folder` renames it
    into place); if the block raises, it is removed, with the parents made for it."""
    created, tmp = _make_tmp(out)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for p in created:  # deepest first; only folders this build made and left empty
            with contextlib.suppress(OSError):
                p.rmdir()
        raise


def engine_summary(engine: dict) -> dict:
    """report.json ``engine``: :func:`engine_step`'s result with the plan's file name instead of its path."""
    return {k: v for k, v in engine.items() if k != "plan"} | {
        "plan": Path(engine["plan"]).name if engine.get("plan") else None}


def finish_folder(tmp: Path, out: Path, report: dict, model_path: Path, model_sha: str, device, engine: dict,
                  extra: dict | None = None) -> None:
    """Write ``report.json`` and ``manifest.json`` (sha256 of every file, of the input ``model_path`` and ``extra``
    inputs) into ``tmp``, then rename it to ``out`` (an old ``out`` is replaced only once the new one is whole)."""
    write_json(tmp / REPORT_NAME, report)
    write_json(tmp / MANIFEST_NAME, make_manifest(tmp, model_path, model_sha, device, engine, extra))
    _move_into_place(tmp, out)


def _make_tmp(out: Path) -> tuple[list[Path], Path]:
    """The hidden temp folder beside ``out`` that becomes it at the end, and the parents made for it (to remove
    again if the build fails)."""
    created = [p for p in [out.parent, *out.parent.parents] if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        os.chmod(tmp, 0o777 & ~_umask())
    except OSError as e:
        for p in created:
            with contextlib.suppress(OSError):
                p.rmdir()
        raise EdgeSDKError(f"output folder {out} cannot be created ({e}).",
                           "choose an -o inside a folder you can write to.") from None
    return created, tmp


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished temp folder to ``out`` (replacing an old one only after the new one is whole)."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except OSError:
        if old is not None:
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_build_folder(build_dir: Path) -> tuple[dict, dict]:
    """``(report, manifest)`` of a build folder whose files all match the sha256 its manifest lists.

    Raises:
        EdgeSDKError: no such folder, not a build folder, damaged JSON, or a file missing or changed since the build.
    """
    import json

    if not build_dir.is_dir():
        raise EdgeSDKError(f"build folder {build_dir} does not exist.", "pass the folder `edgesdk build -o` wrote.")
    rpath, mpath = build_dir / REPORT_NAME, build_dir / MANIFEST_NAME
    if not rpath.is_file() or not mpath.is_file():
        raise EdgeSDKError(f"{build_dir} is not an edgesdk build folder (no {REPORT_NAME}/{MANIFEST_NAME}).",
                           "pass the folder `edgesdk build -o` wrote.")
    try:
        report, manifest = json.loads(rpath.read_text()), json.loads(mpath.read_text())
    except json.JSONDecodeError as e:
        raise EdgeSDKError(f"{build_dir}: report/manifest is not valid JSON ({e}).", "rebuild the folder.") from None
    files = manifest.get("files")
    if not isinstance(files, dict) or REPORT_NAME not in files or report.get("processed_model", MODEL_NAME) not in files:
        raise EdgeSDKError(f"{mpath} does not list the folder's files and their sha256 (it was edited or is not "
                           "edgesdk's).", "rebuild with `edgesdk build ... --force`.")
    for name, digest in files.items():
        p = build_dir / name
        if not p.is_file() or sha256_file(p) != digest:
            raise EdgeSDKError(f"{p} is missing or changed since the build (sha256 differs from {MANIFEST_NAME}).",
                               "rebuild with `edgesdk build ... --force`.")
    return report, manifest


def check_build(build_dir: Path | str, model_path: Path | str | None = None, overrides: dict | None = None,
                step: StepFn | None = None, calibration: Path | str | None = None) -> list[dict]:
    """Re-verify a build folder: sha256 of its files against the manifest, then the verification again.

    Args:
        build_dir: Folder written by :func:`build`.
        model_path: The original model, when it is no longer at the path recorded in the report (a folder written
            by ``edgesdk kv-sparsify``: its source build folder).
        overrides: ``atol``/``rtol``/``min_cosine`` replacing the build's (None values ignored).
        calibration: The calibration file, when it is no longer at the path recorded in the report.

    Returns:
        The verification rows (as in ``report.json``'s ``verify``).

    Raises:
        EdgeSDKError: not a build folder, a file changed since the build, or the original model is
            missing or differs from the one built.
    """
    build_dir = Path(build_dir)
    report, manifest = read_build_folder(build_dir)
    if report.get("kind") == "kv-sparsify":  # written by `edgesdk kv-sparsify` from a build folder
        from edgesdk.kv_build import check_kv

        return check_kv(build_dir, report, overrides, step, Path(model_path) if model_path else None)
    src = Path(model_path or report["model"]["path"])
    if not src.is_file():
        raise EdgeSDKError(f"the original model {src} is not there any more.", "pass its new path with --model.")
    if model_sha256(src) != report["model"]["sha256"]:
        raise EdgeSDKError(f"{src} is not the model this folder was built from (sha256 differs).",
                           "pass the original with --model, or rebuild.")
    config = BuildConfig.model_validate({**report["config"], **{k: v for k, v in (overrides or {}).items()
                                                               if v is not None}})
    if calibration is not None or config.calibration:
        config = config.model_copy(update={"calibration": _check_calibration(
            Path(calibration) if calibration is not None else Path(config.calibration),
            (manifest.get("inputs") or {}).get("calibration"))})
    step = step or _quiet_step
    with step("Load the original and the processed model"):
        original = load_model(src)
        processed = load_model(build_dir / report.get("processed_model", MODEL_NAME))
        ranges = build_ranges(original, config)
        calib, check_feeds = split_feeds(original, specs_at(original, ranges), config, longest_specs(original, ranges))
    pruned_ref = None
    if config.sparsity > 0 and config.kernels != "none":
        # Same calibration data and options as the build, so the same quantization and masks.
        quantized, _, _ = quantize_step(original, find_linears(original), quant_state(original), calib, config, step)
        with step("Prune a dense reference with the same masks (for the verification)"):
            pruned_ref = pruned_reference(quantized, calib, config, get_profile(config.device))
    extra_feeds = range_feeds(original, ranges, config)
    rows = verify_all(original, processed, pruned_ref, check_feeds, config, step, extra_feeds)
    plan = (report.get("engine") or {}).get("plan")  # its sha256 was checked above with the other files
    if plan and importlib.util.find_spec("tensorrt") is not None:
        rows += engine_rows(build_dir / plan, processed, check_feeds, config, step, extra_feeds)
    return rows


def _check_calibration(path: Path, recorded: dict | None) -> str:
    """The build's calibration source, present and (for a file, whose sha256 the manifest keeps) unchanged: the
    same samples give the same quantization, masks and verification inputs."""
    if not path.exists():
        raise EdgeSDKError(f"the calibration source {path} of this build is not there any more.",
                           "pass its new path with --calibration.")
    if recorded and path.is_file() and sha256_file(path) != recorded.get("sha256"):
        raise EdgeSDKError(f"{path} is not the calibration file this folder was built with (sha256 differs).",
                           "pass the original with --calibration, or rebuild.")
    return str(path)


def quantize_step(model, linears, state: str, calib, config: BuildConfig, step: StepFn):
    """INT8 Q/DQ on the chosen linears (or the model as is). Returns ``(model, skipped layers, smoothing factors)``
    (see :func:`edgesdk.quantize.quantize_int8`)."""
    if state == "qdq" or config.quantize != "int8":
        return model, {}, {}
    chosen, skipped = select_layers(model, linears, config.exclude, config.include_lm_head)
    smoothing: dict = {}
    with step(f"Quantize {len(chosen)} linears to INT8 (calibrating on {len(calib)} samples)") as advance:
        q = quantize_int8(model, calib, chosen, config.calibrate_method, progress=advance, smooth=config.smooth_quant,
                          smoothing=smoothing)
    return q, skipped, smoothing


SQNR_KEYS = ("sqnr_db", "sqnr_act_db", "sqnr_weight_db", "sqnr_by_shape")


def layer_sqnr(layers: list[dict], quantized, groups: dict[str, list[dict]], source, smoothing: dict) -> None:
    """Add each INT8 layer's output SQNR (:mod:`edgesdk.sensitivity`) to its report row, measured on the
    verification inputs of each shape (``groups``: ``"build"`` and the profile's ``"min"``/``"max"`` where verified):
    ``sqnr_by_shape`` (label → dB) and, at the shape where it is lowest, ``sqnr_db``/``sqnr_act_db``/
    ``sqnr_weight_db``; None where not measured."""
    from edgesdk.sensitivity import layer_errors_by

    by = layer_errors_by(quantized, groups, source, smoothing)
    for r in layers:
        got = {label: e[r["name"]] for label, e in by.items() if r["name"] in e and e[r["name"]]["sqnr_db"] is not None}
        if got:
            worst = min(got, key=lambda label: got[label]["sqnr_db"])
            r.update(got[worst])
            r["sqnr_by_shape"] = {label: e["sqnr_db"] for label, e in got.items()}


def _rewrite_fn():
    try:
        from edgesdk.rewrite import rewrite_model
    except ImportError as e:
        raise EdgeSDKError(f"the sparse/VitBit rewrite is unavailable ({e}).",
                           "build with --kernels none, or install the full edgesdk package.") from None
    return rewrite_model


def pruned_reference(quantized, calib, config: BuildConfig, device):
    """The quantized model pruned exactly as the rewrite prunes it, left in plain ONNX ops."""
    model, _ = _rewrite_fn()(quantized, config.model_copy(update={"kernels": "none"}), calib, device)
    return model


def verify_all(original, processed, pruned_ref, feeds, config: BuildConfig, step: StepFn,
               extra: dict[str, list[dict]] | None = None) -> list[dict]:
    """The verification rows of a build.

    Dense builds: processed vs original, gating. Sparse builds: pruning changes the model on
    purpose, so processed vs original is reported as the accuracy cost (``gate: false``) and the
    gating comparison is processed vs the pruned dense reference (same masks, plain ONNX ops),
    which checks the packing, the plugin nodes and their kernels' semantics. ``extra`` (label → feeds, from
    :func:`range_feeds`) repeats the comparisons at the optimization profile's min/max shapes; those rows carry
    ``shape`` (the label; the build-shape rows have none).
    """
    from edgesdk.verify import verify

    sparse = config.sparsity > 0
    rows = []
    for label, fs in [(None, feeds), *(extra or {}).items()]:
        at = f" at the {label} shape" if label else ""
        with step(f"Verify on ONNX Runtime{at} ({len(fs)} samples, Polygraphy)"):
            part = verify(original, processed, fs, config)
            for r in part:
                r["against"] = "original"
                r["gate"] = not sparse
            if pruned_ref is not None:
                for r in verify(pruned_ref, processed, fs, config):
                    r["against"] = "pruned_reference"
                    r["runners"] = ["onnxrt-pruned-reference", r["runners"][1]]
                    r["gate"] = True
                    part.append(r)
            if label:
                for r in part:
                    r["shape"] = label
            rows += part
    return rows


def engine_rows(plan: Path, processed, feeds, config: BuildConfig, step: StepFn,
                extra: dict[str, list[dict]] | None = None) -> list[dict]:
    """The TensorRT engine vs ONNX Runtime on the processed model, gating (``against: "tensorrt"``), at the build
    shape and at the profile's ends in ``extra`` (rows with ``shape``). An engine that cannot be run gives one failing
    row carrying the ``error``, so the build is reported unverified."""
    from edgesdk.verify import ENGINE, PROCESSED, verify_engine

    out = []
    for label, fs in [(None, feeds), *(extra or {}).items()]:
        at = f" at the {label} shape" if label else ""
        with step(f"Verify the TensorRT engine against ONNX Runtime{at} ({len(fs)} samples, Polygraphy)"):
            try:
                rows = verify_engine(plan.read_bytes(), processed, fs, config)
            except Exception as e:  # reported in the row; the folder keeps the engine
                rows = [{"output": "(engine)", "runners": [PROCESSED, ENGINE], "samples": len(fs), "max_abs": None,
                         "mean_abs": None, "rel_l2": None, "cosine": None, "top1_agreement": None,
                         "atol": config.atol, "rtol": config.rtol, "min_cosine": config.min_cosine, "passed": False,
                         "error": f"the engine could not be run: {type(e).__name__}: {e}"}]
        for r in rows:
            r["against"], r["gate"] = "tensorrt", True
            if label:
                r["shape"] = label
        out += rows
    return out


def verified(rows: list[dict]) -> bool | None:
    """True when every gating comparison passed; None when nothing gates (no verification, or
    a pruned build without plugin nodes, whose only comparison is its accuracy cost)."""
    gating = [r for r in rows if r.get("gate", True)]
    return all(r["passed"] for r in gating) if gating else None
