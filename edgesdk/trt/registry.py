"""One call registers every edgesdk plugin creator with TensorRT.

Call :func:`register_plugins` before parsing an ONNX model with plugin nodes and before
deserializing a plan that contains them (Python plugins live in the process, not in the plan).
:func:`edgesdk.trt.engine.build_engine` and :class:`edgesdk.Engine` call it themselves.
"""

from __future__ import annotations

import threading

from edgesdk.errors import EdgeSDKError
from edgesdk.trt import _logic

_lock = threading.Lock()
_creators: dict[str, object] = {}  # op_type → creator; keeps them alive for the process


def register_plugins(registry=None) -> list[str]:
    """Register the creators of every operator in :data:`edgesdk.trt._logic.OPS` and of ``EdgeSparseKVAttention``
    (idempotent).

    Args:
        registry (trt.IPluginRegistry): Default ``tensorrt.get_plugin_registry()``.

    Returns:
        list[str]: ``"edgesdk::<op_type>"`` of each creator now registered.

    Raises:
        EdgeSDKError: TensorRT is not installed, or TensorRT refused a creator.
    """
    try:
        import tensorrt as trt
    except ImportError as e:
        raise EdgeSDKError("TensorRT is not installed, so edgesdk's plugins cannot be registered",
                           "install TensorRT >= 10.3 (JetPack 6.1+ ships it), or run the build folder "
                           "with Engine(..., backend='onnxruntime')") from e
    from edgesdk.trt.plugins import plugin_classes

    registry = registry if registry is not None else trt.get_plugin_registry()
    names = []
    from edgesdk.trt import sparse_kv

    with _lock:
        for op in (*_logic.OPS, sparse_kv.OP):
            # sparse_kv's plugin (several outputs, aliased state) is its own class pair, not the linears' template
            _, creator_cls = sparse_kv.plugin_classes() if op == sparse_kv.OP else plugin_classes(op)
            creator = creator_cls()
            key = f"{_logic.PLUGIN_NAMESPACE}::{creator.name}"
            if key not in _creators and not _registered(registry, creator.name):
                if not registry.register_creator(creator, _logic.PLUGIN_NAMESPACE):
                    raise EdgeSDKError(f"TensorRT refused to register the plugin creator {key}",
                                       "check the TensorRT log; another creator may use the same name")
                _creators[key] = creator
            names.append(key)
    return names


def _registered(registry, name: str) -> bool:
    """Whether ``registry`` holds a creator of ``name`` in edgesdk's namespace and version, found by listing
    ``all_creators``: ``get_creator`` logs an API-usage error for every name it does not find."""
    listed = getattr(registry, "all_creators", None)
    if listed is None:  # a registry without the listing: ask, at the price of that log line
        return registry.get_creator(name, _logic.PLUGIN_VERSION, _logic.PLUGIN_NAMESPACE) is not None
    return any(getattr(c, "name", None) == name and str(getattr(c, "plugin_version", "")) == _logic.PLUGIN_VERSION
               and getattr(c, "plugin_namespace", None) == _logic.PLUGIN_NAMESPACE for c in listed)
