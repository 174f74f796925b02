"""Models over protobuf's 2 GB limit: their weights live in ONNX external data files.

Most tests lower ``edgesdk.onnx_io.EXTERNAL_DATA_BYTES`` so that small models take the large-model paths (light
copies, external data on save, arrays handed to ONNX Runtime) and compare with the ordinary paths; one builds a real
model of more than 2 GiB end to end.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf.message import EncodeError
from onnx import TensorProto, helper, numpy_helper

import edgesdk
from edgesdk import onnx_io
from edgesdk.build import build, check_build
from edgesdk.config import BuildConfig
from edgesdk.errors import EdgeSDKError
from edgesdk.ort import make_session

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "models" / "digits_vit.onnx"
CALIB = ROOT / "calibration" / "digits.npz"
RNG = np.random.default_rng(23)


def _mlp(k=37, n=29, ir=10):
    """x[B, 3, k] -> MatMul(W1) -> Relu -> Reshape(1, -1) (a small constant shape tensor, which stays inline)."""
    w1 = RNG.standard_normal((k, n)).astype(np.float32)
    b1 = RNG.standard_normal(n).astype(np.float16)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
         helper.make_node("Cast", ["b1"], ["b1f"], to=TensorProto.FLOAT, name="cast"),
         helper.make_node("Add", ["h", "b1f"], ["a"], name="add"),
         helper.make_node("Relu", ["a"], ["r"], name="relu"),
         helper.make_node("Reshape", ["r", "shape"], ["y"], name="flat")],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "f"])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
         numpy_helper.from_array(np.array([1, -1], np.int64), "shape")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=ir)


@pytest.fixture
def tiny_limit(monkeypatch):
    """Every model counts as over 2 GB."""
    monkeypatch.setattr(onnx_io, "EXTERNAL_DATA_BYTES", 100)


def test_model_nbytes_without_serializing():
    m = _mlp()
    assert onnx_io.model_nbytes(m) == 37 * 29 * 4 + 29 * 2 + 2 * 8
    assert onnx_io.model_nbytes(m) <= m.ByteSize() < onnx_io.model_nbytes(m) + 1024
    assert not onnx_io.is_large(m)


def test_light_copy_writes_external_data_and_leaves_the_model(tmp_path):
    m = _mlp()
    before = m.SerializeToString()
    light = onnx_io.light_copy(m, tmp_path / "w.bin", threshold=64)
    assert m.SerializeToString() == before
    kinds = {t.name: t.data_location for t in light.graph.initializer}
    assert kinds == {"w1": TensorProto.EXTERNAL, "b1": TensorProto.DEFAULT, "shape": TensorProto.DEFAULT}
    assert (tmp_path / "w.bin").stat().st_size == 37 * 29 * 4
    onnx.save(light, str(tmp_path / "m.onnx"))
    back = onnx.load(str(tmp_path / "m.onnx"))
    for a, b in zip(m.graph.initializer, back.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    arrays = []
    onnx_io.light_copy(m, arrays=arrays, threshold=64)
    assert [n for n, _ in arrays] == ["w1"]
    np.testing.assert_array_equal(arrays[0][1], numpy_helper.to_array(m.graph.initializer[0]))


def test_shape_inference_and_checker_on_large_models(tiny_limit):
    m = _mlp()
    inferred = onnx_io.infer_shapes(m, strict_mode=True, data_prop=True)
    shapes = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in inferred.graph.value_info}
    assert shapes["h"] == ["batch", 3, 29]
    onnx_io.check_model(m, full_check=True)
    bad = _mlp()
    bad.graph.node[0].input[1] = "nowhere"
    with pytest.raises(onnx.checker.ValidationError, match="nowhere"):
        onnx_io.check_model(bad)


@pytest.mark.parametrize("outputs", [(), ("h",)])
def test_session_of_a_large_model_equals_the_ordinary_one(tiny_limit, monkeypatch, outputs):
    m = _mlp()
    x = RNG.standard_normal((2, 3, 37)).astype(np.float32)
    big = make_session(m, outputs=outputs)
    assert hasattr(big, "edgesdk_weights")
    got = big.run(None, {"x": x})
    monkeypatch.setattr(onnx_io, "EXTERNAL_DATA_BYTES", 1 << 40)
    small = make_session(m, outputs=outputs)
    assert not hasattr(small, "edgesdk_weights")
    for a, b in zip(got, small.run(None, {"x": x}), strict=True):
        np.testing.assert_array_equal(a, b)
    assert [o.name for o in big.get_outputs()] == ["y", *outputs]
    assert len(m.graph.output) == 1  # the probe outputs went on a copy


def test_save_model_large_is_atomic_and_complete(tiny_limit, tmp_path):
    m = _mlp()
    before = m.SerializeToString()
    onnx_io.save_model(m, tmp_path / "model.onnx")
    assert m.SerializeToString() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]
    assert onnx_io.external_data_files(tmp_path / "model.onnx") == [tmp_path / "model.onnx.data"]
    back = onnx_io.load_model(tmp_path / "model.onnx")
    assert [numpy_helper.to_array(t).tolist() for t in back.graph.initializer] == \
        [numpy_helper.to_array(t).tolist() for t in m.graph.initializer]


def test_ir_version_past_10_is_read_as_10(tmp_path):
    """onnx 1.23's helpers write IR 14, which ONNX Runtime < 1.24 refuses ("Unsupported model IR version")."""
    m = _mlp(ir=14)
    onnx.save(m, str(tmp_path / "ir14.onnx"))
    loaded = onnx_io.load_model(tmp_path / "ir14.onnx")
    assert loaded.ir_version == 10
    make_session(loaded).run(None, {"x": RNG.standard_normal((1, 3, 37)).astype(np.float32)})


