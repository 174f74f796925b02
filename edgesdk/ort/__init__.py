"""ONNX Runtime execution of edgesdk graphs, plugin nodes included (CPU reference ops).

Plugin nodes are saved in the ONNX domain ``edgesdk`` (= their ``plugin_namespace``, so TensorRT's
10.10+ domain fallback also finds them). onnxruntime-extensions resolves Python custom ops only in
the domain ``ai.onnx.contrib`` (``../shared/TRT_NOTES.md`` §9), so :func:`make_session` relabels the
domain in memory; the file on disk is never changed.

Each operator's ORT op lives in ``edgesdk/ort/<op>.py`` and registers itself with
``onnxruntime_extensions.onnx_op`` on import; :func:`register_ops` imports them all.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path

import onnx

from edgesdk.onnx_io import is_large, light_copy

PLUGIN_DOMAIN = "edgesdk"
ORT_CONTRIB_DOMAIN = "ai.onnx.contrib"

_registered = False
_PROTOBUF_ENV = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"


def import_ortx():
    """``onnxruntime_extensions``, imported without two side effects of its package import, which only serve its
    tokenizer converters (never used here): importing ``torch`` and ``transformers`` where they are installed
    (3.7 s on this project's x86 machine, more on a Jetson's cores) and setting
    ``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python`` in ``os.environ`` (every child process would then parse ONNX
    with pure-Python protobuf). While it imports, the two packages, if not imported yet, read as absent (a first
    import of torch in another thread at that moment would fail); afterwards they import normally and the variable
    is as before. onnxruntime-extensions 0.14, which imports transformers unguarded, is imported without the block."""
    if "onnxruntime_extensions" in sys.modules:
        return sys.modules["onnxruntime_extensions"]
    saved = os.environ.get(_PROTOBUF_ENV)
    try:
        return _import_ortx(blocked=[] if _imports_hf_unguarded() else
                            [m for m in ("torch", "transformers") if m not in sys.modules])
    except ImportError as e:  # not retried: a second import of its C extension registers its ops twice
        from edgesdk.errors import EdgeSDKError

        raise EdgeSDKError(f"onnxruntime-extensions cannot be imported ({e}); edgesdk runs its plugin nodes' "
                           "reference ops on ONNX Runtime through it.",
                           "pip install 'onnxruntime-extensions>=0.15,<0.16' (0.14 also needs transformers).") from None
    finally:
        if saved is None:
            os.environ.pop(_PROTOBUF_ENV, None)
        else:
            os.environ[_PROTOBUF_ENV] = saved


def _imports_hf_unguarded() -> bool:
    """onnxruntime-extensions 0.14 imports transformers unconditionally (0.12, 0.13 and 0.15 guard it), so it must
    not be imported with transformers blocked."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onnxruntime-extensions").startswith("0.14.")
    except PackageNotFoundError:
        return False


def _import_ortx(blocked: list[str]):
    for m in blocked:
        sys.modules[m] = None  # `import m` raises ImportError, which the package catches
    try:
        import onnxruntime_extensions
    finally:
        for m in blocked:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]
    return onnxruntime_extensions


def register_ops() -> None:
    """Import every ``edgesdk.ort.<op>`` module so its custom op is registered (idempotent)."""
    global _registered
    if _registered:
        return
    for m in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")
    _registered = True


def uses_plugins(model: onnx.ModelProto) -> bool:
    return any(n.domain == PLUGIN_DOMAIN for n in model.graph.node)


def for_onnxruntime(model: onnx.ModelProto, copy: bool = True, source: onnx.ModelProto | None = None
                    ) -> onnx.ModelProto:
    """``model`` (a copy of it unless ``copy`` is False) with its plugin nodes in the domain onnxruntime-extensions
    serves; ``source``: the model holding the weights, where ``model`` is a light copy (see ``adapt``)."""
    if copy:
        m = onnx.ModelProto()
        m.CopyFrom(model)
    else:
        m = model
    for n in m.graph.node:
        if n.domain == PLUGIN_DOMAIN:
            n.domain = ORT_CONTRIB_DOMAIN
    imports = {o.domain: o for o in m.opset_import}
    if PLUGIN_DOMAIN in imports:
        version = imports[PLUGIN_DOMAIN].version
        m.opset_import.remove(imports[PLUGIN_DOMAIN])
        if ORT_CONTRIB_DOMAIN not in imports:
            m.opset_import.append(onnx.helper.make_opsetid(ORT_CONTRIB_DOMAIN, version))
    from edgesdk.ort._pyop import adapt  # fp16 X and optional bias, which Python ops cannot take

    register_ops()
    adapt(m, ORT_CONTRIB_DOMAIN, source)
    return m


FOLD_LIMIT = 1 << 30  #: most bytes of float32 weights :func:`make_session` folds (a model above keeps its integers)
_INT_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16,
              onnx.TensorProto.INT32}


def _weight_dequantize(model: onnx.ModelProto, keep: set[str]) -> list:
    """The DequantizeLinear nodes of ``model`` that :func:`fold_weight_dequantize` can fold: integer initializer in,
    float32 scale and integer zero point initializers, no ``block_size``, output not in ``keep``; none if their
    float32 weights would exceed :data:`FOLD_LIMIT` (read from the dims: external data is not needed)."""
    import math

    inits = {t.name: t for t in model.graph.initializer}
    found, size = [], 0
    for n in model.graph.node:
        if n.op_type != "DequantizeLinear" or n.domain not in ("", "ai.onnx") or n.output[0] in keep:
            continue
        ins = [inits.get(i) if i else None for i in n.input]
        if (len(ins) < 2 or ins[0] is None or ins[1] is None or ins[0].data_type not in _INT_TYPES
                or ins[1].data_type != onnx.TensorProto.FLOAT or (len(ins) > 2 and n.input[2] and ins[2] is None)
                or any(a.name == "block_size" and a.i for a in n.attribute)):
            continue
        found.append(n)
        size += 4 * math.prod(ins[0].dims)
    return found if size <= FOLD_LIMIT else []


