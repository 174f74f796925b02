"""The build pipeline on the bundled digits ViT: folder contents, report/manifest contracts, atomicity, check."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgesdk.build import build, check_build
from edgesdk.config import BuildConfig
from edgesdk.errors import EdgeSDKError
from edgesdk.inspect import find_linears, quant_state
from edgesdk.onnx_io import sha256_file

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "models" / "digits_vit.onnx"
CALIB = ROOT / "calibration" / "digits.npz"
LAYER_KEYS = {"name", "kind", "shape", "quantized", "sparsity", "kernel", "bytes_dense", "bytes_packed", "reason",
              "measured", "choice", "smooth_alpha", "sqnr_db", "sqnr_act_db", "sqnr_weight_db",
              "sqnr_by_shape"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("b") / "digits"
    cfg = BuildConfig(output=out, calibration=CALIB, kernels="none", calibration_count=32, verify_count=8)
    return out, build(DIGITS, cfg)


def test_build_folder_contents(built):
    out, report = built
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.onnx", "report.json"]
    assert json.loads((out / "report.json").read_text()) == json.loads(json.dumps(report, default=str))
    m = onnx.load(str(out / "model.onnx"))
    assert m.ir_version == 10 and quant_state(m) == "qdq"
    assert all(li.quantized for li in find_linears(m))
    assert not list(out.parent.glob(".digits.*")), "temporary folders left behind"


def test_report_contract(built):
    out, r = built
    assert r["device"]["name"] == "orin" and r["device"]["compute_capability"] == "8.7"
    assert r["model"]["sha256"] == sha256_file(DIGITS) and r["model"]["path"] == str(DIGITS.resolve())
    assert r["model"]["inputs"] == [{"name": "x", "dtype": "float", "shape": ["batch", 1, 8, 8]}]
    assert r["model"]["outputs"][0]["name"] == "logits"
    assert len(r["layers"]) == 9  # 2 blocks × (qkv, proj, fc1, fc2) + head
    for row in r["layers"]:
        assert set(row) == LAYER_KEYS
        assert row["quantized"] and row["kernel"] == "none" and row["reason"] == "kernels=none"
        k, n = row["shape"]
        assert row["bytes_dense"] == k * n + 4 * n
        assert 25 < row["sqnr_db"] <= min(row["sqnr_act_db"], row["sqnr_weight_db"]) and row["smooth_alpha"] is None
        assert row["sqnr_by_shape"] == {"build": row["sqnr_db"]}  # one shape verified (only the batch is dynamic)
    assert {row["name"] for row in r["layers"]} >= {"blocks.0.qkv", "blocks.1.fc2", "head"}
    (v,) = r["verify"]
    assert v["output"] == "logits" and v["samples"] == 8 and v["runners"] == ["onnxrt-original", "onnxrt-processed"]
    assert v["passed"] and v["cosine"] > 0.999 and v["top1_agreement"] >= 0.875 and 0 < v["max_abs"] < 1
    assert r["verified"] is True
    assert r["engine"]["built"] is False and "TensorRT" in r["engine"]["reason"]


def test_manifest_hashes_every_file(built):
    out, _ = built
    man = json.loads((out / "manifest.json").read_text())
    assert set(man["files"]) == {"model.onnx", "report.json"}
    for name, digest in man["files"].items():
        assert sha256_file(out / name) == digest
    assert man["inputs"]["model"]["sha256"] == sha256_file(DIGITS)
    assert man["inputs"]["calibration"]["sha256"] == sha256_file(CALIB)
    v = man["versions"]
    assert v["onnx"] == onnx.__version__ and v["tensorrt"] == "absent" and v["edgesdk"]
    assert man["device"]["name"] == "orin" and man["engine"]["built"] is False


def test_check_reverifies_and_detects_tampering(built, tmp_path):
    out, report = built
    rows = check_build(out)
    assert rows[0]["max_abs"] == pytest.approx(report["verify"][0]["max_abs"]) and rows[0]["passed"]
    failing = check_build(out, overrides={"min_cosine": 1.0, "atol": 0.0, "rtol": 0.0})
    assert not failing[0]["passed"]
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in out.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    data = bytearray((copy / "model.onnx").read_bytes())
    data[-1] ^= 1
    (copy / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(EdgeSDKError, match="changed since the build"):
        check_build(copy)
    other = onnx.load(str(DIGITS))
    other.doc_string = "a different model"
    onnx.save(other, str(tmp_path / "other.onnx"))
    with pytest.raises(EdgeSDKError, match="not the model this folder was built from"):
        check_build(out, model_path=tmp_path / "other.onnx")
    with pytest.raises(EdgeSDKError, match="not there any more"):
        check_build(out, model_path=tmp_path / "missing.onnx")
    with pytest.raises(EdgeSDKError, match="not an edgesdk build folder"):
        check_build(tmp_path)
    with pytest.raises(EdgeSDKError, match="does not exist"):
        check_build(tmp_path / "nope")


def test_force_replaces_atomically(tmp_path):
    out = tmp_path / "o"
    cfg = BuildConfig(output=out, kernels="none", quantize="none", verify=False, calibration_count=1)
    build(DIGITS, cfg)
    first = (out / "report.json").read_text()
    with pytest.raises(EdgeSDKError, match="already exists"):
        build(DIGITS, cfg)
    assert (out / "report.json").read_text() == first
    r = build(DIGITS, cfg.model_copy(update={"force": True, "seed": 3}))
    assert r["config"]["seed"] == 3 and json.loads((out / "report.json").read_text())["config"]["seed"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]


def test_float_build_is_exact_and_already_qdq_is_kept(tmp_path):
    r = build(DIGITS, BuildConfig(output=tmp_path / "f", kernels="none", quantize="none", calibration_count=1))
    assert r["verify"][0]["max_abs"] == 0.0 and not any(row["quantized"] for row in r["layers"])
    q = tmp_path / "q" / "model.onnx"
    build(DIGITS, BuildConfig(output=q.parent, kernels="none", calibration=CALIB, verify=False))
    r2 = build(q, BuildConfig(output=tmp_path / "q2", kernels="none", calibration_count=2, verify_count=2))
    assert r2["model"]["quant_state"] == "qdq" and "used as is" in r2["notes"][0]
    assert r2["verify"][0]["max_abs"] == 0.0  # not quantized twice
    assert not any(row["sqnr_db"] is not None for row in r["layers"])  # nothing quantized: nothing measured
    for row in r2["layers"]:  # came quantized: no float weights, the activation's error only
        assert row["sqnr_weight_db"] is None and row["sqnr_db"] == row["sqnr_act_db"] > 25
    m1, m2 = onnx.load(str(q)), onnx.load(str(tmp_path / "q2" / "model.onnx"))
    assert len(m1.graph.node) == len(m2.graph.node)


def test_exclude_keeps_layers_float(tmp_path):
    r = build(DIGITS, BuildConfig(output=tmp_path / "e", kernels="none", exclude=["fc\\d", "^head$"],
                                  calibration=CALIB, verify_count=2))
    by = {row["name"]: row for row in r["layers"]}
    assert not by["head"]["quantized"] and not by["blocks.0.fc1"]["quantized"] and by["blocks.0.qkv"]["quantized"]
    assert "excluded by --exclude" in by["blocks.1.fc2"]["reason"]
    assert by["head"]["sqnr_db"] is None and by["blocks.0.qkv"]["sqnr_db"] > 25


def test_default_kernels_use_the_rewrite(tmp_path):
    """kernels=auto hands the Q/DQ model to edgesdk.rewrite.rewrite_model and reports its layer facts."""
    r = build(DIGITS, BuildConfig(output=tmp_path / "a", calibration=CALIB, verify_count=4))
    assert len(r["layers"]) == 9 and all(set(row) == LAYER_KEYS for row in r["layers"])
    assert r["verified"] is True
    np.testing.assert_equal(r["config"]["kernels"], "auto")
    # every plugin node's X and Y are typed in the file (older onnx cannot infer past a plugin node)
    m = onnx.load(tmp_path / "a" / "model.onnx")
    typed = {v.name for v in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output)
             if v.type.tensor_type.elem_type}
    plugin = [n for n in m.graph.node if n.domain == "edgesdk"]
    assert plugin and all(n.input[0] in typed and n.output[0] in typed for n in plugin)


def test_sparse_build_gates_on_the_pruned_reference(tmp_path):
    """Pruning changes the model on purpose: the accuracy cost vs the original is reported (not gating),
    and the build is verified against the pruned dense reference (same masks, plain ONNX ops)."""
    cfg = BuildConfig(output=tmp_path / "s", calibration=CALIB, kernels="vitbit", sparsity=0.5,
                      prune="magnitude", sparsity_scope="global", verify_count=4)
    r = build(DIGITS, cfg)
    against = {row["against"]: row for row in r["verify"]}
    assert set(against) == {"original", "pruned_reference"}
    assert against["original"]["gate"] is False and against["pruned_reference"]["gate"] is True
    assert against["pruned_reference"]["passed"] and against["pruned_reference"]["cosine"] > 0.9999
    assert against["original"]["cosine"] < against["pruned_reference"]["cosine"]
    assert r["verified"] is True
    rows = check_build(tmp_path / "s")
    assert [row["against"] for row in rows] == ["original", "pruned_reference"] and rows[1]["passed"]


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
def test_engine_that_cannot_run_fails_the_verification(built, tmp_path):
    """An engine the build cannot run against ONNX Runtime leaves the build unverified, with the reason (here
    the real reason: no TensorRT to load the plan); the comparison itself is `verify.compare`, tested through
    every ONNX Runtime verification."""
    from edgesdk.build import _quiet_step, engine_rows, verified

    out, report = built
    (tmp_path / "model.plan").write_bytes(b"\x01not a plan")
    rows = engine_rows(tmp_path / "model.plan", onnx.load(str(out / "model.onnx")), [{"x": np.ones((1, 1, 8, 8),
                       np.float32)}], BuildConfig(), _quiet_step)
    (row,) = rows
    assert row["against"] == "tensorrt" and row["gate"] and not row["passed"] and row["cosine"] is None
    assert row["runners"] == ["onnxrt-processed", "tensorrt-engine"]
    assert "TensorRT is not installed" in row["error"]
    assert verified(report["verify"] + rows) is False
    # at the optimization profile's ends too (--min-shape/--max-shape), each row marked with its shape
    rows = engine_rows(tmp_path / "model.plan", onnx.load(str(out / "model.onnx")), [{"x": np.ones((1, 1, 8, 8),
                       np.float32)}], BuildConfig(), _quiet_step, {"max": [{"x": np.ones((4, 1, 8, 8), np.float32)}]})
    assert [(r.get("shape"), r["samples"], r["passed"]) for r in rows] == [(None, 1, False), ("max", 1, False)]


def test_summary_shows_engine_rows_and_errors():
    from rich.console import Console

    from edgesdk.report import print_summary

    ok = dict(against="tensorrt", gate=True, output="logits", samples=4, max_abs=0.004, mean_abs=0.001,
              rel_l2=0.002, cosine=0.99999, top1_agreement=1.0, passed=True)
    bad = dict(ok, output="(engine)", max_abs=None, mean_abs=None, rel_l2=None, cosine=None, top1_agreement=None,
               passed=False, error="the engine could not be run: RuntimeError: boom")
    console = Console(width=80, record=True, color_system=None)
    print_summary({"verify": [ok, bad], "layers": []}, console)
    text = console.export_text()
    assert "Verification (ONNX Runtime and TensorRT" in text
    assert any(ln.split()[:3] == ["TensorRT", "logits", "4"] and ln.split()[-1] == "PASS" for ln in text.splitlines())
    assert any(ln.split()[:2] == ["TensorRT", "(engine)"] and ln.split()[-1] == "FAIL" and " - " in ln
               for ln in text.splitlines()), text
    assert "verification against TensorRT failed: the engine could not be run: RuntimeError: boom" in " ".join(
        text.split())
    assert "TensorRT engine:" not in text  # no engine record given: no engine line


@pytest.mark.trt
@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["bitmap", "vitbit"])
def test_build_verifies_its_engine(kernels, tmp_path):
    """Where TensorRT is installed (never here): the engine is compared with ONNX Runtime and gates the build."""
    report = build(DIGITS, BuildConfig(device="host", output=tmp_path / "o", calibration=CALIB, kernels=kernels))
    assert report["engine"]["built"], report["engine"]["reason"]
    rows = [r for r in report["verify"] if r["against"] == "tensorrt"]
    assert [r["output"] for r in rows] == ["logits"] and rows[0]["runners"] == ["onnxrt-processed", "tensorrt-engine"]
    assert all(r["passed"] for r in rows) and report["verified"] is True, rows
    assert [r["against"] for r in check_build(tmp_path / "o")][-1] == "tensorrt"


def test_force_replaces_only_build_folders(tmp_path, monkeypatch):
    """--force never deletes a folder this tool did not write, one holding an input, or the current directory."""
    cfg = BuildConfig(kernels="none", quantize="none", verify=False, calibration_count=1, force=True)
    mine = tmp_path / "m"
    mine.mkdir()
    model = mine / "digits_vit.onnx"
    model.write_bytes(DIGITS.read_bytes())
    (mine / "notes.txt").write_text("important")
    with pytest.raises(EdgeSDKError, match="holds the input"):
        build(model, cfg.model_copy(update={"output": mine}))
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("important")
    with pytest.raises(EdgeSDKError, match="not an edgesdk build folder"):
        build(DIGITS, cfg.model_copy(update={"output": other}))
    monkeypatch.chdir(other)
    for out in (Path("."), Path("..")):
        with pytest.raises(EdgeSDKError, match="current directory"):
            build(DIGITS, cfg.model_copy(update={"output": out}))
    assert sorted(p.name for p in mine.iterdir()) == ["digits_vit.onnx", "notes.txt"]
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    build(DIGITS, cfg.model_copy(update={"output": empty}))  # an empty folder is nobody's work
    assert (empty / "report.json").is_file()


def test_unwritable_destinations_fail_before_the_pipeline_and_leave_nothing(tmp_path, monkeypatch):
    import edgesdk.build as B

    cfg = BuildConfig(kernels="none", quantize="none", verify=False, calibration_count=1)
    loaded = []
    monkeypatch.setattr(B, "load_model", lambda p: loaded.append(p))

    def no_tmp(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(B.tempfile, "mkdtemp", no_tmp)
    with pytest.raises(EdgeSDKError, match="cannot be created .*Permission denied"):
        build(DIGITS, cfg.model_copy(update={"output": tmp_path / "new" / "deeper" / "o"}))
    assert not loaded and list(tmp_path.iterdir()) == []  # no work done, the parents it made removed
    monkeypatch.undo()

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(B, "write_json", full)
    with pytest.raises(EdgeSDKError, match="could not write the build folder .*No space left"):
        build(DIGITS, cfg.model_copy(update={"output": tmp_path / "a" / "o"}))
    assert list(tmp_path.iterdir()) == []


def test_check_runs_from_any_directory_and_follows_moved_inputs(tmp_path, monkeypatch):
    """The report records absolute paths; a moved model or calibration file is passed to check, and must be the
    same bytes; a manifest without its file list is refused."""
    import shutil

    calib = tmp_path / "calib.npz"
    shutil.copy(CALIB, calib)
    monkeypatch.chdir(tmp_path)
    out = Path("out") / "d"
    build(DIGITS, BuildConfig(output=out, calibration=Path("calib.npz"), kernels="none", calibration_count=8,
                              verify_count=2))
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["calibration"] == str(calib.resolve())
    monkeypatch.chdir(ROOT)
    assert check_build(tmp_path / out)[0]["passed"]
    moved = tmp_path / "moved.npz"
    calib.rename(moved)
    with pytest.raises(EdgeSDKError, match="calibration source .* not there any more"):
        check_build(tmp_path / out)
    assert check_build(tmp_path / out, calibration=moved)[0]["passed"]
    np.savez(calib, x=np.ones((10, 1, 8, 8), np.float32))
    with pytest.raises(EdgeSDKError, match="not the calibration file this folder was built with"):
        check_build(tmp_path / out, calibration=calib)
    man = tmp_path / out / "manifest.json"
    man.write_text("{}")
    with pytest.raises(EdgeSDKError, match="does not list the folder's files"):
        check_build(tmp_path / out, calibration=moved)


def test_notes_say_when_verification_reuses_calibration_or_is_skipped(tmp_path):
    few = tmp_path / "few.NPZ"  # upper-case suffixes are read too
    with np.load(CALIB) as d:
        arrays = {k: d[k][:3] for k in d.files}
    with open(few, "wb") as f:
        np.savez(f, **arrays)
    r = build(DIGITS, BuildConfig(output=tmp_path / "a", calibration=few, kernels="none", verify_count=2))
    (note,) = r["notes"]
    assert note.startswith(f"verification inputs are calibration samples: {few} holds no more than the 3")
    r = build(DIGITS, BuildConfig(output=tmp_path / "b", calibration=CALIB, kernels="none", calibration_count=8,
                                  verify_count=2))
    assert r["notes"] == []  # 8 + 2 of the file's samples: held out
    r = build(DIGITS, BuildConfig(output=tmp_path / "c", kernels="none", verify=False))
    assert r["notes"] == ["verification skipped (--no-verify)"] and r["verify"] == []
