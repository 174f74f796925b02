"""What `edgesdk build --kernels auto` (with ``--measure``) picks for each benchmark layer, and what that
choice is worth against cuBLAS fp16 — the issue's "never below 0.95×" target with the dense fallback.

For every (K, N) of ``bench/bench_bitmap_linear.py`` (same random weights: same seeds), M ∈ {1, 2, 4, 8, 16},
fp16 and int8 values at 30/50/70 %: :func:`edgesdk.kernels.bitmap_linear.measure_vs_dense` (the build's
own timer: our kernel vs cuBLAS fp16, and for int8 values also cuBLAS int8) and
:func:`edgesdk.rewrite.choose.decide_measured` (the build's decision). "choice vs fp16" is cuBLAS fp16's
time over the chosen kernel's (the bitmap kernel, or the faster dense one). The committed benchmark
JSON (an independent run) is read back to price each decision a second time ("bench_choice_vs_fp16":
the bitmap kernel's speed-up in that run, 1.0 for cuBLAS fp16; it did not time cuBLAS int8).

    python tools/bitmap_linear_autochoice.py [--green 16] [--json bench/results/bitmap_linear_autochoice.json]
        [--bench-json bench/results/bitmap_linear_h200.json] [--bench-green-json ...]
    python tools/bitmap_linear_autochoice.py --from-json RUN.json --json OUT.json   # re-derive and re-price

The benchmark that prices the decisions is the one of the GPU the run is on (:func:`bench_files`: an H200's
files on an H200, the H100's otherwise), unless ``--bench-json`` / ``--bench-green-json`` name others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_bitmap_linear import MS, SHAPES, random_packed  # noqa: E402
from edgesdk.kernels import _cuda  # noqa: E402
from edgesdk.kernels.bitmap_linear import measure_vs_dense  # noqa: E402
from edgesdk.rewrite.choose import MEASURE_MARGIN, decide_measured  # noqa: E402

VARIANTS = [(0.3, "float16"), (0.5, "float16"), (0.7, "float16"), (0.3, "int8"), (0.5, "int8"), (0.7, "int8")]


def _pack(job):
    return job, random_packed(*job)


def bench_speedups(path: Path) -> dict:
    """(K, N, M, values, sparsity) → speed-up of the default tactic vs cuBLAS fp16 in a benchmark JSON."""
    if not path.exists():
        return {}
    out = {}
    for r in json.loads(path.read_text())["rows"]:
        if r["kernel"] in ("bitmap_float16_default", "bitmap_int8_default"):
            out[(r["K"], r["N"], r["M"], r["kernel"].split("_")[1], round(r["sparsity"], 2))] = r["speedup"]
    return out


def bench_files(device: str, bench_json: Path | None = None, green_json: Path | None = None) -> tuple[Path, Path]:
    """The committed benchmark runs (full GPU, 16-SM green context) that price the decisions of a run on
    ``device`` (its name as the driver gives it): the H200's on an H200, else the H100's; given paths win."""
    res = ROOT / "bench" / "results"
    tag = "_h200" if "H200" in device.upper() else ""
    return (bench_json or res / f"bitmap_linear{tag}.json", green_json or res / f"bitmap_linear_green16{tag}.json")


def price(rows: list[dict], full: dict, green16: dict) -> list[dict]:
    """Rows with ``bench_bitmap_vs_fp16`` looked up again (``full`` for the full GPU, ``green16`` for a 16-SM
    context, none for other contexts) and the decisions re-derived."""
    out = []
    for r in rows:
        ref = full if r["ctx"] == "full" else green16 if r["ctx"] == "green16" else {}
        out.append(derive({**r, "bench_bitmap_vs_fp16": ref.get((r["K"], r["N"], r["M"], r["values"],
                                                                 round(r["sparsity"], 2)))}))
    return out


def derive(r: dict) -> dict:
    """The build's decision and what it is worth, from a row's raw times (``bitmap_us``, ``fp16_us``,
    ``int8_us``, ``dense_us``, ``dense``) and the independent benchmark's ratio ``bench_bitmap_vs_fp16``."""
    kernel, _ = decide_measured(r)
    chosen = r["bitmap_us"] if kernel == "bitmap" else r["dense_us"]
    b = r.get("bench_bitmap_vs_fp16")
    return {**r, "choice": kernel if kernel == "bitmap" else r["dense"],
            "bitmap_vs_fp16": r["fp16_us"] / r["bitmap_us"], "choice_vs_fp16": r["fp16_us"] / chosen,
            # the same choice priced by the independent benchmark run (it timed cuBLAS fp16, not int8)
            "bench_choice_vs_fp16": (b if kernel == "bitmap" else 1.0 if r["dense"] == "cuBLAS fp16" else None)}


