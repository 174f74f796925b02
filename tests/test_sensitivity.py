"""Per-layer INT8 error (``edgesdk.sensitivity``): checked against the Q/DQ model's own outputs, exact cases, and
the build's report and failure message."""

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgesdk.inspect import GraphIndex, find_linears, weight_kn
from edgesdk.ort import make_session
from edgesdk.quantize import quantize_int8
from edgesdk.report import lowest_sqnr
from edgesdk.sensitivity import EXACT_DB, layer_errors, qdq
from tests.test_quantize import _llama_like_block


def _probe(model, feeds, tensors):
    sess = make_session(model, outputs=tensors)
    names = [o.name for o in sess.get_outputs()]
    got = {t: [] for t in tensors}
    for f in feeds:
        for n, v in zip(names, sess.run(None, f)):
            if n in got:
                got[n].append(v.astype(np.float64))
    return {t: np.concatenate(v, 0) for t, v in got.items()}


def _db(ref, out):
    return 10 * math.log10(np.sum(ref ** 2) / np.sum((ref - out) ** 2))


@pytest.mark.parametrize("smooth", [None, 0.5])
def test_matches_the_qdq_models_own_layer_outputs(smooth):
    """For layers whose input is not touched by quantization upstream (q, k, gate, up: RMSNorm stays float), the
    layer's SQNR equals the one between the float model's and the Q/DQ model's layer outputs, run by ONNX Runtime."""
    m, feeds = _llama_like_block()
    factors = {}
    q = quantize_int8(m, feeds[:4], find_linears(m), smooth=smooth, smoothing=factors)
    assert bool(factors) == bool(smooth)
    errs = layer_errors(q, feeds[4:], m, factors)
    assert set(errs) == {"q_proj", "k_proj", "gate_proj", "up_proj", "down_proj"}
    lin = {li.name: li for li in find_linears(m)}
    ql = {li.name: li for li in find_linears(q)}
    # the layers' product outputs (before up_proj's bias, which both sides add alike: subtracted below)
    outs = {name: GraphIndex(q).nodes[ql[name].node].output[0] for name in ql}
    ref = _probe(m, feeds[4:], [GraphIndex(m).nodes[lin[n].node].output[0] for n in ("q_proj", "k_proj", "gate_proj", "up_proj")])
    got = _probe(q, feeds[4:], [outs[n] for n in ("q_proj", "k_proj", "gate_proj", "up_proj")])
    for name in ("q_proj", "k_proj", "gate_proj", "up_proj"):
        a = ref[GraphIndex(m).nodes[lin[name].node].output[0]]
        b = got[outs[name]]
        if smooth and name == "up_proj":  # its output columns were divided by the down projection's factors
            a = a / factors["up_proj"][1]
        if name == "up_proj":
            bias = onnx.numpy_helper.to_array(GraphIndex(q).constants[ql[name].bias]).astype(np.float64)
            a, b = a - bias, b - bias  # the Q/DQ model's bias (divided by the factors when smoothed)
        assert errs[name]["sqnr_db"] == pytest.approx(_db(a, b), abs=0.05), name
        assert errs[name]["sqnr_db"] < min(errs[name]["sqnr_act_db"], errs[name]["sqnr_weight_db"]) + 0.5
    # the rebuilt float weight is the one ONNX Runtime quantized: its per-channel INT8 rounding gives the stored codes
    for name, li in ql.items():
        w = weight_kn(m, lin[name]).astype(np.float64)
        r, c, _ = factors.get(name, (None, None, None))
        w = w * (r[:, None] if r is not None else 1) / (c[None, :] if c is not None else 1)
        w = w.astype(np.float32)
        codes = GraphIndex(q).array(li.weight)
        codes = codes.T if li.weight_layout == "NK" else codes
        scale = np.abs(w).max(0) / np.float32(127)
        np.testing.assert_array_equal(np.clip(np.rint(w / scale), -127, 127).astype(np.int8), codes)


