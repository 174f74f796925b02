"""INT8 quantization of odd but valid graphs: Gemm with a [1, N] C, float16 models, linears inside If/Loop bodies.

Each builds a small model with onnx.helper (odd sizes K=37, N=29, M=23) and runs the whole build with
``--kernels none``: the result verifies and passes onnx.checker, or the build stops with an EdgeSDKError
(never a traceback, and nothing written).
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.build import build
from edgesdk.config import BuildConfig
from edgesdk.errors import EdgeSDKError
from edgesdk.inspect import find_linears, quant_state

K, N, M = 37, 29, 23


def _w(rng, *shape, dtype=np.float32):
    a = (rng.standard_normal(shape) * 0.2).astype(np.float32)
    a[np.abs(a) < 1e-3] = 0.01  # non-zero
    return a.astype(dtype)


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "odd", inputs, outputs, [numpy_helper.from_array(v, n) for n, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(m, full_check=True)
    return m


def _build(tmp_path, model, **kw):
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    cfg = BuildConfig(output=tmp_path / "o", kernels="none", calibration_count=4, verify_count=2, **kw)
    return build(path, cfg)


def _check_written(tmp_path, n_quantized):
    m = onnx.load(str(tmp_path / "o" / "model.onnx"))
    onnx.checker.check_model(m, full_check=True)
    assert quant_state(m) == "qdq"
    assert sum(li.quantized for li in find_linears(m)) == n_quantized
    return m


@pytest.mark.parametrize("c_also_read", [False, True])
def test_gemm_with_c_1xn_quantizes(tmp_path, c_also_read):
    """Gemm(A[M,K], B[K,N], C[1,N]): ORT's quantizer chokes on a [1, N] C; edgesdk passes it as [N]."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["A", "B", "C"], ["Y"], name="gemm")]
    outputs = [_vi("Y", [M, N])]
    if c_also_read:  # another node reads the same [1, N] initializer: it must keep its shape there
        nodes.append(helper.make_node("Add", ["Y", "C"], ["Z"], name="add_c"))
        outputs.append(_vi("Z", [M, N]))
    m = _model(nodes, [_vi("A", [M, K])], outputs, {"B": _w(rng, K, N), "C": _w(rng, 1, N)})
    report = _build(tmp_path, m)
    assert report["verified"] is True, report["verify"]
    q = _check_written(tmp_path, 1)
    if c_also_read:
        (c,) = [t for t in q.graph.initializer if t.name == "C"]
        assert list(c.dims) == [1, N]


def test_float16_model_at_opset17_is_valid_or_refused_clearly(tmp_path):
    """fp16 weights and inputs at opset 17: float16 Q/DQ scales need opset 19."""
    rng = np.random.default_rng(1)
    f16 = TensorProto.FLOAT16
    nodes = [helper.make_node("MatMul", ["X", "W1"], ["h0"], name="fc1/MatMul"),
             helper.make_node("Add", ["h0", "b1"], ["h"], name="fc1/Add"),
             helper.make_node("Relu", ["h"], ["hr"], name="relu"),
             helper.make_node("MatMul", ["hr", "W2"], ["y0"], name="fc2/MatMul"),
             helper.make_node("Add", ["y0", "b2"], ["Y"], name="fc2/Add")]
    m = _model(nodes, [_vi("X", [2, 19, K], f16)], [_vi("Y", [2, 19, 31], f16)],
               {"W1": _w(rng, K, N, dtype=np.float16), "b1": _w(rng, N, dtype=np.float16),
                "W2": _w(rng, N, 31, dtype=np.float16), "b2": _w(rng, 31, dtype=np.float16)})
    try:
        report = _build(tmp_path, m)
    except EdgeSDKError as e:
        assert "opset" in e.problem and "19" in e.problem
        assert "opset 19" in e.fix and "--quantize none" in e.fix
        assert not (tmp_path / "o").exists()
        assert not list(tmp_path.glob(".o.*")), "temporary folders left behind"
    else:
        assert report["verified"] is True, report["verify"]
        _check_written(tmp_path, 2)
    # the same float16 model at opset 19 is fine
    m19 = onnx.ModelProto()
    m19.CopyFrom(m)
    m19.opset_import[0].version = 19
    (tmp_path / "op19").mkdir()
    report = _build(tmp_path / "op19", m19)
    assert report["verified"] is True, report["verify"]
    _check_written(tmp_path / "op19", 2)


