"""CPU tests of the session-35 exploration tools (docs/bitmap_linear.md, round 14): the balanced records of
tools/bitmap_balanced_explore.py decode back to the pruned W, the store-order schedule lowers the modelled bank
conflicts, and tools/eval_pruning.py's 8 x 8 tile mask keeps exactly its count per tile. (The kernel itself needs a
GPU: the tool checks every output against float64 there.)"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import bitmap_balanced_explore as bbe  # noqa: E402
import eval_pruning  # noqa: E402


def _decode(rec: np.ndarray, k: int, n: int, keep: int, sched: bool) -> np.ndarray:
    """Records (chunk-major, kernel order) -> W [n, k], as the kernel's walks place them."""
    r_bytes = bbe.record_bytes(keep)
    logical = rec.reshape(-1, r_bytes // 8, 16, 8).transpose(0, 2, 1, 3).reshape(-1, r_bytes)
    cols = bbe.tile_columns(k)
    kt = k // 8
    w = np.zeros((n, k), dtype=np.float16)
    for idx, r in enumerate(logical):
        p, rem = divmod(idx, 2 * kt)
        t, s = divmod(rem, 2)
        bits = int(r[:8].view("<u8")[0])
        vals = r[8:8 + 2 * keep].view("<f2")
        x = int(r[r_bytes - 2:].view("<u2")[0]) if sched else 0
        assert x % 2 == 0 and x < 64
        assert bin(bits).count("1") == keep
        if not sched:
            assert not r[8 + 2 * keep:].any(), "padding must be zero"
        j = 0
        for b in range(64):
            if bits >> b & 1:
                pos = b ^ x
                w[8 * (2 * p + s) + pos // 8, cols[8 * t + pos % 8]] = vals[j]
                j += 1
    return w


@pytest.mark.parametrize("keep,sched", [(19, False), (19, True), (32, False), (45, True)])
def test_records_decode_to_the_pruned_weights(keep, sched):
    k, n = 256, 48
    wp, rec, wf = bbe.balanced(k, n, keep, 11, sched=sched)
    assert rec.nbytes == (n // 8) * (k // 8) * bbe.record_bytes(keep)
    # every 8 x 8 tile (8 rows x the 8 columns of a k-tile) keeps exactly `keep`
    tiles = (wp != 0)[:, bbe.tile_columns(k)].reshape(n // 8, 8, k // 8, 8).sum(axis=(1, 3))
    assert (tiles == keep).all()
    np.testing.assert_array_equal(_decode(rec, k, n, keep, sched), wp)
    assert wf > keep  # at least one wavefront per store instruction, and random positions conflict


def test_tile_columns_is_a_permutation_with_contiguous_lane_pairs():
    cols = bbe.tile_columns(384)
    assert sorted(cols) == list(range(384))
    # k-tile t = 16 i + 2 q + h, column c = 2 j + e -> 128 i + 32 j + 4 q + 2 h + e
    t, c = 16 * 2 + 2 * 3 + 1, 2 * 2 + 1
    assert cols[8 * t + c] == 128 * 2 + 32 * 2 + 4 * 3 + 2 * 1 + 1


def test_schedule_lowers_the_modelled_wavefronts():
    k, n = 512, 64
    _, _, plain = bbe.balanced(k, n, 19, 5)
    _, _, sched = bbe.balanced(k, n, 19, 5, sched=True)
    assert sched < 0.8 * plain
    # the model itself: 32 lanes storing to one bank each instruction -> one wavefront per store
    banks = np.tile(np.arange(32)[None, :, None], (1, 1, 19))
    assert bbe.wavefronts(banks)[0] == 19
    assert bbe.wavefronts(np.zeros((1, 32, 19), dtype=np.int64))[0] == 32 * 19


def test_schedule_refuses_records_without_padding():
    with pytest.raises(AssertionError, match="padding"):
        bbe.balanced(256, 32, 32, 1, sched=True)


@pytest.mark.parametrize("sparsity", [0.5, 0.7])
def test_tile8_mask_keeps_exactly_its_count_per_tile(sparsity):
    score = np.random.default_rng(3).random((24, 40))
    m = eval_pruning.tile8_mask(score, sparsity)
    keep = round((1 - sparsity) * 64)
    assert (m.reshape(3, 8, 5, 8).sum(axis=(1, 3)) == keep).all()
    # the kept ones are each tile's highest scores
    t = score.reshape(3, 8, 5, 8).transpose(0, 2, 1, 3).reshape(3, 5, 64)
    mt = m.reshape(3, 8, 5, 8).transpose(0, 2, 1, 3).reshape(3, 5, 64)
    assert (t[mt].reshape(3, 5, keep).min(axis=2) >= t[~mt].reshape(3, 5, 64 - keep).max(axis=2)).all()


def test_tile8_mask_falls_back_to_rows_off_the_grid():
    from edgesdk.sparsify import row_mask

    score = np.random.default_rng(4).random((12, 40))  # 12 rows: not a multiple of 8
    np.testing.assert_array_equal(eval_pruning.tile8_mask(score, 0.5), row_mask(score, 0.5))


def test_tile8_mask_fallback_while_it_replaces_row_mask(monkeypatch):
    # --mask tile8 installs tile8_mask as edgesdk.sparsify.row_mask; its fallback must not call itself
    import edgesdk.sparsify as sp

    score = np.random.default_rng(5).random((12, 40))
    want = sp.row_mask(score, 0.5)
    monkeypatch.setattr(sp, "row_mask", eval_pruning.tile8_mask)
    np.testing.assert_array_equal(eval_pruning.tile8_mask(score, 0.5), want)
