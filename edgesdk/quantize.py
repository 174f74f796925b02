"""Explicit INT8 quantization: symmetric Q/DQ on the inputs of linear layers, via onnxruntime.quantization.

Placement follows NVIDIA's recommendation for transformers on TensorRT: Q/DQ on the activation
and the weight of every linear MatMul/Gemm (weights per output channel, zero points 0);
LayerNorm, Softmax, GELU and the attention score path (Q·Kᵀ and P·V, whose operands are both
activations) stay in floating point. The result is what TensorRT's strongly typed builds consume
(``../shared/TRT_NOTES.md`` §3, §10).
"""

from __future__ import annotations

import logging
import re
import tempfile
from pathlib import Path

import numpy as np
import onnx

from edgesdk.errors import EdgeSDKError
from edgesdk.inspect import LinearInfo, find_linears, quant_state, subgraph_inputs
from edgesdk.onnx_io import check_model, is_large, save_model

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
    pats = []
    for p in exclude:
        try:
            pats.append(re.compile(p))
        except re.error as e:
            raise EdgeSDKError(f"--exclude {p!r} is not a valid regular expression ({e}).",
                               "quote it for the shell and escape regex characters, e.g. --exclude 'blocks\\.0\\.'"
                               ) from None
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
                  method: str = "minmax", progress=None, smooth: float | None = None,
                  smoothing: dict | None = None) -> onnx.ModelProto:
    """Quantize ``layers`` of a float model to symmetric INT8 Q/DQ with ``quantize_static``.

    Args:
        model: Float ONNX model (node names unique and non-empty).
        feeds: Calibration inputs (one dict of input name → array per sample).
        layers: Linears to quantize (from :func:`edgesdk.inspect.find_linears`).
        method: ``"minmax"`` or ``"percentile"`` (99.999th percentile of |x|) activation ranges.
        progress: Optional ``callback(done, total)`` called per calibration sample.
        smooth: SmoothQuant migration strength alpha (see :func:`smooth_activations`); None = off.
        smoothing: Optional dict filled with the smoothing factors per smoothed layer (see
            :func:`smooth_activations`' ``scales``), so that the float weights ONNX Runtime quantized can be rebuilt
            from ``model``'s without holding them (:mod:`edgesdk.sensitivity`).

    Returns:
        The Q/DQ model (weights int8 per output channel, activations int8 per tensor, zero points 0).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    if not layers:
        return model
    source = model
    model = fold_weight_transposes(model, layers)
    _check_float16_opset(model, layers)
    if smooth:
        model, _ = smooth_activations(model, feeds, layers, smooth, scales=smoothing)
    if not feeds:
        raise EdgeSDKError("INT8 quantization needs at least one calibration sample.",
                           "pass --calibration DATA or raise --calibration-count.")
    _flatten_gemm_row_bias(model, layers)
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
        large = is_large(model)
        save_model(model, src)  # beside it float.onnx.data, over 2 GB
        del model  # quantize_static reads the file: a model of several GB is not held twice more
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # quantize_static's "consider pre-processing" advice does not apply here
        try:
            quantize_static(
                str(src), str(dst), reader,
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=["MatMul", "Gemm", *_calibrate_softmax()],
                nodes_to_quantize=[li.node for li in layers],
                per_channel=True,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=methods[method],
                extra_options=extra,
                use_external_data_format=large,
            )
        except Exception as e:  # a bug or limit of onnxruntime.quantization on this graph: no traceback
            raise _quantize_failed(e, source, layers) from None
        finally:
            root.setLevel(level)
        out = onnx.load(str(dst))
        out.ir_version = min(out.ir_version, 10)
        toposort(out.graph)  # quantize_static can put an If/Loop before the producers of the outer tensors it reads
        _float_inputs_elsewhere(out, {li.node for li in layers})
        _check_valid(out, source)
    _check_placement(out, {li.node for li in layers})
    return out


def _float_inputs_elsewhere(model: onnx.ModelProto, quantized: set[str]) -> None:
    """Give every node outside ``quantized`` the float tensor again where it reads an activation's DequantizeLinear.

    onnxruntime's quantizer points every consumer of a quantized activation at its DequantizeLinear, including nodes
    it was not asked to quantize: a linear left out with --exclude beside one that is quantized (k_proj excluded,
    q_proj not) would read INT8-rounded activations with its float weight. What is left float stays float.
    """
    producer = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.name in quantized or node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        for j, name in enumerate(node.input):
            dq = producer.get(name)
            q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
            if q is not None and q.op_type == "QuantizeLinear":
                node.input[j] = q.input[0]


def _calibrate_softmax() -> list[str]:
    """``["Softmax"]`` for onnxruntime < 1.20, else ``[]``.

    onnxruntime 1.18/1.19's quantizer sets every Softmax output's range to [0, 1] after calibration, including
    Softmax nodes it was not asked to quantize, and fails ("Only an existing tensor can be modified") where that
    output was not calibrated: a Softmax followed by a Cast (Hugging Face Llama/Qwen attention) rather than by a
    MatMul. Listing Softmax among the op types calibrates those outputs; ``nodes_to_quantize`` still keeps Q/DQ off
    them. 1.20 skips nodes it does not quantize.
    """
    import onnxruntime

    try:
        version = tuple(int(x) for x in onnxruntime.__version__.split(".")[:2])
    except ValueError:
        return []
    return ["Softmax"] if version < (1, 20) else []


def smooth_activations(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], layers: list[LinearInfo],
                       alpha: float = 0.5, scales: dict | None = None) -> tuple[onnx.ModelProto, dict[str, str]]:
    """SmoothQuant (Xiao et al., 2023): move activation outliers into the weights before INT8.

    For the linears reading one activation X (e.g. q/k/v), per input channel j:
    ``s_j = max|X_j|^alpha / max|W_j,:|^(1-alpha)``; X is divided by s where it is produced and
    the weight rows are multiplied by s, so the float function is unchanged. X / s is folded into
    the producer: a LayerNormalization (scale and bias), an RMSNorm's final ``Mul`` by a
    constant gamma, or a ``Mul(a, up_proj(x))`` (the SwiGLU gate feeding a down projection, folded
    into up_proj's output columns). Groups with any other producer are left alone.

    Args:
        model: Float model.
        feeds: Calibration inputs (for max|X_j|).
        layers: Linears to be quantized.
        alpha: Migration strength in (0, 1).
        scales: Optional dict filled per smoothed layer name with ``(rows, cols, alpha)``: float64 factors over K
            that multiplied the weight's rows, over N that divided its columns (and bias), or None where there were
            none, and the alpha of the layer's own group (None where only its columns were divided).
            The smoothed weight is ``float32(W · rows[:, None] / cols[None, :])`` of the ``[K, N]`` weight.

    Returns:
        The smoothed model and, per smoothed layer name, where its input scale went.
    """
    from onnx import numpy_helper

    from edgesdk.inspect import GraphIndex, bias_values, weight_kn
    from edgesdk.ort import make_session

    # float linears left out of ``layers`` (--exclude) that read the same activation as a layer to quantize: X / s
    # reaches them too, so their weight rows take s as well (their float function unchanged)
    chosen = {li.name for li in layers}
    inputs = {li.input for li in layers}
    bystanders = [li for li in find_linears(model) if li.name not in chosen and li.input in inputs and not li.quantized
                  and not li.trans_a]
    model = fold_weight_transposes(model, [li for li in layers if not li.quantized] + bystanders)
    ix = GraphIndex(model)
    lin = {li.name: li for li in find_linears(model)}
    groups: dict[str, list[LinearInfo]] = {}
    for li in layers:
        li = lin.get(li.name)
        if li is not None and not li.quantized and not li.trans_a:
            groups.setdefault(li.input, []).append(li)
    riders: dict[str, list[LinearInfo]] = {}
    for li in bystanders:
        if li.name in lin and li.input in groups:
            riders.setdefault(li.input, []).append(lin[li.name])

    def only_for(tensor: str, allowed: set[str]) -> bool:
        return tensor not in ix.graph_outputs and all(
            c.name in allowed or c.op_type == "Shape" for c in ix.consumers.get(tensor, []))

    plans = {}  # activation tensor -> (kind, producer node, gamma name | up-proj LinearInfo)
    by_output = {li.output: li for li in lin.values()}
    for x, group in groups.items():
        node = ix.producer.get(x)
        k = group[0].k
        if (node is None or not only_for(x, {li.node for li in group + riders.get(x, [])})
                or any(li.k != k for li in group + riders.get(x, []))):
            continue
        if node.op_type == "LayerNormalization" and ix.const(node.input[1]) is not None:
            plans[x] = ("layernorm", node, None)
        elif node.op_type == "Mul":
            consts = [i for i in node.input if ix.const(i) is not None and int(np.prod(ix.const(i).dims)) == k]
            ups = [by_output[i] for i in node.input if i in by_output and not by_output[i].trans_a]
            if consts:
                plans[x] = ("gamma", node, consts[0])
            elif ups and only_for(ups[0].output, {node.name}) and ups[0].n == k:
                plans[x] = ("up", node, ups[0])
    if not plans:
        return model, {}
    sess = make_session(model, outputs=list(plans))
    names = [o.name for o in sess.get_outputs()]
    amax = {x: np.zeros(groups[x][0].k) for x in plans}
    for f in feeds:
        for n, v in zip(names, sess.run(None, f)):
            if n in amax:
                amax[n] = np.maximum(amax[n], np.abs(v.astype(np.float64)).reshape(-1, v.shape[-1]).max(0))
    del sess

    taken = {t.name for t in model.graph.initializer} | {o for n in model.graph.node for o in n.output}

    def put(array: np.ndarray, base: str) -> str:
        name = base
        while name in taken:
            name += "_s"
        taken.add(name)
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array, np.float32), name))
        return name

    done = {}
    row_scale: dict[str, np.ndarray] = {}  # linear name -> s over K (weight rows multiplied)
    col_scale: dict[str, np.ndarray] = {}  # linear name -> s over N (weight columns and bias divided)
    alphas: dict[str, float | None] = {}  # linear name -> alpha of its group
    for x, (kind, node, extra) in plans.items():
        group = groups[x]
        wmax = np.max([np.abs(weight_kn(model, li, ix)).max(1) for li in group], axis=0).astype(np.float64)
        ok = (amax[x] > 0) & (wmax > 0)
        sc = np.ones_like(wmax)
        sc[ok] = np.clip(amax[x][ok] ** alpha / wmax[ok] ** (1 - alpha), 1e-5, 1e5)
        for li in group + riders.get(x, []):
            row_scale[li.name] = sc
            alphas[li.name] = alpha
            done[li.name] = kind
        if kind == "layernorm":
            node.input[1] = put(ix.array(node.input[1]).astype(np.float64) / sc, f"{node.input[1]}_smooth")
            if len(node.input) > 2 and node.input[2]:
                node.input[2] = put(ix.array(node.input[2]).astype(np.float64) / sc, f"{node.input[2]}_smooth")
        elif kind == "gamma":
            i = list(node.input).index(extra)
            g = ix.array(extra).astype(np.float64)
            node.input[i] = put((g.reshape(-1) / sc).reshape(g.shape), f"{extra}_smooth")
        else:  # 1/s goes into up_proj's output columns (and bias)
            col_scale[extra.name] = sc
    for name in set(row_scale) | set(col_scale):
        li = lin[name]
        w = weight_kn(model, li, ix).astype(np.float64)
        w = w * row_scale.get(name, np.ones(li.k))[:, None] / col_scale.get(name, np.ones(li.n))[None, :]
        ix.nodes[li.node].input[1] = put(w.T if li.weight_layout == "NK" else w, f"{li.weight}_smooth")
        b = bias_values(model, li, ix)
        if name in col_scale and b is not None:
            holder = ix.nodes[li.bias_node] if li.bias_node else ix.nodes[li.node]
            j = list(holder.input).index(li.bias)
            holder.input[j] = put(b.astype(np.float64) / col_scale[name], f"{li.bias}_smooth")
    if scales is not None:
        scales.update({name: (row_scale.get(name), col_scale.get(name), alphas.get(name))
                       for name in set(row_scale) | set(col_scale)})
    used = {i for n in model.graph.node for i in n.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    return model, done


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


FLOAT16_TYPES = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}
QDQ_FLOAT16_OPSET = 19  # QuantizeLinear/DequantizeLinear take float16/bfloat16 scales from opset 19


def _check_float16_opset(model: onnx.ModelProto, layers: list[LinearInfo]) -> None:
    """Refuse float16 linears below opset 19: their Q/DQ scales would be float16, which opsets < 19 do not allow."""
    from edgesdk.onnx_io import opset

    v = opset(model)
    if v >= QDQ_FLOAT16_OPSET:
        return
    inits = {t.name: t.data_type for t in model.graph.initializer}
    half = [(li.name, FLOAT16_TYPES[inits[li.weight]]) for li in layers
            if not li.quantized and inits.get(li.weight) in FLOAT16_TYPES]
    if half:
        names = ", ".join(repr(n) for n, _ in half[:3]) + (f" and {len(half) - 3} more" if len(half) > 3 else "")
        dtype, one = half[0][1], len(half) == 1
        raise EdgeSDKError(
            f"float16 models need opset >= {QDQ_FLOAT16_OPSET} for INT8 Q/DQ: {'linear' if one else 'linears'} "
            f"{names} {'has' if one else 'have'} {dtype} weights and the model is at ONNX opset {v} (its Q/DQ "
            f"scales would be {dtype}, which QuantizeLinear/DequantizeLinear accept only from opset "
            f"{QDQ_FLOAT16_OPSET}).",
            f"re-export the model at opset {QDQ_FLOAT16_OPSET} (torch.onnx.export(..., opset_version="
            f"{QDQ_FLOAT16_OPSET})) or in float32, or build with --quantize none.")


def _flatten_gemm_row_bias(model: onnx.ModelProto, layers: list[LinearInfo]) -> None:
    """Give each quantized Gemm with a constant C of shape ``[1, N]`` the same C as ``[N]`` (in place).

    Gemm broadcasts C unidirectionally to ``[M, N]``, so both mean the same; onnxruntime.quantization's
    int32-bias scale check fails on the 2-D form. The initializer is reshaped where only these Gemms read it,
    else a new one is made (other readers keep the original).
    """
    from onnx import numpy_helper

    from edgesdk.inspect import GraphIndex

    g = model.graph
    ix = GraphIndex(model)
    fix: dict[str, list[onnx.NodeProto]] = {}
    for li in layers:
        node = ix.nodes.get(li.node)
        if li.kind != "Gemm" or li.quantized or node is None or len(node.input) < 3 or not node.input[2]:
            continue
        t = ix.const(node.input[2])
        if t is not None and list(t.dims) == [1, li.n]:
            fix.setdefault(node.input[2], []).append(node)
    if not fix:
        return
    readers: dict[str, int] = {}
    for n in g.node:
        for name in set(n.input) | subgraph_inputs(n):
            readers[name] = readers.get(name, 0) + 1
    pinned = {o.name for o in g.output} | {i.name for i in g.input}
    inits = {t.name: t for t in g.initializer}
    taken = set(inits) | {o for n in g.node for o in n.output} | {i.name for i in g.input}
    for c, nodes in fix.items():
        if c in inits and c not in pinned and readers.get(c, 0) == len(nodes):
            t = inits[c]
            n_el = t.dims[1]
            del t.dims[:]
            t.dims.append(n_el)
            continue
        name = f"{c}_flat"
        while name in taken:
            name += "_"
        taken.add(name)
        g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(ix.array(c).reshape(-1)), name))
        for node in nodes:
            node.input[2] = name
        if readers.get(c, 0) == len(nodes) and c not in pinned and c in ix.producer:
            dead = ix.producer[c]  # the Constant node C came from, now unread
            if dead.op_type == "Constant":
                g.node.remove(dead)


def toposort(graph: onnx.GraphProto) -> None:
    """Sort ``graph``'s nodes topologically in place (subgraphs too), keeping the given order where it is valid.

    A node with If/Loop/Scan bodies depends on the producers of the outer-scope tensors its bodies read.
    A graph with a cycle is left as it is (onnx.checker then names the problem).
    """
    import heapq

    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                toposort(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sub in a.graphs:
                    toposort(sub)
    nodes = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    users: list[list[int]] = [[] for _ in nodes]
    indegree = [0] * len(nodes)
    for i, n in enumerate(nodes):
        for p in {producer[x] for x in set(n.input) | subgraph_inputs(n) if x in producer} - {i}:
            users[p].append(i)
            indegree[i] += 1
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in users[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(nodes) or order == list(range(len(nodes))):
        return
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)


def _quantize_failed(e: Exception, model: onnx.ModelProto, layers: list[LinearInfo]) -> EdgeSDKError:
    """An EdgeSDKError for an exception out of quantize_static, naming the linear it was working on if it can."""
    names: dict[str, str] = {}
    for li in layers:
        for key in (li.node, li.weight, li.bias, f"{li.weight}_T" if li.weight_transpose else None):
            if key:
                names.setdefault(key, li.name)
    layer = next((names[k] for k in sorted(names, key=len, reverse=True) if re.search(
        rf"(?<![\w./:-]){re.escape(k)}(?![\w./:-])", str(e))), None)
    tb = e.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):  # the innermost frame that holds a layer's node, weight or bias name
        if layer is not None:
            break
        for v in frame.f_locals.values():
            key = v.name if isinstance(v, (onnx.NodeProto, onnx.TensorProto)) else v if isinstance(v, str) else None
            if key in names:
                layer = names[key]
                break
    detail = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    if len(detail) > 300:
        detail = detail[:297] + "..."
    if layer is not None:
        return EdgeSDKError(f"onnxruntime.quantization failed on linear {layer!r} ({detail}).",
                            f"--exclude the layer (--exclude '^{re.escape(layer)}$'), or report this with the model.")
    return EdgeSDKError(f"onnxruntime.quantization failed on this model ({detail}).",
                        "--exclude the layer it fails on (see `edgesdk inspect` for the names), or report this with "
                        "the model.")


def _check_valid(model: onnx.ModelProto, source: onnx.ModelProto) -> None:
    """The quantized model passes onnx.checker, then the full check (types, shapes), each unless the float model
    fails it too (then the quantization is not what broke it: e.g. graph outputs declared without a shape)."""
    for full in (False, True):
        try:
            check_model(model, full_check=full)
        except Exception as e:
            try:
                check_model(source, full_check=full)
            except Exception:
                return
            raise EdgeSDKError(f"INT8 quantization produced an invalid ONNX model: {_short(e)}",
                               "--exclude the layers concerned, build with --quantize none, or report this with "
                               "the model.") from None


def _short(e: Exception) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= 300 else s[:297] + "..."
