"""The measured kernel choice of ``--kernels auto`` (``--measure``): when to time, what the times decide,
and how the rewrite applies and reports it. The timing itself runs on a GPU (tests/gpu/test_measure_choice_gpu.py);
here the measurer is a plain function of the layer shape so that the decision logic is checked exactly."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.devices import PROFILES
from edgesdk.errors import EdgeSDKError
from edgesdk.report import layers_table
from edgesdk.rewrite import rewrite_model
from edgesdk.rewrite.choose import decide_measured, measure_plan

ORIN = PROFILES["orin"]
H100 = ORIN.model_copy(update={"name": "host", "description": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
                               "sm_count": 132})
ORIN_HOST = ORIN.model_copy(update={"name": "host", "description": "Orin (nvgpu)"})


def cfg(**kw):
    base = dict(sparsity=0.5, prune="magnitude", kernels="auto", exclude=[], include_lm_head=False, measure="auto")
    base.update(kw)
    return SimpleNamespace(**base)


def two_layer_model(k=96, n1=80, n2=56, seed=0):
    """X[1, k] → MatMul → Relu → MatMul → Y: two decode-style linears (M = 1)."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((k, n1)) / np.sqrt(k)).astype(np.float32)
    w2 = (rng.standard_normal((n1, n2)) / np.sqrt(n1)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["X", "w1"], ["h"], name="/fc1/MatMul"),
             helper.make_node("Relu", ["h"], ["r"], name="/act/Relu"),
             helper.make_node("MatMul", ["r", "w2"], ["Y"], name="/fc2/MatMul")]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n2])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


# ------------------------------------------------------------------------------------ measure_plan
def test_measure_plan_modes():
    assert measure_plan("off", ORIN, H100) == (False, "--measure off: static rule")
    on, note = measure_plan("auto", ORIN, None)
    assert not on and "no GPU here" in note and "orin" in note
    with pytest.raises(EdgeSDKError, match="--measure on needs an NVIDIA GPU"):
        measure_plan("on", ORIN, None)
    # nvidia-smi-only host profile (SM count unknown = 0) cannot run kernels: same as no GPU
    assert measure_plan("auto", ORIN, H100.model_copy(update={"sm_count": 0}))[0] is False
    # the target itself (a Jetson building its engine): measured
    on, note = measure_plan("auto", ORIN, ORIN_HOST)
    assert on and "16 SMs" in note
    # another GPU: not measured under auto, measured with a warning under on
    on, note = measure_plan("auto", ORIN, H100)
    assert not on and "not the target orin" in note
    on, note = measure_plan("on", ORIN, H100)
    assert on and "NOT the target orin" in note
    # --device host: the GPU here is the target
    assert measure_plan("auto", H100, H100)[0] is True
    with pytest.raises(EdgeSDKError, match="unknown --measure"):
        measure_plan("sometimes", ORIN, H100)


def test_decide_measured():
    meas = {"bitmap_us": 12.3, "dense_us": 16.6, "dense": "cuBLAS fp16", "gpu": "G", "m": 1}
    assert decide_measured(meas) == ("bitmap", None)
    # near-ties keep the dense layer (margin 2 %)
    assert decide_measured({**meas, "bitmap_us": 16.6 / 1.02}) == ("bitmap", None)
    kernel, why = decide_measured({**meas, "bitmap_us": 16.5})
    assert kernel == "none" and why.endswith("the dense layer is faster or within the margin")
    assert decide_measured({**meas, "bitmap_us": 16.5}, margin=1.0) == ("bitmap", None)
    kernel, why = decide_measured({**meas, "bitmap_us": 9.1, "dense_us": 6.2, "dense": "cuBLAS int8"})
    assert kernel == "none"
    assert why == "auto: measured on G at M=1: bitmap 9.1 µs vs dense 6.2 µs (cuBLAS int8): the dense layer is faster"


