"""EdgeVitBitGemm kernels vs the numpy reference: every tactic bit-exact, at the exactness bounds (GPU)."""

import numpy as np
import pytest

from edgesdk.formats import vitbit_gemm as F
from edgesdk.kernels import vitbit_gemm as K
from edgesdk.reference import vitbit_gemm as R

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def run(p: F.VitBitWeights, x: np.ndarray, tactic: int, graph: bool = False, x_offset: int = 0) -> np.ndarray:
    """Launch on the GPU with Y and the workspace poisoned; returns Y as numpy. ``x_offset``: X placed that
    many bytes past a 256-byte aligned address (unaligned int8 X)."""
    dev = "cuda"
    m = int(np.prod(x.shape[:-1]))
    flat = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    buf = torch.zeros(flat.size + x_offset, dtype=torch.uint8, device=dev)
    buf[x_offset:] = torch.from_numpy(flat).to(dev)
    xt = buf[x_offset:]
    t = {k: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for k, v in p.to_tensors().items()}
    y_np = np.dtype(p.y_dtype or x.dtype)
    y = torch.full(x.shape[:-1] + (p.n,), float("nan"), dtype=getattr(torch, y_np.name), device=dev)
    ws = torch.full((max(K.workspace_bytes(p.node_attributes(), m), 1),), 0x7F, dtype=torch.uint8, device=dev)
    ins = [xt.data_ptr()] + [t[n].data_ptr() for n in F.TENSOR_NAMES if n in t]
    dtype = x.dtype.name
    s = torch.cuda.current_stream()

    def go():
        K.launch(p.node_attributes(), dtype, m, ins, [y.data_ptr()], s.cuda_stream, tactic, workspace=ws.data_ptr())

    if graph:
        go()  # compile and load outside the capture
        torch.cuda.synchronize()
        y.fill_(float("nan"))
        ws.fill_(0x7F)
        g = torch.cuda.CUDAGraph()
        cs = torch.cuda.Stream()
        with torch.cuda.stream(cs):
            s = cs
            with torch.cuda.graph(g, stream=cs):
                go()
        g.replay()
    else:
        go()
    torch.cuda.synchronize()
    return y.cpu().numpy()


