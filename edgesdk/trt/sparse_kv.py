"""TensorRT plugin for ``EdgeSparseKVAttention`` (slice ``sparse_kv``): the cache state updated in place.

The node (:mod:`edgesdk.formats.sparse_kv`, "The graph node") has 8 inputs (q, k, v fp16; k/v records int8; k/v
windows fp16; lengths int32) and 5 outputs (out fp16, then the four state tensors). Each state output is **aliased**
to its input (``IPluginV3OneBuildV2.get_aliased_input``, TensorRT >= 10.3 with
``PreviewFeature.ALIASED_PLUGIN_IO_10_03``, which :func:`edgesdk.trt.engine.build_engine` turns on; NVIDIA's
``samples/python/aliased_io_plugin`` and TensorRT-Edge-LLM's KV-cache plugins use the same interface), so the
kernels append into the cache the engine was given. ``enqueue`` is :func:`edgesdk.kernels.sparse_kv.run_node`: S
new tokens are S steps of ``append`` + ``decode_attention``, all on TensorRT's stream, no allocation, no sync.

Everything the plugin decides is a plain function here (tested without TensorRT); :func:`plugin_classes` only wraps
them in TensorRT's classes. Never run here: TensorRT cannot be installed on this project's machines; ``run_node``
itself is checked on a GPU by ``tests/gpu/test_sparse_kv_node.py``.
"""

from __future__ import annotations

import functools

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.formats import sparse_kv as fmt

OP = "sparse_kv"
IN_DTYPES = ("float16", "float16", "float16", "int8", "int8", "float16", "float16", "int32")
OUT_DTYPES = ("float16", "int8", "int8", "float16", "float16")
#: output index -> the input it is aliased to (the cache state)
ALIASES = {1: 3, 2: 4, 3: 5, 4: 6}


def aliased_input(output_index: int) -> int:
    """The input an output is written into (-1: a fresh buffer)."""
    return ALIASES.get(int(output_index), -1)


def supports_format(pos: int, dtypes: list[str], formats: list[str]) -> bool:
    """Linear layout; the dtype of each position is fixed (``IN_DTYPES`` then ``OUT_DTYPES``)."""
    want = (IN_DTYPES + OUT_DTYPES)[pos]
    return formats[pos] == "LINEAR" and dtypes[pos] == want


def output_dims(input_dims: list) -> list:
    """Output dims from input dims (any objects: TensorRT's dimension expressions or ints): out = q's, state = its
    input's."""
    return [input_dims[0], *input_dims[3:7]]


def check_dims(attrs: dict, dims: list[tuple[int, ...]]) -> tuple[int, int]:
    """``(batch, new tokens)`` from the 8 input shapes; raises EdgeSDKError naming the first that does not fit the
    node's attributes (max dims at configure time, actual ones at shape change)."""
    cfg, _ = fmt.config_from_attributes(attrs)
    if len(dims) != len(IN_DTYPES):
        raise EdgeSDKError(f"{fmt.OP_TYPE} takes {len(IN_DTYPES)} inputs ({', '.join(fmt.INPUT_NAMES)}), got "
                           f"{len(dims)}", "rewrite the decoder with edgesdk kv-sparsify")
    q = tuple(dims[0])
    if len(q) != 4:
        raise EdgeSDKError(f"{fmt.OP_TYPE}: q has rank {len(q)}", "q is [batch, q_heads, new_tokens, head_dim]")
    B, S = int(q[0]), int(q[2])
    want = [(B, cfg.num_q_heads, S, cfg.head_dim), (B, cfg.num_kv_heads, S, cfg.head_dim),
            (B, cfg.num_kv_heads, S, cfg.head_dim)]
    want += [fmt.state_shapes(cfg, B)[s] for s in fmt.STATE_NAMES] + [(B,)]
    for name, got, exp in zip(fmt.INPUT_NAMES, dims, want):
        if tuple(int(x) for x in got) != exp:
            raise EdgeSDKError(f"{fmt.OP_TYPE}: input {name} has dims {tuple(got)}, expected {exp}",
                               "rewrite the decoder with edgesdk kv-sparsify (the state is sized by --capacity)")
    return B, S


def encode_fields(attrs: dict) -> list[tuple[str, np.ndarray, str]]:
    """``[(name, data, PluginFieldType name)]`` of every attribute (ints as one int32, floats as one float32)."""
    cfg, scale = fmt.config_from_attributes(attrs)
    vals = fmt.node_attributes(cfg, scale)
    return [(n, np.array([vals[n]], np.int32 if t is int else np.float32), "INT32" if t is int else "FLOAT32")
            for n, t in fmt.ATTRIBUTES.items()]


def attrs_from_fields(fields) -> dict:
    """Attributes from ``(name, data)`` pairs (build or runtime phase); strings and unknown fields ignored."""
    got = {}
    for name, data in fields:
        t = fmt.ATTRIBUTES.get(name)
        if t is None:
            continue
        arr = np.asarray(data).ravel()
        if arr.size != 1:
            raise EdgeSDKError(f"{fmt.OP_TYPE}: field {name!r} holds {arr.size} values, expected 1",
                               "rewrite the decoder with edgesdk kv-sparsify")
        got[name] = int(arr[0]) if t is int else float(arr[0])
    fmt.config_from_attributes(got)  # every field present and valid, or a clear error
    return got


