"""Input shapes of exported models: --shape binding of symbolic dims, --min-shape/--max-shape profiles, rows per call.

The models are Hugging Face optimum exports (``tools/optimum_fixtures.py``): a ViT whose four pixel dims are all
dynamic, and a Llama decoder with its KV cache (``past_key_values.*``, an ``attention_mask`` of length
``past_sequence_length + sequence_length``) and without.
"""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from edgesdk.build import build, check_build
from edgesdk.cli import app
from edgesdk.config import BuildConfig, load_config, parse_shape
from edgesdk.errors import EdgeSDKError
from edgesdk.onnx_io import dim_expression, input_specs, shape_ranges
from edgesdk.report import verify_view
from edgesdk.trt.engine import profile_shapes

DATA = Path(__file__).resolve().parent / "data" / "optimum"
VIT, LLAMA, LLAMA_PAST = (DATA / n / "model.onnx" for n in ("vit", "llama", "llama_past"))
PAST = ["past_key_values.0.key", "past_key_values.0.value"]
runner = CliRunner()


def _model(path):
    return onnx.load(str(path))


def test_dim_expression():
    v = {"past_sequence_length": 31, "sequence_length": 1}
    assert dim_expression("past_sequence_length + sequence_length", v) == 32
    assert dim_expression("2*sequence_length - 1", v) == 1
    assert dim_expression("sequence_length // 2", {"sequence_length": 9}) == 4
    assert dim_expression("batch", v) is None  # unbound
    assert dim_expression("past_sequence_length + unknown", v) is None
    assert dim_expression("x ** 2", {"x": 3}) is None  # only + - * //
    assert dim_expression("f(x)", {"x": 3}) is None
    assert dim_expression("a // b", {"a": 3, "b": 0}) is None


def test_one_hint_binds_the_inputs_sharing_its_dims():
    m = _model(LLAMA)
    specs = input_specs(m, {"input_ids": [2, 9]})
    assert {k: v[0] for k, v in specs.items()} == {"input_ids": [2, 9], "attention_mask": [2, 9], "position_ids": [2, 9]}
    assert all(v[1] == np.int64 for v in specs.values())
    # before: every input needed its own hint; the error still names the dim another hint could bind
    with pytest.raises(EdgeSDKError) as e:
        input_specs(m, {})
    assert "--shape input_ids:1xN" in e.value.fix and "'sequence_length'" in e.value.fix


def test_expression_dims_and_profile_ranges():
    m = _model(LLAMA_PAST)
    r = shape_ranges(m, {"input_ids": [1, 1], PAST[0]: [1, 2, 31, 8]}, {PAST[0]: [1, 2, 0, 8]},
                     {PAST[0]: [1, 2, 255, 8]})
    assert r["attention_mask"] == ([1, 1], [1, 32], [1, 256])  # past + seq at each level
    assert r[PAST[1]] == ([1, 2, 0, 8], [1, 2, 31, 8], [1, 2, 255, 8])  # shares every dim name with PAST[0]
    assert r["input_ids"] == ([1, 1], [1, 1], [1, 1])  # batch bound to 1 at max by the max hint
    same = shape_ranges(m, {"input_ids": [1, 1], "attention_mask": [1, 32], PAST[0]: [1, 2, 31, 8]})
    assert same["attention_mask"][1] == [1, 32]  # a mask hint that agrees is taken
    # without max hints the batch goes to max_batch, other dims stay at opt
    r = shape_ranges(m, {"input_ids": [2, 1], PAST[0]: [2, 2, 7, 8]}, max_batch=6)
    assert r["attention_mask"] == ([1, 8], [2, 8], [6, 8])
    with pytest.raises(EdgeSDKError) as e:  # attention_mask's length needs past_sequence_length
        shape_ranges(m, {"input_ids": [1, 1]})
    assert "attention_mask" in e.value.problem and "'past_sequence_length'" in e.value.fix