def fold_weight_dequantize(model: onnx.ModelProto, nodes: list | None = None) -> int:
    """Replace DequantizeLinear nodes of constant integer weights (``nodes``, default: all that
    :func:`_weight_dequantize` finds) in ``model`` by float32 initializers of their outputs, computed as ONNX Runtime's
    kernel computes them: ``float(int32(x) - int32(zero_point)) * scale``, per tensor or along ``axis``. Returns how
    many were folded; initializers left unused are removed."""
    import numpy as np
    from onnx import numpy_helper

    nodes = _weight_dequantize(model, set()) if nodes is None else nodes
    if not nodes:
        return 0
    inits = {t.name: t for t in model.graph.initializer}
    drop = {id(n) for n in nodes}
    new = []
    for n in nodes:
        x = numpy_helper.to_array(inits[n.input[0]]).astype(np.int64)
        scale = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
        zp = (numpy_helper.to_array(inits[n.input[2]]).astype(np.int64) if len(n.input) > 2 and n.input[2]
              else np.zeros_like(scale, np.int64))
        if scale.ndim == 1 and x.ndim > 1:  # per axis
            axis = next((a.i for a in n.attribute if a.name == "axis"), 1) % x.ndim
            shape = [1] * x.ndim
            shape[axis] = -1
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        y = (x - zp).astype(np.int32).astype(np.float32) * scale
        new.append(numpy_helper.from_array(y.astype(np.float32), n.output[0]))
    keep = [n for n in model.graph.node if id(n) not in drop]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    used = {i for n in keep for i in n.input} | {o.name for o in model.graph.output}
    for n in keep:  # inputs of subgraphs (If/Loop bodies) count too
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                used |= {i for sn in a.g.node for i in sn.input}
    rest = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(rest + new)
    return len(nodes)


def make_session(model: onnx.ModelProto | bytes | str | Path, threads: int | None = None, quiet: bool = False,
                 outputs: Sequence[str] = ()):
    """An ``onnxruntime.InferenceSession`` on the CPU with all graph optimizations off.

    ``ORT_DISABLE_ALL`` keeps ORT from rewriting DequantizeLinear→MatMul into MatMulNBits, which
    changes numerics (``../shared/DESIGN.md`` §6). Plugin nodes run through our reference ops. The
    DequantizeLinear of constant integer weights is computed once, here (:func:`fold_weight_dequantize`), instead of
    at every run: the outputs are bit for bit those of the unfolded graph (prepacking off), ~3x faster on an INT8 LLM.
    ``quiet``: ONNX Runtime logs nothing, not even the errors it also raises (for runs whose failure is handled).
    ``outputs``: intermediate tensors to return too, after the graph's outputs (calibration probes); ``model`` is
    not changed.

    A model over 2 GB (protobuf's limit) reaches ONNX Runtime without being serialized whole: a path is opened where
    it is (its external data beside it); a ``ModelProto``'s large initializers are handed over as arrays
    (``SessionOptions.add_external_initializers``), held by the session (``edgesdk_weights``) while it lives.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4 if quiet else 3
    if threads:
        so.intra_op_num_threads = threads
    providers = ["CPUExecutionProvider"]
    if isinstance(model, (str, Path)):
        head = onnx.load(str(model), load_external_data=False)
        external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in head.graph.initializer)
        if not uses_plugins(head) and not outputs and (external or not _weight_dequantize(head, set())):
            return ort.InferenceSession(str(model), so, providers=providers)  # a model with external data: as is
        onnx.external_data_helper.load_external_data_for_model(head, str(Path(model).parent))
        model = head
    elif isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    large = is_large(model)
    plugins = uses_plugins(model)
    owned = False  # model is a copy of our own
    if not large and _weight_dequantize(model, set(outputs)):
        full = onnx.ModelProto()
        full.CopyFrom(model)
        fold_weight_dequantize(full, _weight_dequantize(full, set(outputs)))
        so.add_session_config_entry("session.disable_prepacking", "1")  # prepacked weights round differently
        model, large, owned = full, is_large(full), True  # float weights may pass protobuf's limit: then as arrays
    weights: list = []
    if large:
        m = light_copy(model, arrays=weights)
    elif (outputs or plugins) and not owned:
        m = onnx.ModelProto()
        m.CopyFrom(model)
    else:
        m = model
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in dict.fromkeys(outputs) if t not in have)
    if plugins:
        register_ops()
        so.register_custom_ops_library(import_ortx().get_library_path())
        m = for_onnxruntime(m, copy=False, source=model if large else None)
    if weights:
        values = [ort.OrtValue.ortvalue_from_numpy(a) for _, a in weights]
        so.add_external_initializers([n for n, _ in weights], values)
        if not owned:
            so.add_session_config_entry("session.disable_prepacking", "1")  # MLAS would hold the weights a 2nd time
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=providers)
    if weights:
        sess.edgesdk_weights = values
    return sess
