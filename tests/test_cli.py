"""The edgesdk CLI: help, devices, inspect, build with a YAML config + overriding flags, check, config parsing."""

import json
import re
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


@pytest.mark.parametrize("cmd", ["build", "inspect", "check", "devices", "pack", "kernels"])
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
    assert data["host"] is not None or "no NVIDIA GPU" in data["host_reason"]


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
    head = next(ln for ln in r.output.splitlines() if ln.startswith("head "))
    assert " quantize " in head and "rewrite" not in head and head.rstrip().endswith("none"), head  # dense: no plugin


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


def _edgesdk(*args, cwd=ROOT):
    """The console script's entry point (``main``), as a user runs it."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", "from edgesdk.cli import main; main()", *args], cwd=cwd,
                          capture_output=True, text=True)


def test_usage_errors_exit_1_and_verification_failures_keep_2(tmp_path):
    """Exit 2 means "folder written, verification failed": a command line that cannot be parsed is bad input (1)."""
    for args in (["build", str(DIGITS), "--sparsity", "abc"], ["build", str(DIGITS), "--bogus"], ["build"],
                 ["no-such-command"], []):
        r = _edgesdk(*args)
        assert r.returncode == 1, (args, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr
    r = _edgesdk("build", str(DIGITS), "--sparsity", "abc")
    assert "Invalid value for '--sparsity'" in " ".join(r.stderr.replace("│", " ").split())
    assert "Usage: " in r.stderr and "build [OPTIONS]" in r.stderr
    assert _edgesdk("devices", "--help").returncode == 0 and _edgesdk("devices").returncode == 0
    r = _edgesdk("build", str(DIGITS), "-o", str(tmp_path / "b"), "--kernels", "none", "--quantize", "none",
                 "--atol", "0", "--rtol", "0", "--min-cosine", "1", "--verify-count", "1", "--calibration-count", "1",
                 "--seed", "1", "--quiet")
    # float in, float out: exact, so a zero tolerance passes; with the INT8 default it would fail
    assert r.returncode == 0, r.stderr
    r = _edgesdk("check", str(tmp_path / "b"), "--min-cosine", "1.01")
    assert r.returncode == 1 and "min_cosine" in r.stderr  # a bad override is bad input
    r = _edgesdk("build", str(DIGITS), "-o", str(tmp_path / "q"), "--kernels", "none", "--atol", "0", "--rtol", "0",
                 "--min-cosine", "1", "--verify-count", "1", "--calibration-count", "1", "--quiet")
    assert r.returncode == 2 and (tmp_path / "q" / "report.json").is_file(), r.stderr
    (row,) = json.loads((tmp_path / "q" / "report.json").read_text())["verify"]
    # one sample: the worst sample's mean (Polygraphy's, float32) is the mean (ours, float64) up to rounding, which
    # went either way between x86 and aarch64
    assert not row["passed"] and row["worst_mean_abs"] >= row["mean_abs"] * (1 - 1e-6) and row["mean_abs"] > 0
    assert row["worst_mean_rel"] > 0
    assert row["why"].startswith(f"mean abs error {row['worst_mean_abs']:.3g} > --atol 0 and mean rel error")
    text = " ".join(r.stderr.split())  # said on stderr even with --quiet, with the fix
    assert f"FAIL logits (processed vs original): {row['why']}" in text and "loosen --atol/--rtol" in text
    # and the INT8 layers of largest error, with an --exclude that names exactly them
    layers = json.loads((tmp_path / "q" / "report.json").read_text())["layers"]
    assert all(r["sqnr_db"] is not None and 20 < r["sqnr_db"] < 80 for r in layers), layers
    low = sorted(layers, key=lambda r: r["sqnr_db"])[:3]
    assert "at the build shape " + ", ".join(f"{r['name']} ({r['sqnr_db']:.1f} dB)" for r in low) in text
    pat = re.search(r"--exclude '([^']+)'", text).group(1)
    assert sorted(r["name"] for r in layers if re.search(pat, r["name"])) == sorted(r["name"] for r in low)


def test_why_shows_thresholds_as_given():
    from edgesdk.verify import why

    row = {"worst_mean_abs": 0.51, "worst_mean_rel": 0.2, "atol": 0.125, "rtol": 0.1, "cosine": 0.99976,
           "min_cosine": 0.99999}
    assert why(row, True) == "cosine 0.99976 < --min-cosine 0.99999"  # was "< --min-cosine 1"
    row.update(cosine=0.9999994, min_cosine=0.9999995)
    assert why(row, False) == ("mean abs error 0.51 > --atol 0.125 and mean rel error 0.2 > --rtol 0.1 (worst "
                               "sample); cosine 0.999999 < --min-cosine 0.9999995")


def test_build_help_shows_the_defaults():
    out = " ".join(runner.invoke(app, ["build", "--help"], terminal_width=200).output.replace("│", " ").split())
    for text in ("[default: orin]", "[default: 16]", "[default: wanda]", "[default: 0.99]", "e.g. 0.75 for SmolLM2"):
        assert text in out, text


def test_yaml_takes_flag_names_and_paths_relative_to_itself(tmp_path, monkeypatch):
    d = tmp_path / "proj"
    (d / "data").mkdir(parents=True)
    (d / "data" / "c.npz").write_bytes(CALIB.read_bytes())
    cfg = d / "build.yaml"
    cfg.write_text("use-dla-core: 0\ntiming-cache-file: cache/t.cache\nshape: ['x:1x1x8x8']\n"
                   "calibration: data/c.npz\noutput: out/b\n")
    monkeypatch.chdir(tmp_path)
    c = load_config(cfg)
    assert c.dla_core == 0 and c.shape_hints == {"x": [1, 1, 8, 8]}
    assert c.calibration == d / "data" / "c.npz" and c.timing_cache == d / "cache" / "t.cache"
    assert c.output == d / "out" / "b"
    assert load_config(cfg, {"calibration": Path("flag.npz")}).calibration == Path("flag.npz")  # flags: as typed
    cfg.write_text("calibraton: data/c.npz\n")
    with pytest.raises(EdgeSDKError, match=rf"calibraton: unknown option \(did you mean 'calibration'\?\) \(in "
                                           rf"{cfg}\)"):
        load_config(cfg)
    with pytest.raises(EdgeSDKError, match=r"sparsity: .* \(flag\)"):
        load_config(None, {"sparsity": 2.0})
    cfg.write_text("1: 2\n")
    with pytest.raises(EdgeSDKError, match="key 1 is not an option name"):
        load_config(cfg)


def test_shape_hints_take_either_separator():
    assert parse_shape("x=2x1x8x8") == ("x", [2, 1, 8, 8]) == parse_shape("x:2x1x8x8")
    assert parse_shape("a:b=3") == ("a:b", [3])


def test_pack_on_the_demo_with_its_defaults(tmp_path):
    r = runner.invoke(app, ["pack", str(DIGITS), "-o", str(tmp_path / "p")], terminal_width=200)
    assert r.exit_code == 0, r.output
    index = json.loads((tmp_path / "p" / "index.json").read_text())
    assert index["options"]["kernels"] == "bitmap" and index["options"]["prune"] == "magnitude"
    assert len(index["layers"]) == 9 and "Packed 9 linears" in r.output and "{" not in r.output
    r = runner.invoke(app, ["pack", str(DIGITS), "-o", str(tmp_path / "v"), "--kernels", "vitbit"])
    assert r.exit_code == 1 and "Q/DQ" in r.output


def test_kernels_compiles_into_the_cache_the_launchers_read(tmp_path, monkeypatch):
    """`edgesdk kernels --arch sm_87` fills the cubin cache without a GPU; the second run finds it; the file is the
    one the launcher's get_kernel would load (same key)."""
    import shutil

    from edgesdk.kernels import _cuda, sparse_kv

    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc (or NVRTC) to compile; CI has nvcc")
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path))
    r = runner.invoke(app, ["kernels", "--arch", "8.7", "--op", "sparse_kv", "--json"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.output)
    want = _cuda.cubin_path(_cuda.PLUGINS_DIR / sparse_kv.SOURCE, "sm_87")
    assert row["state"] == "compiled" and row["arch"] == "sm_87" and row["cubin"] == str(want)
    assert want.is_file() and want.stat().st_size == row["bytes"] > 100_000
    (row,) = json.loads(runner.invoke(app, ["kernels", "--arch", "sm_87", "--op", "sparse_kv", "--json"]).output)
    assert row["state"] == "cached"
    for args, words in ((["--arch", "foo"], "not a compute capability"), (["--arch", "8.7", "--op", "gemm"],
                                                                           "not an operator")):
        r = runner.invoke(app, ["kernels", *args])
        assert r.exit_code == 1 and words in r.output, r.output
