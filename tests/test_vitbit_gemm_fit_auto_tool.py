"""tools/vitbit_gemm_fit_auto.py on the CPU: binning, the per-bin choice, the fallback for empty bins."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import vitbit_gemm_fit_auto as fa  # noqa: E402


def _write(tmp_path, rows, gelu=False, name="a.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"meta": {"sm_count": 132, "gelu": gelu}, "rows": rows}))
    return p


def _row(cfg, k, n, m, t, us, kind="shipped"):
    return {"config": cfg, "K": k, "N": n, "M": m, "kind": kind, "tactic": t, "us": us}


def test_features_and_bins():
    r, kt = fa.features(768, 2304, 197, 132)  # 2 x 18 tiles on 132 SMs, 6 k-tiles
    assert r == pytest.approx(36 / 132) and kt == 6
    assert fa.bin_of(r, kt) == (1, 1)
    assert fa.bin_of(0.1, 2) == (0, 0)
    assert fa.bin_of(100.0, 32) == (len(fa.R_EDGES), len(fa.KT_EDGES))
    assert fa.bin_of(fa.R_EDGES[2], fa.KT_EDGES[0]) == (3, 1)  # edges belong to the upper bin


def test_fit_picks_least_geomean_regret_and_fills_empty_bins(tmp_path):
    rows = []
    # small r (M = 128 on 132 SMs, N = 128: r < 0.25): tactic 72 wins on both cases, 82 loses
    for k in (768, 1024):
        rows += [_row("full", k, 128, 128, 72, 1.0), _row("full", k, 128, 128, 82, 2.0)]
    # large r on 16 SMs: 82 wins once by a lot, 72 once by a little -> 82 (geomean)
    rows += [_row("green16", 768, 2048, 2048, 72, 1.0), _row("green16", 768, 2048, 2048, 82, 1.02)]
    rows += [_row("green16", 1024, 2048, 2048, 72, 2.0), _row("green16", 1024, 2048, 2048, 82, 1.0)]
    # an unchecked kind is ignored
    rows += [_row("full", 768, 128, 128, 82, 0.1, kind="noepi")]
    cases = fa.load_cases([_write(tmp_path, rows)])
    assert len(cases) == 4
    table = fa.fit(cases)
    assert table[fa.bin_of(*fa.features(768, 128, 128, 132))] == 72
    assert table[fa.bin_of(*fa.features(768, 2048, 2048, 16))] == 82
    assert set(table) == {(i, j) for i in range(len(fa.R_EDGES) + 1) for j in range(len(fa.KT_EDGES) + 1)}
    assert table[(0, 0)] == 72 and table[(len(fa.R_EDGES), len(fa.KT_EDGES))] == 82  # filled from neighbours


def test_repeats_are_merged_by_median(tmp_path):
    a = _write(tmp_path, [_row("full", 768, 128, 128, 72, 1.0), _row("full", 768, 128, 128, 82, 3.0)], name="a.json")
    b = _write(tmp_path, [_row("full", 768, 128, 128, 72, 5.0), _row("full", 768, 128, 128, 82, 1.0)], name="b.json")
    c = _write(tmp_path, [_row("full", 768, 128, 128, 72, 1.2), _row("full", 768, 128, 128, 82, 2.0)], name="c.json")
    (case,) = fa.load_cases([a, b, c])
    assert case["times"] == {72: 1.2, 82: 2.0} and case["best_tactic"] == 72


def test_a_tactic_missing_in_a_case_is_not_a_candidate_of_its_bin(tmp_path):
    rows = [_row("full", 768, 128, 128, 72, 1.0), _row("full", 768, 128, 128, 82, 1.5), _row("full", 768, 128, 128, 50, 0.5),
            _row("full", 1024, 128, 128, 72, 1.0), _row("full", 1024, 128, 128, 82, 1.5)]
    table = fa.fit(fa.load_cases([_write(tmp_path, rows)]))
    assert table[fa.bin_of(*fa.features(768, 128, 128, 132))] == 72
