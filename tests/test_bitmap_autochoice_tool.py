"""CPU tests of tools/bitmap_linear_autochoice.py's bookkeeping: which benchmark prices a run's decisions (the GPU's
own), and --from-json re-deriving and re-pricing an earlier run's raw times. (The timings themselves need a GPU.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import bitmap_linear_autochoice as ac  # noqa: E402


@pytest.mark.parametrize("device, tag", [("NVIDIA H200", "_h200"), ("NVIDIA H200 NVL", "_h200"),
                                         ("NVIDIA H100 80GB HBM3", ""), ("Orin (nvgpu)", "")])
def test_the_benchmark_that_prices_a_run_is_the_gpus_own(device, tag):
    full, green = ac.bench_files(device)
    assert (full.name, green.name) == (f"bitmap_linear{tag}.json", f"bitmap_linear_green16{tag}.json")
    assert full.exists() and green.exists()  # committed runs
    given = Path("/x/other.json")
    assert ac.bench_files(device, given)[0] == given and ac.bench_files(device, None, given)[1] == given


def _bench(path: Path, speedups: dict) -> None:
    rows = [{"K": k, "N": n, "M": m, "kernel": f"bitmap_{vd}_default", "sparsity": s, "speedup": v}
            for (k, n, m, vd, s), v in speedups.items()]
    rows.append({"K": 7, "N": 9, "M": 1, "kernel": "cublas_fp16", "sparsity": 0.5, "speedup": 9.0})  # not ours
    path.write_text(json.dumps({"meta": {}, "rows": rows}))


def _row(ctx, bitmap_us, fp16_us, int8_us=None, values="float16", m=1):
    dense, dense_us = (("cuBLAS int8", int8_us) if int8_us is not None and int8_us < fp16_us
                       else ("cuBLAS fp16", fp16_us))
    return {"ctx": ctx, "K": 7, "N": 9, "M": m, "values": values, "sparsity": 0.5, "bitmap_us": bitmap_us,
            "fp16_us": fp16_us, "int8_us": int8_us, "dense_us": dense_us, "dense": dense,
            "bench_bitmap_vs_fp16": 123.0}  # stale pricing: must be replaced


def test_from_json_re_derives_and_re_prices_by_the_runs_device(tmp_path, monkeypatch):
    res = tmp_path / "results"
    res.mkdir()
    _bench(res / "bitmap_linear_h200.json", {(7, 9, 1, "float16", 0.5): 0.8, (7, 9, 2, "int8", 0.5): 1.3})
    _bench(res / "bitmap_linear_green16_h200.json", {(7, 9, 1, "float16", 0.5): 1.7})
    _bench(res / "bitmap_linear.json", {(7, 9, 1, "float16", 0.5): 5.0})  # the H100's: must not be used
    _bench(res / "bitmap_linear_green16.json", {(7, 9, 1, "float16", 0.5): 5.0})
    monkeypatch.setattr(ac, "bench_files", lambda dev, b=None, g=None, _f=ac.bench_files:
                        tuple(res / p.name for p in _f(dev, b, g)))
    rows = [_row("full", 10.0, 12.0),                      # bitmap 1.2x faster: kept, priced 0.8 by the bench
            _row("full", 20.0, 12.0),                      # slower: cuBLAS fp16, priced 1.0
            _row("full", 9.0, 12.0, 6.0, "int8", m=2),     # dense int8 fastest: kept dense, no fp16 price
            _row("green16", 10.0, 12.0),                   # 16 SMs: the green16 file's price
            _row("green8", 10.0, 12.0)]                    # another context: no price
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"meta": {"device": "NVIDIA H200", "date": "2026-12-08T00:00:00Z"}, "rows": rows}))
    out = tmp_path / "out.json"
    assert ac.main(["--from-json", str(run), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    r = got["rows"]
    assert [x["choice"] for x in r] == ["bitmap", "cuBLAS fp16", "cuBLAS int8", "bitmap", "bitmap"]
    assert [x["bench_bitmap_vs_fp16"] for x in r] == [0.8, 0.8, 1.3, 1.7, None]  # per layer, not per choice
    assert [x["bench_choice_vs_fp16"] for x in r] == [0.8, 1.0, None, 1.7, None]
    assert r[0]["choice_vs_fp16"] == pytest.approx(1.2) and r[2]["choice_vs_fp16"] == pytest.approx(2.0)
    meta = got["meta"]
    assert (meta["bench_json"], meta["bench_green_json"]) == ("bitmap_linear_h200.json",
                                                              "bitmap_linear_green16_h200.json")
    full = {(s["values"], s["sparsity"]): s for s in meta["summary"] if s["ctx"] == "full"}
    assert full[("float16", 0.5)]["bench_min_choice_vs_fp16"] == 0.8
    assert full[("int8", 0.5)]["int8_dense_chosen"] == 1
