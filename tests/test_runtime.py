"""edgesdk.Engine and `edgesdk run/bench` without TensorRT: the ONNX Runtime backend, errors, CLI."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import typer
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

import edgesdk
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime import Engine, find_build
from edgesdk.runtime_cli import benchmark, random_inputs, register

RNG = np.random.default_rng(60)
HAVE_TRT = importlib.util.find_spec("tensorrt") is not None
W = RNG.standard_normal((13, 7)).astype(np.float32)
B = RNG.standard_normal(7).astype(np.float32)


@pytest.fixture()
def build_dir(tmp_path):
    """A build folder as `edgesdk build` writes it without TensorRT: ONNX + manifest, no plan."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 13])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 7])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "B"], ["a"]),
                           helper.make_node("Relu", ["a"], ["y"])], "g", [x], [y],
                          [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(m, tmp_path / "model.onnx")
    (tmp_path / "manifest.json").write_text(json.dumps({"engine": {"built": False, "tensorrt": "absent",
                                                                    "cuda": None, "compute_capability": None}}))
    return tmp_path


def _ref(x):
    return np.maximum(x.astype(np.float64) @ W + B, 0)


def test_onnxruntime_backend_matches_numpy(build_dir):
    x = RNG.standard_normal((5, 13)).astype(np.float32)
    with edgesdk.Engine(build_dir, backend="onnxruntime") as eng:
        assert [(t.name, t.shape, t.dtype) for t in eng.inputs] == [("x", (-1, 13), np.float32)]
        assert [t.name for t in eng.outputs] == ["y"]
        y = eng.infer({"x": x})["y"]
        y2 = eng.infer({"x": x[:2]})["y"]  # dynamic batch
    np.testing.assert_allclose(y, _ref(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y2, _ref(x[:2]), rtol=1e-5, atol=1e-5)
    with pytest.raises(EdgeSDKError, match="closed"):
        eng.infer({"x": x})
    eng.close()  # idempotent


def test_bad_inputs_name_problem_and_fix(build_dir):
    eng = Engine(build_dir / "model.onnx", backend="onnxruntime")
    x = RNG.standard_normal((2, 13)).astype(np.float32)
    with pytest.raises(EdgeSDKError, match=r"missing \['x'\], unknown \['z'\]"):
        eng.infer({"z": x})
    with pytest.raises(EdgeSDKError, match="(?s)float64.*astype"):
        eng.infer({"x": x.astype(np.float64)})
    with pytest.raises(EdgeSDKError, match=r"shape \(2, 12\)"):
        eng.infer({"x": x[:, :12]})
    with pytest.raises(EdgeSDKError, match="shape"):
        eng.infer({"x": x[None]})
    # non-contiguous host arrays are fine (copied)
    np.testing.assert_allclose(eng.infer({"x": np.asfortranarray(x)})["y"], _ref(x), rtol=1e-5, atol=1e-5)
    eng.close()


def test_tensorrt_is_never_a_silent_fallback(build_dir):
    # no model.plan (built without TensorRT): asking for TensorRT names the problem and the way out
    with pytest.raises(EdgeSDKError, match="no model.plan") as e:
        Engine(build_dir)
    assert "backend='onnxruntime'" in e.value.fix
    (build_dir / "model.plan").write_bytes(b"\0" * 64)
    with pytest.raises(EdgeSDKError, match="built without TensorRT"):  # the manifest says so
        Engine(build_dir)
    (build_dir / "manifest.json").unlink()
    if not HAVE_TRT:
        with pytest.raises(EdgeSDKError, match="needs TensorRT"):
            Engine(build_dir)
    with pytest.raises(EdgeSDKError, match="unknown backend"):
        Engine(build_dir, backend="cuda")
    with pytest.raises(EdgeSDKError, match="does not exist"):
        Engine(build_dir / "nope")
    with pytest.raises(EdgeSDKError, match="cuda_graph"):
        Engine(build_dir, backend="onnxruntime", cuda_graph=True)


def test_find_build(build_dir, tmp_path_factory):
    b = find_build(build_dir)
    assert b.plan is None and b.onnx == build_dir / "model.onnx" and b.manifest["engine"]["tensorrt"] == "absent"
    (build_dir / "model.plan").write_bytes(b"x")
    assert find_build(build_dir / "model.plan").plan == build_dir / "model.plan"
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(EdgeSDKError, match="neither"):
        find_build(empty)
    (empty / "manifest.json").write_text("{not json")
    (empty / "m.onnx").write_bytes(b"")
    with pytest.raises(EdgeSDKError, match="not valid JSON"):
        find_build(empty)


def test_benchmark_and_random_inputs(build_dir):
    with Engine(build_dir, backend="onnxruntime") as eng:
        feeds = random_inputs(eng.inputs, batch=3, seed=1)
        assert feeds["x"].shape == (3, 13) and feeds["x"].dtype == np.float32 and feeds["x"].std() > 0.5
        r = benchmark(eng, feeds, warmup=1, iterations=7)
    lat = r["latency_ms"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert r["samples_per_inference"] == 3
    assert r["throughput"]["samples_per_s"] == pytest.approx(3 * r["throughput"]["inferences_per_s"])
    with pytest.raises(EdgeSDKError, match="dynamic dims"):
        random_inputs([edgesdk.runtime.TensorInfo("x", (1, -1), np.dtype(np.float32))])


def _cli():
    app = typer.Typer()
    register(app)
    return app


def test_cli_run_and_bench(build_dir, tmp_path):
    x = RNG.standard_normal((4, 13)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    app, runner = _cli(), CliRunner()
    r = runner.invoke(app, ["run", str(build_dir), "--input", str(tmp_path / "x.npy"), "--backend", "onnxruntime",
                            "--output", str(tmp_path / "out.npz")])
    assert r.exit_code == 0, r.output
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], _ref(x), rtol=1e-5, atol=1e-5)
    np.savez(tmp_path / "in.npz", x=x)
    r = runner.invoke(app, ["run", str(build_dir), "-i", f"x={tmp_path / 'x.npy'}", "--backend", "onnxruntime"])
    assert r.exit_code == 0 and "(4, 7)" in r.output, r.output
    r = runner.invoke(app, ["run", str(build_dir), "-i", str(tmp_path / "in.npz"), "--backend", "onnxruntime"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["run", str(build_dir), "-i", str(tmp_path / "x.npy")])  # tensorrt: no plan
    # the fix is given in the command line's words, not Engine's arguments
    assert r.exit_code == 1 and "fix:" in r.output and "--backend onnxruntime" in r.output, r.output
    assert "Engine(" not in r.output and "backend='" not in r.output, r.output
    r = runner.invoke(app, ["bench", str(build_dir), "--backend", "onnxruntime", "--cuda-graph"])
    assert r.exit_code == 1 and "--cuda-graph needs the TensorRT backend" in r.output, r.output
    assert "drop --cuda-graph" in r.output and "cuda_graph" not in r.output, r.output
    r = runner.invoke(app, ["bench", str(build_dir), "--backend", "onnxruntime", "--batch", "2",
                            "--iterations", "5", "--warmup", "1", "--json", str(tmp_path / "b.json")])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "b.json").read_text())
    assert res["inputs"] == {"x": [2, 13]} and res["iterations"] == 5 and res["latency_ms"]["p99"] > 0


DEMO = Path(__file__).resolve().parents[1] / "models" / "digits_vit.onnx"


@pytest.mark.parametrize("kernels", ["bitmap", "vitbit"])
def test_onnxruntime_backend_on_the_bundled_demo(kernels, tmp_path):
    """Build the demo (INT8 + plugin nodes) without TensorRT, run the build folder through Engine."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from edgesdk.build import build
    from edgesdk.config import BuildConfig
    from edgesdk.ort import make_session

    report = build(DEMO, BuildConfig(output=tmp_path / "demo", kernels=kernels, verify=False))
    assert report["engine"]["built"] is False and "TensorRT is not installed" in report["engine"]["reason"]
    assert any(layer.get("kernel") == kernels for layer in report["layers"])
    digits = load_digits()
    _, x_test, _, y_test = train_test_split((digits.images / 16).astype(np.float32)[:, None], digits.target,
                                            test_size=0.25, random_state=0, stratify=digits.target)
    with Engine(tmp_path / "demo", backend="onnxruntime") as eng:
        assert [t.name for t in eng.inputs] == ["x"] and eng.inputs[0].shape == (-1, 1, 8, 8)
        # the build's TensorRT profile (batch 1 .. 8) holds on the CPU too: what runs here runs on the Jetson
        assert eng.profile == {"x": ((1, 1, 8, 8), (1, 1, 8, 8), (8, 1, 8, 8))}
        with pytest.raises(EdgeSDKError, match=r"outside the build's optimization profile") as e:
            eng.infer({"x": x_test})
        assert f"--max-batch {len(x_test)}" in e.value.fix
        logits = np.concatenate([eng.infer({"x": x_test[i:i + 8]})["logits"] for i in range(0, len(x_test), 8)])
        with pytest.raises(EdgeSDKError, match="no model.plan"):
            Engine(tmp_path / "demo")  # the TensorRT backend is never chosen silently
    # plan checks against the manifest the build wrote
    manifest_path = tmp_path / "demo" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["engine"]["tensorrt"] == "absent"
    (tmp_path / "demo" / "model.plan").write_bytes(b"\0" * 256)  # a plan that appeared without a TensorRT build
    with pytest.raises(EdgeSDKError, match="built without TensorRT") as e:
        Engine(tmp_path / "demo")
    assert "rebuild" in e.value.fix
    manifest["engine"].update(built=True, tensorrt="10.3.0.30", cuda="12.6", compute_capability="8.7")
    manifest_path.write_text(json.dumps(manifest))
    if not HAVE_TRT:
        with pytest.raises(EdgeSDKError, match=r"needs TensorRT 10\.3\.0\.30, which is not installed"):
            Engine(tmp_path / "demo")
    ref = make_session(DEMO).run(None, {"x": x_test})[0]
    assert logits.shape == (len(x_test), 10) and np.all(np.isfinite(logits))
    agree = np.mean(logits.argmax(1) == ref.argmax(1))
    top1 = np.mean(logits.argmax(1) == y_test)
    assert agree >= 0.98 and top1 >= 0.9, (agree, top1)  # measured: 1.0 and 0.924 (= float model)


def test_api_misuse_gets_problem_and_fix(build_dir, tmp_path):
    """What a first-time caller gets wrong: feeds not a dict, bad arguments, an .onnx for the TensorRT backend,
    a damaged model, ONNX Runtime failing; every one an EdgeSDKError naming the fix."""
    x = RNG.standard_normal((2, 13)).astype(np.float32)
    with Engine(build_dir, backend="onnxruntime") as eng:
        assert eng.profile is None  # no report.json: not a build folder, any batch
        for bad in (x, [x], None):
            with pytest.raises(EdgeSDKError, match="infer takes a dict") as e:
                eng.infer(bad)
            assert e.value.fix == "feed {'x': array}"
        with pytest.raises(EdgeSDKError, match=r"x\.astype\(np\.float32\)"):  # the input's name, a real numpy name
            eng.infer({"x": x.astype(np.float64)})
        assert isinstance(eng.inputs, tuple) and isinstance(eng.outputs, tuple)  # not the backend's own lists
    assert "Engine" in dir(edgesdk) and "Engine" in edgesdk.__all__  # tab completion
    for threads in ("4", 2.5, 0, True):
        with pytest.raises(EdgeSDKError, match="not a thread count"):
            Engine(build_dir, backend="onnxruntime", threads=threads)
    with pytest.raises(EdgeSDKError, match="not a str or Path"):
        Engine(None)
    (build_dir / "model.plan").write_bytes(b"\0" * 64)
    with pytest.raises(EdgeSDKError, match="is an ONNX model; the TensorRT backend runs a plan") as e:
        Engine(build_dir / "model.onnx")
    assert str(build_dir / "model.plan") in e.value.fix
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.onnx").write_text("not onnx")
    with pytest.raises(EdgeSDKError, match="ONNX Runtime cannot load .*DecodeError"):
        Engine(bad, backend="onnxruntime")
    two = tmp_path / "two"
    two.mkdir()
    for n in ("a.onnx", "b.onnx"):
        (two / n).write_bytes((build_dir / "model.onnx").read_bytes())
    with pytest.raises(EdgeSDKError, match=r"several ONNX models \(a.onnx, b.onnx\)"):
        Engine(two, backend="onnxruntime")


def test_onnx_runtime_failures_are_edgesdk_errors(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 13])
    g = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "g", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, -1])],
                          [numpy_helper.from_array(np.array([2, -1], np.int64), "s")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), tmp_path / "r.onnx")
    with Engine(tmp_path / "r.onnx", backend="onnxruntime") as eng:
        assert eng.infer({"x": np.ones((2, 13), np.float32)})["y"].shape == (2, 13)
        with pytest.raises(EdgeSDKError, match=r"ONNX Runtime failed on inputs x 3x13 \(.*\)") as e:
            eng.infer({"x": np.ones((3, 13), np.float32)})  # 39 values cannot be 2 rows
        assert "Engine.inputs" in e.value.fix


def test_unknown_rank_inputs_are_fed_as_given(tmp_path):
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, None)  # no shape at all
    g = helper.make_graph([helper.make_node("Relu", ["a"], ["b"])], "g", [a],
                          [helper.make_tensor_value_info("b", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), tmp_path / "u.onnx")
    with Engine(tmp_path / "u.onnx", backend="onnxruntime") as eng:
        assert eng.inputs[0].shape is None
        x = RNG.standard_normal((2, 3)).astype(np.float32)
        np.testing.assert_array_equal(eng.infer({"a": x})["b"], np.maximum(x, 0))
        assert "a[?]" in repr(eng)
