"""GPU tests of the EdgeBitmapLinear kernel vs the float64 numpy reference (needs an NVIDIA GPU).

Outputs are poisoned with NaN before every launch; shapes are odd (K, N not multiples of 8/64, M not
a multiple of 8); sparsities 0 … 1; fp16/fp32 X, fp16/int8 values, with and without bias, every tactic.
"""

import numpy as np
import pytest

from edgesdk.formats.bitmap_linear import BitmapLinearWeights
from edgesdk.kernels import bitmap_linear as kbl
from edgesdk.reference.bitmap_linear import bitmap_linear, tolerance

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _dev(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def run_kernel(x: np.ndarray, p: BitmapLinearWeights, tactic: int = 1, stream=None):
    t = {k: _dev(v) for k, v in p.to_tensors().items()}
    xd = _dev(x)
    m = int(np.prod(x.shape[:-1]))
    y = torch.full((*x.shape[:-1], p.n), float("nan"), dtype=xd.dtype, device="cuda")
    s = stream if stream is not None else torch.cuda.current_stream()
    kbl.launch(p.node_attributes(), str(x.dtype), m, [xd.data_ptr(), *[v.data_ptr() for v in t.values()]],
               [y.data_ptr()], s.cuda_stream, tactic)
    torch.cuda.synchronize()
    return y.cpu().numpy()


def make(rng, m, n, k, sparsity, vd, xd, bias):
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[rng.random((n, k)) < sparsity] = 0
    p = BitmapLinearWeights.pack(w, vd, bias=rng.standard_normal(n) if bias else None)
    x = rng.uniform(-2, 2, (m, k)).astype(xd)
    return x, p


def check(x, p, y):
    ref = bitmap_linear(x, p, out_dtype=np.float64)
    tol = tolerance(x, p)
    assert y.dtype == x.dtype and y.shape == ref.shape
    assert np.isfinite(y).all(), "NaN left in Y: some output was never written"
    err = np.abs(y.astype(np.float64) - ref)
    bad = err > tol
    assert not bad.any(), f"{bad.sum()} of {bad.size} outside tolerance; worst {err.max():.3g} (tol {tol[bad].min():.3g})"


SHAPES = [(1, 37, 203), (3, 203, 777), (8, 8, 64), (13, 1001, 130), (16, 96, 1000), (17, 45, 1025),
          (40, 250, 333), (100, 129, 65), (513, 77, 1201), (5, 1, 1), (2, 9, 7),
          # K % 8 == 0 with M <= 16: the decode path (bitmap_gemv_*) for fp16 X
          (1, 1001, 520), (4, 77, 8), (11, 300, 1544), (16, 515, 4104), (9, 33, 136)]


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.7, 0.9, 1.0])
@pytest.mark.parametrize("vd", ["float16", "int8"])
@pytest.mark.parametrize("xd", [np.float16, np.float32])
def test_matches_reference(sparsity, vd, xd):
    rng = np.random.default_rng(int(sparsity * 10) + 100 * (vd == "int8") + 1000 * (xd == np.float32))
    for i, (m, n, k) in enumerate(SHAPES):
        x, p = make(rng, m, n, k, sparsity, vd, xd, bias=i % 2 == 0)
        check(x, p, run_kernel(x, p))


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.7, 0.9, 1.0])
@pytest.mark.parametrize("vd", ["float16", "int8"])
def test_matches_reference_r80(sparsity, vd):
    """The 80-register decode kernels (heuristic tactic 49) on every SHAPES entry with fp16 X (those with
    M <= 16 and K % 8 == 0 take them; the others fall back to the generic path)."""
    rng = np.random.default_rng(int(sparsity * 10) + 100 * (vd == "int8") + 5000)
    for i, (m, n, k) in enumerate(SHAPES):
        x, p = make(rng, m, n, k, sparsity, vd, np.float16, bias=i % 2 == 1)
        check(x, p, run_kernel(x, p, kbl.R80_HEURISTIC))


@pytest.mark.parametrize("sparsity", [0.0, 0.3, 0.5, 0.7, 0.9, 1.0])
@pytest.mark.parametrize("vd", ["float16", "int8"])
@pytest.mark.parametrize("tactic", [kbl.XS_HEURISTIC, kbl.XS80_HEURISTIC])
def test_matches_reference_xs(tactic, sparsity, vd):
    """The X-staged decode kernels (X rows by cp.async into the ring slot, B fragments by ldmatrix;
    heuristics 60 and 70) on every SHAPES entry with fp16 X (M <= 16 and K % 8 == 0 take them)."""
    rng = np.random.default_rng(int(sparsity * 10) + 100 * (vd == "int8") + 7000 + tactic)
    for i, (m, n, k) in enumerate(SHAPES):
        x, p = make(rng, m, n, k, sparsity, vd, np.float16, bias=i % 2 == 0)
        check(x, p, run_kernel(x, p, tactic))


