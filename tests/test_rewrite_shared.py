"""Pruning a layer that keeps its nodes (`_write_back`): zero points, weights shared with other layers or ops,
and Wanda on a Gemm with transA (edgesdk/rewrite/__init__.py)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgesdk.build import build
from edgesdk.config import BuildConfig

RNG = np.random.default_rng(17)
M, K, N = 23, 37, 29


def _save(path, nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return path


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _dequantized(model: onnx.ModelProto, dq_output: str) -> np.ndarray:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    dq = next(n for n in model.graph.node if n.output[0] == dq_output)
    q, s = inits[dq.input[0]].astype(np.float64), inits[dq.input[1]].astype(np.float64)
    zp = inits[dq.input[2]].astype(np.float64) if len(dq.input) > 2 else 0.0
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    shape = [1] * q.ndim
    if np.ndim(s):
        shape[axis] = -1
    return (q - np.reshape(zp, shape)) * np.reshape(s, shape)


def test_uint8_weights_with_a_zero_point_are_pruned_to_zero(tmp_path):
    """A pruned weight is stored as the zero point: with uint8 and zero point 128, storing 0 meant -128 * scale."""
    w = RNG.standard_normal((K, N))
    scale = (np.abs(w).max(0) / 127).astype(np.float32)
    zp = np.full(N, 128, np.uint8)
    wq = np.clip(np.round(w / scale) + 128, 0, 255).astype(np.uint8)
    path = _save(tmp_path / "u8.onnx",
                 [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1, name="dq"),
                  helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
                 [_vi("x", [M, K])], [_vi("y", [M, N])],
                 [numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(scale, "ws"),
                  numpy_helper.from_array(zp, "wz")])
    r = build(path, BuildConfig(output=tmp_path / "o", kernels="bitmap", sparsity=0.5, prune="magnitude",
                                calibration_count=4, verify_count=2))
    (row,) = r["layers"]
    assert row["kernel"] == "none" and "uint8" in row["reason"] and abs(row["sparsity"] - 0.5) < 0.02
    m = onnx.load(str(tmp_path / "o" / "model.onnx"))
    fc = next(n for n in m.graph.node if n.op_type == "MatMul")
    got = _dequantized(m, fc.input[1])
    assert abs(np.mean(got == 0) - row["sparsity"]) < 1e-9  # before: ~1 % (stored 0 is -128 * scale)
    orig = _dequantized(onnx.load(str(path)), "w")
    np.testing.assert_allclose(got[got != 0], orig[got != 0])  # the kept weights are untouched


def test_a_weight_shared_with_an_add_keeps_its_values_there(tmp_path):
    """W feeds the layer and an Add; ONNX Runtime's quantizer makes both read W's DequantizeLinear. Pruning the
    layer must not prune the Add's W: the layer gets a private DequantizeLinear."""
    w = RNG.standard_normal((K, N)).astype(np.float32)
    path = _save(tmp_path / "shared.onnx",
                 [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc"),
                  helper.make_node("Add", ["x2", "w"], ["z"], name="add")],
                 [_vi("x", [M, K]), _vi("x2", [K, N])], [_vi("y", [M, N]), _vi("z", [K, N])],
                 [numpy_helper.from_array(w, "w")])
    r = build(path, BuildConfig(output=tmp_path / "o", kernels="none", sparsity=0.5, prune="magnitude",
                                calibration_count=4, verify_count=2))
    assert r["layers"][0]["sparsity"] > 0.45
    sess = ort.InferenceSession(str(tmp_path / "o" / "model.onnx"))
    z = sess.run(["z"], {"x": np.ones((M, K), np.float32), "x2": np.zeros((K, N), np.float32)})[0]
    assert np.mean(z == 0) < 0.01 and np.abs(z - w).max() < 0.05  # W itself (INT8-rounded), not pruned
    m = onnx.load(str(tmp_path / "o" / "model.onnx"))
    fc = next(n for n in m.graph.node if n.op_type == "MatMul")
    assert abs(np.mean(_dequantized(m, fc.input[1]) == 0) - r["layers"][0]["sparsity"]) < 1e-9


