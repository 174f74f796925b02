"""sparse_kv launcher arithmetic (CPU): split plans per tactic, workspace layout, shared memory."""

import math

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.formats.sparse_kv import SparseKVConfig
from edgesdk.kernels import sparse_kv as ks


@pytest.mark.parametrize("tactic", [t for t in ks.TACTICS if t != ks.STREAM_K])
@pytest.mark.parametrize("batch,max_len,sms", [(1, 1, 132), (1, 4096, 132), (16, 32768, 132), (3, 777, 16)])
def test_plan_ranges(tactic, batch, max_len, sms):
    cfg = SparseKVConfig(64, 32, 8, 0.7, 0.7, 32768)
    ts, ns = ks.plan_cache(cfg, batch, max_len, sms=sms, tactic=tactic)
    cap = ks.max_tokens_per_split(64, 4, cfg.rk, cfg.rv) if tactic == ks.SPLIT_V1 else ks.MAX_TOKENS_PER_SPLIT2
    if tactic == ks.WIDE16_FUSED:  # 48-byte records: the wave model's splits
        cap = ks.MAX_TOKENS_PER_SPLIT_WAVE
    assert ts % 64 == 0 and 64 <= ts <= cap
    assert ns == max(1, math.ceil(max_len / ts))


def test_wave_split():
    """Tactic 4 with 48-byte records on >= 100 SMs: per wave count w the most splits per pair that fit w waves, the
    plan priced lowest by waves * (WAVE_COST_TILES + tiles per warp); other records and small GPUs: one wave, capped."""
    assert ks.WAVE_COST_TILES == 5.0
    # Llama-like B = 8, 24000 tokens (64 pairs, 94 units of 256 tokens): w = 1: 2 splits of 47 units (12032 tokens),
    # 1 wave, cost 5 + 47 = 52; w = 2: 4 of 24 (6144), 2 waves, 58; w = 3: 6 of 16, 3 waves, 63 ... -> 12032.
    # The one-wave rule capped it at 8192 tokens: 3 splits, 192 blocks, 2 waves (measured 98.0 vs 71.5 µs, H100).
    assert ks.plan(64, 32, 8, 48, 48, 8, 24000, sms=132, tactic=ks.WIDE16_FUSED) == (12032, 2)
    # SmolLM2-like B = 16, 32768 (48 pairs, 128 units): w = 1: 2 of 64, cost 69; w = 2: 5 of 26 (6656), 240 blocks,
    # 2 waves, 62; w = 3: 8 of 16, 3 waves, 63; w = 4: 11 of 12, 4 waves, 68 -> 6656 tokens, 5 splits.
    assert ks.plan(64, 9, 3, 48, 48, 16, 32768, sms=132, tactic=ks.WIDE16_FUSED) == (6656, 5)
    # Llama-like B = 16, 32768 (128 pairs): w = 1 is one split per pair: 1 wave of 128 tiles per warp, cost 133;
    # w = 2: 2 splits, 2 waves of 64 + 5 -> 138.
    assert ks.plan(64, 32, 8, 48, 48, 16, 32768, sms=132, tactic=ks.WIDE16_FUSED) == (32768, 1)
    # few pairs: as before (one wave, most splits)
    assert ks.plan(64, 32, 8, 48, 48, 1, 4096, sms=132, tactic=ks.WIDE16_FUSED) == (256, 16)
    # not for other record sizes (staged kernels, 50 %) nor on 16 SMs: one wave, at most MAX_TOKENS_PER_SPLIT2
    cfg50 = SparseKVConfig(64, 32, 8, 0.5, 0.5, 32768)
    assert ks.plan(64, 32, 8, cfg50.rk, cfg50.rv, 8, 24000, sms=132, tactic=ks.WIDE16_FUSED) == (8192, 3)
    assert ks.plan(64, 32, 8, 48, 48, 8, 24000, sms=16, tactic=ks.WIDE16_FUSED) == (8192, 3)
    # a forced split beyond MAX_TOKENS_PER_SPLIT2 is taken there only
    assert ks.plan(64, 32, 8, 48, 48, 1, 20000, sms=132, tokens_per_split=12288, tactic=ks.WIDE16_FUSED) == (12288, 2)
    with pytest.raises(EdgeSDKError, match="multiple of 256"):
        ks.plan(64, 32, 8, cfg50.rk, cfg50.rv, 1, 20000, sms=132, tokens_per_split=12288, tactic=ks.WIDE16_FUSED)
    # the default tactic is priced at the one-wave split first (choices as before) ...
    assert ks.default_tactic(64, 32, 8, 8, 24000, sms=132, rk=48, rv=48) == ks.WIDE16_FUSED
    # ... and where that leaves tactic 1 with register records and pairs <= SMs, at the wave plan again. TinyLlama-like
    # B = 11, 32707 tokens (44 pairs): one-wave split 8192 (capped): 2 blocks per SM x 512 tiles + 0.5 x 4 splits = 1026,
    # x 0.72 = 739 > tactic 1's 11 x 64 + 0.5 x 32 = 720 (1024-token splits); wave plan 11008 (3 splits, one wave):
    # 688 + 1.5 = 689.5, x 0.72 = 496 < 720 -> tactic 4 (measured 84.1 -> 65.1 µs, H100, session 31)
    assert ks._tile_cost(44, 132, 1024, 32) == 720 and ks.plan(64, 32, 4, 48, 48, 11, 32707, sms=132,
                                                               tactic=ks.STREAM) == (1024, 32)
    assert ks.plan(64, 32, 4, 48, 48, 11, 32707, sms=132, tactic=ks.WIDE16_FUSED) == (11008, 3)
    assert ks.default_tactic(64, 32, 4, 11, 32707, sms=132, rk=48, rv=48) == ks.WIDE16_FUSED
    assert ks.default_tactic(64, 32, 4, 11, 32707, sms=132, rk=cfg50.rk, rv=cfg50.rv) == ks.STREAM  # staged records
    assert ks.default_tactic(64, 32, 4, 11, 32707, sms=16, rk=48, rv=48) != ks.WIDE16_FUSED  # small GPUs
    assert ks.default_tactic(64, 12, 12, 12, 8192, sms=132, rk=48, rv=48) == ks.STREAM  # 144 pairs > 132 SMs


