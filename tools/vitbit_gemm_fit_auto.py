#!/usr/bin/env python3
"""Fit tactic 1 of EdgeVitBitGemm (``edgesdk.kernels.vitbit_gemm.auto_tactic``, the default wherever TensorRT does
not time the tactics itself) to measured times, and check the fit on layers it did not see.

Input: JSON of ``tools/vitbit_gemm_explore.py`` (rows of kind ``shipped``: one time per config, layer, M and
tactic). Each case (config, K, N, M) is described by the rule's two features:

* ``r``: 128 x 128 output tiles per SM of the context (``ceil(M / 128) ceil(N / 128) / SMs``);
* ``kt``: k-tiles of 128 (``ceil(K_padded / 128)``).

Cases fall into bins (``R_EDGES`` on r x ``KT_EDGES`` on kt). In each bin the rule takes the tactic with the least
geometric mean of (its time / the case's best time) over the training cases of that bin; a bin without training
cases takes its neighbour's choice. The ``--hold`` layers are left out of the fit and reported on their own, with
the shipped rule (``auto_tactic``, given each case's recorded occupancy) and the round-10 rule it replaced beside the
fitted ones (regret = time of the tactic a rule picks / the best time of the case). Rows of tactic 1 itself (the
launcher's own choice, as run) are not candidates: where a file has them, the report adds their measured regret
("t1 as run").

A second candidate, the **wave model**, sees wave quantization, which the bins cannot: for each tactic t it fits
``time = a_t + b_t W + c_t W kt / splits`` (W = waves = ceil(tiles / (blocks per SM x SMs)), tiles = the tactic's
output tiles x its K splits) by least squares on relative error, and picks the tactic with the least predicted
time. It needs the resident blocks per SM of each row (``blocks_per_sm``, recorded by the explore tool since
round 11, or given by ``--blocks-per-sm``); cases without them are left out of its fit and its report. Split-M
tactics (two kernels) are not its candidates. ``--loo`` also fits both rules with each layer left out in turn.
Rows of the issue's benchmark (``bench/bench_vitbit_gemm.py``) are read as well. ``--judge FILES`` reports the
rules fitted on RESULTS on the cases of other files (another GPU's runs, or the ``--orin`` rows with
``--judge-green-kind orin``), every layer of them: nothing of the judged files enters the fit.

    python tools/vitbit_gemm_fit_auto.py RESULTS.json [MORE.json ...] [--hold 768:2304,768:768,768:3072,3072:768]
        [--green-kind orin] [--blocks-per-sm 72:6,82:2,...] [--wave-tactics 3,29,...] [--loo] [--judge OTHER.json ... [--judge-green-kind orin]]
        [--json bench/results/vitbit_gemm_autofit_X.json]
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgesdk.errors import EdgeSDKError  # noqa: E402
from edgesdk.kernels.vitbit_gemm import AUTO, SPLIT_M, WAVE_MODEL, auto_tactic, config, shape_class  # noqa: E402

WAVE_TACTICS = sorted(WAVE_MODEL)  # the shipped rule's candidates

R_EDGES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # bins: r < 0.25, 0.25 <= r < 0.5, ..., r >= 8
KT_EDGES = (4, 9)  # bins: kt < 4 (K <= 384), 4 <= kt < 9 (K <= 1024), kt >= 9


def features(k: int, n: int, m: int, sms: int) -> tuple[float, int]:
    """(r, kt) of a case, as the launcher's rule sees it."""
    return shape_class(n, k, m, sms)


def rule_r10(c: dict) -> int:
    """Tactic 1 as rounds 6-12 shipped it (replaced in round 13 by the wave model): bins of tiles per SM (r) and
    k-tiles (kt), from the H100 measurements of rounds 3-10. Kept here as the baseline of the reports."""
    r, kt = c["r"], c["kt"]
    if r < 0.5:
        return 72
    if r < 1:
        return 33
    if kt > 8 and r < 4:
        return 29
    return 82


