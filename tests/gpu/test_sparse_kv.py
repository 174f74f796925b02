"""GPU tests of the sparse_kv kernels vs the numpy cache model and the float64 reference.

Every output, workspace, record and ring buffer is poisoned (NaN / 0xAB bytes) before the kernels run.
Compression (prefill and append) must reproduce the numpy bytes exactly; attention is checked against
float64 attention on the pruned cache; sparsity 0 against dense attention on the raw K/V.
"""

import numpy as np
import pytest

from edgesdk.formats import sparse_kv as f
from edgesdk.kernels import sparse_kv as ks
from edgesdk.reference import sparse_kv as ref

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")


def _dev(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


class GpuCache:
    """Device arrays of one cache, poisoned."""

    def __init__(self, cfg: f.SparseKVConfig, batch: int):
        h, nr = cfg.num_kv_heads, cfg.record_capacity
        self.cfg = cfg
        self.k_rec = torch.full((batch, h, nr, cfg.rk), 0xAB, dtype=torch.uint8, device="cuda")
        self.v_rec = torch.full((batch, h, nr, cfg.rv), 0xAB, dtype=torch.uint8, device="cuda")
        self.k_ring = torch.full((batch, h, cfg.ring, cfg.head_dim), float("nan"), dtype=torch.float16, device="cuda")
        self.v_ring = torch.full_like(self.k_ring, float("nan"))
        self.lens = torch.zeros(batch, dtype=torch.int32, device="cuda")

    def ptrs(self) -> ks.CachePtrs:
        return ks.CachePtrs(self.k_rec.data_ptr(), self.v_rec.data_ptr(), self.k_ring.data_ptr(),
                            self.v_ring.data_ptr(), self.lens.data_ptr())


def _stream():
    return torch.cuda.current_stream().cuda_stream


def gpu_prefill(cfg, k, v, lens):
    g = GpuCache(cfg, k.shape[0])
    g.lens.copy_(torch.from_numpy(np.asarray(lens, np.int32)))
    kd, vd = _dev(k), _dev(v)
    ks.prefill(cfg, k.shape[0], k.shape[2], kd.data_ptr(), vd.data_ptr(), g.ptrs(), _stream())
    torch.cuda.synchronize()
    return g


def assert_same_cache(cfg, g: GpuCache, host: f.SparseKVCache):
    lens = g.lens.cpu().numpy()
    assert np.array_equal(lens, host.lens)
    k_rec, v_rec = (f.records_to_logical(x.cpu().numpy()) for x in (g.k_rec, g.v_rec))  # stored chunk-major
    k_ring, v_ring = g.k_ring.cpu().numpy(), g.v_ring.cpu().numpy()
    for b, L in enumerate(lens.tolist()):
        nc = cfg.n_compressed(L)
        hk, hv = f.records_to_logical(host.k_rec), f.records_to_logical(host.v_rec)
        assert np.array_equal(k_rec[b, :, :nc], hk[b, :, :nc]), f"K records of sequence {b} differ"
        assert np.array_equal(v_rec[b, :, :nc], hv[b, :, :nc]), f"V records of sequence {b} differ"
        slots = [t % cfg.ring for t in range(nc, L)]
        assert np.array_equal(k_ring[b, :, slots].view(np.uint16), host.k_ring[b, :, slots].view(np.uint16))
        assert np.array_equal(v_ring[b, :, slots].view(np.uint16), host.v_ring[b, :, slots].view(np.uint16))


def gpu_attention(cfg, g: GpuCache, q, max_len, tokens_per_split=None, tactic=ks.STREAM_FUSED, calls=2, warps=None):
    """Run decode attention ``calls`` times on one poisoned workspace (the fused merge's counters must
    reset themselves); ``out`` is poisoned before every call and the last result is returned."""
    B = q.shape[0]
    _, ns = ks.plan_cache(cfg, B, max_len, tokens_per_split=tokens_per_split, tactic=tactic, warps=warps)
    ws = torch.full((ks.workspace_bytes(cfg.num_q_heads, cfg.head_dim, B, ns) // 4,), float("nan"), device="cuda")
    ks.init_workspace(ws.data_ptr(), B, cfg.num_q_heads, _stream())
    out = torch.empty((B, cfg.num_q_heads, cfg.head_dim), dtype=torch.float16, device="cuda")
    qd = _dev(q)
    res = []
    for _ in range(calls):
        out.fill_(float("nan"))
        ks.decode_attention(cfg, B, max_len, qd.data_ptr(), g.ptrs(), out.data_ptr(), ws.data_ptr(), _stream(),
                            tokens_per_split=tokens_per_split, tactic=tactic, warps=warps)
        torch.cuda.synchronize()
        res.append(out.cpu().numpy())
    for r in res[1:]:
        assert np.array_equal(r.view(np.uint16), res[0].view(np.uint16)), "repeated call gave a different result"
    return res[-1]


# (tactic, tokens per split): the heuristic, one 16-token tile per warp (64; also the most splits, up to
# 47, so the block-parallel merges run their 4-split steps and remainders), many tiles per warp (1024:
# every cp.async stage reused several times), for tactic 0 its own range.
SPLITS = [(ks.SPLIT_V1, None), (ks.SPLIT_V1, 64), (ks.STREAM, None), (ks.STREAM, 64), (ks.STREAM, 1024),
          (ks.STREAM_FUSED, None), (ks.STREAM_FUSED, 64), (ks.STREAM_FUSED, 1024)]


def splits_for(d):
    """SPLITS, and at d = 64 the wide tactics at their heuristic, one tile per warp (128 / 256 tokens) and longer."""
    wide = [(ks.WIDE_FUSED, None), (ks.WIDE_FUSED, 128), (ks.WIDE_FUSED, 1024),
            (ks.WIDE16_FUSED, None), (ks.WIDE16_FUSED, 256), (ks.WIDE16_FUSED, 2048),
            (ks.STREAM_K, None), (ks.STREAM_K, 16), (ks.STREAM_K, 272), (ks.STREAM_K, 2048)]
    return SPLITS + (wide if d == 64 else [])


def tactics_for(d):
    return [t for t in ks.TACTICS if d == 64 or (t not in ks.WIDE_WARPS and t != ks.STREAM_K)]


def check_attention(out, expect):
    assert np.isfinite(out).all(), "NaN left in out: some output was never written"
    err = np.abs(out.astype(np.float64) - expect)
    tol = 2e-3 + 4e-3 * np.abs(expect)
    assert (err <= tol).all(), f"{(err > tol).sum()} of {err.size} outside tolerance, worst {err.max():.3g}"


def make(rng, B, hkv, S, d):
    k = (rng.standard_normal((B, hkv, S, d)) * 1.5).astype(np.float16)
    v = rng.standard_normal((B, hkv, S, d)).astype(np.float16)
    k[rng.random(k.shape) < 0.02] = np.float16(0.25)  # magnitude ties
    return k, v


def prefilled(rng, cfg, lens, S):
    """Random K, V of ``S`` tokens prefilled into the GPU cache for ``lens``, a random q and the float64 reference
    attention over the host cache: ``(gpu cache, q, expected)``."""
    k, v = make(rng, len(lens), cfg.num_kv_heads, S, cfg.head_dim)
    host = f.SparseKVCache.prefill(cfg, k, v, lens)
    g = gpu_prefill(cfg, k, v, lens)
    q = rng.standard_normal((len(lens), cfg.num_q_heads, cfg.head_dim)).astype(np.float16)
    return g, q, ref.cache_attention(host, q)


CASES = [  # (d, hq, hkv, k_sparsity, v_sparsity, lens)
    (64, 32, 8, 0.7, 0.7, [1001, 37, 1]),
    (64, 9, 3, 0.5, 0.7, [777, 2049]),
    (128, 8, 2, 0.7, 0.5, [333, 95, 1500]),
    (128, 4, 4, 0.0, 0.0, [129]),
    (64, 8, 1, 0.3, 0.9, [63, 64, 65, 3001]),
    (128, 14, 2, 0.7, 0.7, [517]),
    (64, 4, 2, 0.9, 0.9, [2001, 5]),  # small records: tactic 2's merge passes hold 26 splits (64-token splits: 32)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"d{c[0]}-{c[1]}q{c[2]}kv-{c[3]}-{c[4]}")
def test_prefill_bytes_and_attention(case):
    d, hq, hkv, sk, sv, lens = case
    rng = np.random.default_rng(len(lens) * 1000 + d + hq)
    S = max(lens) + 6
    cfg = f.SparseKVConfig(d, hq, hkv, sk, sv, S)
    k, v = make(rng, len(lens), hkv, S, d)
    host = f.SparseKVCache.prefill(cfg, k, v, lens)
    g = gpu_prefill(cfg, k, v, lens)
    assert_same_cache(cfg, g, host)
    q = rng.standard_normal((len(lens), hq, d)).astype(np.float16)
    expect = ref.cache_attention(host, q)
    for tactic, tps in splits_for(d):
        check_attention(gpu_attention(cfg, g, q, S, tps, tactic), expect)
    if sk == 0.0 and sv == 0.0:  # sparsity 0 == dense attention on the raw cache
        for tactic in tactics_for(d):
            check_attention(gpu_attention(cfg, g, q, S, tactic=tactic), ref.decode_attention(q, k, v, lens))


@pytest.mark.parametrize("warps", [8, 16])
@pytest.mark.parametrize("case", [c for c in CASES if c[0] == 64], ids=lambda c: f"d{c[0]}-{c[1]}q{c[2]}kv-{c[3]}-{c[4]}")
def test_wide_blocks(case, warps):
    """Tactics 1 and 2 with 8 or 16 warps per block (d = 64): the heuristic split, one tile per warp (the
    most splits), several tiles per warp, and a split longer than every sequence."""
    d, hq, hkv, sk, sv, lens = case
    rng = np.random.default_rng(len(lens) * 1000 + d + hq + warps)
    S = max(lens) + 6
    cfg = f.SparseKVConfig(d, hq, hkv, sk, sv, S)
    k, v = make(rng, len(lens), hkv, S, d)
    host = f.SparseKVCache.prefill(cfg, k, v, lens)
    g = gpu_prefill(cfg, k, v, lens)
    q = rng.standard_normal((len(lens), hq, d)).astype(np.float16)
    expect = ref.cache_attention(host, q)
    unit = 16 * warps
    for tactic in (ks.STREAM, ks.STREAM_FUSED):
        for tps in (None, unit, 3 * unit, -(-S // unit) * unit):
            check_attention(gpu_attention(cfg, g, q, S, tps, tactic, warps=warps), expect)


@pytest.mark.parametrize("sk,sv", [(0.6875, 0.6875), (0.734, 0.734), (0.7, 0.7), (0.67, 0.7)])
def test_register_records(sk, sv, monkeypatch):
    """16-warp blocks decode 48-byte records from registers: keep 20 and 17 (the largest and smallest of a 48-byte
    record) and 19 (70 %); 0.67 / 0.7 (56- and 48-byte records) stays staged. Tactic 4 and tactics 1, 2 with 16
    warps, at the heuristic split, one tile per warp and several (6 per warp: the pipelined kernels; also every split
    with the pipelined kernels forced), ragged lengths with window and padding rows, against float64; the staged kernels
    on the same cache give the same bits; records 8 bytes past a 16-byte boundary (staged) too."""
    d, hq, hkv, lens = 64, 12, 3, [1500, 83, 700]
    rng = np.random.default_rng(int(sk * 1000) + int(sv * 10))
    S = max(lens) + 5
    cfg = f.SparseKVConfig(d, hq, hkv, sk, sv, S)
    assert ks.uses_register_records(d, cfg.rk, cfg.rv, 16) == (sk != 0.67)
    k, v = make(rng, len(lens), hkv, S, d)
    host = f.SparseKVCache.prefill(cfg, k, v, lens)
    g = gpu_prefill(cfg, k, v, lens)
    q = rng.standard_normal((len(lens), hq, d)).astype(np.float16)
    expect = ref.cache_attention(host, q)
    assert ks.uses_pipelined_records(1536, 16) and not ks.uses_pipelined_records(768, 16)
    for pipe_min in (ks.PIPE_MIN_TILES_PER_WARP, 1):  # 1: the pipelined kernels at every split
        for tactic, warps in ((ks.WIDE16_FUSED, None), (ks.STREAM, 16), (ks.STREAM_FUSED, 16), (ks.STREAM_K, None)):
            for tps in (None, 256, 768, 1536):
                monkeypatch.setattr(ks, "PIPE_MIN_TILES_PER_WARP", pipe_min)
                out = gpu_attention(cfg, g, q, S, tps, tactic, warps=warps)
                check_attention(out, expect)
                monkeypatch.setattr(ks, "REGISTER_RECORDS", False)
                staged = gpu_attention(cfg, g, q, S, tps, tactic, warps=warps)
                monkeypatch.undo()
                assert np.array_equal(out.view(np.uint16), staged.view(np.uint16))
    kb = torch.empty(g.k_rec.numel() + 8, dtype=torch.uint8, device="cuda")
    vb = torch.empty(g.v_rec.numel() + 8, dtype=torch.uint8, device="cuda")
    kb[8:].copy_(g.k_rec.reshape(-1))
    vb[8:].copy_(g.v_rec.reshape(-1))
    assert kb.data_ptr() % 16 == 0
    g.k_rec, g.v_rec = kb[8:], vb[8:]
    check_attention(gpu_attention(cfg, g, q, S, None, ks.WIDE16_FUSED), expect)


def test_long_splits(monkeypatch):
    """Tactic 4 with register records takes splits beyond MAX_TOKENS_PER_SPLIT2 (the wave model, session 31): 12288
    tokens (48 tiles per warp, two splits of the longest sequence), one split of the whole length, and the heuristic,
    on ragged lengths with window and padding rows; against float64, and bit for bit against the staged kernels."""
    d, hq, hkv, lens = 64, 8, 2, [20001, 9000, 1]
    rng = np.random.default_rng(31)
    S = max(lens) + 3
    cfg = f.SparseKVConfig(d, hq, hkv, 0.7, 0.7, S)
    g, q, expect = prefilled(rng, cfg, lens, S)
    one = -(-S // 256) * 256
    assert one > ks.MAX_TOKENS_PER_SPLIT2
    for tps in (None, 12288, one):
        out = gpu_attention(cfg, g, q, S, tps, ks.WIDE16_FUSED)
        check_attention(out, expect)
        monkeypatch.setattr(ks, "REGISTER_RECORDS", False)
        staged = gpu_attention(cfg, g, q, S, tps, ks.WIDE16_FUSED)
        monkeypatch.undo()
        assert np.array_equal(out.view(np.uint16), staged.view(np.uint16))


@pytest.mark.parametrize("hq,hkv", [(9, 3), (4, 2)])
def test_merge_many_splits(hq, hkv):
    """More splits than one pass of the fused merge holds (32 or fewer): several passes per head, in every fused
    tactic, sparse and dense, against float64; ragged lengths so that one sequence has far fewer splits than the
    grid."""
    d = 64
    rng = np.random.default_rng(hq * 10 + hkv)
    lens = [9001, 300, 4500]
    S = max(lens) + 3
    cfg = f.SparseKVConfig(d, hq, hkv, 0.7, 0.7, S)
    k, v = make(rng, len(lens), hkv, S, d)
    host = f.SparseKVCache.prefill(cfg, k, v, lens)
    g = gpu_prefill(cfg, k, v, lens)
    q = rng.standard_normal((len(lens), hq, d)).astype(np.float16)
    expect = ref.cache_attention(host, q)
    for tactic, tps in ((ks.STREAM_FUSED, 64), (ks.STREAM_FUSED, 192), (ks.WIDE_FUSED, 128), (ks.WIDE16_FUSED, 256),
                        (ks.STREAM_K, 16), (ks.STREAM_K, 208)):
        _, ns = ks.plan_cache(cfg, len(lens), S, tokens_per_split=tps, tactic=tactic)
        assert ns > 32
        check_attention(gpu_attention(cfg, g, q, S, tps, tactic), expect)
    kd, vd, ld, qd = _dev(k), _dev(v), _dev(np.array(lens, np.int32)), _dev(q)
    dense_expect = ref.decode_attention(q, k, v, np.array(lens, np.int32))
    for tactic, tps in ((ks.WIDE_FUSED, 128), (ks.WIDE16_FUSED, 256), (ks.STREAM_K, 16)):
        _, ns = ks.plan_dense(d, hq, hkv, len(lens), S, tokens_per_split=tps, tactic=tactic)
        ws = torch.full((ks.workspace_bytes(hq, d, len(lens), ns) // 4,), float("nan"), device="cuda")
        ks.init_workspace(ws.data_ptr(), len(lens), hq, _stream())
        for _ in range(2):
            out = torch.full((len(lens), hq, d), float("nan"), dtype=torch.float16, device="cuda")
            ks.dense_decode_attention(d, hq, hkv, len(lens), S, S, qd.data_ptr(), kd.data_ptr(), vd.data_ptr(),
                                      ld.data_ptr(), out.data_ptr(), ws.data_ptr(), _stream(), tokens_per_split=tps,
                                      tactic=tactic)
            torch.cuda.synchronize()
            check_attention(out.cpu().numpy(), dense_expect)


@pytest.mark.parametrize("d,v_sparsity", [(64, 0.6), (64, 0.72), (128, 0.6)])
def test_append_steps_match_host(d, v_sparsity, monkeypatch):
    """Decode 150 steps from ragged prompts: bytes after every compression and attention at the end (d = 64 with
    keeps 19 and 18: scheduled records, appends scheduling from 130 tokens on, groups of 7 that start inside
    16-token tiles)."""
    monkeypatch.setattr(f, "SCHEDULE_APPEND_FROM", 130)
    rng = np.random.default_rng(d)
    hq, hkv, B, steps = 6, 2, 3, 150
    cfg = f.SparseKVConfig(d, hq, hkv, 0.7, v_sparsity, 400, window=5, group=7)
    assert f.schedules(d, cfg.keep_k, cfg.keep_v) == (v_sparsity == 0.72)
    lens0 = np.array([0, 31, 100], np.int32)
    k, v = make(rng, B, hkv, 100, d)
    host = f.SparseKVCache.prefill(cfg, k, v, lens0)
    g = gpu_prefill(cfg, k, v, lens0)
    for step in range(steps):
        kn = rng.standard_normal((B, hkv, d)).astype(np.float16)
        vn = rng.standard_normal((B, hkv, d)).astype(np.float16)
        host.append(kn, vn)
        g.lens += 1
        knd, vnd = _dev(kn), _dev(vn)  # keep both alive until the kernel has run
        ks.append(cfg, B, knd.data_ptr(), vnd.data_ptr(), g.ptrs(), _stream())
        if step % 37 == 0 or step == steps - 1:
            torch.cuda.synchronize()
            assert_same_cache(cfg, g, host)
    q = rng.standard_normal((B, hq, d)).astype(np.float16)
    for tactic, tps in splits_for(d):
        check_attention(gpu_attention(cfg, g, q, cfg.capacity, tps, tactic), ref.cache_attention(host, q))


@pytest.mark.parametrize("d,tactic", [(64, t) for t in ks.TACTICS] + [(128, t) for t in tactics_for(128)])
def test_empty_sequence_gives_zeros_and_dense_kernel(d, tactic):
    """dense_decode_attention (tactic 0: the split kernel; 1-5: the dense streaming kernels) on a poisoned
    workspace: ragged lengths, an empty sequence, the heuristic split, one tile per warp and one split of many
    tiles per warp (every cp.async stage reused)."""
    rng = np.random.default_rng(7 + d)
    hq, hkv, cap = 8, 2, 700
    lens = np.array([0, 699, 45], np.int32)
    k, v = make(rng, 3, hkv, cap, d)
    q = rng.standard_normal((3, hq, d)).astype(np.float16)
    kd, vd, ld, qd = _dev(k), _dev(v), _dev(lens), _dev(q)
    expect = ref.decode_attention(q, k, v, lens)
    for tps in (None, 16 * ks.WIDE_WARPS.get(tactic, 8), 512 if tactic == ks.SPLIT_V1 else 768 if d == 128 else 1024):
        _, ns = ks.plan_dense(d, hq, hkv, 3, cap, tokens_per_split=tps, tactic=tactic)
        ws = torch.full((ks.workspace_bytes(hq, d, 3, ns) // 4,), float("nan"), device="cuda")
        ks.init_workspace(ws.data_ptr(), 3, hq, _stream())
        for _ in range(2):
            out = torch.full((3, hq, d), float("nan"), dtype=torch.float16, device="cuda")
            ks.dense_decode_attention(d, hq, hkv, 3, cap, cap, qd.data_ptr(), kd.data_ptr(), vd.data_ptr(),
                                      ld.data_ptr(), out.data_ptr(), ws.data_ptr(), _stream(), tokens_per_split=tps,
                                      tactic=tactic)
            torch.cuda.synchronize()
            o = out.cpu().numpy()
            check_attention(o, expect)
            assert np.array_equal(o[0], np.zeros((hq, d), np.float16))


def test_small_for_sanitizer():
    """Small ragged prefill + append + attention (the case run under compute-sanitizer memcheck)."""
    rng = np.random.default_rng(11)
    cfg = f.SparseKVConfig(128, 6, 3, 0.7, 0.7, 201, window=8, group=8)
    lens = [0, 17, 199]
    k, v = make(rng, 3, 3, 200, 128)
    host = f.SparseKVCache.prefill(cfg, k, v, lens)
    g = gpu_prefill(cfg, k, v, lens)
    kn = rng.standard_normal((3, 3, 128)).astype(np.float16)
    vn = rng.standard_normal((3, 3, 128)).astype(np.float16)
    host.append(kn, vn)
    g.lens += 1
    knd, vnd = _dev(kn), _dev(vn)  # keep both alive until the kernel has run
    ks.append(cfg, 3, knd.data_ptr(), vnd.data_ptr(), g.ptrs(), _stream())
    torch.cuda.synchronize()
    assert_same_cache(cfg, g, host)
    q = rng.standard_normal((3, 6, 128)).astype(np.float16)
    for tactic in tactics_for(128):
        check_attention(gpu_attention(cfg, g, q, 200, 64, tactic), ref.cache_attention(host, q))


@pytest.mark.parametrize("tactic", [ks.STREAM, ks.STREAM_FUSED])
def test_record_words_empty_d64(tactic):
    """d = 64, 50 %: tokens whose 32 kept channels are exactly the low or the high bitmap word (the other
    word is 0: the branch-free decode starts on the low word, or never reads it), mixed with random ones."""
    rng = np.random.default_rng(3)
    d, hq, hkv, lens = 64, 8, 2, [300, 171]
    S = max(lens)
    cfg = f.SparseKVConfig(d, hq, hkv, 0.5, 0.5, S)
    k, v = make(rng, len(lens), hkv, S, d)
    t = np.arange(S)
    for x in (k, v):
        for sel, big, small in ((t % 3 == 0, slice(0, 32), slice(32, 64)),    # low word kept
                                (t % 3 == 1, slice(32, 64), slice(0, 32))):   # high word kept
            a = x[:, :, sel].astype(np.float32)
            a[..., big] = np.where(a[..., big] < 0, -4, 4) + a[..., big]
            a[..., small] = np.clip(a[..., small], -0.9, 0.9)
            x[:, :, sel] = a.astype(np.float16)
    host = f.SparseKVCache.prefill(cfg, k, v, lens)
    bm = f.records_to_logical(host.k_rec)[0, 0, :6, :8].copy().view(np.uint64)[:, 0]
    assert bm[0] == 0xFFFFFFFF and bm[1] == 0xFFFFFFFF00000000  # the edge cases are really there
    g = gpu_prefill(cfg, k, v, lens)
    assert_same_cache(cfg, g, host)
    q = rng.standard_normal((len(lens), hq, d)).astype(np.float16)
    expect = ref.cache_attention(host, q)
    for tps in (64, None, 1024):
        check_attention(gpu_attention(cfg, g, q, S, tps, tactic), expect)


def test_sm_count_is_the_current_contexts():
    """``sm_count()`` (the split heuristic's default) answers for the current context, queried once per context: the
    device's SMs on torch's context, a green context's share inside one, the device's again after it."""
    from edgesdk.kernels import _cuda

    torch.zeros(1, device="cuda")  # torch's context current
    full = torch.cuda.get_device_properties(0).multi_processor_count
    assert ks.sm_count() == _cuda.context_sm_count() == full
    with _cuda.in_green_context(16) as sms:
        assert 16 <= sms < full
        assert ks.sm_count() == _cuda.context_sm_count() == sms
        assert ks.smem_optin() == _cuda.context_attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN") > 48 * 1024
    assert ks.sm_count() == full


@pytest.mark.parametrize("k_sparsity,v_sparsity", [(0.6, 0.8), (0.7, 0.73)])
def test_any_store_order_decodes(k_sparsity, v_sparsity):
    """Records in random store orders x (0-63, odd ones too; keeps 26/13 the compressor never schedules, and 19/17)
    uploaded from the host: every tactic's decoder puts each value at channel c' ^ x (float64 reference)."""
    rng = np.random.default_rng(int(100 * k_sparsity))
    cfg = f.SparseKVConfig(64, 8, 2, k_sparsity, v_sparsity, 1200)
    lens = np.array([1100, 333], np.int32)
    k, v = make(rng, 2, 2, 1100, 64)
    host = f.SparseKVCache.prefill(cfg, k, v, lens)
    for name, keep in (("k_rec", cfg.keep_k), ("v_rec", cfg.keep_v)):
        log = f.records_to_logical(getattr(host, name))
        for b, L in enumerate(lens.tolist()):
            nc = cfg.n_compressed(L)
            dense = f.decompress(log[b, :, :nc], 64, keep)
            rec = f.compress(dense, keep)  # plain again (the prefill may have scheduled them)
            log[b, :, :nc] = f.reorder_records(rec, 64, keep, rng.integers(0, 64, rec.shape[:-1]))
        setattr(host, name, f.records_to_physical(log))
    g = GpuCache(cfg, 2)
    for name in ("k_rec", "v_rec", "k_ring", "v_ring", "lens"):
        getattr(g, name).copy_(torch.from_numpy(np.ascontiguousarray(getattr(host, name))))
    q = rng.standard_normal((2, cfg.num_q_heads, 64)).astype(np.float16)
    expect = ref.cache_attention(host, q)
    for tactic, tps in splits_for(64):
        check_attention(gpu_attention(cfg, g, q, int(lens.max()), tps, tactic), expect)


def test_schedule_switch_gives_plain_records(monkeypatch):
    """``SCHEDULE_RECORDS = False``: the prefill writes plain records (x = 0), the bytes of ``compress``."""
    rng = np.random.default_rng(11)
    cfg = f.SparseKVConfig(64, 4, 2, 0.7, 0.7, 300)
    k, v = make(rng, 1, 2, 300, 64)
    monkeypatch.setattr(ks, "SCHEDULE_RECORDS", False)
    g = gpu_prefill(cfg, k, v, [300])
    nc = cfg.n_compressed(300)
    got = f.records_to_logical(g.k_rec.cpu().numpy())[0, :, :nc]
    assert np.array_equal(got, f.compress(k[0, :, :nc], cfg.keep_k))
    monkeypatch.setattr(ks, "SCHEDULE_RECORDS", True)
    g = gpu_prefill(cfg, k, v, [300])
    got = f.records_to_logical(g.k_rec.cpu().numpy())[0, :, :nc]
    assert (f.record_order(got, 64, cfg.keep_k) != 0).any()
