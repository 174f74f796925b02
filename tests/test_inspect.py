"""Linear discovery (edgesdk.inspect.find_linears) on the graph forms exporters write, float and Q/DQ."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.inspect import GraphIndex, bias_values, find_linears, quant_state, weight_kn
from edgesdk.ort import make_session
from edgesdk.quantize import quantize_int8

RNG = np.random.default_rng(7)
K, N1, N2, N3 = 7, 9, 5, 3


def _model() -> tuple[onnx.ModelProto, dict]:
    """X[B,T,7] → MatMul+Add (blk.fc1) → Relu → MatMul(Transpose(W [N,K])) → scores X·Xᵀ·X (not linears)
    → reshape 2-D → Gemm transB (head, with bias) ; plus a Gemm without transB and no bias."""
    w1 = RNG.standard_normal((K, N1)).astype(np.float32)
    b1 = RNG.standard_normal(N1).astype(np.float32)
    w2 = RNG.standard_normal((N2, N1)).astype(np.float32)  # stored [N, K], transposed in-graph
    w3 = RNG.standard_normal((N3, N2)).astype(np.float32)  # Gemm transB=1
    b3 = RNG.standard_normal(N3).astype(np.float32)
    w4 = RNG.standard_normal((N3, 4)).astype(np.float32)  # Gemm transB=0, no bias
    inits = [numpy_helper.from_array(a, n) for a, n in
             [(w1, "blk.fc1.weight"), (b1, "blk.fc1.bias"), (w2, "onnx::W2"), (w3, "head.weight"), (b3, "head.bias"),
              (w4, "onnx::W4"), (np.array([-1, N2], np.int64), "shape2d")]]
    nodes = [
        helper.make_node("MatMul", ["x", "blk.fc1.weight"], ["m1"], name="/blk/fc1/MatMul"),
        helper.make_node("Add", ["blk.fc1.bias", "m1"], ["a1"], name="/blk/fc1/Add"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
        helper.make_node("Transpose", ["onnx::W2"], ["w2t"], perm=[1, 0], name="w2_T"),
        helper.make_node("MatMul", ["r1", "w2t"], ["m2"], name="/blk/fc2/MatMul"),
        helper.make_node("Transpose", ["m2"], ["m2t"], perm=[0, 2, 1], name="kt"),
        helper.make_node("MatMul", ["m2", "m2t"], ["s"], name="/attn/scores"),
        helper.make_node("MatMul", ["s", "m2"], ["pv"], name="/attn/pv"),
        helper.make_node("Reshape", ["pv", "shape2d"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "head.weight", "head.bias"], ["logits"], transB=1, name="/head/Gemm"),
        helper.make_node("Gemm", ["logits", "onnx::W4"], ["y2"], name="/proj/Gemm"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4, K])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return m, {"blk.fc1": (w1, b1), "blk.fc2": (w2.T, None), "head": (w3.T, b3), "proj": (w4, None)}


def test_find_linears_float_forms():
    m, expect = _model()
    found = find_linears(m)
    assert [li.name for li in found] == list(expect)
    by = {li.name: li for li in found}
    assert (by["blk.fc1"].k, by["blk.fc1"].n, by["blk.fc1"].bias, by["blk.fc1"].output) == (K, N1, "blk.fc1.bias", "a1")
    assert by["blk.fc1"].nodes == ["/blk/fc1/MatMul", "/blk/fc1/Add"]
    assert by["blk.fc2"].weight_transpose == "w2_T" and by["blk.fc2"].weight_layout == "NK"
    assert (by["head"].kind, by["head"].weight_layout, by["head"].k, by["head"].n) == ("Gemm", "NK", N2, N3)
    assert by["proj"].weight_layout == "KN" and by["proj"].bias is None
    assert not any(li.quantized for li in found) and quant_state(m) == "float"
    ix = GraphIndex(m)
    for name, (w, b) in expect.items():
        np.testing.assert_array_equal(weight_kn(m, by[name], ix), w)
        if b is None:
            assert bias_values(m, by[name], ix) is None
        else:
            np.testing.assert_array_equal(bias_values(m, by[name], ix), b)


def test_linear_semantics_match_onnxruntime():
    """Y = X·W[K,N] + b computed in float64 from LinearInfo equals what ORT computes for that layer."""
    m, _ = _model()
    found = find_linears(m)
    m.graph.output.extend([helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in ("a1", "r1", "m2")])
    x = RNG.standard_normal((3, 4, K)).astype(np.float32)
    sess = make_session(m)
    names = [o.name for o in sess.get_outputs()]
    out = dict(zip(names, sess.run(None, {"x": x})))
    ins = {"blk.fc1": x, "blk.fc2": out["r1"]}
    for li in found[:2]:
        y = ins[li.name].astype(np.float64) @ weight_kn(m, li).astype(np.float64)
        if li.bias:
            y += bias_values(m, li)
        np.testing.assert_allclose(out[li.output], y, rtol=1e-5, atol=1e-5)


def test_find_linears_qdq_after_quantize():
    m, expect = _model()
    feeds = [{"x": RNG.standard_normal((2, 4, K)).astype(np.float32)} for _ in range(3)]
    q = quantize_int8(m, feeds, find_linears(m))
    assert quant_state(q) == "qdq"
    found = {li.name: li for li in find_linears(q)}
    assert set(found) == set(expect)
    ix = GraphIndex(q)
    for name, (w, b) in expect.items():
        li = found[name]
        assert li.quantized and li.act_scale is not None and li.act_q is not None
        assert ix.const(li.weight).data_type == TensorProto.INT8
        scale = ix.array(li.weight_scale)
        assert scale.shape == (li.n,)
        wq = weight_kn(q, li)
        # symmetric per-channel int8: |error| <= scale/2 per output channel
        assert np.all(np.abs(wq - w) <= scale[None, :] / 2 + 1e-6)
        if b is not None:
            np.testing.assert_array_equal(bias_values(q, li), b)
    # the score path stays float: no Q/DQ on the inputs of the attention MatMuls
    for node in q.graph.node:
        if node.name in ("/attn/scores", "/attn/pv"):
            assert all(ix.producer.get(i) is None or ix.producer[i].op_type != "DequantizeLinear" for i in node.input)


@pytest.mark.parametrize("op", ["QLinearMatMul", "MatMulInteger", "DynamicQuantizeLinear"])
def test_quant_state_qoperator(op):
    m, _ = _model()
    m.graph.node.append(helper.make_node(op, ["x"], ["z"], name="q"))
    assert quant_state(m) == "qoperator"


def test_identity_shared_bias_and_scope_names():
    """torch.onnx legacy dedups equal initializers through Identity nodes; scope names repeat parents."""
    w = RNG.standard_normal((K, N1)).astype(np.float32)
    b = np.zeros(N1, np.float32)
    g = helper.make_graph(
        [helper.make_node("Identity", ["shared.bias"], ["dup"], name="Identity_3"),
         helper.make_node("MatMul", ["x", "onnx::MatMul_9"], ["m"], name="/blocks/blocks.0/attn/proj/MatMul"),
         helper.make_node("Add", ["dup", "m"], ["y"], name="/blocks/blocks.0/attn/proj/Add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, N1])],
        [numpy_helper.from_array(w, "onnx::MatMul_9"), numpy_helper.from_array(b, "shared.bias")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    (li,) = find_linears(m)
    assert li.name == "blocks.0.attn.proj" and li.bias == "dup" and li.output == "y"
    np.testing.assert_array_equal(bias_values(m, li), b)
