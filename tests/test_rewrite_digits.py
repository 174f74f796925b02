"""Accuracy cost of INT8 + sparsity on a real trained model: the bundled digits ViT.

``models/digits_vit.onnx`` (trained on scikit-learn's digits, 450 held-out images) is quantized
to INT8, pruned and rewritten to ``EdgeVitBitGemm`` nodes, and run through ONNX Runtime with the
reference ops. The issue's target is a top-1 drop <= 1.5 points at 50 % sparsity with the better
of magnitude/Wanda. With every layer at 50 % (``sparsity_scope="layer"``) this 69 k-parameter model
loses 3.3 (magnitude) / 6.0 (Wanda) points; one global magnitude threshold over all layers
(``--sparsity-scope global``: 50 % of all weights, sensitive layers keep more) loses < 1 point
(measured 2026-11-22 on this CPU). Neither criterion retrains. The test prints every figure.
"""

from pathlib import Path

import numpy as np
import onnx
import pytest

from edgesdk.config import BuildConfig
from edgesdk.devices import PROFILES
from edgesdk.inspect import find_linears
from edgesdk.ort import make_session
from edgesdk.quantize import quantize_int8
from edgesdk.rewrite import rewrite_model

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("sklearn")


@pytest.fixture(scope="module")
def digits():
    from models.recipes import digits_split

    x_train, x_test, _, y_test = digits_split()
    model = onnx.load(str(ROOT / "models" / "digits_vit.onnx"))
    calib = [{"x": x_train[i:i + 128]} for i in range(0, len(x_train), 128)]
    q = quantize_int8(model, calib, find_linears(model))

    def top1(m):
        return float(np.mean(make_session(m).run(None, {"x": x_test})[0].argmax(-1) == y_test))

    return model, q, calib, top1


def test_digits_int8_sparse_top1(digits, capsys):
    model, q, calib, top1 = digits
    base = top1(model)
    assert base > 0.9
    assert abs(top1(q) - base) <= 0.01  # INT8 alone
    drops = {}
    kept = {}
    for sparsity, scope in ((0.3, "layer"), (0.5, "layer"), (0.5, "global")):
        for method in ("magnitude", "wanda"):
            cfg = BuildConfig(sparsity=sparsity, prune=method, kernels="vitbit", sparsity_scope=scope)
            new, report = rewrite_model(q, cfg, calib, PROFILES["orin"])
            assert [r["kernel"] for r in report] == ["vitbit"] * len(report)
            drops[sparsity, scope, method] = 100 * (base - top1(new))
            weights = sum(r["shape"][0] * r["shape"][1] for r in report)
            kept[sparsity, scope, method] = sum(r["sparsity"] * r["shape"][0] * r["shape"][1] for r in report) / weights
    with capsys.disabled():
        print("\ndigits ViT top-1 drop (points) INT8 + sparsity:",
              {f"{s}/{sc}/{m}": round(d, 2) for (s, sc, m), d in drops.items()})
    for key, frac in kept.items():  # the sparsity asked for is the sparsity delivered, over all weights
        assert abs(frac - key[0]) < 0.02, (key, frac)
    assert min(drops[0.3, "layer", "magnitude"], drops[0.3, "layer", "wanda"]) <= 1.5
    assert min(drops[0.5, "global", "magnitude"], drops[0.5, "global", "wanda"]) <= 1.5  # the target


@pytest.mark.parametrize("sparsity", [0.2, 0.5])
def test_inspect_preview_matches_build_choice(digits, sparsity):
    """`edgesdk inspect`'s kernel preview on the float model = the kernels the rewrite of the INT8 model picks."""
    import json

    from typer.testing import CliRunner

    from edgesdk.cli import app

    model, q, calib, _ = digits
    cfg = BuildConfig(sparsity=sparsity, prune="magnitude", kernels="auto")
    _, report = rewrite_model(q, cfg, calib, PROFILES["orin"])
    res = CliRunner().invoke(app, ["inspect", str(ROOT / "models" / "digits_vit.onnx"), "--json",
                                   "--sparsity", str(sparsity)])
    assert res.exit_code == 0, res.output
    preview = {li["name"]: li["kernel"] for li in json.loads(res.output)["linears"]}
    built = {r["name"]: r["kernel"] for r in report}
    assert preview == built
    assert set(built.values()) == ({"vitbit", "bitmap"} if sparsity >= 0.3 else {"vitbit", "none"})
