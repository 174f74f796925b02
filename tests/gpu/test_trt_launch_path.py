"""The TensorRT plugins' enqueue path on a GPU, without TensorRT (tools/plugin_launch_check.py).

One-layer models of every weight variant go through the plugin-field round trip and
``edgesdk.trt._logic.enqueue`` with raw ``cuMemAlloc`` pointers and a raw ``cuStreamCreate`` stream,
for every tactic, fp16 and fp32 X, odd M; outputs are NaN-poisoned first and compared with the
numpy reference. One launch per layer is also captured in a CUDA graph (global capture mode).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))


@pytest.fixture(scope="module")
def tools():
    import plugin_launch_check as plc
    import trt_smoke

    from edgesdk.kernels._cuda import init

    init()
    return plc, trt_smoke


def test_enqueue_path_matches_reference_for_every_variant_and_tactic(tools):
    from _plugin_ref import one_layer_model, plugin_layers

    plc, trt_smoke = tools
    cu, check = plc.cu, plc.check
    stream = check(cu.cuStreamCreate(1))
    rng = np.random.default_rng(7)
    rows = []
    try:
        for label, op, packed in trt_smoke.variants(np.random.default_rng(5)):
            (layer,) = plugin_layers(one_layer_model(op, packed, np.float16, ["b", 17, packed.node_attributes()["k"]]))
            rows += plc.check_layer(layer, [1, 5, 51], stream, rng, timing_reps=0)
    finally:
        check(cu.cuStreamDestroy(stream))
    bad = [r for r in rows if not r["ok"]]
    assert rows and not bad, bad[:5]
    assert any(r["tactic"] == "graph(default)" for r in rows)


def test_runtime_host_buffers_round_trip(tools):
    plc, _ = tools
    assert all(r["ok"] for r in plc.check_runtime_buffers())