def workspace_bytes(attrs: dict, max_batch: int, sms: int | None = None) -> int:
    """Scratch of :func:`edgesdk.kernels.sparse_kv.run_node` for any batch up to the profile's largest: the most of
    each batch's (a smaller batch may split its tokens more ways, so its partials can take more room)."""
    from edgesdk.kernels import sparse_kv as ks

    cfg, _ = fmt.config_from_attributes(attrs)
    return max(ks.node_plan(cfg, b, sms)[1] for b in range(1, max(1, int(max_batch)) + 1))


_configs: dict = {}  # attribute values -> (config, scale): validated once per distinct layer


def _config(attrs: dict):
    """:func:`~edgesdk.formats.sparse_kv.config_from_attributes`, cached by the attribute values (an enqueue per decode
    step must not validate them again)."""
    try:
        key = tuple(attrs[name] for name in fmt.ATTRIBUTES)
        return _configs[key]
    except (KeyError, TypeError):  # first call for these values, or a missing / unhashable attribute
        got = fmt.config_from_attributes(attrs)  # raises the clear error where one is due
        try:
            _configs[tuple(attrs[name] for name in fmt.ATTRIBUTES)] = got
        except TypeError:
            pass
        return got


def enqueue(attrs: dict, q_dims: tuple[int, ...], inputs, outputs, workspace: int, stream: int) -> None:
    """One call: ``run_node`` with TensorRT's pointers (state read from the inputs, written to the aliased outputs,
    which are the same buffers)."""
    from edgesdk.kernels import sparse_kv as ks

    cfg, scale = _config(attrs)
    B, S = int(q_dims[0]), int(q_dims[2])
    ks.run_node(cfg, scale, B, S, int(inputs[0]), int(inputs[1]), int(inputs[2]), [int(p) for p in inputs[3:7]],
                [int(p) for p in outputs[1:5]], int(inputs[7]), int(outputs[0]), int(workspace), int(stream))


@functools.lru_cache(maxsize=None)
def plugin_classes():
    """``(EdgeSparseKVAttentionPlugin, EdgeSparseKVAttentionPluginCreator)`` (needs TensorRT >= 10.3)."""
    import tensorrt as trt

    from edgesdk.trt import _logic
    from edgesdk.trt.plugins import _dtype, _format, _type_maps

    class Plugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuildV2, trt.IPluginV3OneRuntime):
        def __init__(self, attrs: dict | None = None, phase=None):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuildV2.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.plugin_name = fmt.OP_TYPE
            self.plugin_version = _logic.PLUGIN_VERSION
            self.plugin_namespace = _logic.PLUGIN_NAMESPACE
            self.num_outputs = len(OUT_DTYPES)
            self.attrs = dict(attrs or {})
            self.phase = phase
            self.max_batch = 1
            self._fields: list = []

        def get_capability_interface(self, type):
            return self

        def clone(self):
            c = Plugin()
            c.__dict__.update(self.__dict__)
            c.attrs = dict(self.attrs)
            c._fields = []
            return c

        def get_output_data_types(self, input_types):
            return [_type_maps()[1][t] for t in OUT_DTYPES]

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            return output_dims([inputs[i] for i in range(len(inputs))])

        def supports_format_combination(self, pos, in_out, num_inputs):
            return supports_format(pos, [_dtype(in_out[i].desc.type) for i in range(pos + 1)],
                                   [_format(in_out[i].desc.format) for i in range(pos + 1)])

        def get_aliased_input(self, output_index):
            return aliased_input(output_index)

        def configure_plugin(self, inp, out):
            self.max_batch, _ = check_dims(self.attrs, [tuple(d.max) for d in inp])

        def get_workspace_size(self, input_desc, output_desc):
            return workspace_bytes(self.attrs, int(tuple(input_desc[0].max)[0]))

        def get_valid_tactics(self):
            return []

        def get_fields_to_serialize(self):
            ftype = trt.PluginFieldType
            self._fields = [trt.PluginField(n, d, getattr(ftype, t)) for n, d, t in encode_fields(self.attrs)]
            return trt.PluginFieldCollection(self._fields)

        def set_tactic(self, tactic):
            pass

        def on_shape_change(self, inp, out):
            check_dims(self.attrs, [tuple(d.dims) for d in inp])

        def attach_to_context(self, resource_context):
            return self.clone()

        def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
            enqueue(self.attrs, tuple(input_desc[0].dims), inputs, outputs, workspace, stream)

    class Creator(trt.IPluginCreatorV3One):
        def __init__(self):
            trt.IPluginCreatorV3One.__init__(self)
            self.name = fmt.OP_TYPE
            self.plugin_version = _logic.PLUGIN_VERSION
            self.plugin_namespace = _logic.PLUGIN_NAMESPACE
            ftype = trt.PluginFieldType
            self.field_names = trt.PluginFieldCollection(
                [trt.PluginField(n, np.array([]), getattr(ftype, "INT32" if t is int else "FLOAT32"))
                 for n, t in fmt.ATTRIBUTES.items()])

        def create_plugin(self, name, fc, phase):
            return Plugin(attrs_from_fields([(f.name, f.data) for f in fc]), phase)

    Plugin.__name__ = Plugin.__qualname__ = f"{fmt.OP_TYPE}Plugin"
    Creator.__name__ = Creator.__qualname__ = f"{fmt.OP_TYPE}PluginCreator"
    return Plugin, Creator