def run(ctx_label: str, packed: dict, ref: dict) -> list[dict]:
    rows = []
    for i, (k, n) in enumerate(SHAPES):
        for s, vd in VARIANTS:
            p = packed[(k, n, s, vd, 1000 * i + int(s * 10))]
            for m in MS:
                meas = measure_vs_dense(p, m, int8_dense=vd == "int8")
                r = derive({"ctx": ctx_label, "K": k, "N": n, "M": m, "values": vd, "sparsity": s, **meas,
                            "bench_bitmap_vs_fp16": ref.get((k, n, m, vd, s))})
                rows.append(r)
                b = r["bench_bitmap_vs_fp16"]
                print(f"{ctx_label:7s} {k:5d}x{n:<5d} M={m:2d} {vd:7s} {s:.1f}: bitmap {r['bitmap_us']:7.2f}  "
                      f"fp16 {r['fp16_us']:7.2f}  int8 {r['int8_us'] if r['int8_us'] is not None else '-':>7}  -> "
                      f"{r['choice']:12s} {r['choice_vs_fp16']:.2f}x (bench {b if b is None else round(b, 2)})",
                      flush=True)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for ctx in sorted({r["ctx"] for r in rows}):
        for s, vd in VARIANTS:
            sel = [r for r in rows if r["ctx"] == ctx and r["values"] == vd and r["sparsity"] == s]
            if not sel:
                continue
            big = [r for r in sel if r["K"] * r["N"] >= 4 * 2**20]
            priced = [r["bench_choice_vs_fp16"] for r in sel if r["bench_choice_vs_fp16"] is not None]
            out.append({"ctx": ctx, "values": vd, "sparsity": s, "rows": len(sel),
                        "bitmap_chosen": sum(r["choice"] == "bitmap" for r in sel),
                        "int8_dense_chosen": sum(r["choice"] == "cuBLAS int8" for r in sel),
                        "min_choice_vs_fp16": min(r["choice_vs_fp16"] for r in sel),
                        "min_bitmap_vs_fp16": min(r["bitmap_vs_fp16"] for r in sel),
                        "median_choice_vs_fp16_KN>=4M": (statistics.median(r["choice_vs_fp16"] for r in big)
                                                         if big else None),
                        "median_bitmap_vs_fp16_KN>=4M": (statistics.median(r["bitmap_vs_fp16"] for r in big)
                                                         if big else None),
                        "bench_min_choice_vs_fp16": min(priced) if priced else None,
                        "bench_priced_rows": len(priced)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--green", type=int, default=0, help="also run on a green context of this many SMs")
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "bitmap_linear_autochoice.json")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--bench-json", type=Path, default=None,
                    help="the independent benchmark run that prices each decision a second time (default: the "
                         "GPU's own, bench/results/bitmap_linear_h200.json on an H200, bitmap_linear.json otherwise)")
    ap.add_argument("--bench-green-json", type=Path, default=None,
                    help="the same for the 16-SM rows (default: bitmap_linear_green16[_h200].json, as above)")
    ap.add_argument("--from-json", type=Path, help="re-derive the decisions and the summary from the raw times "
                    "of an earlier run's JSON (e.g. after a change of the decision rule) instead of measuring")
    args = ap.parse_args(argv)
    if args.from_json:
        old = json.loads(args.from_json.read_text())
        full, green = bench_files(old["meta"]["device"], args.bench_json, args.bench_green_json)
        rows = price(old["rows"], bench_speedups(full), bench_speedups(green))
        info = {**old["meta"], "summary": summarize(rows), "bench_json": full.name, "bench_green_json": green.name,
                "derived": f"decisions re-derived by tools/bitmap_linear_autochoice.py --from-json with "
                           f"MEASURE_MARGIN = {MEASURE_MARGIN} from the raw times measured at {old['meta']['date']}, "
                           f"priced by {full.name} / {green.name}"}
        for s in info["summary"]:
            print(json.dumps(s))
        from bench._common import write_json

        print(f"wrote {write_json(args.json, rows, info)}")
        return 0

    jobs = [(k, n, s, vd, 1000 * i + int(s * 10)) for i, (k, n) in enumerate(SHAPES) for s, vd in VARIANTS]
    with ProcessPoolExecutor(args.workers) as ex:
        packed = dict(ex.map(_pack, jobs))
    _cuda.init()
    facts = _cuda.device_facts()
    bench_json, green_json = bench_files(facts["name"], args.bench_json, args.bench_green_json)
    rows = run("full", packed, bench_speedups(bench_json))
    if args.green:
        with _cuda.in_green_context(args.green) as sms:
            rows += run(f"green{sms}", packed, bench_speedups(green_json) if sms == 16 else {})
    summary = summarize(rows)
    for s in summary:
        print(json.dumps(s))
    from bench._common import meta, write_json

    info = meta({"tool": "tools/bitmap_linear_autochoice.py", "gpu": facts,
                 "method": "edgesdk.kernels.bitmap_linear.measure_vs_dense (the build's timer: CUDA graph of >= 16 "
                           "launches over operand copies rotated beyond 2x L2, median of 6 replays) per row, "
                           "decision by edgesdk.rewrite.choose.decide_measured",
                 "margin": MEASURE_MARGIN, "summary": summary,
                 "bench_json": bench_json.name, "bench_green_json": green_json.name})
    print(f"wrote {write_json(args.json, rows, info)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
