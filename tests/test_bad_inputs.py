"""Every bad input of issue 2 gets one clear message (problem + fix), exit code != 0, and nothing left behind."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from edgesdk.cli import app

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "models" / "digits_vit.onnx"


def _run(args, tmp_path):
    """Run the CLI; assert failure with problem + fix; assert the destination folder holds nothing new."""
    before = sorted(p.name for p in tmp_path.iterdir())
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 1, r.output
    assert "error:" in r.output and "fix:" in r.output, r.output
    after = sorted(p.name for p in tmp_path.iterdir())
    assert after == before, f"left behind: {set(after) - set(before)}"
    return " ".join(r.output.split())


def _linear_model(path: Path, x_shape, opset: int = 17) -> Path:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32), "fc.weight")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "fc.weight"], ["y"], name="fc")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x_shape[:-1]) + [5])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), str(path))
    return path


def test_not_an_onnx_file(tmp_path):
    bad = tmp_path / "notes.onnx"
    bad.write_text("this is a text file, not a model\n" * 20)
    msg = _run(["build", str(bad), "-o", str(tmp_path / "out")], tmp_path)
    assert "not an ONNX" in msg and "re-export" in msg


def test_truncated_file(tmp_path):
    data = DIGITS.read_bytes()
    bad = tmp_path / "cut.onnx"
    bad.write_bytes(data[: len(data) // 2])
    msg = _run(["build", str(bad), "-o", str(tmp_path / "out")], tmp_path)
    assert "truncated" in msg and str(bad) in msg


def test_missing_and_empty_file(tmp_path):
    assert "does not exist" in _run(["build", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "o")], tmp_path)
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert "empty" in _run(["build", str(tmp_path / "empty.onnx"), "-o", str(tmp_path / "o")], tmp_path)


@pytest.mark.parametrize("version", [99, 9])
def test_unknown_or_too_old_opset(tmp_path, version):
    m = _linear_model(tmp_path / "m.onnx", [2, 8], opset=version)
    msg = _run(["build", str(m), "-o", str(tmp_path / "out")], tmp_path)
    assert f"opset {version}" in msg and "opset_version=17" in msg


def test_dynamic_dims_without_shape_hint(tmp_path):
    m = _linear_model(tmp_path / "m.onnx", ["batch", "seq", 8])
    msg = _run(["build", str(m), "-o", str(tmp_path / "out")], tmp_path)
    assert "dynamic dims" in msg and "--shape x:1xNx8" in msg
    # the hint fixes it
    r = CliRunner().invoke(app, ["build", str(m), "-o", str(tmp_path / "out"), "--shape", "x:2x3x8", "--quiet",
                                 "--kernels", "none"])
    assert r.exit_code == 0, r.output


def test_bad_shape_hints(tmp_path):
    m = _linear_model(tmp_path / "m.onnx", ["batch", 8])
    assert "does not have" in _run(["build", str(m), "-o", str(tmp_path / "o"), "--shape", "y:1x8"], tmp_path)
    assert "does not fit" in _run(["build", str(m), "-o", str(tmp_path / "o"), "--shape", "x:1x9"], tmp_path)
    assert "bad shape hint" in _run(["build", str(m), "-o", str(tmp_path / "o"), "--shape", "x:1xq"], tmp_path)


def test_calibration_that_does_not_match(tmp_path):
    np.savez(tmp_path / "wrong_name.npz", image=np.zeros((4, 1, 8, 8), np.float32), extra=np.zeros(3))
    msg = _run(["build", str(DIGITS), "-o", str(tmp_path / "o"), "--calibration", str(tmp_path / "wrong_name.npz")],
               tmp_path)
    assert "does not match the model inputs" in msg and "'x'" in msg
    np.savez(tmp_path / "wrong_shape.npz", x=np.ones((4, 1, 7, 8), np.float32))
    msg = _run(["build", str(DIGITS), "-o", str(tmp_path / "o"), "--calibration", str(tmp_path / "wrong_shape.npz")],
               tmp_path)
    assert "does not match the model inputs" in msg and "[4, 1, 7, 8]" in msg
    np.savez(tmp_path / "wrong_type.npz", x=np.ones((4, 1, 8, 8), np.int64))
    msg = _run(["build", str(DIGITS), "-o", str(tmp_path / "o"), "--calibration", str(tmp_path / "wrong_type.npz")],
               tmp_path)
    assert "does not match the model inputs" in msg and "int64" in msg
    (tmp_path / "garbage.npz").write_bytes(b"PK not really")
    msg = _run(["build", str(DIGITS), "-o", str(tmp_path / "o"), "--calibration", str(tmp_path / "garbage.npz")],
               tmp_path)
    assert "cannot read calibration file" in msg


def test_model_without_linear_layers(tmp_path):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(tmp_path / "r.onnx"))
    msg = _run(["build", str(tmp_path / "r.onnx"), "-o", str(tmp_path / "out")], tmp_path)
    assert "no linear layers" in msg


def test_unwritable_output_folder(tmp_path):
    (tmp_path / "a_file").write_text("x")
    msg = _run(["build", str(DIGITS), "-o", str(tmp_path / "a_file" / "out")], tmp_path)
    assert "cannot be written" in msg and "-o" in msg


def test_existing_output_needs_force(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    msg = _run(["build", str(DIGITS), "-o", str(tmp_path / "out")], tmp_path)
    assert "already exists" in msg and "--force" in msg
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"


def test_qoperator_model_is_refused(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    w = numpy_helper.from_array(np.ones((8, 5), np.int8), "w")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dq"),
             helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["y"], name="mmi")]
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 5])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(tmp_path / "q.onnx"))
    msg = _run(["build", str(tmp_path / "q.onnx"), "-o", str(tmp_path / "out")], tmp_path)
    assert "QOperator" in msg and "MatMulInteger" in msg and "Q/DQ" in msg


def test_bad_options(tmp_path):
    assert "unknown device" in _run(["build", str(DIGITS), "-o", str(tmp_path / "o"), "-d", "tx2"], tmp_path)
    msg = _run(["build", str(DIGITS), "-o", str(tmp_path / "o"), "--quantize", "int4"], tmp_path)
    assert "quantize" in msg and "'int8'" in msg
    assert "not a valid regex" in _run(["build", str(DIGITS), "-o", str(tmp_path / "o"), "--exclude", "blocks["], tmp_path)
    (tmp_path / "c.yaml").write_text("devise: orin\n")
    assert "devise" in _run(["build", str(DIGITS), "-o", str(tmp_path / "o"), "--config", str(tmp_path / "c.yaml")],
                            tmp_path)


def test_missing_external_data(tmp_path):
    m = onnx.load(str(DIGITS))
    onnx.save(m, str(tmp_path / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.onnx.data", size_threshold=0)
    (tmp_path / "ext.onnx.data").rename(tmp_path / "elsewhere.data")
    text = _run(["build", str(tmp_path / "ext.onnx"), "-o", str(tmp_path / "out")], tmp_path)
    assert "external weight data cannot be read" in text and "next to its external data" in text


def test_bad_exclude_regex_in_inspect(tmp_path):
    text = _run(["inspect", str(DIGITS), "--exclude", "["], tmp_path)
    assert "--exclude '[' is not a valid regular expression" in text


def test_dla_core_the_device_does_not_have(tmp_path):
    text = _run(["build", str(DIGITS), "-o", str(tmp_path / "o"), "--device", "orin-nano-4", "--use-dla-core", "0"],
                tmp_path)
    assert "orin-nano-4 has 0 DLA core(s)" in text and "leave --use-dla-core out" in text
    text = _run(["build", str(DIGITS), "-o", str(tmp_path / "o"), "--use-dla-core", "2"], tmp_path)
    assert "orin has 2 DLA core(s) (0 to 1)" in text and "pass 0 to 1" in text


def test_a_build_output_is_not_built_again(tmp_path):
    out = tmp_path / "b"
    assert CliRunner().invoke(app, ["build", str(DIGITS), "-o", str(out), "--quiet", "--no-verify"]).exit_code == 0
    text = _run(["build", str(out / "model.onnx"), "-o", str(tmp_path / "again")], tmp_path)
    assert "already an edgesdk build" in text and "build the original model" in text
    r = CliRunner().invoke(app, ["inspect", str(out / "model.onnx")])
    assert r.exit_code == 0 and "an edgesdk build: plugin nodes EdgeVitBitGemm 8" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["inspect", str(out / "model.onnx"), "--json"])
    assert json.loads(r.output)["plugin_nodes"] == {"EdgeVitBitGemm": 8}
