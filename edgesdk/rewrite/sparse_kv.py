"""Graph rewrite: a decoder's attention over its KV cache becomes ``EdgeSparseKVAttention`` nodes (MUSTAFAR).

:func:`sparsify_kv` takes a decoder exported with its cache (optimum's ``text-generation-with-past``: per layer
``past_key_values.N.key/value`` in, ``present.N.key/value`` out), float or a Q/DQ build, and for every layer
replaces the attention core with one node in domain ``edgesdk`` (:mod:`edgesdk.formats.sparse_kv`, "The graph
node"). What it finds per layer, from the cache outward (the names of the exporter's nodes are never relied on):

* ``present.N.key = Concat(past_key_values.N.key, k)`` and the same for V: ``k`` (after RoPE) and ``v`` are the
  layer's new K and V rows ``[B, Hkv, S, d]``;
* the ``MatMul`` reached from ``present.N.key`` through data-movement ops only (``Unsqueeze``/``Expand``/``Reshape``
  of GQA's repeat, ``Transpose``) and scalar ``Mul``/``Div``: the scores; its other input, back through scalar
  ``Mul``/``Div``, is ``q`` (after RoPE);
* after the scores: scalar ``Mul``/``Div``, one ``Add`` (the mask), ``Softmax`` over the last axis, optionally the
  ``Where(IsNaN(p), 0, p)`` guard, and the ``MatMul`` with V reached from ``present.N.value``: the attention output
  ``[B, Hq, S, d]``, whose consumers now read the node's output.

The score scale is the product of the scalar factors found (1/sqrt(d) split over q and K in optimum's export).
Anything else between those points (a soft-cap, a second additive term) is refused with the op that stopped the
match, and so is an added term built from float constants of more than one value (ALiBi's slopes): the node computes
plain causal softmax attention. A mask that depends on the inputs in another way (a sliding window) is not told
apart from the causal one. The query head count
comes from one ONNX Runtime run of the model (one token, empty cache).

The node reads q, k, v and writes its output in fp16 (the kernels' dtype); a float32 model gets Casts around it.
The graph then takes, instead of ``past_key_values.*``, each layer's cache state ``past_sparse_kv.N.k_records``,
``.v_records`` (int8), ``.k_window``, ``.v_window`` (fp16) and one ``kv_lengths`` (int32 ``[batch]``, tokens cached
after the call), and gives ``present_sparse_kv.N.*`` instead of ``present.*``. The ``attention_mask`` input goes
(the node masks by ``kv_lengths``: no left padding); ``position_ids`` stays. An empty cache is all zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from edgesdk.errors import EdgeSDKError
from edgesdk.formats import sparse_kv as fmt

_MOVES = {"Unsqueeze", "Expand", "Reshape", "Transpose", "Identity", "Squeeze"}
_FIX = ("export the decoder with optimum (text-generation-with-past) from a Llama-style model (causal softmax "
        "attention); other attention forms are not supported by EdgeSparseKVAttention")


@dataclass(frozen=True)
class KVLayer:
    """One rewritten layer: its index, the node's inputs (q, k, v), the attention output it replaced, the scale."""

    layer: int
    q: str
    k: str
    v: str
    output: str
    scale: float


def _scalar(t) -> float | None:
    import onnx_graphsurgeon as gs

    if isinstance(t, gs.Constant):
        a = np.asarray(t.values)
    elif len(t.inputs) == 1 and t.inputs[0].op == "Constant":
        a = np.asarray(t.inputs[0].attrs["value"].values)
    else:
        return None
    return float(a.reshape(-1)[0]) if a.size == 1 else None


def _scalar_step(node, x) -> float | None:
    """The factor ``node`` applies to ``x`` if it is ``x * c`` / ``c * x`` / ``x / c`` with a scalar constant c."""
    if node.op not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    other = node.inputs[1] if node.inputs[0] is x else node.inputs[0]
    c = _scalar(other)
    if c is None or (node.op == "Div" and node.inputs[0] is not x):
        return None
    return c if node.op == "Mul" else 1.0 / c


def _data_consumers(t) -> list:
    return [n for n in t.outputs if n.op != "Shape"]


def _follow(start, layer: int, what: str):
    """From ``start`` through data movement and scalar factors to the one MatMul it feeds: ``(matmul, factor)``."""
    t, factor, seen = start, 1.0, 0
    while True:
        users = _data_consumers(t)
        if len(users) != 1:
            ops = sorted(n.op for n in users) or ["nothing"]
            raise EdgeSDKError(f"layer {layer}: {what} feeds {', '.join(ops)} (expected one path to the attention "
                               "MatMul)", _FIX)
        n = users[0]
        if n.op == "MatMul":
            return n, factor
        f = _scalar_step(n, t)
        if f is not None:
            factor *= f
        elif n.op not in _MOVES or n.inputs[0] is not t:
            raise EdgeSDKError(f"layer {layer}: {what} reaches {n.op} ({n.name}) before the attention MatMul", _FIX)
        t = n.outputs[0]
        seen += 1
        if seen > 32:
            raise EdgeSDKError(f"layer {layer}: no attention MatMul after {what}", _FIX)


