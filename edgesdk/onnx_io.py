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
    # onnx >= 1.19's helpers write IR 11-14, which ONNX Runtime 1.18-1.23, TensorRT 10 and onnx < 1.19's checker
    # refuse although such a model seldom uses anything past IR 10 (a newer element type is refused where used).
    model.ir_version = min(model.ir_version, IR_VERSION)
    try:
        if is_large(model):
            onnx.checker.check_model(str(path))
        else:
            onnx.checker.check_model(model)
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
    """Write ``model`` to ``path`` atomically with IR version 10; a model over ~1.8 GB keeps its large tensors in
    ``<name>.data`` beside it (ONNX external data: protobuf cannot hold 2 GB); ``model``'s tensors stay in memory.

    Returns:
        The path written.
    """
    path = Path(path)
    model.ir_version = IR_VERSION
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    data = path.parent / (path.name + ".data")
    tmp_data = Path(tmp + ".data")
    try:
        if is_large(model):
            light = light_copy(model, tmp_data, location=data.name)
            onnx.save_model(light, tmp)
            os.chmod(tmp_data, 0o666 & ~_umask())
            os.replace(tmp_data, data)
        else:
            onnx.save_model(model, tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        for p in (tmp, tmp_data):
            if os.path.exists(p):
                os.unlink(p)
    return path


# ------------------------------------------------------------------------------ models over 2 GB
def _tensor_nbytes(t: onnx.TensorProto) -> int:
    """Bytes of ``t``'s data, from its dims and type (reading ``raw_data``'s length would copy it)."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return 0
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 0
    if t.data_type == onnx.TensorProto.STRING or not itemsize:
        return t.ByteSize()
    return int(np.prod(t.dims, dtype=np.int64)) * itemsize


def _graphs(g: onnx.GraphProto):
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    yield from _graphs(sub)


def model_nbytes(model: onnx.ModelProto) -> int:
    """The data of ``model``'s tensors (initializers and Constant nodes, subgraphs included) in bytes: its size
    serialized, less the graph structure, computed without serializing (protobuf refuses 2 GB and over)."""
    total = 0
    for g in _graphs(model.graph):
        total += sum(_tensor_nbytes(t) for t in g.initializer)
        total += sum(_tensor_nbytes(a.t) for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR)
    return total


def is_large(model: onnx.ModelProto) -> bool:
    """Too large to serialize in one protobuf (over ``EXTERNAL_DATA_BYTES``): save, check, infer shapes and run it
    through files with external data."""
    return model_nbytes(model) > EXTERNAL_DATA_BYTES


def light_copy(model: onnx.ModelProto, data: Path | None = None, location: str | None = None,
               arrays: list | None = None, threshold: int = 1024) -> onnx.ModelProto:
    """A copy of ``model`` whose top-level initializers of more than ``threshold`` bytes are placeholders, each
    referenced as ONNX external data at ``location``:

    * with ``data``, their bytes are written there (4 KB aligned; ``location`` defaults to its name, relative to
      the folder the copy is saved in);
    * with ``arrays``, ``(name, numpy array)`` pairs are appended to it instead, for
      ``SessionOptions.add_external_initializers`` (nothing written);
    * with neither, the placeholders carry name, type and dims only, enough for shape inference.

    The large tensors are never copied into the new proto, so this is how a model over 2 GB is saved, checked,
    shape-inferred and handed to ONNX Runtime.
    """
    out = onnx.ModelProto()
    for fd, value in model.ListFields():
        if fd.name != "graph":
            _copy_field(out, fd.name, value)
    g, lg = model.graph, out.graph
    for fd, value in g.ListFields():
        if fd.name != "initializer":
            _copy_field(lg, fd.name, value)
    f = open(data, "wb") if data is not None else None
    try:
        offset = 0
        for t in g.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL or _tensor_nbytes(t) <= threshold:
                lg.initializer.add().CopyFrom(t)
                continue
            stub = lg.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
            if t.doc_string:
                stub.doc_string = t.doc_string
            if f is None and arrays is None:
                continue
            if f is not None:
                blob = t.raw_data if t.HasField("raw_data") else onnx.numpy_helper.to_array(t).astype(
                    np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<"), copy=False).tobytes()
                pad = -offset % 4096
                f.write(b"\0" * pad)
                offset += pad
                f.write(blob)
                where = (location or data.name, offset, len(blob))
                offset += len(blob)
            else:
                arrays.append((t.name, onnx.numpy_helper.to_array(t)))
                where = (location or "edgesdk-in-memory.bin", 0, _tensor_nbytes(t))
            stub.data_location = onnx.TensorProto.EXTERNAL
            for k, v in zip(("location", "offset", "length"), where):
                stub.external_data.add(key=k, value=str(v))
    finally:
        if f is not None:
            f.close()
    return out


def _copy_field(msg, name: str, value) -> None:
    if hasattr(value, "extend"):  # repeated
        getattr(msg, name).extend(value)
    elif hasattr(value, "CopyFrom"):
        getattr(msg, name).CopyFrom(value)
    else:
        setattr(msg, name, value)


def infer_shapes(model: onnx.ModelProto, **kwargs) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes``, for models over 2 GB too (on a :func:`light_copy`: shape inference
    needs the large tensors' dims, not their values). The result's large initializers are placeholders then; use
    it for its types and shapes only."""
    return onnx.shape_inference.infer_shapes(light_copy(model) if is_large(model) else model, **kwargs)


def check_model(model: onnx.ModelProto, full_check: bool = False) -> None:
    """``onnx.checker.check_model``, for models over 2 GB too (through a temporary file with external data)."""
    if not is_large(model):
        onnx.checker.check_model(model, full_check=full_check)
        return
    with tempfile.TemporaryDirectory(prefix="edgesdk-check-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save_model(light_copy(model, Path(tmp) / "model.onnx.data"), str(path))
        onnx.checker.check_model(str(path), full_check=full_check)


def external_data_files(path: Path | str) -> list[Path]:
    """The external data files ``path``'s tensors name (without reading them), sorted."""
    path = Path(path)
    m = onnx.load(str(path), load_external_data=False)
    names = set()
    for g in _graphs(m.graph):
        tensors = list(g.initializer) + [a.t for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
        for t in tensors:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                names.update(e.value for e in t.external_data if e.key == "location")
    return sorted(path.parent / n for n in names)


def model_sha256(path: Path | str) -> str:
    """sha256 of an ONNX model file, or, where its weights are in external data files, of the model file's and each
    data file's sha256 together (so that ``edgesdk check`` notices a changed data file too)."""
    path = Path(path)
    try:
        files = external_data_files(path)
    except Exception:  # not ONNX: its bytes are all there is
        files = []
    if not files:
        return sha256_file(path)
    h = hashlib.sha256(sha256_file(path).encode())
    for f in files:
        h.update(f"\n{f.name} {sha256_file(f)}".encode())
    return h.hexdigest()


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
