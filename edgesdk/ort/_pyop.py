"""Glue between plugin nodes and onnxruntime-extensions' Python custom ops.

Two limits of the Python custom-op API shape the ONNX Runtime view of a plugin node (the model
file is never changed):

* fp16 tensors are not supported at all (the process aborts with "Type float16 not supported by
  python customops api"): an fp16 X is given to the op through ``Cast(float32)`` and the op's
  fp32 output, which already holds fp16-rounded values, is cast back to fp16 (exactly).
  The op learns X's real dtype from the extra attribute ``x_dtype``. An int8 X (ops whose format
  lists it in ``X_DTYPES``) travels the same way (int8 → float32 is exact); Y's dtype is then the
  node's ``y_dtype`` attribute.
* attributes a node may omit (the format's ``ATTRIBUTE_DEFAULTS``) are added with their default.
* every declared input is required: a node without bias gets an empty float32 bias input.
* float attributes reach the op printed with 6 significant digits (``0.012345679`` arrives as
  ``0.0123457``): :func:`adapt` rewrites them as strings holding the exact float32 value
  (``%.9g`` round-trips every float32) and the op parses them back.
* an exception raised inside a Python op aborts the whole process. So :func:`adapt` validates
  every plugin node whose packed tensors are initializers (the format's ``from_tensors``) and
  raises :class:`~edgesdk.errors.EdgeSDKError` before a session exists; an error at run time
  (e.g. X with the wrong K) is printed to stderr and the op returns NaNs instead of aborting.

:func:`register` declares one op from its format module (``OP_TYPE``, ``TENSOR_NAMES``,
``ATTRIBUTES``) and a ``forward(x, attrs, tensors)`` computing exactly what the kernel computes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgesdk.errors import EdgeSDKError
from edgesdk.onnx_io import infer_shapes

#: op_type → number of inputs after X (bias included) for every registered op.
REGISTERED: dict[str, int] = {}
#: op_type → (names after X, validate(attrs, tensors)) used by :func:`adapt`.
_VALIDATORS: dict[str, tuple[tuple[str, ...], Callable[[dict, dict], object]]] = {}
_FLOAT_ATTRS: dict[str, set[str]] = {}
_ATTR_TYPES = {int: "dt_int64", float: "dt_float", str: "dt_string"}
_DTYPES = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16", TensorProto.INT8: "int8"}
#: op_type → X dtypes the op takes, and attribute defaults (the format's X_DTYPES / ATTRIBUTE_DEFAULTS).
_X_DTYPES: dict[str, tuple[str, ...]] = {}
_DEFAULTS: dict[str, dict] = {}
#: op_type → ``adapt(node, types, fresh) -> nodes`` for ops outside :func:`register`'s one-X form (several outputs,
#: a cache state), registered by their ``edgesdk.ort.<op>`` module.
ADAPTERS: dict[str, Callable] = {}


def register(fmt, input_types: list[str], forward: Callable[[np.ndarray, dict, dict], np.ndarray],
             validate: Callable[[dict, dict], object]) -> None:
    """Register ``fmt.OP_TYPE`` as an onnxruntime-extensions op.

    Args:
        fmt: The op's format module.
        input_types: ``PyCustomOpDef`` type names of the inputs after X (e.g. ``"dt_int8"``).
        forward: ``forward(x, attrs, tensors) -> y`` (x in its real dtype, y in X's dtype).
        validate: ``validate(attrs, tensors)`` raising ``FormatError`` on bad packed data.
    """
    from edgesdk.ort import import_ortx

    ortx = import_ortx()
    PyCustomOpDef, onnx_op = ortx.PyCustomOpDef, ortx.onnx_op

    attrs = {k: getattr(PyCustomOpDef, _ATTR_TYPES[str if t is float else t]) for k, t in fmt.ATTRIBUTES.items()}
    floats = [k for k, t in fmt.ATTRIBUTES.items() if t is float]
    attrs["x_dtype"] = PyCustomOpDef.dt_string
    names = fmt.TENSOR_NAMES

    def compute(x, *inputs, **kw):
        x_dtype = kw.pop("x_dtype")
        kw.update({k: float(np.float32(kw[k])) for k in floats})
        has_bias = int(kw.get("has_bias", 0))
        tensors = {n: np.asarray(v) for n, v in zip(names, inputs) if n != "bias" or has_bias}
        try:
            return np.asarray(forward(np.asarray(x).astype(x_dtype), kw, tensors)).astype(np.float32)
        except Exception as err:  # raising here would abort the process (module doc)
            print(f"edgesdk: {fmt.OP_TYPE} failed, returning NaN: {err}", file=sys.stderr, flush=True)
            n = int(kw.get("n", 1))
            return np.full(np.shape(x)[:-1] + (n,), np.nan, np.float32)

    onnx_op(op_type=fmt.OP_TYPE, inputs=[PyCustomOpDef.dt_float] + [getattr(PyCustomOpDef, t) for t in input_types],
            outputs=[PyCustomOpDef.dt_float], attrs=attrs)(compute)
    REGISTERED[fmt.OP_TYPE] = len(names)
    _VALIDATORS[fmt.OP_TYPE] = (names, validate)
    _FLOAT_ATTRS[fmt.OP_TYPE] = set(floats)
    _X_DTYPES[fmt.OP_TYPE] = tuple(getattr(fmt, "X_DTYPES", ("float16", "float32")))
    _DEFAULTS[fmt.OP_TYPE] = dict(getattr(fmt, "ATTRIBUTE_DEFAULTS", {}))


def _validate(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> None:
    names, validate = _VALIDATORS[node.op_type]
    attrs = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        attrs[a.name] = v.decode() if isinstance(v, bytes) else v
    tensors = {}
    for name, inp in zip(names, node.input[1:]):
        if inp not in inits:
            return  # weights computed at run time: checked when the op runs
        tensors[name] = numpy_helper.to_array(inits[inp])
    try:
        validate(attrs, tensors)
    except EdgeSDKError as err:
        raise EdgeSDKError(f"plugin node {node.name!r} ({node.op_type}): {err.problem}", err.fix) from None


def _known_types(model: onnx.ModelProto) -> dict[str, int]:
    g = model.graph
    out = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.tensor_type.elem_type:
            out[vi.name] = vi.type.tensor_type.elem_type
    out.update({t.name: t.data_type for t in g.initializer})
    return out


def adapt(model: onnx.ModelProto, domain: str, source: onnx.ModelProto | None = None) -> None:
    """Rewrite plugin nodes of ``domain`` in place into what the Python ops accept (module doc). ``source``: the
    model whose initializers hold the weights, where ``model`` is a :func:`~edgesdk.onnx_io.light_copy` of it.

    Raises:
        EdgeSDKError: The dtype of a plugin node's X cannot be determined or is not fp16/fp32.
    """
    g = model.graph
    plugin = [n for n in g.node if n.domain == domain and (n.op_type in REGISTERED or n.op_type in ADAPTERS)]
    if not plugin:
        return
    types = _known_types(model)
    if any(n.input[0] not in types for n in plugin):
        try:
            types.update(_known_types(infer_shapes(model, strict_mode=False)))
        except Exception:
            pass
    for n in g.node:  # onnx < 1.17 may stop inferring at a plugin node; a QuantizeLinear's output type is
        if n.op_type == "QuantizeLinear" and n.domain in ("", "ai.onnx") and n.output[0] not in types:
            zp = n.input[2] if len(n.input) > 2 else ""  # its zero point's, else output_dtype's, else uint8
            given = {a.name: a.i for a in n.attribute}.get("output_dtype", 0)
            types[n.output[0]] = types.get(zp, 0) if zp else (given or TensorProto.UINT8)
    inits = {t.name: t for t in (source or model).graph.initializer}
    for n in plugin:
        if n.op_type in REGISTERED:
            _validate(n, inits)
    taken = {o for n in g.node for o in n.output} | {t.name for t in g.initializer} | {i.name for i in g.input}

    def fresh(name: str) -> str:
        i = 0
        while f"{name}_{i}" in taken:
            i += 1
        taken.add(f"{name}_{i}")
        return f"{name}_{i}"

    plugin_ids = {id(n) for n in plugin}
    nodes = []
    for n in g.node:
        if id(n) not in plugin_ids:
            nodes.append(n)
            continue
        if n.op_type in ADAPTERS:
            nodes.extend(ADAPTERS[n.op_type](n, types, fresh))
            continue
        dt = _DTYPES.get(types.get(n.input[0], 0))
        if dt is None or dt not in _X_DTYPES[n.op_type]:
            raise EdgeSDKError(f"cannot tell the dtype of input {n.input[0]!r} of plugin node {n.name!r} "
                               f"(or it is not one of {', '.join(_X_DTYPES[n.op_type])})",
                               "rewrite the model with edgesdk (it records value_info for plugin outputs)")
        have = {a.name for a in n.attribute}
        for name, value in _DEFAULTS[n.op_type].items():
            if name not in have:
                n.attribute.append(helper.make_attribute(name, value))
        y_attr = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "y_dtype"), b"")
        y_dt = (y_attr.decode() if isinstance(y_attr, bytes) else str(y_attr)) or dt
        if y_dt not in ("float16", "float32"):
            raise EdgeSDKError(f"plugin node {n.name!r} ({n.op_type}) reads an {dt} X but has no y_dtype "
                               "attribute (float16 or float32) for its output",
                               "rewrite the model with edgesdk (it sets y_dtype on int8-input nodes)")
        want = 1 + REGISTERED[n.op_type]
        while len(n.input) < want:
            empty = fresh("edgesdk_empty_bias")
            g.initializer.append(helper.make_tensor(empty, TensorProto.FLOAT, [0], []))
            n.input.append(empty)
        for i, a in enumerate(n.attribute):
            if a.name in _FLOAT_ATTRS[n.op_type] and a.type == onnx.AttributeProto.FLOAT:
                n.attribute[i].CopyFrom(helper.make_attribute(a.name, "%.9g" % np.float32(a.f)))
        n.attribute.append(helper.make_attribute("x_dtype", dt))
        if dt != "float32":
            x32 = fresh(f"{n.input[0]}_f32")
            nodes.append(helper.make_node("Cast", [n.input[0]], [x32], to=TensorProto.FLOAT))
            n.input[0] = x32
        if y_dt == "float16":
            y32, y = fresh(f"{n.output[0]}_f32"), n.output[0]
            n.output[0] = y32
            nodes.append(n)
            nodes.append(helper.make_node("Cast", [y32], [y], to=TensorProto.FLOAT16))
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
