"""sparse_kv format, pruning, cache model and reference (CPU)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgesdk.errors import EdgeSDKError, FormatError
from edgesdk.formats import sparse_kv as f
from edgesdk.reference import sparse_kv as ref


def test_keep_count_and_record_bytes():
    assert [f.keep_count(64, s) for s in (0.0, 0.5, 0.7)] == [64, 32, 19]
    assert [f.keep_count(128, s) for s in (0.0, 0.5, 0.7)] == [128, 64, 38]
    assert f.record_bytes(64, 19) == 8 + 2 * 20 == 48
    assert f.record_bytes(64, 32) == 72 and f.record_bytes(128, 38) == 16 + 80
    with pytest.raises(EdgeSDKError, match="outside"):
        f.keep_count(64, 1.0)


def test_worked_example_d64():
    # x[c] = ±(c + 1) / 64, + on even channels: magnitudes grow with c, so 70 % pruning (keep 19)
    # keeps channels 45..63: bitmap bits 45..63 = 0xFFFFE00000000000, values x[45..63] then 1 zero pad.
    c = np.arange(64)
    x = ((c + 1) * np.where(c % 2, -1, 1) / 64).astype(np.float16)
    rec = f.compress(x, 19)
    assert rec.dtype == np.uint8 and rec.shape == (48,)
    assert rec[:8].tobytes() == (0xFFFFE00000000000).to_bytes(8, "little")
    vals = rec[8:].view("<f2")
    assert vals[0] == np.float16(-46 / 64) and vals[1] == np.float16(47 / 64) and vals[18] == np.float16(-1.0)
    assert vals[19] == 0
    dense = f.decompress(rec, 64, 19)
    assert np.array_equal(dense[:45], np.zeros(45, np.float16)) and np.array_equal(dense[45:], x[45:])


def test_ties_keep_lower_channels_and_sign_ignored():
    x = np.full(64, 0.5, np.float16)
    x[7] = -0.5  # same magnitude
    x[60] = -2.0  # largest
    rec = f.compress(x, 3)
    assert int.from_bytes(rec[:8].tobytes(), "little") == (1 << 60) | 0b11
    assert list(rec[8:14].view("<f2")) == [0.5, 0.5, -2.0]
    # -0 and +0 tie: lower channel wins.
    z = np.zeros(64, np.float16)
    z[3] = np.float16(-0.0)
    assert int.from_bytes(f.compress(z, 2)[:8].tobytes(), "little") == 0b11


def test_worked_example_d128_second_word():
    x = np.zeros(128, np.float16) + np.float16(0.001)
    x[[1, 64, 127]] = [3, -4, 5]
    rec = f.compress(x, 3)
    assert rec.shape == (16 + 8,)
    w = np.frombuffer(rec[:16].tobytes(), "<u8")
    assert w[0] == 1 << 1 and w[1] == (1 << 0) | (1 << 63)
    assert list(rec[16:22].view("<f2")) == [3, -4, 5]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([64, 128]), st.floats(0.0, 0.95), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_roundtrip_property(d, sparsity, rows, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, d)).astype(np.float16)
    x[rng.random(x.shape) < 0.1] = x[0, 0]  # force ties
    keep = f.keep_count(d, sparsity)
    rec = f.compress(x, keep)
    assert rec.shape == (rows, f.record_bytes(d, keep))
    dense = f.decompress(rec, d, keep)
    assert np.array_equal(dense.view(np.uint16), f.prune(x, keep).view(np.uint16))
    mask = f.prune_mask(x, keep)
    assert (mask.sum(-1) == keep).all()
    mag = np.abs(x.astype(np.float32))
    for r in range(rows):  # every kept magnitude ≥ every dropped one
        if keep < d:
            assert mag[r][mask[r]].min() >= mag[r][~mask[r]].max()


def test_corrupted_records_raise_format_error():
    rng = np.random.default_rng(1)
    rec = f.compress(rng.standard_normal((5, 64)).astype(np.float16), 19)
    bad = rec.copy()
    bad[2, 0] ^= 0xFF  # bitmap popcount changes
    with pytest.raises(FormatError, match="record 2 has"):
        f.decompress(bad, 64, 19)
    bad = rec.copy()
    bad[4, -1] = 0x3C  # padding value nonzero
    with pytest.raises(FormatError, match="padding"):
        f.decompress(bad, 64, 19)
    with pytest.raises(FormatError, match="expected"):
        f.decompress(rec[:, :40], 64, 19)
    with pytest.raises(FormatError, match="expected"):
        f.decompress(rec.astype(np.float32), 64, 19)


def test_config_validation_and_memory():
    c = f.SparseKVConfig(64, 32, 8, 0.7, 0.7, 4096)
    assert c.gqa == 4 and c.ring == 64 and c.keep_k == 19 and c.rk == 48
    assert c.n_compressed(63) == 0 and c.n_compressed(64) == 32 and c.n_compressed(95) == 32
    assert c.n_compressed(96) == 64
    assert c.memory_ratio(4096) <= 0.46  # issue target (records + dense window)
    assert f.SparseKVConfig(64, 9, 3, 0.5, 0.5, 100).memory_ratio(100) < 1
    for kw in ({"head_dim": 96}, {"num_q_heads": 30}, {"num_q_heads": 72}, {"window": 0}, {"k_sparsity": 1.5}):
        args = dict(head_dim=64, num_q_heads=32, num_kv_heads=8, k_sparsity=0.5, v_sparsity=0.5, capacity=64)
        args.update(kw)
        with pytest.raises(EdgeSDKError):
            f.SparseKVConfig(**args)
    with pytest.raises(EdgeSDKError, match="capacity"):
        c.check_lengths(np.array([5000]))


def _kv(rng, b, h, s, d):
    return (rng.standard_normal((b, h, s, d)) * 0.7).astype(np.float16), rng.standard_normal((b, h, s, d)).astype(np.float16)


def test_records_stored_chunk_major():
    """The stored layout by hand: 2 slot groups of 16 records of 24 bytes (3 units of 8); byte x of unit k of
    record t lies at 16 · 24 · (t // 16) + 128 k + 8 (t % 16) + x; round trip; slots not a multiple of 16 refused."""
    logical = np.zeros((1, 1, 32, 24), np.uint8)
    for t in range(32):
        for o in range(24):
            logical[0, 0, t, o] = (7 * t + o) % 251
    stored = f.records_to_physical(logical).reshape(-1)
    assert stored[0] == logical[0, 0, 0, 0] and stored[8] == logical[0, 0, 1, 0]  # unit 0 of records 0, 1
    assert stored[128 + 3] == logical[0, 0, 0, 11]  # unit 1 (bytes 8..15) of record 0, byte 3
    assert stored[384 + 2 * 128 + 8 * 5 + 6] == logical[0, 0, 21, 22]  # group 1, unit 2 of record 21 (5th), byte 6
    assert np.array_equal(f.records_to_logical(f.records_to_physical(logical)), logical)
    with pytest.raises(FormatError, match="multiple of 16"):
        f.records_to_physical(np.zeros((1, 1, 20, 24), np.uint8))
    with pytest.raises(FormatError, match="multiple of 8"):
        f.records_to_logical(np.zeros((1, 1, 16, 20), np.uint8))
    cfg = f.SparseKVConfig(64, 4, 2, 0.7, 0.7, 77, window=3, group=2)
    assert cfg.record_capacity == 80  # n_compressed(77) = 74, rounded up to whole groups


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 9), st.integers(1, 13), st.integers(0, 2**31 - 1), st.sampled_from([0.5, 0.72]))
def test_append_matches_prefill(window, group, seed, v_sparsity):
    """Appending token by token gives the same records and window as compressing the prompt at once (with v at
    0.72, keep 18, the records are scheduled too: groups that start inside a 16-token tile included)."""
    rng = np.random.default_rng(seed)
    cfg = f.SparseKVConfig(64, 4, 2, 0.7, v_sparsity, 80, window=window, group=group)
    lens = np.array([int(rng.integers(0, 80)), 80, int(rng.integers(1, 80))], np.int32)
    k, v = _kv(rng, 3, 2, 80, 64)
    full = f.SparseKVCache.prefill(cfg, k, v, lens)
    step = f.SparseKVCache.prefill(cfg, k, v, np.zeros(3, np.int32))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(f, "SCHEDULE_APPEND_FROM", 1)  # appends schedule from the first group on
        for t in range(80):
            step.append(k[:, :, t], v[:, :, t])
    for b, L in enumerate(lens):
        nc = cfg.n_compressed(int(L))
        for a_, b_ in ((full.k_rec, step.k_rec), (full.v_rec, step.v_rec)):
            assert np.array_equal(f.records_to_logical(a_)[b, :, :nc], f.records_to_logical(b_)[b, :, :nc])
    kd, vd = full.dense()
    for b, L in enumerate(lens):
        nc = cfg.n_compressed(int(L))
        assert np.array_equal(kd[b, :, :nc], f.prune(k[b, :, :nc], cfg.keep_k))
        assert np.array_equal(vd[b, :, nc:L], v[b, :, nc:L])  # dense window


