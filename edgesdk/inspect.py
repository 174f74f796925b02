"""Linear-layer discovery: which nodes of an ONNX graph are ``Y = X·W (+ b)`` with a constant W.

:func:`find_linears` recognises the forms the common exporters write (torch.onnx legacy and
dynamo, HF/optimum, timm) and the Q/DQ form ONNX Runtime's quantizer and ModelOpt write:

* ``MatMul(X, W)`` with W ``[K, N]``, optionally followed by ``Add(·, b)`` (either operand order),
* ``MatMul(X, Transpose(W))`` with W stored ``[N, K]``,
* ``Gemm(A, B, C)`` with ``transA``/``transB`` (``alpha == beta == 1``),
* any of these with W behind a per-channel ``DequantizeLinear`` (int8 weights) and X behind a
  ``QuantizeLinear → DequantizeLinear`` pair (activation scale),
* X of any rank ≥ 2 (``[..., K]``; 3-D activations of transformers included).

MatMuls whose two operands are both activations (attention scores Q·Kᵀ and P·V) are not linears, nor are
MatMuls on an activation of rank < 2 (the plugins need rows), nor Gemms whose C is not a bias ``[N]`` or
``[1, N]`` (a per-row ``[M, 1]``, full ``[M, N]`` or scalar C). A bias ``Add`` is fused only when its constant
is ``[N]`` or ``[1, …, 1, N]`` and does not raise the output's rank (else it stays in the graph). Ranks come
from the graph's inputs, outputs and ``value_info``, else from ONNX shape inference; where neither gives one, it is
not checked.
The rewrite passes (``edgesdk/rewrite``) and ``edgesdk inspect`` both build on this module.
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from edgesdk.onnx_io import infer_shapes

QOPERATOR_OPS = frozenset(
    {"QLinearMatMul", "MatMulInteger", "DynamicQuantizeLinear", "ConvInteger", "QLinearConv",
     "QLinearAdd", "QLinearMul", "QGemm", "QAttention", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
     "QLinearSoftmax", "QLinearGlobalAveragePool", "QLinearConcat", "QLinearLeakyRelu", "QLinearSigmoid"}
)


@dataclass
class LinearInfo:
    """One linear layer ``Y[..., N] = X[..., K] · W[K, N] (+ b[N])`` found in a graph.

    Attributes:
        name: Layer name for reports and ``--exclude`` regexes (e.g. ``blocks.0.attn.qkv``).
        kind: ``"MatMul"`` or ``"Gemm"`` (the op that does the product).
        node: Name of the MatMul/Gemm node.
        input: Float activation tensor the layer reads (before Q/DQ when quantized).
        output: Tensor the layer writes (the bias Add's output when a bias Add is fused).
        k: Input features.
        n: Output features.
        weight: Initializer holding W (int8 when quantized, float otherwise).
        weight_layout: ``"KN"`` or ``"NK"``: how ``weight`` is stored.
        bias: Initializer holding b, or None.
        bias_node: The separate ``Add`` node adding the bias, or None (Gemm's C, or no bias).
        trans_a: Gemm ``transA`` (the activation is stored ``[K, M]``); always False for MatMul.
        quantized: True when W comes through a DequantizeLinear.
        weight_dq: DequantizeLinear node of W, or None.
        weight_scale: Initializer of W's scale (shape ``[N]`` per channel or scalar), or None.
        weight_zero_point: Initializer of W's zero point, or None.
        weight_axis: DequantizeLinear ``axis`` of W, or None.
        act_q: QuantizeLinear node in front of the activation, or None (may be shared by layers).
        act_dq: DequantizeLinear node in front of the layer's activation input, or None.
        act_scale: Initializer of the activation scale, or None.
        act_zero_point: Initializer of the activation zero point, or None.
        weight_transpose: Transpose node between W and the MatMul, or None.
        bias_dq: DequantizeLinear node of an int32-quantized bias, or None.
        nodes: Nodes that belong to this layer alone (weight DQ/Transpose, MatMul/Gemm, bias Add),
            in graph order; the activation Q/DQ may be shared and is not listed.
    """

    name: str
    kind: str
    node: str
    input: str
    output: str
    k: int
    n: int
    weight: str
    weight_layout: str
    bias: str | None = None
    bias_node: str | None = None
    trans_a: bool = False
    quantized: bool = False
    weight_dq: str | None = None
    weight_scale: str | None = None
    weight_zero_point: str | None = None
    weight_axis: int | None = None
    act_q: str | None = None
    act_dq: str | None = None
    act_scale: str | None = None
    act_zero_point: str | None = None
    weight_transpose: str | None = None
    bias_dq: str | None = None
    nodes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """Every name the If/Loop/Scan bodies of ``node`` (nested ones too) read: the outer-scope tensors they depend
    on, plus names their own nodes define (which no outer node produces)."""
    used: set[str] = set()
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            for n in g.node:
                used.update(i for i in n.input if i)
                used |= subgraph_inputs(n)
    return used


def _ranks(g: onnx.GraphProto) -> dict[str, int]:
    return {vi.name: len(vi.type.tensor_type.shape.dim) for vi in list(g.input) + list(g.value_info) + list(g.output)
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}


class GraphIndex:
    """Lookups over one graph: producers, consumers, constants (initializers and Constant nodes)."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.graph = g
        self.nodes = {n.name: n for n in g.node}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for o in n.output:
                self.producer[o] = n
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self.constants: dict[str, onnx.TensorProto] = {t.name: t for t in g.initializer}
        for n in g.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
                for a in n.attribute:
                    if a.name == "value":
                        self.constants[n.output[0]] = a.t
            elif n.op_type == "Identity" and n.input[0] in self.constants:
                # torch.onnx's legacy exporter dedups equal initializers (e.g. all-zero biases) this way
                self.constants[n.output[0]] = self.constants[n.input[0]]
        self.graph_outputs = {o.name for o in g.output}
        self._from_constants: dict[str, bool] = {}
        self.ranks = _ranks(g)  # tensors whose rank the graph states (inputs, outputs, value_info)
        self._model = model
        self._inferred: dict[str, int] | None = None

    def rank(self, *tensors: str) -> int | None:
        """Rank of the first of ``tensors`` the graph states one for (constants included), else the first ONNX
        shape inference finds (run once, on the first such miss; models without ``value_info`` are common),
        else None."""
        for t in tensors:
            if t in self.constants:
                return len(self.constants[t].dims)
            if t in self.ranks:
                return self.ranks[t]
        if self._inferred is None:
            self._inferred = {}
            try:
                self._inferred = _ranks(infer_shapes(self._model, strict_mode=False).graph)
            except Exception:  # inference is an aid here (e.g. ops it does not know): no ranks from it
                pass
        return next((self._inferred[t] for t in tensors if t in self._inferred), None)

    def from_constants(self, name: str) -> bool:
        """Whether ``name`` is computed from constants alone (a weight behind any ops), not from graph inputs.
        Iterative (an LLM's activations go back thousands of nodes); results are kept for later calls."""
        memo = self._from_constants
        stack, on_path = [(name, False)], set()
        while stack:
            t, expanded = stack.pop()
            if t in memo:
                continue
            node = self.producer.get(t)
            if t in self.constants or node is None:  # a constant, or a graph input
                memo[t] = t in self.constants
                continue
            ins = [i for i in node.input if i]
            if expanded:
                on_path.discard(t)
                memo[t] = all(memo.get(i, False) for i in ins)
            elif t in on_path:  # a cycle (not a valid graph): not a weight
                memo[t] = False
            else:
                on_path.add(t)
                stack.append((t, True))
                stack.extend((i, False) for i in ins if i not in memo)
        return memo[name]

    def const(self, name: str) -> onnx.TensorProto | None:
        return self.constants.get(name)

    def array(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.constants[name])

    def sole_consumer(self, tensor: str) -> onnx.NodeProto | None:
        c = self.consumers.get(tensor, [])
        if len(c) == 1 and tensor not in self.graph_outputs:
            return c[0]
        return None

    def produced_by(self, tensor: str, op_type: str) -> onnx.NodeProto | None:
        n = self.producer.get(tensor)
        return n if n is not None and n.op_type == op_type else None


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _dims(t: onnx.TensorProto) -> list[int]:
    return list(t.dims)


def _trace_weight(ix: GraphIndex, tensor: str) -> dict | None:
    """Follow a MatMul/Gemm operand back through Transpose / DequantizeLinear to a constant."""
    out = {"transpose": None, "dq": None}
    for _ in range(3):
        if ix.const(tensor) is not None:
            t = ix.const(tensor)
            if len(t.dims) != 2:
                return None
            out["weight"] = tensor
            return out
        node = ix.producer.get(tensor)
        if node is None:
            return None
        if node.op_type == "Transpose" and out["transpose"] is None:
            perm = _attr(node, "perm", [1, 0])
            if list(perm) != [1, 0]:
                return None
            out["transpose"] = node
            tensor = node.input[0]
        elif node.op_type == "DequantizeLinear" and out["dq"] is None:
            if ix.const(node.input[1]) is None:
                return None
            if len(node.input) > 2 and node.input[2] and ix.const(node.input[2]) is None:
                return None
            out["dq"] = node
            tensor = node.input[0]
        else:
            return None
    return None


def _trace_activation(ix: GraphIndex, tensor: str) -> dict:
    """Activation input: unwrap a Q → DQ pair (constant scales) in front of it."""
    dq = ix.produced_by(tensor, "DequantizeLinear")
    if dq is not None and ix.const(dq.input[1]) is not None:
        q = ix.produced_by(dq.input[0], "QuantizeLinear")
        if q is not None and ix.const(q.input[1]) is not None:
            return {"input": q.input[0], "q": q, "dq": dq}
    return {"input": tensor, "q": None, "dq": None}


def _is_bias(dims: list[int], n: int, rank: int | None = None) -> bool:
    """``dims`` is a bias added to every row of a ``[..., N]`` tensor of rank ``rank`` (None: unknown):
    ``[N]`` or ``[1, …, 1, N]``, and no more dims than that tensor (else it broadcasts to a higher rank)."""
    return bool(dims) and dims[-1] == n and all(d == 1 for d in dims[:-1]) and (rank is None or len(dims) <= rank)


def _find_bias(ix: GraphIndex, tensor: str, n: int,
               rank: int | None = None) -> tuple[onnx.NodeProto, str, onnx.NodeProto | None] | None:
    """An ``Add(tensor, b)`` (either order) with b a constant ``[N]`` or ``[1, …, 1, N]`` that keeps
    ``tensor``'s rank (``rank``, None when unknown)."""
    add = ix.sole_consumer(tensor)
    if add is None or add.op_type != "Add" or len(add.input) != 2:
        return None
    other = add.input[1] if add.input[0] == tensor else add.input[0]
    if other == tensor:
        return None
    dq = None
    if ix.const(other) is None:
        dq = ix.produced_by(other, "DequantizeLinear")
        if dq is None or ix.const(dq.input[0]) is None or ix.const(dq.input[1]) is None:
            return None
        other = dq.input[0]
    if not _is_bias(_dims(ix.const(other)), n, rank):
        return None
    return add, other, dq


def _clean_name(s: str) -> str:
    """``/blocks/blocks.0/attn/proj/MatMul`` → ``blocks.0.attn.proj`` (torch scope names repeat parents)."""
    s = re.sub(r"/(MatMul|Gemm|Add|MatMulAddFusion)(_\d+)?$", "", s.strip("/"))
    parts = [p for p in s.split("/") if p]
    keep = [p for i, p in enumerate(parts) if not (i + 1 < len(parts) and parts[i + 1].startswith(p + "."))]
    return ".".join(keep) or "linear"


def _layer_name(node: onnx.NodeProto, weight: str, bias: str | None) -> str:
    """The module path: from parameter names (``blocks.0.fc1.weight``), torch dynamo's name-scope
    metadata, else the node name."""
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes":
            try:
                scopes = ast.literal_eval(p.value)
            except (ValueError, SyntaxError):
                break
            path = ""  # scopes: ['', 'lm', 'lm.model', ..., 'lm.model.layers.0.mlp.up_proj', 'linear']
            for sc in scopes:
                if isinstance(sc, str) and sc and (not path or sc.startswith(path + ".")):
                    path = sc
            if path:
                return path
    for param, suffix in ((weight, ".weight"), (bias or "", ".bias")):
        for tag in ("_quantized", "_transposed", "_DequantizeLinear", "_scale"):
            param = param.replace(tag, "")
        if param.endswith(suffix) and not param.startswith("onnx::"):
            return param[: -len(suffix)]
    if node.name and not node.name.startswith("node_"):
        return _clean_name(node.name)
    return _clean_name(node.name or node.output[0])


def find_linears(model: onnx.ModelProto, passed_over: dict[str, str] | None = None) -> list[LinearInfo]:
    """All linear layers of ``model``'s main graph, in graph order.

    Args:
        model: An ONNX model, float or Q/DQ.
        passed_over: If given, filled with node name -> why each other MatMul/Gemm is not a linear.

    Returns:
        One :class:`LinearInfo` per MatMul/Gemm whose second operand (the first with Gemm
        ``transA``) is a 2-D constant, possibly behind Transpose/DequantizeLinear.
    """
    ix = GraphIndex(model)
    found: list[LinearInfo] = []
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("MatMul", "Gemm"):
            continue
        why = passed_over if passed_over is not None else {}
        if node.op_type == "Gemm":
            if _attr(node, "alpha", 1.0) != 1.0 or _attr(node, "beta", 1.0) != 1.0:
                why[node.name] = "Gemm with alpha or beta != 1"
                continue
            trans_a = bool(_attr(node, "transA", 0))
            trans_b = bool(_attr(node, "transB", 0))
        else:
            trans_a = trans_b = False
        w = _trace_weight(ix, node.input[1])
        if w is None:
            if not ix.from_constants(node.input[1]):
                why[node.name] = "both operands are activations (as attention's Q·Kᵀ and P·V): left to TensorRT"
            else:
                why[node.name] = ("its weight is not a constant 2-D matrix reached directly or through "
                                  "Transpose/DequantizeLinear (e.g. behind a Cast, or 3-D)")
            continue
        wdims = _dims(ix.const(w["weight"]))
        transposed = trans_b != (w["transpose"] is not None)
        k, n = (wdims[1], wdims[0]) if transposed else (wdims[0], wdims[1])
        layout = "NK" if transposed else "KN"
        act = _trace_activation(ix, node.input[0])
        # MatMul(X, W[K, N]) keeps X's rank (a 1-D X gives a 1-D Y); Gemm's A and Y are 2-D
        rank = ix.rank(node.input[0], act["input"], node.output[0]) if node.op_type == "MatMul" else 2
        if rank is not None and rank < 2:
            why[node.name] = f"its activation has rank {rank} (the plugins take [..., K] of rank >= 2)"
            continue  # the plugins take X [..., K] of rank >= 2
        info = LinearInfo(
            name="", kind=node.op_type, node=node.name, input=act["input"], output=node.output[0],
            k=int(k), n=int(n), weight=w["weight"], weight_layout=layout, trans_a=trans_a,
        )
        owned = [node]
        if w["transpose"] is not None:
            info.weight_transpose = w["transpose"].name
            owned.append(w["transpose"])
        if w["dq"] is not None:
            dq = w["dq"]
            info.quantized = True
            info.weight_dq = dq.name
            info.weight_scale = dq.input[1]
            info.weight_zero_point = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
            info.weight_axis = int(_attr(dq, "axis", 1))
            owned.append(dq)
        if act["dq"] is not None:
            info.act_q, info.act_dq = act["q"].name, act["dq"].name
            info.act_scale = act["dq"].input[1]
            zp = act["dq"].input[2] if len(act["dq"].input) > 2 else ""
            info.act_zero_point = zp or None
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            c = node.input[2]
            cdq = ix.produced_by(c, "DequantizeLinear")
            if cdq is not None:
                info.bias_dq = cdq.name
                owned.append(cdq)
                c = cdq.input[0]
            if ix.const(c) is None or not _is_bias(_dims(ix.const(c)), n, 2):
                why[node.name] = "Gemm whose C is not a bias of shape [N] or [1, N]"
                continue  # C is an activation, a scalar, per-row [M, 1] or full [M, N]: not a plain linear
            info.bias = c
        elif node.op_type == "MatMul":
            b = _find_bias(ix, node.output[0], n, rank)
            if b is not None:
                add, bias, bdq = b
                info.bias, info.bias_node, info.output = bias, add.name, add.output[0]
                owned.append(add)
                if bdq is not None:
                    info.bias_dq = bdq.name
                    owned.append(bdq)
        info.nodes = [x.name for x in sorted(owned, key=lambda x: order.get(x.name, 0))]
        info.name = _layer_name(node, w["weight"], info.bias)
        found.append(info)
    _dedupe_names(found)
    return found


def _dedupe_names(infos: list[LinearInfo]) -> None:
    seen: dict[str, int] = {}
    for i in infos:
        if i.name in seen:
            seen[i.name] += 1
            i.name = f"{i.name}_{seen[i.name]}"
        else:
            seen[i.name] = 0


def weight_kn(model: onnx.ModelProto, info: LinearInfo, ix: GraphIndex | None = None) -> np.ndarray:
    """W of a layer as float32 ``[K, N]`` (dequantized when the layer is Q/DQ)."""
    ix = ix or GraphIndex(model)
    w = ix.array(info.weight)
    if info.quantized:
        scale = ix.array(info.weight_scale).astype(np.float64)
        zp = ix.array(info.weight_zero_point).astype(np.float64) if info.weight_zero_point else 0.0
        axis = info.weight_axis if info.weight_axis is not None else 1
        if np.ndim(scale) == 1:
            shape = [1, 1]
            shape[axis] = -1
            scale = scale.reshape(shape)
            if np.ndim(zp) == 1:
                zp = zp.reshape(shape)
        w = (w.astype(np.float64) - zp) * scale
    w = w.astype(np.float32)
    return w.T.copy() if info.weight_layout == "NK" else w


def bias_values(model: onnx.ModelProto, info: LinearInfo, ix: GraphIndex | None = None) -> np.ndarray | None:
    """b of a layer as float32 ``[N]``, or None."""
    if info.bias is None:
        return None
    ix = ix or GraphIndex(model)
    b = ix.array(info.bias).reshape(-1)
    if info.bias_dq is not None:
        dq = ix.nodes[info.bias_dq]
        scale = ix.array(dq.input[1]).astype(np.float64).reshape(-1)
        zp = ix.array(dq.input[2]).astype(np.float64).reshape(-1) if len(dq.input) > 2 and dq.input[2] else 0.0
        b = (b.astype(np.float64) - zp) * scale
    return b.astype(np.float32)


def quant_state(model: onnx.ModelProto) -> str:
    """``"qoperator"`` (ORT's QLinear*/Integer ops), ``"qdq"`` (Q/DQ nodes) or ``"float"``."""
    ops = {n.op_type for n in model.graph.node}
    if ops & QOPERATOR_OPS:
        return "qoperator"
    if "DequantizeLinear" in ops:
        return "qdq"
    return "float"
