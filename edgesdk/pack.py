"""``edgesdk pack``: each linear's packed plugin weights as files, with an index and sha256 sums.

The offline packing tool, for benchmarks and inspection. A model without plugin nodes is first
pruned and rewritten exactly as ``edgesdk build`` would (:func:`edgesdk.rewrite.rewrite_model`,
no quantization step: give a Q/DQ model for int8 formats); a model that already has plugin nodes
(e.g. ``model.onnx`` of a build folder) is read as it is.

Folder layout (written to a temporary sibling and renamed into place: never half-written)::

    DIR/index.json                 what is below, with every tensor's dtype, shape, bytes, sha256
    DIR/<layer>/<tensor>.bin       raw little-endian bytes of one node input (e.g. bitmaps.bin)

``index.json``::

    {"format": "edgesdk-pack", "version": 1, "edgesdk": "0.1.0",
     "source": {"file": "model.onnx", "sha256": "..."},
     "options": {"sparsity": 0.5, "prune": "magnitude", "kernels": "bitmap", "device": "orin"},
     "layers": [{"name": "blocks.0.attn.qkv", "op_type": "EdgeBitmapLinear", "node": "...",
                 "attributes": {...}, "bytes_packed": 123, "bytes_dense": 456, "sparsity": 0.5,
                 "tensors": [{"name": "bitmaps", "file": "blocks.0.attn.qkv/bitmaps.bin",
                              "dtype": "int8", "shape": [96], "bytes": 96, "sha256": "..."}, ...]}],
     "skipped": [{"name": "lm_head", "reason": "..."}]}

:func:`load_pack` reads a folder back, checking every sha256 and validating each layer with its
format's ``from_tensors``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgesdk.errors import EdgeSDKError, FormatError

INDEX = "index.json"
FORMAT = "edgesdk-pack"
VERSION = 1


def _formats() -> dict:
    from edgesdk.formats import bitmap_linear, vitbit_gemm

    return {m.OP_TYPE: m for m in (bitmap_linear, vitbit_gemm)}


def _packed_class(fmt):
    return fmt.BitmapLinearWeights if hasattr(fmt, "BitmapLinearWeights") else fmt.VitBitWeights


def _attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _safe(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]", "_", name).strip(".") or "layer"
    out, i = base, 1
    while out.lower() in taken:  # case-insensitive file systems
        out, i = f"{base}_{i}", i + 1
    taken.add(out.lower())
    return out


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pack_model(model_path: Path | str, out_dir: Path | str, config=None, calibration=None) -> dict:
    """Write every plugin layer's packed weights of ``model_path`` under ``out_dir``.

    Args:
        model_path: ONNX model: float, Q/DQ, or already rewritten.
        out_dir: Folder to create (replaced only with ``config.force``).
        config: A ``BuildConfig`` (``sparsity``, ``prune``, ``kernels``, ``exclude``,
            ``include_lm_head``, ``device``, ``force``); None = ``BuildConfig(kernels="bitmap",
            prune="magnitude")``.
        calibration: Feeds for Wanda (list of input dicts); None = read ``config.calibration``
            (seeded random data when that is unset, like ``edgesdk build``).

    Returns:
        A summary: ``output``, ``layers`` (packed), ``skipped``, ``bytes_packed``, ``bytes_dense``.

    Raises:
        EdgeSDKError: Unreadable model, existing folder without force, bad options, nothing to pack.
    """
    from edgesdk.build import _move_into_place, check_output, split_feeds
    from edgesdk.config import BuildConfig
    from edgesdk.devices import get_profile
    from edgesdk.onnx_io import input_specs, load_model, model_sha256

    if config is None:
        config = BuildConfig(kernels="bitmap", prune="magnitude")
    model_path, out = Path(model_path), Path(out_dir)
    check_output(out, bool(getattr(config, "force", False)), inputs=(model_path, getattr(config, "calibration", None)),
                 marker=(INDEX,), what="a folder `edgesdk pack` wrote")
    model = load_model(model_path)
    formats = _formats()
    skipped: list[dict] = []
    rows: dict[str, dict] = {}
    if not any(n.domain == "edgesdk" for n in model.graph.node):
        if config.kernels == "none":
            raise EdgeSDKError("--kernels none packs nothing", "use --kernels bitmap, vitbit or auto")
        from edgesdk.rewrite import rewrite_model

        if calibration is None and config.prune == "wanda" and config.sparsity > 0:
            calibration = split_feeds(model, input_specs(model, config.shape_hints), config)[0]
        model, report = rewrite_model(model, config, calibration, get_profile(config.device))
        rows = {r["name"]: r for r in report if r["kernel"] != "none"}
        skipped = [{"name": r["name"], "reason": r["reason"]} for r in report if r["kernel"] == "none"]
    inits = {t.name: t for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.domain == "edgesdk" and n.op_type in formats]
    if not nodes:
        raise EdgeSDKError(f"no linear of {model_path} could be packed ({len(skipped)} left alone)",
                           "see the reasons with `edgesdk inspect`; e.g. vitbit needs a Q/DQ model")

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        layers, taken = [], set()
        for node, name in zip(nodes, _layer_names(nodes, rows)):
            fmt = formats[node.op_type]
            folder = _safe(name, taken)
            (tmp / folder).mkdir()
            entry = {"name": name, "op_type": node.op_type, "node": node.name, "attributes": _attrs(node),
                     "tensors": []}
            for tname, inp in zip(fmt.TENSOR_NAMES, node.input[1:]):
                if inp not in inits:
                    raise EdgeSDKError(f"input {inp!r} of plugin node {node.name!r} is not an initializer",
                                       "pack the model that edgesdk rewrote, not one edited afterwards")
                arr = np.ascontiguousarray(numpy_helper.to_array(inits[inp]))
                data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
                rel = f"{folder}/{tname}.bin"
                (tmp / rel).write_bytes(data)
                entry["tensors"].append({"name": tname, "file": rel, "dtype": arr.dtype.name, "shape": list(arr.shape),
                                         "bytes": len(data), "sha256": _sha(data)})
            entry["bytes_packed"] = sum(t["bytes"] for t in entry["tensors"])
            row = rows.get(name, {})
            entry["bytes_dense"] = row.get("bytes_dense")
            entry["sparsity"] = row.get("sparsity")
            layers.append(entry)
        index = {"format": FORMAT, "version": VERSION, "edgesdk": _version(),
                 "source": {"file": model_path.name, "sha256": model_sha256(model_path)},
                 "options": {k: getattr(config, k, None) for k in ("sparsity", "prune", "kernels", "device")},
                 "layers": layers, "skipped": skipped}
        (tmp / INDEX).write_text(json.dumps(index, indent=1, default=str))
        os.chmod(tmp, 0o755)
        _move_into_place(tmp, out)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"output": str(out), "layers": len(layers), "skipped": len(skipped),
            "bytes_packed": sum(e["bytes_packed"] for e in layers),
            "bytes_dense": None if any(e["bytes_dense"] is None for e in layers)  # a rewritten model: not known
            else sum(e["bytes_dense"] for e in layers)}


def _layer_names(nodes: list[onnx.NodeProto], rows: dict) -> list[str]:
    """Layer names: the rewrite names nodes ``<layer>/<OP_TYPE>``."""
    names = []
    for n in nodes:
        suffix = f"/{n.op_type}"
        names.append(n.name[: -len(suffix)] if n.name.endswith(suffix) else (n.name or n.output[0]))
    return names


def _version() -> str:
    from edgesdk import __version__

    return __version__


def load_pack(folder: Path | str) -> dict[str, object]:
    """Read a pack folder: layer name → packed weights object (``BitmapLinearWeights``/``VitBitWeights``).

    Raises:
        FormatError: Missing/unknown index, a file whose size or sha256 differs from the index, or
            packed data the format rejects.
    """
    folder = Path(folder)
    fix = "re-run `edgesdk pack`; the folder was modified or truncated"
    try:
        index = json.loads((folder / INDEX).read_text())
    except (OSError, ValueError) as err:
        raise FormatError(f"{folder / INDEX} cannot be read ({err})", fix) from None
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise FormatError(f"{folder} is not an edgesdk pack of version {VERSION}", fix)
    formats = _formats()
    out = {}
    for layer in index["layers"]:
        fmt = formats.get(layer["op_type"])
        if fmt is None:
            raise FormatError(f"layer {layer['name']!r} has unknown op_type {layer['op_type']!r}", fix)
        tensors = {}
        for t in layer["tensors"]:
            path = (folder / t["file"]).resolve()
            if folder.resolve() not in path.parents:
                raise FormatError(f"tensor file {t['file']!r} points outside {folder}", fix)
            data = path.read_bytes() if path.is_file() else b""
            if len(data) != t["bytes"] or _sha(data) != t["sha256"]:
                raise FormatError(f"{t['file']}: size or sha256 does not match index.json", fix)
            dtype = np.dtype(t["dtype"]).newbyteorder("<")
            if int(np.prod(t["shape"], dtype=np.int64)) * dtype.itemsize != len(data):
                raise FormatError(f"{t['file']}: {len(data)} bytes do not hold {t['dtype']} {t['shape']}", fix)
            tensors[t["name"]] = np.frombuffer(data, dtype).astype(dtype.newbyteorder("=")).reshape(t["shape"])
        out[layer["name"]] = _packed_class(fmt).from_tensors(layer["attributes"], tensors)
    return out
