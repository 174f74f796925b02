"""Class-based TensorRT plugins (``IPluginV3`` + ``IPluginCreatorV3One``) for edgesdk's operators.

One plugin class and one creator class per operator, made by :func:`plugin_classes` when TensorRT
is importable (the classes must subclass TensorRT's bindings, so they cannot exist without it).
The methods only convert TensorRT objects to plain values and call :mod:`edgesdk.trt._logic`.

API: the V3-One interface of TensorRT 10.0 - 11.x (the only Python plugin API on JetPack 6.1/6.2 =
TensorRT 10.3 and JetPack 7.2 = TensorRT 10.16), written from ``../shared/TRT_NOTES.md`` §1 and
NVIDIA's ``samples/python/python_plugin/circ_pad_plugin_multi_tactic.py``. Never run here (no
TensorRT can be installed); ``tools/trt_smoke.py`` is its first test.

Notes:
    * Fields = node attributes. The packed weights, scales and bias are node inputs coming from
      initializers, which TensorRT bakes into the engine, so a deserialized plugin needs only
      :func:`get_fields_to_serialize`.
    * ``enqueue`` launches through the operator's cuda-python launcher on TensorRT's stream: no
      allocation, no sync (CUDA-graph safe). Under a captured graph Python runs only at capture.
"""

from __future__ import annotations

import functools

import numpy as np

from edgesdk.trt import _logic


@functools.lru_cache(maxsize=None)
def _type_maps():
    import tensorrt as trt

    dtypes = {trt.DataType.HALF: "float16", trt.DataType.FLOAT: "float32", trt.DataType.INT8: "int8",
              trt.DataType.INT32: "int32"}
    formats = {trt.TensorFormat.LINEAR: "LINEAR"}
    return dtypes, {v: k for k, v in dtypes.items()}, formats


def _dtype(t) -> str:
    return _type_maps()[0].get(t, str(t))


def _format(f) -> str:
    return _type_maps()[2].get(f, str(f))


@functools.lru_cache(maxsize=None)
def plugin_classes(op: str):
    """``(PluginClass, CreatorClass)`` for slice ``op`` (needs TensorRT)."""
    import tensorrt as trt

    spec = _logic.spec_for(op)

    class Plugin(trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuild, trt.IPluginV3OneRuntime):
        def __init__(self, attrs: dict | None = None, phase=None):
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuild.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.plugin_name = spec.op_type
            self.plugin_version = _logic.PLUGIN_VERSION
            self.plugin_namespace = _logic.PLUGIN_NAMESPACE
            self.num_outputs = 1
            self.attrs = dict(attrs or {})
            self.timing_cache_id = _logic.timing_cache_id(spec, self.attrs) if attrs else ""
            self.phase = phase
            self.tactic = 0
            self.m_max: int | None = None
            self.forced_tactics: list[int] | None = None  # tools/trt_smoke.py builds one engine per tactic
            self._fields: list = []  # keeps serialized buffers alive while TensorRT reads them

        # IPluginV3
        def get_capability_interface(self, type):
            return self

        def clone(self):
            c = Plugin()
            c.__dict__.update(self.__dict__)
            c.attrs = dict(self.attrs)
            # properties of the C++ object, not entries of __dict__: the update above does not carry them
            c.timing_cache_id = self.timing_cache_id
            c._fields = []
            return c

        # IPluginV3OneBuild
        def get_output_data_types(self, input_types):
            return [_type_maps()[1][_logic.output_dtype(spec, [_dtype(t) for t in input_types], self.attrs)]]

        def get_output_shapes(self, inputs, shape_inputs, expr_builder):
            x = inputs[0]
            dims = [x[i] for i in range(len(x))]
            value_of = lambda e: e.get_constant_value() if e.is_constant() else None  # noqa: E731
            out_dims = _logic.output_dims(spec, self.attrs, dims, expr_builder.constant, value_of)
            out = trt.DimsExprs(len(out_dims))
            for i, d in enumerate(out_dims):
                out[i] = d
            return [out]

        def supports_format_combination(self, pos, in_out, num_inputs):
            dtypes = [_dtype(in_out[i].desc.type) for i in range(pos + 1)]
            formats = [_format(in_out[i].desc.format) for i in range(pos + 1)]
            return _logic.supports_format(spec, pos, dtypes, formats, num_inputs, self.attrs)

        def configure_plugin(self, inp, out):
            want = _logic.num_inputs(spec, self.attrs)
            if len(inp) != want:
                raise ValueError(f"{spec.op_type} expects {want} inputs "
                                 f"(X, {', '.join(spec.tensor_names)}), got {len(inp)}")
            self.m_max = _logic.rows(tuple(inp[0].max))

        def get_workspace_size(self, input_desc, output_desc):
            return _logic.workspace_bytes(spec, self.attrs, _logic.rows(tuple(input_desc[0].max)))

        def get_valid_tactics(self):
            return _logic.select_tactics(_logic.tactics(spec, self.attrs, self.m_max), self.forced_tactics)

        def get_fields_to_serialize(self):
            ftype = trt.PluginFieldType
            self._fields = [trt.PluginField(name, data, getattr(ftype, t))
                            for name, data, t in _logic.encode_fields(spec, self.attrs)]
            return trt.PluginFieldCollection(self._fields)

        # IPluginV3OneRuntime
        def set_tactic(self, tactic):
            self.tactic = int(tactic)

        def on_shape_change(self, inp, out):
            _logic.output_dims(spec, self.attrs, tuple(inp[0].dims), int)  # checks rank and K

        def attach_to_context(self, resource_context):
            return self.clone()

        def enqueue(self, input_desc, output_desc, inputs, outputs, workspace, stream):
            _logic.enqueue(spec, self.attrs, _dtype(input_desc[0].type), tuple(input_desc[0].dims),
                           inputs, outputs, workspace, stream, self.tactic)

    class Creator(trt.IPluginCreatorV3One):
        def __init__(self):
            trt.IPluginCreatorV3One.__init__(self)
            self.name = spec.op_type
            self.plugin_version = _logic.PLUGIN_VERSION
            self.plugin_namespace = _logic.PLUGIN_NAMESPACE
            ftype = trt.PluginFieldType
            self.field_names = trt.PluginFieldCollection(
                [trt.PluginField(n, np.array([]), getattr(ftype, t)) for n, t in _logic.field_names(spec)])

        def create_plugin(self, name, fc, phase):
            attrs = _logic.attrs_from_fields(spec, [(f.name, f.data) for f in fc])
            return Plugin(attrs, phase)

    Plugin.__name__ = Plugin.__qualname__ = f"{spec.op_type}Plugin"
    Creator.__name__ = Creator.__qualname__ = f"{spec.op_type}PluginCreator"
    return Plugin, Creator