def _back_scalars(t):
    """Walk back from ``t`` through scalar Mul/Div: ``(source tensor, factor)``."""
    factor = 1.0
    while len(t.inputs) == 1:
        n = t.inputs[0]
        src = next((x for x in n.inputs if _scalar(x) is None), None)
        f = _scalar_step(n, src) if src is not None else None
        if f is None:
            break
        factor *= f
        t = src
    return t, factor


def _find_layer(graph, layer: int, present_k, present_v, past_k, past_v) -> tuple[KVLayer, list]:
    ck, cv = present_k.inputs[0] if present_k.inputs else None, present_v.inputs[0] if present_v.inputs else None
    for c, past, name in ((ck, past_k, present_k.name), (cv, past_v, present_v.name)):
        if c is None or c.op != "Concat" or len(c.inputs) != 2 or c.inputs[0] is not past:
            raise EdgeSDKError(f"layer {layer}: {name} is not Concat({past.name}, new tokens)", _FIX)
    k_new, v_new = ck.inputs[1], cv.inputs[1]
    qk, fk = _follow(present_k, layer, present_k.name)
    pv, fv = _follow(present_v, layer, present_v.name)
    if fv != 1.0:
        raise EdgeSDKError(f"layer {layer}: V is scaled by {fv} before its MatMul", _FIX)
    scores_in = qk.inputs[0]
    q, fq = _back_scalars(scores_in)
    # scores -> [scalar]* -> Add(mask) -> [scalar]* -> Softmax(-1) -> [Where(IsNaN)] -> MatMul with V
    t, fs, added = qk.outputs[0], 1.0, False
    while True:
        users = _data_consumers(t)
        if len(users) == 2 and {u.op for u in users} == {"IsNaN", "Where"}:
            pass
        elif len(users) != 1:
            raise EdgeSDKError(f"layer {layer}: the attention scores feed {sorted(u.op for u in users)}", _FIX)
        n = next(u for u in users if u.op != "IsNaN")
        f = _scalar_step(n, t)
        if f is not None:
            fs *= f
        elif n.op == "Add" and not added:
            _check_mask(layer, n.inputs[1] if n.inputs[0] is t else n.inputs[0])
            added = True
        elif n.op == "Softmax":
            axis = n.attrs.get("axis", -1)
            if axis not in (-1, 3):
                raise EdgeSDKError(f"layer {layer}: Softmax over axis {axis}", _FIX)
        elif n.op == "Where" and n.inputs[2] is t and n.inputs[0].inputs and n.inputs[0].inputs[0].op == "IsNaN":
            pass
        elif n is pv and n.inputs[0] is t:
            break
        else:
            raise EdgeSDKError(f"layer {layer}: {n.op} ({n.name}) between the attention scores and the MatMul with V",
                               _FIX)
        t = n.outputs[0]
    if not any(n.op == "Softmax" for n in _path_ops(qk, pv)):
        raise EdgeSDKError(f"layer {layer}: no Softmax between the scores and the MatMul with V", _FIX)
    return KVLayer(layer, q.name, k_new.name, v_new.name, pv.outputs[0].name, fq * fk * fs), [qk, pv]


def _check_mask(layer: int, mask) -> None:
    """The one ``Add`` on the scores must add the attention mask: built from the inputs and scalar constants only. A
    float constant with more than one value among its sources is a learned or positional bias (ALiBi's slopes), which
    the node does not compute: refused."""
    import onnx_graphsurgeon as gs

    seen, todo = set(), [mask]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        values = None
        if isinstance(t, gs.Constant):
            values = np.asarray(t.values)
        elif len(t.inputs) == 1 and t.inputs[0].op == "Constant":
            values = np.asarray(t.inputs[0].attrs["value"].values)
        if values is not None:
            if np.issubdtype(values.dtype, np.floating) and values.size > 1:
                raise EdgeSDKError(f"layer {layer}: the scores get an additive term built from a float constant of "
                                   f"{values.size} values ({t.name}), a position bias rather than the mask", _FIX)
            continue
        for n in t.inputs:
            if n.op not in ("Shape", "Size"):  # only the sizes of what feeds them
                todo.extend(n.inputs)