def test_model_sha256_covers_external_data(tmp_path):
    m = _mlp()
    onnx.save(m, str(tmp_path / "a.onnx"), save_as_external_data=True, location="a.weights", size_threshold=64)
    digest = onnx_io.model_sha256(tmp_path / "a.onnx")
    assert digest != onnx_io.sha256_file(tmp_path / "a.onnx")
    data = bytearray((tmp_path / "a.weights").read_bytes())
    data[5] ^= 1
    (tmp_path / "a.weights").write_bytes(bytes(data))
    assert onnx_io.model_sha256(tmp_path / "a.onnx") != digest
    (tmp_path / "b.onnx").write_bytes(b"not onnx")
    assert onnx_io.model_sha256(tmp_path / "b.onnx") == onnx_io.sha256_file(tmp_path / "b.onnx")


def _outputs(folder, x):
    with edgesdk.Engine(folder, backend="onnxruntime") as eng:
        return eng.infer({"x": x})["logits"]


def test_build_of_a_large_model_with_plugins_equals_the_ordinary_build(tmp_path, monkeypatch):
    """The bundled ViT with external data, every path of the large-model code (quantize through a file with external
    data, probes and verification through arrays handed to ONNX Runtime, the build folder with model.onnx.data,
    `check`, the runtime) against the same build without: bit-identical weights and outputs."""
    src = tmp_path / "src" / "digits.onnx"
    src.parent.mkdir()
    onnx.save(onnx.load(str(DIGITS)), str(src), save_as_external_data=True, location="digits.weights",
              size_threshold=256)
    cfg = dict(calibration=CALIB, kernels="bitmap", sparsity=0.5, prune="magnitude", calibration_count=8,
               verify_count=4)
    small = build(src, BuildConfig(output=tmp_path / "small", **cfg))
    monkeypatch.setattr(onnx_io, "EXTERNAL_DATA_BYTES", 100)
    large = build(src, BuildConfig(output=tmp_path / "large", **cfg))
    assert large["verified"] and small["verified"]
    assert [r["kernel"] for r in large["layers"]] == [r["kernel"] for r in small["layers"]]
    assert "bitmap" in {r["kernel"] for r in large["layers"]}
    assert sorted(p.name for p in (tmp_path / "large").iterdir()) == ["manifest.json", "model.onnx",
                                                                      "model.onnx.data", "report.json"]
    man = json.loads((tmp_path / "large" / "manifest.json").read_text())
    assert set(man["files"]) == {"model.onnx", "model.onnx.data", "report.json"}
    assert large["model"]["sha256"] == onnx_io.model_sha256(src) != onnx_io.sha256_file(src)
    a, b = onnx_io.load_model(tmp_path / "small" / "model.onnx"), onnx_io.load_model(tmp_path / "large" / "model.onnx")
    weights = [{t.name: (t.data_type, numpy_helper.to_array(t).tobytes()) for t in m.graph.initializer} for m in (a, b)]
    assert weights[0] == weights[1]
    x = np.load(CALIB)[np.load(CALIB).files[0]][:3].astype(np.float32)
    np.testing.assert_array_equal(_outputs(tmp_path / "large", x), _outputs(tmp_path / "small", x))
    rows = check_build(tmp_path / "large")
    assert [(r["against"], r["passed"]) for r in rows] == [(r["against"], r["passed"]) for r in large["verify"]]
    assert all(r["passed"] for r in rows if r["gate"])
    # a changed weight file of the original is noticed
    w = tmp_path / "src" / "digits.weights"
    data = bytearray(w.read_bytes())
    data[100] ^= 1
    w.write_bytes(bytes(data))
    with pytest.raises(EdgeSDKError, match="not the model this folder was built from"):
        check_build(tmp_path / "large")
    # and a changed data file of the build folder
    shutil.copy(tmp_path / "large" / "model.onnx.data", tmp_path / "keep")
    d = bytearray((tmp_path / "large" / "model.onnx.data").read_bytes())
    d[-1] ^= 1
    (tmp_path / "large" / "model.onnx.data").write_bytes(bytes(d))
    with pytest.raises(EdgeSDKError, match="model.onnx.data is missing or changed"):
        check_build(tmp_path / "large")


def test_a_model_over_2_gib_builds(tmp_path):
    """The real thing: 2.15 GB of fp32 weights in eight linears on one input (protobuf refuses to serialize the
    model whole). Wide and narrow (K = 1 050 000, N = 64) because onnxruntime < 1.20 quantizes per channel in time
    quadratic in N."""
    k, n, parts = 1_050_000, 64, 8
    rng = np.random.default_rng(5)
    nodes, inits = [], []
    for i in range(parts):
        w = rng.standard_normal((k, n), dtype=np.float32)
        w *= np.float32(1 / np.sqrt(k))
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"fc{i}"))
    del w
    nodes.append(helper.make_node("Concat", [f"y{i}" for i in range(parts)], ["y"], axis=-1, name="cat"))
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, n * parts])], inits)
    del inits
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    del g
    assert onnx_io.model_nbytes(m) == parts * k * n * 4 > 2**31
    with pytest.raises((EncodeError, ValueError)):  # upb / pure-Python protobuf
        m.SerializeToString()
    onnx.save(m, str(tmp_path / "big.onnx"), save_as_external_data=True, location="big.onnx_data")
    del m
    report = build(tmp_path / "big.onnx", BuildConfig(output=tmp_path / "out", calibration_count=2, verify_count=2))
    assert report["verified"], report["verify"]
    assert len(report["layers"]) == parts and all(r["quantized"] for r in report["layers"])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["manifest.json", "model.onnx", "report.json"]