def _layer(rng, n, k, bits=8, bias=True, gelu=False, x_scale=0.02):
    lo, hi = F.weight_range(bits)
    w = rng.integers(lo, hi + 1, (n, k)).astype(np.int8)
    w.flat[rng.integers(0, w.size, max(1, w.size // 50))] = lo  # make sure the extreme value occurs
    s = rng.uniform(0.002, 0.03, n).astype(np.float32)
    b = rng.normal(0, 2, n).astype(np.float32) if bias else None
    return F.VitBitWeights.pack(w, s, bits, bias=b, x_scale=x_scale, gelu=gelu)


def _x_full_range(rng, shape, x_scale, dtype):
    """Activations whose quantized values cover [-128, 127] (ends included) plus clipped outliers."""
    q = rng.integers(-128, 128, shape).astype(np.float64)
    x = q * x_scale + rng.uniform(-0.45, 0.45, shape) * x_scale
    x.flat[rng.integers(0, x.size, max(1, x.size // 40))] = -1000 * x_scale
    x.flat[rng.integers(0, x.size, max(1, x.size // 40))] = 1000 * x_scale
    return x.astype(dtype)


SHAPES = [((1, 37), 48, 40), ((3, 67), 200, 77), ((197,), 768, 257), ((300,), 1040, 130), ((2, 261), 1328, 96)]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("lead, k, n", SHAPES)
def test_every_tactic_bit_exact(lead, k, n, dtype):
    rng = np.random.default_rng(k * 7 + n)
    p = _layer(rng, n, k, bias=(k % 2 == 0))
    x = _x_full_range(rng, lead + (k,), p.x_scale, dtype)
    q = R.quantize_activations(x.reshape(-1, k), p.x_scale)
    assert q.min() == -128 and q.max() == 127
    ref = R.vitbit_gemm(x, p)
    m = int(np.prod(lead))
    tactics = K.valid_tactics(p.node_attributes(), m)
    assert 1 in tactics and len(tactics) >= 10 + 5 * (k > 128)  # split-K needs >= 2 k-tiles
    assert {1, 3, 9, 25, 28, 29, 30, 31, 33, 34, 71, 72, 73, 80, 81, 82} <= set(tactics)
    if k > 128:
        assert 50 in tactics  # in-kernel split-K needs 2 k-tiles
    for t in tactics:
        y = run(p, x, t)
        bad = ~((y == ref) | (np.isnan(y) & np.isnan(ref)))
        name = "auto" if t == K.AUTO else K.config(t)[0].name
        assert not bad.any(), f"tactic {t} ({name}): {bad.sum()} of {bad.size} differ"


@pytest.mark.parametrize("bits", [4, 5])
def test_sub8bit_field_tactics_at_the_bound(bits):
    """Worst case for the packed fields: all q = -128 times the most negative weight (largest positive
    product) in every column of a pair, over a K that is not a multiple of the flush interval."""
    rng = np.random.default_rng(bits)
    n, k = 70, 1000
    lo, _ = F.weight_range(bits)
    w = np.full((n, k), lo, np.int8)
    w[1::4] = -lo - 1  # neighbouring field at the negative extreme
    p = F.VitBitWeights.pack(w, np.full(n, 0.01, np.float32), bits, x_scale=0.05)
    x = np.full((133, k), -1000.0, np.float32)
    x[::3] = 1000.0
    ref = R.vitbit_gemm(x, p)
    for t in K.valid_tactics(p.node_attributes(), 133):
        assert np.array_equal(run(p, x, t), ref), f"tactic {t}"
    p2 = _layer(rng, 93, 333, bits=bits)
    x2 = _x_full_range(rng, (77, 333), p2.x_scale, np.float16)
    ref2 = R.vitbit_gemm(x2, p2)
    for t in (20, 21, 10, 1):
        assert np.array_equal(run(p2, x2, t), ref2), f"tactic {t}"


def test_fp_share_at_the_2pow24_bound():
    """Partial sum exactly 2^24 over 1024 values of K, then +1: exact only because the FP warps flush
    to int32 every 1024 values (an fp32 accumulator would stay at 2^24)."""
    n, k = 64, 2048
    w = np.full((n, k), -128, np.int8)
    w[:, 1024:] = 1
    p = F.VitBitWeights.pack(w, np.full(n, 1.0, np.float32), x_scale=1.0)
    x = np.full((40, k), -128.0, np.float32)
    x[:, 1024:] = 0.0
    x[:, 1024] = 1.0
    ref = R.vitbit_gemm(x, p)
    assert R.int_gemm(R.quantize_activations(x, 1.0), p.w_q())[0, 0] == 2**24 + 1
    for t in K.valid_tactics(p.node_attributes(), 40):
        assert np.array_equal(run(p, x, t), ref), f"tactic {t}"


def test_int32_bound_k_max():
    """K = 131071 with every product (-128)(-128): acc = 2^31 - 16384, no overflow in any tactic."""
    n, k = 40, F.K_MAX
    p = F.VitBitWeights.pack(np.full((n, k), -128, np.int8), np.full(n, 1.0, np.float32), x_scale=1.0)
    x = np.full((17, k), -200.0, np.float32)
    ref = R.vitbit_gemm(x, p)
    assert ref[0, 0] == np.float32(k * 16384)
    for t in K.valid_tactics(p.node_attributes(), 17):
        assert np.array_equal(run(p, x, t), ref), f"tactic {t}"


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gelu_tight_tolerance(dtype):
    """GELU is not bit-exact with numpy's float64 erf: fp16 Y (gelu_h) within 1 ulp of the reference, fp32 Y
    (erff) to a tight tolerance."""
    rng = np.random.default_rng(11)
    p = _layer(rng, 136, 256, gelu=True, x_scale=0.05)
    x = _x_full_range(rng, (150, 256), p.x_scale, dtype)
    ref = R.vitbit_gemm(x, p)
    for t in (1, 3, 5, 9, 11, 15, 17, 22, 25, 27, 28, 29, 30, 31, 33, 34, 50, 71, 72, 73, 80, 81, 82):
        y = run(p, x, t)
        if dtype == np.float16:
            assert R.fp16_ulps(y, ref).max() <= 1, f"tactic {t}"
        else:
            np.testing.assert_allclose(y.astype(np.float64), ref.astype(np.float64), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("n", [2048, 2044])
def test_gelu_fp16_sweep_every_tactic(n):
    """fp16 Y with GELU over a dense sweep of pre-GELU values (about -8.4 ... 8.4): every tactic's output within 1 ulp of
    the float64 reference and equal to it on more than 99.5 % of values, and all tactics bit-identical (one
    gelu_h for the compact, generic and hybrid epilogues). N = 2048 takes the compact epilogue, 2044 the generic."""
    rng = np.random.default_rng(n)
    k, m = 256, 256  # two k-tiles: the in-kernel split-K tactic (50) is valid too
    w = np.zeros((n, k), np.int8)
    w[np.arange(n), np.arange(n) % k] = 1  # acc[i, j] = q[i, j % k] = i - 128
    q = np.repeat(np.arange(-128, 128, dtype=np.int8)[:, None], k, 1)
    p = F.VitBitWeights.pack(w, rng.uniform(0.03, 0.055, n).astype(np.float32), bias=rng.uniform(-1.5, 1.5, n)
                             .astype(np.float32), x_scale=1.0, gelu=True, y_dtype="float16")
    acc = R.int_gemm(q, p.w_q())
    pre = R.epilogue(acc, p.alpha, p.bias, False, np.float32)
    assert pre.min() < -7 and pre.max() > 7 and len(np.unique(pre)) > m * n // 2
    ref = R.vitbit_gemm(q, p)
    first = None
    for t in K.valid_tactics(p.node_attributes(), m):
        y = run(p, q, t)
        u = R.fp16_ulps(y, ref)
        name = "auto" if t == K.AUTO else K.config(t)[0].name
        assert u.max() <= 1 and (u > 0).mean() < 0.005, f"tactic {t} ({name}): max {u.max()}, {(u > 0).mean():.2%}"
        if first is None:
            first = (t, y)
        assert np.array_equal(y.view(np.uint16), first[1].view(np.uint16)), f"tactic {t} ({name}) != {first[0]}"
        if t != K.AUTO and K.config(t)[0].persistent:  # 3 blocks walk all the tiles of the GELU build
            old = K.PERSISTENT_GRID_CAP
            try:
                K.PERSISTENT_GRID_CAP = 3
                assert np.array_equal(run(p, q, t).view(np.uint16), y.view(np.uint16)), f"tactic {t} capped"
            finally:
                K.PERSISTENT_GRID_CAP = old


PERSISTENT = (30, 31, 33, 34, 60, 71, 72, 80, 81, 82)  # 60: split-M (head tp_128x128 + tail tp_64x64)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("misalign", [0, 4])
def test_register_epilogue_paths(bias, misalign):
    """The persistent and in-kernel split-K tactics finish fp16 Y with a compact epilogue where N % 8 == 0 and
    Y / w_scale / bias are aligned (bias fixed at compile time), else with the generic one: both bit-exact, with
    and without bias; ``misalign`` = 4 puts w_scale and bias 4 bytes off an 8-byte boundary (generic path). GELU
    layers take the compact epilogue too: test_gelu_tight_tolerance and test_gelu_fp16_sweep_every_tactic cover them."""
    rng = np.random.default_rng(17 + bias + misalign)
    for (m, k, n) in [(261, 200, 96), (130, 768, 264), (77, 48, 520)]:
        p = _layer(rng, n, k, bias=bias)
        x = _x_full_range(rng, (m, k), p.x_scale, np.float16)
        ref = R.vitbit_gemm(x, p)
        a = p.node_attributes()
        t = p.to_tensors()
        xt = torch.from_numpy(x).cuda()

        def at(v, off):  # a device copy of v starting `off` bytes past a 256-byte boundary
            buf = torch.zeros(v.nbytes + off, dtype=torch.uint8, device="cuda")
            buf[off:] = torch.from_numpy(np.ascontiguousarray(v).reshape(-1).view(np.uint8)).cuda()
            return buf, buf.data_ptr() + off

        # the weight rows stay 16-byte aligned (cp.async): only w_scale and bias move
        keep = [at(t[nm], 0 if nm == "weight" else misalign) for nm in F.TENSOR_NAMES if nm in t]
        ins = [xt.data_ptr()] + [ptr for _, ptr in keep]
        ws = torch.full((K.workspace_bytes(a, m),), 0x7F, dtype=torch.uint8, device="cuda")
        for tac in (1, 30, 31, 33, 34, 50, 60, 71, 72, 80, 81, 82):
            y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
            K.launch(a, "float16", m, ins, [y.data_ptr()], torch.cuda.current_stream().cuda_stream, tac,
                     workspace=ws.data_ptr())
            torch.cuda.synchronize()
            got = y.cpu().numpy()
            bad = got.view(np.uint16) != ref.view(np.uint16)
            assert not bad.any(), f"tactic {tac} {m}x{k}x{n} bias={bias} misalign={misalign}: {bad.sum()} differ"


@pytest.mark.parametrize("cap", [1, 3, 7])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_persistent_tactics_walk_many_tiles(cap, dtype):
    """Persistent tactics with the grid capped to a few blocks, so each block walks many tiles through one
    pipeline (tile changes in the middle of the cp.async prologue included): bit-exact on odd shapes with
    partial row / column tiles and a K tail, Y poisoned."""
    rng = np.random.default_rng(cap * 13 + (dtype == np.float16))
    old = K.PERSISTENT_GRID_CAP
    try:
        K.PERSISTENT_GRID_CAP = cap
        walked = {t: 0 for t in PERSISTENT}
        # K = 48: one k-tile per tile; the last shape gives the 256-row / 256-column tiles enough tiles
        for (m, k, n) in [(301, 200, 390), (390, 768, 264), (200, 48, 1000), (777, 200, 650)]:
            p = _layer(rng, n, k, bias=(n % 2 == 0))
            x = _x_full_range(rng, (m, k), p.x_scale, dtype)
            ref = R.vitbit_gemm(x, p)
            for t in PERSISTENT:
                cfg, _ = K.config(t)
                tiles = -(-m // cfg.bm) * -(-n // cfg.bn)
                if tiles <= cap:  # at cap 7, 80 and 81 skip one shape each (too few 256-row / -column tiles)
                    continue
                walked[t] += 1  # every block walks more than one tile
                y = run(p, x, t)
                bad = ~((y == ref) | (np.isnan(y) & np.isnan(ref)))
                assert not bad.any(), f"cap {cap} tactic {t} ({cfg.name}) {m}x{k}x{n}: {bad.sum()} differ"
        assert min(walked.values()) >= 3, walked
    finally:
        K.PERSISTENT_GRID_CAP = old


def test_persistent_grid_follows_the_context():
    """The persistent grid is min(tiles, resident blocks x SMs of the current context)."""
    from edgesdk.kernels import _cuda

    cfg, _ = K.config(30)
    _cuda.init()
    kern = K._kernel(f"vitbit_gemm_{cfg.name}")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g = K.persistent_grid(kern, cfg, 10**6)
    assert g % sms == 0 and 1 <= g // sms <= 2
    assert K.persistent_grid(kern, cfg, 5) == 5


def test_cuda_graph_capture():
    rng = np.random.default_rng(5)
    p = _layer(rng, 96, 160)
    x = _x_full_range(rng, (70, 160), p.x_scale, np.float16)
    ref = R.vitbit_gemm(x, p)
    for t in (1, 5, 11, 27, 30, 33, 50, 72, 73):
        assert np.array_equal(run(p, x, t, graph=True), ref)


def test_inkernel_splitk_many_tiles_and_counter_reuse():
    """tk tactics (split-K summed by each tile's last block): odd shapes with partial tiles, a K tail and
    splits that do not divide the k-tiles, Y poisoned; then the gemm() path on one zeroed buffer launched
    three times: exact every time, and the tile counters are back to zero after each launch."""
    rng = np.random.default_rng(50)
    for (m, k, n) in [(197, 768, 392), (61, 1000, 130), (333, 3072, 200), (70, 200, 77)]:
        p = _layer(rng, n, k, bias=(n % 2 == 0))
        x = _x_full_range(rng, (m, k), p.x_scale, np.float16)
        ref = R.vitbit_gemm(x, p)
        for t in (50,):
            y = run(p, x, t)
            bad = ~((y == ref) | (np.isnan(y) & np.isnan(ref)))
            assert not bad.any(), f"tactic {t} {m}x{k}x{n}: {bad.sum()} differ"
    m, k, n = 150, 900, 264
    p = _layer(rng, n, k)
    x = _x_full_range(rng, (m, k), p.x_scale, np.float32)
    ref = R.vitbit_gemm(x, p)
    a = p.node_attributes()
    t = {kk: torch.from_numpy(np.ascontiguousarray(v)).cuda() for kk, v in p.to_tensors().items()}
    xq = torch.from_numpy(R.quantize_activations(x, p.x_scale).astype(np.int8))
    kp = F.k_padded(k)
    xqp = torch.zeros((m, kp), dtype=torch.int8)
    xqp[:, :k] = xq
    xqp = xqp.cuda()
    ws = torch.zeros(K.workspace_bytes(a, m), dtype=torch.uint8, device="cuda")
    part = ws.data_ptr() + K._xq_bytes(m, k)
    off = K._xq_bytes(m, k) + K._partials_bytes(m, n)
    for tactic in (50, 5, 50):  # a tc2 split-K tactic in between writes its partials to the same region
        for _ in range(3):
            y = torch.full((m, n), float("nan"), dtype=torch.float32, device="cuda")
            K.gemm(K.validate_attributes(a), "float32", m, xqp.data_ptr(), t["weight"].data_ptr(),
                   t["w_scale"].data_ptr(), t["bias"].data_ptr(), y.data_ptr(),
                   torch.cuda.current_stream().cuda_stream, tactic, part=part)
            torch.cuda.synchronize()
            assert np.array_equal(y.cpu().numpy(), ref), f"tactic {tactic}"
            ctr = ws[off:off + 4 * K._counters(m, n)].view(torch.int32)
            assert off + 4 * K._counters(m, n) == ws.numel()
            assert int(ctr.abs().sum()) == 0, f"tactic {tactic}: counters not reset"


@pytest.mark.parametrize("y_dtype", ["float16", "float32"])
@pytest.mark.parametrize("lead, k, n", SHAPES + [((2, 45), 96, 64)])
def test_int8_x_every_tactic_bit_exact(lead, k, n, y_dtype):
    """int8 X (the graph's QuantizeLinear output, q itself, -128 and 127 included): every tactic equals the
    reference, read in place (K % 16 == 0, aligned) or through the pad kernel (K % 16 != 0, or X 8 bytes off
    alignment); the workspace is poisoned, so tk (50) also proves its counters are zeroed first."""
    rng = np.random.default_rng(k * 3 + n)
    p = _layer(rng, n, k, bias=(k % 2 == 1), gelu=(n % 2 == 1))
    p8 = F.VitBitWeights(**{**p.__dict__, "y_dtype": y_dtype, "_validated": False})
    x = rng.integers(-128, 128, lead + (k,)).astype(np.int8)
    x.reshape(-1)[:2] = [-128, 127]
    ref = R.vitbit_gemm(x, p8)
    assert ref.dtype == np.dtype(y_dtype)
    m = int(np.prod(lead))
    tactics = K.valid_tactics(p8.node_attributes(), m)
    for t in tactics:
        for off in ((0, 8) if t in (1, 30, 50) else (0,)):
            y = run(p8, x, t, x_offset=off)
            name = "auto" if t == K.AUTO else K.config(t)[0].name
            if p8.gelu and y_dtype == "float16":  # gelu_h: within 1 ulp (test_gelu_tight_tolerance)
                assert R.fp16_ulps(y, ref).max() <= 1, f"tactic {t} ({name}) offset {off}"
            elif p8.gelu:  # erff in fp32 on the GPU vs float64 erf: the tolerance of test_gelu_tight_tolerance
                np.testing.assert_allclose(y.astype(np.float64), ref.astype(np.float64), rtol=2e-6, atol=2e-6,
                                           err_msg=f"tactic {t} ({name}) offset {off}")
            else:
                bad = ~((y == ref) | (np.isnan(y) & np.isnan(ref)))
                assert not bad.any(), f"tactic {t} ({name}) offset {off}: {bad.sum()} of {bad.size} differ"
    for t in (1, 50, 30):
        assert np.array_equal(run(p8, x, t, graph=True), run(p8, x, t)), f"tactic {t} under graph capture"


@pytest.mark.parametrize("y_dtype", ["float16", "float32"])
@pytest.mark.parametrize("off", [0, 8])
def test_split_m_both_parts_int8_x(y_dtype, off):
    """Split-M tactics with both kernels running (grid capped to 7 blocks, so the head takes whole waves of 7
    128 x 128 tiles and the tail the rest), int8 X read in place (off 0) or through the pad kernel (off 8),
    fp16 and fp32 Y, under CUDA-graph capture too: bit-exact."""
    rng = np.random.default_rng(77 + off)
    old = K.PERSISTENT_GRID_CAP
    try:
        K.PERSISTENT_GRID_CAP = 7
        for (m, k, n) in [(301, 160, 390), (1000, 48, 260)]:
            p = _layer(rng, n, k, bias=True)
            p8 = F.VitBitWeights(**{**p.__dict__, "y_dtype": y_dtype, "_validated": False})
            x = rng.integers(-128, 128, (m, k)).astype(np.int8)
            ref = R.vitbit_gemm(x, p8)
            slots = K.persistent_grid(K._kernel("vitbit_gemm_tp_128x128"), K._C["tp_128x128"], 1 << 30)
            assert 0 < K.split_m_rows(slots, m, n) < m
            for t in K.SPLIT_M:
                y = run(p8, x, t, x_offset=off)
                bad = ~((y == ref) | (np.isnan(y) & np.isnan(ref)))
                assert not bad.any(), f"tactic {t} {m}x{k}x{n}: {bad.sum()} of {bad.size} differ"
                assert np.array_equal(run(p8, x, t, graph=True, x_offset=off), y)
    finally:
        K.PERSISTENT_GRID_CAP = old


def test_int8_x_time_and_measure():
    """The build's timer with an int8 X: the GEMM alone (no quantize pass) against cuBLAS int8."""
    rng = np.random.default_rng(4)
    p = _layer(rng, 768, 768)
    p8 = F.VitBitWeights(**{**p.__dict__, "y_dtype": "float16", "_validated": False})
    t8 = K.time_us(p8, 197, x_dtype="int8")
    assert 0 < t8 < 1e4
    meas = K.measure_vs_dense(p8, 197)
    assert meas["x_dtype"] == "int8" and meas["vitbit_us"] > 0 and meas["dense_us"] > 0
    assert K.measure_vs_dense(p, 197)["x_dtype"] == "float16"


def test_default_tactic_uses_the_drivers_occupancy():
    """Tactic 1 resolves to auto_tactic with each candidate kernel's occupancy as the driver reports it, on the
    full GPU and in a 16-SM green context (the choice follows the context), and runs that tactic (bit-exact)."""
    import contextlib

    from cuda.bindings import driver as cu

    from edgesdk.kernels import _cuda

    torch.zeros(1, device="cuda")  # torch's context current
    _cuda.init()
    for t in K.WAVE_MODEL:
        for gelu in (False, True):
            cfg, _ = K.config(t)
            kern = K._kernel(K.kernel_name(cfg, gelu))
            kern.set_max_dynamic_smem(cfg.smem)
            want = _cuda.check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(kern.function, cfg.threads, cfg.smem))
            assert K.resident_blocks(t, gelu) == want >= 1, (t, gelu)
    rng = np.random.default_rng(13)
    p = _layer(rng, 300, 520)
    a = p.node_attributes()
    picks = {}
    for green in (False, True):
        with _cuda.in_green_context(16) if green else contextlib.nullcontext():
            n_sm = _cuda.context_sm_count()
            assert (n_sm < torch.cuda.get_device_properties(0).multi_processor_count) == green
            for m in (1, 197, 1576, 6304):
                occ = {t: K.resident_blocks(t) for t in K.WAVE_MODEL}
                want = K.auto_tactic(a["n"], a["k"], m, n_sm, occ)
                assert K.resolve_tactic(a, m) == want
                assert K._gemm_config(a, m, K.AUTO)[0] == K.config(want)[0]
                picks[(green, m)] = want
    assert len(set(picks.values())) >= 2, picks  # the choice changes with M (and the context)
    x = _x_full_range(rng, (197, 520), p.x_scale, np.float16)
    y = run(p, x, K.AUTO)
    assert np.array_equal(y.view(np.uint16), R.vitbit_gemm(x, p).view(np.uint16))
