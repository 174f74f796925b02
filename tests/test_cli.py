"""The edgesdk CLI: help, devices, inspect, build with a YAML config + overriding flags, check, config parsing."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgesdk.cli import app
from edgesdk.config import BuildConfig, load_config, parse_shape
from edgesdk.errors import EdgeSDKError

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "models" / "digits_vit.onnx"
CALIB = ROOT / "calibration" / "digits.npz"
runner = CliRunner()


@pytest.mark.parametrize("cmd", ["build", "inspect", "check", "devices", "pack"])
def test_help_teaches(cmd):
    r = runner.invoke(app, [cmd, "--help"])
    assert r.exit_code == 0, r.output
    assert "Usage" in r.output


def test_build_help_lists_kebab_case_flags():
    out = runner.invoke(app, ["build", "--help"], terminal_width=200).output
    for flag in ("--device", "--output", "--calibration-count", "--shape", "--include-lm-head", "--min-cosine",
                 "--no-verify", "--config", "--exclude", "--kernels", "--measure", "--sparsity"):
        assert flag in out, flag
    assert "edgesdk build models/digits_vit.onnx" in out


def test_devices_lists_profiles_as_json():
    r = runner.invoke(app, ["devices", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["orin"]["sm_count"] == 16 and data["orin-nano-4"]["dla_cores"] == 0 and "host" in data


def test_inspect_json_and_table():
    r = runner.invoke(app, ["inspect", str(DIGITS), "--json", "--exclude", "head"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["quant_state"] == "float" and info["opset"] == 17 and len(info["linears"]) == 9
    head = next(li for li in info["linears"] if li["name"] == "head")
    assert head["kind"] == "Gemm" and (head["k"], head["n"]) == (64, 10) and not head["selected"]
    qkv = next(li for li in info["linears"] if li["name"] == "blocks.0.qkv")
    assert (qkv["k"], qkv["n"], qkv["weight_layout"]) == (64, 192, "KN") and qkv["selected"]
    r = runner.invoke(app, ["inspect", str(DIGITS)], terminal_width=200)
    assert r.exit_code == 0 and "blocks.1.fc2" in r.output and "128×64" in r.output


def test_build_with_yaml_config_and_flag_override_then_check(tmp_path):
    cfg = tmp_path / "build.yaml"
    cfg.write_text(f"device: orin-nx-16\nkernels: none\ncalibration: {CALIB}\ncalibration-count: 8\nverify_count: 2\n"
                   "exclude: ['^head$']\n")
    out = tmp_path / "b"
    r = runner.invoke(app, ["build", str(DIGITS), "-o", str(out), "--config", str(cfg), "--verify-count", "3"],
                      terminal_width=200)
    assert r.exit_code == 0, r.output
    report = json.loads((out / "report.json").read_text())
    assert report["device"]["name"] == "orin-nx-16" and report["config"]["verify_count"] == 3
    assert report["config"]["calibration_count"] == 8 and report["verify"][0]["samples"] == 3
    assert "Verification" in r.output and "PASS" in r.output and "blocks.0.qkv" in r.output
    r = runner.invoke(app, ["check", str(out)])
    assert r.exit_code == 0 and "PASS" in r.output, r.output
    assert "not run by check (the folder has no model.plan" in " ".join(r.output.split()), r.output
    r = runner.invoke(app, ["check", str(out), "--min-cosine", "1.0", "--atol", "0", "--rtol", "0"])
    assert r.exit_code == 2 and "FAIL" in r.output


def test_failed_verification_exits_2_but_writes_the_report(tmp_path):
    r = runner.invoke(app, ["build", str(DIGITS), "-o", str(tmp_path / "b"), "--kernels", "none", "--atol", "0",
                            "--rtol", "0", "--min-cosine", "1", "--calibration", str(CALIB), "--verify-count", "2"])
    assert r.exit_code == 2 and "verification failed" in r.output
    assert json.loads((tmp_path / "b" / "report.json").read_text())["verified"] is False


def test_config_parsing():
    assert parse_shape("input_ids:1x128") == ("input_ids", [1, 128])
    assert parse_shape("a:b:2x3") == ("a:b", [2, 3])
    for bad in ("x", "x:", "x:0x3", "x:2xa", ":1x2"):
        with pytest.raises(EdgeSDKError, match="bad shape hint"):
            parse_shape(bad)
    c = BuildConfig(shape_hints=["x:1x3"])
    assert c.shape_hints == {"x": [1, 3]} and c.kernels == "auto" and c.prune == "wanda" and c.sparsity == 0.0
    assert c.measure == "auto" and load_config(None, {"measure": "off"}).measure == "off"
    with pytest.raises(EdgeSDKError, match="measure: Input should be 'auto', 'on' or 'off'"):
        load_config(None, {"measure": "bogus"})
    assert load_config(None, {"device": None, "sparsity": 0.5}).sparsity == 0.5
    with pytest.raises(EdgeSDKError, match="sparsity"):
        load_config(None, {"sparsity": 1.5})


def test_config_file_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("device: [unclosed\n")
    with pytest.raises(EdgeSDKError, match="not valid YAML"):
        load_config(p)
    p.write_text("- a\n- b\n")
    with pytest.raises(EdgeSDKError, match="mapping"):
        load_config(p)
    with pytest.raises(EdgeSDKError, match="does not exist"):
        load_config(tmp_path / "none.yaml")
    p.write_text("quantize: fp4\n")
    with pytest.raises(EdgeSDKError, match="quantize"):
        load_config(p)


def test_error_messages_print_paths_verbatim(tmp_path):
    """Square brackets in a path are text, not rich markup."""
    missing = tmp_path / "model[bold]v2.onnx"
    r = runner.invoke(app, ["build", str(missing)])
    assert r.exit_code == 1 and f"{missing} does not exist" in r.output, r.output