def test_reference_matches_torch_sdpa_gqa():
    torch = pytest.importorskip("torch")

    rng = np.random.default_rng(3)
    B, Hq, Hkv, T, d = 3, 9, 3, 77, 64
    q = rng.standard_normal((B, Hq, d)).astype(np.float16)
    k, v = _kv(rng, B, Hkv, T, d)
    lens = np.array([77, 1, 40])
    out = ref.decode_attention(q, k, v, lens)
    for b, L in enumerate(lens):
        kt = torch.from_numpy(k[b, :, :L].astype(np.float64)).repeat_interleave(3, 0)
        vt = torch.from_numpy(v[b, :, :L].astype(np.float64)).repeat_interleave(3, 0)
        o = torch.nn.functional.scaled_dot_product_attention(torch.from_numpy(q[b].astype(np.float64))[:, None], kt, vt)
        np.testing.assert_allclose(out[b], o[:, 0].numpy(), rtol=1e-10, atol=1e-12)
    assert np.array_equal(ref.decode_attention(q, k, v, [0, 0, 0]), np.zeros((B, Hq, d)))


def test_sparsity_zero_cache_is_dense():
    rng = np.random.default_rng(4)
    cfg = f.SparseKVConfig(128, 8, 2, 0.0, 0.0, 300)
    k, v = _kv(rng, 2, 2, 300, 128)
    lens = np.array([300, 157], np.int32)
    cache = f.SparseKVCache.prefill(cfg, k, v, lens)
    q = rng.standard_normal((2, 8, 128)).astype(np.float16)
    np.testing.assert_array_equal(ref.cache_attention(cache, q), ref.decode_attention(q, k, v, lens))


