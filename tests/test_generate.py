"""Decoding with a decoder-with-cache build: ``edgesdk.generate`` (Decoder, greedy generation, perplexity, the
sparse_kv cache emulation) and the ``edgesdk generate`` / ``edgesdk perplexity`` commands.

The model is optimum's tiny Llama export with its KV cache (``tests/data/optimum/llama_past``: one layer, 2 KV
heads of 8 channels, a vocabulary of 64; ``tools/optimum_fixtures.py``). With one layer, the cached K and V of a
token depend on that token and its position only, so a pruned cache can be checked row by row against the dense
one."""

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

import edgesdk
from edgesdk.build import build
from edgesdk.cli import app
from edgesdk.config import BuildConfig
from edgesdk.errors import EdgeSDKError
from edgesdk.formats import sparse_kv as skv
from edgesdk.generate import Decoder, decoder_layout, perplexity

MODEL = Path(__file__).resolve().parent / "data" / "optimum" / "llama_past" / "model.onnx"
PAST = ["past_key_values.0.key", "past_key_values.0.value"]
runner = CliRunner()


def _ids(n, seed=0):
    return np.random.default_rng(seed).integers(0, 64, n)


def _prefill_logits(ids):
    """All logits of ``ids`` from one ONNX Runtime call with an empty cache (independent of Decoder)."""
    sess = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    n = len(ids)
    feeds = {"input_ids": np.asarray(ids, np.int64)[None], "attention_mask": np.ones((1, n), np.int64),
             "position_ids": np.arange(n, dtype=np.int64)[None]}
    for p in PAST:
        feeds[p] = np.zeros((1, 2, 0, 8), np.float32)
    return sess.run(["logits"], feeds)[0][0].astype(np.float64)


@pytest.fixture(scope="module")
def bare():
    with edgesdk.Engine(MODEL, backend="onnxruntime") as e:
        yield e


@pytest.fixture(scope="module")
def past_build(tmp_path_factory):
    """INT8 build for one new token per call after 0..95 cached."""
    out = tmp_path_factory.mktemp("g") / "llama_past"
    cfg = BuildConfig(output=out, kernels="none", shape_hints=["input_ids:1x1", f"{PAST[0]}:1x2x31x8"],
                      min_shapes=[f"{PAST[0]}:1x2x0x8"], max_shapes=[f"{PAST[0]}:1x2x95x8"], verify_count=2,
                      calibration_count=4)
    build(MODEL, cfg)
    return out


def test_layout_of_an_optimum_export(bare):
    lay = decoder_layout(bare)
    assert (lay.tokens, lay.mask, lay.positions, lay.logits) == ("input_ids", "attention_mask", "position_ids",
                                                                "logits")
    assert lay.cache == (("past_key_values.0.key", "present.0.key", 2), ("past_key_values.0.value", "present.0.value", 2))
    assert lay.new_range == (1, None) and lay.max_cache is None  # a bare .onnx has no profile


@pytest.mark.parametrize("chunk", [1, 7, None])
def test_cache_fed_back_equals_one_prefill(bare, chunk):
    ids = _ids(61)
    ref = _prefill_logits(ids)
    dec = Decoder(bare)
    got = np.concatenate([dec.feed(ids[:20], chunk), dec.feed(ids[20:], chunk)])  # two feeds: the cache carries over
    assert dec.length == 61
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_perplexity_against_float64(bare):
    ids = _ids(157, seed=3)
    context = 50
    nll = []
    for w in range(3):  # 157 tokens make 3 windows of 50; the last 7 are not scored
        win = ids[w * context:(w + 1) * context]
        logits = _prefill_logits(win)[:-1]
        logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        nll.extend(-logp[np.arange(context - 1), win[1:]])
    r = Decoder(bare).perplexity(ids, context=context, chunk=1)
    assert (r["windows"], r["scored"], r["context"]) == (3, 147, 50)
    assert r["perplexity"] == pytest.approx(np.exp(np.mean(nll)), rel=1e-6)
    assert r["perplexity"] > 10  # random weights: far from certain
    assert Decoder(bare).perplexity(ids, context=context, windows=1)["scored"] == 49


