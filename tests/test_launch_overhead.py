"""The plugin launch path with the CUDA driver stubbed (no GPU): plans cached, arg blocks reused.

``tools/launch_overhead.py``'s :class:`StubDriver` answers every driver call; its ``cuLaunchKernel``
hook decodes the ``kernelParams`` array the launchers built, so each test checks the exact kernel,
grid, block, shared memory and parameter values against the launchers' pure config functions.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.driver")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from launch_overhead import StubDriver  # noqa: E402

from edgesdk.errors import EdgeSDKError  # noqa: E402
from edgesdk.formats.vitbit_gemm import k_padded  # noqa: E402
from edgesdk.kernels import _cuda  # noqa: E402
from edgesdk.formats.sparse_kv import STATE_DTYPES, SparseKVConfig, state_shapes  # noqa: E402
from edgesdk.formats import sparse_kv as sparse_kv_format  # noqa: E402
from edgesdk.kernels import bitmap_linear as kbl  # noqa: E402
from edgesdk.kernels import sparse_kv as ks  # noqa: E402
from edgesdk.kernels import vitbit_gemm as K  # noqa: E402

P, I, F, L = "p", "i", "f", "l"  # parameter kinds: pointer, int, float, long long
BITMAP_SIG = [P] * 7 + [I] * 5  # X, bitmaps, values, offsets, scales, bias, Y, m, n, k, ks, spb
QUANT_SIG = [P, P, F, I, I, I]  # X, Xq, x_scale, m, k, kp
GEMM_SIG = [P] * 6 + [F] + [I] * 5  # Xq, W, Y, part, w_scale, bias, x_scale, flags, m, n, kp, kps
EPI_SIG = [P, I, P, P, P, F, I, I, I]  # part, splits, Y, w_scale, bias, x_scale, flags, m, n
# sparse_kv: attention (tactic 0; tactics 1-4 add out, fuse), merge, append, the node's step kernel, token copy
KV_ATTN_SIG = [P] * 7 + [I] * 12 + [F]  # q, ws, lens, k_rec, v_rec, k_ring, v_ring, Hkv, G, geometry (8), TS, NS, scale
KV_SIGS = {"sparse_kv_attn_": KV_ATTN_SIG, "sparse_kv_attn2_": KV_ATTN_SIG + [P, I],
           "sparse_kv_attn2r_": KV_ATTN_SIG + [P, I], "sparse_kv_attn2p_": KV_ATTN_SIG + [P, I],
           "sparse_kv_dense2_": KV_ATTN_SIG + [P, I], "sparse_kv_combine_": [P] * 3 + [I] * 3,
           "sparse_kv_append_": [P] * 7 + [I] * 9 + [P, I, I],
           "sparse_kv_node_step": [P, P, I, P, I] + [P] * 8 + [I] * 5,
           "sparse_kv_token_copy": [P, P, I, I, L, L]}


def decode(params: int, sig: list[str]) -> list:
    arr = (ctypes.c_void_p * len(sig)).from_address(params)
    typ = {P: ctypes.c_uint64, I: ctypes.c_int, F: ctypes.c_float, L: ctypes.c_longlong}
    return [typ[s].from_address(arr[i]).value for i, s in enumerate(sig)]


@pytest.fixture
def stub(monkeypatch):
    """The stub driver behind ``_cuda`` (fresh caches, no compilation); records decoded launches."""
    s = StubDriver(_cuda._driver())
    s.seen = []
    s.sigs = {}  # CUfunction int -> signature, filled as kernels are resolved

    real_get = _cuda.get_kernel

    def get_kernel(source, name, options=()):
        k = real_get(source, name, options)
        kv = [sig for prefix, sig in KV_SIGS.items() if name.startswith(prefix)]
        s.sigs[int(k.function)] = (name, kv[0] if kv else BITMAP_SIG if name.startswith("bitmap_") else QUANT_SIG
                                   if name.startswith("vitbit_quantize") else EPI_SIG
                                   if name == "vitbit_splitk_epilogue" else GEMM_SIG)
        return k

    def on_launch(f, grid, block, smem, stream, params):
        name, sig = s.sigs[int(f)]
        s.seen.append({"name": name, "grid": grid, "block": block, "smem": smem, "stream": stream,
                       "params": params, "args": decode(params, sig)})

    s.on_launch = on_launch
    monkeypatch.setattr(_cuda, "_driver", lambda: s)
    monkeypatch.setattr(_cuda, "compile_cubin", lambda *a, **k: b"stub cubin")
    monkeypatch.setattr(_cuda, "_modules", {})
    monkeypatch.setattr(_cuda, "_functions", {})
    monkeypatch.setattr(_cuda, "_initialized", False)
    monkeypatch.setattr(_cuda, "get_kernel", get_kernel)
    monkeypatch.setattr(_cuda, "_ctx_facts", {})
    for mod in (kbl, K):
        monkeypatch.setattr(mod, "_layers", {})
    for mod in (kbl, K, ks):
        monkeypatch.setattr(mod, "_tls", threading.local())
    yield s


BM = {"n": 200, "k": 72, "value_dtype": "int8", "has_bias": 1, "plugin_version": "1"}


def _bitmap(stub, attrs, m, ptrs, y, tactic=1, x_dtype="float16", stream=0x51):
    stub.seen.clear()
    kbl.launch(attrs, x_dtype, m, ptrs, [y], stream, tactic)
    (launch,) = stub.seen
    return launch


def test_bitmap_plan_is_cached_and_pointers_rewritten_in_place(stub):
    ptrs = [0x10000 + 0x1000 * i for i in range(6)]
    first = _bitmap(stub, BM, 3, ptrs, 0x90000)
    c = kbl.config(200, 72, 3, "float16", "int8", 1, stub.sms)
    assert first["name"] == c["name"] and first["name"].startswith("bitmap_dec")
    assert (first["grid"], first["block"], first["smem"]) == (c["grid"], c["block"], c["smem"])
    assert first["args"] == [*ptrs, 0x90000, 3, 200, 72, c["ks"], c["spb"]] and first["stream"] == 0x51
    loads = stub.calls["cuModuleGetFunction"], stub.calls.get("cuDeviceGetAttribute", 0)
    ctx_calls = stub.calls["cuCtxGetCurrent"]

    ptrs2 = [0x20000 + 0x1000 * i for i in range(6)]
    second = _bitmap(stub, BM, 3, ptrs2, 0xA0000, stream=0x52)
    assert second["args"] == [*ptrs2, 0xA0000, 3, 200, 72, c["ks"], c["spb"]] and second["stream"] == 0x52
    assert second["params"] == first["params"]  # same arg block, rewritten
    assert (stub.calls["cuModuleGetFunction"], stub.calls.get("cuDeviceGetAttribute", 0)) == loads
    assert stub.calls["cuCtxGetCurrent"] == ctx_calls + 1  # one driver query per launch (the context)
    assert len(kbl._tls.plans) == 1

    # Another M is another plan (grid and the m parameter differ); no bias → null bias pointer.
    third = _bitmap(stub, dict(BM, has_bias=0), 40, ptrs[:5], 0xB0000)
    c40 = kbl.config(200, 72, 40, "float16", "int8", 1, stub.sms)
    assert third["name"] == c40["name"] and third["grid"] == c40["grid"]
    assert third["args"] == [*ptrs[:5], 0, 0xB0000, 40, 200, 72, c40["ks"], c40["spb"]]
    assert third["params"] != first["params"] and len(kbl._tls.plans) == 2


def test_bitmap_unaligned_x_and_fp32_take_the_generic_path(stub):
    ptrs = [0x10000 + 0x1000 * i for i in range(6)]
    a = _bitmap(stub, BM, 3, [0x10002, *ptrs[1:]], 0x90000)
    assert a["name"] == kbl.config(200, 72, 3, "float16", "int8", 1, stub.sms, x_aligned=False)["name"]
    assert a["name"].startswith("bitmap_linear_f16") and a["args"][0] == 0x10002
    b = _bitmap(stub, BM, 3, ptrs, 0x90000, tactic=7, x_dtype="float32")
    c = kbl.config(200, 72, 3, "float32", "int8", 7, stub.sms)
    assert (b["name"], b["grid"], b["block"], b["smem"]) == (c["name"], c["grid"], c["block"], c["smem"])


def test_bitmap_plans_are_per_thread_and_per_context(stub):
    ptrs = [0x10000 + 0x1000 * i for i in range(6)]
    main = _bitmap(stub, BM, 5, ptrs, 0x90000)
    got = {}

    def other():
        got["launch"] = _bitmap(stub, BM, 5, [p + 0x100000 for p in ptrs], 0x190000)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert got["launch"]["params"] != main["params"]  # its own arg block
    assert got["launch"]["args"][:7] == [p + 0x100000 for p in ptrs] + [0x190000]
    assert decode(main["params"], BITMAP_SIG)[:7] == [*ptrs, 0x90000]  # main thread's block untouched

    # A 16-SM (green) context: kernels resolved again for it, heuristic planned with its SM count.
    loads = stub.calls["cuModuleGetFunction"]
    stub.ctx, stub.sms = 0x8000, 16
    green = _bitmap(stub, BM, 5, ptrs, 0x90000)
    c16 = kbl.config(200, 72, 5, "float16", "int8", 1, 16)
    assert stub.calls["cuModuleGetFunction"] == loads + 1
    assert (green["grid"], green["block"], green["args"][-2:]) == (c16["grid"], c16["block"], [c16["ks"], c16["spb"]])


def test_bitmap_bad_calls_raise_and_are_not_cached(stub):
    ptrs = [0x10000 + 0x1000 * i for i in range(6)]
    for _ in range(2):
        with pytest.raises(EdgeSDKError, match="tactic 99"):
            kbl.launch(BM, "float16", 3, ptrs, [1], 0, 99)
        with pytest.raises(EdgeSDKError, match="expected 6 inputs"):
            kbl.launch(BM, "float16", 3, ptrs[:5], [1], 0)
        with pytest.raises(EdgeSDKError, match="bad attributes"):
            kbl.launch(dict(BM, value_dtype="int4"), "float16", 3, ptrs, [1], 0)
    assert not getattr(kbl._tls, "plans", {}) and "cuLaunchKernel" not in stub.calls


VB = {"n": 300, "k": 520, "bits": 8, "has_bias": 1, "gelu": 1, "x_scale": 0.0375}


@pytest.mark.parametrize("tactic,m,n_kernels", [(3, 19, 2), (4, 19, 3)])
def test_vitbit_launches_share_pointer_slots(stub, tactic, m, n_kernels):
    ins, y, ws = [0x10000, 0x20000, 0x30000, 0x40000], 0x50000, 0x60000
    a = K.validate_attributes(VB)
    cfg, splits = K.config(tactic, 8)
    kp = k_padded(520)
    for call in range(2):
        shift = 0x1000000 * call
        stub.seen.clear()
        K.launch(VB, "float16", m, [p + shift for p in ins], [y + shift], 0x77, tactic, workspace=ws + shift)
        assert [s["name"] for s in stub.seen][:2] == ["vitbit_quantize_f16", f"vitbit_gemm_{cfg.name}"]
        assert len(stub.seen) == n_kernels
        q, g = stub.seen[0], stub.seen[1]
        assert q["args"][:2] == [ins[0] + shift, ws + shift] and q["args"][3:] == [m, 520, kp]
        assert q["args"][2] == pytest.approx(a["x_scale"], rel=1e-7)
        part = ws + shift + K._xq_bytes(m, 520) if splits > 1 else 0
        assert g["args"][:6] == [ws + shift, ins[1] + shift, y + shift, part, ins[2] + shift, ins[3] + shift]
        kt = -(-kp // K.BK)
        assert g["args"][7:] == [1 | 2 | 4, m, 300, kp, -(-kt // splits)]
        assert (g["grid"], g["block"], g["smem"]) == ((-(-300 // cfg.bn), -(-m // cfg.bm), splits),
                                                     (cfg.threads, 1, 1), cfg.smem)
        if splits > 1:
            e = stub.seen[2]
            assert e["name"] == "vitbit_splitk_epilogue"
            assert e["args"][:5] == [part, splits, y + shift, ins[2] + shift, ins[3] + shift]
            assert e["args"][6:] == [7, m, 300]
        if call == 0:
            params = [s["params"] for s in stub.seen]
            loads = stub.calls["cuModuleGetFunction"]
        else:
            assert [s["params"] for s in stub.seen] == params
            assert stub.calls["cuModuleGetFunction"] == loads


def test_vitbit_one_off_gemm_matches_the_planned_launch(stub):
    """``gemm()`` (benchmarks) builds the same GEMM launch as ``launch()``, from ctypes values."""
    a = K.validate_attributes(dict(VB, has_bias=0, gelu=0))
    K.launch(dict(VB, has_bias=0, gelu=0), "float32", 7, [1 << 20, 2 << 20, 3 << 20], [4 << 20], 0, 4,
             workspace=5 << 20)
    planned = stub.seen[1:]
    stub.seen.clear()
    K.gemm(a, "float32", 7, 5 << 20, 2 << 20, 3 << 20, 0, 4 << 20, 0, 4, part=(5 << 20) + K._xq_bytes(7, 520))
    assert [{k: v for k, v in s.items() if k != "params"} for s in stub.seen] == \
        [{k: v for k, v in s.items() if k != "params"} for s in planned]
    with pytest.raises(EdgeSDKError, match="partials"):
        K.gemm(a, "float32", 7, 5 << 20, 2 << 20, 3 << 20, 0, 4 << 20, 0, 4)


def test_vitbit_default_tactic_and_inkernel_splitk_plans(stub):
    """Tactic 1 resolves per shape (here: M = 19, K = 520 on 132 SMs -> persistent tp_32x32, grid = its tiles;
    its GELU build for this GELU layer, the build without GELU code otherwise); the in-kernel split-K tactics
    launch two kernels, the quantize kernel zeroing the tile counters, which lie after the partials region
    (where no tactic writes partials)."""
    ws = 0x60000
    K.launch(dict(VB, gelu=0), "float16", 19, [0x10000, 0x20000, 0x30000, 0x40000], [0x50000], 0, 1, workspace=ws)
    assert [s["name"] for s in stub.seen] == ["vitbit_quantize_f16", "vitbit_gemm_tp_32x32"]
    stub.seen.clear()
    K.launch(VB, "float16", 19, [0x10000, 0x20000, 0x30000, 0x40000], [0x50000], 0, 1, workspace=ws)
    assert [s["name"] for s in stub.seen] == ["vitbit_quantize_f16", "vitbit_gemm_tp_32x32_gelu"]
    assert stub.seen[1]["grid"] == (-(-300 // 32), 1, 1)  # 10 tiles < 2 blocks/SM x 132 SMs
    kp, kt = k_padded(520), -(-k_padded(520) // K.BK)
    part = ws + K._xq_bytes(19, 520)
    ctr = part + K._partials_bytes(19, 300)
    assert ctr + 4 * K._counters(19, 300) == ws + K.workspace_bytes(VB, 19)
    for tactic, name, bn, splits in ((50, "tk_64x64", 64, 2),):  # kt = 5: 3 + 2
        stub.seen.clear()
        K.launch(VB, "float16", 19, [0x10000, 0x20000, 0x30000, 0x40000], [0x50000], 0, tactic, workspace=ws)
        assert [s["name"] for s in stub.seen] == ["vitbit_quantize_f16", f"vitbit_gemm_{name}_gelu"]
        g = stub.seen[1]
        tiles = -(-300 // bn)
        assert g["grid"] == (tiles, 1, splits) and g["args"][11] == -(-kt // splits) and g["args"][3] == part
        assert 4 * tiles * splits * 64 * bn <= ctr - part and tiles <= K._counters(19, 300)
        garr = (ctypes.c_void_p * 13).from_address(g["params"])
        assert ctypes.c_uint64.from_address(garr[12]).value == ctr
        arr = (ctypes.c_void_p * 8).from_address(stub.seen[0]["params"])
        ctr_off, nctr = ctypes.c_int64.from_address(arr[6]).value, ctypes.c_int.from_address(arr[7]).value
        assert nctr == tiles and ws + 4 * ctr_off == ctr


@pytest.mark.parametrize("tactic,tail", [(60, "tp_64x64")])
def test_vitbit_split_m_plans_head_and_tail(stub, tactic, tail):
    """Split-M tactics: the persistent 128 x 128 kernel on the first mh rows (whole waves of its resident
    blocks), the tail kernel on the rest, its X and Y pointers mh rows in (Xq rows of K16 bytes, fp16 Y rows);
    planned once, the pointers rewritten per call; gemm() builds the same launches."""
    m, n, k = 12000, 300, 520  # ncol = 3, 94 x 3 = 282 tiles; the stub: 2 blocks per SM x 132 = 264 slots
    a = K.validate_attributes(VB)
    kp = k_padded(k)
    head, tl = K._C["tp_128x128"], K._C[tail]
    slots = K.persistent_grid(K._kernel(K.kernel_name(head, True)), head, 1 << 30)
    mh = K.split_m_rows(slots, m, n)
    assert 0 < mh < m  # this shape has both parts on the stub's 132 SMs
    ins, y, ws = [0x10000, 0x20000, 0x30000, 0x40000], 0x500000, 0x6000000
    for call in range(2):
        shift = 0x10000000 * call
        stub.seen.clear()
        K.launch(VB, "float16", m, [p + shift for p in ins], [y + shift], 0, tactic, workspace=ws + shift)
        names = [s["name"] for s in stub.seen]
        assert names == ["vitbit_quantize_f16", "vitbit_gemm_tp_128x128_gelu", f"vitbit_gemm_{tail}_gelu"]
        g1, g2 = stub.seen[1], stub.seen[2]
        assert g1["args"][:3] == [ws + shift, ins[1] + shift, y + shift] and g1["args"][8] == mh
        assert g2["args"][:3] == [ws + shift + mh * kp, ins[1] + shift, y + shift + mh * 300 * 2]
        assert g2["args"][8] == m - mh and g2["args"][9:11] == [300, kp]
        assert g1["grid"][0] == min(slots, -(-mh // 128) * -(-n // 128))
        assert g2["grid"][0] <= -(-(m - mh) // tl.bm) * -(-n // tl.bn)
    planned = [{kk: v for kk, v in s.items() if kk != "params"} for s in stub.seen[1:]]
    stub.seen.clear()
    K.gemm(a, "float16", m, ws + shift, ins[1] + shift, ins[2] + shift, ins[3] + shift, y + shift, 0, tactic)
    assert [{kk: v for kk, v in s.items() if kk != "params"} for s in stub.seen] == planned


KV = SparseKVConfig(64, 32, 8, 0.7, 0.7, 4096)
SCHED = sparse_kv_format.SCHEDULE_APPEND_FROM  # append's `sched`: schedule groups from this length on
KV_PTRS = dict(q=0x11000, cache=ks.CachePtrs(0x21000, 0x22000, 0x23000, 0x24000, 0x25000), out=0x31000, ws=0x40000)


def _kv_attention(stub, ptrs, **kw):
    stub.seen.clear()
    ks.decode_attention(KV, 2, 3000, ptrs["q"], ptrs["cache"], ptrs["out"], ptrs["ws"], 0x51, **kw)
    return list(stub.seen)


@pytest.mark.parametrize("tactic,names", [(None, ["sparse_kv_attn2_d64_g4_w8"]),
                                          (ks.SPLIT_V1, ["sparse_kv_attn_d64_g4", "sparse_kv_combine_d64"]),
                                          (ks.STREAM, ["sparse_kv_attn2_d64_g4", "sparse_kv_combine_d64"]),
                                          (ks.STREAM_FUSED, ["sparse_kv_attn2_d64_g4"]),
                                          (ks.WIDE16_FUSED, ["sparse_kv_attn2r_d64_g4_w16"])])
def test_sparse_kv_attention_plan_is_cached(stub, tactic, names):
    """decode_attention resolves its launches once per call shape and context; a call rewrites the pointers only
    (one driver query, the context), and every parameter is the one the plan functions give."""
    first = _kv_attention(stub, KV_PTRS, tactic=tactic)
    assert [x["name"] for x in first] == names
    t = tactic if tactic is not None else ks.default_tactic(64, 32, 8, 2, 3000, rk=KV.rk, rv=KV.rv)
    ts, ns = ks.plan_cache(KV, 2, 3000, tactic=t)
    c = KV_PTRS["cache"]
    parts = KV_PTRS["ws"] + 4 * ks._counter_words(2, 32)
    geometry = [KV.record_capacity, KV.ring, KV.window, KV.group, KV.keep_k, KV.keep_v, KV.rk, KV.rv]
    attn = first[0]
    assert attn["grid"] == (ns, 8, 2) and attn["stream"] == 0x51
    assert attn["args"][:7] == [KV_PTRS["q"], parts if t == ks.SPLIT_V1 else KV_PTRS["ws"], c.lens, c.k_rec, c.v_rec,
                                c.k_ring, c.v_ring]
    assert attn["args"][7:19] == [8, 4, *geometry, ts, ns]
    assert attn["args"][19] == pytest.approx(1.4426950408889634 / 8, rel=1e-6)
    if t != ks.SPLIT_V1:
        assert attn["args"][20:] == [KV_PTRS["out"], 1 if t in ks.FUSED_TACTICS else 0]
        assert attn["block"] == (32 * ks._warps(64, t, None), 1, 1)
        assert attn["smem"] == ks.smem_bytes2(64, KV.rk, KV.rv, ks._warps(64, t, None))
    if len(first) == 2:
        assert first[1]["grid"] == (64, 1, 1) and first[1]["args"] == [parts, c.lens, KV_PTRS["out"], 32, ts, ns]

    calls = dict(stub.calls)
    moved = {k: (v + 0x100000 if k != "cache" else ks.CachePtrs(*(p + 0x100000 for p in v))) for k, v in KV_PTRS.items()}
    second = _kv_attention(stub, moved, tactic=tactic)
    assert [x["params"] for x in second] == [x["params"] for x in first]  # same arg blocks, rewritten
    mc = moved["cache"]
    assert second[0]["args"][0] == moved["q"] and second[0]["args"][2:7] == [mc.lens, mc.k_rec, mc.v_rec, mc.k_ring,
                                                                             mc.v_ring]
    assert stub.calls["cuCtxGetCurrent"] == calls["cuCtxGetCurrent"] + 1
    assert stub.calls["cuLaunchKernel"] == calls["cuLaunchKernel"] + len(names)
    assert {k: v for k, v in stub.calls.items() if k not in ("cuCtxGetCurrent", "cuLaunchKernel")} == {
        k: v for k, v in calls.items() if k not in ("cuCtxGetCurrent", "cuLaunchKernel")}


@pytest.mark.parametrize("tactic,warps", [(ks.STREAM, 4), (ks.STREAM_FUSED, 4), (ks.WIDE_FUSED, 8),
                                          (ks.WIDE16_FUSED, 16)])
def test_sparse_kv_dense_streaming_tactics(stub, tactic, warps):
    """dense_decode_attention's tactics 1-4 launch the dense streaming kernels on the plain cache: nothing compressed
    (record capacity 1, a window over everything, record sizes 0), the cache as the ring, their own shared memory."""
    stub.seen.clear()
    ks.dense_decode_attention(64, 8, 2, 3, 700, 700, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x51,
                              tactic=tactic)
    ts, ns = ks.plan_dense(64, 8, 2, 3, 700, tactic=tactic)
    names = [x["name"] for x in stub.seen]
    assert names == ["sparse_kv_dense2_d64_g4" + ("" if warps == 4 else f"_w{warps}")] + (
        [] if tactic in ks.FUSED_TACTICS else ["sparse_kv_combine_d64"])
    attn = stub.seen[0]
    assert attn["grid"] == (ns, 2, 3) and attn["block"] == (32 * warps, 1, 1)
    assert attn["smem"] == ks.smem_bytes_dense2(64, warps) == warps * 3 * 2 * 16 * 72 * 2
    assert attn["args"][:7] == [0x1000, 0x6000, 0x4000, 0, 0, 0x2000, 0x3000]
    assert attn["args"][7:19] == [2, 4, 1, 700, 1 << 30, 1, 1, 1, 0, 0, ts, ns]
    assert attn["args"][20:] == [0x5000, 1 if tactic in ks.FUSED_TACTICS else 0]


@pytest.mark.parametrize("head_dim,sk,sv,kind", [(64, 0.7, 0.7, "attn2r"), (64, 0.734, 0.734, "attn2r"),
                                                  (64, 0.6875, 0.95, "attn2"), (64, 0.67, 0.7, "attn2"),
                                                  (64, 0.5, 0.5, "attn2"), (128, 0.9, 0.9, "attn2")])
def test_sparse_kv_register_records_choice(stub, monkeypatch, head_dim, sk, sv, kind):
    """16-warp blocks (tactic 4; tactics 1, 2 with warps=16) decode d = 64 K and V records of 48 bytes (keep 17-20)
    from registers (``sparse_kv_attn2r_*_w16``) when both arrays are 16-byte aligned; anything else is staged
    (``sparse_kv_attn2_*``) with the same arguments, grid and shared memory: 4- and 8-warp blocks, other record sizes,
    records 8 bytes off a 16-byte boundary, and REGISTER_RECORDS = False (measurements). Each is its own call shape
    (the plan cache knows the switch and the alignment)."""
    cfg = SparseKVConfig(head_dim, 8, 2, sk, sv, 2048)
    aligned = ks.CachePtrs(0x21000, 0x22000, 0x23000, 0x24000, 0x25000)
    calls = [(ks.STREAM_FUSED, None)]
    if head_dim == 64:
        calls += [(ks.WIDE_FUSED, None), (ks.WIDE16_FUSED, None), (ks.STREAM, 16), (ks.STREAM_FUSED, 16)]
    seen = {}
    for variant, cache, on in (("reg", aligned, True), ("off", aligned, False),
                               ("k8", aligned._replace(k_rec=0x21008), True),
                               ("v8", aligned._replace(v_rec=0x22008), True)):
        monkeypatch.setattr(ks, "REGISTER_RECORDS", on)
        for tactic, warps in calls:
            stub.seen.clear()
            ks.decode_attention(cfg, 3, 2000, 0x11000, cache, 0x31000, 0x40000, 0x51, tactic=tactic, warps=warps)
            seen[variant, tactic, warps] = stub.seen[0]
    monkeypatch.undo()
    for tactic, warps in calls:
        w = ks._warps(head_dim, tactic, warps)
        suffix = "" if w == 4 else f"_w{w}"
        assert ks.uses_register_records(head_dim, cfg.rk, cfg.rv, w) == (kind == "attn2r" and w == 16)
        assert not ks.uses_register_records(head_dim, cfg.rk, cfg.rv, w, aligned=False)
        assert seen["reg", tactic, warps]["name"] == f"sparse_kv_{kind if w == 16 else 'attn2'}_d{head_dim}_g4{suffix}"
        for variant in ("off", "k8", "v8"):
            staged = seen[variant, tactic, warps]
            assert staged["name"] == f"sparse_kv_attn2_d{head_dim}_g4{suffix}"
            reg = seen["reg", tactic, warps]
            assert staged["grid"] == reg["grid"] and staged["smem"] == reg["smem"]
            assert staged["args"][7:] == reg["args"][7:]


def test_sparse_kv_pipelined_records_choice(stub, monkeypatch):
    """Register-record blocks take the pipelined kernels (``sparse_kv_attn2p_*_w16``) when each warp walks at least
    PIPE_MIN_TILES_PER_WARP tiles of the split (tokens per split / 256), else the unpipelined ones
    (``sparse_kv_attn2r_*``), with the same arguments, grid and shared memory; PIPELINED_RECORDS = False keeps the
    unpipelined ones; staged records (REGISTER_RECORDS = False) are never pipelined."""
    cfg = SparseKVConfig(64, 8, 2, 0.7, 0.7, 8192)
    cache = ks.CachePtrs(0x21000, 0x22000, 0x23000, 0x24000, 0x25000)
    assert ks.PIPE_MIN_TILES_PER_WARP == 6
    for tactic, warps in ((ks.WIDE16_FUSED, None), (ks.STREAM, 16), (ks.STREAM_FUSED, 16)):
        for tiles in (1, 5, 6, 7, 32):
            seen = {}
            for variant, reg, pipe in (("pipe", True, True), ("nopipe", True, False), ("staged", False, True)):
                monkeypatch.setattr(ks, "REGISTER_RECORDS", reg)
                monkeypatch.setattr(ks, "PIPELINED_RECORDS", pipe)
                stub.seen.clear()
                ks.decode_attention(cfg, 3, 8192, 0x11000, cache, 0x31000, 0x40000, 0x51, tokens_per_split=256 * tiles,
                                    tactic=tactic, warps=warps)
                seen[variant] = stub.seen[0]
                assert ks.uses_pipelined_records(256 * tiles, 16) == (pipe and tiles >= 6)
            monkeypatch.setattr(ks, "REGISTER_RECORDS", True)
            monkeypatch.setattr(ks, "PIPELINED_RECORDS", True)
            assert seen["pipe"]["name"] == f"sparse_kv_{'attn2p' if tiles >= 6 else 'attn2r'}_d64_g4_w16"
            assert seen["nopipe"]["name"] == "sparse_kv_attn2r_d64_g4_w16"
            assert seen["staged"]["name"] == "sparse_kv_attn2_d64_g4_w16"
            for variant in ("nopipe", "staged"):
                assert seen[variant]["grid"] == seen["pipe"]["grid"] and seen[variant]["smem"] == seen["pipe"]["smem"]
                assert seen[variant]["args"][7:] == seen["pipe"]["args"][7:]


def test_sparse_kv_streaming_tactic_over_the_shared_memory_limit_is_refused(stub, monkeypatch):
    """16 warps of dense tiles need 216 KB: on a device allowing 163 KB per block (Orin) the call says so and
    launches nothing; the refused shape is not cached."""
    monkeypatch.setattr(ks, "smem_optin", lambda: 163 * 1024)
    stub.seen.clear()
    for _ in range(2):
        with pytest.raises(EdgeSDKError, match="221184 bytes of shared memory per block; this device allows 166912"):
            ks.dense_decode_attention(64, 8, 2, 3, 700, 700, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x51,
                                      tactic=ks.WIDE16_FUSED)
    assert stub.seen == []
    ks.dense_decode_attention(64, 8, 2, 3, 700, 700, 0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x51,
                              tactic=ks.WIDE_FUSED)  # 8 warps: 108 KB fits
    assert [x["name"] for x in stub.seen] == ["sparse_kv_dense2_d64_g4_w8"]


def test_sparse_kv_bad_call_raises_before_any_driver_call(stub):
    with pytest.raises(EdgeSDKError, match="8 or 16 warps"):
        ks.decode_attention(KV, 1, 256, 0, KV_PTRS["cache"], 0, 0, 0, tactic=ks.SPLIT_V1, warps=8)
    with pytest.raises(EdgeSDKError, match="max_len"):
        ks.decode_attention(KV, 1, 5000, 0, KV_PTRS["cache"], 0, 0, 0)
    assert stub.calls == {}
    assert not ks._tls.plans or all(not v for v in ks._tls.plans.values())


@pytest.mark.parametrize("S", [1, 3])
def test_sparse_kv_node_steps(stub, S):
    """run_node: S steps from one plan. S = 1: append (zeroing the merge counters) and attention on the node's
    tensors and lengths. S > 1: the step kernel (lengths, token i of q/k/v into the workspace, the previous output row
    back), append, attention on the workspace rows, then the last output row copied back; per step only the step index
    changes. The state is copied only where input and output differ."""
    d, B, ws = 64, 2, 0x900000
    q, k, v, out, lengths = 0x100000, 0x200000, 0x300000, 0x400000, 0x500000
    state_in = [0x600000, 0x610000, 0x620000, 0x630000]
    state_out = [0x600000, 0x710000, 0x620000, 0x630000]  # v_records not aliased: one copy
    tactic, nbytes = ks.node_plan(KV, B)
    assert tactic in ks.FUSED_TACTICS
    counters = ks._counter_words(B, 32)
    _, ns = ks.plan_cache(KV, B, KV.capacity, tactic=tactic)
    lens = ws + ks._up(ks.workspace_bytes(32, d, B, ns))
    q_ws = lens + ks._up(4 * B)
    o_ws = q_ws + ks._up(2 * B * 32 * d)
    k_ws = o_ws + ks._up(2 * B * 32 * d)
    v_ws = k_ws + ks._up(2 * B * 8 * d)
    assert v_ws + ks._up(2 * B * 8 * d) <= ws + nbytes
    copies = []
    stub.cuMemcpyDtoDAsync = lambda dst, src, n, stream: copies.append((dst, src, n)) or (stub._ok,)
    for rep in range(2):  # the second call reuses the plan
        stub.seen.clear()
        ks.run_node(KV, 0.125, B, S, q, k, v, state_in, state_out, lengths, out, ws, 0x51)
        seen = stub.seen
        assert len(seen) == (2 if S == 1 else 3 * S + 1)
        qi, ki, vi, oi = (q, k, v, out) if S == 1 else (q_ws, k_ws, v_ws, o_ws)
        li = lengths if S == 1 else lens  # one token: the node's lengths are the cached lengths
        for i in range(S):
            if S == 1:
                app, attn = seen
                assert app["args"][-3:] == [ws, counters, SCHED]  # zeroes the merge counters; schedules (70 %)
            else:
                prep, app, attn = seen[3 * i:3 * i + 3]
                assert prep["name"] == "sparse_kv_node_step"
                assert prep["args"] == [lengths, lens, B, ws, counters, q, k, v, out, q_ws, k_ws, v_ws, o_ws, B * 32,
                                        B * 8, d, S, i]
                assert app["args"][-3:] == [0, 0, SCHED]
            assert app["name"] == "sparse_kv_append_d64" and app["args"][:7] == [ki, vi, li, 0x600000, 0x710000,
                                                                              0x620000, 0x630000]
            # 70 %: 48-byte records, decoded from registers by 16-warp blocks (pipelined from 6 tiles per warp)
            reg = "sparse_kv_attn2p_d64" if ks.uses_pipelined_records(ks.plan_cache(KV, B, KV.capacity)[0], 16) \
                else "sparse_kv_attn2r_d64"
            assert attn["name"].startswith(reg if attn["block"][0] == 512 else "sparse_kv_attn2_d64")
            assert attn["args"][:3] == [qi, ws, li] and attn["args"][20:] == [oi, 1]
        if S > 1:
            assert seen[-1]["name"] == "sparse_kv_token_copy"
            assert seen[-1]["args"] == [o_ws, out + 2 * (S - 1) * d, B * 32, d, d, S * d]
        v_records = state_shapes(KV, B)["v_records"]
        assert STATE_DTYPES["v_records"] == "int8"
        assert copies == [(0x710000, 0x610000, int(np.prod(v_records)))] * (rep + 1)  # int8 state: 1 byte each
