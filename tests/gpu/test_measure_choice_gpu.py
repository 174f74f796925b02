"""GPU side of the measured kernel choice (``--measure``): the cuBLAS dense baseline is right, the timers
return sane figures from graph-captured launches, and a rewrite measured on this GPU records them."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from edgesdk.devices import host_profile
from edgesdk.formats.bitmap_linear import BitmapLinearWeights
from edgesdk.kernels import _cuda, dense
from edgesdk.kernels import bitmap_linear as kbl
from edgesdk.rewrite import rewrite_model

pytestmark = pytest.mark.gpu
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _run_dense(x, w, dtype):
    m, k = x.shape
    n = w.shape[0]
    cu = _cuda._driver()
    _cuda.init()
    st = _cuda.check(cu.cuStreamCreate(1))
    ybytes = (2 if dtype == "float16" else 4) * m * n
    with _cuda.DeviceBuffer(x.nbytes) as xd, _cuda.DeviceBuffer(w.nbytes) as wd, _cuda.DeviceBuffer(ybytes) as yd:
        xd.upload(x)
        wd.upload(w)
        yd.poison()
        status = dense.linear(int(xd), int(wd), int(yd), m, n, k, dtype, int(st))
        _cuda.check(cu.cuStreamSynchronize(st))
        y = yd.download((m, n), np.float16 if dtype == "float16" else np.int32)
    _cuda.check(cu.cuStreamDestroy(st))
    return status, y


@pytest.mark.parametrize("m,n,k", [(1, 37, 70), (3, 129, 200), (16, 300, 1000)])
def test_dense_fp16_matches_float64(m, n, k):
    rng = np.random.default_rng(m * n + k)
    x = rng.uniform(-2, 2, (m, k)).astype(np.float16)
    w = rng.uniform(-1, 1, (n, k)).astype(np.float16)
    status, y = _run_dense(x, w, "float16")
    assert status == 0
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    # cuBLAS may reduce split-K partials in fp16 (its default math mode, as torch's): a looser bound than
    # our kernels', still far below what a transposed or misplaced operand would give (errors ~ |ref|)
    mag = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(np.isfinite(y)) and np.all(err <= 2.0**-9 * np.abs(ref) + 2.0**-11 * mag)
    assert np.linalg.norm(err) <= 2e-3 * np.linalg.norm(ref)


@pytest.mark.parametrize("m,n,k", [(1, 36, 68), (5, 130, 260), (16, 256, 1024)])
def test_dense_int8_exact_or_unsupported(m, n, k):
    rng = np.random.default_rng(k)
    x = rng.integers(-128, 128, (m, k), dtype=np.int8)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    x[0, 0] = w[0, 0] = -128
    status, y = _run_dense(x, w, "int8")
    if status == dense.STATUS_NOT_SUPPORTED:
        pytest.skip(f"cuBLAS has no int8 GEMM for m={m}, n={n}, k={k} on this GPU")
    assert status == 0
    assert np.array_equal(y, x.astype(np.int64) @ w.astype(np.int64).T)


def test_timers_and_measure_vs_dense():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((1000, 2056)).astype(np.float32)
    w[rng.random(w.shape) < 0.5] = 0
    for vd in ("float16", "int8"):
        p = BitmapLinearWeights.pack(w, vd)
        t = kbl.time_us(p, 3)
        assert math.isfinite(t) and 0.5 < t < 5000
        meas = kbl.measure_vs_dense(p, 3, int8_dense=vd == "int8")
        assert meas["m"] == 3 and meas["gpu"] == _cuda.device_facts()["name"]
        assert 0.5 < meas["bitmap_us"] < 5000 and 0.5 < meas["fp16_us"] < 5000
        assert meas["dense_us"] == min(meas["fp16_us"], meas["int8_us"] or math.inf)
        if vd == "float16":
            assert meas["int8_us"] is None and meas["dense"] == "cuBLAS fp16"
    assert dense.time_us(1000, 2056, 1, "float16") > 0


def test_rewrite_measured_on_this_gpu():
    from test_measure_choice import cfg, two_layer_model

    host = host_profile()
    _, rows = rewrite_model(two_layer_model(k=512, n1=384, n2=256), cfg(measure="auto"), None, host)
    for r in rows:
        assert r["measured"] is not None and r["measured"]["sm_count"] == host.sm_count
        assert r["choice"].startswith("measured on this GPU")
        assert (r["kernel"] == "bitmap") == (r["measured"]["bitmap_us"] <= r["measured"]["dense_us"])


def test_vitbit_measure_vs_dense():
    from edgesdk.formats.vitbit_gemm import VitBitWeights
    from edgesdk.kernels import vitbit_gemm as kvg

    rng = np.random.default_rng(5)
    q = rng.integers(-127, 128, (300, 776), dtype=np.int8)
    p = VitBitWeights.pack(q, rng.uniform(0.001, 0.01, 300).astype(np.float32), 8,
                           bias=rng.standard_normal(300).astype(np.float32), x_scale=0.02)
    t = kvg.time_us(p, 197)
    assert math.isfinite(t) and 0.5 < t < 5000
    meas = kvg.measure_vs_dense(p, 197)
    assert meas["plugin"] == "vitbit" and meas["m"] == 197 and 0.5 < meas["vitbit_us"] < 5000
    assert meas["dense"] == "cuBLAS int8" and meas["dense_us"] == meas["int8_us"] and meas["fp16_us"] is None