def test_plan_rejects_bad_tactic_and_split():
    with pytest.raises(EdgeSDKError):
        ks.plan(64, 32, 8, 48, 48, 1, 4096, sms=132, tactic=6)
    with pytest.raises(EdgeSDKError):
        ks.plan(64, 32, 8, 48, 48, 1, 4096, tokens_per_split=96, tactic=ks.STREAM)
    with pytest.raises(EdgeSDKError):
        ks.plan(64, 32, 8, 48, 48, 1, 4096, tokens_per_split=ks.MAX_TOKENS_PER_SPLIT2 + 64, tactic=ks.STREAM)


def stream_k_segments(pairs, tpp, nb, lens_tiles):
    """The segment loop of attn2_entry (the .cu), transliterated: per block its (pair, first tile, end tile, slot,
    ns_work) segments; lens_tiles[p] = ceil(L / 16) of pair p's sequence."""
    total = pairs * tpp
    out = []
    for blk in range(nb):
        g, g1, segs = blk * total // nb, (blk + 1) * total // nb, []
        while g < g1:
            pair = g // tpp
            p0 = pair * tpp
            e = min(g1, p0 + tpp)
            first = ((p0 + 1) * nb - 1) // total
            work = min(lens_tiles[pair], tpp)
            ns_work = ((p0 + work) * nb - 1) // total - first + 1 if work > 0 else 0
            segs.append((pair, g - p0, e - p0, blk - first, ns_work))
            g = e
        out.append(segs)
    return out


@pytest.mark.parametrize("pairs,max_len,tps", [(128, 32768, 31744), (48, 32768, 11904), (3, 700, 16), (8, 4096, 4096),
                                               (2, 100, 64), (5, 33, 16), (1, 9001, 2048), (48, 16384, 5952)])
