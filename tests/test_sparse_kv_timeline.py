"""CPU checks of tools/sparse_kv_timeline.py's arithmetic: the stamp analysis."""

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import sparse_kv_timeline as tl  # noqa: E402


def stamps(blocks):
    """[blk, 16, 2] stamps from per-block dicts {k: (globaltimer ns, clock)}."""
    st = np.zeros((len(blocks), 16, 2), np.uint64)
    for b, d in enumerate(blocks):
        for k, v in d.items():
            st[b, k] = v
    return st


def test_analyse_phases_and_stale_stamps():
    # 1 GHz clocks (1 ns per clock); block 1 starts 400 ns later; block 2 ran past its sequence (stamp 0 only).
    b0 = {0: (1000, 10), 8: (3000, 2010), 1: (3500, 2510), 2: (9500, 8510), 3: (10000, 9010), 4: (10500, 9510),
          5: (11500, 10510), 6: (12500, 11510), 7: (5, 0)}
    b1 = {0: (1400, 50), 8: (3400, 2050), 1: (3900, 2550), 2: (8900, 7550), 3: (9400, 8050), 4: (9900, 8550),
          5: (10900, 9550), 6: (400, 3), 7: (9, 0)}  # stamp 6 left by an earlier call (older clock): not this call's
    b2 = {0: (1200, 70), 7: (11, 0)}
    a = tl.analyse(stamps([b0, b1, b2]), 3, fused=True)
    assert a["blocks"] == 2 and a["sms"] == 2 and a["clock_ghz"] == pytest.approx(1.0)
    assert a["start_spread"] == pytest.approx(0.4)
    assert a["start_to_first_decode"] == pytest.approx(2.0) and a["start_to_first_tile"] == pytest.approx(2.5)
    assert a["tiles"] == pytest.approx(5.5) and a["tiles_max"] == pytest.approx(6.0)
    assert a["block_merge"] == pytest.approx(0.5) and a["hand_over"] == pytest.approx(1.0)
    assert a["merge"] == pytest.approx(1.0) and a["merge_max"] == pytest.approx(1.0)  # block 0's only
    assert a["split_done_last"] == pytest.approx(9.5) and a["end"] == pytest.approx(11.5)
    u = tl.analyse(stamps([b0, b1]), 2, fused=False)
    assert "hand_over" not in u and "merge" not in u and u["end"] == u["split_done_last"]
