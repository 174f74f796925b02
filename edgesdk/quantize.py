"""Explicit INT8 quantization: symmetric Q/DQ on the inputs of linear layers, via onnxruntime.quantization.

Placement follows NVIDIA's recommendation for transformers on TensorRT: Q/DQ on the activation
and the weight of every linear MatMul/Gemm (weights per output channel, zero points 0);
LayerNorm, Softmax, GELU and the attention score path (Q·Kᵀ and P·V, whose operands are both
activations) stay in floating point. The result is what TensorRT's strongly typed builds consume
(``../shared/TRT_NOTES.md`` §3, §10).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import onnx

from edgesdk.errors import EdgeSDKError
from edgesdk.inspect import LinearInfo, find_linears, quant_state

QOPERATOR_FIX = (
    "TensorRT only reads explicit QuantizeLinear/DequantizeLinear (Q/DQ) graphs. Quantize the float "
    "model instead: `edgesdk build float_model.onnx --quantize int8` (or onnxruntime.quantization."
    "quantize_static(..., quant_format=QuantFormat.QDQ))."
)


def check_not_qoperator(model: onnx.ModelProto, path: str = "model") -> None:
    """Refuse ONNX Runtime's QOperator form (QLinearMatMul, MatMulInteger, ...), which TensorRT cannot parse."""
    if quant_state(model) == "qoperator":
        from edgesdk.inspect import QOPERATOR_OPS

        ops = sorted({n.op_type for n in model.graph.node} & QOPERATOR_OPS)
        raise EdgeSDKError(f"{path} is quantized in ONNX Runtime's QOperator form ({', '.join(ops)}).", QOPERATOR_FIX)


def select_layers(model: onnx.ModelProto, linears: list[LinearInfo], exclude: list[str],
                  include_lm_head: bool) -> tuple[list[LinearInfo], dict[str, str]]:
    """Split linears into the ones to quantize and the ones left alone (name → reason)."""
    integer_inputs = any(
        i.type.tensor_type.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) for i in model.graph.input
    )
    outputs = {o.name for o in model.graph.output}
    pats = [re.compile(p) for p in exclude]
    chosen, skipped = [], {}
    for li in linears:
        hit = next((p.pattern for p in pats if p.search(li.name)), None)
        if hit is not None:
            skipped[li.name] = f"excluded by --exclude {hit!r}"
        elif not include_lm_head and ("lm_head" in li.name or (integer_inputs and li.output in outputs)):
            skipped[li.name] = "LM head kept in float (use --include-lm-head to quantize it)"
        else:
            chosen.append(li)
    return chosen, skipped


class _Reader:
    """An onnxruntime.quantization CalibrationDataReader over a list of feed dicts."""

    def __init__(self, feeds: list[dict[str, np.ndarray]], progress=None):
        self.feeds, self.i, self.progress = feeds, 0, progress

    def get_next(self):
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        if self.progress is not None:
            self.progress(self.i, len(self.feeds))
        return self.feeds[self.i - 1]

    def rewind(self):
        self.i = 0


def quantize_int8(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], layers: list[LinearInfo],
                  method: str = "minmax", progress=None) -> onnx.ModelProto:
    """Quantize ``layers`` of a float model to symmetric INT8 Q/DQ with ``quantize_static``.

    Args:
        model: Float ONNX model (node names unique and non-empty).
        feeds: Calibration inputs (one dict of input name → array per sample).
        layers: Linears to quantize (from :func:`edgesdk.inspect.find_linears`).
        method: ``"minmax"`` or ``"percentile"`` (99.999th percentile of |x|) activation ranges.
        progress: Optional ``callback(done, total)`` called per calibration sample.

    Returns:
        The Q/DQ model (weights int8 per output channel, activations int8 per tensor, zero points 0).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    if not layers:
        return model
    model = fold_weight_transposes(model, layers)
    if not feeds:
        raise EdgeSDKError("INT8 quantization needs at least one calibration sample.",
                           "pass --calibration DATA or raise --calibration-count.")
    reader = type("EdgeCalibrationReader", (_Reader, CalibrationDataReader), {})(feeds, progress)
    methods = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile}
    extra = {
        "ActivationSymmetric": True,
        "WeightSymmetric": True,
        "QuantizeBias": False,  # TensorRT's DequantizeLinear takes no INT32 input: biases stay float
        "MatMulConstBOnly": True,
        "OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm"],  # Q/DQ on linear inputs only
    }
    if method == "percentile":
        extra.update({"CalibPercentile": 99.999, "CalibTensorRangeSymmetric": True})
    with tempfile.TemporaryDirectory(prefix="edgesdk-q-") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "qdq.onnx"
        onnx.save(model, str(src))
        quantize_static(
            str(src), str(dst), reader,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul", "Gemm"],
            nodes_to_quantize=[li.node for li in layers],
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=methods[method],
            extra_options=extra,
        )
        out = onnx.load(str(dst))
    out.ir_version = min(out.ir_version, 10)
    _check_placement(out, {li.node for li in layers})
    return out


def fold_weight_transposes(model: onnx.ModelProto, layers: list[LinearInfo]) -> onnx.ModelProto:
    """Replace ``Transpose(W)`` and Constant-node weights feeding float linears by ``[K, N]`` initializers.

    onnxruntime.quantization only quantizes a MatMul whose B is an initializer.
    """
    from onnx import numpy_helper

    from edgesdk.inspect import GraphIndex

    out = onnx.ModelProto()
    out.CopyFrom(model)
    ix = GraphIndex(out)
    inits = {t.name for t in out.graph.initializer}
    drop = set()
    for li in layers:
        if li.quantized or (li.weight_transpose is None and li.weight in inits):
            continue
        node = ix.nodes[li.node]
        name = f"{li.weight}_T" if li.weight_transpose else li.weight
        if name not in inits:
            w = ix.array(li.weight)
            out.graph.initializer.append(numpy_helper.from_array(w.T.copy() if li.weight_transpose else w, name))
            inits.add(name)
        if li.weight_transpose:
            t = ix.nodes[li.weight_transpose]
            node.input[1] = name
            if all(c.name == li.node for c in ix.consumers.get(t.output[0], [])):
                drop.add(t.name)
        if li.weight in ix.producer:  # a Constant node: now an initializer of the same name
            drop.add(ix.producer[li.weight].name)
    keep = [n for n in out.graph.node if n.name not in drop]
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out


def _check_placement(model: onnx.ModelProto, wanted: set[str]) -> None:
    """Every requested linear got an int8 per-channel weight and a symmetric activation Q/DQ."""
    from edgesdk.inspect import GraphIndex

    ix = GraphIndex(model)
    got = {li.node: li for li in find_linears(model)}
    for name in wanted:
        li = got.get(name)
        if li is None or not li.quantized or li.act_dq is None:
            raise EdgeSDKError(f"onnxruntime.quantization did not quantize linear node {name!r}.",
                               f"exclude it with --exclude, or report this model's graph around {name!r}.")
        scale = ix.array(li.weight_scale)
        for zp in (li.weight_zero_point, li.act_zero_point):
            if zp is not None and np.any(ix.array(zp) != 0):
                raise EdgeSDKError(f"linear {li.name!r} got a non-zero zero point.", "TensorRT needs symmetric Q/DQ.")
        if scale.size not in (1, li.n):
            raise EdgeSDKError(f"linear {li.name!r}: weight scale has {scale.size} values, expected {li.n}.",
                               "report this model; per-channel quantization went wrong.")
