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


def test_wave_model_recovers_a_wave_law_and_picks_by_it(tmp_path):
    # times that follow us = a + b W + c W kt exactly (W = ceil(tiles / (blocks x SMs))), for two tactics whose
    # tiles quantize differently: the fit must give back (a, b, c) and pick the tactic the law says is faster
    law = {72: (2.0, 0.3, 0.05), 82: (3.0, 0.9, 0.4)}
    per_sm = {72: 6, 82: 2}
    rows, truth = [], {}
    for cfg, sms in (("full", 132), ("green16", 16)):
        for k in (384, 768, 1536, 3072):
            for n in (384, 1152, 3072):
                for m in (197, 1576, 6304):
                    us = {}
                    for t, (a, b, c) in law.items():
                        cf, _ = fa.config(t)
                        w = -(-(-(-m // cf.bm) * -(-n // cf.bn)) // (per_sm[t] * sms))
                        us[t] = a + b * w + c * w * (-(-k // 128))
                        rows.append(_row(cfg, k, n, m, t, us[t]) | {"blocks_per_sm": per_sm[t]})
                    assert us[72] != us[82]
                    truth[(cfg, k, n, m)] = min(us, key=us.get)
    cases = fa.load_cases([_write(tmp_path, rows)])
    coef = fa.fit_waves(cases)
    for t, abc in law.items():
        assert coef[t] == pytest.approx(abc, rel=1e-6)
    picks = {(c["config"], c["K"], c["N"], c["M"]): fa.wave_pick(coef, c) for c in cases}
    assert picks == truth
    only = fa.fit_waves(cases, {72})  # --wave-tactics: the candidates fitted (and picked from)
    assert set(only) == {72} and only[72] == pytest.approx(coef[72])
    assert {fa.wave_pick(only, c) for c in cases} == {72}
    assert set(truth.values()) == {72, 82}  # the law makes each tactic win somewhere


def test_wave_model_needs_occupancy_and_skips_split_m(tmp_path):
    rows = [_row("full", 768, 768, m, t, 1.0 + t / 100 + m / 1e4) for m in (197, 1576, 6304) for t in (33, 60)]
    cases = fa.load_cases([_write(tmp_path, rows)])
    assert fa.fit_waves(cases) == {} and fa.wave_pick({}, cases[0]) is None
    rows = [r | {"blocks_per_sm": 3} for r in rows]
    cases = fa.load_cases([_write(tmp_path, rows, name="b.json")])
    coef = fa.fit_waves(cases)
    assert set(coef) == {33}  # 60 runs two kernels: not a wave-model candidate
    assert all(fa.wave_pick(coef, c) == 33 for c in cases)


def test_benchmark_rows_are_read_as_tactics(tmp_path):
    def b(v, us):
        return {"config": "full", "K": 768, "N": 768, "M": 197, "B": 1, "variant": v, "us": us}
    rows = [b("torch._int_mm", 0.5), b("ours gemm t72 tp_32x32", 2.0), b("ours gemm t1 auto=t33", 3.0),
            b("ours gemm t33 tp_64x64", 5.0), b("ours gemm t1 repeat (noise check)", 0.1),
            b("ours op t1 (quantize+gemm)", 0.2)]
    (case,) = fa.load_cases([_write(tmp_path, rows)], blocks_per_sm={72: 6})
    assert case["times"] == {72: 2.0, 33: 4.0}  # the auto row times its tactic: median with the tactic's own row
    assert case["blocks_per_sm"] == {72: 6}


def test_leave_one_layer_out_never_fits_on_the_layer_it_picks_for(tmp_path):
    # layer A says 72, layer B says 82 (same bin): left out, each gets the other's choice
    rows = [_row("full", 768, 128, 128, 72, 1.0), _row("full", 768, 128, 128, 82, 2.0),
            _row("full", 1024, 128, 128, 72, 2.0), _row("full", 1024, 128, 128, 82, 1.0)]
    picks = fa.leave_one_layer_out(fa.load_cases([_write(tmp_path, rows)]))
    assert {(p["case"]["K"], p["bins"], p["wave"]) for p in picks} == {(768, 82, None), (1024, 72, None)}


def test_tactic_1_rows_are_the_launchers_choice_not_a_candidate(tmp_path):
    rows = [_row("full", 768, 128, 128, 72, 1.0), _row("full", 768, 128, 128, 82, 2.0), _row("full", 768, 128, 128, 1, 1.1)]
    (case,) = fa.load_cases([_write(tmp_path, rows)])
    assert case["times"] == {72: 1.0, 82: 2.0} and case["auto_us"] == 1.1
    rows = [_row("full", 768, 128, 128, 72, 1.0)]
    assert fa.load_cases([_write(tmp_path, rows, name="b.json")])[0]["auto_us"] is None


def test_rules_of_the_report(tmp_path):
    # round-10 bins: 72 below half a tile per SM, 33 below one, 29 at long K below 4, else 82
    def case(k, n, m, sms=132):
        r, kt = fa.features(k, n, m, sms)
        return {"K": k, "N": n, "M": m, "sms": sms, "r": r, "kt": kt}
    assert [fa.rule_r10(case(768, 768, m)) for m in (197, 1576, 6304)] == [72, 33, 82]
    assert fa.rule_r10(case(3072, 768, 6304)) == 29
    c = case(768, 768, 197) | {"blocks_per_sm": {}}
    assert fa.rule_shipped(c) is None  # no occupancy recorded: the shipped rule cannot pick
    c["blocks_per_sm"] = {60: 2}  # only a tactic that is not the rule's candidate
    assert fa.rule_shipped(c) is None
    c["blocks_per_sm"] = {t: 0 for t in fa.WAVE_TACTICS} | {33: 2}
    assert fa.rule_shipped(c) == 33


def test_judge_reports_on_other_files_without_fitting_on_them(tmp_path, monkeypatch):
    def rows_for(fast, slow):  # one tactic twice as fast as the other on every layer
        return [_row(cfg, k, 128, 128, t, us) | {"blocks_per_sm": 2} for cfg in ("full", "green16")
                for k in (768, 1024, 1536) for t, us in ((fast, 1.0), (slow, 2.0))]
    train = _write(tmp_path, rows_for(72, 82), name="train.json")
    other = _write(tmp_path, rows_for(82, 72), name="other.json")  # the opposite: every pick of the fit is wrong

    def run(*extra):
        out = tmp_path / "fit.json"
        monkeypatch.setattr(sys, "argv", ["fit", str(train), "--hold", "", "--json", str(out), *extra])
        assert fa.main() == 0
        return json.loads(out.read_text())

    plain, judged = run(), run("--judge", str(other))
    assert plain["table"] == judged["table"] and plain["wave_model"] == judged["wave_model"]
    assert "judge" not in plain and judged["judge"]["sources"] == [str(other)]
    sets = judged["judge"]["sets"]
    assert set(sets) == {"judge plain full", "judge plain green16"}
    for s in sets.values():
        assert s["bins"]["cases"] == 3 and s["bins"]["geomean"] == pytest.approx(2.0)
        assert s["wave"]["geomean"] == pytest.approx(2.0)
    assert judged["sets"]["train plain full"]["bins"]["geomean"] == pytest.approx(1.0)
