"""`edgesdk run` / `edgesdk bench` on bad input: exit 1, one problem + fix on stderr, no traceback, nothing half-written."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from edgesdk.cli import app
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime_cli import _parse_shapes

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "models" / "digits_vit.onnx"
CALIB = ROOT / "calibration" / "digits.npz"
ORT = ["--backend", "onnxruntime"]
FAST = ["--iterations", "2", "--warmup", "0"]
runner = CliRunner()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The bundled demo built without TensorRT (input 'x', shape Nx1x8x8), once for the module."""
    out = tmp_path_factory.mktemp("rc") / "digits"
    r = runner.invoke(app, ["build", str(DIGITS), "-o", str(out), "--calibration", str(CALIB), "--quiet"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture()
def x_npy(tmp_path):
    p = tmp_path / "x.npy"
    np.save(p, np.zeros((2, 1, 8, 8), np.float32))
    return p


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_fails(r, *words, stdout_empty=True):
    """Exit 1 through the CLI's error path (not an exception CliRunner caught), message on stderr."""
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.exception, r.output)
    assert "Traceback" not in r.output and "error:" in r.stderr and "fix:" in r.stderr, r.output
    if stdout_empty:
        assert r.stdout == "", r.stdout
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def no_leftovers(folder: Path, keep=()):
    return sorted(p.name for p in folder.iterdir() if p.name not in keep) == []


# 1. --batch and --shape sizes ------------------------------------------------------------------


@pytest.mark.parametrize("batch", ["0", "-1"])
def test_bench_batch_below_one_is_exit_1(demo, batch):
    r = invoke("bench", demo, *ORT, "--batch", batch)
    assert_fails(r, f"--batch {batch} is less than 1", "--batch 1 or more")
    assert "dynamic dims" not in r.output


@pytest.mark.parametrize("spec, words", [
    ("x=2x1x8", ["input 'x' has rank 4", "Nx1x8x8", "--shape x=1x1x8x8"]),
    ("x=0x1x8x8", ["every dim must be at least 1"]),
    ("x=-2x1x8x8", ["every dim must be at least 1"]),
    ("x=2x3x8x8", ["dim 1 of input 'x' is fixed at 1", "Nx1x8x8"]),
    ("pixels=2x1x8x8", ["names no input of the model", "['x']"]),
])
def test_bench_bad_shape_is_exit_1(demo, spec, words):
    assert_fails(invoke("bench", demo, *ORT, "--shape", spec, *FAST), *words)


@pytest.mark.parametrize("flag, value, words", [
    ("--iterations", "0", ["--iterations 0 is less than 1"]),
    ("--warmup", "-1", ["--warmup -1 is less than 0"]),
    ("--seed", "-1", ["--seed -1 is less than 0"]),  # was a numpy ValueError traceback
    ("--batch", str(10 ** 18), ["does not fit in memory", "smaller --batch"]),  # was a numpy ValueError traceback
])
def test_bench_other_numbers_are_exit_1(demo, flag, value, words):
    assert_fails(invoke("bench", demo, *ORT, *FAST, flag, value), *words)


# 2. output paths -------------------------------------------------------------------------------


def test_outputs_create_missing_parent_folders(demo, x_npy, tmp_path):
    r = invoke("bench", demo, *ORT, *FAST, "--json", tmp_path / "new" / "deep" / "b.json")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "new" / "deep" / "b.json").read_text())["iterations"] == 2
    assert no_leftovers(tmp_path / "new" / "deep", keep=("b.json",))
    r = invoke("run", demo, *ORT, "-i", x_npy, "-o", tmp_path / "out" / "dir" / "res")
    assert r.exit_code == 0, r.output
    assert np.load(tmp_path / "out" / "dir" / "res.npz")["logits"].shape == (2, 10)
    assert no_leftovers(tmp_path / "out" / "dir", keep=("res.npz",))
    # .npz is added as np.savez adds it, never replacing another suffix
    assert invoke("run", demo, *ORT, "-i", x_npy, "-o", tmp_path / "res.v2").exit_code == 0
    assert (tmp_path / "res.v2.npz").is_file()


