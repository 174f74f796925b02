"""The plugin check tools' CPU side: one-layer plugin models, node extraction, reference comparison.

``tools/trt_smoke.py`` (TensorRT) and ``tools/plugin_launch_check.py`` (GPU) build on these; here the
same models run through ``edgesdk.Engine(..., backend="onnxruntime")`` (the ORT reference ops).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from _plugin_ref import compare, one_layer_model, plugin_layers  # noqa: E402

from edgesdk import Engine  # noqa: E402
from edgesdk.formats.bitmap_linear import BitmapLinearWeights  # noqa: E402
from edgesdk.formats.vitbit_gemm import VitBitWeights, quantize_weights  # noqa: E402

RNG = np.random.default_rng(606)
N, K = 37, 75


def _weights():
    w = RNG.standard_normal((N, K))
    w[RNG.random(w.shape) < 0.6] = 0
    return w


CASES = {
    "bitmap fp16 values + bias": ("bitmap_linear", lambda: BitmapLinearWeights.pack(
        _weights(), "float16", bias=RNG.standard_normal(N).astype(np.float32))),
    "bitmap int8 values": ("bitmap_linear", lambda: BitmapLinearWeights.pack(_weights(), "int8")),
    "vitbit 8-bit + bias + gelu": ("vitbit_gemm", lambda: VitBitWeights.pack(
        *quantize_weights(_weights()), 8, bias=RNG.standard_normal(N), x_scale=0.04, gelu=True)),
    "vitbit 4-bit": ("vitbit_gemm", lambda: VitBitWeights.pack(*quantize_weights(_weights(), 4), 4, x_scale=0.04)),
}


def test_one_layer_model_with_quantize_linear_in_front(tmp_path):
    """The smoke test's int8-X case (QuantizeLinear -> VitBit node reading int8): runs on ONNX Runtime and
    equals the reference of the float input (ORT's Q rounds x / x_scale like the reference)."""
    packed = VitBitWeights.pack(*quantize_weights(_weights()), 8, bias=RNG.standard_normal(N), x_scale=0.04,
                                y_dtype="float32")
    model = one_layer_model("vitbit_gemm", packed, np.float32, ["batch", 5, K], quantize_x=True)
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node] == ["QuantizeLinear", "EdgeVitBitGemm"]
    (layer,) = plugin_layers(model)
    onnx.save(model, tmp_path / "model.onnx")
    x = (RNG.standard_normal((3, 5, K)) * 3).astype(np.float32)
    x.reshape(-1)[:3] = [1000.0, -1000.0, 2.5 * 0.04]  # saturation and a rounding tie
    with Engine(tmp_path / "model.onnx", backend="onnxruntime") as eng:
        y = eng.infer({"X": x})["Y"]
    assert y.dtype == np.float32 and y.shape == (3, 5, N)
    ok, err, rule = compare(layer, x, y)
    assert ok and rule == "bit-exact", (err, rule)
    with pytest.raises(ValueError, match="quantize_x needs"):
        one_layer_model("vitbit_gemm", packed, np.float16, ["batch", 5, K], quantize_x=True)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_one_layer_models_run_and_match_the_reference(case, dtype, tmp_path):
    op, make = CASES[case]
    packed = make()
    model = one_layer_model(op, packed, dtype, ["batch", 5, K])
    onnx.checker.check_model(model)
    (layer,) = plugin_layers(model)
    assert layer.op == op and layer.n == N and layer.k == K
    assert layer.attrs == {k: v for k, v in packed.node_attributes().items()} | (
        {"x_scale": pytest.approx(packed.x_scale)} if op == "vitbit_gemm" else {})
    assert list(layer.tensors) == list(packed.to_tensors())
    onnx.save(model, tmp_path / "model.onnx")
    x = (RNG.standard_normal((3, 5, K)) * 3).astype(dtype)
    with Engine(tmp_path / "model.onnx", backend="onnxruntime") as eng:
        y = eng.infer({"X": x})["Y"]
    assert y.dtype == dtype and y.shape == (3, 5, N)
    ok, err, rule = compare(layer, x, y)
    assert ok, (err, rule)
    # the comparison catches wrong outputs: NaN poison left in place, or values off by a little
    poisoned = y.copy()
    poisoned.reshape(-1)[RNG.integers(y.size)] = np.nan
    assert not compare(layer, x, poisoned)[0]
    off = y.copy()
    i = int(np.argmax(np.abs(y.astype(np.float64))))
    off.reshape(-1)[i] = off.reshape(-1)[i] * dtype(1.01) + dtype(0.01)
    assert not compare(layer, x, off)[0]