@pytest.mark.parametrize("opt, lo, hi, words", [
    ({"input_ids": [1, 1], "attention_mask": [1, 33], PAST[0]: [1, 2, 31, 8]}, {}, {},
     ["attention_mask", "33", "make it 32"]),  # past 31 + 1 token
    ({"input_ids": [1, 1], PAST[0]: [1, 2, 31, 8], PAST[1]: [1, 2, 30, 8]}, {}, {}, ["two values", "30", "31"]),
    ({"input_ids": [1, 1], PAST[0]: [1, 2, 31, 8]}, {PAST[0]: [1, 2, 40, 8]}, {}, ["not in order"]),
    ({"input_ids": [1, 1], PAST[0]: [1, 2, 31, 8]}, {}, {PAST[0]: [1, 2, 9, 8]}, ["not in order"]),
    ({"input_ids": [1, 1], PAST[0]: [1, 3, 31, 8]}, {}, {}, ["does not fit"]),
    ({"input_ids": [1, 1], PAST[0]: [1, 2, 31, 8], "nope": [1]}, {}, {}, ["nope", "does not have"]),
])
def test_bad_hints(opt, lo, hi, words):
    m = _model(LLAMA_PAST)
    with pytest.raises(EdgeSDKError) as e:
        shape_ranges(m, opt, lo, hi)
    text = e.value.problem + e.value.fix
    assert all(w in text for w in words), text


def test_shape_flags_parse():
    assert parse_shape("past:1x2x0x8", "--min-shape", zero=True) == ("past", [1, 2, 0, 8])
    with pytest.raises(EdgeSDKError, match="bad shape hint"):
        parse_shape("past:1x2x0x8")  # only --min-shape takes 0 (an empty KV cache)
    cfg = BuildConfig(shape_hints=["a:1x4"], min_shapes=["a:1x0"], max_shapes={"a": "1x9"})
    assert (cfg.shape_hints, cfg.min_shapes, cfg.max_shapes) == ({"a": [1, 4]}, {"a": [1, 0]}, {"a": [1, 9]})
    with pytest.raises(EdgeSDKError):
        BuildConfig(max_shapes=["a:1x0"])


def test_yaml_min_max_shape_keys(tmp_path):
    y = tmp_path / "b.yaml"
    y.write_text("shape: ['input_ids:1x1']\nmin-shape: ['past_key_values.0.key:1x2x0x8']\n"
                 "max_shape: {past_key_values.0.key: 1x2x63x8}\n")
    cfg = load_config(y)
    assert cfg.min_shapes == {PAST[0]: [1, 2, 0, 8]} and cfg.max_shapes == {PAST[0]: [1, 2, 63, 8]}


def test_profile_shapes_takes_the_builds_profile():
    given = {"ids": {"min": [1, 1], "opt": [1, 16], "max": [4, 512]}}
    assert profile_shapes({"ids": (-1, -1), "x": (3,)}, {}, 8, given) == {"ids": ((1, 1), (1, 16), (4, 512))}
    with pytest.raises(EdgeSDKError, match="does not fit"):
        profile_shapes({"ids": (-1, 7)}, {}, 8, given)


def test_vit_rows_per_call_at_the_given_shape(tmp_path, capfd):
    """optimum's ViT has dynamic channels/height/width: rows per call were taken from a run at all-ones dims, which
    failed (ONNX Runtime printed a Conv error), then from shape inference, which lost the rows behind the attention
    reshape (M = 1) and the batch: five layers of six got the wrong kernel and the build printed an ORT error."""
    out = tmp_path / "vit"
    report = build(VIT, BuildConfig(output=out, shape_hints=["pixel_values:4x3x16x16"], verify_count=2,
                                    calibration_count=4))
    assert "onnxruntime" not in capfd.readouterr().err
    rows = {r["name"]: r for r in report["layers"]}
    enc = [r for n, r in rows.items() if n.startswith("vit.encoder")]
    assert len(enc) == 6 and all(r["kernel"] == "vitbit" for r in enc), [(r["name"], r["reason"]) for r in enc]
    assert "M=4 rows" in rows["classifier"]["reason"]  # 4 images, one row each
    assert report["model"]["profile"] == {"pixel_values": {"min": [1, 3, 16, 16], "opt": [4, 3, 16, 16],
                                                           "max": [8, 3, 16, 16]}}
    assert report["verified"] is True and all("shape" not in v for v in report["verify"])  # batch only: no extra rows


def test_inspect_rows_unknown_without_shape():
    res = runner.invoke(app, ["inspect", str(VIT), "--json"])
    assert res.exit_code == 0, res.output
    lin = {li["name"]: li for li in json.loads(res.output)["linears"]}
    dense = lin["vit.encoder.layer.0.attention.output.dense"]
    assert dense["rows_per_call"] is None and dense["kernel"] is None and "--shape" in dense["kernel_reason"]
    res = runner.invoke(app, ["inspect", str(VIT), "--json", "--shape", "pixel_values:4x3x16x16"])
    lin = {li["name"]: li for li in json.loads(res.output)["linears"]}
    assert {li["rows_per_call"] for n, li in lin.items() if n.startswith("vit.")} == {20}
    assert lin["classifier"]["rows_per_call"] == 4
    res = runner.invoke(app, ["inspect", str(VIT), "--shape", "pixel_values:4x3x16"])
    assert res.exit_code == 1 and "does not fit" in res.output