# ------------------------------------------------------------------------------------ rewrite
def shape_measurer(slower_k):
    """Bitmap slower than dense exactly for layers with K == slower_k; records its calls."""
    calls = []

    def measure(packed, m, int8):
        calls.append((packed.n, packed.k, m, int8, packed.value_dtype))
        b, d = (9.0, 6.0) if packed.k == slower_k else (5.0, 8.0)
        return {"bitmap_us": b, "dense_us": d, "dense": "cuBLAS fp16", "fp16_us": d, "int8_us": None, "m": m,
                "gpu": "TestGPU", "sm_count": 16}
    return measure, calls


def test_rewrite_applies_measured_choice():
    model = two_layer_model()
    measure, calls = shape_measurer(slower_k=80)  # fc2 (K = 80) loses to dense
    new, rows = rewrite_model(model, cfg(), None, ORIN, measurer=measure)
    by = {r["name"]: r for r in rows}
    assert sorted(calls) == [(56, 80, 1, False, "float16"), (80, 96, 1, False, "float16")]
    fc1, fc2 = by["fc1"], by["fc2"]
    assert fc1["kernel"] == "bitmap" and fc1["reason"] is None and fc1["measured"]["bitmap_us"] == 5.0
    assert fc2["kernel"] == "none" and "bitmap 9.0 µs vs dense 6.0 µs" in fc2["reason"]
    assert fc1["choice"] == fc2["choice"] == "measured by the caller's measurer"
    ops = [n.op_type for n in new.graph.node]
    assert ops.count("EdgeBitmapLinear") == 1 and ops.count("MatMul") == 1
    # the layer that stays dense carries its pruned weights (50 % per output row)
    w2 = [numpy_helper.to_array(t) for t in new.graph.initializer if list(t.dims) == [80, 56]]
    assert len(w2) == 1 and np.all((w2[0] == 0).sum(0) == 40)
    onnx.checker.check_model(new)
    # the summary table shows the measured speed-up of the kept plugin and the reason of the other
    from rich.console import Console

    console = Console(record=True, width=400)
    console.print(layers_table(rows))
    text = console.export_text()
    assert "measured: 5.0 µs vs dense 8.0 µs (1.60×)" in text and "the dense layer is faster" in text