def _single(w: np.ndarray, x: np.ndarray):
    k, n = w.shape
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "one",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
                          [onnx.numpy_helper.from_array(w.astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    x = x.astype(np.float32)
    return m, [{"x": x[i:i + 3]} for i in range(0, len(x), 3)]


def test_values_on_the_int8_grid_have_no_error_and_one_step_off_does():
    rng = np.random.default_rng(11)
    k, n = 37, 23
    codes = rng.integers(-127, 128, (k, n))
    codes[0] = 127  # every column reaches 127: scale = max|w| / 127 exactly
    w = codes * (2.0 ** -rng.integers(3, 8, n))[None, :]
    x = rng.integers(-127, 128, (9, k)) * 2.0 ** -4
    x[0, 0] = 127 * 2.0 ** -4
    m, feeds = _single(w, x)
    q = quantize_int8(m, feeds, find_linears(m))
    e = layer_errors(q, feeds, m)["fc"]
    assert e == {"sqnr_db": EXACT_DB, "sqnr_act_db": EXACT_DB, "sqnr_weight_db": EXACT_DB}
    w2 = w.copy()
    w2[5, 3] += 0.5 * abs(w[:, 3]).max() / 127 * 0.6  # 0.3 of a step: rounds back to the code, an error of 0.3 step
    m2, _ = _single(w2, x)
    e2 = layer_errors(q, feeds, m2)["fc"]  # the same Q/DQ model measured against a float weight that differs
    assert e2["sqnr_act_db"] == EXACT_DB and math.isfinite(e2["sqnr_weight_db"]) and e2["sqnr_db"] == e2["sqnr_weight_db"]
    y = x @ w2
    err = (x[:, 5] * (w2[5, 3] - w[5, 3]))
    assert e2["sqnr_weight_db"] == pytest.approx(10 * math.log10(np.sum(y ** 2) / np.sum(err ** 2)), abs=0.01)


def test_activation_error_against_float64_numpy():
    rng = np.random.default_rng(3)
    k, n = 29, 13
    w = rng.standard_normal((k, n))
    x = rng.standard_normal((12, k)) * rng.uniform(0.1, 6, k)
    m, feeds = _single(w, x)
    q = quantize_int8(m, feeds, find_linears(m))
    e = layer_errors(q, feeds, m)["fc"]
    s = np.float32(np.abs(x.astype(np.float32)).max() / 127)  # minmax, symmetric
    xq = np.clip(np.rint(x.astype(np.float32) / s), -128, 127).astype(np.float64) * s
    np.testing.assert_array_equal(qdq(x, s), xq.astype(np.float32))
    wf = w.astype(np.float32).astype(np.float64)
    y = x.astype(np.float32).astype(np.float64) @ wf
    assert e["sqnr_act_db"] == pytest.approx(10 * math.log10(np.sum(y ** 2) / np.sum(((x.astype(np.float32) - xq) @ wf) ** 2)), abs=0.01)
    # a model that came quantized: no float weights, the activation figure only
    e0 = layer_errors(q, feeds, None)["fc"]
    assert e0["sqnr_weight_db"] is None and e0["sqnr_db"] == e0["sqnr_act_db"]
    assert e0["sqnr_act_db"] == pytest.approx(e["sqnr_act_db"], abs=0.3)  # measured through Ŵ instead of W


def test_worst_orders_lowest_first():
    errs = {"a": {"sqnr_db": 30.0}, "b": {"sqnr_db": 12.5}, "c": {"sqnr_db": None}, "d": {"sqnr_db": 20.0}}
    assert [k for k, _ in lowest_sqnr([{"name": k, **v} for k, v in errs.items()], 2)] == ["b", "d"]



def test_each_verified_shape_is_measured_and_the_worst_is_reported(capsys):
    """An input group whose activations are far from the calibration data's (an LLM's first token alone) can hold a
    layer's worst error: the report keeps every shape's SQNR and the lowest, and a failure names the layers of the
    shapes that failed."""
    import typer

    from edgesdk.build import layer_sqnr
    from edgesdk.cli import verification_failed

    m, feeds = _llama_like_block()
    layers = find_linears(m)
    q = quantize_int8(m, feeds[:4], layers)
    odd = []
    for f in feeds[4:]:  # one channel 60x larger than calibration saw: clipped after the RMSNorm, the rest coarser
        x = f["x"].copy()
        x[:, 0] *= 60
        odd.append({"x": x})
    rows = [{"name": li.name} for li in layers]
    layer_sqnr(rows, q, {"build": feeds[4:], "min": odd}, m, {})
    for r in rows:
        assert set(r["sqnr_by_shape"]) == {"build", "min"} and r["sqnr_db"] == min(r["sqnr_by_shape"].values())
        worst = min(r["sqnr_by_shape"], key=r["sqnr_by_shape"].get)
        alone = layer_errors(q, feeds[4:] if worst == "build" else odd, m)[r["name"]]
        assert {k: r[k] for k in alone} == alone  # act/weight figures come from the same (worst) shape
    assert all(r["sqnr_by_shape"]["min"] < r["sqnr_by_shape"]["build"] - 2 for r in rows)
    failed = [{"output": "down", "passed": False, "gate": True, "against": "original", "shape": "min", "why": "x"}]
    with pytest.raises(typer.Exit):
        verification_failed(failed, layers=rows)
    err = " ".join(capsys.readouterr().err.split())
    low = sorted(rows, key=lambda r: r["sqnr_by_shape"]["min"])[:3]
    assert "at the min shape " + ", ".join(f"{r['name']} ({r['sqnr_by_shape']['min']:.1f} dB)" for r in low) in err
    assert "at the build shape" not in err
    # a failure against the pruned reference (the kernels' semantics) is not an INT8 question: no layer named
    with pytest.raises(typer.Exit):
        verification_failed([{**failed[0], "against": "pruned_reference"}], layers=rows)
    assert "lowest output SQNR" not in capsys.readouterr().err


def test_summary_line_names_the_lowest_and_their_shape():
    from edgesdk.report import sqnr_line

    rows = [{"name": "a", "sqnr_db": 30.0, "sqnr_by_shape": {"build": 31.0, "min": 30.0}},
            {"name": "b", "sqnr_db": 8.25, "sqnr_by_shape": {"build": 25.0, "min": 8.25}},
            {"name": "c", "sqnr_db": 12.0, "sqnr_by_shape": {"build": 12.0, "min": 40.0}},
            {"name": "d", "sqnr_db": None, "sqnr_by_shape": None}]
    assert sqnr_line(rows, 2) == ("INT8 error per layer (output SQNR, higher is better; layers[].sqnr_db): lowest "
                                  "b 8.2 dB at the min shape, c 12.0 dB at the build shape; median 12.0 dB over 3 "
                                  "layers")
    assert sqnr_line([{"name": "d", "sqnr_db": None}]) is None
