"""Load, validate and save ONNX models; resolve input shapes.

Saving is atomic (temp name + ``os.replace``) and writes IR version 10, which ONNX Runtime
1.18+ and TensorRT 10.x read (onnx 1.23 would write IR 14 otherwise: ``../shared/TRT_NOTES.md`` §4).
"""

from __future__ import annotations

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
    """Concrete shape and dtype of every model input.

    A dynamic leading (batch) dim without a hint becomes 1; any other dynamic dim needs a hint.

    Raises:
        EdgeSDKError: hint for an unknown input, hint of the wrong rank or contradicting a fixed dim,
            a dynamic non-batch dim without a hint, or an input type edgesdk cannot feed.
    """
    inputs = graph_inputs(model)
    names = [i.name for i in inputs]
    for h in shape_hints:
        if h not in names:
            raise EdgeSDKError(f"--shape names input {h!r}, which the model does not have.",
                               f"use one of the model's inputs: {', '.join(names)}.")
    specs = {}
    for vi in inputs:
        elem = vi.type.tensor_type.elem_type
        if elem not in NP_TYPES:
            raise EdgeSDKError(f"input {vi.name!r} has ONNX type {onnx.TensorProto.DataType.Name(elem)}, which "
                               "edgesdk cannot generate data for.", "feed float, int or bool inputs.")
        dims = tensor_dims(vi)
        hint = shape_hints.get(vi.name)
        if hint is not None:
            if len(hint) != len(dims) or any(isinstance(d, int) and d != h for d, h in zip(dims, hint)):
                raise EdgeSDKError(f"--shape {vi.name}:{'x'.join(map(str, hint))} does not fit the model's input "
                                   f"shape {dims}.", f"give {len(dims)} dims and keep the fixed ones as they are.")
            specs[vi.name] = (list(hint), np.dtype(NP_TYPES[elem]))
            continue
        dynamic = [(i, d) for i, d in enumerate(dims) if not isinstance(d, int)]
        if [i for i, _ in dynamic if i > 0]:
            example = "x".join(str(d) if isinstance(d, int) else ("1" if i == 0 else "N") for i, d in enumerate(dims))
            raise EdgeSDKError(
                f"input {vi.name!r} has dynamic dims {dims} and no shape hint.",
                f"pass --shape {vi.name}:{example} (N = the size to build and verify for).")
        specs[vi.name] = ([1 if not isinstance(d, int) else d for d in dims], np.dtype(NP_TYPES[elem]))
    return specs
