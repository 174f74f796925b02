"""Load, validate and save ONNX models; resolve input shapes.

Saving is atomic (temp name + ``os.replace``) and writes IR version 10, which ONNX Runtime
1.18+ and TensorRT 10.x read (onnx 1.23 would write IR 14 otherwise: ``../shared/TRT_NOTES.md`` §4).
"""

from __future__ import annotations

import ast
import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from edgesdk.errors import EdgeSDKError

IR_VERSION = 10
MIN_OPSET = 13  # the oldest opset whose QuantizeLinear/DequantizeLinear take per-channel axes
TRT_MAX_OPSET = 20  # highest opset TensorRT 10.x's ONNX parser documents
EXTERNAL_DATA_BYTES = 1_800_000_000
EXPORT_FIX = "re-export it with torch.onnx.export(..., opset_version=17) or check the file is complete."


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def sha256_file(path: Path | str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def load_model(path: Path | str) -> onnx.ModelProto:
    """Read and validate an ONNX model (external data included).

    Raises:
        EdgeSDKError: missing file, not ONNX, truncated, no graph, unknown/unsupported opset, or
            a graph the ONNX checker rejects.
    """
    path = Path(path)
    if not path.is_file():
        raise EdgeSDKError(f"model file {path} does not exist.", "pass the path of an .onnx file.")
    data = path.read_bytes()
    if not data:
        raise EdgeSDKError(f"{path} is empty.", EXPORT_FIX)
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        kind = "truncated or corrupted" if "runcated" in str(e) or data[:1] == b"\x08" else "not an ONNX file"
        raise EdgeSDKError(f"{path} is {kind} (protobuf: {e}).", EXPORT_FIX) from None
    if model.ir_version <= 0 or not model.opset_import or not model.graph.node:
        raise EdgeSDKError(f"{path} is not an ONNX model (no IR version, opset or graph nodes found).", EXPORT_FIX)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
        except (OSError, ValueError, onnx.checker.ValidationError) as e:  # onnx >= 1.17 checks the path
            raise EdgeSDKError(f"{path}: its external weight data cannot be read ({e}).",
                               "keep the .onnx file next to its external data file(s).") from None
    check_opset(model, str(path))
    try:
        if model.ByteSize() < EXTERNAL_DATA_BYTES:
            onnx.checker.check_model(model)
        else:
            onnx.checker.check_model(str(path))
    except (onnx.checker.ValidationError, ValueError) as e:
        raise EdgeSDKError(f"{path} is not a valid ONNX model: {str(e).splitlines()[0]}", EXPORT_FIX) from None
    ensure_node_names(model)
    return model


def opset(model: onnx.ModelProto) -> int:
    """The default-domain (``ai.onnx``) opset version."""
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 0


def check_opset(model: onnx.ModelProto, name: str = "model") -> None:
    """Refuse opsets this onnx does not know, and opsets too old for per-channel Q/DQ."""
    v, known = opset(model), onnx.defs.onnx_opset_version()
    if v > known:
        raise EdgeSDKError(f"{name} uses ONNX opset {v}, unknown to onnx {onnx.__version__} (knows up to {known}).",
                           f"re-export with opset_version=17 (TensorRT 10.x parses up to opset {TRT_MAX_OPSET}).")
    if v < MIN_OPSET:
        raise EdgeSDKError(
            f"{name} uses ONNX opset {v or '(none)'}; edgesdk needs opset >= {MIN_OPSET} (per-channel Q/DQ).",
            "convert it: onnx.version_converter.convert_version(model, 17), or re-export with opset_version=17.")


def ensure_node_names(model: onnx.ModelProto) -> None:
    """Give every unnamed node a unique name (quantization and the report address nodes by name)."""
    used = {n.name for n in model.graph.node if n.name}
    for i, n in enumerate(model.graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in used:
                name += "_"
            n.name = name
            used.add(name)


def save_model(model: onnx.ModelProto, path: Path | str) -> Path:
    """Write ``model`` to ``path`` atomically with IR version 10 (external data when > ~1.8 GB).

    Returns:
        The path written.
    """
    path = Path(path)
    model.ir_version = IR_VERSION
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        if model.ByteSize() > EXTERNAL_DATA_BYTES:
            data_name = path.name + ".data"
            onnx.save_model(model, tmp, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data_name, size_threshold=1024)
            os.replace(Path(tmp).parent / data_name, path.parent / data_name)
        else:
            onnx.save_model(model, tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


NP_TYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
            onnx.TensorProto.DOUBLE: np.float64, onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32,
            onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.BOOL: np.bool_}


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Real inputs (not initializers listed as inputs, as old exporters did)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def tensor_dims(vi: onnx.ValueInfoProto) -> list[int | str]:
    """Dims of a value info: ints, or the symbolic name / ``"?"`` for dynamic dims."""
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or "?")
    return dims


def input_specs(model: onnx.ModelProto, shape_hints: dict[str, list[int]]) -> dict[str, tuple[list[int], np.dtype]]:
    """Concrete shape and dtype of every model input (the shape a build calibrates and verifies at).

    A dynamic leading (batch) dim without a hint becomes 1; any other dynamic dim needs a hint, given
    for this input or for another input whose dim has the same symbolic name (see :func:`shape_ranges`).

    Raises:
        EdgeSDKError: hint for an unknown input, hint of the wrong rank or contradicting a fixed dim,
            a dynamic non-batch dim without a hint, or an input type edgesdk cannot feed.
    """
    ranges = shape_ranges(model, shape_hints)
    return {vi.name: (ranges[vi.name][1], np.dtype(NP_TYPES[vi.type.tensor_type.elem_type]))
            for vi in graph_inputs(model)}


_DIM_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
            ast.FloorDiv: lambda a, b: a // b}


def dim_expression(text: str, values: dict[str, int]) -> int | None:
    """Value of a symbolic dim such as ``"past_sequence_length + sequence_length"`` (Hugging Face / optimum
    exports write these) from the values of its names; None if a name is unbound or the text is not ``+ - * //``
    over names and integers."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None

    def ev(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name):
            return values.get(n.id)
        if isinstance(n, ast.BinOp) and type(n.op) in _DIM_OPS:
            a, b = ev(n.left), ev(n.right)
            if a is None or b is None or (isinstance(n.op, ast.FloorDiv) and b == 0):
                return None
            return _DIM_OPS[type(n.op)](a, b)
        return None

    if isinstance(tree, ast.Name):  # a plain name is bound directly, not evaluated
        return values.get(text)
    return ev(tree)


def dim_names(text: str) -> list[str]:
    """The names a symbolic dim uses (``"past_sequence_length + sequence_length"`` → both)."""
    try:
        return sorted({n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)})
    except SyntaxError:
        return []


class UnboundShape(EdgeSDKError):
    """An input whose dynamic dims no hint binds (``input``: its name)."""

    def __init__(self, input: str, problem: str, fix: str | None = None):
        super().__init__(problem, fix)
        self.input = input


def shapes_with_fallback(model: onnx.ModelProto, hints: dict[str, list[int]], fallback: dict[str, list[int]]
                         ) -> dict[str, list[int]]:
    """Every input's shape from ``hints`` (binding dim names as :func:`shape_ranges` does), taking ``fallback``
    values only for names the hints leave unbound: ``edgesdk bench --shape past_key_values.0.key=...`` on a build
    folder sizes the other cache inputs and the attention mask from that one hint, the rest from the build."""
    hints = dict(hints)
    dims_of = {vi.name: tensor_dims(vi) for vi in graph_inputs(model)}

    def named(d) -> bool:
        return isinstance(d, str) and d.isidentifier()

    values = {d: v for k, shape in hints.items() for d, v in zip(dims_of.get(k, []), shape) if named(d)}
    # inputs whose dims are plain names first (their fallback values bind the names the hints leave free), so that
    # dims written as expressions of those names follow
    for name, dims in dims_of.items():
        if name in hints or name not in fallback or len(fallback[name]) != len(dims):
            continue
        if all(isinstance(d, int) or d == "?" or named(d) for d in dims):
            hints[name] = [values.get(d, f) if named(d) else f for d, f in zip(dims, fallback[name])]
            values.update({d: v for d, v in zip(dims, hints[name]) if named(d)})
    while True:
        try:
            return {k: v[1] for k, v in shape_ranges(model, hints).items()}
        except UnboundShape as e:
            if e.input in hints or e.input not in fallback:
                raise
            hints[e.input] = [dim_expression(d, values) or f if isinstance(d, str) and d != "?" else f
                              for d, f in zip(dims_of[e.input], fallback[e.input])]


def shape_ranges(model: onnx.ModelProto, opt: dict[str, list[int]], lo: dict[str, list[int]] | None = None,
                 hi: dict[str, list[int]] | None = None, max_batch: int = 8) -> dict[str, tuple[list[int], ...]]:
    """``{input: (min, opt, max)}``: every input's concrete shape at the build shape (opt) and its range.

    ``opt``/``lo``/``hi`` are the ``--shape``/``--min-shape``/``--max-shape`` hints (input name → full shape).
    A hint binds the model's symbolic dim names to its values, so inputs that share a name (``batch_size``,
    ``sequence_length`` of ``input_ids``, ``attention_mask`` and ``position_ids`` in a Hugging Face export) need
    one hint between them, and dims written as expressions (``past_sequence_length + sequence_length``) follow.
    Unbound names: a leading (batch) dim's is 1 at opt and min and ``max(opt, max_batch)`` at max; any other
    must be bound at opt, and keeps its opt value at min and max unless ``lo``/``hi`` bind it. Static inputs
    have min = opt = max.

    Raises:
        EdgeSDKError: a hint for an unknown input, of the wrong rank, contradicting a fixed dim or another hint
            (one symbolic name, two values), a dynamic non-batch dim left unbound, min > opt or opt > max, a dim
            below 1 at opt, or an input type edgesdk cannot feed.
    """
    inputs = graph_inputs(model)
    names = [i.name for i in inputs]
    flags = ("--shape", "--min-shape", "--max-shape")
    levels = dict(zip(flags, (dict(opt or {}), dict(lo or {}), dict(hi or {}))))
    dims_of = {}
    for vi in inputs:
        elem = vi.type.tensor_type.elem_type
        if elem not in NP_TYPES:
            raise EdgeSDKError(f"input {vi.name!r} has ONNX type {onnx.TensorProto.DataType.Name(elem)}, which "
                               "edgesdk cannot generate data for.", "feed float, int or bool inputs.")
        dims_of[vi.name] = tensor_dims(vi)
    batch_names = {d[0] for d in dims_of.values() if d and isinstance(d[0], str) and d[0].isidentifier()}
    bound: dict[str, dict[str, int]] = {}
    for flag, hints in levels.items():
        values, source = {}, {}
        for h, shape in hints.items():
            if h not in names:
                raise EdgeSDKError(f"{flag} names input {h!r}, which the model does not have.",
                                   f"use one of the model's inputs: {', '.join(names)}.")
            dims = dims_of[h]
            if len(shape) != len(dims) or any(isinstance(d, int) and d != v for d, v in zip(dims, shape)):
                raise EdgeSDKError(f"{flag} {h}:{'x'.join(map(str, shape))} does not fit the model's input "
                                   f"shape {dims}.", f"give {len(dims)} dims and keep the fixed ones as they are.")
            for d, v in zip(dims, shape):
                if isinstance(d, str) and d.isidentifier():
                    if d in values and values[d] != v:
                        raise EdgeSDKError(
                            f"{flag} gives dim {d!r} two values: {values[d]} ({source[d]}) and {v} ({h}).",
                            f"inputs that share the dim name {d!r} must agree; fix one of the two hints.")
                    values[d], source[d] = int(v), h
        bound[flag] = values
    for b in batch_names:  # unbound batch names
        bound["--shape"].setdefault(b, 1)
        bound["--min-shape"].setdefault(b, 1)
        bound["--max-shape"].setdefault(b, max(bound["--shape"][b], max_batch))
    for flag in flags[1:]:  # other names keep their opt value
        for k, v in bound["--shape"].items():
            bound[flag].setdefault(k, v)
    for flag, hints in levels.items():  # a hinted dim written as an expression must agree with the names' values
        for h, shape in hints.items():
            for d, v in zip(dims_of[h], shape):
                if isinstance(d, str) and d != "?" and not d.isidentifier():
                    want = dim_expression(d, bound[flag])
                    if want is not None and want != v:
                        raise EdgeSDKError(f"{flag} {h}:{'x'.join(map(str, shape))} gives dim {d!r} the value {v}, "
                                           f"but the other hints make it {want}.",
                                           f"make {h}'s hint agree with them, or leave it out (it follows from them).")

    out = {}
    for name in names:
        dims = dims_of[name]
        per = []
        for flag in flags:
            hint = levels[flag].get(name)
            if hint is not None:
                per.append([int(v) for v in hint])
                continue
            shape = []
            for i, d in enumerate(dims):
                if isinstance(d, int):
                    shape.append(d)
                elif d == "?":  # unnamed: batch default at index 0, else the opt hint decides
                    shape.append({"--shape": 1, "--min-shape": 1}.get(flag, max(per[0][0] or 1, max_batch))
                                 if i == 0 else (None if flag == "--shape" else per[0][i]))
                else:
                    shape.append(dim_expression(d, bound[flag]))
            per.append(shape)
            if flag == "--shape":
                missing = [i for i, v in enumerate(shape) if v is None]
                if missing:
                    example = "x".join(str(v) if v is not None else "N" for v in shape)
                    unbound = sorted({n for i in missing for n in (dim_names(dims[i]) if dims[i] != "?" else [])
                                      if n not in bound[flag]})
                    also = (f" (or a hint for another input that has dim {', '.join(map(repr, unbound))})"
                            if unbound else "")
                    raise UnboundShape(name, f"input {name!r} has dynamic dims {dims} and no shape hint.",
                                       f"pass --shape {name}:{example}{also} (N = the size to build and verify for).")
        lo_shape, opt_shape, hi_shape = per[1], per[0], per[2]
        for i, d in enumerate(dims):
            if None in (lo_shape[i], hi_shape[i]):  # an expression that cannot be evaluated at min/max
                lo_shape[i] = opt_shape[i] if lo_shape[i] is None else lo_shape[i]
                hi_shape[i] = opt_shape[i] if hi_shape[i] is None else hi_shape[i]
            if opt_shape[i] < 1:
                raise EdgeSDKError(f"input {name!r} dim {i} ({d}) is {opt_shape[i]} at the build shape.",
                                   "build and verify at a shape with every dim >= 1 (--shape).")
            if not (0 <= lo_shape[i] <= opt_shape[i] <= hi_shape[i]):
                raise EdgeSDKError(f"input {name!r} dim {i} ({d}): min {lo_shape[i]}, opt {opt_shape[i]}, max "
                                   f"{hi_shape[i]} are not in order.", "give --min-shape <= --shape <= --max-shape.")
        out[name] = (lo_shape, opt_shape, hi_shape)
    return out