def test_stream_k_plan(pairs, max_len, tps):
    """STREAM_K: every tile of every pair in exactly one block's segment, in order; segment slots below the plan's
    split count; each pair's merge count = its segments that start below its length (for any length); the default
    share is one block per SM."""
    tpp, nb, most = ks.stream_k_blocks(pairs, max_len, tps)
    assert tpp == math.ceil(max_len / 16) and nb == min(pairs * tpp, math.ceil(pairs * tpp * 16 / tps))
    rng = __import__("random").Random(pairs * max_len)
    lens_tiles = [rng.choice([0, 1, tpp, rng.randint(0, tpp)]) for _ in range(pairs)]
    segs = [s for blk in stream_k_segments(pairs, tpp, nb, lens_tiles) for s in blk]
    for p in range(pairs):
        mine = [s for s in segs if s[0] == p]
        assert [s[3] for s in mine] == list(range(len(mine))) and len(mine) <= most
        assert mine[0][1] == 0 and mine[-1][2] == tpp and all(a[2] == b[1] for a, b in zip(mine, mine[1:]))
        working = sum(1 for s in mine if s[1] < lens_tiles[p])
        assert all(s[4] == working for s in mine)
    assert most == max(sum(1 for s in segs if s[0] == p) for p in range(pairs))
    # 48 pairs of 2048 tiles on 132 SMs: 745 tiles per block, a pair spans 2.75 blocks, so up to 4 segments
    assert ks.plan(64, 9, 3, 48, 48, 16, 32768, sms=132, tactic=ks.STREAM_K) == (16 * math.ceil(16 * 3 * 2048 / 132),
                                                                                  4)
    with pytest.raises(EdgeSDKError):
        ks.plan(64, 9, 3, 48, 48, 16, 32768, sms=132, tokens_per_split=24, tactic=ks.STREAM_K)
    with pytest.raises(EdgeSDKError):
        ks.plan(128, 8, 2, 80, 80, 1, 4096, sms=132, tactic=ks.STREAM_K)


def test_workspace_has_counters_then_partials():
    # 3 * 9 = 27 counters rounded up to 28 words, then B * Hq * splits * (d + 2) floats.
    assert ks.workspace_bytes(9, 64, 3, 5) == 4 * (28 + 3 * 9 * 5 * 66)
    assert ks.workspace_bytes(32, 128, 1, 1) == 4 * (32 + 32 * 130)


def test_stream_smem_fits_orin():
    # Per warp: K and V tiles [16][d + 8] fp16 and 3 stages of 16 K + 16 V records.
    assert ks.smem_bytes2(64, 48, 48) == 4 * (2 * 16 * 72 * 2 + 3 * (768 + 768))
    worst = max(ks.smem_bytes2(d, c.rk, c.rv) for d in (64, 128)
                for c in [SparseKVConfig(d, 8, 8, 0.0, 0.0, 64)])
    assert worst + 16 <= 163 * 1024  # sm_87 opt-in limit per block (static 16 B for the merge flag)
    wide = ks.smem_bytes2(64, *[SparseKVConfig(64, 8, 8, 0.0, 0.0, 64).rk] * 2, ks.WIDE_WARPS[ks.WIDE_FUSED])  # d = 64
    assert wide + 16 <= 163 * 1024