def _path_ops(start, end) -> list:
    out, n = [], start
    while n is not end:
        n = next(u for u in _data_consumers(n.outputs[0]) if u.op != "IsNaN")
        out.append(n)
    return out


def _probe_heads(model: onnx.ModelProto, tensors: list[str]) -> dict[str, tuple[int, ...]]:
    """Shapes of ``tensors`` from one ONNX Runtime run: batch 1, one token, an empty cache."""
    from edgesdk.ort import make_session

    sess = make_session(model, quiet=True, outputs=tensors)
    feeds = {}
    for i in sess.get_inputs():
        dims = []
        for j, d in enumerate(i.shape):
            if isinstance(d, int) and d >= 0:
                dims.append(d)
            else:
                dims.append(0 if str(d).startswith("past") and "+" not in str(d) else 1)
        dt = np.int64 if "int64" in i.type else np.int32 if "int32" in i.type else \
            np.float16 if "float16" in i.type else np.float32
        feeds[i.name] = (np.zeros if "position" in i.name or dt not in (np.int64, np.int32) else np.ones)(dims, dt)
    try:
        got = sess.run(tensors, feeds)
    except Exception as e:
        raise EdgeSDKError(f"one ONNX Runtime run of the decoder (one token, empty cache) failed: {e}",
                           "check that the model runs with an empty cache (past_sequence_length 0)") from None
    return {n: tuple(a.shape) for n, a in zip(tensors, got)}