def test_unwritable_output_is_exit_1_before_any_work(demo, x_npy, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert_fails(invoke("bench", demo, *ORT, *FAST, "--json", blocker / "b.json"),
                 f"--json {blocker / 'b.json'} cannot be written", f"{blocker} is not a folder you can write to")
    assert_fails(invoke("run", demo, *ORT, "-i", x_npy, "-o", blocker / "sub" / "res.npz"),
                 f"--output {blocker / 'sub' / 'res.npz'} cannot be written")
    assert_fails(invoke("run", demo, *ORT, "-i", x_npy, "-o", tmp_path), f"--output {tmp_path} is a folder",
                 str(tmp_path / "outputs.npz"))
    assert_fails(invoke("bench", demo, *ORT, *FAST, "--json", tmp_path), f"--json {tmp_path} is a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "x.npy"]


def test_a_failed_write_leaves_nothing_half_written(demo, x_npy, tmp_path, monkeypatch):
    out = tmp_path / "res.npz"
    out.write_bytes(b"old")

    def disk_full(f, **arrays):
        f.write(b"PK\x03\x04 half an archive")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", disk_full)
    assert_fails(invoke("run", demo, *ORT, "-i", x_npy, "-o", out), f"cannot write {out}", "No space left")
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["res.npz", "x.npy"]


# 3. --shape syntax -----------------------------------------------------------------------------


def test_bench_shape_takes_both_build_and_bench_forms(demo, tmp_path):
    for spec in ("x=3x1x8x8", "x:3x1x8x8"):
        r = invoke("bench", demo, *ORT, *FAST, "--shape", spec, "--json", tmp_path / "b.json")
        assert r.exit_code == 0, r.output
        assert json.loads((tmp_path / "b.json").read_text())["inputs"] == {"x": [3, 1, 8, 8]}
    # split on the last '=' or ':': names may hold either
    assert _parse_shapes(["input:0:1x3", "a=b=2X4", "c:d=5"]) == {"input:0": (1, 3), "a=b": (2, 4), "c:d": (5,)}
    for bad in ("x", "x=", "=1x2", ":1x2", "x=1xa", "x2x1"):
        with pytest.raises(EdgeSDKError, match="not NAME=DxDxD or NAME:DxDxD") as e:
            _parse_shapes([bad])
        assert "x=8x1x8x8" in e.value.fix and "x:8x1x8x8" in e.value.fix
    r = invoke("bench", demo, *ORT, "--shape", "x2x1x8x8")
    assert_fails(r, "NAME=DxDxD or NAME:DxDxD", "x:8x1x8x8")


# 4. errors on stderr ---------------------------------------------------------------------------


def test_errors_go_to_stderr_like_build(demo, x_npy):
    assert_fails(invoke("build", DIGITS.with_name("missing.onnx")))  # the reference behaviour
    for r, words in ((invoke("run", demo, "-i", x_npy), ["no model.plan", "--backend onnxruntime"]),  # TensorRT: no plan
                     (invoke("bench", demo), ["no model.plan", "--backend onnxruntime"]),
                     (invoke("run", demo, *ORT, "-i", "missing.npy"), ["missing.npy does not exist"])):
        assert_fails(r, *words)
        assert r.stderr.startswith("error: ") and "\n  fix: " in r.stderr, r.stderr


# 5. --input files ------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"hello, not numpy\n", DIGITS.read_bytes()[:4096], b""],
                         ids=["text", "onnx", "empty"])
def test_run_input_that_is_not_numpy(demo, tmp_path, content):
    p = tmp_path / "in.onnx"
    p.write_bytes(content)
    r = invoke("run", demo, *ORT, "-i", p)
    assert_fails(r, f"input file {p} is not a NumPy .npy or .npz file", "np.save(")
    assert "allow_pickle" not in r.output


def test_run_input_file_missing(demo, tmp_path):
    assert_fails(invoke("run", demo, *ORT, "-i", tmp_path / "nope.npy"),
                 f"input file {tmp_path / 'nope.npy'} does not exist")


def test_run_npz_keys_must_match_input_names(demo, tmp_path, x_npy):
    x = np.zeros((2, 1, 8, 8), np.float32)
    np.savez(tmp_path / "named.npz", pixels=x)
    assert_fails(invoke("run", demo, *ORT, "-i", tmp_path / "named.npz"),
                 "named.npz holds array 'pixels', which is not an input of the model", "['x']",
                 "np.savez('inputs.npz', x=...)")
    assert_fails(invoke("run", demo, *ORT, "-i", f"pixels={x_npy}"), "names 'pixels', which is not an input")
    np.savez(tmp_path / "empty.npz")
    assert_fails(invoke("run", demo, *ORT, "-i", tmp_path / "empty.npz"), "no --input gives the model's input 'x'")
    np.savez(tmp_path / "good.npz", x=x)
    assert invoke("run", demo, *ORT, "-i", tmp_path / "good.npz").exit_code == 0


def test_run_damaged_npy_npz_are_exit_1(demo, tmp_path, x_npy):
    (tmp_path / "zip.npz").write_bytes(b"PK\x03\x04 garbage")  # was zipfile.BadZipFile
    np.savez(tmp_path / "obj.npz", x=np.array([1, None], dtype=object))  # was ValueError (lazy member read)
    (tmp_path / "short.npy").write_bytes(x_npy.read_bytes()[:150])
    for name in ("zip.npz", "obj.npz", "short.npy"):
        assert_fails(invoke("run", demo, *ORT, "-i", tmp_path / name), f"cannot read {tmp_path / name} as .npy/.npz")


def test_run_input_path_holding_equals_sign(demo, tmp_path):
    d = tmp_path / "run=3"
    d.mkdir()
    np.save(d / "x.npy", np.zeros((1, 1, 8, 8), np.float32))
    assert invoke("run", demo, *ORT, "-i", d / "x.npy").exit_code == 0


# other paths that ended in tracebacks ----------------------------------------------------------


def test_model_that_is_not_onnx_is_exit_1(tmp_path, x_npy):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "model.onnx").write_text("not onnx")  # was google.protobuf DecodeError
    assert_fails(invoke("run", tmp_path / "b", *ORT, "-i", x_npy), f"cannot load {tmp_path / 'b' / 'model.onnx'}",
                 "DecodeError", "edgesdk build")
    assert_fails(invoke("bench", tmp_path / "b", *ORT), "cannot load")


def test_runtime_failure_on_the_inputs_is_exit_1(demo, tmp_path):
    np.save(tmp_path / "empty.npy", np.zeros((0, 1, 8, 8), np.float32))  # ONNX Runtime's Reshape fails on it
    # a build folder holds inputs to the profile its TensorRT engine has (batch 1 .. --max-batch)
    assert_fails(invoke("run", demo, *ORT, "-i", tmp_path / "empty.npy"),
                 "outside the build's optimization profile (1, 1, 8, 8) .. (8, 1, 8, 8)")
    # a bare .onnx has no profile: ONNX Runtime's own failure, in one message
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "m.onnx").write_bytes((Path(demo) / "model.onnx").read_bytes())
    assert_fails(invoke("run", tmp_path / "bare" / "m.onnx", *ORT, "-i", tmp_path / "empty.npy"),
                 "ONNX Runtime failed on inputs x 0x1x8x8", "Engine.inputs")