@pytest.fixture(scope="module")
def past_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("p") / "llama_past"
    cfg = BuildConfig(output=out, sparsity=0.5, prune="magnitude", shape_hints=["input_ids:1x1", f"{PAST[0]}:1x2x31x8"],
                      min_shapes=[f"{PAST[0]}:1x2x0x8"], max_shapes=[f"{PAST[0]}:1x2x95x8"], verify_count=3,
                      calibration_count=4)
    return out, build(LLAMA_PAST, cfg)


def test_decoder_with_past_profile_and_range_verification(past_build):
    out, r = past_build
    prof = r["model"]["profile"]
    assert prof["attention_mask"] == {"min": [1, 1], "opt": [1, 32], "max": [1, 96]}
    assert prof[PAST[1]] == {"min": [1, 2, 0, 8], "opt": [1, 2, 31, 8], "max": [1, 2, 95, 8]}
    assert r["model"]["shapes"]["attention_mask"] == [1, 32]
    assert any(x["kernel"] == "bitmap" for x in r["layers"])
    outputs = {x["output"] for x in r["verify"]}
    assert outputs == {"logits", "present.0.key", "present.0.value"}
    for shape, n in ((None, 3), ("min", 2), ("max", 2)):
        part = [x for x in r["verify"] if x.get("shape") == shape]
        assert {(x["against"], x["output"]) for x in part} == {(a, o) for a in ("original", "pruned_reference")
                                                               for o in outputs}
        assert all(x["samples"] == n for x in part)
        assert all(x["passed"] for x in part if x["gate"]) and all(x["cosine"] > 0.9999 for x in part if x["gate"])
    assert r["verified"] is True
    rows = check_build(out)  # `edgesdk check` repeats the range rows
    assert sorted((x["against"], x["output"], x.get("shape") or "") for x in rows) == \
        sorted((x["against"], x["output"], x.get("shape") or "") for x in r["verify"])


def test_runtime_holds_inputs_to_the_profile(past_build):
    import edgesdk

    out, _ = past_build

    def feeds(p):
        f = {"input_ids": np.array([[5]], np.int64), "attention_mask": np.ones((1, p + 1), np.int64),
             "position_ids": np.array([[p]], np.int64)}
        for name in PAST:
            f[name] = np.random.default_rng(p).standard_normal((1, 2, p, 8)).astype(np.float32)
        return f

    with edgesdk.Engine(out, backend="onnxruntime") as e:
        assert e.profile["attention_mask"] == ((1, 1), (1, 32), (1, 96))
        for p in (0, 40, 95):
            res = e.infer(feeds(p))
            assert res["logits"].shape == (1, 1, 64) and res["present.0.key"].shape == (1, 2, p + 1, 8)
        with pytest.raises(EdgeSDKError) as err:
            e.infer(feeds(96))
    assert "(1, 1) .. (1, 96)" in err.value.problem and "--max-shape" in err.value.fix


def test_verify_view_groups_many_outputs():
    def row(out, cos, passed=True, against="original", shape=None):
        return {"output": out, "against": against, "samples": 2, "max_abs": 1 - cos, "mean_abs": (1 - cos) / 2,
                "rel_l2": 1 - cos, "cosine": cos, "passed": passed, **({"shape": shape} if shape else {})}

    few = [row(f"o{i}", 0.99) for i in range(3)]
    assert verify_view(few) == few
    many = [row(f"o{i}", 0.999 - i / 1000) for i in range(8)] + [row(f"o{i}", 0.99, shape="max") for i in range(8)]
    many[2]["passed"] = False
    view = verify_view(many)
    assert [(v["output"], v.get("shape"), v["passed"]) for v in view] == [
        ("o2 (worst of 8)", None, False), ("o0 (worst of 8)", "max", True)]
    assert view[0]["max_abs"] == pytest.approx(1 - 0.992)  # the largest over the group, not the worst row's


