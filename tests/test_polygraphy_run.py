"""`polygraphy run --edgesdk-onnxrt / --edgesdk-trt` (edgesdk/polygraphy_run.py) on a built demo."""

import importlib.util
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from edgesdk.cli import app
from edgesdk.ort import make_session

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "digits_vit.onnx"


def polygraphy(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from polygraphy.tools import main; sys.exit(main())",
                           *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The INT8 demo with bitmap-linear plugin nodes, as `edgesdk build` writes it."""
    out = tmp_path_factory.mktemp("pg") / "digits"
    r = CliRunner().invoke(app, ["build", str(DEMO), "-o", str(out), "--calibration", str(ROOT / "calibration" / "digits.npz"),
                                 "--kernels", "bitmap", "--no-verify", "--quiet"])
    assert r.exit_code == 0, r.output
    return out


def test_entry_point_is_registered():
    eps = metadata.entry_points(group="polygraphy.run.plugins")
    assert "edgesdk" in eps.names, "reinstall edgesdk (pip install -e .) to register its polygraphy extension"
    groups = eps["edgesdk"].load()()
    assert [g.get_name_opt()[1] for g in groups] == ["edgesdk-onnxrt", "edgesdk-trt"]


def test_edgesdk_onnxrt_runner(built, tmp_path):
    model = built / "model.onnx"
    # plain ONNX Runtime does not know the plugin nodes: the reason this runner exists
    r = polygraphy("run", model, "--onnxrt", cwd=tmp_path)
    assert r.returncode != 0 and "EdgeBitmapLinear" in r.stdout + r.stderr
    # the runner gives what edgesdk.ort.make_session gives, bit for bit
    r = polygraphy("run", model, "--edgesdk-onnxrt", "--input-shapes", "x:[3,1,8,8]", "--save-inputs", "in.json",
                   "--save-outputs", "out.json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    from polygraphy.comparator import RunResults
    from polygraphy.json import load_json

    feeds = load_json(tmp_path / "in.json")[0]
    (_, [out]), = RunResults.load(str(tmp_path / "out.json")).items()
    assert feeds["x"].shape == (3, 1, 8, 8) and np.ptp(feeds["x"]) > 0
    want = make_session(model).run(["logits"], {"x": feeds["x"]})[0]
    np.testing.assert_array_equal(out["logits"], want)
    # and it compares with the original float model on ONNX Runtime (INT8 costs a little: mean error)
    r = polygraphy("run", DEMO, "--onnxrt", "--input-shapes", "x:[3,1,8,8]", "--save-outputs", "ref.json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = polygraphy("run", model, "--edgesdk-onnxrt", "--input-shapes", "x:[3,1,8,8]", "--load-outputs", "ref.json",
                   "--check-error-stat", "mean", "--atol", "0.1", "--rtol", "0.1", cwd=tmp_path)
    assert r.returncode == 0 and "PASSED" in r.stdout + r.stderr, r.stdout + r.stderr


def test_edgesdk_trt_runner_script(built, tmp_path):
    """Without TensorRT here, only the script `polygraphy run` would execute is checked: the plugin creators are
    registered before TensorRT parses the model, and every --trt option reaches the TensorRT runner."""
    r = polygraphy("run", built / "model.onnx", "--edgesdk-trt", "--strongly-typed", "--edgesdk-onnxrt",
                   "--gen-script", "run.py", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    script = (tmp_path / "run.py").read_text()
    assert "from edgesdk.polygraphy_run import SessionFromEdgeOnnx, register_trt_plugins" in script
    register = script.index("edgesdk_plugins = register_trt_plugins()")
    assert register < script.index("NetworkFromOnnxPath(") < script.index("TrtRunner(")
    assert "strongly_typed=True" in script and "OnnxrtRunner(build_edgesdk_onnxrt_session)" in script
    compile(script, "run.py", "exec")


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
def test_edgesdk_trt_without_tensorrt_says_what_to_do(built, tmp_path):
    r = polygraphy("run", built / "model.onnx", "--edgesdk-trt", "--strongly-typed", cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Traceback" not in out, out
    assert "--edgesdk-trt: TensorRT is not installed" in out and "--edgesdk-onnxrt alone" in out, out
