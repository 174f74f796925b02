"""Plugin nodes of an ONNX model and their numpy ground truth (shared by the plugin check tools).

Used by ``tools/plugin_launch_check.py`` (GPU, no TensorRT) and ``tools/trt_smoke.py`` (TensorRT).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from edgesdk.trt import _logic

#: X dtype → (atol, rtol) for VitBit with fused GELU, as in tests/gpu/test_vitbit_gemm.py.
GELU_TOL = {"float32": (2e-6, 2e-6)}  # fp32 Y (erff); fp16 Y (gelu_h): within 1 ulp
OP_OF_TYPE = {_logic.spec_for(op).op_type: op for op in _logic.OPS}


@dataclass
class PluginLayer:
    """One plugin node: its slice, attributes as a deserialized plugin sees them, and its tensors."""

    name: str
    op: str
    attrs: dict
    tensors: dict[str, np.ndarray]  # name (format's TENSOR_NAMES) → array, in node input order

    @property
    def k(self) -> int:
        return int(self.attrs["k"])

    @property
    def n(self) -> int:
        return int(self.attrs["n"])


def plugin_layers(model: onnx.ModelProto) -> list[PluginLayer]:
    """Every ``EdgeBitmapLinear`` / ``EdgeVitBitGemm`` node whose weight inputs are initializers."""
    inits = {t.name: t for t in model.graph.initializer}
    layers = []
    for node in model.graph.node:
        op = OP_OF_TYPE.get(node.op_type)
        if op is None:
            continue
        spec = _logic.spec_for(op)
        raw = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        raw = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()}
        # exactly what a deserialized plugin gets: node attributes → fields → attributes
        attrs = _logic.attrs_from_fields(spec, [(n, d) for n, d, _ in _logic.encode_fields(spec, raw)])
        names = spec.tensor_names[: _logic.num_inputs(spec, attrs) - 1]
        tensors = {nm: numpy_helper.to_array(inits[i]) for nm, i in zip(names, node.input[1:])}
        layers.append(PluginLayer(node.name, op, attrs, tensors))
    return layers


def reference(layer: PluginLayer, x: np.ndarray) -> np.ndarray:
    """float64 (bitmap) or exact-semantics (vitbit) ground truth of the node for input ``x``."""
    if layer.op == "bitmap_linear":
        from edgesdk.formats.bitmap_linear import BitmapLinearWeights
        from edgesdk.reference.bitmap_linear import bitmap_linear

        return bitmap_linear(x, BitmapLinearWeights.from_tensors(layer.attrs, layer.tensors), out_dtype=np.float64)
    from edgesdk.reference.vitbit_gemm import forward

    return forward(x, layer.attrs, layer.tensors)


def compare(layer: PluginLayer, x: np.ndarray, y: np.ndarray) -> tuple[bool, float, str]:
    """``(ok, max |y - ref|, rule)`` for a kernel output ``y``.

    Rules: bitmap_linear within :func:`edgesdk.reference.bitmap_linear.tolerance`; vitbit_gemm
    bit-exact, or, when the node fuses GELU (not reproducible in numpy): fp16 Y (``gelu_h``) within 1 fp16 ulp,
    fp32 Y (erff) within :data:`GELU_TOL` (the rules of ``tests/gpu/test_vitbit_gemm.py::test_gelu_tight_tolerance``).
    """
    ref = reference(layer, x)
    finite = bool(np.all(np.isfinite(y)))
    err = float(np.max(np.abs(y.astype(np.float64) - ref.astype(np.float64)))) if y.size else 0.0
    if layer.op == "bitmap_linear":
        from edgesdk.formats.bitmap_linear import BitmapLinearWeights
        from edgesdk.reference.bitmap_linear import tolerance

        tol = tolerance(x, BitmapLinearWeights.from_tensors(layer.attrs, layer.tensors))
        ok = finite and bool(np.all(np.abs(y.astype(np.float64) - ref) <= tol))
        return ok, err, "within reference.tolerance()"
    if int(layer.attrs.get("gelu", 0)) and np.dtype(y.dtype) == np.float16:
        from edgesdk.reference.vitbit_gemm import fp16_ulps

        ok = finite and bool(np.all(fp16_ulps(y, ref) <= 1))
        return ok, err, "GELU: within 1 fp16 ulp"
    if int(layer.attrs.get("gelu", 0)):
        atol, rtol = GELU_TOL[np.dtype(y.dtype).name]
        ok = finite and bool(np.all(np.abs(y.astype(np.float64) - ref.astype(np.float64))
                                    <= atol + rtol * np.abs(ref.astype(np.float64))))
        return ok, err, f"GELU: atol={atol:g} rtol={rtol:g}"
    return finite and bool(np.array_equal(y, ref)), err, "bit-exact"


def one_layer_model(op: str, packed, x_dtype, x_shape: list, quantize_x: bool = False) -> onnx.ModelProto:
    """A one-node ONNX model ``Y = <plugin>(X)`` with the packed tensors as initializers.

    ``x_shape`` may name dynamic dims (e.g. ``["batch", 17, K]``). The node is written as the
    rewrite writes it: domain ``edgesdk``, the format's attributes plus ``plugin_version`` and
    ``plugin_namespace``. ``quantize_x`` (VitBit with ``y_dtype``, fp32 X): a QuantizeLinear with the
    node's ``x_scale`` in front, the plugin reading its int8 output — the rewrite's default layout.
    """
    from onnx import helper

    spec = _logic.spec_for(op)
    attrs, tensors = packed.node_attributes(), packed.to_tensors()
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(x_dtype))
    x = helper.make_tensor_value_info("X", elem, list(x_shape))
    y = helper.make_tensor_value_info("Y", elem, [*x_shape[:-1], int(attrs["n"])])
    inits = [numpy_helper.from_array(v, k) for k, v in tensors.items()]
    nodes, x_in = [], "X"
    if quantize_x:
        if np.dtype(x_dtype) != np.float32 or attrs.get("y_dtype") != "float32":
            raise ValueError("quantize_x needs fp32 X and a VitBit node with y_dtype float32 (opset 17 Q)")
        inits += [numpy_helper.from_array(np.array(attrs["x_scale"], np.float32), "x_scale"),
                  numpy_helper.from_array(np.array(0, np.int8), "x_zero_point")]
        nodes.append(helper.make_node("QuantizeLinear", ["X", "x_scale", "x_zero_point"], ["X_q"], name="X_q"))
        x_in = "X_q"
    nodes.append(helper.make_node(spec.op_type, [x_in, *tensors], ["Y"], name=f"{op}_0",
                                  domain=_logic.PLUGIN_NAMESPACE, plugin_version=_logic.PLUGIN_VERSION,
                                  plugin_namespace=_logic.PLUGIN_NAMESPACE, **attrs))
    graph = helper.make_graph(nodes, f"{op}_one_layer", [x], [y], inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid(_logic.PLUGIN_NAMESPACE, 1)])
