"""ONNX Runtime op ``EdgeSparseKVAttention``: the node through :mod:`edgesdk.reference.sparse_kv`.

The node's cache state arrives as tensors (records int8, windows fp16 and ``lengths``, the cached tokens after the
call); the op rebuilds the :class:`~edgesdk.formats.sparse_kv.SparseKVCache` they hold (records validated), runs the
S decode steps of :func:`~edgesdk.reference.sparse_kv.attention_steps` in float64, rounds the output once to fp16 (the
kernel's output dtype) and returns it with the updated state. The node's q, k, v and output are fp16 (as for the
kernels); Python ops take no fp16 tensors, so :func:`adapt_node` wraps the node's fp16 inputs and outputs in exact
Casts (the model file is never changed).
"""

from __future__ import annotations

import sys

import numpy as np
from onnx import TensorProto, helper

from edgesdk.formats import sparse_kv as fmt
from edgesdk.ort import _pyop
from edgesdk.reference.sparse_kv import attention_steps


def forward(q, k, v, state: dict, lengths, attrs: dict):
    """``(out fp16 [B, Hq, S, d], new state dict)`` of one node call (module doc); raises EdgeSDKError on bad
    input."""
    from edgesdk.errors import EdgeSDKError

    cfg, scale = fmt.config_from_attributes(attrs)
    q, k, v = (np.asarray(t) for t in (q, k, v))
    B, S = q.shape[0], q.shape[2]
    want = {"q": (B, cfg.num_q_heads, S, cfg.head_dim), "k": (B, cfg.num_kv_heads, S, cfg.head_dim),
            "v": (B, cfg.num_kv_heads, S, cfg.head_dim)}
    want.update(fmt.state_shapes(cfg, B))
    got = {"q": q, "k": k, "v": v, **state}
    for name, shape in want.items():
        if tuple(got[name].shape) != shape:
            raise EdgeSDKError(f"{fmt.OP_TYPE} input {name} has shape {tuple(got[name].shape)}, expected {shape}",
                               "feed the cache state the previous call returned (zeros for an empty cache)")
    lengths = cfg.check_lengths(np.asarray(lengths).reshape(-1), "lengths")
    if lengths.shape[0] != B or (B and lengths.min() < S):
        raise EdgeSDKError(f"{fmt.OP_TYPE} lengths {lengths.tolist()} for batch {B} with {S} new tokens",
                           "pass one length per sequence: tokens cached after this call (each >= the new tokens)")
    cache = fmt.SparseKVCache(cfg, np.array(state["k_records"]).view(np.uint8),
                              np.array(state["v_records"]).view(np.uint8),
                              np.asarray(state["k_window"], np.float16).copy(),
                              np.asarray(state["v_window"], np.float16).copy(), (lengths - S).astype(np.int32))
    out = attention_steps(cache, q, k, v, scale).astype(np.float16)
    new = {"k_records": cache.k_rec.view(np.int8), "v_records": cache.v_rec.view(np.int8),
           "k_window": cache.k_ring, "v_window": cache.v_ring}
    return out, new


def _register() -> None:
    from edgesdk.ort import import_ortx

    ortx = import_ortx()
    D = ortx.PyCustomOpDef
    attrs = {k: (D.dt_int64 if t is int else D.dt_string) for k, t in fmt.ATTRIBUTES.items()}

    def compute(q, k, v, k_rec, v_rec, k_win, v_win, lengths, **kw):
        state = {"k_records": np.asarray(k_rec), "v_records": np.asarray(v_rec), "k_window": np.asarray(k_win),
                 "v_window": np.asarray(v_win)}
        try:
            out, new = forward(q, k, v, state, lengths, kw)
            return (out.astype(np.float32), new["k_records"], new["v_records"],
                    new["k_window"].astype(np.float32), new["v_window"].astype(np.float32))
        except Exception as err:  # raising here would abort the process (edgesdk.ort._pyop)
            print(f"edgesdk: {fmt.OP_TYPE} failed, returning NaN: {err}", file=sys.stderr, flush=True)
            return (np.full(np.shape(q), np.nan, np.float32), state["k_records"], state["v_records"],
                    state["k_window"].astype(np.float32), state["v_window"].astype(np.float32))

    ortx.onnx_op(op_type=fmt.OP_TYPE,
                 inputs=[D.dt_float, D.dt_float, D.dt_float, D.dt_int8, D.dt_int8, D.dt_float, D.dt_float, D.dt_int32],
                 outputs=[D.dt_float, D.dt_int8, D.dt_int8, D.dt_float, D.dt_float], attrs=attrs)(compute)


def adapt_node(n, types: dict, fresh) -> list:
    """The node (and Casts) the Python op accepts: float attributes as exact strings, the fp16 q/k/v/out and
    windows through float32 (exact both ways)."""
    from edgesdk.errors import EdgeSDKError

    f16 = TensorProto.FLOAT16
    q_type = types.get(n.input[0], 0)
    if q_type != f16:
        raise EdgeSDKError(f"input {n.input[0]!r} of {n.name!r} ({fmt.OP_TYPE}) is not float16 (or its dtype is "
                           "unknown): the node reads q, k, v in fp16, as its kernels do",
                           "rewrite the decoder with edgesdk kv-sparsify (it casts a float32 model's q, k, v)")
    floats = {k for k, t in fmt.ATTRIBUTES.items() if t is float}
    for i, a in enumerate(n.attribute):
        if a.name in floats and a.type == a.FLOAT:
            n.attribute[i].CopyFrom(helper.make_attribute(a.name, "%.9g" % np.float32(a.f)))
    before, after = [], []
    for i in [0, 1, 2, 5, 6]:
        x32 = fresh(f"{n.input[i]}_f32")
        before.append(helper.make_node("Cast", [n.input[i]], [x32], to=TensorProto.FLOAT))
        n.input[i] = x32
    for i in [0, 3, 4]:
        y32, y = fresh(f"{n.output[i]}_f32"), n.output[i]
        n.output[i] = y32
        after.append(helper.make_node("Cast", [y32], [y], to=f16))
    return before + [n] + after


_register()
_pyop.ADAPTERS[fmt.OP_TYPE] = adapt_node