def rule_shipped(c: dict) -> int | None:
    """What the launcher's tactic 1 (``auto_tactic``) picks for case ``c`` given its recorded occupancy (None
    where the case has none)."""
    if not c.get("blocks_per_sm"):
        return None
    try:
        return auto_tactic(c["N"], c["K"], c["M"], c["sms"], c["blocks_per_sm"])
    except EdgeSDKError:  # no candidate of the rule has its occupancy recorded
        return None


def bin_of(r: float, kt: int) -> tuple[int, int]:
    return bisect.bisect_right(R_EDGES, r), bisect.bisect_right(KT_EDGES, kt)


_BENCH_VARIANT = re.compile(r"ours gemm t1 auto=t(\d+)|ours gemm t(\d+) ")


def _bench_rows(rows: list[dict]) -> list[dict]:
    """Rows of ``bench/bench_vitbit_gemm.py`` (``variant`` "ours gemm tN ..." and "ours gemm t1 auto=tN", timed
    as tactic N) in the explore tool's form; other variants (baselines, the t1 repeat) are dropped."""
    out = []
    for row in rows:
        m = _BENCH_VARIANT.match(row.get("variant", ""))
        if m and int(m.group(1) or m.group(2)) != 1:
            out.append({k: row[k] for k in ("config", "K", "N", "M", "us")}
                       | {"kind": "shipped", "tactic": int(m.group(1) or m.group(2))})
    return out


def load_cases(paths: list[Path], green_kind: str = "shipped", blocks_per_sm: dict[int, int] | None = None
               ) -> list[dict]:
    """One case per (gelu, config, K, N, M): the times of every tactic timed for it (the median where several
    files time the same case). ``green_kind="orin"``: on green contexts, the explore tool's ``--orin`` rows (Orin's
    shared-memory carveout and persistent grid) stand in for the shipped ones. Rows of the issue's benchmark
    (``bench/bench_vitbit_gemm.py``) are read too. ``blocks_per_sm``: resident blocks per SM by tactic, for rows
    that do not record them."""
    acc: dict[tuple, dict[int, list[float]]] = {}
    occ: dict[tuple, dict[int, int]] = {}
    auto: dict[tuple, list[float]] = {}
    for p in paths:
        d = json.loads(Path(p).read_text())
        meta = d["meta"]
        gelu = bool(meta.get("gelu"))
        rows = d["rows"]
        if rows and "variant" in rows[0]:
            rows = _bench_rows(rows)
        for row in rows:
            cfg = row["config"]
            if row.get("kind") != ("shipped" if cfg == "full" else green_kind):
                continue
            sms = meta["sm_count"] if cfg == "full" else int(cfg.removeprefix("green"))
            key = (gelu, cfg, sms, row["K"], row["N"], row["M"])
            t = int(row["tactic"])
            if t == AUTO:  # the launcher's own choice, as run: not a candidate
                auto.setdefault(key, []).append(float(row["us"]))
                continue
            acc.setdefault(key, {}).setdefault(t, []).append(float(row["us"]))
            b = row.get("blocks_per_sm") or (blocks_per_sm or {}).get(t)
            if b:
                occ.setdefault(key, {})[t] = int(b)
    cases = []
    for (gelu, cfg, sms, k, n, m), times in sorted(acc.items()):
        t = {tac: statistics.median(v) for tac, v in times.items()}
        r, kt = features(k, n, m, sms)
        cases.append({"gelu": gelu, "config": cfg, "sms": sms, "K": k, "N": n, "M": m, "r": r, "kt": kt,
                      "times": t, "best": min(t.values()), "best_tactic": min(t, key=t.get),
                      "blocks_per_sm": occ.get((gelu, cfg, sms, k, n, m), {}),
                      "auto_us": statistics.median(auto[key]) if (key := (gelu, cfg, sms, k, n, m)) in auto else None})
    return cases