def test_token_calibration_fills_the_kv_cache_from_the_preceding_tokens(tmp_path):
    """Each sample's past_key_values are the model's own present outputs for the tokens before it: the decoder with
    cache then gives the logits the decoder without cache (same weights) gives at those positions."""
    from edgesdk.calibration import load_feeds, past_inputs
    from edgesdk.ort import make_session

    m = _model(LLAMA_PAST)
    specs = input_specs(m, {"input_ids": [1, 2], PAST[0]: [1, 2, 5, 8]})
    assert past_inputs(m, specs) == {PAST[0]: ("present.0.key", 2), PAST[1]: ("present.0.value", 2)}
    ids = np.random.default_rng(3).integers(1, 64, size=40)
    txt = tmp_path / "t.txt"
    txt.write_text(" ".join(map(str, ids)))
    nopast, withpast = make_session(_model(LLAMA)), make_session(m)
    feeds = load_feeds(txt, specs, 3, model=m)
    assert len(feeds) == 3
    for i, f in enumerate(feeds):
        assert f[PAST[0]].shape == (1, 2, 5, 8) and f["attention_mask"].shape == (1, 7)
        assert f["position_ids"].tolist() == [[5, 6]] and f["input_ids"].tolist() == [list(ids[i * 7 + 5:i * 7 + 7])]
        full = ids[i * 7:(i + 1) * 7][None].astype(np.int64)
        want = nopast.run(["logits"], {"input_ids": full, "attention_mask": np.ones_like(full),
                                       "position_ids": np.arange(7)[None].astype(np.int64)})[0][:, 5:]
        np.testing.assert_allclose(withpast.run(["logits"], f)[0], want, rtol=1e-4, atol=1e-5)
    # without a calibration source the cache comes from random tokens the same way (not N(0, 1) noise)
    (f,) = load_feeds(None, specs, 1, seed=9, model=m)
    assert f[PAST[0]].shape == (1, 2, 5, 8) and f["position_ids"].tolist() == [[5, 6]]
    assert 0 < np.abs(f[PAST[1]]).max() < 1  # this tiny model's V values stay below 0.4; N(0, 1) noise over 80 would not
    with pytest.raises(EdgeSDKError, match="fewer than one sample"):
        short = tmp_path / "s.txt"
        short.write_text("1 2 3")
        load_feeds(short, specs, 2, model=m)


def test_range_verification_reads_token_calibration(tmp_path):
    """With a token-id calibration file the min/max rows run on its text (the last samples), and a text too short
    for the max shape is refused naming --max-shape."""
    from edgesdk.build import build_ranges, range_feeds

    txt = tmp_path / "t.txt"
    txt.write_text(" ".join(map(str, np.random.default_rng(5).integers(1, 64, size=600))))
    m = _model(LLAMA_PAST)
    cfg = BuildConfig(calibration=txt, calibration_count=4, verify_count=2, shape_hints=["input_ids:1x1",
                      f"{PAST[0]}:1x2x7x8"], max_shapes=[f"{PAST[0]}:1x2x40x8"])
    feeds = range_feeds(m, build_ranges(m, cfg), cfg)
    assert list(feeds) == ["max"] and len(feeds["max"]) == 2  # min = opt but for the batch: no min rows
    ids = txt.read_text().split()
    got = [int(f["input_ids"][0, 0]) for f in feeds["max"]]
    # after 4 calibration windows of 40 + 1 tokens (the profile's longest) and 2 verification samples of 7 + 1
    skip = 4 * 41 + 2 * 8
    assert got == [int(ids[skip + i * 41 + 40]) for i in (0, 1)]
    cfg = cfg.model_copy(update={"max_shapes": {PAST[0]: [1, 2, 900, 8]}})
    with pytest.raises(EdgeSDKError) as e:
        range_feeds(m, build_ranges(m, cfg), cfg)
    assert "max shape" in e.value.problem and "--max-shape" in e.value.fix


