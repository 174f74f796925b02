"""Linear detection (edgesdk.inspect.find_linears) refuses what the plugins cannot compute exactly.

The plugins compute ``Y[..., N] = X[..., K]·W + b`` with b a length-N vector added to every row and X of
rank ≥ 2, so: a Gemm C that is not ``[N]``/``[1, N]`` is no bias (the Gemm is no linear), an Add whose
constant raises the output's rank is not fused as a bias, and a MatMul on a 1-D activation is no linear.
Each model is also built with every kernel choice; the build's own verification must pass.
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.build import build
from edgesdk.config import BuildConfig
from edgesdk.inspect import find_linears

K, N, M = 37, 29, 23
KERNELS = [("none", 0.0), ("bitmap", 0.5), ("vitbit", 0.0)]


def _w(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Random float32, all entries non-zero."""
    a = rng.standard_normal(shape).astype(np.float32)
    return np.where(np.abs(a) < 0.05, np.float32(0.5), a).astype(np.float32)


def _model(nodes, inputs, outputs, inits, value_info=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits.items()],
                          value_info=list(value_info))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(m)
    return m


def _vi(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _build(model: onnx.ModelProto, tmp_path, kernels: str, sparsity: float) -> dict:
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    cfg = BuildConfig(output=tmp_path / "o", kernels=kernels, sparsity=sparsity, calibration_count=4, verify_count=2)
    return build(path, cfg)


# ------------------------------------------------------------------ 1. Gemm C of shape [M, 1] with M == N
def _gemm_c_model(c_shape, rng) -> onnx.ModelProto:
    """A[M', K] → Gemm(·, B[K, N], C) → fc (MatMul+Add, a linear); M' = N so that C [N, 1] has N elements."""
    m = N
    inits = {"B": _w(rng, K, N), "C": _w(rng, *c_shape), "fc.weight": _w(rng, N, K), "fc.bias": _w(rng, K)}
    nodes = [helper.make_node("Gemm", ["A", "B", "C"], ["h"], name="/head/Gemm"),
             helper.make_node("MatMul", ["h", "fc.weight"], ["fc_mm"], name="/fc/MatMul"),
             helper.make_node("Add", ["fc_mm", "fc.bias"], ["Y"], name="/fc/Add")]
    return _model(nodes, [_vi("A", [m, K])], [_vi("Y", [m, K])], inits)


@pytest.mark.parametrize("c_shape,is_bias", [((N,), True), ((1, N), True), ((N, 1), False), ((), False),
                                             ((1,), False), ((N, N), False)])
def test_gemm_bias_shapes(c_shape, is_bias):
    found = find_linears(_gemm_c_model(c_shape, np.random.default_rng(1)))
    assert [li.name for li in found] == (["head", "fc"] if is_bias else ["fc"])
    if is_bias:
        assert (found[0].kind, found[0].bias, found[0].n) == ("Gemm", "C", N)


@pytest.mark.parametrize("kernels,sparsity", KERNELS)
def test_gemm_c_per_row_is_not_a_bias(kernels, sparsity, tmp_path):
    model = _gemm_c_model((N, 1), np.random.default_rng(2))
    assert [li.node for li in find_linears(model)] == ["/fc/MatMul"]
    report = _build(model, tmp_path, kernels, sparsity)
    assert report["verified"] is True
    assert [row["name"] for row in report["layers"]] == ["fc"]


# ------------------------------------------------------------------ 2. Add of a [1, 1, N] constant on a 2-D output
def _bias_model(x_shape, b_shape, rng) -> onnx.ModelProto:
    """X → MatMul(W[K, N]) → Add(b) → Y; Y has the broadcast shape of the two."""
    inits = {"fc.weight": _w(rng, K, N), "fc.bias": _w(rng, *b_shape)}
    nodes = [helper.make_node("MatMul", ["X", "fc.weight"], ["fc_mm"], name="/fc/MatMul"),
             helper.make_node("Add", ["fc_mm", "fc.bias"], ["Y"], name="/fc/Add")]
    rank = max(len(x_shape), len(b_shape))
    y_shape = [1] * (rank - len(x_shape)) + list(x_shape[:-1]) + [N]
    return _model(nodes, [_vi("X", list(x_shape))], [_vi("Y", y_shape)], inits)


@pytest.mark.parametrize("x_shape,b_shape,fused", [((M, K), (N,), True), ((M, K), (1, N), True),
                                                   ((M, K), (1, 1, N), False), ((2, M, K), (1, 1, N), True),
                                                   ((2, M, K), (1, 1, 1, N), False), ((2, M, K), (2, 1, N), False),
                                                   ((M, K), (M, N), False)])
def test_bias_add_shapes(x_shape, b_shape, fused):
    (li,) = find_linears(_bias_model(x_shape, b_shape, np.random.default_rng(3)))
    if fused:
        assert (li.bias, li.bias_node, li.output) == ("fc.bias", "/fc/Add", "Y")
        assert li.nodes == ["/fc/MatMul", "/fc/Add"]
    else:
        assert (li.bias, li.bias_node, li.output) == (None, None, "fc_mm")
        assert li.nodes == ["/fc/MatMul"]


def test_bias_add_rank_unknown_still_fused():
    """No rank known for X (no shape): a [1, 1, N] constant is fused (nothing says it raises the rank)."""
    model = _bias_model((M, K), (1, 1, N), np.random.default_rng(4))
    model.graph.input[0].type.tensor_type.ClearField("shape")
    (li,) = find_linears(model)
    assert li.bias == "fc.bias"


@pytest.mark.parametrize("kernels,sparsity", KERNELS)
def test_bias_rank_up_not_fused(kernels, sparsity, tmp_path):
    model = _bias_model((M, K), (1, 1, N), np.random.default_rng(5))
    (li,) = find_linears(model)
    assert (li.bias, li.bias_node, li.output) == (None, None, "fc_mm")
    report = _build(model, tmp_path, kernels, sparsity)
    assert report["verified"] is True
    out = onnx.load(str(tmp_path / "o" / "model.onnx"))
    assert "Add" in [n.op_type for n in out.graph.node]


# ------------------------------------------------------------------ 3. 1-D activation
def _act_1d_model(rng) -> onnx.ModelProto:
    """X[M, K] → fc (a linear); v[K] → MatMul(W1)+b1 (1-D, graph input) → Relu → r[N] (1-D by value_info)
    → MatMul(W2[N, K]) → Z[K] (1-D too). Only fc is a linear."""
    inits = {"fc.weight": _w(rng, K, N), "fc.bias": _w(rng, N), "v1.weight": _w(rng, K, N), "v1.bias": _w(rng, N),
             "v2.weight": _w(rng, N, K)}
    nodes = [helper.make_node("MatMul", ["X", "fc.weight"], ["fc_mm"], name="/fc/MatMul"),
             helper.make_node("Add", ["fc_mm", "fc.bias"], ["Y"], name="/fc/Add"),
             helper.make_node("MatMul", ["v", "v1.weight"], ["v1_mm"], name="/v1/MatMul"),
             helper.make_node("Add", ["v1_mm", "v1.bias"], ["v1_out"], name="/v1/Add"),
             helper.make_node("Relu", ["v1_out"], ["r"], name="/relu"),
             helper.make_node("MatMul", ["r", "v2.weight"], ["Z"], name="/v2/MatMul")]
    return _model(nodes, [_vi("X", [M, K]), _vi("v", [K])], [_vi("Y", [M, N]), _vi("Z", [K])], inits,
                  value_info=[_vi("r", [N])])


def test_act_1d_rank_unknown_still_linear():
    """Without a known rank (no shape on v or Z, no value_info) the MatMuls stay linears."""
    model = _act_1d_model(np.random.default_rng(6))
    model.graph.input[1].type.tensor_type.ClearField("shape")
    model.graph.output[1].type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    assert [li.name for li in find_linears(model)] == ["fc", "v1", "v2"]


def test_act_1d_rank_from_shape_inference():
    """The graph states only its input's rank (no value_info, Z without shape, as many exporters write it): shape
    inference gives r's rank, so the MatMul on r is no linear either (before, it was taken and its plugin read a
    1-D X)."""
    model = _act_1d_model(np.random.default_rng(8))
    model.graph.output[1].type.tensor_type.ClearField("shape")
    del model.graph.value_info[:]
    assert [li.name for li in find_linears(model)] == ["fc"]


@pytest.mark.parametrize("kernels,sparsity", KERNELS)
def test_act_1d_is_not_a_linear(kernels, sparsity, tmp_path):
    model = _act_1d_model(np.random.default_rng(7))
    assert [li.name for li in find_linears(model)] == ["fc"]
    report = _build(model, tmp_path, kernels, sparsity)
    assert report["verified"] is True
    assert [row["name"] for row in report["layers"]] == ["fc"]


def test_passed_over_matmuls_say_why(tmp_path):
    """find_linears(passed_over=...) says why each other MatMul/Gemm is not a linear; build's "no linear layers"
    refusal and inspect repeat it."""
    import json

    from typer.testing import CliRunner

    from edgesdk.cli import app
    from edgesdk.errors import EdgeSDKError

    rng = np.random.default_rng(11)
    w = numpy_helper.from_array(rng.standard_normal((37, 29)).astype(np.float32), "w")
    w16 = numpy_helper.from_array(rng.standard_normal((37, 29)).astype(np.float16), "w16")
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], alpha=2.0, name="scaled"),
             helper.make_node("Cast", ["w16"], ["w32"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("MatMul", ["x", "w32"], ["c"], name="behind_cast"),
             helper.make_node("Transpose", ["x"], ["xt"], name="t"),
             helper.make_node("MatMul", ["x", "xt"], ["s"], name="scores")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [23, 37])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape)
                               for o, shape in (("g", [23, 29]), ("c", [23, 29]), ("s", [23, 23]))],
                              [w, w16])
    path = tmp_path / "none.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    why: dict[str, str] = {}
    assert find_linears(onnx.load(str(path)), why) == []
    assert why["scaled"] == "Gemm with alpha or beta != 1"
    assert why["behind_cast"].startswith("its weight is not a constant 2-D matrix")
    assert why["scores"].startswith("both operands are activations")
    with pytest.raises(EdgeSDKError, match=r"has no linear layers .*passed over: scaled: Gemm with alpha or beta"):
        build(path, BuildConfig(output=tmp_path / "o", calibration_count=1, verify=False))
    r = CliRunner().invoke(app, ["inspect", str(path), "--json"])
    assert json.loads(r.output)["passed_over"] == why