def test_stream_split_heuristic():
    # k = round(sqrt(t) / 1.6) tiles per warp, t = 16-token tiles per SM; tokens per split = 64 k.
    # SmolLM2 B=1 4k: t = 3 * 256 / 132 = 5.82 -> 1.51 -> k 2; Llama B=16 32k: t = 128 * 2048 / 132
    # = 1985.9 -> 27.85 -> k 28 (1792 tokens, 19 splits); on 16 SMs t = 16384 -> 80 -> 5120 tokens.
    assert ks.plan(64, 9, 3, 48, 48, 1, 4096, sms=132, tactic=ks.STREAM) == (128, 32)
    assert ks.plan(64, 32, 8, 48, 48, 16, 32768, sms=132, tactic=ks.STREAM) == (1792, 19)
    assert ks.plan(64, 32, 8, 48, 48, 16, 32768, sms=16, tactic=ks.STREAM_FUSED) == (5120, 7)
    assert ks.plan(64, 32, 8, 48, 48, 1, 1, sms=132, tactic=ks.STREAM) == (64, 1)
    prev = 0
    for max_len in (1, 100, 1000, 10_000, 100_000, 10_000_000):  # more work: never smaller splits, capped
        ts, _ = ks.plan(64, 32, 8, 48, 48, 4, max_len, sms=132, tactic=ks.STREAM)
        assert prev <= ts <= ks.MAX_TOKENS_PER_SPLIT2
        prev = ts
    assert prev == ks.MAX_TOKENS_PER_SPLIT2


def test_default_tactic_rule():
    """Tactic 2 (fused merge) by default at <= 100 tiles per SM and <= 32 splits, else tactic 1."""
    # (hq, hkv, B, ctx) on 132 SMs: tiles per SM 15.5, 62 (ns 52), 3.9, 62 (ns 13), 93 (ns 11), 1986, 23 (ns 86)
    cases = [((32, 8, 1, 4096), ks.STREAM_FUSED), ((32, 8, 1, 16384), ks.STREAM), ((32, 8, 1, 1024), ks.STREAM_FUSED),
             ((32, 8, 4, 4096), ks.STREAM_FUSED), ((9, 3, 16, 4096), ks.STREAM_FUSED), ((32, 8, 16, 32768), ks.STREAM),
             ((9, 3, 1, 16384), ks.STREAM), ((32, 8, 4, 16384), ks.STREAM)]
    for (hq, hkv, b, ctx), want in cases:
        assert ks.default_tactic(64, hq, hkv, b, ctx, sms=132, wide=False) == want, (hq, hkv, b, ctx)
        assert ks.default_tactic(128, hq, hkv, b, ctx, sms=132) == want, (hq, hkv, b, ctx)  # no wide kernel at d = 128
        cfg = SparseKVConfig(128, hq, hkv, 0.7, 0.7, ctx)
        assert ks.plan_cache(cfg, b, ctx, sms=132) == ks.plan_cache(cfg, b, ctx, sms=132, tactic=want)
    # a forced split size counts: 64-token splits at 4k are 64 splits -> tactic 1
    assert ks.default_tactic(64, 32, 8, 1, 4096, sms=132, tokens_per_split=64) == ks.STREAM
    assert ks.default_tactic(64, 32, 8, 1, 4096, sms=132, tokens_per_split=128) == ks.STREAM_FUSED


@pytest.mark.parametrize("warps", [8, 16])
@pytest.mark.parametrize("batch,max_len", [(1, 1), (1, 4096), (16, 32768), (3, 777)])
def test_wide_block_plans(warps, batch, max_len):
    """Tactics 1, 2 with 8 or 16 warps per block: splits are whole multiples of 16 · warps tokens (one
    tile per warp and pass); others are refused, and so are d = 128 and tactic 0."""
    cfg = SparseKVConfig(64, 32, 8, 0.7, 0.7, 32768)
    ts, ns = ks.plan_cache(cfg, batch, max_len, sms=132, tactic=ks.STREAM_FUSED, warps=warps)
    assert ts % (16 * warps) == 0 and 16 * warps <= ts <= ks.MAX_TOKENS_PER_SPLIT2
    assert ns == max(1, math.ceil(max_len / ts))
    assert ks.smem_bytes2(64, cfg.rk, cfg.rv, warps) == warps // 4 * ks.smem_bytes2(64, cfg.rk, cfg.rv)
    with pytest.raises(EdgeSDKError, match=f"multiple of {16 * warps}"):
        ks.plan_cache(cfg, batch, max_len, tokens_per_split=16 * warps + 64, tactic=ks.STREAM, warps=warps)
    cfg128 = SparseKVConfig(128, 8, 2, 0.7, 0.7, 256)
    for c, tactic in ((cfg128, ks.STREAM), (cfg, ks.SPLIT_V1)):
        with pytest.raises(EdgeSDKError, match="8 or 16 warps"):
            ks.decode_attention(c, 1, 256, 0, ks.CachePtrs(0, 0, 0, 0, 0), 0, 0, 0, tokens_per_split=256,
                                tactic=tactic, warps=warps)