def test_invalid_quantized_model_is_refused_not_written(tmp_path, monkeypatch):
    """The onnx.checker safety net: without the up-front float16 check, the invalid Q/DQ graph (float16
    scales at opset 17) is caught right after quantization, before anything is verified or written."""
    import edgesdk.quantize as q

    monkeypatch.setattr(q, "_check_float16_opset", lambda model, layers: None)
    rng = np.random.default_rng(3)
    f16 = TensorProto.FLOAT16
    m = _model([helper.make_node("MatMul", ["X", "W"], ["Y"], name="fc/MatMul")], [_vi("X", [M, K], f16)],
               [_vi("Y", [M, N], f16)], {"W": _w(rng, K, N, dtype=np.float16)})
    with pytest.raises(EdgeSDKError, match="invalid ONNX model") as e:
        _build(tmp_path, m)
    assert "DequantizeLinear" in e.value.problem and "--quantize none" in e.value.fix
    assert not (tmp_path / "o").exists()


def test_quantize_static_failure_names_the_layer(tmp_path, monkeypatch):
    """Any other exception out of onnxruntime.quantization becomes an EdgeSDKError naming the layer."""
    import onnxruntime.quantization as ortq

    def broken(model_input, model_output, reader, **kw):
        weight_name = "fc2.weight"  # noqa: F841 (what ORT's frames hold when they fail on a layer)
        raise ValueError("The truth value of an array with more than one element is ambiguous.")

    monkeypatch.setattr(ortq, "quantize_static", broken)
    rng = np.random.default_rng(4)
    m = _model([helper.make_node("MatMul", ["X", "fc1.weight"], ["h"], name="fc1/MatMul"),
                helper.make_node("MatMul", ["h", "fc2.weight"], ["Y"], name="fc2/MatMul")],
               [_vi("X", [M, K])], [_vi("Y", [M, 31])], {"fc1.weight": _w(rng, K, N), "fc2.weight": _w(rng, N, 31)})
    with pytest.raises(EdgeSDKError, match="failed on linear 'fc2'") as e:
        _build(tmp_path, m)
    assert "ValueError" in e.value.problem and "--exclude '^fc2$'" in e.value.fix
    assert "report this with the model" in e.value.fix
    assert not (tmp_path / "o").exists()


def _if_model(rng):
    def branch(tag, w):
        return helper.make_graph([helper.make_node("MatMul", ["h", w], [f"{tag}_y"], name=f"{tag}/MatMul")], tag, [],
                                 [_vi(f"{tag}_y", [2, 19, 31])])

    nodes = [helper.make_node("MatMul", ["X", "W1"], ["h0"], name="fc/MatMul"),
             helper.make_node("Add", ["h0", "b1"], ["h"], name="fc/Add"),
             helper.make_node("If", ["cond"], ["Y"], name="if", then_branch=branch("then", "Wt"),
                              else_branch=branch("else", "We"))]
    return _model(nodes, [_vi("X", [2, 19, K]), _vi("cond", [], TensorProto.BOOL)], [_vi("Y", [2, 19, 31])],
                  {"W1": _w(rng, K, N), "b1": _w(rng, N), "Wt": _w(rng, N, 31), "We": _w(rng, N, 31)})


def _loop_model(rng):
    body = helper.make_graph([helper.make_node("MatMul", ["h", "Wl"], ["p"], name="body/MatMul"),
                              helper.make_node("Add", ["s_in", "p"], ["s_out"], name="body/Add"),
                              helper.make_node("Identity", ["c_in"], ["c_out"], name="body/Id")], "body",
                             [_vi("i", [], TensorProto.INT64), _vi("c_in", [], TensorProto.BOOL),
                              _vi("s_in", [2, 19, 31])],
                             [_vi("c_out", [], TensorProto.BOOL), _vi("s_out", [2, 19, 31])])
    nodes = [helper.make_node("MatMul", ["X", "W1"], ["h0"], name="fc/MatMul"),
             helper.make_node("Add", ["h0", "b1"], ["h"], name="fc/Add"),
             helper.make_node("Loop", ["trip", "", "s0"], ["Y"], name="loop", body=body)]
    return _model(nodes, [_vi("X", [2, 19, K])], [_vi("Y", [2, 19, 31])],
                  {"W1": _w(rng, K, N), "b1": _w(rng, N), "Wl": _w(rng, N, 31), "trip": np.array(3, np.int64),
                   "s0": np.zeros((2, 19, 31), np.float32)})


@pytest.mark.parametrize("make", [_if_model, _loop_model], ids=["if", "loop"])
def test_linear_beside_an_if_or_loop_reading_outer_scope_stays_sorted(tmp_path, make):
    """A MatMul in an If/Loop body reads the outer tensor h: after quantization the main graph stays
    topologically sorted (the If/Loop after the nodes that compute h)."""
    m = make(np.random.default_rng(2))
    report = _build(tmp_path, m)
    assert report["verified"] is True, report["verify"]
    q = _check_written(tmp_path, 1)
    order = [n.op_type for n in q.graph.node]
    sub = next(i for i, t in enumerate(order) if t in ("If", "Loop"))
    h_at = next(i for i, n in enumerate(q.graph.node) if "h" in n.output)
    assert h_at < sub, order
