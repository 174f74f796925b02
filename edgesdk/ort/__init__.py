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


def make_session(model: onnx.ModelProto | bytes | str | Path, threads: int | None = None, quiet: bool = False,
                 outputs: Sequence[str] = ()):
    """An ``onnxruntime.InferenceSession`` on the CPU with all graph optimizations off.

    ``ORT_DISABLE_ALL`` keeps ORT from rewriting DequantizeLinear→MatMul into MatMulNBits, which
    changes numerics (``../shared/DESIGN.md`` §6). Plugin nodes run through our reference ops.
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
        if not uses_plugins(head) and not outputs:
            return ort.InferenceSession(str(model), so, providers=providers)
        onnx.external_data_helper.load_external_data_for_model(head, str(Path(model).parent))
        model = head
    elif isinstance(model, (bytes, bytearray)):
        model = onnx.load_from_string(bytes(model))
    large = is_large(model)
    plugins = uses_plugins(model)
    weights: list = []
    if large:
        m = light_copy(model, arrays=weights)
    elif outputs or plugins:
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
        so.add_session_config_entry("session.disable_prepacking", "1")  # MLAS would hold the weights a 2nd time
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=providers)
    if weights:
        sess.edgesdk_weights = values
    return sess
