"""CPU tests of tools/orin_bw_proxy.py's arithmetic (the measurements themselves need a GPU: tools only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import orin_bw_proxy as obp  # noqa: E402

ORIN = obp.ORIN_B_PER_SM_CLK


def test_orin_rate_from_the_data_sheet():
    # 204.8 GB/s over 16 SMs at 1.3 GHz
    assert obp.ORIN_B_PER_SM_CLK == pytest.approx(204.8e9 / (16 * 1.3e9))
    assert 9.8 < obp.ORIN_B_PER_SM_CLK < 9.9


def _layer(k, n, m, dense_us, ours_us, ours_bytes, mhz=2000.0, level="none", sms=16):
    dense_bytes = 2 * k * n + 2 * m * (k + n)
    dense = {"K": k, "N": n, "M": m, "kernel": "cublas_fp16", "sparsity": 0.0, "us": dense_us, "bytes": dense_bytes,
             "GBps": dense_bytes / dense_us / 1e3, "speedup": 1.0, "level": level, "sm_mhz": mhz}
    dense["B_per_sm_clk"] = dense["GBps"] * 1e9 / (sms * mhz * 1e6)
    ours = {"K": k, "N": n, "M": m, "kernel": "bitmap_float16_default", "sparsity": 0.5, "us": ours_us,
            "bytes": ours_bytes, "GBps": ours_bytes / ours_us / 1e3, "speedup": dense_us / ours_us, "level": level,
            "sm_mhz": mhz}
    return [dense, ours]


def test_model_decode_bound_and_byte_bound():
    k = n = 4096
    dense_bytes = 2 * k * n + 2 * (k + n)
    # dense streams at 20 B/SM-clk here (bandwidth-bound at Orin's rate); ours takes 2x dense's time on 16 SMs
    dense_us = dense_bytes / (20 * 16 * 2000)
    rows = _layer(k, n, 1, dense_us, 2 * dense_us, dense_bytes // 2)
    (m,) = [r for r in obp.quiet_orin_model(rows) if r["op"] == "bitmap_linear"]
    cap = 10.0  # dense-equivalent bytes per SM-clock: dense_bytes over our time
    assert m["cap_dense_eq_B_per_sm_clk"] == pytest.approx(cap)
    assert m["bytes_ratio"] == pytest.approx(0.5)
    for f in obp.BUS_FRACTIONS:
        expect = 1 / max(0.5, f * ORIN / cap)  # decode-bound at f = 1 (9.85 / 10 > 0.5), byte-bound never here
        assert m[f"speedup_f{f}"] == pytest.approx(expect)
    # a much faster decode: the byte ratio limits
    rows = _layer(k, n, 1, dense_us, dense_us / 4, dense_bytes // 2)
    (m,) = [r for r in obp.quiet_orin_model(rows) if r["op"] == "bitmap_linear"]
    assert m["speedup_f1.0"] == pytest.approx(2.0)


def test_model_leaves_out_latency_bound_dense_rows():
    k = n = 4096
    dense_bytes = 2 * k * n + 2 * (k + n)
    slow = dense_bytes / (5 * 16 * 2000)  # dense at 5 B/SM-clk: below Orin's peak rate even on 16 H100 SMs
    rows = _layer(k, n, 1, slow, slow, dense_bytes // 2)
    assert [r for r in obp.quiet_orin_model(rows) if r["op"] == "bitmap_linear"] == []
    # rows of other levels (the co-runner ones) never enter the model
    fast = dense_bytes / (20 * 16 * 2000)
    rows = _layer(k, n, 1, fast, fast, dense_bytes // 2, level="load16")
    assert obp.quiet_orin_model(rows) == []


def test_summary_medians_per_level():
    k = n = 4096
    dense_bytes = 2 * k * n + 2 * (k + n)
    rows = (_layer(k, n, 1, 10.0, 8.0, dense_bytes // 2) + _layer(k, n, 4, 10.0, 12.5, dense_bytes // 2)
            + _layer(k, n, 16, 10.0, 5.0, dense_bytes // 2)
            + _layer(576, 1536, 1, 1.0, 100.0, 1000))  # K·N < 4M: not in the medians
    for r in rows:
        r["hog_GBps_gt"] = 0.0
    (s,) = obp.summarize(rows, ["none"])
    assert s["floa_50"] == pytest.approx(1.25)  # median of 1.25, 0.8, 2.0
    dense = sorted(r["B_per_sm_clk"] for r in rows if r["kernel"] == "cublas_fp16" and r["K"] == 4096)
    assert s["dense_B_per_sm_clk"] == pytest.approx(dense[1])  # X and Y bytes grow with M: the M = 4 row