def test_rewrite_measures_each_shape_once_and_not_when_forced():
    # two layers of one shape: one measurement (cached by shape, values and density)
    rng = np.random.default_rng(1)
    w = [(rng.standard_normal((64, 64)) / 8).astype(np.float32) for _ in range(2)]
    nodes = [helper.make_node("MatMul", ["X", "w0"], ["h"], name="/a/MatMul"),
             helper.make_node("MatMul", ["h", "w1"], ["Y"], name="/b/MatMul")]
    g = helper.make_graph(nodes, "same", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 64])],
                          [numpy_helper.from_array(w[0], "w0"), numpy_helper.from_array(w[1], "w1")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    measure, calls = shape_measurer(slower_k=-1)
    _, rows = rewrite_model(model, cfg(), None, ORIN, measurer=measure)
    assert len(calls) == 1 and all(r["kernel"] == "bitmap" and r["measured"] for r in rows)
    # --kernels bitmap forces the plugin: nothing is timed
    measure, calls = shape_measurer(slower_k=64)
    _, rows = rewrite_model(model, cfg(kernels="bitmap"), None, ORIN, measurer=measure)
    assert not calls and all(r["kernel"] == "bitmap" and r["measured"] is None for r in rows)


def test_rewrite_without_gpu_keeps_static_rule_and_says_so(monkeypatch):
    import edgesdk.rewrite as rw

    monkeypatch.setattr(rw, "_host_gpu", lambda: None)  # this machine has no GPU (as CI)
    _, rows = rewrite_model(two_layer_model(), cfg(), None, ORIN)
    assert all(r["kernel"] == "bitmap" and r["measured"] is None for r in rows)
    assert all(r["choice"].startswith("not measured: no GPU here") for r in rows)
    with pytest.raises(EdgeSDKError, match="--measure on needs an NVIDIA GPU"):
        rewrite_model(two_layer_model(), cfg(measure="on"), None, ORIN)
    _, rows = rewrite_model(two_layer_model(), cfg(measure="off"), None, ORIN)
    assert all(r["choice"] == "--measure off: static rule" for r in rows)
    with pytest.raises(EdgeSDKError, match="unknown --measure"):
        rewrite_model(two_layer_model(), cfg(measure="maybe"), None, ORIN)


def test_vitbit_candidate_measured_and_kept_dense_when_slower():
    # an INT8 Q/DQ linear with 40 rows per call (not decode-style: the static rule's vitbit case) is timed;
    # slower than dense int8 -> its Q/DQ nodes stay
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_rewrite import feeds_for, linear_model

    from edgesdk.inspect import find_linears
    from edgesdk.quantize import quantize_int8

    m = linear_model("matmul_add_3d")  # X [B, 5, 70]
    q = quantize_int8(m, feeds_for(m, count=3), find_linears(m))
    q.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 40  # X [B, 40, 70]: M = 40 at B = 1
    calls = []

    def measure(packed, rows, int8):
        calls.append((type(packed).__name__, rows, int8))
        return {"plugin": "vitbit", "vitbit_us": 7.0, "dense_us": 6.0, "dense": "cuBLAS int8", "m": rows,
                "gpu": "TestGPU", "sm_count": 16}

    new, (row,) = rewrite_model(q, cfg(sparsity=0.0), None, ORIN, measurer=measure)
    assert calls == [("VitBitWeights", 40, True)]
    assert row["kernel"] == "none" and "vitbit 7.0 µs vs dense 6.0 µs (cuBLAS int8)" in row["reason"]
    assert row["measured"]["plugin"] == "vitbit"
    ops = [n.op_type for n in new.graph.node]
    assert "EdgeVitBitGemm" not in ops and "QuantizeLinear" in ops and "MatMul" in ops
    # faster than dense by the margin: the plugin node replaces the Q/DQ linear
    calls.clear()
    new, (row,) = rewrite_model(q, cfg(sparsity=0.0), None, ORIN,
                                measurer=lambda p, r, i: {"plugin": "vitbit", "vitbit_us": 5.0, "dense_us": 6.0,
                                                          "dense": "cuBLAS int8", "m": r, "gpu": "G", "sm_count": 16})
    assert row["kernel"] == "vitbit" and [n.op_type for n in new.graph.node].count("EdgeVitBitGemm") == 1


def test_timing_failure_falls_back_under_auto_and_fails_under_on(monkeypatch):
    import edgesdk.rewrite as rw

    monkeypatch.setattr(rw, "_host_gpu", lambda: ORIN_HOST)  # "this GPU is the target"

    def broken(packed, m, int8):
        raise RuntimeError("CUDA driver call failed: CUDA_ERROR_NO_BINARY_FOR_GPU (209)")

    monkeypatch.setattr(rw, "_measure_on_gpu", broken)
    # the timer compares against the module-level function, so patch before the rewrite creates it
    _, rows = rewrite_model(two_layer_model(), cfg(), None, ORIN)
    assert all(r["kernel"] == "bitmap" and r["measured"] is None for r in rows)
    assert rows[-1]["choice"].startswith("not measured: timing on this GPU failed (RuntimeError: CUDA driver")
    with pytest.raises(RuntimeError, match="NO_BINARY"):
        rewrite_model(two_layer_model(), cfg(measure="on"), None, ORIN)


@pytest.mark.parametrize("nbytes", [246_000, 395_364, 1_769_472, 64 << 20])
@pytest.mark.parametrize("l2", [4 << 20, 50 << 20, 60 << 20])  # Orin, H100, H200
def test_timed_operand_copies_span_twice_the_l2(nbytes, l2):
    """The build's timer compares a compressed layer with the dense one it replaces: both must miss L2. With
    at most 64 copies, 1536 x 576 at 70 % with int8 values (395,364 bytes) spanned 25 MB of an H100's 50 MB L2."""
    from edgesdk.kernels._cuda import rotation_copies

    c = rotation_copies(nbytes, l2)
    assert c >= 2 and c * nbytes >= 2 * l2
    assert (c - 2) * nbytes < 2 * l2 or c == 2  # not needlessly many
    assert rotation_copies(nbytes, l2, limit_bytes=4 * nbytes) <= 4  # memory cap still holds