def test_two_layers_sharing_a_weight_keep_their_own_wanda_masks(tmp_path):
    """Two MatMuls read one W from inputs of very different column scales, so Wanda gives them different masks;
    each must get its own pruned copy (before: the second layer ran with the first one's mask)."""
    w = RNG.standard_normal((K, N)).astype(np.float32)
    calib = tmp_path / "c.npz"
    col = np.linspace(0.1, 10, K).astype(np.float32)
    np.savez(calib, a=(RNG.standard_normal((16 * M, K)) * col).astype(np.float32),  # rows on axis 0
             b=(RNG.standard_normal((16 * M, K)) * col[::-1]).astype(np.float32))
    path = _save(tmp_path / "two.onnx",
                 [helper.make_node("MatMul", ["a", "w"], ["ya"], name="fa"),
                  helper.make_node("MatMul", ["b", "w"], ["yb"], name="fb")],
                 [_vi("a", [M, K]), _vi("b", [M, K])], [_vi("ya", [M, N]), _vi("yb", [M, N])],
                 [numpy_helper.from_array(w, "w")])
    r = build(path, BuildConfig(output=tmp_path / "o", kernels="none", sparsity=0.5, prune="wanda",
                                calibration=calib, calibration_count=8, verify_count=2))
    m = onnx.load(str(tmp_path / "o" / "model.onnx"))
    mm = {n.name: n for n in m.graph.node if n.op_type == "MatMul"}
    wa, wb = (_dequantized(m, mm[name].input[1]) for name in ("fa", "fb"))
    assert 0.45 < np.mean(wa == 0) < 0.55 and 0.45 < np.mean(wb == 0) < 0.55
    assert np.mean((wa == 0) != (wb == 0)) > 0.2  # different masks: the inputs weigh the columns oppositely
    rows = {(v["output"], v["against"]): v for v in r["verify"]}
    assert all(v["passed"] for v in rows.values() if v["gate"]), rows


def test_wanda_on_a_gemm_with_transposed_input(tmp_path):
    """Gemm transA=1 reads A = X^T [K, M]: the activation norms are over A's first axis (before: refused with
    'activation norms have M features but the weight has K')."""
    w = RNG.standard_normal((K, N)).astype(np.float32)
    path = _save(tmp_path / "ta.onnx", [helper.make_node("Gemm", ["a", "w"], ["y"], transA=1, name="g")],
                 [_vi("a", [K, M])], [_vi("y", [M, N])], [numpy_helper.from_array(w, "w")])
    r = build(path, BuildConfig(output=tmp_path / "o", kernels="bitmap", sparsity=0.5, prune="wanda",
                                calibration_count=4, verify_count=2))
    (row,) = r["layers"]
    assert row["kernel"] == "bitmap" and abs(row["sparsity"] - 0.5) < 0.02 and r["verified"] is True


def test_inspect_previews_what_the_build_does_with_a_qdq_model(tmp_path):
    """A model already in Q/DQ form is built as it is: inspect's preview takes its own weights (uint8 with a zero
    point: no plugin) instead of assuming the build re-quantizes them (it previewed vitbit)."""
    import json

    from typer.testing import CliRunner

    from edgesdk.cli import app

    w = RNG.standard_normal((K, N))
    scale = (np.abs(w).max(0) / 127).astype(np.float32)
    wq = np.clip(np.round(w / scale) + 128, 0, 255).astype(np.uint8)
    xs, xz = np.float32(0.05), np.int8(0)
    path = _save(tmp_path / "q.onnx",
                 [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="q"),
                  helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dqx"),
                  helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1, name="dqw"),
                  helper.make_node("MatMul", ["xd", "w"], ["y"], name="fc")],
                 [_vi("x", [M, K])], [_vi("y", [M, N])],
                 [numpy_helper.from_array(wq, "wq"), numpy_helper.from_array(scale, "ws"),
                  numpy_helper.from_array(np.full(N, 128, np.uint8), "wz"), numpy_helper.from_array(xs, "xs"),
                  numpy_helper.from_array(xz, "xz")])
    r = CliRunner().invoke(app, ["inspect", str(path), "--json"])
    (layer,) = json.loads(r.output)["linears"]
    report = build(path, BuildConfig(output=tmp_path / "o", calibration_count=2, verify_count=1))
    assert layer["kernel"] == report["layers"][0]["kernel"] == "none"
    assert "uint8" in layer["kernel_reason"] and "uint8" in report["layers"][0]["reason"]
