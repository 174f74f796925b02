"""Pruning: per-row magnitude and Wanda, global vs per-layer, exclusion."""

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.sparsify import activation_norms, is_excluded, prune, row_mask, scores


def _ref_keep(score, sparsity):
    """Independent loop reference: drop the `round(s*K)` smallest scores of each row (first index wins ties)."""
    n, k = score.shape
    drop = int(round(sparsity * k))
    keep = np.ones((n, k), bool)
    for r in range(n):
        idx = sorted(range(k), key=lambda j: (score[r, j], j))[:drop]
        keep[r, idx] = False
    return keep


@pytest.mark.parametrize("shape", [(1, 1), (3, 67), (17, 130), (5, 2)])
@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.77, 1.0])
def test_row_mask_matches_loop_reference(shape, sparsity):
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    score = rng.standard_normal(shape) ** 2
    score[:, ::7] = score[:, :1]  # ties
    keep = row_mask(score, sparsity)
    assert np.array_equal(keep, _ref_keep(score, sparsity))
    assert np.all((~keep).sum(1) == int(round(sparsity * shape[1])))


def test_magnitude_prunes_smallest_per_row_and_keeps_dtype():
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float16, np.int8):
        w = (rng.standard_normal((9, 71)) * 40).astype(dtype)
        w[w == 0] = 1
        out, (st,) = prune({"l": w}, 0.5)
        p = out["l"]
        assert p.dtype == w.dtype
        kept = p != 0
        assert np.all(kept.sum(1) == 71 - 36)
        assert np.array_equal(p[kept], w[kept])
        a = np.abs(w.astype(np.float64))
        for r in range(9):
            assert a[r][kept[r]].min() >= a[r][~kept[r]].max()
        assert st.sparsity == pytest.approx(36 / 71)


def test_wanda_matches_reference_and_differs_from_magnitude():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 11, 33)) * np.exp(rng.standard_normal(33))  # uneven feature scales
    w = rng.standard_normal((13, 33)).astype(np.float32)
    norms = activation_norms(x)
    ref_norm = np.array([np.sqrt(sum(float(v) ** 2 for v in x[..., k].ravel())) for k in range(33)])
    np.testing.assert_allclose(norms, ref_norm, rtol=1e-12)
    pw, _ = prune({"l": w}, 0.5, "wanda", {"l": norms})
    keep_ref = _ref_keep(np.abs(w.astype(np.float64)) * ref_norm[None], 0.5)
    assert np.array_equal(pw["l"] != 0, keep_ref)
    pm, _ = prune({"l": w}, 0.5, "magnitude")
    assert not np.array_equal(pm["l"] != 0, pw["l"] != 0)
    # Wanda's point: smaller output error on the calibration inputs than magnitude.
    x2 = x.reshape(-1, 33)
    err = lambda p: np.linalg.norm(x2 @ (w - p).T.astype(np.float64))  # noqa: E731
    assert err(pw["l"]) < err(pm["l"])


def test_scores_validation():
    w = np.ones((2, 3))
    with pytest.raises(EdgeSDKError, match="calibration"):
        scores(w, "wanda")
    with pytest.raises(EdgeSDKError, match="K=3"):
        scores(w, "wanda", np.ones(4))
    with pytest.raises(EdgeSDKError, match="unknown pruning method"):
        scores(w, "random")
    with pytest.raises(EdgeSDKError, match="non-finite"):
        scores(w, "wanda", np.array([1.0, np.nan, 1.0]))
    with pytest.raises(EdgeSDKError, match=r"\[N, K\]"):
        scores(np.ones(3))


def test_global_scope_moves_sparsity_to_small_layers():
    rng = np.random.default_rng(2)
    big = rng.standard_normal((8, 64)).astype(np.float32)
    small = (rng.standard_normal((8, 64)) * 0.1).astype(np.float32)
    out, stats = prune({"big": big, "small": small}, 0.5, scope="global")
    by = {s.name: s for s in stats}
    assert by["small"].sparsity > 0.8 and by["big"].sparsity < 0.2
    total = sum((o == 0).sum() for o in out.values()) / (2 * 8 * 64)
    assert abs(total - 0.5) <= 8 / (2 * 8 * 64) + 1e-9  # per-row rounding only
    for o in out.values():  # still balanced per row
        assert len(set((o == 0).sum(1))) == 1


def test_exclusion_and_errors():
    rng = np.random.default_rng(3)
    ws = {n: rng.standard_normal((4, 8)).astype(np.float32) for n in ("blocks.0.attn.qkv", "blocks.0.mlp.fc1", "lm_head")}
    out, stats = prune(ws, 0.5, exclude=["lm_head", r"attn\.qkv$"])
    assert np.array_equal(out["lm_head"], ws["lm_head"]) and np.array_equal(out["blocks.0.attn.qkv"], ws["blocks.0.attn.qkv"])
    assert {s.name: s.method for s in stats} == {"blocks.0.attn.qkv": "excluded", "blocks.0.mlp.fc1": "magnitude", "lm_head": "excluded"}
    assert is_excluded("model.layers.3.mlp.down_proj", [r"layers\.3\."])
    with pytest.raises(EdgeSDKError, match="regular expression"):
        is_excluded("x", ["blocks.(0"])
    with pytest.raises(EdgeSDKError, match="outside"):
        prune(ws, 1.5)
    with pytest.raises(EdgeSDKError, match="scope"):
        prune(ws, 0.5, scope="model")
    with pytest.raises(EdgeSDKError, match="no calibration activations"):
        prune(ws, 0.5, "wanda", {"lm_head": np.ones(8)})
