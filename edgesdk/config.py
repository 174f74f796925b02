"""Build options: one pydantic model, filled from a YAML file (``--config``) and command-line flags.

Flags override the file; unknown keys and bad values are errors that name the key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edgesdk.errors import EdgeSDKError


def parse_shape(spec: str, flag: str = "--shape", zero: bool = False) -> tuple[str, list[int]]:
    """``"input:1x3x224x224"`` (or ``"input=1x3x224x224"``, the form ``edgesdk bench`` shows) → ``("input", [1, 3,
    224, 224])``; split at the last ``:`` or ``=``, so the name may itself contain either. ``zero``: dims may be 0
    (``--min-shape``: an empty KV cache before the first token)."""
    cut = max(spec.rfind(":"), spec.rfind("="))
    name, dims = spec[:cut], spec[cut + 1:]
    try:
        if cut <= 0:
            raise ValueError
        shape = [int(d) for d in dims.lower().split("x")]
        if any(d < (0 if zero else 1) for d in shape):
            raise ValueError
    except ValueError:
        raise EdgeSDKError(f"bad shape hint {spec!r}.", "write NAME:D0xD1x... with "
                           f"{'dims >= 0' if zero else 'positive dims'}, e.g. {flag} input:1x3x224x224") from None
    return name, shape


class BuildConfig(BaseModel):
    """Everything ``edgesdk build`` needs besides the model path.

    Attributes:
        device: Device profile name (``edgesdk devices``).
        output: Build folder to write.
        force: Replace an existing build folder.
        quantize: ``"int8"`` (symmetric Q/DQ on linear layers) or ``"none"``.
        calibration: ``.npz``, ``.npy``, folder of ``.npy``/images, or token-id file; None → seeded random.
        calibration_count: Calibration samples to use.
        calibrate_method: Activation range estimator (``minmax`` or ``percentile``).
        smooth_quant: SmoothQuant alpha (activation outliers moved into weights before INT8), or None.
        shape_hints: Input name → full shape, for dynamic dims (``--shape input:1x3x224x224``): the shape the build
            calibrates and verifies at, and the TensorRT profile's opt shape. A hint binds the symbolic dim names
            of its input, so inputs sharing a name need one hint (:func:`edgesdk.onnx_io.shape_ranges`).
        min_shapes: Input name → the TensorRT optimization profile's min shape (``--min-shape``; default: batch
            1, other dims as at ``shape_hints``).
        max_shapes: Input name → the profile's max shape (``--max-shape``; default: batch ``max_batch``, other
            dims as at ``shape_hints``). The build also verifies at the min and max shapes where they differ
            from the build shape in more than the batch.
        image_mean: Per-channel mean for image calibration (default: ImageNet for 3 channels).
        image_std: Per-channel std for image calibration.
        sparsity: Fraction of weights to prune in rewritten layers (0 = dense).
        prune: Pruning criterion.
        sparsity_scope: ``layer`` (every rewritten layer pruned to ``sparsity``) or ``global`` (one
            threshold over all rewritten layers, so sensitive layers keep more weights).
        kernels: Plugin kernels to use (``none`` keeps plain ONNX ops).
        measure: ``auto`` times each plugin candidate against the dense layer when the build runs on
            the target GPU and keeps dense where it is faster; ``on`` times on any GPU here; ``off``
            uses the static rule only (``edgesdk.rewrite.choose``).
        vitbit_input: What ``EdgeVitBitGemm`` reads: ``int8`` (the layer's QuantizeLinear output, kept in the
            graph so that TensorRT can fuse it into the producer of X) or ``float`` (the activation before the
            QuantizeLinear, quantized by the plugin itself).
        exclude: Regexes on layer names left in float and unrewritten.
        include_lm_head: Also quantize/rewrite an LLM's output head.
        atol: Absolute tolerance of the verification (Polygraphy, mean error).
        rtol: Relative tolerance of the verification (Polygraphy, mean error).
        min_cosine: Lowest accepted cosine similarity of each output.
        verify: Compare processed vs original model on ONNX Runtime.
        verify_count: Input samples used by the verification.
        workspace_mb: TensorRT workspace (None → the device profile's).
        builder_optimization_level: TensorRT builder optimization level 0-5 (None → 3).
        timing_cache: TensorRT timing cache file, reused across builds (None → one per TensorRT
            version and GPU under ``~/.cache/edgesdk/trt``).
        dla_core: Build for this DLA core with GPU fallback (Jetson AGX/NX only; None → GPU only).
        max_batch: Largest batch of the TensorRT optimization profile for a dynamic batch dim.
        seed: Seed for random inputs.
    """

    model_config = ConfigDict(extra="forbid")

    device: str = "orin"
    output: Path | None = None
    force: bool = False
    quantize: Literal["int8", "none"] = "int8"
    calibration: Path | None = None
    calibration_count: int = Field(16, ge=1)
    calibrate_method: Literal["minmax", "percentile"] = "minmax"
    smooth_quant: float | None = Field(None, gt=0, lt=1)
    shape_hints: dict[str, list[int]] = Field(default_factory=dict)
    min_shapes: dict[str, list[int]] = Field(default_factory=dict)
    max_shapes: dict[str, list[int]] = Field(default_factory=dict)
    image_mean: list[float] | None = None
    image_std: list[float] | None = None
    sparsity: float = Field(0.0, ge=0.0, lt=1.0)
    prune: Literal["magnitude", "wanda"] = "wanda"
    sparsity_scope: Literal["layer", "global"] = "layer"
    kernels: Literal["auto", "bitmap", "vitbit", "none"] = "auto"
    measure: Literal["auto", "on", "off"] = "auto"
    vitbit_input: Literal["int8", "float"] = "int8"
    exclude: list[str] = Field(default_factory=list)
    include_lm_head: bool = False
    atol: float = Field(0.1, ge=0)
    rtol: float = Field(0.1, ge=0)
    min_cosine: float = Field(0.99, ge=-1, le=1)
    verify: bool = True
    verify_count: int = Field(4, ge=1)
    workspace_mb: int | None = Field(None, ge=1)
    builder_optimization_level: int | None = Field(None, ge=0, le=5)
    timing_cache: Path | None = None
    dla_core: int | None = Field(None, ge=0)
    max_batch: int = Field(8, ge=1)
    seed: int = 0

    @field_validator("shape_hints", "min_shapes", "max_shapes", mode="before")
    @classmethod
    def _shapes(cls, v, info):
        flag, zero = {"shape_hints": ("--shape", False), "min_shapes": ("--min-shape", True),
                      "max_shapes": ("--max-shape", False)}[info.field_name]
        if isinstance(v, (list, tuple)):
            return dict(parse_shape(s, flag, zero) for s in v)
        if isinstance(v, dict):
            return {k: (parse_shape(f"{k}:{s}", flag, zero)[1] if isinstance(s, str) else s) for k, s in v.items()}
        return v

    @field_validator("exclude")
    @classmethod
    def _regexes(cls, v):
        for p in v:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"exclude pattern {p!r} is not a valid regex: {e}") from None
        return v


# The YAML file may use the flags' names (``--use-dla-core``, ``--timing-cache-file``, ``--shape``) as well as the
# option names of :class:`BuildConfig`.
FLAG_KEYS = {"use_dla_core": "dla_core", "timing_cache_file": "timing_cache", "shape": "shape_hints",
             "min_shape": "min_shapes", "max_shape": "max_shapes"}
# Paths in a YAML file are relative to that file (as in docker compose), not to where the command runs.
PATH_KEYS = ("calibration", "output", "timing_cache")


def _explain(err: ValidationError, source) -> EdgeSDKError:
    import difflib

    lines = []
    for e in err.errors():
        key = str(e["loc"][0]) if e["loc"] else ""
        where = source(key)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(key, [*BuildConfig.model_fields, *FLAG_KEYS], n=1)
            msg = "unknown option" + (f" (did you mean {close[0]!r}?)" if close else "")
        lines.append(f"{'.'.join(str(x) for x in e['loc']) or '(top)'}: {msg} ({where})")
    return EdgeSDKError("invalid build options: " + "; ".join(lines),
                        "fix the named keys (`edgesdk build --help` lists every option and its values; a YAML file "
                        "takes the same names, with _ or -).")


def load_config(path: Path | None = None, overrides: dict | None = None, defaults: dict | None = None) -> BuildConfig:
    """A :class:`BuildConfig` from ``defaults`` (a command's own), a YAML file (optional) over them and ``overrides``
    (flags; None values ignored) on top.

    Raises:
        EdgeSDKError: unreadable/invalid YAML, unknown keys, or bad values.
    """
    import yaml

    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise EdgeSDKError(f"config file {path} does not exist.", "pass an existing YAML file to --config.")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise EdgeSDKError(f"config file {path} is not valid YAML ({e}).", "fix the YAML syntax.") from None
        if not isinstance(data, dict):
            raise EdgeSDKError(f"config file {path} must hold a mapping of option: value.",
                               "write e.g. `device: orin` / `quantize: int8`, one per line.")
        bad = [k for k in data if not isinstance(k, str)]
        if bad:
            raise EdgeSDKError(f"config file {path}: key {bad[0]!r} is not an option name.",
                               "write option names as in `edgesdk build --help`, e.g. `calibration_count: 32`.")
        data = {k.replace("-", "_"): v for k, v in data.items()}
        data = {FLAG_KEYS.get(k, k): v for k, v in data.items()}
        for k in PATH_KEYS:
            if isinstance(data.get(k), str) and data[k] and not Path(data[k]).expanduser().is_absolute():
                data[k] = str(path.parent / data[k])
    from_file = set(data)
    flags = {k: v for k, v in (overrides or {}).items() if v is not None}
    data = {**(defaults or {}), **data, **flags}

    def source(key: str) -> str:
        return "flag" if key in flags else f"in {path}" if key in from_file else "default"

    try:
        return BuildConfig.model_validate(data)
    except ValidationError as e:
        raise _explain(e, source) from None