def test_wide_default_rule():
    """At d = 64, WIDE_FUSED while the 16-token tiles per SM are <= 75 (and no split is forced); its split is
    the fewest 128-token units per split that keep B * Hkv * splits within one block per SM."""
    # (hq, hkv, B, ctx) -> tiles per SM on 132 SMs: 15.5, 62.1, 5.8, 23.3, 46.5, 23.3 (wide); 124.1, 93.1 (not)
    wide = [((32, 8, 1, 4096), (256, 16)), ((32, 8, 1, 16384), (1024, 16)), ((9, 3, 1, 4096), (128, 32)),
            ((9, 3, 1, 16384), (384, 43)), ((9, 3, 1, 32768), (768, 43)), ((9, 3, 4, 4096), (384, 11)),
            ((32, 8, 4, 4096), (1024, 4))]
    for (hq, hkv, b, ctx), plan in wide:
        assert ks.default_tactic(64, hq, hkv, b, ctx, sms=132) == ks.WIDE_FUSED, (hq, hkv, b, ctx)
        cfg = SparseKVConfig(64, hq, hkv, 0.7, 0.7, ctx)
        assert ks.plan_cache(cfg, b, ctx, sms=132) == plan == ks.plan_cache(cfg, b, ctx, sms=132, tactic=ks.WIDE_FUSED)
        assert b * hkv * plan[1] <= 132
    for hq, hkv, b, ctx in ((32, 8, 1, 32768), (9, 3, 16, 4096), (32, 8, 16, 32768)):
        assert ks.default_tactic(64, hq, hkv, b, ctx, sms=132) not in ks.WIDE_WARPS
    assert ks.default_tactic(64, 32, 8, 1, 4096, sms=132, tokens_per_split=256) == ks.STREAM_FUSED  # forced split
    # not on small GPUs (Orin: 16 SMs): the rule before, whatever the shape
    for hq, hkv, b, ctx in ((32, 8, 1, 1024), (9, 3, 1, 4096), (32, 8, 1, 16384), (9, 3, 4, 1024)):
        cfg = SparseKVConfig(64, hq, hkv, 0.7, 0.7, ctx)
        assert ks.default_tactic(64, hq, hkv, b, ctx, sms=16, rk=cfg.rk, rv=cfg.rv) == \
            ks.default_tactic(64, hq, hkv, b, ctx, sms=16, wide=False)
    # more sequences than SMs: one split each (the whole length, capped)
    assert ks.plan(64, 32, 8, 48, 48, 64, 100, sms=132, tactic=ks.WIDE_FUSED) == (128, 1)
    assert ks.plan(64, 32, 8, 48, 48, 1, 10**6, sms=132, tactic=ks.WIDE_FUSED)[0] == ks.MAX_TOKENS_PER_SPLIT2
    for bad in (dict(warps=4), dict(warps=16)):
        with pytest.raises(EdgeSDKError, match="WIDE16_FUSED"):
            ks.plan(64, 32, 8, 48, 48, 1, 4096, sms=132, tactic=ks.WIDE_FUSED, **bad)
    for tactic in (ks.WIDE_FUSED, ks.WIDE16_FUSED):
        with pytest.raises(EdgeSDKError, match="d = 128"):
            ks.plan(128, 32, 8, 48, 48, 1, 4096, sms=132, tactic=tactic)
    # the node's workspace follows the default plan
    cfg = SparseKVConfig(64, 9, 3, 0.7, 0.7, 4096)
    tactic, nbytes = ks.node_plan(cfg, 1, sms=132)
    assert tactic == ks.WIDE_FUSED and nbytes >= ks.workspace_bytes(9, 64, 1, 32)