def wave_features(c: dict, tactic: int) -> list[float] | None:
    """[1, W, W kt / splits] of ``tactic`` on case ``c`` (None: no occupancy recorded, or a split-M tactic)."""
    per_sm = c.get("blocks_per_sm", {}).get(tactic)
    if not per_sm or tactic in SPLIT_M:
        return None
    cfg, splits = config(tactic)
    tiles = -(-c["M"] // cfg.bm) * -(-c["N"] // cfg.bn) * splits
    waves = -(-tiles // (per_sm * c["sms"]))
    return [1.0, float(waves), waves * c["kt"] / splits]


def fit_waves(cases: list[dict], tactics=None) -> dict[int, list[float]]:
    """Per tactic (of ``tactics``, default every tactic timed), the (a, b, c) of ``time = a + b W + c W kt / splits``
    that minimise the squared relative error over the cases that timed it with its occupancy recorded (at least 3
    cases; else the tactic is left out)."""
    import numpy as np

    coef = {}
    for tac in sorted({t for c in cases for t in c["times"]}):
        if tactics is not None and tac not in tactics:
            continue
        xs, ys = [], []
        for c in cases:
            f = wave_features(c, tac) if tac in c["times"] else None
            if f is not None:
                xs.append([v / c["times"][tac] for v in f])
                ys.append(1.0)
        if len(xs) >= 3:
            coef[tac] = [float(v) for v in np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)[0]]
    return coef


def wave_pick(coef: dict[int, list[float]], c: dict) -> int | None:
    """The tactic of least predicted time among those with a fit and occupancy for ``c`` (None: none)."""
    pred = {}
    for tac, k in coef.items():
        f = wave_features(c, tac)
        if f is not None and tac in c["times"]:
            pred[tac] = sum(a * b for a, b in zip(k, f))
    return min(sorted(pred), key=pred.get) if pred else None


def fit(cases: list[dict]) -> dict[tuple[int, int], int]:
    """The tactic per bin with the least geometric-mean regret over the bin's cases (timed with every tactic
    considered: a tactic missing from a case, e.g. split-K above its size limit, is not a candidate there)."""
    by_bin: dict[tuple[int, int], list[dict]] = {}
    for c in cases:
        by_bin.setdefault(bin_of(c["r"], c["kt"]), []).append(c)
    table = {}
    for b, cs in by_bin.items():
        cands = set.intersection(*(set(c["times"]) for c in cs))
        if not cands:
            raise SystemExit(f"bin {b}: no tactic was timed on every case")
        score = {t: sum(math.log(c["times"][t] / c["best"]) for c in cs) for t in cands}
        table[b] = min(sorted(score), key=score.get)
    # bins without cases: the nearest bin of the same kt class (smaller r first), else of any kt class
    full = {}
    for i in range(len(R_EDGES) + 1):
        for j in range(len(KT_EDGES) + 1):
            if (i, j) in table:
                full[(i, j)] = table[(i, j)]
                continue
            near = sorted(table, key=lambda b: (abs(b[1] - j), abs(b[0] - i), b[0] > i))
            full[(i, j)] = table[near[0]]
    return full


def leave_one_layer_out(cases: list[dict], wave_tactics=None) -> list[dict]:
    """For each layer (K, N) in turn, fit the bins and the wave model on the other layers and pick for the
    layer's cases: one dict per case with ``bins`` and ``wave`` (the tactic each picks; wave None where it cannot)."""
    out = []
    for layer in sorted({(c["K"], c["N"]) for c in cases}):
        train = [c for c in cases if (c["K"], c["N"]) != layer]
        if not train:
            raise SystemExit("--loo needs at least two layers")
        table, coef = fit(train), fit_waves(train, wave_tactics)
        for c in cases:
            if (c["K"], c["N"]) == layer:
                out.append({"case": c, "bins": table[bin_of(c["r"], c["kt"])], "wave": wave_pick(coef, c)})
    return out


def regret(c: dict, tactic: int) -> float | None:
    return c["times"][tactic] / c["best"] if tactic in c["times"] else None


def summary(values: list[float]) -> dict:
    if not values:
        return {"cases": 0}
    return {"cases": len(values), "geomean": math.exp(sum(map(math.log, values)) / len(values)),
            "median": statistics.median(values), "max": max(values),
            "over_1.03": sum(v > 1.03 for v in values), "over_1.10": sum(v > 1.10 for v in values)}


def describe(label: str, x: dict, n: int) -> str:
    """One rule's :func:`summary` on a set of ``n`` cases, for the terminal."""
    if not x["cases"]:
        return f"{label}: no cases"
    return (f"{label} geomean {x['geomean']:.4f} max {x['max']:.3f} >3% {x['over_1.03']} >10% {x['over_1.10']}"
            + ("" if x["cases"] == n else f" ({x['cases']} cases)"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--hold", default="768:2304,768:768,768:3072,3072:768", help="layers K:N left out of the fit")
    ap.add_argument("--green-kind", default="shipped", choices=("shipped", "orin"),
                    help="rows used on green contexts: as shipped, or at Orin's occupancy (explore --orin)")
    ap.add_argument("--blocks-per-sm", default="", metavar="T:B,...",
                    help="resident blocks per SM by tactic, for rows without them (files of the benchmark, or of the "
                    "explore tool before round 11)")
    ap.add_argument("--wave-tactics", default="", metavar="T,...",
                    help="the wave model's candidates (default: every tactic timed, split-M excepted)")
    ap.add_argument("--loo", action="store_true",
                    help="also leave each layer out in turn (fit on the others) and report the regrets on it")
    ap.add_argument("--judge", nargs="+", type=Path, default=[], metavar="FILE",
                    help="also report the rules fitted on RESULTS on every case of these files (not fitted on)")
    ap.add_argument("--judge-green-kind", choices=("shipped", "orin"),
                    help="rows of the --judge files used on green contexts (default: --green-kind)")
    ap.add_argument("--json", type=Path, help="write the fitted table and the regrets here")
    args = ap.parse_args()

    hold = {tuple(int(v) for v in s.split(":")) for s in args.hold.split(",") if s}
    try:
        bps = {int(t): int(b) for t, b in (v.split(":") for v in args.blocks_per_sm.split(",") if v)}
    except ValueError:
        raise SystemExit(f"--blocks-per-sm {args.blocks_per_sm!r}: expected TACTIC:BLOCKS pairs, e.g. 72:6,82:2")
    cases = load_cases(args.results, args.green_kind, bps)
    train = [c for c in cases if (c["K"], c["N"]) not in hold]
    test = [c for c in cases if (c["K"], c["N"]) in hold]
    if not train and not args.loo:
        raise SystemExit("no training cases: every layer is in --hold (--loo fits on the other layers instead)")
    if not train:  # --loo only: the full fit is on every layer
        train, test = cases, []
    table = fit(train)
    wave_tactics = {int(t) for t in args.wave_tactics.split(",") if t} or None
    coef = fit_waves(train, wave_tactics)

    def wave_rule(c):
        return wave_pick(coef, c)

    def bins_rule(c):
        return table[bin_of(c["r"], c["kt"])]

    # the rules compared: the round-10 rule, the shipped auto_tactic, and the two fitted here (case -> tactic | None)
    rules = {"r10": rule_r10, "shipped": rule_shipped, "bins": bins_rule, "wave": wave_rule}

    def report(tag: str, cs: list[dict], picks=None) -> dict:
        """Each rule's regret summary on cases ``cs`` (``picks``: per case, tactics overriding the rules': the
        leave-one-out fits), and tactic 1 as run where the files timed it."""
        res = {}
        for lab, rule in rules.items():
            vals = []
            for i, c in enumerate(cs):
                t = picks[i][lab] if picks and lab in picks[i] else rule(c)
                if t is not None and (v := regret(c, t)) is not None:
                    vals.append(v)
            res[lab] = summary(vals)
        ran = [c["auto_us"] / c["best"] for c in cs if c.get("auto_us")]
        if ran:
            res["t1_as_run"] = summary(ran)
        print(f"{tag:>24}: {len(cs)} cases; " + "; ".join(describe(lab, x, len(cs)) for lab, x in res.items()))
        return res

    def groups(cs: list[dict]):
        for gelu in (False, True):
            for cfg in sorted({c["config"] for c in cs}):
                sub = [c for c in cs if c["gelu"] == gelu and c["config"] == cfg]
                if sub:
                    yield f"{'gelu' if gelu else 'plain'} {cfg}", sub

    print("fitted table (rows: r bins; columns: kt bins " + ", ".join(
        ["< %d" % KT_EDGES[0]] + [f"{a}-{b - 1}" for a, b in zip(KT_EDGES, KT_EDGES[1:])] + [f">= {KT_EDGES[-1]}"])
          + ")")
    labels = [f"r < {R_EDGES[0]}"] + [f"{a} <= r < {b}" for a, b in zip(R_EDGES, R_EDGES[1:])] + [f"r >= {R_EDGES[-1]}"]
    for i, lab in enumerate(labels):
        print(f"  {lab:>16}: " + "  ".join(f"{table[(i, j)]:>3}" for j in range(len(KT_EDGES) + 1)))

    out = {"r_edges": R_EDGES, "kt_edges": KT_EDGES, "table": {f"{i},{j}": t for (i, j), t in sorted(table.items())},
           "hold": sorted(hold), "green_kind": args.green_kind, "sources": [str(p) for p in args.results], "sets": {},
           "wave_model": {str(t): k for t, k in coef.items()}, "blocks_per_sm_given": bps,
           "wave_tactics": sorted(wave_tactics) if wave_tactics else None}
    if coef:
        print("wave model (us = a + b W + c W kt / splits): " + "; ".join(
            f"t{t} {k[0]:.2f} {k[1]:+.3f} {k[2]:+.4f}" for t, k in sorted(coef.items())))
    else:
        print("wave model: no rows with blocks_per_sm in the inputs")
    for name, cs in (("train", train), ("hold", test)):
        for tag, sub in groups(cs):
            out["sets"][f"{name} {tag}"] = report(f"{name} {tag}", sub)

    def picked(c: dict) -> dict:
        d = {}
        for lab, rule in rules.items():
            t = rule(c)
            d[lab], d[f"{lab}_regret"] = t, (regret(c, t) if t is not None else None)
        return d

    out["cases"] = [{k: v for k, v in c.items() if k not in ("times", "blocks_per_sm")} | picked(c) for c in cases]
    nan = float("nan")
    for c in test:
        d = picked(c)
        print(f"  hold {'G' if c['gelu'] else ' '} {c['config']:>7} {c['K']:>5}x{c['N']:<5} M={c['M']:<5} "
              f"r={c['r']:<7.3f} kt={c['kt']:<3} best t{c['best_tactic']:<3} " + "  ".join(
                  f"{lab} t{d[lab] if d[lab] is not None else '-':<3} {d[lab + '_regret'] or nan:.3f}" for lab in rules))
    if args.judge:
        jkind = args.judge_green_kind or args.green_kind
        jcases = load_cases(args.judge, jkind, bps)
        out["judge"] = {"sources": [str(p) for p in args.judge], "green_kind": jkind, "sets": {}}
        print(f"judged on {len(jcases)} cases of {', '.join(map(str, args.judge))} (green rows: {jkind}):")
        for tag, sub in groups(jcases):
            out["judge"]["sets"][f"judge {tag}"] = report(f"judge {tag}", sub)
    if args.loo:
        loo = leave_one_layer_out(cases, wave_tactics)
        out["loo"] = {}
        print("leave one layer out (each layer's cases picked by rules fitted on the other layers):")
        for tag, sub in groups([p["case"] for p in loo]):
            ps = [p for p in loo if p["case"] in sub]
            out["loo"][f"loo {tag}"] = report(f"loo {tag}", [p["case"] for p in ps], ps)
        out["loo_cases"] = [{k: p["case"][k] for k in ("gelu", "config", "K", "N", "M", "best_tactic")}
                            | {"bins": p["bins"], "wave": p["wave"],
                               "bins_regret": regret(p["case"], p["bins"]),
                               "wave_regret": regret(p["case"], p["wave"]) if p["wave"] is not None else None}
                            for p in loo]
    if args.json:
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