def sparsify_kv(model: onnx.ModelProto, k_sparsity: float, v_sparsity: float | None = None, *, capacity: int,
                window: int = 32, group: int = 32) -> tuple[onnx.ModelProto, list[KVLayer], fmt.SparseKVConfig]:
    """The decoder with every layer's attention on a sparse KV cache (module doc).

    Args:
        model: A decoder with its KV cache (float or Q/DQ); not changed.
        k_sparsity, v_sparsity (float): Fraction of each K / V row pruned once a token leaves the window
            (``v_sparsity`` default: ``k_sparsity``); 0 keeps the cache dense, in fp16.
        capacity (int): Most tokens one sequence caches (the state's size is fixed by it).
        window, group (int): Dense window and compression group (MUSTAFAR: 32, 32).

    Returns:
        ``(model, layers, config)``: the rewritten model, one :class:`KVLayer` per layer, the cache geometry.

    Raises:
        EdgeSDKError: not a decoder with a cache, an attention the node cannot compute, or a geometry the kernels
            do not take (head_dim not 64/128, GQA group > 8).
    """
    import onnx_graphsurgeon as gs

    from edgesdk.calibration import past_inputs

    v_sparsity = k_sparsity if v_sparsity is None else v_sparsity
    for s in (k_sparsity, v_sparsity):
        fmt.keep_count(64, s)  # the range check, with its message
    if capacity < 1:
        raise EdgeSDKError(f"capacity {capacity}", "pass the most tokens a sequence caches (e.g. 2048)")
    specs = {}
    for i in model.graph.input:
        tt = i.type.tensor_type
        specs[i.name] = ([d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim],
                         onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
    past = past_inputs(model, specs)
    pairs = {}
    for name, (present, axis) in past.items():
        parts = name.split(".")
        if len(parts) != 3 or parts[0] != "past_key_values" or parts[2] not in ("key", "value") or axis != 2:
            raise EdgeSDKError(f"cache input {name} (axis {axis}) is not past_key_values.N.key/value [B, H, T, d]",
                               "export the decoder with optimum (text-generation-with-past)")
        pairs.setdefault(int(parts[1]), {})[parts[2]] = (name, present)
    if not pairs:
        raise EdgeSDKError("the model has no past_key_values.* inputs with matching present.* outputs",
                           "export the decoder with its KV cache (optimum-cli export onnx --task "
                           "text-generation-with-past)")
    graph = gs.import_onnx(model)
    tensors = graph.tensors()
    found: list[KVLayer] = []
    for layer in sorted(pairs):
        kv = pairs[layer]
        if set(kv) != {"key", "value"}:
            raise EdgeSDKError(f"layer {layer} caches only its {next(iter(kv))}", _FIX)
        lay, _ = _find_layer(graph, layer, tensors[kv["key"][1]], tensors[kv["value"][1]], tensors[kv["key"][0]],
                             tensors[kv["value"][0]])
        found.append(lay)
    shapes = _probe_heads(model, [t for lay in found for t in (lay.q, lay.k)])
    (_, hq, _, d), (_, hkv, _, _) = shapes[found[0].q], shapes[found[0].k]
    for lay in found[1:]:
        if (shapes[lay.q][1], shapes[lay.k][1], shapes[lay.q][3]) != (hq, hkv, d):
            raise EdgeSDKError(f"layer {lay.layer} has {shapes[lay.q][1]} query / {shapes[lay.k][1]} KV heads of "
                               f"{shapes[lay.q][3]}, layer {found[0].layer} {hq} / {hkv} of {d}",
                               "one cache geometry for all layers is what kv-sparsify writes; such a model is not "
                               "supported")
    cfg = fmt.SparseKVConfig(head_dim=d, num_q_heads=hq, num_kv_heads=hkv, k_sparsity=k_sparsity,
                             v_sparsity=v_sparsity, capacity=capacity, window=window, group=group)
    f_type = np.dtype(specs[pairs[found[0].layer]["key"][0]][1])
    lengths = gs.Variable(fmt.LENGTHS_INPUT, dtype=np.int32, shape=["batch_size"])
    old_in = {n for kv in pairs.values() for n, _ in kv.values()}
    old_out = {p for kv in pairs.values() for _, p in kv.values()}
    new_in, new_out = [lengths], []
    for lay in found:
        ins, outs = fmt.state_io_names(lay.layer)
        state_in, state_out = [], []
        for s, i_name, o_name in zip(fmt.STATE_NAMES, ins, outs):
            dt = np.int8 if fmt.STATE_DTYPES[s] == "int8" else np.float16
            shape = ["batch_size", *fmt.state_shapes(cfg, 1)[s][1:]]
            state_in.append(gs.Variable(i_name, dtype=dt, shape=shape))
            state_out.append(gs.Variable(o_name, dtype=dt, shape=shape))
        out = tensors[lay.output]
        att = gs.Variable(f"{lay.output}_sparse_kv", dtype=f_type, shape=out.shape)
        for user in list(out.outputs):
            for j, x in enumerate(user.inputs):
                if x is out:
                    user.inputs[j] = att
        attrs = fmt.node_attributes(cfg, lay.scale)
        attrs.update(plugin_version="1", plugin_namespace=fmt_namespace())
        name = f"/sparse_kv/layer{lay.layer}"
        qkv = [tensors[lay.q], tensors[lay.k], tensors[lay.v]]
        if f_type != np.float16:  # the node reads and writes fp16 (the kernels' dtype): Casts around it
            half = [gs.Variable(f"{t.name}_fp16", dtype=np.float16, shape=t.shape) for t in qkv]
            for t, h in zip(qkv, half):
                graph.nodes.append(gs.Node(op="Cast", name=f"{name}/Cast_{h.name}",
                                           attrs={"to": onnx.TensorProto.FLOAT16}, inputs=[t], outputs=[h]))
            qkv, att16 = half, gs.Variable(f"{att.name}_fp16", dtype=np.float16, shape=out.shape)
            graph.nodes.append(gs.Node(op="Cast", name=f"{name}/Cast_out",
                                       attrs={"to": onnx.helper.np_dtype_to_tensor_dtype(f_type)},
                                       inputs=[att16], outputs=[att]))
            att = att16
        graph.nodes.append(gs.Node(op=fmt.OP_TYPE, name=name, domain="edgesdk", attrs=attrs,
                                   inputs=[*qkv, *state_in, lengths], outputs=[att, *state_out]))
        new_in += state_in
        new_out += state_out
    graph.inputs = [t for t in graph.inputs if t.name not in old_in] + new_in
    graph.outputs = [t for t in graph.outputs if t.name not in old_out] + new_out
    graph.cleanup(remove_unused_graph_inputs=True).toposort()
    left = [n.name for n in graph.nodes for x in n.inputs if x.name in old_in]
    if left:
        raise EdgeSDKError(f"nodes besides attention read the cache inputs ({', '.join(left[:3])})", _FIX)
    out_model = gs.export_onnx(graph)
    out_model.ir_version = min(out_model.ir_version, 10)
    if not any(o.domain == "edgesdk" for o in out_model.opset_import):
        out_model.opset_import.append(onnx.helper.make_opsetid("edgesdk", 1))
    for p in model.metadata_props:
        out_model.metadata_props.add(key=p.key, value=p.value)
    return out_model, found, cfg


def fmt_namespace() -> str:
    from edgesdk.trt._logic import PLUGIN_NAMESPACE

    return PLUGIN_NAMESPACE


def default_scale_check(layers: list[KVLayer], head_dim: int) -> list[int]:
    """Layers whose scale differs from ``1/sqrt(head_dim)`` by more than float32 rounding (reported, not refused:
    some models scale differently on purpose)."""
    want = 1.0 / math.sqrt(head_dim)
    return [lay.layer for lay in layers if abs(lay.scale - want) > 1e-6 * want]