def test_store_order_worked_example():
    """d = 64, keep 3: channels 1, 2, 40 kept; in store order x = 33 they are stored as c' = c ^ 33 = 32, 35, 9,
    so the bitmap has bits 9, 32, 35 and the values follow c' (channel 40's first), then x in the last half."""
    row = np.zeros(64, np.float16)
    row[[1, 2, 40]] = [np.float16(-1.5), np.float16(0.25), np.float16(3.0)]
    rec = f.compress(row, 3)
    got = f.reorder_records(rec, 64, 3, 33)
    assert int.from_bytes(got[:8].tobytes(), "little") == (1 << 9) | (1 << 32) | (1 << 35)
    assert got[8:].view("<f2").tolist() == [3.0, -1.5, 0.25, float(np.uint16(33).view(np.float16))]
    assert got[14:16].view("<u2")[0] == 33
    assert f.record_order(got, 64, 3) == 33 and f.record_order(rec, 64, 3) == 0
    assert np.array_equal(f.decompress(got, 64, 3), row)
    assert np.array_equal(f.reorder_records(rec, 64, 3, 0), rec)  # x = 0: the plain record


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 7, 13, 17, 18, 19, 26, 45, 63]), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_store_order_roundtrip(keep, rows, seed):
    """Any store order x decodes to the pruned rows; the bitmap is the channel bitmap permuted by x."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 64)).astype(np.float16)
    rec = f.compress(x, keep)
    order = rng.integers(0, 64, rows)
    got = f.reorder_records(rec, 64, keep, order)
    assert np.array_equal(f.record_order(got, 64, keep), order)
    assert np.array_equal(f.decompress(got, 64, keep), f.prune(x, keep))
    mask = np.unpackbits(got[:, :8], axis=-1, bitorder="little").astype(bool)
    real = f.prune_mask(x, keep)
    for i in range(rows):
        assert np.array_equal(mask[i], real[i][np.arange(64) ^ order[i]])


def test_store_order_errors():
    rec = f.compress(np.arange(1, 65, dtype=np.float16)[None], 19)
    with pytest.raises(EdgeSDKError, match="carry no store order"):
        f.reorder_records(f.compress(np.ones((1, 64), np.float16), 20), 64, 20, 2)
    with pytest.raises(EdgeSDKError, match="carry no store order"):
        f.reorder_records(f.compress(np.ones((1, 128), np.float16), 19), 128, 19, 2)
    bad = rec.copy()
    bad[0, -2:] = np.array([64], "<u2").view(np.uint8)  # x must be < 64
    with pytest.raises(FormatError, match="must be < 64"):
        f.decompress(bad, 64, 19)
    bad = f.compress(np.arange(1, 129, dtype=np.float16)[None], 38)  # d = 128: the padding stays zero
    bad[0, -1] = 1
    with pytest.raises(FormatError, match="nonzero padding"):
        f.decompress(bad, 128, 38)


def test_store_banks_hand_checked():
    """Channels 0-18 kept (keep 19), plain: the ascending walk stores values 0-9 at channels 0-9, the descending one
    18-10 at channels 18-10; a 36-word tile row r starts at bank 4 r; channels 2 i, 2 i + 1 share bank i."""
    row = np.zeros(64, np.float16)
    row[:19] = np.arange(1, 20)
    rec = f.compress(row, 19)
    expect = [-1, 0, 9, 0, 8, 1, 8, 1, 7, 2, 7, 2, 6, 3, 6, 3, 5, 4, 5, 4]
    assert f.store_banks(rec, 19, 0).tolist() == expect
    assert f.store_banks(rec, 19, 7).tolist() == [-1 if b < 0 else (b + 28) % 32 for b in expect]
    # x = 32 moves every kept channel (all below 32) by the same word: same order, same channels, same banks
    assert f.store_banks(f.reorder_records(rec, 64, 19, 32), 19, 0).tolist() == expect
    # x = 2: c' = c ^ 2 = {0..16, 18, 19}; ascending c' 0..9 are channels 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, descending
    # c' 19, 18, 16, 15, .., 10 channels 17, 16, 18, 13, 12, 15, 14, 9, 8
    assert f.store_banks(f.reorder_records(rec, 64, 19, 2), 19, 0).tolist() == [
        -1, 1, 8, 1, 8, 0, 9, 0, 6, 3, 6, 3, 7, 2, 7, 2, 4, 5, 4, 5]


@pytest.mark.parametrize("keep", [17, 18, 19])
def test_candidate_banks_are_store_banks_of_the_reordered_records(keep):
    """The schedule's shortcut (banks of every candidate order from the plain record) = store_banks of the record
    actually reordered, for every candidate and row."""
    rng = np.random.default_rng(keep)
    rec = f.compress(rng.standard_normal((3, 5, 64)).astype(np.float16), keep)
    xs = np.asarray(f.SCHEDULE_CANDIDATES)
    for row in (0, 5, 15):
        got = f._candidate_banks(rec, keep, row, xs)
        for i, x in enumerate(xs):
            assert np.array_equal(got[..., i, :], f.store_banks(f.reorder_records(rec, 64, keep, x), keep, row))


def _tile_wavefronts(k_log, v_log, keep_k, keep_v):
    """Modelled wavefronts of each full 16-token tile: the busiest bank's stores, summed over the 20 steps."""
    H, n = k_log.shape[0], k_log.shape[1] // 16 * 16
    out = []
    for h in range(H):
        for t0 in range(0, n, 16):
            banks = np.concatenate([f.store_banks(k_log[h, t0:t0 + 16], keep_k, np.arange(16)),
                                    f.store_banks(v_log[h, t0:t0 + 16], keep_v, np.arange(16))])
            out.append(f._bank_counts(banks).max(-1).sum())
    return np.array(out)