def test_generate_is_greedy_over_the_fed_back_cache(bare):
    prompt = [1, 2, 3]
    out = Decoder(bare).generate(prompt, max_new_tokens=12)
    assert out.stopped == "length" and len(out.tokens) == 12
    seq = list(prompt)
    for t in out.tokens:  # each token is the argmax after all before it, by a full prefill each time
        assert t == int(np.argmax(_prefill_logits(seq)[-1]))
        seq.append(t)
    first = out.tokens[0]
    stop = Decoder(bare).generate(prompt, max_new_tokens=12, eos=[first])
    assert stop == ([first], "eos")


@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.7])
def test_kv_sparsity_holds_the_cache_as_sparse_kv(bare, sparsity):
    ids = _ids(45, seed=5)
    dense = Decoder(bare)
    dense.feed(ids)
    sparse = Decoder(bare, kv_sparsity=sparsity, window=8, group=4)
    sparse.feed(ids)
    comp = skv.n_compressed(45, 8, 4)
    assert comp == 36
    keep = skv.keep_count(8, sparsity)
    for p in PAST:
        d, s = dense._cache[p][0], sparse._cache[p][0]  # [heads, tokens, head_dim]
        np.testing.assert_array_equal(s[:, comp:], d[:, comp:].astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(s[:, :comp], skv.prune(d[:, :comp], keep).astype(np.float32))
        assert ((s[:, :comp] != 0).sum(-1) == keep).all()
    if sparsity == 0.0:  # the fp16 cache alone
        a = Decoder(bare).perplexity(ids, context=45)["perplexity"]
        b = Decoder(bare, kv_sparsity=0.0).perplexity(ids, context=45)["perplexity"]
        assert b == pytest.approx(a, rel=1e-3)


def test_kv_sparsity_prunes_before_the_step_that_appends(bare):
    """The kernel appends a token (compressing a group once the window holds window + group) and then attends: the
    step that brings the length to 12 (window 8, group 4) already sees tokens 0..3 pruned."""
    ids = _ids(12, seed=9)
    dense = Decoder(bare)
    dense.feed(ids[:11], chunk=1)  # the same calls as under KV sparsity: the same float32 K and V
    dec = Decoder(bare, kv_sparsity=0.7, window=8, group=4)
    dec.feed(ids[:11])
    assert dec._compressed == 0  # n_compressed(11) = 0
    keep = skv.keep_count(8, 0.7)
    feeds = {"input_ids": np.array([[ids[11]]], np.int64), "attention_mask": np.ones((1, 12), np.int64),
             "position_ids": np.array([[11]], np.int64)}
    for p in PAST:
        c = dense._cache[p].astype(np.float16)
        c[:, :, :4] = skv.prune(c[:, :, :4], keep)
        feeds[p] = c.astype(np.float32)
    want = bare.infer(feeds)["logits"][0, -1]  # the same session: the same float32 arithmetic
    np.testing.assert_array_equal(dec.step([int(ids[11])])[-1], want)
    assert dec._compressed == 4


def test_kv_sparsity_scores_as_a_token_by_token_decode(bare):
    """Under KV sparsity each query sees the cache a decode would hold at that point: the 45th token's logits
    equal one step after 44 tokens fed one by one, and differ from a dense cache's once tokens are pruned."""
    ids = _ids(45, seed=8)
    dec = Decoder(bare, kv_sparsity=0.7, window=8, group=4)
    last = dec.feed(ids)[-1]
    again = Decoder(bare, kv_sparsity=0.7, window=8, group=4)
    for t in ids[:-1]:
        again.step([int(t)])
    np.testing.assert_array_equal(again.step([int(ids[-1])])[-1], last)
    assert np.abs(last - _prefill_logits(ids)[-1]).max() > 1e-3


def test_the_build_profile_bounds_decoding(past_build):
    with edgesdk.Engine(past_build, backend="onnxruntime") as e:
        dec = Decoder(e)
        assert dec.layout.new_range == (1, 1) and dec.layout.max_cache == 95
        out = dec.generate([1, 2, 3], max_new_tokens=500)
        assert out.stopped == "cache_full" and len(out.tokens) == 94 and dec.length == 96  # 95 cached + 1 new
        r = dec.perplexity(_ids(300), windows=2)
        assert (r["context"], r["scored"]) == (96, 190)
        with pytest.raises(EdgeSDKError) as err:
            dec.perplexity(_ids(300), context=97)
        assert "2 .. 96" in err.value.fix
        dec.reset()
        with pytest.raises(EdgeSDKError) as err:
            dec.feed(_ids(97))
        assert "at most 95" in err.value.problem and dec.length == 0  # refused before any call
        with pytest.raises(EdgeSDKError) as err:
            dec.step([1, 2])
        assert "1 to 1" in err.value.problem
        with pytest.raises(EdgeSDKError):
            dec.generate([], 4)


def test_a_profile_without_an_empty_cache(tmp_path):
    out = tmp_path / "b"
    cfg = BuildConfig(output=out, quantize="none", kernels="none", shape_hints=["input_ids:1x1", f"{PAST[0]}:1x2x31x8"],
                      min_shapes=[f"{PAST[0]}:1x2x4x8"], max_shapes=[f"{PAST[0]}:1x2x63x8"], verify_count=1)
    build(MODEL, cfg)
    with edgesdk.Engine(out, backend="onnxruntime") as e:
        with pytest.raises(EdgeSDKError) as err:
            Decoder(e)
    assert "at least 4 cached" in err.value.problem and "x0x" in err.value.fix


def test_perplexity_without_a_cache(bare, tmp_path):
    """A causal LM exported without its cache (optimum's text-generation task) scores each window in one call: the
    same figure as the decoder with its cache, which has the same weights (one tiny-random-Llama checkpoint)."""
    plain = MODEL.parent.parent / "llama" / "model.onnx"
    ids = _ids(130, seed=4)
    want = Decoder(bare).perplexity(ids, context=40)
    with edgesdk.Engine(plain, backend="onnxruntime") as e:
        got = perplexity(e, ids, context=40)
        assert (got["scored"], got["windows"]) == (117, 3)
        assert got["perplexity"] == pytest.approx(want["perplexity"], rel=1e-5)
        with pytest.raises(EdgeSDKError) as err:
            perplexity(e, ids, context=40, kv_sparsity=0.5)
        assert "no KV cache" in err.value.problem
        with pytest.raises(EdgeSDKError) as err:
            perplexity(e, ids)
        assert "--context" in err.value.fix
    vit = Path(__file__).resolve().parents[1] / "models" / "digits_vit.onnx"
    with edgesdk.Engine(vit, backend="onnxruntime") as e:
        with pytest.raises(EdgeSDKError) as err:
            perplexity(e, ids, context=40)
    assert "not a causal language model" in err.value.problem


def test_not_a_decoder_with_a_cache():
    with edgesdk.Engine(MODEL.parent.parent / "llama" / "model.onnx", backend="onnxruntime") as e:
        with pytest.raises(EdgeSDKError) as err:
            Decoder(e)
    assert "past_key_values" in err.value.problem and "text-generation-with-past" in err.value.fix


def test_cli_generate_and_perplexity(past_build, tmp_path):
    res = runner.invoke(app, ["generate", str(past_build), "--prompt-ids", "1 2 3", "--max-new-tokens", "5",
                              "--backend", "onnxruntime", "--reference", str(MODEL)])
    assert res.exit_code == 0, res.output
    with edgesdk.Engine(past_build, backend="onnxruntime") as e:
        want = Decoder(e).generate([1, 2, 3], 5).tokens
    assert " ".join(map(str, want)) in res.output and "agree on the first" in res.output
    (tmp_path / "ids.txt").write_text(" ".join(map(str, _ids(400))))
    res = runner.invoke(app, ["perplexity", str(past_build), "--tokens", str(tmp_path / "ids.txt"), "--windows", "2",
                              "--skip", "10", "--kv-sparsity", "0.5", "--kv-window", "8", "--backend", "onnxruntime",
                              "--reference", str(MODEL), "--json", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert [(r["model"], r["kv_sparsity"]) for r in rows] == [("build", None), ("build", 0.5), ("reference", None),
                                                              ("reference", 0.5)]
    assert all(r["context"] == 96 and r["scored"] == 190 for r in rows)  # the reference scores the build's windows
    with edgesdk.Engine(past_build, backend="onnxruntime") as e:
        assert rows[0]["perplexity"] == pytest.approx(Decoder(e).perplexity(_ids(400)[10:], windows=2)["perplexity"])
    assert rows[2]["perplexity"] != rows[0]["perplexity"]  # INT8 vs float


@pytest.mark.parametrize("args, words", [
    (["generate", "{b}", "--prompt", "hi", "--prompt-ids", "1"], "give the prompt once"),
    (["generate", "{b}", "--prompt", "hi"], "no tokenizer.json"),
    (["generate", "{b}", "--prompt-ids", "1 x"], "integer token ids"),
    (["generate", "{b}", "--prompt-ids", "1 -2"], "negative token ids"),
    (["generate", "{b}", "--prompt-ids", "1", "--max-new-tokens", "0"], "--max-new-tokens 0"),
    (["perplexity", "{b}"], "give the text once"),
    (["perplexity", "{b}", "--tokens", "{missing}"], "cannot read --tokens"),
    (["perplexity", "{b}", "--tokens", "{short}"], "make no window of 96"),
    (["generate", "{vit}", "--prompt-ids", "1"], "not a decoder with a KV cache"),
    (["perplexity", "{plain}", "--tokens", "{ids}", "--context", "40", "--kv-sparsity", "0.5"], "no KV cache"),
    (["perplexity", "{vit}", "--tokens", "{ids}", "--context", "40"], "not a causal language model"),
])
def test_cli_errors(past_build, tmp_path, args, words):
    (tmp_path / "short.txt").write_text("1 2 3")
    (tmp_path / "ids.txt").write_text(" ".join(map(str, _ids(100))))
    vit = Path(__file__).resolve().parents[1] / "models" / "digits_vit.onnx"
    fill = {"b": str(past_build), "missing": str(tmp_path / "none.txt"), "short": str(tmp_path / "short.txt"),
            "vit": str(vit), "plain": str(MODEL.parent.parent / "llama" / "model.onnx"), "ids": str(tmp_path / "ids.txt")}
    res = runner.invoke(app, [a.format(**fill) for a in args] + ["--backend", "onnxruntime"])
    assert res.exit_code == 1 and words in res.output, res.output
    assert "fix:" in res.output


def test_cli_text_through_a_tokenizer_beside_the_source_model(past_build, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    tok = tokenizers.Tokenizer(WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0"))
    tok.pre_tokenizer = WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    res = runner.invoke(app, ["generate", str(past_build), "--prompt", "w1 w2 w3", "--max-new-tokens", "4",
                              "--tokenizer", str(path), "--backend", "onnxruntime"])
    assert res.exit_code == 0, res.output
    with edgesdk.Engine(past_build, backend="onnxruntime") as e:
        want = Decoder(e).generate([1, 2, 3], 4).tokens
    assert ("ids: " + " ".join(map(str, want))) in res.output
    assert tok.decode([1, 2, 3] + want) in res.output and "stop at: none" in res.output
    # optimum writes generation_config.json beside the tokenizer: its eos_token_id stops generation
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [want[1], 63]}))
    res = runner.invoke(app, ["generate", str(past_build), "--prompt", "w1 w2 w3", "--max-new-tokens", "4",
                              "--tokenizer", str(path), "--backend", "onnxruntime"])
    assert res.exit_code == 0 and f"stop at: {want[1]} 63" in res.output and "stopped: eos" in res.output
    assert ("ids: " + " ".join(map(str, want[:2]))) in res.output and ("ids: " + " ".join(map(str, want[:3]))) \
        not in res.output
    (tmp_path / "t.txt").write_text(" ".join(f"w{i}" for i in _ids(200)))
    res = runner.invoke(app, ["perplexity", str(past_build), "--text", str(tmp_path / "t.txt"), "--tokenizer",
                              str(path), "--backend", "onnxruntime", "--json", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    (row,) = json.loads((tmp_path / "p.json").read_text())["rows"]
    with edgesdk.Engine(past_build, backend="onnxruntime") as e:
        assert row["perplexity"] == pytest.approx(Decoder(e).perplexity(_ids(200))["perplexity"])
