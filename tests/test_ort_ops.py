"""ONNX Runtime reference ops: single plugin nodes vs independent numpy references."""

import math
from pathlib import Path
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.errors import EdgeSDKError
from edgesdk.formats.bitmap_linear import BitmapLinearWeights
from edgesdk.formats.vitbit_gemm import VitBitWeights
from edgesdk.ort import make_session
from edgesdk.reference.bitmap_linear import tolerance
from edgesdk.rewrite import PLUGIN_ATTRS

ONNX_DT = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def _node_model(op_type, attrs, tensors, x_shape, n, dtype, y_dtype=None):
    inits = [numpy_helper.from_array(np.ascontiguousarray(v), f"w.{k}") for k, v in tensors.items()]
    node = helper.make_node(op_type, ["X"] + [i.name for i in inits], ["Y"], domain="edgesdk",
                            **attrs, **PLUGIN_ATTRS)
    sym = ["b"] + list(x_shape[1:-1])
    x_type = TensorProto.INT8 if dtype == np.int8 else ONNX_DT[dtype]
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", x_type, sym + [x_shape[-1]])],
                          [helper.make_tensor_value_info("Y", ONNX_DT[y_dtype or dtype], sym + [n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("edgesdk", 1)],
                          ir_version=10)
    onnx.checker.check_model(m)
    return m


def vitbit_int64(x, w_q, w_scale, x_scale, bias, gelu=False, y_dtype=None):
    """Independent VitBit semantics: int64 accumulation, fp32 epilogue, Y in X's dtype (an int8 X is q
    itself; Y then in ``y_dtype``).

    With ``gelu`` the exact GELU is applied to the fp32 value in float64 (math.erf), then rounded
    to fp32: equal to the reference up to erf's last float64 bit (compare with a 1e-6 tolerance).
    """
    if x.dtype == np.int8:
        q = x.astype(np.int64)
    else:
        q = np.clip(np.rint(x.astype(np.float32) / np.float32(x_scale)), -128, 127).astype(np.int64)
    acc = q.reshape(-1, x.shape[-1]) @ w_q.astype(np.int64).T
    alpha = (np.float32(x_scale) * w_scale.astype(np.float32)).astype(np.float32)
    y = acc.astype(np.float32) * alpha
    if bias is not None:
        y = (y + bias.astype(np.float32)).astype(np.float32)
    if gelu:
        erf = np.vectorize(math.erf, otypes=[np.float64])
        y64 = y.astype(np.float64)
        y = (0.5 * y64 * (1.0 + erf(y64 / math.sqrt(2.0)))).astype(np.float32)
    return y.astype(y_dtype or x.dtype).reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("has_bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 5, 67), (1, 130), (2, 1, 1, 33)])
def test_vitbit_op_bit_exact(dtype, has_bias, shape):
    rng = np.random.default_rng(sum(shape) + has_bias)
    k, n = shape[-1], 29
    w_q = rng.integers(-128, 128, (n, k)).astype(np.int8)
    w_scale = (rng.random(n) * 0.01 + 1e-3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if has_bias else None
    x_scale = float(np.float32(0.0371234567))  # 9 significant digits: ORT prints float attrs with 6
    packed = VitBitWeights.pack(w_q, w_scale, 8, bias=bias, x_scale=x_scale)
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    x.reshape(-1)[:3] = [1000.0, -1000.0, 0.5 * x_scale]  # saturation and a rounding tie
    m = _node_model("EdgeVitBitGemm", packed.node_attributes(), packed.to_tensors(), shape, n, dtype)
    y = make_session(m).run(None, {"X": x})[0]
    assert y.dtype == dtype and y.shape == shape[:-1] + (n,)
    np.testing.assert_array_equal(y, vitbit_int64(x, w_q, w_scale, x_scale, bias))


@pytest.mark.parametrize("y_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("gelu", [False, True])
def test_vitbit_op_int8_x(y_dtype, gelu):
    """An int8 X (the QuantizeLinear output) is q itself; Y in the node's y_dtype; -128 and 127 included."""
    rng = np.random.default_rng(5 + gelu)
    shape, n = (2, 7, 45), 19
    w_q = rng.integers(-128, 128, (n, shape[-1])).astype(np.int8)
    w_scale = (rng.random(n) * 0.01 + 1e-3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    x_scale = float(np.float32(0.0371234567))
    packed = VitBitWeights.pack(w_q, w_scale, 8, bias=bias, x_scale=x_scale, gelu=gelu,
                                y_dtype=np.dtype(y_dtype).name)
    x = rng.integers(-128, 128, shape).astype(np.int8)
    x.reshape(-1)[:2] = [-128, 127]
    m = _node_model("EdgeVitBitGemm", packed.node_attributes(), packed.to_tensors(), shape, n, np.int8, y_dtype)
    y = make_session(m).run(None, {"X": x})[0]
    ref = vitbit_int64(x, w_q, w_scale, x_scale, bias, gelu, y_dtype)
    assert y.dtype == y_dtype and y.shape == shape[:-1] + (n,)
    np.testing.assert_allclose(y, ref, rtol=1e-6 if gelu else 0, atol=1e-7 if gelu else 0)
    # a node without y_dtype cannot take an int8 X: refused before a session exists
    bad = VitBitWeights.pack(w_q, w_scale, 8, bias=bias, x_scale=x_scale)
    with pytest.raises(EdgeSDKError, match="has no y_dtype"):
        make_session(_node_model("EdgeVitBitGemm", bad.node_attributes(), bad.to_tensors(), shape, n, np.int8,
                                 y_dtype)).run(None, {"X": x})


def test_int8_x_typed_without_value_info_or_shape_inference(monkeypatch):
    """A plugin's int8 X made by a QuantizeLinear that reads another plugin node's output, no value_info in the
    file: onnx 1.16's shape inference leaves it untyped (newer versions type it from the zero point), so the
    X dtype comes from the QuantizeLinear's zero point; shape inference is switched off here to test that."""
    rng = np.random.default_rng(12)
    k, n1, n2 = 37, 23, 11
    layers, nodes, inits = [], [], []
    for i, (kk, nn) in enumerate([(k, n1), (n1, n2)]):
        w_q = rng.integers(-128, 128, (nn, kk)).astype(np.int8)
        w_scale = (rng.random(nn) * 0.01 + 1e-3).astype(np.float32)
        x_scale = float(np.float32(0.05 + 0.3 * i))
        p = VitBitWeights.pack(w_q, w_scale, 8, x_scale=x_scale, y_dtype="float32")
        layers.append((w_q, w_scale, x_scale))
        t = [numpy_helper.from_array(np.ascontiguousarray(v), f"l{i}.{name}") for name, v in p.to_tensors().items()]
        q = [numpy_helper.from_array(np.float32(x_scale), f"l{i}.s"), numpy_helper.from_array(np.int8(0), f"l{i}.z")]
        inits += t + q
        x_in = "X" if i == 0 else "H"
        nodes.append(helper.make_node("QuantizeLinear", [x_in, f"l{i}.s", f"l{i}.z"], [f"q{i}"]))
        nodes.append(helper.make_node("EdgeVitBitGemm", [f"q{i}"] + [x.name for x in t], ["H" if i == 0 else "Y"],
                                      domain="edgesdk", **p.node_attributes(), **PLUGIN_ATTRS))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, n2])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("edgesdk", 1)],
                          ir_version=10)
    assert not m.graph.value_info
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", lambda model, *a, **kw: model)
    x = rng.standard_normal((3, k)).astype(np.float32) * 4
    y = make_session(m).run(None, {"X": x})[0]
    h = x
    for w_q, w_scale, x_scale in layers:
        qx = np.clip(np.rint(h / np.float32(x_scale)), -128, 127).astype(np.int8)
        h = vitbit_int64(qx, w_q, w_scale, x_scale, None, y_dtype=np.float32)
    np.testing.assert_array_equal(y, h)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("value_dtype", ["float16", "int8"])
@pytest.mark.parametrize("has_bias", [True, False])
def test_bitmap_op_matches_float64(dtype, value_dtype, has_bias):
    rng = np.random.default_rng(7 + has_bias)
    n, k = 37, 131
    w = rng.standard_normal((n, k))
    w[rng.random((n, k)) < 0.5] = 0
    bias = rng.standard_normal(n) if has_bias else None
    packed = BitmapLinearWeights.pack(w, value_dtype, bias=bias)
    shape = (2, 3, k)
    x = rng.standard_normal(shape).astype(dtype)
    m = _node_model("EdgeBitmapLinear", packed.node_attributes(), packed.to_tensors(), shape, n, dtype)
    y = make_session(m).run(None, {"X": x})[0]
    assert y.dtype == dtype and y.shape == (2, 3, n)
    # independent: stored values (fp16, or int8 * scale) in float64
    if value_dtype == "float16":
        wd = w.astype(np.float16).astype(np.float64)
    else:
        scale = np.abs(w).max(1) / 127
        wd = np.clip(np.rint(w / scale[:, None]), -127, 127) * scale.astype(np.float32).astype(np.float64)[:, None]
    ref = x.astype(np.float64) @ wd.T + (0 if bias is None else bias.astype(np.float32))
    assert np.all(np.abs(y.astype(np.float64) - ref) <= tolerance(x, packed))
    # and exactly what the kernel's ground truth says (one rounding to X's dtype)
    np.testing.assert_allclose(y.astype(np.float64), ref, rtol=2**-10 if dtype == np.float16 else 1e-6, atol=1e-3)


def test_corrupted_tensors_fail_with_the_format_message():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((9, 70))
    w[rng.random(w.shape) < 0.5] = 0
    packed = BitmapLinearWeights.pack(w, "float16")
    t = packed.to_tensors()
    t["offsets"] = t["offsets"].copy()
    t["offsets"][1] += 8  # group 0 claims more values than its bitmap has bits
    t["values"] = np.concatenate([t["values"], np.zeros(16, np.int8)])
    m = _node_model("EdgeBitmapLinear", packed.node_attributes(), t, (1, 70), 9, np.float32)
    with pytest.raises(EdgeSDKError, match="bits set"):
        make_session(m)


def test_wrong_x_width_returns_nan_instead_of_aborting(capfd):
    rng = np.random.default_rng(4)
    packed = VitBitWeights.pack(rng.integers(-8, 8, (5, 16)).astype(np.int8), np.ones(5, np.float32), x_scale=0.1)
    m = _node_model("EdgeVitBitGemm", packed.node_attributes(), packed.to_tensors(), (2, 16), 5, np.float32)
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "K"
    y = make_session(m).run(None, {"X": np.ones((2, 17), np.float32)})[0]
    assert y.shape == (2, 5) and np.isnan(y).all()
    assert "EdgeVitBitGemm failed" in capfd.readouterr().err


def test_reference_ops_load_without_torch_or_a_protobuf_switch(tmp_path):
    """onnxruntime_extensions' package import pulls in torch and transformers where installed (seconds) and sets
    PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python for the process; edgesdk's import of it does neither, and both
    packages still import afterwards. A fresh interpreter, since this one may have imported them already.
    (onnxruntime-extensions 0.14 needs transformers to import at all: there only the variable is checked.)"""
    import subprocess
    import sys

    from edgesdk.ort import _imports_hf_unguarded

    pulled = "" if _imports_hf_unguarded() else (
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'pulled in'\n")
    code = ("import importlib.util, os, sys\n"
            "import edgesdk.ort as o\n"
            "o.register_ops()\n"
            "assert 'onnxruntime_extensions' in sys.modules\n"
            + pulled +
            "assert os.environ.get('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION') == 'upb', 'changed'\n"
            "for m in ('torch', 'transformers'):\n"
            "    if importlib.util.find_spec(m) is not None:\n"
            "        __import__(m)\n")
    env = {**__import__("os").environ, "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "upb"}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-1500:]


@pytest.mark.parametrize("release, needs, ok", [("0.14.0", "transformers", True),
                                                ("0.15.2", "a_package_nobody_installed", False)])
def test_import_ortx_where_the_package_imports_transformers(tmp_path, release, needs, ok):
    """onnxruntime-extensions 0.14 imports transformers unconditionally: its import with torch/transformers blocked
    (to skip their cost) failed, so every ONNX Runtime run of a plugin graph failed where 0.14 and transformers were
    installed (found on the GPU machine). 0.14 is now imported unblocked; a package that cannot import at all gives
    an error naming the fix. Fake packages (with their dist-info) in a subprocess keep this machine's out of it."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "onnxruntime_extensions").mkdir()
    (tmp_path / "onnxruntime_extensions" / "__init__.py").write_text(f"import {needs}\nVALUE = 7\n")
    info = tmp_path / f"onnxruntime_extensions-{release}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: onnxruntime-extensions\nVersion: {release}\n")
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text("")
    code = ("import sys\nfrom edgesdk.errors import EdgeSDKError\nfrom edgesdk.ort import import_ortx\n"
            "try:\n    print(import_ortx().VALUE, 'transformers' in sys.modules)\n"
            "except EdgeSDKError as e:\n    print('ERR', e.problem, '|', e.fix)\n")
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{root}"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    if ok:
        assert out.stdout.split() == ["7", "True"]
    else:
        assert out.stdout.startswith("ERR onnxruntime-extensions cannot be imported") and ">=0.15" in out.stdout


# ---------------------------------------------------------------- weights dequantized once per session
def _dq_model(x_dtype, axis, zp: bool):
    """Y = X @ DequantizeLinear(W) for an integer W (per tensor, or per channel along ``axis``)."""
    rng = np.random.default_rng(11)
    k, n = 37, 29
    lo, hi = (0, 256) if x_dtype == np.uint8 else (-128, 128)
    w = rng.integers(lo, hi, (k, n)).astype(x_dtype)
    if axis is None:
        scale, zero = np.float32(0.0123), x_dtype(7 if zp else 0)
    else:
        scale = (rng.random(w.shape[axis]) * 0.05 + 0.001).astype(np.float32)
        zero = (rng.integers(0, 9, w.shape[axis]) if zp else np.zeros(w.shape[axis])).astype(x_dtype)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.asarray(scale), "s"),
             numpy_helper.from_array(np.asarray(zero), "z")]
    attrs = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("DequantizeLinear", ["W", "s", "z"], ["Wf"], **attrs),
             helper.make_node("MatMul", ["X", "Wf"], ["Y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["b", k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _plain_session(model):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("x_dtype, axis, zp", [(np.int8, 1, False), (np.int8, 0, True), (np.uint8, 1, True),
                                               (np.uint8, None, True), (np.int8, None, False)])
def test_weight_dequantize_folded_bit_exact(x_dtype, axis, zp):
    """make_session computes a constant weight's DequantizeLinear once; its outputs are the unfolded graph's, bit for
    bit (the float weight as ONNX Runtime's kernel computes it, prepacking off)."""
    from edgesdk.ort import fold_weight_dequantize

    m = _dq_model(x_dtype, axis, zp)
    x = np.random.default_rng(3).standard_normal((5, 37)).astype(np.float32)
    want = _plain_session(m).run(None, {"X": x})[0]
    np.testing.assert_array_equal(make_session(m).run(None, {"X": x})[0], want)
    folded = onnx.ModelProto()
    folded.CopyFrom(m)
    assert fold_weight_dequantize(folded) == 1
    assert [n.op_type for n in folded.graph.node] == ["MatMul"]
    assert [t.name for t in folded.graph.initializer] == ["Wf"]  # W, s, z no longer used
    w = numpy_helper.to_array(m.graph.initializer[0]).astype(np.float64)
    s = numpy_helper.to_array(m.graph.initializer[1]).astype(np.float64)
    z = numpy_helper.to_array(m.graph.initializer[2]).astype(np.float64)
    if axis is not None:
        s, z = (v.reshape((-1, 1) if axis == 0 else (1, -1)) for v in (s, z))
    np.testing.assert_allclose(numpy_helper.to_array(folded.graph.initializer[0]), (w - z) * s, rtol=1e-6)


def test_weight_dequantize_block_quantized_is_left_alone():
    from edgesdk.ort import _weight_dequantize

    m = _dq_model(np.int8, 1, False)
    m.graph.node[0].attribute.append(helper.make_attribute("block_size", 8))
    assert _weight_dequantize(m, set()) == []


def test_weight_dequantize_not_folded_where_it_must_not_be(monkeypatch):
    import edgesdk.ort as eo

    m = _dq_model(np.int8, 1, False)
    assert len(eo._weight_dequantize(m, set())) == 1
    assert eo._weight_dequantize(m, {"Wf"}) == []  # asked for as an output: the node stays
    x = np.ones((2, 37), np.float32)
    y, wf = make_session(m, outputs=["Wf"]).run(None, {"X": x})
    assert wf.shape == (37, 29) and y.shape == (2, 29)
    monkeypatch.setattr(eo, "FOLD_LIMIT", 37 * 29 * 4 - 1)  # too large to fold
    assert eo._weight_dequantize(m, set()) == []
    monkeypatch.undo()
    m.graph.node[0].input[0] = "X2"  # not a constant
    assert eo._weight_dequantize(m, set()) == []


def test_int8_build_outputs_unchanged_by_folding(tmp_path):
    """A whole INT8 build (the test decoder with its cache): folded and unfolded sessions agree bit for bit."""
    from edgesdk.build import build
    from edgesdk.config import BuildConfig

    src = Path(__file__).resolve().parent / "data" / "optimum" / "llama_d64_past" / "model.onnx"
    build(src, BuildConfig(output=tmp_path / "b", kernels="none", calibration_count=2, verify=False,
                           shape_hints={"input_ids": [1, 3], "past_key_values.0.key": [1, 2, 5, 64]}))
    m = onnx.load(str(tmp_path / "b" / "model.onnx"))
    assert sum(n.op_type == "DequantizeLinear" for n in m.graph.node) > 14
    rng = np.random.default_rng(5)
    feeds = {"input_ids": rng.integers(0, 64, (1, 3)), "attention_mask": np.ones((1, 8), np.int64),
             "position_ids": np.arange(5, 8)[None]}
    for i in m.graph.input:
        if i.name.startswith("past"):
            feeds[i.name] = rng.standard_normal((1, 2, 5, 64)).astype(np.float32)
    for a, b in zip(_plain_session(m).run(None, feeds), make_session(tmp_path / "b" / "model.onnx").run(None, feeds)):
        np.testing.assert_array_equal(a, b)