def test_schedule_spreads_the_scatter_over_the_banks():
    """Scheduled records of random K/V (keep 19 and 17) decode to the same rows with about a third fewer modelled
    wavefronts per tile than plain ones; no tile gets worse (the greedy step never adds more than x = 0 would)."""
    rng = np.random.default_rng(5)
    cfg = f.SparseKVConfig(64, 8, 2, 0.7, 0.73, 600)
    assert f.schedules(64, cfg.keep_k, cfg.keep_v) and (cfg.keep_k, cfg.keep_v) == (19, 17)
    k, v = _kv(rng, 1, 2, 600, 64)
    cache = f.SparseKVCache.prefill(cfg, k, v, np.array([600], np.int32))
    nc = cfg.n_compressed(600)
    kl, vl = f.records_to_logical(cache.k_rec)[0, :, :nc], f.records_to_logical(cache.v_rec)[0, :, :nc]
    plain_k, plain_v = f.compress(k[0, :, :nc], cfg.keep_k), f.compress(v[0, :, :nc], cfg.keep_v)
    assert np.array_equal(f.decompress(kl, 64, 19), f.decompress(plain_k, 64, 19))
    assert np.array_equal(f.decompress(vl, 64, 17), f.decompress(plain_v, 64, 17))
    assert (f.record_order(kl, 64, 19) % 2 == 0).all() and (f.record_order(kl, 64, 19) != 0).mean() > 0.5
    sched = _tile_wavefronts(kl, vl, 19, 17)
    plain = _tile_wavefronts(plain_k, plain_v, 19, 17)
    assert len(sched) == 2 * (nc // 16)
    assert sched.mean() < 0.75 * plain.mean(), (sched.mean(), plain.mean())
    assert (sched <= plain).all()
    assert not f.schedules(64, 19, 26) and not f.schedules(128, 38, 38)


def test_appends_schedule_from_the_threshold():
    """Below SCHEDULE_APPEND_FROM tokens an append writes plain records (x = 0); from it on, scheduled ones."""
    rng = np.random.default_rng(2)
    cfg = f.SparseKVConfig(64, 4, 2, 0.7, 0.7, 200, window=8, group=16)
    k, v = _kv(rng, 1, 2, 200, 64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(f, "SCHEDULE_APPEND_FROM", 120)
        c = f.SparseKVCache.prefill(cfg, k, v, np.zeros(1, np.int32))
        for t in range(200):
            c.append(k[:, :, t], v[:, :, t])
    x = f.record_order(f.records_to_logical(c.k_rec)[0], 64, cfg.keep_k)  # [H, slots]
    # a group is compressed at L = 24, 40, ..., 200 (tokens L - 24 .. L - 9): those of L < 120 (tokens < 96) plain
    assert (x[:, :96] == 0).all() and (x[:, 96:cfg.n_compressed(200)] != 0).mean() > 0.5
    kd, _ = c.dense()
    nc = cfg.n_compressed(200)
    assert np.array_equal(kd[0, :, :nc], f.prune(k[0, :, :nc], cfg.keep_k))