def test_wide16_default_rule(monkeypatch):
    """WIDE16_FUSED above 75 tiles per SM, up to 1000, where its shared memory fits (given sms: Orin's 163 KB,
    so at 70 % but not at 50 % at d = 64) and the tile model prices it below tactic 1's plan. Where its plan takes the
    pipelined register-record kernels (session 29) the model prices its tiles at REG_PIPE_TILE_COST and the 1000-tile
    limit does not apply; PIPELINED_RECORDS = False gives the rule before."""
    c70 = SparseKVConfig(64, 32, 8, 0.7, 0.7, 32768)
    c50 = SparseKVConfig(64, 32, 8, 0.5, 0.5, 32768)
    s70 = SparseKVConfig(64, 9, 3, 0.7, 0.7, 32768)
    # (cfg, B, ctx) -> (tokens per split, splits); Llama B=1 32k: 124 tiles/SM, 8 pairs x 16 splits = 128 blocks;
    # B=16 16k: one split per pair (the wave model, test_wave_split; one wave capped at 8192 tokens: 2 waves)
    picks = [(c70, 1, 32768, (2048, 16)), (c70, 4, 16384, (4096, 4)), (c70, 4, 32768, (8192, 4)),
             (c70, 16, 4096, (4096, 1)), (c70, 16, 16384, (16384, 1)), (s70, 4, 16384, (1536, 11)),
             (s70, 4, 32768, (3072, 11))]
    for cfg, b, ctx, plan in picks:
        assert ks.default_tactic(64, cfg.num_q_heads, cfg.num_kv_heads, b, ctx, sms=132, rk=cfg.rk, rv=cfg.rv) \
            == ks.WIDE16_FUSED, (cfg.num_kv_heads, b, ctx)
        assert ks.plan_cache(cfg, b, ctx, sms=132) == plan
    # not: without record sizes, at 50 % (184 KB); and, by the rule before session 29 (PIPELINED_RECORDS = False),
    # past 1000 tiles per SM and where the model prices tactic 1 lower: SmolLM2 B=16 4k (96 blocks of 8 tiles per
    # warp: 128 tiles + 1 for 2 splits, against 4 blocks x 4 warps x 6 tiles = 96 + 5.5 for 11 splits) and B=8 8k
    # (120 blocks: 112 + 2.5 against 96 + 11; staged tactic 4 measured 0.90-0.94x in session 25). With the pipelined
    # kernels these three take tactic 4 (H100, session 29: 1.01x, 1.06x and, Llama B=16 32k, 1.20x).
    assert ks._tile_cost(48, 132, 2048, 2) == 128 + 1 and ks._tile_cost(48, 132, 384, 11) == 96 + 5.5
    assert ks.default_tactic(64, 32, 8, 1, 32768, sms=132) == ks.STREAM
    assert ks.default_tactic(64, 32, 8, 4, 16384, sms=132, rk=c50.rk, rv=c50.rv) == ks.STREAM
    pipelined = [(9, 3, 8, 8192), (32, 8, 16, 32768), (9, 3, 16, 4096)]  # 93, 1986 (past 1000), 93 tiles per SM
    before = [ks.STREAM_FUSED, ks.STREAM, ks.STREAM_FUSED]
    for (hq, hkv, b, ctx), old in zip(pipelined, before):
        cfg = SparseKVConfig(64, hq, hkv, 0.7, 0.7, ctx)
        assert ks.uses_pipelined_records(ks.plan_cache(cfg, b, ctx, sms=132, tactic=ks.WIDE16_FUSED)[0], 16)
        assert ks.default_tactic(64, hq, hkv, b, ctx, sms=132, rk=cfg.rk, rv=cfg.rv) == ks.WIDE16_FUSED, (hq, b, ctx)
        monkeypatch.setattr(ks, "PIPELINED_RECORDS", False)
        assert ks.default_tactic(64, hq, hkv, b, ctx, sms=132, rk=cfg.rk, rv=cfg.rv) == old, (hq, b, ctx)
        monkeypatch.setattr(ks, "PIPELINED_RECORDS", True)
    # at the one-wave plan tactic 1 stays priced lower: MHA-12-like B=6, 9k (tile costs 358.5 vs 1025 x 0.72; tactic 4
    # at 8192-token splits measured 0.87x, session 29); at the wave plan (3072 tokens, 3 splits, 2 waves) tactic 4 is
    # priced 2 x 192 + 1.5 = 385.5, x 0.72 = 277.6, and taken (session 31: 48.9 -> 43.4 µs, H100)
    assert ks._tile_cost(72, 132, 704, 13) == 8 * 44 + 6.5 and ks._tile_cost(72, 132, 8192, 2) == 2 * 512 + 1
    assert ks.plan(64, 12, 12, c70.rk, c70.rv, 6, 9000, sms=132, tactic=ks.WIDE16_FUSED) == (3072, 3)
    assert ks._tile_cost(72, 132, 3072, 3) == 385.5
    assert ks.default_tactic(64, 12, 12, 6, 9000, sms=132, rk=c70.rk, rv=c70.rv) == ks.WIDE16_FUSED
    monkeypatch.setattr(ks, "PIPELINED_RECORDS", False)  # the rule before session 29 (and so before 31)
    assert ks.default_tactic(64, 12, 12, 6, 9000, sms=132, rk=c70.rk, rv=c70.rv) == ks.STREAM
    monkeypatch.setattr(ks, "PIPELINED_RECORDS", True)
    assert ks.smem_bytes2(64, c50.rk, c50.rv, 16) > ks.ORIN_SMEM_OPTIN >= ks.smem_bytes2(64, c70.rk, c70.rv, 16) + 16
    assert ks.node_plan(c70, 4, sms=132)[0] == ks.WIDE16_FUSED


