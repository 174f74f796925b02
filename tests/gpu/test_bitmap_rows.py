"""GPU tests of the row-walk EdgeBitmapLinear kernel (``bitmap_rows_*``, round 8) vs the float64 reference.

Odd shapes, sparsities 0 … 1, fp16/int8 values, bias on/off, M = 1 … 4, every configuration of
``ROWS_CONFIGS`` that fits; outputs poisoned with NaN before every launch.
"""

import numpy as np
import pytest

from edgesdk.formats.bitmap_linear import BitmapLinearWeights, row_layout
from edgesdk.kernels import bitmap_linear as kbl
from edgesdk.reference.bitmap_linear import bitmap_linear, tolerance

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def run_rows(x, p, rpw=None, ks=None):
    lay = row_layout(p)
    ts = [torch.from_numpy(np.ascontiguousarray(t)).cuda() for t in lay.tensors()]
    xd = torch.from_numpy(x).cuda()
    y = torch.full((x.shape[0], p.n), float("nan"), dtype=torch.float16, device="cuda")
    kbl.launch_rows(lay, x.shape[0], [xd.data_ptr(), *[t.data_ptr() for t in ts]], [y.data_ptr()],
                    torch.cuda.current_stream().cuda_stream, rpw, ks)
    torch.cuda.synchronize()
    return y.cpu().numpy()


def check(x, p, y):
    ref = bitmap_linear(x, p, out_dtype=np.float64)
    tol = tolerance(x, p)
    assert np.isfinite(y).all(), "NaN left in Y: some output was never written"
    err = np.abs(y.astype(np.float64) - ref)
    bad = err > tol
    assert not bad.any(), f"{bad.sum()} of {bad.size} outside tolerance; worst {err.max():.3g}"


SHAPES = [(1, 37, 203), (3, 203, 777), (4, 8, 64), (2, 1001, 130), (1, 96, 1000), (4, 45, 1025), (3, 250, 333),
          (1, 1, 1), (2, 9, 7), (1, 515, 4104), (4, 77, 2050), (1, 33, 9000)]


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.7, 0.9, 1.0])
@pytest.mark.parametrize("vd", ["float16", "int8"])
def test_rows_matches_reference(sparsity, vd):
    rng = np.random.default_rng(int(sparsity * 10) + 100 * (vd == "int8") + 7000)
    for i, (m, n, k) in enumerate(SHAPES):
        w = rng.standard_normal((n, k)).astype(np.float32)
        w[rng.random((n, k)) < sparsity] = 0
        p = BitmapLinearWeights.pack(w, vd, bias=rng.standard_normal(n) if i % 2 == 0 else None)
        x = rng.uniform(-2, 2, (m, k)).astype(np.float16)
        check(x, p, run_rows(x, p))


@pytest.mark.parametrize("rpw,ks", kbl.ROWS_CONFIGS)
def test_rows_every_config(rpw, ks):
    rng = np.random.default_rng(rpw * 100 + ks)
    for m, n, k, s in [(1, 300, 2600, 0.5), (4, 71, 5000, 0.7), (2, 1030, 777, 0.3), (3, 40, 64, 0.9)]:
        w = rng.standard_normal((n, k)).astype(np.float32)
        w[rng.random((n, k)) < s] = 0
        for vd in ("float16", "int8"):
            p = BitmapLinearWeights.pack(w, vd, bias=rng.standard_normal(n))
            x = rng.uniform(-2, 2, (m, k)).astype(np.float16)
            check(x, p, run_rows(x, p, rpw, ks))
