"""CPU tests of the session-36 exploration tool (docs/bitmap_linear.md, round 15): the lane-owned-bank records of
tools/bitmap_lanebank_explore.py hold the balanced-pruned W, and a lane-by-lane numpy model of the kernel's data
path (scatter into the lane's own bank, XOR-diagonal reads into mma fragments, the epilogue's output rows) gives
X . W^T. (The kernel itself needs a GPU: the tool checks every output against float64 there.)"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import bitmap_lanebank_explore as lbe  # noqa: E402


def test_tile_channels_cover_each_step_once():
    ch = lbe.tile_channels()  # [b, p, e]
    assert sorted(ch.reshape(-1)) == list(range(32))
    # read k = 4 h + l hands lane (g, q) k-tile l ^ q, pair q: channels 8 q + 2 l + e, for every l and q
    for l in range(4):
        for q in range(4):
            assert list(ch[l ^ q, q]) == [8 * q + 2 * l, 8 * q + 2 * l + 1]


@pytest.mark.parametrize("keep", [19, 32, 45])
def test_records_hold_the_balanced_weights(keep):
    k, n = 96, 128
    wp, rec = lbe.lanebank(k, n, keep, 5)
    assert rec.nbytes == (n // 8) * (k // 8) * lbe.record_bytes(keep)
    # every tile (8 rows x the 8 channels of one k-tile) keeps exactly `keep`; the tiles partition W
    t = lbe._tiles((wp != 0).astype(np.int8))
    assert (t.sum(axis=-1) == keep).all()
    assert t.sum() == (wp != 0).sum()
    np.testing.assert_array_equal(lbe._untile(lbe._tiles(wp), n, k), wp)
    r = lbe.record_bytes(keep)
    logical = rec.reshape(-1, r // 8, 16, 8).transpose(0, 2, 1, 3).reshape(-1, r)
    if keep % 4:
        assert not logical[:, 8 + 2 * keep:].any(), "padding must be zero"


@pytest.mark.parametrize("keep,m", [(19, 1), (19, 11), (32, 16), (45, 5)])
def test_kernel_model_matches_float64(keep, m):
    k, n = 64, 128  # 2 row groups x 2 steps
    wp, rec = lbe.lanebank(k, n, keep, 17 + m)
    x = np.random.default_rng(m).uniform(-1, 1, (m, k)).astype(np.float16)
    want = x.astype(np.float64) @ wp.astype(np.float64).T
    got = lbe.simulate(rec, x, k, n, keep)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_kernel_model_catches_a_wrong_channel_order():
    k, n, keep = 32, 64, 19
    wp, rec = lbe.lanebank(k, n, keep, 3)
    x = np.random.default_rng(0).uniform(-1, 1, (3, k)).astype(np.float16)
    want = x.astype(np.float64) @ wp.astype(np.float64).T
    swapped = x.copy()
    swapped[:, [0, 2]] = swapped[:, [2, 0]]
    assert not np.allclose(lbe.simulate(rec, swapped, k, n, keep), want)


def test_rule_ky():
    # 4096 x 4096 (S = 128 steps, 64 row groups), 8 warps, 2 blocks per SM on 132 SMs
    ky = lbe.rule_ky(128, 64, 8, 2, 132)
    assert ky in lbe.KYS and 128 // ky >= 8
    assert lbe.rule_ky(4, 9, 8, 1, 132) == 1  # too few steps to split


@pytest.mark.parametrize("mode,keep,m", [("half", 19, 1), ("half", 32, 9), ("pair", 10, 3), ("pair", 16, 16)])
def test_kernel_model_other_walks(mode, keep, m):
    k, n = 64, 128
    wp, rec = lbe.lanebank(k, n, keep, 23 + m, mode)
    assert rec.nbytes == (n // 8) * (k // 8) * lbe.record_bytes(keep, mode)
    nz = lbe._tiles((wp != 0).astype(np.int8))
    if mode == "half":  # (keep + 1) // 2 of the even channels, keep // 2 of the odd ones, per tile
        assert (nz[..., :32].sum(axis=-1) == (keep + 1) // 2).all()
        assert (nz[..., 32:].sum(axis=-1) == keep // 2).all()
    else:  # pairs of adjacent channels kept together, keep pairs per tile
        assert (nz[..., :32] == nz[..., 32:]).all()
        assert (nz[..., :32].sum(axis=-1) == keep).all()
    x = np.random.default_rng(m).uniform(-1, 1, (m, k)).astype(np.float16)
    want = x.astype(np.float64) @ wp.astype(np.float64).T
    np.testing.assert_allclose(lbe.simulate(rec, x, k, n, keep, mode), want, rtol=1e-12, atol=1e-12)


def test_sparsity_of_the_modes():
    assert lbe.sparsity_of(19) == 1 - 19 / 64
    assert lbe.sparsity_of(10, "pair") == 0.6875
    with pytest.raises(ValueError, match="elem, half or pair"):
        lbe.lanebank(32, 64, 10, 0, "quad")


@pytest.mark.parametrize("sparsity", [0.5, 0.7])
def test_eval_pruning_masks_of_the_walks(sparsity):
    import eval_pruning

    score = np.random.default_rng(1).random((24, 40))
    keep = int(round((1 - sparsity) * 64))
    half = eval_pruning.tile8half_mask(score, sparsity).reshape(3, 8, 5, 8)
    assert (half[..., 0::2].sum(axis=(1, 3)) == (keep + 1) // 2).all()
    assert (half[..., 1::2].sum(axis=(1, 3)) == keep // 2).all()
    pair = eval_pruning.tile8pair_mask(score, sparsity).reshape(3, 8, 5, 8)
    assert (pair[..., 0::2] == pair[..., 1::2]).all()
    assert (pair[..., 0::2].sum(axis=(1, 3)) == int(round((1 - sparsity) * 32))).all()
    # the kept pairs are the best by summed score: the lowest kept pair beats the highest pruned one, per tile
    t = score.reshape(3, 8, 5, 8).transpose(0, 2, 1, 3).reshape(3, 5, 32, 2).sum(-1)
    pm = pair.transpose(0, 2, 1, 3).reshape(3, 5, 32, 2)[..., 0]
    assert (np.where(pm, t, np.inf).min(-1) >= np.where(pm, -np.inf, t).max(-1)).all()
    from edgesdk.sparsify import row_mask
    odd = np.random.default_rng(2).random((12, 20))  # off the 8 x 8 grid: per row
    np.testing.assert_array_equal(eval_pruning.tile8pair_mask(odd, 0.5), row_mask(odd, 0.5))