def test_register_records_default_rule(monkeypatch):
    """Records that 16-warp blocks decode from registers (48 bytes: 70 % at d = 64) take WIDE16_FUSED instead of
    WIDE_FUSED from 30 to 75 tiles per SM; below 30 tiles per SM, with other record sizes or none given, or with
    REGISTER_RECORDS off, WIDE_FUSED as before."""
    # (hq, hkv, B, ctx) -> tiles per SM on 132 SMs: 62.1, 62.1, 46.5, 34.9 (16 warps); 15.5, 23.3, 23.3 (8 warps)
    reg = ((32, 8, 1, 16384), (32, 8, 4, 4096), (9, 3, 1, 32768), (9, 3, 3, 8192))
    low = ((32, 8, 1, 4096), (9, 3, 1, 16384), (9, 3, 4, 4096))
    for shapes, want in ((reg, ks.WIDE16_FUSED), (low, ks.WIDE_FUSED)):
        for hq, hkv, b, ctx in shapes:
            c70, c50 = (SparseKVConfig(64, hq, hkv, s, s, ctx) for s in (0.7, 0.5))
            assert ks.uses_register_records(64, c70.rk, c70.rv, 16)
            assert ks.default_tactic(64, hq, hkv, b, ctx, sms=132, rk=c70.rk, rv=c70.rv) == want, (hq, hkv, b, ctx)
            assert ks.default_tactic(64, hq, hkv, b, ctx, sms=132, rk=c50.rk, rv=c50.rv) == ks.WIDE_FUSED
            assert ks.default_tactic(64, hq, hkv, b, ctx, sms=132) == ks.WIDE_FUSED
            assert ks.plan_cache(c70, b, ctx, sms=132) == ks.plan_cache(c70, b, ctx, sms=132, tactic=want)
    monkeypatch.setattr(ks, "REGISTER_RECORDS", False)
    for hq, hkv, b, ctx in reg:
        c70 = SparseKVConfig(64, hq, hkv, 0.7, 0.7, ctx)
        assert ks.default_tactic(64, hq, hkv, b, ctx, sms=132, rk=c70.rk, rv=c70.rv) == ks.WIDE_FUSED