@pytest.mark.parametrize("tactic", kbl.valid_tactics({"n": 1, "k": 1, "value_dtype": "float16"}))
@pytest.mark.parametrize("m", [1, 7, 9, 16, 33, 70])
def test_every_tactic(tactic, m):
    rng = np.random.default_rng(tactic * 100 + m)
    for vd in ("float16", "int8"):
        x, p = make(rng, m, 299, 2120, 0.6, vd, np.float16, bias=True)  # K % 8 == 0, K % 64 != 0
        check(x, p, run_kernel(x, p, tactic))


def test_rank3_and_large_values():
    rng = np.random.default_rng(7)
    w = rng.standard_normal((300, 517)).astype(np.float32) * 50
    w[rng.random(w.shape) < 0.5] = 0
    p = BitmapLinearWeights.pack(w, "float16")
    x = rng.uniform(-30, 30, (2, 3, 517)).astype(np.float16)
    y = run_kernel(x, p)
    assert y.shape == (2, 3, 300)
    check(x, p, y)


def test_llm_shape_decode():
    rng = np.random.default_rng(11)
    for vd in ("float16", "int8"):
        x, p = make(rng, 4, 4096, 4096, 0.5, vd, np.float16, bias=False)
        check(x, p, run_kernel(x, p))


def test_cuda_graph_capture_and_replay():
    rng = np.random.default_rng(3)
    x, p = make(rng, 5, 333, 999, 0.5, "int8", np.float16, bias=True)
    t = {k: _dev(v) for k, v in p.to_tensors().items()}
    xd = _dev(x)
    y = torch.full((5, 333), float("nan"), dtype=torch.float16, device="cuda")
    args = ([xd.data_ptr(), *[v.data_ptr() for v in t.values()]], [y.data_ptr()])
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        kbl.launch(p.node_attributes(), "float16", 5, *args, s.cuda_stream)  # compile + load outside capture
        torch.cuda.synchronize()
        y.fill_(float("nan"))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            kbl.launch(p.node_attributes(), "float16", 5, *args, s.cuda_stream)
        g.replay()
    torch.cuda.synchronize()
    check(x, p, y.cpu().numpy())


def test_memcheck_subset():
    """Small cases run under compute-sanitizer (tools: PYTORCH_NO_CUDA_MEMORY_CACHING=1)."""
    rng = np.random.default_rng(5)
    for (m, n, k), s, vd, xd in [((1, 13, 77), 0.5, "float16", np.float16), ((17, 9, 130), 0.0, "int8", np.float32),
                                 ((3, 40, 1000), 1.0, "float16", np.float16), ((70, 33, 65), 0.7, "int8", np.float16),
                                 ((1, 299, 2120), 0.6, "int8", np.float16), ((12, 299, 2120), 0.3, "float16", np.float16)]:
        x, p = make(rng, m, n, k, s, vd, xd, bias=True)
        for tactic in (1, 6, 9, 21, 25, 26, 28, 43, 44, 46, 49, 53, 57, 60, 65, 70, 75):
            check(x, p, run_kernel(x, p, tactic))


def test_unaligned_x_falls_back_to_generic_path():
    rng = np.random.default_rng(9)
    x, p = make(rng, 3, 70, 264, 0.5, "float16", np.float16, bias=True)
    t = {k: _dev(v) for k, v in p.to_tensors().items()}
    buf = torch.zeros(3 * 264 + 1, dtype=torch.float16, device="cuda")
    buf[1:] = _dev(x).reshape(-1)  # X at a 2-byte offset: not 16-byte aligned
    y = torch.full((3, 70), float("nan"), dtype=torch.float16, device="cuda")
    kbl.launch(p.node_attributes(), "float16", 3, [buf.data_ptr() + 2, *[v.data_ptr() for v in t.values()]],
               [y.data_ptr()], torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    check(x, p, y.cpu().numpy())


@pytest.mark.parametrize("tactic", [1, 43, 44, 48, 49, 50, 54, 56, 57, 60, 61, 63, 65, 70, 71, 75])
@pytest.mark.parametrize("m", [1, 8, 9, 16])
def test_decode_v2_long_k_odd_strips(tactic, m):
    """Decode path v2 (``bitmap_dec_*``): K long enough that one warp refreshes its offsets window twice
    (tactic 43: no K split, 66 groups; 80-register tactic 57: two K splits), an odd number of strips
    (the last strip pair has one strip), N not a multiple of 8, M on both sides of the 8-row B block."""
    rng = np.random.default_rng(1000 + 10 * tactic + m)
    for vd, s in (("float16", 0.3), ("int8", 0.5), ("float16", 0.95), ("int8", 0.0)):
        x, p = make(rng, m, 77, 4168, s, vd, np.float16, bias=m % 2 == 1)
        c = kbl.config(77, 4168, m, "float16", vd, tactic, 132)
        assert c["name"].startswith("bitmap_dec"), c
        check(x, p, run_kernel(x, p, tactic))