def test_decoder_with_cache_calibrates_on_prefills_and_verifies_on_decode_steps(tmp_path):
    from edgesdk.build import build_ranges, longest_specs, split_feeds

    ids = [int(t) for t in np.random.default_rng(6).integers(1, 64, size=500)]
    txt = tmp_path / "t.txt"
    txt.write_text(" ".join(map(str, ids)))
    m = _model(LLAMA_PAST)
    for source in (txt, None):
        cfg = BuildConfig(calibration=source, calibration_count=3, verify_count=2,
                          shape_hints=["input_ids:1x1", f"{PAST[0]}:1x2x9x8"])
        calib, check = split_feeds(m, input_specs(m, cfg.shape_hints), cfg)
        assert [f["input_ids"].shape for f in calib] == [(1, 10)] * 3  # the whole 9 + 1 window as new tokens
        assert all(f[PAST[0]].shape == (1, 2, 0, 8) and f["position_ids"].tolist() == [list(range(10))] for f in calib)
        assert [f["input_ids"].shape for f in check] == [(1, 1)] * 2 and all(f[PAST[0]].shape == (1, 2, 9, 8)
                                                                              for f in check)
        if source is not None:  # held out: the windows after the calibration ones
            assert calib[2]["input_ids"][0].tolist() == ids[20:30]
            assert [int(f["input_ids"][0, 0]) for f in check] == [ids[39], ids[49]]
    # windows as long as the profile's longest cache (19 + 1), verification after them; a text too short says so
    cfg = BuildConfig(calibration=txt, calibration_count=3, verify_count=2, shape_hints=["input_ids:1x1",
                      f"{PAST[0]}:1x2x9x8"], max_shapes=[f"{PAST[0]}:1x2x19x8"])
    ranges = build_ranges(m, cfg)
    calib, check = split_feeds(m, input_specs(m, cfg.shape_hints), cfg, longest_specs(m, ranges))
    assert [f["input_ids"][0].tolist() for f in calib] == [ids[i * 20:(i + 1) * 20] for i in range(3)]
    assert [int(f["input_ids"][0, 0]) for f in check] == [ids[69], ids[79]]
    short = tmp_path / "short.txt"
    short.write_text(" ".join(map(str, ids[:65])))
    with pytest.raises(EdgeSDKError) as e:
        split_feeds(m, input_specs(m, cfg.shape_hints), cfg.model_copy(update={"calibration": short}),
                    longest_specs(m, ranges))
    assert "too few tokens" in e.value.problem and "--calibration-count" in e.value.fix


def test_bench_takes_the_build_shape_and_binds_one_hint(past_build, tmp_path):
    """`edgesdk bench` on a build folder of a decoder with a cache: no --shape runs the build shape (it asked for a
    --shape per input before); one --shape on a cache input sizes the other cache inputs and the mask."""
    out, _ = past_build
    base = ["bench", str(out), "--backend", "onnxruntime", "--iterations", "2", "--warmup", "0", "--json"]
    res = runner.invoke(app, [*base, str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    got = json.loads((tmp_path / "a.json").read_text())["inputs"]
    assert got == {"input_ids": [1, 1], "attention_mask": [1, 32], "position_ids": [1, 1], PAST[0]: [1, 2, 31, 8],
                   PAST[1]: [1, 2, 31, 8]}
    res = runner.invoke(app, [*base, str(tmp_path / "b.json"), "--shape", f"{PAST[0]}=1x2x90x8"])
    assert res.exit_code == 0, res.output
    got = json.loads((tmp_path / "b.json").read_text())["inputs"]
    assert got["attention_mask"] == [1, 91] and got[PAST[1]] == [1, 2, 90, 8] and got["input_ids"] == [1, 1]
    res = runner.invoke(app, [*base, str(tmp_path / "c.json"), "--shape", f"{PAST[0]}=1x2x96x8"])
    assert res.exit_code == 1 and "outside the build's optimization profile" in res.output


def test_shapes_with_fallback_binds_names_before_expressions():
    from edgesdk.onnx_io import shapes_with_fallback

    m = _model(LLAMA_PAST)
    build = {"input_ids": [1, 1], "attention_mask": [1, 32], "position_ids": [1, 1], PAST[0]: [1, 2, 31, 8],
             PAST[1]: [1, 2, 31, 8]}
    got = shapes_with_fallback(m, {"input_ids": [1, 3]}, build)  # 3 new tokens after the build's 31 cached
    assert got == {**build, "input_ids": [1, 3], "position_ids": [1, 3], "attention_mask": [1, 34]}
    got = shapes_with_fallback(m, {PAST[1]: [4, 2, 90, 8]}, build)  # the hint's batch and cache length win
    assert got["input_ids"] == [4, 1] and got["attention_mask"] == [4, 91] and got[PAST[0]] == [4, 2, 90, 8]
    with pytest.raises(EdgeSDKError, match="make it 32"):  # a mask length alone does not say cache vs new tokens
        shapes_with_fallback(m, {"attention_mask": [1, 50]}, build)