def test_trt_smoke_cases_are_valid_models(tmp_path):
    """tools/trt_smoke.py's weight variants and inputs run on ONNX Runtime (so on a Jetson only TensorRT is new)."""
    import trt_smoke

    for label, op, packed in trt_smoke.variants(np.random.default_rng(1)):
        for dtype in (np.float16, np.float32):
            model = one_layer_model(op, packed, dtype, ["batch", trt_smoke.TOKENS, packed.node_attributes()["k"]])
            (layer,) = plugin_layers(model)
            x = trt_smoke.make_x(op, packed, 2, dtype, RNG)
            path = tmp_path / f"{op}.onnx"
            onnx.save(model, path)
            with Engine(path, backend="onnxruntime") as eng:
                assert compare(layer, x, eng.infer({"X": x})["Y"])[0], label


def test_trt_smoke_kv_folder_runs_up_to_tensorrt(tmp_path, monkeypatch):
    """tools/trt_smoke.py's kv-sparsify folder check: its source build and the folder (verified on ONNX Runtime) are
    made here too (the "host" device profile, which needs a GPU, read as "orin"); without TensorRT it records the
    missing engine and stops."""
    import trt_smoke

    import edgesdk.build
    from edgesdk.devices import get_profile

    monkeypatch.setattr(edgesdk.build, "get_profile", lambda name: get_profile("orin" if name == "host" else name))
    got = []
    monkeypatch.setattr(trt_smoke, "record", lambda name, ok, **info: got.append((name, ok, info)) or ok)
    trt_smoke.sparse_kv_folder(tmp_path)
    assert [(n, ok) for n, ok, _ in got] == [("sparse_kv 70% / kv-sparsify folder: build", False)]
    assert "TensorRT is not installed" in got[0][2]["reason"]
    import json

    report = json.loads((tmp_path / "kv-70" / "report.json").read_text())
    assert report["verified"] is True and report["sparse_kv"]["capacity"] == 96


def test_launch_check_groups_rows_per_build_op_dtype_and_m():
    """The committed launch-path JSON's groups: default = what tactic 0 resolves to, best = per layer."""
    pytest.importorskip("cuda.bindings", reason="tools/plugin_launch_check.py imports cuda-python (extra [gpu])")
    import plugin_launch_check as plc

    def row(layer, tactic, gpu, ok=True, err=1e-3, m=1, build="b8"):
        r = {"build": build, "layer": layer, "op": "bitmap_linear", "x_dtype": "float16", "m": m,
             "tactic": tactic, "ok": ok, "max_abs_err": err, "rule": "within reference.tolerance()"}
        if gpu is not None:
            r.update(gpu_us=gpu, host_enqueue_us=20.0 + gpu)
        return r

    rows = [row("a", 1, 3.0), row("a", 2, 2.0), row("b", 1, 5.0), row("b", 7, 4.0),
            row("c", 1, 7.0, err=4e-3), row("c", 2, 9.0), row("a", "graph(default)", None, ok=False),
            row("a", 1, 1.0, m=17)]
    groups = {(g["build"], g["m"]): g for g in plc.group_rows(rows)}
    g = groups[("b8", 1)]
    assert (g["layers"], g["launches"], g["all_ok"], g["max_abs_err"]) == (3, 7, False, 4e-3)
    assert g["gpu_us_default_median_over_layers"] == 5.0  # tactic 1 on a, b, c: 3, 5, 7
    assert g["gpu_us_best_median_over_layers"] == 4.0  # best per layer: 2, 4, 7
    assert g["host_us_per_enqueue_median"] == 24.5  # host µs of the six timed rows: 22, 23, 24, 25, 27, 29
    assert groups[("b8", 17)]["launches"] == 1 and groups[("b8", 17)]["all_ok"]
