"""Graph rewrite: prune the linears, choose a kernel per layer, pack it, insert plugin nodes.

:func:`rewrite_model` is the build pipeline's pass after quantization. For every linear that
:func:`edgesdk.inspect.find_linears` finds (float or Q/DQ MatMul(+Add), Gemm with transA/transB,
transposed weights, any activation rank ≥ 2):

1. Layers are selected like quantization selects them (``--exclude`` regexes, LM head only with
   ``include_lm_head``); the others keep their nodes and get a ``reason``.
2. Selected layers are pruned (:mod:`edgesdk.sparsify`: ``magnitude`` or ``wanda`` with activation
   norms from the calibration feeds), per row; int8 weights are pruned in the int8 domain.
3. :func:`edgesdk.rewrite.choose.choose` picks ``bitmap``, ``vitbit`` or ``none``.
4. The layer's nodes (weight DQ/Transpose, MatMul/Gemm, bias Add) are replaced by one node in
   domain ``edgesdk`` with the format's attributes plus ``plugin_version="1"`` and
   ``plugin_namespace="edgesdk"``; the packed tensors become initializers named
   ``<layer>.<tensor>``.

   * ``EdgeBitmapLinear`` reads the float activation the MatMul read (the DQ output when the
     activation is fake-quantized, so the numerics of the Q/DQ model are kept); int8 weights are
     stored as int8 values with their per-channel scales, float weights as fp16 values.
   * ``EdgeVitBitGemm`` (``vitbit_input="int8"``, the default) reads the int8 output of the layer's
     activation QuantizeLinear, which stays in the graph (TensorRT cannot fuse a Q into a plugin, but
     can fuse it into the layer that produces X), with ``y_dtype`` = the activation's float dtype;
     the DequantizeLinear is folded away. With ``vitbit_input="float"`` it reads the float
     activation *before* the QuantizeLinear and quantizes on chip with the calibrated scale
     (attribute ``x_scale``; both Q and DQ folded away). An exact (erf) GELU that only this layer's
     output feeds is fused too (attribute ``gelu=1``, :func:`find_gelu`): the fc1 + GELU of every
     ViT MLP becomes one node.

   Layers left as they are but pruned get their pruned weights written back densely.
5. Dead nodes (Q/DQ pairs no longer used) and initializers are removed, ``value_info`` is given
   for every plugin output (dtype and shape), the model is written with IR version 10 and
   checked with ``onnx.checker``; graph input and output names are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgesdk.errors import EdgeSDKError, FormatError
from edgesdk.formats import bitmap_linear as bitmap_fmt
from edgesdk.formats import vitbit_gemm as vitbit_fmt
from edgesdk.inspect import GraphIndex, LinearInfo, _attr, bias_values, find_linears, subgraph_inputs, weight_kn
from edgesdk.onnx_io import check_model, infer_shapes, shape_ranges
from edgesdk.rewrite.choose import KERNELS, MEASURE, LayerFacts, choose, decide_measured, measure_plan
from edgesdk.sparsify import activation_norms, prune

PLUGIN_DOMAIN = "edgesdk"
PLUGIN_ATTRS = {"plugin_version": "1", "plugin_namespace": "edgesdk"}
IR_VERSION = 10
_FLOATS = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16"}
#: What an ``EdgeVitBitGemm`` node reads: the int8 QuantizeLinear output, or the float activation.
VITBIT_INPUTS = ("int8", "float")


# ----------------------------------------------------------------------------------------- facts
def _types(model: onnx.ModelProto) -> dict[str, tuple[int, list]]:
    """Tensor name → (elem_type, dims with None for unknown/symbolic), via ONNX shape inference."""
    try:
        inferred = infer_shapes(model, strict_mode=False)
    except Exception:  # shape inference is an aid here, never a requirement
        inferred = model
    g = inferred.graph
    out: dict[str, tuple[int, list]] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if t.elem_type:
            dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if t.HasField("shape") else None
            out[vi.name] = (t.elem_type, dims)
    for init in g.initializer:
        out[init.name] = (init.data_type, list(init.dims))
    return out


def _int8_weights(ix: GraphIndex, info: LinearInfo) -> tuple[np.ndarray | None, np.ndarray | None, str | None]:
    """(q [N, K] int8, scale [N] float32, problem) of a Q/DQ weight; problem explains a refusal."""
    if not info.quantized:
        return None, None, None
    q = ix.array(info.weight)
    dq = ix.nodes[info.weight_dq]
    if q.dtype != np.int8:
        return None, None, f"weights are {q.dtype}, not int8"
    if _attr(dq, "block_size", 0):
        return None, None, "block-wise weight quantization is not supported by the plugins"
    if info.weight_zero_point and np.any(ix.array(info.weight_zero_point) != 0):
        return None, None, "weights are quantized asymmetrically (zero point != 0)"
    scale = ix.array(info.weight_scale).astype(np.float32)
    if info.weight_layout == "KN":
        q = q.T
    n_axis = 1 if info.weight_layout == "KN" else 0
    if scale.size == 1:
        scale = np.full(info.n, scale.reshape(()), np.float32)
    elif scale.ndim == 1 and (info.weight_axis % 2) == n_axis and scale.size == info.n:
        scale = scale.reshape(-1)
    else:
        return None, None, "weight scales are not per output channel"
    if not np.all(np.isfinite(scale) & (scale > 0)):
        return None, None, "weight scales are not finite and positive"
    return np.ascontiguousarray(q), scale, None


def _act_scale(ix: GraphIndex, info: LinearInfo) -> float | None:
    """The symmetric int8 per-tensor activation scale of the Q/DQ pair in front of the layer, or None."""
    if info.act_dq is None or info.act_q is None:
        return None
    q, dq = ix.nodes[info.act_q], ix.nodes[info.act_dq]
    for node in (q, dq):
        if len(node.input) < 3 or not node.input[2] or ix.const(node.input[2]) is None:
            return None  # no zero point → uint8
        zp = ix.array(node.input[2])
        if zp.dtype != np.int8 or zp.size != 1 or int(zp.reshape(())) != 0:
            return None
        if ix.const(node.input[1]) is None or ix.array(node.input[1]).size != 1:
            return None
    s_q, s_dq = ix.array(q.input[1]).reshape(()), ix.array(dq.input[1]).reshape(())
    if np.float32(s_q) != np.float32(s_dq) or not np.isfinite(s_q) or s_q <= 0:
        return None
    return float(np.float32(s_q))


def _scalar(ix: GraphIndex, name: str) -> float | None:
    c = ix.const(name)
    if c is None:
        return None
    a = ix.array(name)
    return float(a.reshape(())) if a.size == 1 else None


def find_gelu(ix: GraphIndex, y: str) -> tuple[list[onnx.NodeProto], str] | None:
    """The exact (erf) GELU applied to ``y`` and nothing else: ``(nodes, output)`` or None.

    Matches ``Gelu`` (approximate="none") and the decompositions exporters write,
    ``0.5 · y · (1 + erf(y / √2))`` with the division as ``Div(y, √2)`` or ``Mul(y, 1/√2)`` and the
    two products in any order (torch.onnx legacy: ``Mul(y, ·)`` then ``Mul(·, 0.5)``; dynamo:
    ``Mul(0.5, ·)`` then ``Mul(y, ·)``). The tanh approximation is not fused.
    """
    if y in ix.graph_outputs:
        return None
    users = ix.consumers.get(y, [])

    def other(node, t):
        return node.input[1] if node.input[0] == t else node.input[0]

    def near(v, want):
        return v is not None and abs(v - want) <= 1e-6 * abs(want)

    if len(users) == 1 and users[0].op_type == "Gelu" and _attr(users[0], "approximate", b"none") in (b"none", "none"):
        return [users[0]], users[0].output[0]
    for d in users:
        if len(d.input) != 2 or d.input[0] != y:
            continue
        c = _scalar(ix, d.input[1])
        if not ((d.op_type == "Div" and near(c, 2 ** 0.5)) or (d.op_type == "Mul" and near(c, 2 ** -0.5))):
            continue
        e = ix.sole_consumer(d.output[0])
        a = e and e.op_type == "Erf" and ix.sole_consumer(e.output[0])
        if not a or a.op_type != "Add" or _scalar(ix, other(a, e.output[0])) != 1.0:
            continue
        chain = [d, e, a]
        m1 = ix.sole_consumer(a.output[0])
        if m1 is None or m1.op_type != "Mul":
            continue
        o1 = other(m1, a.output[0])
        h = ix.produced_by(o1, "Mul")
        if h is not None and ix.sole_consumer(o1) is m1 and y in h.input and _scalar(ix, other(h, y)) == 0.5:
            chain += [h, m1]  # (0.5 · y) · (1 + erf)
            out = m1.output[0]
        else:
            m2 = ix.sole_consumer(m1.output[0])
            if m2 is None or m2.op_type != "Mul":
                continue
            o2 = other(m2, m1.output[0])
            if sorted([o1 == y, o2 == y]) != [False, True] or _scalar(ix, o2 if o1 == y else o1) != 0.5:
                continue
            chain += [m1, m2]
            out = m2.output[0]
        if {id(n) for n in users} <= {id(n) for n in chain}:
            return chain, out
    return None


def _rows(dims: list | None, trans_a: bool) -> int:
    if not dims:
        return 1
    lead = dims[1:] if trans_a else dims[:-1]
    return int(np.prod([d if d else 1 for d in lead], dtype=np.int64)) if lead else 1


def _unknown_rows(dims: list | None, trans_a: bool) -> bool:
    """Shape inference left a dim of the rows (all but the last of X, or the first of a transA X) unknown; an unknown
    leading dim is the batch, which the build takes as 1 unless --shape says otherwise."""
    if not dims:
        return True
    lead = dims[1:] if trans_a else dims[:-1]
    return any(not d for d in lead[1:])


def _probe_rows(model: onnx.ModelProto, tensors: Sequence[str],
                shape_hints: Mapping[str, list[int]] | None = None) -> dict[str, list[int]]:
    """Shapes of ``tensors`` when the model runs once at the build shape.

    Static shape inference loses dims behind Reshape/Shape arithmetic; one ONNX Runtime run on zeros gives the exact
    rows per call the ``auto`` rule reasons about. The zeros have the shape ``shape_hints`` (``--shape``) resolve to
    (:func:`edgesdk.onnx_io.shape_ranges`: the build's shape, not the calibration data's batches), or every dynamic
    dim set to 1 where they do not resolve it. Returns ``{}`` when the model cannot run that way (then shape
    inference is used).
    """
    from edgesdk.ort import make_session

    inits = {t.name for t in model.graph.initializer}
    dtypes = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.INT64: np.int64,
              TensorProto.INT32: np.int32, TensorProto.BOOL: np.bool_, TensorProto.DOUBLE: np.float64}
    try:
        opt = {k: v[1] for k, v in shape_ranges(model, dict(shape_hints or {})).items()}
    except EdgeSDKError:
        opt = {}
    feed = {}
    for i in model.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        if t.elem_type not in dtypes:
            return {}
        shape = opt.get(i.name) or [d.dim_value if d.dim_value > 0 else 1 for d in t.shape.dim]
        feed[i.name] = np.zeros(shape, dtypes[t.elem_type])
    wanted = [t for t in dict.fromkeys(tensors) if t not in feed]
    try:
        sess = make_session(model, quiet=True, outputs=wanted)
        outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
    except Exception:
        return {}
    outs.update(feed)
    return {t: list(outs[t].shape) for t in tensors if t in outs}


# ----------------------------------------------------------------------------------------- calibration
def _feeds(calibration) -> list[dict[str, np.ndarray]]:
    if calibration is None:
        return []
    if isinstance(calibration, Mapping):
        return [dict(calibration)]
    return [dict(c) for c in calibration]


def input_norms(model: onnx.ModelProto, tensors: Sequence[str], calibration,
                transposed: frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """``||X[:, k]||_2`` of each named tensor over all calibration feeds (ONNX Runtime, CPU).

    Args:
        model: The model the tensors belong to (standard ops only).
        tensors: Activation tensor names (a linear's input).
        calibration: One feed dict or a list of them (graph input name → array).
        transposed: Tensors a layer reads transposed (Gemm ``transA=1``: A is ``[K, M]``), whose norms are over
            their first axis; their results are keyed ``"<name>:T"``.

    Raises:
        EdgeSDKError: No calibration data, or ONNX Runtime cannot run the model on it.
    """
    from edgesdk.ort import make_session

    feeds = _feeds(calibration)
    if not feeds:
        raise EdgeSDKError("Wanda pruning needs calibration data, none was given",
                           "pass --calibration (inputs of the model) or use --prune magnitude")
    wanted = list(dict.fromkeys(tensors))
    sess = make_session(model, outputs=wanted)
    names = [o.name for o in sess.get_outputs()]
    sq: dict[str, np.ndarray] = {}
    for feed in feeds:
        try:
            outs = dict(zip(names, sess.run(None, feed)))
        except Exception as err:
            raise EdgeSDKError(f"ONNX Runtime could not run the model on the calibration data: {err}",
                               "pass calibration arrays with the model's input names, dtypes and shapes") from None
        for t in wanted:
            a = activation_norms(outs[t]) ** 2
            sq[t] = sq.get(t, 0) + a
            if t in transposed:
                sq[t + ":T"] = sq.get(t + ":T", 0) + activation_norms(np.asarray(outs[t]).T) ** 2
    return {t: np.sqrt(v) for t, v in sq.items()}


# ----------------------------------------------------------------------------------------- graph edits
def _unique(name: str, taken: set[str]) -> str:
    out, i = name, 1
    while out in taken:
        out, i = f"{name}_{i}", i + 1
    taken.add(out)
    return out


def _remove_dead(graph: onnx.GraphProto) -> None:
    """Drop nodes whose outputs nobody reads, then unused initializers and value_info."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output if o):
            keep.append(node)
            needed.update(i for i in node.input if i)
            needed |= subgraph_inputs(node)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    produced = {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    vis = [v for v in graph.value_info if v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(vis)


def plan_kernels(model: onnx.ModelProto, linears: Sequence[LinearInfo], selected: set[str], kernels: str,
                 sparsity: float, int8: bool, device=None, shape_hints: Mapping[str, list[int]] | None = None
                 ) -> dict[str, dict]:
    """Preview of the per-layer kernel choice a build would make, without quantizing or pruning.

    Uses the same facts as :func:`rewrite_model` (rows per call from one ONNX Runtime run at the shape
    ``shape_hints`` give, as ``--shape`` does for ``build``, else shape inference) and the same :func:`~edgesdk.rewrite.choose.choose`
    rule, assuming the build's INT8 Q/DQ (symmetric, per-channel weights) when ``int8`` is set and
    ``sparsity`` on every selected layer. The build's ``report.json`` stays authoritative: weights that
    the quantizer maps to -128, or per-layer sparsities of ``--sparsity-scope global``, can change it.

    Args:
        model: The model as given to ``build``.
        linears: ``find_linears(model)``.
        selected: Names of the layers ``build`` would process (the others get no entry).
        kernels: ``auto``, ``bitmap``, ``vitbit`` or ``none``.
        sparsity: Planned pruned fraction.
        int8: The build quantizes to INT8 (``--quantize int8``).
        device: ``DeviceProfile`` for the roofline of the ``auto`` rule, or None.
        shape_hints: ``--shape`` hints (input name → full shape) for inputs with dynamic dims.

    Returns:
        Layer name → ``{"rows_per_call": M, "kernel": kernel, "reason": why not, or None}``; with ``auto``, where
        neither the run nor shape inference tells M, ``rows_per_call`` and ``kernel`` are None and the reason says so.
    """
    if kernels not in KERNELS:
        raise EdgeSDKError(f"unknown --kernels {kernels!r}", f"use one of: {', '.join(KERNELS)}")
    ix = GraphIndex(model)
    types = _types(model)
    chosen = [li for li in linears if li.name in selected]
    probed = _probe_rows(model, [ix.nodes[li.node].input[0] for li in chosen], shape_hints) if kernels == "auto" else {}
    out: dict[str, dict] = {}
    for li in chosen:
        x_tensor = ix.nodes[li.node].input[0]
        x_type = types.get(x_tensor) or types.get(li.input)
        dims = probed.get(x_tensor) or (x_type[1] if x_type else None)
        if kernels == "auto" and x_tensor not in probed and _unknown_rows(dims, li.trans_a):
            out[li.name] = {"rows_per_call": None, "kernel": None,
                            "reason": "rows per call unknown: the model did not run at a known input shape "
                                      "(pass --shape as for build)"}
            continue
        if li.quantized:  # a Q/DQ layer is used as it is: its own weights and activation scale decide
            q, _, wproblem = _int8_weights(ix, li)
            facts = LayerFacts(li.name, li.k, li.n, _rows(dims, li.trans_a), q is not None,
                               _act_scale(ix, li) is not None, float(sparsity), wproblem)
        else:  # the build's INT8 Q/DQ (symmetric, per-channel weights) where it quantizes
            facts = LayerFacts(li.name, li.k, li.n, _rows(dims, li.trans_a), int8, int8, float(sparsity))
        kernel, reason = choose(facts, kernels, device)
        out[li.name] = {"rows_per_call": facts.m, "kernel": kernel, "reason": reason}
    return out


# ----------------------------------------------------------------------------------------- packing
def _bytes_dense(info: LinearInfo, int8: bool) -> int:
    """Dense weights as a dense kernel reads them: int8 + fp32 scales, or fp16."""
    return info.n * info.k + 4 * info.n if int8 else 2 * info.n * info.k


def _pack(kernel: str, w: np.ndarray, q: np.ndarray | None, scale: np.ndarray | None, bias, x_scale,
          gelu: bool = False, y_dtype: str = ""):
    """Packed weights of one layer (raises FormatError when the format refuses them); ``y_dtype``: set
    for a VitBit node that reads the int8 QuantizeLinear output."""
    if kernel == "vitbit":
        return vitbit_fmt.VitBitWeights.pack(q, scale, 8, bias=bias, x_scale=x_scale, gelu=gelu, y_dtype=y_dtype)
    if q is not None:
        if np.any(q == -128):
            raise FormatError("int8 weights use -128, outside the bitmap format's symmetric range [-127, 127]",
                              "quantize weights symmetrically to [-127, 127]")
        return bitmap_fmt.BitmapLinearWeights.pack(q.astype(np.float64) * scale.astype(np.float64)[:, None],
                                                   "int8", scales=scale, bias=bias)
    return bitmap_fmt.BitmapLinearWeights.pack(w, "float16", bias=bias)


# ----------------------------------------------------------------------------------------- the pass
def rewrite_model(model: onnx.ModelProto, config, calibration=None, device=None, measurer=None
                  ) -> tuple[onnx.ModelProto, list[dict]]:
    """Prune, choose kernels, pack and insert plugin nodes (see the module docstring).

    Args:
        model: Float or Q/DQ model (not modified).
        config: A ``BuildConfig`` (reads ``sparsity``, ``prune``, ``kernels``, ``exclude``,
            ``include_lm_head``, and ``sparsity_scope``, ``measure``, ``vitbit_input`` when present).
        calibration: Feeds for Wanda: one dict (input name → array) or a list of them.
        device: ``DeviceProfile`` for the ``auto`` rule (roofline figures), or None.
        measurer: ``f(packed, m, int8) -> dict`` timing a plugin candidate against dense (the
            ``edgesdk.kernels.<op>.measure_vs_dense`` contract); None: those functions when
            ``config.measure`` and this machine's GPU allow it (:func:`choose.measure_plan`).

    Returns:
        The rewritten model and one dict per linear with ``name, kind, shape [K, N], quantized,
        sparsity, kernel, bytes_dense, bytes_packed, reason`` (reason None when rewritten); plugin
        candidates of ``auto`` also get ``measured`` (the times, or None) and ``choice`` (how it was decided).

    Raises:
        EdgeSDKError: Bad options, Wanda without calibration, or a result that fails the checker.
    """
    from edgesdk.quantize import select_layers

    kernels = str(getattr(config, "kernels", "auto") or "auto")
    if kernels not in KERNELS:
        raise EdgeSDKError(f"unknown --kernels {kernels!r}", f"use one of {', '.join(KERNELS)}")
    sparsity = float(getattr(config, "sparsity", 0.0) or 0.0)
    method = str(getattr(config, "prune", "magnitude") or "magnitude")
    scope = str(getattr(config, "sparsity_scope", "layer") or "layer")
    vitbit_input = str(getattr(config, "vitbit_input", "int8") or "int8")
    if vitbit_input not in VITBIT_INPUTS:
        raise EdgeSDKError(f"unknown --vitbit-input {vitbit_input!r}", f"use one of {', '.join(VITBIT_INPUTS)}")

    model = _copy(model)
    ix = GraphIndex(model)
    types = _types(model)
    linears = find_linears(model)
    chosen, skipped = select_layers(model, linears, list(getattr(config, "exclude", None) or []),
                                    bool(getattr(config, "include_lm_head", False)))
    chosen_names = {li.name for li in chosen}

    # 1. weights [N, K] (float32, dequantized) and int8 views
    dense = {li.name: weight_kn(model, li, ix).T for li in chosen}
    qw = {li.name: _int8_weights(ix, li) for li in chosen}

    # 2. pruning
    stats = {}
    if sparsity > 0 and chosen:
        norms = None
        if method == "wanda":
            x_of = {li.name: ix.nodes[li.node].input[0] for li in chosen}
            trans = frozenset(x_of[li.name] for li in chosen if li.trans_a)  # Gemm transA: X is A^T
            by_tensor = input_norms(model, list(x_of.values()), calibration, trans)
            norms = {li.name: by_tensor[x_of[li.name] + (":T" if li.trans_a else "")] for li in chosen}
        pruned, st = prune(dense, sparsity, method, norms, scope=scope)
        stats = {s.name: s for s in st}
        for name, w in pruned.items():
            keep = w != 0
            dense[name] = np.where(keep, dense[name], 0.0)
            q, s, p = qw[name]
            if q is not None:
                qw[name] = (np.where(keep, q, 0).astype(np.int8), s, p)

    # 3. choose, pack, replace
    probed = _probe_rows(model, [ix.nodes[li.node].input[0] for li in chosen],
                         getattr(config, "shape_hints", None)) if kernels == "auto" else {}
    timer = _Timer(str(getattr(config, "measure", "auto") or "auto"), device, measurer) if kernels == "auto" else None
    report: list[dict] = []
    taken = {t.name for t in model.graph.initializer} | {o for n in model.graph.node for o in n.output} \
        | {i.name for i in model.graph.input}
    node_pos = {n.name: i for i, n in enumerate(model.graph.node)}
    new_nodes: dict[int, list[onnx.NodeProto]] = {}
    drop: set[int] = set()  # id() of replaced nodes
    new_inits: list[onnx.TensorProto] = []
    new_vi: list[onnx.ValueInfoProto] = []
    graph_inputs = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    for li in linears:
        q, scale, wproblem = qw.get(li.name, (None, None, None))
        x_scale = _act_scale(ix, li)
        row = {"name": li.name, "kind": li.kind, "shape": [li.k, li.n], "quantized": li.quantized,
               "sparsity": 0.0, "kernel": "none", "bytes_dense": _bytes_dense(li, q is not None),
               "bytes_packed": None, "reason": None, "measured": None, "choice": None}  # one key set for every row
        report.append(row)
        if li.name not in chosen_names:
            row["reason"] = skipped.get(li.name, "not selected")
            continue
        w = dense[li.name]
        row["sparsity"] = float(np.mean(w == 0)) if w.size else 0.0
        mm = ix.nodes[li.node]
        x_tensor = mm.input[0]
        x_type = types.get(x_tensor) or types.get(li.input)
        dims = probed.get(x_tensor) or (x_type[1] if x_type else None)
        facts = LayerFacts(li.name, li.k, li.n, _rows(dims, li.trans_a),
                           q is not None, x_scale is not None, row["sparsity"], wproblem)
        kernel, reason = choose(facts, kernels, device)
        if kernel != "none" and (x_type is None or x_type[0] not in _FLOATS):
            kernel, reason = "none", "activation dtype unknown or not fp16/fp32 (plugins take fp16/fp32)"
        if kernel == "bitmap" and li.quantized and q is None:
            kernel, reason = "none", f"bitmap: {wproblem}"
        bias = bias_values(model, li, ix)
        packed = None
        gelu = find_gelu(ix, li.output) if kernel == "vitbit" else None
        x_q = kernel == "vitbit" and vitbit_input == "int8"  # the plugin reads the Q output
        if kernel != "none":
            try:
                packed = _pack(kernel, w, q, scale, bias, x_scale, gelu is not None,
                               _FLOATS[x_type[0]] if x_q else "")
            except FormatError as err:
                kernel, reason = "none", f"{kernel}: {err.problem}"
        if kernel in ("bitmap", "vitbit") and packed is not None and timer is not None:
            row["measured"] = meas = timer(packed, facts.m, q is not None)
            row["choice"] = timer.note
            if meas is not None:
                kernel, reason = decide_measured(meas)
                if kernel == "none":
                    packed = None
        row["kernel"], row["reason"] = kernel, reason
        if packed is None:
            if li.name in stats and row["sparsity"] > 0:
                _write_back(model, ix, li, w, qw[li.name][0], taken, new_inits,
                            lambda nodes, at=node_pos[li.node]: new_nodes.setdefault(at, []).extend(nodes))
            continue
        row["bytes_packed"] = int(packed.nbytes)
        x_in = (ix.nodes[li.act_q].output[0] if x_q else li.input) if kernel == "vitbit" else x_tensor
        nodes = []
        x_known = types.get(x_in)  # (elem type, dims) of what the plugin reads, recorded below
        if li.trans_a:
            if x_known and x_known[1] is not None:
                x_known = (x_known[0], x_known[1][::-1])
            xt = _unique(f"{li.name}.x_t", taken)
            nodes.append(helper.make_node("Transpose", [x_in], [xt], name=_unique(f"{li.name}/Transpose", taken),
                                          perm=[1, 0]))
            x_in = xt
        fmt = vitbit_fmt if kernel == "vitbit" else bitmap_fmt
        tensors = packed.to_tensors()
        inputs = [x_in]
        for tname in fmt.TENSOR_NAMES:
            if tname in tensors:
                init = numpy_helper.from_array(np.ascontiguousarray(tensors[tname]), _unique(f"{li.name}.{tname}", taken))
                new_inits.append(init)
                inputs.append(init.name)
        attrs = {**packed.node_attributes(), **PLUGIN_ATTRS}
        y_out = gelu[1] if gelu else li.output
        nodes.append(helper.make_node(fmt.OP_TYPE, inputs, [y_out], name=_unique(f"{li.name}/{fmt.OP_TYPE}", taken),
                                      domain=PLUGIN_DOMAIN, **attrs))
        new_nodes[node_pos[li.node]] = nodes
        # weight DQ/Transpose and activation Q/DQ are removed once unused
        drop.update(id(ix.nodes[n]) for n in (li.node, li.bias_node) if n)
        drop.update(id(n) for n in (gelu[0] if gelu else []))
        dims = x_type[1]
        y_dims = (([dims[1]] if li.trans_a else list(dims[:-1])) + [li.n]) if dims else None
        new_vi.append(helper.make_tensor_value_info(
            y_out, x_type[0], None if y_dims is None else [d if d else None for d in y_dims]))
        if x_known and x_in not in graph_inputs:  # the plugin's X typed in the file: onnx 1.16's shape inference
            new_vi.append(helper.make_tensor_value_info(  # stops at the first plugin node
                x_in, x_known[0], None if x_known[1] is None else [d if d else None for d in x_known[1]]))
    return _finish(model, new_nodes, drop, new_inits, new_vi), report


class _Timer:
    """The measured choice of ``auto`` (see :mod:`edgesdk.rewrite.choose`): decides once, on the first
    plugin candidate, whether to time on this GPU; caches times per (operator, N, K, M, values, INT8, density)."""

    def __init__(self, mode: str, device, measurer=None):
        if mode not in MEASURE:
            raise EdgeSDKError(f"unknown --measure {mode!r}", f"use one of {', '.join(MEASURE)}")
        self.mode, self.device, self.fn = mode, device, measurer
        self.note = "measured by the caller's measurer" if measurer else None
        self.ready = measurer is not None or mode == "off"
        if mode == "off":
            self.note = "--measure off: static rule"
        self.cache: dict[tuple, dict] = {}

    def __call__(self, packed, m: int, int8: bool) -> dict | None:
        if not self.ready:
            self.ready = True
            measure, self.note = measure_plan(self.mode, self.device, _host_gpu())
            if measure:
                self.fn = _measure_on_gpu
        if self.fn is None:
            return None
        key = (type(packed).__name__, packed.n, packed.k, int(m), getattr(packed, "value_dtype", None),
               getattr(packed, "bits", None), getattr(packed, "y_dtype", None), bool(int8),
               round(float(getattr(packed, "density", 1.0)), 2))
        if key not in self.cache:
            try:
                self.cache[key] = self.fn(packed, int(m), bool(int8))
            except Exception as err:  # noqa: BLE001 - a GPU that cannot time must not sink an `auto` build
                if self.fn is not _measure_on_gpu or self.mode == "on":
                    raise
                self.fn = None
                self.note = (f"not measured: timing on this GPU failed ({type(err).__name__}: {err}), so the static "
                             "rule decides; --measure on makes this an error")
                return None
        return dict(self.cache[key])


def _measure_on_gpu(packed, m: int, int8: bool) -> dict:
    """``measure_vs_dense`` of the packed layer's operator on this GPU."""
    if isinstance(packed, vitbit_fmt.VitBitWeights):
        from edgesdk.kernels.vitbit_gemm import measure_vs_dense as vitbit_measure

        return vitbit_measure(packed, m)
    from edgesdk.kernels.bitmap_linear import measure_vs_dense as bitmap_measure

    return bitmap_measure(packed, m, int8)


def _host_gpu():
    """This machine's GPU profile, or None (no GPU / driver / cuda-python)."""
    from edgesdk.devices import host_profile

    try:
        return host_profile()
    except EdgeSDKError:
        return None


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _write_back(model, ix: GraphIndex, li: LinearInfo, w: np.ndarray, q, taken: set[str], new_inits: list,
                insert) -> None:
    """Give a layer that keeps its nodes its pruned weights: a new initializer (W may be shared), in which a pruned
    weight is stored as the weight's zero point (0 after dequantization, whatever the zero point), read through a
    private copy of the DequantizeLinear/Transpose chain where that chain also feeds other nodes (another layer,
    with its own mask, or a non-linear op, which must keep the unpruned weight). ``insert(nodes)`` places new nodes
    before the layer's node."""
    stored = ix.array(li.weight)
    if q is not None:
        vals = q.T if li.weight_layout == "KN" else q
    else:
        vals = w.T if li.weight_layout == "KN" else w
    vals = np.where(vals == 0, _stored_zero(ix, li, stored), stored).astype(stored.dtype)
    init = numpy_helper.from_array(np.ascontiguousarray(vals), _unique(f"{li.weight}.pruned", taken))
    new_inits.append(init)
    chain = [ix.nodes[n] for n in (li.weight_dq, li.weight_transpose) if n]  # W -> DQ -> Transpose -> the layer
    layer = ix.nodes[li.node]
    nxt = chain[1:] + [layer]
    shared = any(o in ix.graph_outputs or any(c.name != after.name for c in ix.consumers.get(o, []))
                 for node, after in zip(chain, nxt) for o in node.output)
    if not chain or not shared:
        reader = chain[0] if chain else layer
        for i, name in enumerate(reader.input):
            if name == li.weight:
                reader.input[i] = init.name
        return
    copies, prev_in, prev_out = [], li.weight, init.name
    for node in chain:
        c = onnx.NodeProto()
        c.CopyFrom(node)
        c.name = _unique(f"{node.name}.{li.name}", taken)
        for i, name in enumerate(c.input):
            if name == prev_in:
                c.input[i] = prev_out
        prev_in, prev_out = node.output[0], _unique(f"{node.output[0]}.{li.name}", taken)
        c.output[0] = prev_out
        copies.append(c)
    for i, name in enumerate(layer.input):
        if name == prev_in:
            layer.input[i] = prev_out
    insert(copies)


def _stored_zero(ix: GraphIndex, li: LinearInfo, stored: np.ndarray):
    """The stored value that dequantizes to 0: the weight's zero point (per tensor or along its axis), else 0."""
    if not li.weight_zero_point:
        return 0
    zp = ix.array(li.weight_zero_point)
    if zp.size == 1:
        return zp.reshape(())
    axis = li.weight_axis % stored.ndim
    shape = [1] * stored.ndim
    shape[axis] = zp.size
    return zp.reshape(shape)


def _finish(model: onnx.ModelProto, new_nodes: dict, drop: set[int], new_inits: list, new_vi: list) -> onnx.ModelProto:
    g = model.graph
    nodes = []
    for i, n in enumerate(g.node):
        nodes.extend(new_nodes.get(i, []))
        if id(n) not in drop:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(new_inits)
    outputs = {o.name for o in g.output}
    fresh: dict[str, onnx.ValueInfoProto] = {}
    for v in new_vi:  # one per name (an X shared by several plugin nodes comes once)
        if v.name not in outputs:
            fresh.setdefault(v.name, v)
    keep_vi = [v for v in g.value_info if v.name not in fresh]
    del g.value_info[:]
    g.value_info.extend(keep_vi + list(fresh.values()))
    _remove_dead(g)
    if new_nodes and not any(o.domain == PLUGIN_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(PLUGIN_DOMAIN, 1))
    model.ir_version = IR_VERSION
    try:
        check_model(model)
    except onnx.checker.ValidationError as err:
        raise EdgeSDKError(f"the rewritten model fails onnx.checker: {err}",
                           "report this with the input model; run with --kernels none to skip the rewrite") from None
    return model
