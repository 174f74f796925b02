"""The sparse KV cache inside a decoder's graph: the ``EdgeSparseKVAttention`` node (format attributes, the
reference's S-step semantics, the ONNX Runtime op), ``edgesdk.rewrite.sparse_kv.sparsify_kv`` on optimum's export,
decoding the rewritten model with ``edgesdk.generate.Decoder``, and ``edgesdk kv-sparsify``.

The decoder is optimum's tiny Llama export with head_dim 64 (the kernels' smallest) and two layers
(``tests/data/optimum/llama_d64_past``, ``tools/optimum_fixtures.py``)."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

import edgesdk
from edgesdk.cli import app
from edgesdk.errors import EdgeSDKError, FormatError
from edgesdk.formats import sparse_kv as skv
from edgesdk.generate import Decoder, perplexity
from edgesdk.ort import make_session
from edgesdk.reference.sparse_kv import attention_steps, decode_attention
from edgesdk.rewrite.sparse_kv import sparsify_kv

DATA = Path(__file__).resolve().parent / "data" / "optimum"
MODEL = DATA / "llama_d64_past" / "model.onnx"
runner = CliRunner()


def _rand(rng, shape):
    return (rng.standard_normal(shape) * 2).astype(np.float16)


# ---------------------------------------------------------------- node attributes and the reference's S steps
def test_node_attributes_round_trip_and_errors():
    cfg = skv.SparseKVConfig(64, 6, 2, 0.7, 0.5, capacity=77, window=3, group=2)
    attrs = skv.node_attributes(cfg, 0.11)
    got, scale = skv.config_from_attributes({k: str(v) for k, v in attrs.items()})  # as ORT's Python ops pass them
    assert got == cfg and scale == pytest.approx(0.11)
    for bad, words in (({**attrs, "scale": 0.0}, "scale"), ({**attrs, "window": "x"}, "window"),
                       ({k: v for k, v in attrs.items() if k != "capacity"}, "capacity")):
        with pytest.raises(FormatError, match=words):
            skv.config_from_attributes(bad)
    # n_compressed(77) = 74 record slots, rounded up to whole 16-token groups: 80
    assert skv.state_shapes(cfg, 3) == {"k_records": (3, 2, 80, cfg.rk), "v_records": (3, 2, 80, cfg.rv),
                                        "k_window": (3, 2, 5, 64), "v_window": (3, 2, 5, 64)}


def _by_hand(q, k, v, cfg, before, scale):
    """float64 attention of each new token over fp16 K/V with the compressed tokens pruned, built without the
    cache: token j of sequence b is pruned for query i iff j < n_compressed(before[b] + i + 1)."""
    B, hq, S, d = q.shape
    out = np.zeros(q.shape)
    for b in range(B):
        for i in range(S):
            L = before[b] + i + 1
            nc = cfg.n_compressed(L)
            kk, vv = k[b, :, :L].copy(), v[b, :, :L].copy()
            kk[:, :nc], vv[:, :nc] = skv.prune(kk[:, :nc], cfg.keep_k), skv.prune(vv[:, :nc], cfg.keep_v)
            out[b, :, i] = decode_attention(q[b:b + 1, :, i].astype(np.float16), kk[None], vv[None], [L], scale)[0]
    return out


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.7])
def test_attention_steps_is_s_decode_steps(sparsity):
    rng = np.random.default_rng(7)
    cfg = skv.SparseKVConfig(64, 6, 2, sparsity, sparsity, capacity=40, window=3, group=2)
    before, S = np.array([0, 5, 11], np.int32), 9
    T = int(before.max()) + S
    k_all, v_all = _rand(rng, (3, 2, T, 64)), _rand(rng, (3, 2, T, 64))
    # the cache of each sequence's first before[b] tokens (ragged; prefill's bytes equal append's, tested in
    # test_sparse_kv_format), then S new tokens per sequence
    cache = skv.SparseKVCache.prefill(cfg, k_all, v_all, before)
    k_new = np.stack([k_all[b, :, before[b]:before[b] + S] for b in range(3)])
    v_new = np.stack([v_all[b, :, before[b]:before[b] + S] for b in range(3)])
    q = rng.standard_normal((3, 6, S, 64)).astype(np.float32)
    got = attention_steps(cache, q, k_new, v_new, 0.2)
    assert cache.lens.tolist() == (before + S).tolist()
    ref = np.zeros(got.shape)
    for b in range(3):
        kb = np.concatenate([k_all[b, :, :before[b]], k_new[b]], axis=1)[None]
        vb = np.concatenate([v_all[b, :, :before[b]], v_new[b]], axis=1)[None]
        ref[b:b + 1] = _by_hand(q[b:b + 1], kb, vb, cfg, [int(before[b])], 0.2)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)
    # and the cache after the call is the one the per-token appends give
    k2, v2 = cache.dense()
    for b in range(3):
        L = int(cache.lens[b])
        nc = cfg.n_compressed(L)
        kb = np.concatenate([k_all[b, :, :before[b]], k_new[b]], axis=1)
        assert np.array_equal(k2[b, :, nc:L], kb[:, nc:L])
        assert np.array_equal(k2[b, :, :nc], skv.prune(kb[:, :nc], cfg.keep_k))


# ---------------------------------------------------------------- the ONNX Runtime op
def _node_model(cfg, scale, S, dtype):
    B = "B"
    d, hq, hkv = cfg.head_dim, cfg.num_q_heads, cfg.num_kv_heads
    sh = skv.state_shapes(cfg, 1)
    st = {"k_records": TensorProto.INT8, "v_records": TensorProto.INT8, "k_window": TensorProto.FLOAT16,
          "v_window": TensorProto.FLOAT16}
    ins = [helper.make_tensor_value_info("q", dtype, [B, hq, S, d]),
           helper.make_tensor_value_info("k", dtype, [B, hkv, S, d]),
           helper.make_tensor_value_info("v", dtype, [B, hkv, S, d])]
    ins += [helper.make_tensor_value_info(f"in_{s}", st[s], [B, *sh[s][1:]]) for s in skv.STATE_NAMES]
    ins.append(helper.make_tensor_value_info("lengths", TensorProto.INT32, [B]))
    outs = [helper.make_tensor_value_info("out", dtype, [B, hq, S, d])]
    outs += [helper.make_tensor_value_info(f"out_{s}", st[s], [B, *sh[s][1:]]) for s in skv.STATE_NAMES]
    node = helper.make_node(skv.OP_TYPE, [i.name for i in ins], [o.name for o in outs], name="attn", domain="edgesdk",
                            **skv.node_attributes(cfg, scale))
    g = helper.make_graph([node], "g", ins, outs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("edgesdk", 1)])
    m.ir_version = 10
    return m


def test_ort_op_equals_the_reference_and_carries_the_state():
    rng = np.random.default_rng(3)
    cfg = skv.SparseKVConfig(64, 4, 2, 0.7, 0.5, capacity=50, window=4, group=3)
    np_dt = np.float16
    sess = make_session(_node_model(cfg, 0.125, "S", TensorProto.FLOAT16))
    ref_cache = skv.SparseKVCache.empty(cfg, 2)
    state = {f"in_{s}": np.full(shape, 0, np.int8 if skv.STATE_DTYPES[s] == "int8" else np.float16)
             for s, shape in skv.state_shapes(cfg, 2).items()}
    lens = np.zeros(2, np.int32)
    for S in (5, 1, 7, 2):  # calls of several sizes cross window and group boundaries
        q = rng.standard_normal((2, 4, S, 64)).astype(np_dt)
        k, v = _rand(rng, (2, 2, S, 64)).astype(np_dt), _rand(rng, (2, 2, S, 64)).astype(np_dt)
        lens = lens + S
        got = dict(zip([o.name for o in sess.get_outputs()],
                       sess.run(None, {"q": q, "k": k, "v": v, "lengths": lens, **state})))
        want = attention_steps(ref_cache, q, k, v, 0.125).astype(np.float16)
        assert got["out"].dtype == np_dt
        np.testing.assert_array_equal(got["out"].astype(np.float16), want)
        assert np.array_equal(got["out_k_records"].view(np.uint8), ref_cache.k_rec)
        assert np.array_equal(got["out_v_records"].view(np.uint8), ref_cache.v_rec)
        assert np.array_equal(got["out_k_window"], ref_cache.k_ring)
        assert np.array_equal(got["out_v_window"], ref_cache.v_ring)
        state = {f"in_{s}": got[f"out_{s}"] for s in skv.STATE_NAMES}
    assert ref_cache.lens.tolist() == lens.tolist() and cfg.n_compressed(int(lens[0])) > 0


def test_ort_op_takes_fp16_only():
    cfg = skv.SparseKVConfig(64, 4, 2, 0.5, 0.5, capacity=10, window=2, group=2)
    with pytest.raises(EdgeSDKError, match="not float16"):
        make_session(_node_model(cfg, 0.125, 1, TensorProto.FLOAT))


def test_ort_op_bad_call_returns_nan_and_says_why(capfd):
    cfg = skv.SparseKVConfig(64, 4, 2, 0.5, 0.5, capacity=10, window=2, group=2)
    sess = make_session(_node_model(cfg, 0.125, 1, TensorProto.FLOAT16))
    state = {f"in_{s}": np.zeros(shape, np.int8 if skv.STATE_DTYPES[s] == "int8" else np.float16)
             for s, shape in skv.state_shapes(cfg, 1).items()}
    x = np.ones((1, 4, 1, 64), np.float16)
    kv = np.ones((1, 2, 1, 64), np.float16)
    for lens, words in ((np.array([0], np.int32), "lengths"), (np.array([11], np.int32), "capacity")):
        out = sess.run(["out"], {"q": x, "k": kv, "v": kv, "lengths": lens, **state})[0]
        assert np.isnan(out).all()
        assert words in capfd.readouterr().err


# ---------------------------------------------------------------- the rewrite of optimum's export
@pytest.fixture(scope="module")
def source():
    return onnx.load(str(MODEL))


@pytest.fixture(scope="module")
def rewritten(source, tmp_path_factory):
    out = {}
    for s in (0.0, 0.5, 0.7):
        m, layers, cfg = sparsify_kv(source, s, capacity=60, window=4, group=4)
        path = tmp_path_factory.mktemp("kv") / f"m{s}.onnx"
        onnx.save(m, str(path))
        out[s] = (path, layers, cfg)
    return out


def test_rewrite_structure(rewritten):
    path, layers, cfg = rewritten[0.7]
    m = onnx.load(str(path))
    nodes = [n for n in m.graph.node if n.op_type == skv.OP_TYPE]
    assert len(nodes) == 2 and [lay.layer for lay in layers] == [0, 1]
    assert all(lay.scale == pytest.approx(0.125, rel=1e-6) for lay in layers)
    assert (cfg.head_dim, cfg.num_q_heads, cfg.num_kv_heads, cfg.keep_k) == (64, 4, 2, 19)
    names = [i.name for i in m.graph.input]
    assert "attention_mask" not in names and not any(n.startswith("past_key_values") for n in names)
    assert names[:3] == ["input_ids", "position_ids", skv.LENGTHS_INPUT]
    ins, outs = skv.state_io_names(1)
    assert set(ins) <= set(names) and set(outs) <= {o.name for o in m.graph.output}
    assert not any(o.name.startswith("present.") for o in m.graph.output)
    # a float32 model: the node reads q, k, v and writes its output in fp16, through Casts
    casts = {o for n in m.graph.node if n.op_type == "Cast" and n.name.startswith("/sparse_kv/") for o in n.output}
    assert len(casts) == 8 and all(n.input[i] in casts for n in nodes for i in range(3)) and nodes[0].output[0] in {
        i for n in m.graph.node if n.op_type == "Cast" for i in n.input}
    onnx.checker.check_model(m)


def _ids(n, seed=0):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 64, n)]


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.7])
def test_rewritten_model_decodes_as_the_emulated_cache(rewritten, sparsity):
    """The node's cache (real records) gives the logits of the dense model whose cache is pruned the same way
    (Decoder(kv_sparsity), an independent path: the model's own attention on numpy-pruned rows); sparsity 0 is the
    original model up to the fp16 cache."""
    ids = _ids(50)
    with edgesdk.Engine(rewritten[sparsity][0], backend="onnxruntime") as e:
        got = Decoder(e).feed(ids)
        got7 = Decoder(e).feed(ids, chunk=7)
    with edgesdk.Engine(MODEL, backend="onnxruntime") as e:
        emulated = Decoder(e, kv_sparsity=sparsity, window=4, group=4).feed(ids, chunk=1)
        dense = Decoder(e).feed(ids)
    # S tokens in one call = S steps (the node is exact; the model's MatMuls of 7 rows may round differently from
    # those of 1 on some ONNX Runtime versions: 6e-8 on 1.18)
    np.testing.assert_allclose(got, got7, rtol=0, atol=1e-6 * np.abs(got).max())
    np.testing.assert_allclose(got, emulated, rtol=0, atol=3e-4 * np.abs(emulated).max())
    if sparsity == 0.0:
        np.testing.assert_allclose(got, dense, rtol=0, atol=1e-3 * np.abs(dense).max())
    else:
        assert np.abs(got - dense).max() > 1e-2 * np.abs(dense).max()  # pruning is visible


def test_rewritten_model_generates_until_the_capacity(rewritten):
    with edgesdk.Engine(rewritten[0.5][0], backend="onnxruntime") as e:
        dec = Decoder(e)
        assert dec.layout.max_cache == 59 and dec.layout.sparse_kv["capacity"] == 60
        out = dec.generate(_ids(10), max_new_tokens=100)
        assert out.stopped == "cache_full" and len(out.tokens) == 51
        with pytest.raises(EdgeSDKError, match="already holds its KV cache sparse"):
            Decoder(e, kv_sparsity=0.5)
        r = perplexity(e, _ids(80, 1), context=40)
        assert r["kv_model"]["k_sparsity"] == 0.5 and r["scored"] == 78


def test_rewrite_refuses_what_the_node_cannot_compute(source, tmp_path):
    with pytest.raises(EdgeSDKError, match="head_dim 8"):
        sparsify_kv(onnx.load(str(DATA / "llama_past" / "model.onnx")), 0.5, capacity=64)
    with pytest.raises(EdgeSDKError, match="no past_key_values"):
        sparsify_kv(onnx.load(str(DATA / "llama" / "model.onnx")), 0.5, capacity=64)
    with pytest.raises(EdgeSDKError, match="outside"):
        sparsify_kv(source, 1.0, capacity=64)
    # a soft-cap (tanh) on the scores of layer 1
    m = onnx.ModelProto()
    m.CopyFrom(source)
    sm = next(n for n in m.graph.node if n.op_type == "Softmax" and "layers.1" in n.name)
    sm.input[0], old = "capped", sm.input[0]
    m.graph.node.append(helper.make_node("Tanh", [old], ["capped"], name="softcap"))
    with pytest.raises(EdgeSDKError, match="layer 1: Tanh"):
        sparsify_kv(m, 0.5, capacity=64)
    # an ALiBi-like bias (per-head float slopes) added to the mask of layer 0
    m = onnx.ModelProto()
    m.CopyFrom(source)
    add = next(n for n in m.graph.node if n.op_type == "Softmax" and "layers.0" in n.name)
    add = next(n for n in m.graph.node if add.input[0] in n.output)
    assert add.op_type == "Add"
    m.graph.initializer.append(helper.make_tensor("slopes", TensorProto.FLOAT, [1, 4, 1, 1], [-0.5, -0.25, -0.125, -0.0625]))
    m.graph.node.append(helper.make_node("Add", [add.input[1], "slopes"], ["biased"], name="alibi"))
    add.input[1] = "biased"
    with pytest.raises(EdgeSDKError, match="layer 0: the scores get an additive term built from a float constant of 4"):
        sparsify_kv(m, 0.5, capacity=64)


# ---------------------------------------------------------------- edgesdk kv-sparsify
def test_cli_kv_sparsify(tmp_path):
    out = tmp_path / "kv" / "m.onnx"
    r = runner.invoke(app, ["kv-sparsify", str(MODEL), "-o", str(out), "--sparsity", "0.7", "--v-sparsity", "0.5",
                            "--capacity", "64", "--window", "4", "--group", "4"])
    assert r.exit_code == 0, r.output
    assert "2 attention layers" in r.output and "19 of 64 kept" in r.output and "V 50%" in r.output
    m = onnx.load(str(out))
    assert {p.key: p.value for p in m.metadata_props}["edgesdk.source_model"] == str(MODEL.resolve())
    toks = tmp_path / "t.txt"
    toks.write_text(" ".join(map(str, _ids(70))))
    r = runner.invoke(app, ["perplexity", str(out), "--tokens", str(toks), "--context", "30", "--backend",
                            "onnxruntime", "--reference", str(MODEL), "--kv-sparsity", "0.7"])
    assert r.exit_code == 0, r.output
    assert "K 70% V 50% sparse (model)" in r.output and "70% sparse" in r.output


@pytest.mark.parametrize("args, words", [
    (["-o", "{tmp}/m.txt", "--sparsity", "0.5"], "is not an edgesdk build folder"),
    (["-o", str(MODEL), "--sparsity", "0.5"], "is the source model"),
    (["-o", "{tmp}/m.onnx", "--sparsity", "1.5"], "outside"),
    (["-o", "{tmp}/m.onnx", "--sparsity", "0.5", "--capacity", "0"], "--capacity"),
])
def test_cli_kv_sparsify_errors(tmp_path, args, words):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = runner.invoke(app, ["kv-sparsify", str(MODEL), *args])
    assert r.exit_code == 1 and words in r.output, r.output
    assert not list(tmp_path.glob("*.onnx"))


# ---------------------------------------------------------------- the TensorRT plugin's decisions (no TensorRT)
def test_trt_plugin_logic():
    from edgesdk.trt import sparse_kv as tk

    cfg = skv.SparseKVConfig(64, 6, 2, 0.7, 0.5, capacity=77, window=3, group=2)
    attrs = skv.node_attributes(cfg, 0.125)
    assert [tk.aliased_input(i) for i in range(5)] == [-1, 3, 4, 5, 6]
    dts = list(tk.IN_DTYPES + tk.OUT_DTYPES)
    fm = ["LINEAR"] * len(dts)
    assert all(tk.supports_format(p, dts, fm) for p in range(len(dts)))
    assert not tk.supports_format(0, ["float32"], ["LINEAR"]) and not tk.supports_format(3, dts, fm[:3] + ["CHW32"])
    dims = [(2, 6, 5, 64), (2, 2, 5, 64), (2, 2, 5, 64), *(skv.state_shapes(cfg, 2)[s] for s in skv.STATE_NAMES), (2,)]
    assert tk.check_dims(attrs, dims) == (2, 5)
    assert tk.output_dims(dims) == [dims[0], *dims[3:7]]
    bad = list(dims)
    bad[4] = (2, 2, 10, cfg.rv)
    with pytest.raises(EdgeSDKError, match="v_records has dims"):
        tk.check_dims(attrs, bad)
    with pytest.raises(EdgeSDKError, match="takes 8 inputs"):
        tk.check_dims(attrs, dims[:7])
    from edgesdk.kernels import sparse_kv as ks

    # the scratch covers every batch up to the largest, whichever splits most (132 SMs: an H100's count)
    need = [ks.node_plan(cfg, b, 132)[1] for b in range(1, 9)]
    assert tk.workspace_bytes(attrs, 8, 132) == max(need) and tk.workspace_bytes(attrs, 1, 132) == need[0]
    fields = tk.encode_fields(attrs)
    assert {n for n, _, _ in fields} == set(skv.ATTRIBUTES)
    back = tk.attrs_from_fields([(n, d) for n, d, _ in fields] + [("plugin_version", b"1")])
    assert skv.config_from_attributes(back) == (cfg, pytest.approx(0.125))
    with pytest.raises(FormatError, match="capacity"):
        tk.attrs_from_fields([(n, d) for n, d, _ in fields if n != "capacity"])


def test_trt_plugin_classes():
    pytest.importorskip("tensorrt", reason="TensorRT cannot be installed on this project's machines")
    from edgesdk.trt import sparse_kv as tk

    plugin, creator = tk.plugin_classes()
    assert creator().name == skv.OP_TYPE and plugin().num_outputs == 5


# ---------------------------------------------------------------- edgesdk kv-sparsify BUILD -o FOLDER
@pytest.fixture(scope="module")
def source_build(tmp_path_factory):
    """The test decoder built (INT8, plain ONNX ops) with a profile of 0..63 cached tokens, one new token per call."""
    from edgesdk.build import build
    from edgesdk.config import BuildConfig

    out = tmp_path_factory.mktemp("src") / "llm"
    build(MODEL, BuildConfig(output=out, kernels="none", calibration_count=2, verify_count=1,
                             shape_hints={"input_ids": [1, 1], "past_key_values.0.key": [1, 2, 15, 64]},
                             min_shapes={"past_key_values.0.key": [1, 2, 0, 64]},
                             max_shapes={"past_key_values.0.key": [1, 2, 63, 64]}))
    return out


def test_kv_profile_of_the_rewritten_decoder(rewritten):
    from edgesdk.kv_build import kv_profile

    prof = kv_profile(onnx.load(str(rewritten[0.5][0])), (1, 2, 4), 8)
    assert prof["input_ids"] == {"min": [1, 1], "opt": [2, 1], "max": [4, 8]} == prof["position_ids"]
    assert prof[skv.LENGTHS_INPUT] == {"min": [1], "opt": [2], "max": [4]}
    rec = prof["past_sparse_kv.1.k_records"]
    assert rec["min"][1:] == rec["max"][1:] and (rec["min"][0], rec["max"][0]) == (1, 4)


def test_kv_folder(source_build, tmp_path):
    """A build folder from a build folder: the rewritten model verified against the source build with its cache
    pruned the same way (gating) and its dense cache (cost); Engine, Decoder and `check` take it."""
    from edgesdk.build import check_build
    from edgesdk.config import BuildConfig
    from edgesdk.kv_build import kv_build

    out = tmp_path / "kv"
    r = kv_build(source_build, out, 0.7, window=4, group=4, max_tokens=8)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.onnx", "report.json"]
    assert not list(tmp_path.glob(".*"))  # no temp folder left
    assert r["kind"] == "kv-sparsify" and r["verified"] is True and not r["engine"]["built"]
    sk = r["sparse_kv"]
    assert (sk["capacity"], sk["window"], sk["group"], sk["max_tokens"], sk["verify_tokens"]) == (64, 4, 4, 8, 16)
    gate, cost = r["verify"]
    assert (gate["against"], gate["gate"], gate["passed"], gate["tokens"]) == ("kv_emulated", True, True, 16)
    assert (cost["against"], cost["gate"]) == ("source", False)
    assert gate["cosine"] > 0.9999 and cost["max_abs"] > 10 * gate["max_abs"]  # pruning shows; the rewrite does not
    assert r["model"]["profile"]["input_ids"] == {"min": [1, 1], "opt": [1, 1], "max": [1, 8]}
    with edgesdk.Engine(out, backend="onnxruntime") as e:
        dec = Decoder(e)
        assert dec.layout.new_range == (1, 8) and dec.layout.max_cache == 63
        with pytest.raises(EdgeSDKError, match="outside the build's optimization profile"):
            e.infer({**dec._cache, "input_ids": np.zeros((1, 9), np.int64), "position_ids": np.zeros((1, 9), np.int64),
                     skv.LENGTHS_INPUT: np.array([9], np.int32)})
        assert dec.generate(_ids(5), max_new_tokens=100).stopped == "cache_full"
    rows = check_build(out)
    assert [(x["against"], x["passed"]) for x in rows] == [("kv_emulated", True), ("source", False)]
    assert rows[0]["max_abs"] == gate["max_abs"]
    # the gate can fail: at tolerances the rewrite meets, emulating another sparsity than the model's does not
    from edgesdk.kv_build import verify_kv

    tight = BuildConfig(atol=2e-3, rtol=2e-3, min_cosine=0.9999)
    right = {k: r["sparse_kv"][k] for k in ("window", "group", "max_tokens", "k_sparsity", "v_sparsity")}
    ok, _ = verify_kv(out / "model.onnx", source_build / "model.onnx", right, _ids(24, 3), tight)
    bad, _ = verify_kv(out / "model.onnx", source_build / "model.onnx", {**right, "k_sparsity": 0.0, "v_sparsity": 0.0},
                       _ids(24, 3), tight)
    assert ok[0]["passed"] and bad[0]["gate"] and not bad[0]["passed"], (ok[0], bad[0])
    # the source build changed: check refuses
    (source_build / "model.onnx").rename(source_build / "moved.onnx")
    try:
        with pytest.raises(EdgeSDKError, match="not there any more"):
            check_build(out)
    finally:
        (source_build / "moved.onnx").rename(source_build / "model.onnx")


def test_kv_folder_records_the_engine_feeds(source_build, tmp_path):
    """The feeds kept for TensorRT's comparison: the first call (prompt from an empty cache) and the last."""
    from edgesdk.config import BuildConfig
    from edgesdk.kv_build import kv_build, verify_kv

    out = tmp_path / "kv"
    kv_build(source_build, out, 0.5, window=4, group=4, max_tokens=8, verify=False)
    policy = {"k_sparsity": 0.5, "v_sparsity": 0.5, "window": 4, "group": 4, "max_tokens": 8}
    rows, fed = verify_kv(out / "model.onnx", source_build / "model.onnx", policy, _ids(20, 5), BuildConfig())
    assert len(rows) == 2 and len(fed) == 2
    assert fed[0]["input_ids"].shape == (1, 8) and fed[0][skv.LENGTHS_INPUT].tolist() == [8]
    assert not fed[0]["past_sparse_kv.0.k_window"].any()  # empty cache
    assert fed[1]["input_ids"].shape == (1, 4) and fed[1][skv.LENGTHS_INPUT].tolist() == [20]
    assert fed[1]["past_sparse_kv.0.k_records"].any()
    big = kv_build(source_build, tmp_path / "big", 0.5, capacity=128, verify=False)
    assert big["sparse_kv"]["capacity"] == 128 and any("exceeds the 64 tokens" in n for n in big["notes"])


def test_random_inputs_of_a_kv_folder_are_an_empty_cache(source_build, tmp_path):
    """`edgesdk run`/`bench` fill inputs at random: not the cache state (a kernel given random records and lengths
    computes nothing meaningful), which starts empty, with kv_lengths = the new tokens."""
    from edgesdk.kv_build import kv_build
    from edgesdk.runtime_cli import random_inputs

    kv_build(source_build, tmp_path / "kv", 0.5, window=4, group=4, max_tokens=8, verify=False)
    with edgesdk.Engine(tmp_path / "kv", backend="onnxruntime") as e:
        feeds = random_inputs(e.inputs, 1, {"input_ids": (1, 6), "position_ids": (1, 6)}, seed=3)
        assert feeds[skv.LENGTHS_INPUT].tolist() == [6] and feeds["position_ids"].tolist() == [list(range(6))]
        assert not any(feeds[n].any() for n in feeds if n.startswith("past_sparse_kv."))
        assert np.isfinite(e.infer(feeds)["logits"]).all()
    r = runner.invoke(app, ["bench", str(tmp_path / "kv"), "--backend", "onnxruntime", "--iterations", "2"])
    assert r.exit_code == 0, r.output


def test_cli_kv_folder(source_build, tmp_path):
    out = tmp_path / "kv"
    args = ["kv-sparsify", str(source_build), "-o", str(out), "--sparsity", "0.7", "--window", "4", "--group", "4"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    # the notes wrap at the terminal's width, where the temporary path's length puts the breaks: compare words
    words = " ".join(r.output.split())
    assert "source, KV" in words and "(cost)" in words and "capacity 64 tokens" in words, r.output
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and "already exists" in r.output
    # a tolerance no model meets: the folder is written, exit 2, the failing row named
    r = runner.invoke(app, [*args, "--force", "--min-cosine", "1.0"])
    assert r.exit_code == 2 and (out / "report.json").is_file(), r.output
    assert "FAIL logits (processed vs source, KV pruned alike)" in r.output and "INT8 build" in r.output
    r = runner.invoke(app, ["check", str(out)])
    assert r.exit_code == 2, r.output
    r = runner.invoke(app, ["check", str(out), "--min-cosine", "0.99"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("src, args, words", [
    ("model", ["--sparsity", "0.5"], "is not an edgesdk build folder"),
    ("build", ["--sparsity", "0.5", "--max-tokens", "65"], "--max-tokens 65"),
    ("build", ["--sparsity", "0.5", "--verify-tokens", "1"], "--verify-tokens 1"),
    ("build", ["--sparsity", "0.5", "--capacity", "128", "--verify-tokens", "100"], "63 cached + 1"),
    ("build", ["--sparsity", "0.5", "--capacity", "0"], "--capacity"),
    ("build", ["--sparsity", "1.5"], "outside"),
])
def test_cli_kv_folder_errors(source_build, tmp_path, src, args, words):
    r = runner.invoke(app, ["kv-sparsify", str(MODEL if src == "model" else source_build), "-o", str(tmp_path / "kv"),
                            *args])
    assert r.exit_code == 1 and words in r.output, r.output
    assert not list(tmp_path.iterdir())  # nothing left behind


def test_cli_kv_folder_of_a_kv_folder(source_build, tmp_path):
    from edgesdk.build import check_build
    from edgesdk.kv_build import kv_build

    r = kv_build(source_build, tmp_path / "kv", 0.5, window=4, group=4, verify=False)
    assert r["verify"] == [] and r["sparse_kv"]["verify_tokens"] is None
    rows = check_build(tmp_path / "kv")  # check verifies a folder built with --no-verify (default length)
    assert [(x["against"], x["gate"], x["tokens"]) for x in rows] == [("kv_emulated", True, 16), ("source", False, 16)]
    assert rows[0]["passed"]
    r = runner.invoke(app, ["kv-sparsify", str(tmp_path / "kv"), "-o", str(tmp_path / "kv2"), "--sparsity", "0.5"])
    assert r.exit_code == 1 and "already runs its attention on the sparse KV cache" in r.output, r.output


def test_decoder_emulates_k_and_v_sparsities_apart():
    from edgesdk.generate import _share

    assert _share("past_key_values.3.key", (0.7, 0.5)) == 0.7 and _share("past_key_values.3.value", (0.7, 0.5)) == 0.5
    assert _share("whatever", 0.3) == 0.3
    with pytest.raises(EdgeSDKError, match="keys or values"):
        _share("past.3.k", (0.7, 0.5))


# ---------------------------------------------------------------- dense prefill into the sparse cache (MUSTAFAR's)
def test_dense_prefill_then_sparse_decode(rewritten):
    """Decoder(prefill=dense): the prompt's logits are the dense model's, its cache is compressed into the state, and
    the decode steps after it equal the emulation with the prompt in one (dense) call and the cache pruned after."""
    ids, p = _ids(30, 4), 20
    with edgesdk.Engine(rewritten[0.7][0], backend="onnxruntime") as kv, \
            edgesdk.Engine(MODEL, backend="onnxruntime") as src:
        dec = Decoder(kv, prefill=src)
        first = dec.prefill(ids[:p])
        assert dec.length == p
        got = np.stack([dec.step([t])[-1] for t in ids[p:]])
        np.testing.assert_array_equal(first, Decoder(src).feed(ids[:p]))
        emu = Decoder(src, kv_sparsity=0.7, window=4, group=4)
        emu.feed(ids[:p], chunk=p)
        want = np.stack([emu.step([t])[-1] for t in ids[p:]])
        np.testing.assert_allclose(got, want, rtol=0, atol=3e-4 * np.abs(want).max())
        steps = Decoder(kv).feed(ids)[p:]  # the prompt as decode steps is another function
        assert np.abs(steps - got).max() > 1e-2 * np.abs(want).max()
        out = Decoder(kv, prefill=src).generate(ids[:p], max_new_tokens=3)
        assert out.tokens[0] == int(np.argmax(first[-1]))
        with pytest.raises(EdgeSDKError, match="holds 60"):
            dec.prefill(_ids(61))
        with pytest.raises(EdgeSDKError, match="holds a dense cache"):
            Decoder(src, prefill=src)
        with pytest.raises(EdgeSDKError, match="no dense prefill engine"):
            Decoder(kv).prefill(ids)
    with edgesdk.Engine(rewritten[0.7][0], backend="onnxruntime") as kv, \
            edgesdk.Engine(DATA / "llama_past" / "model.onnx", backend="onnxruntime") as other:
        with pytest.raises(EdgeSDKError, match="is not the prefill model's cache"):
            Decoder(kv, prefill=other)


def test_cli_generate_with_dense_prefill(rewritten):
    r = runner.invoke(app, ["generate", str(rewritten[0.5][0]), "--prompt-ids", " ".join(map(str, _ids(12))),
                            "--max-new-tokens", "4", "--backend", "onnxruntime", "--prefill", str(MODEL),
                            "--reference", str(MODEL)])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert f"prompt prefilled densely by {MODEL}" in text and "agree on the first" in text
