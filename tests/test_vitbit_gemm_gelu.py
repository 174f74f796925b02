"""The fp16-Y GELU of EdgeVitBitGemm (``gelu_h``, round 8) on the CPU: the coefficients in the plugin source,
repeated step by step in numpy fp32 (tools/fit_gelu_poly.py), against float64 erf."""

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("scipy")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import fit_gelu_poly  # noqa: E402


@pytest.fixture(scope="module")
def tool():
    return fit_gelu_poly


@pytest.fixture(scope="module")
def ys(tool):
    return tool.grid(n=1_000_001)


def test_source_coefficients_within_one_fp16_ulp(tool, ys):
    """Never more than 1 fp16 ulp from the correctly rounded GELU, and equal to it almost everywhere; in the
    negative tail better than the erf form, whose 1 + erf cancels."""
    coeffs, clamp = tool.read_source()
    assert len(coeffs) == 8 and 5.5 < clamp < 6.5
    a = tool.accuracy(tool.evaluate(ys, coeffs, clamp), ys)
    assert a["max_fp16_ulps"] <= 1, a
    assert a["fp16_differ"] < 0.005, a
    assert a["max_rel_error"] < 1e-5, a
    e = tool.accuracy(tool.erf_form(ys), ys)
    assert a["tail_fp16_differ"] < e["tail_fp16_differ"] / 10, (a, e)


def test_special_values(tool):
    """Past the clamp the decay comes from -t^2: fp16 -0 for y <= -5.9, y itself for y >= 5.9; +-inf and NaN as
    the erf form gives them (inf, NaN, NaN)."""
    coeffs, clamp = tool.read_source()
    neg = -np.geomspace(5.9, 1e30, 4001).astype(np.float32)
    g = tool.evaluate(neg, coeffs, clamp).astype(np.float16)
    assert np.all(g == 0) and np.all(np.signbit(g))
    pos = np.geomspace(5.9, 65000, 4001).astype(np.float32)
    assert np.array_equal(tool.evaluate(pos, coeffs, clamp).astype(np.float16), pos.astype(np.float16))
    g = tool.evaluate(np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32), coeffs, clamp)
    assert g[0] == np.inf and np.isnan(g[1]) and np.isnan(g[2]) and g[3] == 0 and g[4] == 0
    with np.errstate(invalid="ignore"):
        ref = tool.erf_form(np.array([np.inf, -np.inf, np.nan], np.float32))
    assert ref[0] == np.inf and np.isnan(ref[1]) and np.isnan(ref[2])


def test_fit_reaches_the_bound_and_a_lower_degree_does_not(tool, ys):
    """The tool's fit at the source's degree meets the bound; degree 5 does not (the bound discriminates)."""
    _, clamp = tool.read_source()
    a7 = tool.accuracy(tool.evaluate(ys, tool.fit(7, clamp, iterations=100), clamp), ys)
    assert a7["max_fp16_ulps"] <= 1 and a7["fp16_differ"] < 0.005, a7
    a5 = tool.accuracy(tool.evaluate(ys, tool.fit(5, clamp, iterations=100), clamp), ys)
    assert a5["fp16_differ"] > 0.005 or a5["max_fp16_ulps"] > 1, a5


def test_read_source_fails_loudly(tool):
    with pytest.raises(RuntimeError, match="not found"):
        tool.read_source("float s = 1.0f;")


def test_fp16_ulps():
    """The distance the GPU tests use: units in the last place of fp16, across zero and the subnormals."""
    from edgesdk.reference.vitbit_gemm import fp16_ulps

    one_up = np.nextafter(np.float16(1), np.float16(2))
    tiny = np.float16(2.0**-24)  # the smallest subnormal
    a = np.array([1.0, 0.0, -tiny, 65504.0, -2.0], np.float16)
    b = np.array([one_up, -0.0, tiny, np.inf, -2.0], np.float16)
    assert fp16_ulps(a, b).tolist() == [1, 0, 2, 1, 0]
    assert fp16_ulps(np.float32(1.0 + 2.0**-12), np.float16(1)).tolist() == 0  # rounds to 1 (tie to even)
