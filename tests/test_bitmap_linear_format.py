"""CPU tests of the bitmap-sparse linear format (edgesdk/formats/bitmap_linear.py) and reference."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgesdk.errors import EdgeSDKError, FormatError
from edgesdk.formats import bitmap_linear as fmt
from edgesdk.formats.bitmap_linear import BitmapLinearWeights
from edgesdk.reference.bitmap_linear import bitmap_linear, tolerance


def sparse(rng, n, k, sparsity, dtype=np.float32):
    w = rng.standard_normal((n, k)).astype(dtype)
    w[rng.random((n, k)) < sparsity] = 0
    return w


def worked_example_w():
    w = np.zeros((2, 9), np.float32)
    w[0, 0], w[0, 3], w[1, 1], w[0, 8], w[1, 8] = 1.0, -2.0, 0.5, 3.0, 4.0
    return w


def test_worked_example_fp16_bytes():
    """The literal example of docs/bitmap_linear.md."""
    p = BitmapLinearWeights.pack(worked_example_w(), "float16")
    t = p.to_tensors()
    assert list(t) == ["bitmaps", "values", "offsets", "scales"]
    expect_bitmaps = bytes([0x09, 0x02, 0, 0, 0, 0, 0, 0, 0x01, 0x01, 0, 0, 0, 0, 0, 0]) + bytes(48)
    assert t["bitmaps"].dtype == np.int8 and t["bitmaps"].tobytes() == expect_bitmaps
    assert t["values"].dtype == np.int8 and t["values"].tobytes() == bytes.fromhex(
        "003c00c0003800420044000000000000")
    assert t["offsets"].dtype == np.int32 and t["offsets"].tolist() == [0, 8]
    assert t["scales"].tolist() == [1.0, 1.0]
    assert p.nbytes == 64 + 16 + 8 + 8
    assert p.node_attributes() == {"n": 2, "k": 9, "value_dtype": "float16", "has_bias": 0,
                                   "format_version": 1}
    y = bitmap_linear(np.ones((1, 9), np.float32), p)
    assert y.tolist() == [[2.0, 4.5]]


def test_worked_example_int8():
    p = BitmapLinearWeights.pack(worked_example_w(), "int8", bias=np.array([0.25, -1.0]))
    t = p.to_tensors()
    assert t["values"].tolist() == [42, -85, 16, 127, 127] + [0] * 11
    assert t["offsets"].tolist() == [0, 16]
    np.testing.assert_allclose(t["scales"], np.float32([3 / 127, 4 / 127]))
    assert t["bias"].tolist() == [0.25, -1.0] and p.node_attributes()["has_bias"] == 1
    assert list(t) == list(fmt.TENSOR_NAMES)
    y = bitmap_linear(np.ones((1, 9), np.float16), p, out_dtype=np.float64)
    np.testing.assert_allclose(y, [[(42 - 85 + 127) * 3 / 127 + 0.25, (16 + 127) * 4 / 127 - 1.0]], rtol=1e-6)


def test_schema():
    assert fmt.OP_TYPE == "EdgeBitmapLinear" and fmt.TENSOR_NAMES[-1] == "bias"
    assert set(fmt.ATTRIBUTES) == {"n", "k", "value_dtype", "has_bias", "format_version"}
    assert fmt.input_names({"has_bias": 0}) == fmt.TENSOR_NAMES[:-1]
    assert fmt.output_shape((2, 3, 9), {"n": 5}) == (2, 3, 5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 70), k=st.integers(1, 200), sparsity=st.sampled_from([0.0, 0.3, 0.5, 0.9, 1.0]),
       value_dtype=st.sampled_from(fmt.VALUE_DTYPES), wdtype=st.sampled_from([np.float16, np.float32, np.float64]),
       bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_round_trip(n, k, sparsity, value_dtype, wdtype, bias, seed):
    rng = np.random.default_rng(seed)
    w = sparse(rng, n, k, sparsity, wdtype)
    b = rng.standard_normal(n) if bias else None
    p = BitmapLinearWeights.pack(w, value_dtype, bias=b)
    d = p.unpack()
    assert d.shape == (n, k) and d.dtype == np.float32
    if value_dtype == "float16":
        np.testing.assert_array_equal(d, w.astype(np.float16).astype(np.float32))
    else:
        # compare in float64: with fp16 W, NumPy 2 would evaluate atol + rtol·|W| in fp16 (a 1-ulp miss at a .5 tie)
        np.testing.assert_allclose(d, w.astype(np.float64), atol=float(p.scales.max()) / 2 * 1.0001)
        assert ((d != 0) <= (w != 0)).all()
    q = BitmapLinearWeights.from_tensors(p.node_attributes(), p.to_tensors())
    np.testing.assert_array_equal(q.unpack(), d)
    assert q.nbytes == p.nbytes == sum(t.nbytes for t in p.to_tensors().values())
    assert (np.diff(p.offsets) % fmt.value_align(value_dtype) == 0).all()
    x = rng.standard_normal((2, 3, k)).astype(np.float32)
    y = bitmap_linear(x, p)
    assert y.shape == (2, 3, n) and y.dtype == np.float32
    ref = x.reshape(-1, k).astype(np.float64) @ d.astype(np.float64).T + (0 if b is None else b)
    np.testing.assert_allclose(y.reshape(-1, n), ref, rtol=1e-5, atol=1e-5)
    assert (tolerance(x, p) > 0).all()


@pytest.mark.parametrize("value_dtype", fmt.VALUE_DTYPES)
def test_round_trip_large(value_dtype):
    rng = np.random.default_rng(17)
    w = sparse(rng, 777, 3001, 0.6)  # neither a multiple of 8 nor of 64
    p = BitmapLinearWeights.pack(w, value_dtype, bias=rng.standard_normal(777))
    q = BitmapLinearWeights.from_tensors(p.node_attributes(), p.to_tensors())
    np.testing.assert_array_equal(q.unpack(), p.unpack())
    if value_dtype == "float16":
        np.testing.assert_array_equal(p.unpack(), w.astype(np.float16).astype(np.float32))
    else:
        np.testing.assert_allclose(p.unpack(), w, atol=float(p.scales.max()) / 2 * 1.0001)


@pytest.mark.parametrize("n,k", [(1, 1), (7, 63), (9, 65), (37, 1000)])
def test_sparsity_extremes(n, k):
    rng = np.random.default_rng(n * k)
    zero = BitmapLinearWeights.pack(np.zeros((n, k)), "float16")
    assert zero.values.size == 0 and zero.offsets.max() == 0 and (zero.bitmaps == 0).all()
    assert (zero.unpack() == 0).all() and zero.density == 0
    dense = BitmapLinearWeights.pack(rng.uniform(0.5, 1.0, (n, k)), "int8")
    assert dense.density == 1.0 and dense.values.size == dense.offsets[-1]
    assert np.count_nonzero(dense.values) == n * k
    assert BitmapLinearWeights.from_tensors(zero.node_attributes(), zero.to_tensors()).values.size == 0


@pytest.mark.parametrize("value_dtype,limit", [("float16", 0.65), ("int8", 0.40)])
def test_byte_model(value_dtype, limit):
    rng = np.random.default_rng(1)
    n, k = 1000, 1500  # not multiples of 8 / 64
    w = sparse(rng, n, k, 0.5)
    p = BitmapLinearWeights.pack(w, value_dtype)
    dense = fmt.dense_fp16_bytes(n, k)
    assert p.nbytes / dense <= limit
    # int8 quantization drops weights that round to 0 (~1 % of N(0,1) nonzeros): model is an upper bound
    model = fmt.expected_nbytes(n, k, 0.5, value_dtype)
    assert 0.97 * model <= p.nbytes <= 1.003 * model
    for s, hi in [(0.3, 0.80), (0.7, 0.40)]:
        assert fmt.expected_nbytes(4096, 4096, s, "float16") / fmt.dense_fp16_bytes(4096, 4096) <= hi
    assert fmt.expected_nbytes(8, 64, 0.0) == 64 + 1024 + 8 + 32
    assert fmt.expected_nbytes(8, 64, 1.0) == 64 + 0 + 8 + 32


def _good(value_dtype="float16", bias=True):
    rng = np.random.default_rng(5)
    p = BitmapLinearWeights.pack(sparse(rng, 13, 130, 0.5), value_dtype,
                                 bias=rng.standard_normal(13) if bias else None)
    return p.node_attributes(), {k: v.copy() for k, v in p.to_tensors().items()}


def _corrupt_bitmap(t):
    t["bitmaps"].view("<u8")[0] = np.uint64(2**64 - 1)  # 64 bits set, offsets unchanged


CASES = [
    ("missing attribute", lambda a, t: a.pop("k"), "attribute 'k' is missing"),
    ("bad version", lambda a, t: a.update(format_version=2), "format_version 2"),
    ("bad dtype attr", lambda a, t: a.update(value_dtype="int4"), "value_dtype"),
    ("string int", lambda a, t: a.update(n="13"), "must be an int"),
    ("bad has_bias", lambda a, t: a.update(has_bias=2), "has_bias"),
    ("missing bias", lambda a, t: t.pop("bias"), "missing"),
    ("short bitmaps", lambda a, t: t.update(bitmaps=t["bitmaps"][:-8]), "'bitmaps' has"),
    ("uint8 bitmaps", lambda a, t: t.update(bitmaps=t["bitmaps"].view(np.uint8)), "must be int8"),
    ("short values", lambda a, t: t.update(values=t["values"][:-2]), "'values' has"),
    ("long values", lambda a, t: t.update(values=np.concatenate([t["values"], np.zeros(16, np.int8)])),
     "'values' has"),
    ("offsets dtype", lambda a, t: t.update(offsets=t["offsets"].astype(np.int64)), "must be int32"),
    ("offsets start", lambda a, t: t["offsets"].__iadd__(8), "start at 0"),
    ("offsets decrease", lambda a, t: t["offsets"].__setitem__(2, t["offsets"][1] - 8), "never decrease"),
    ("offsets misaligned", lambda a, t: t["offsets"].__setitem__(1, t["offsets"][1] + 1), "multiples"),
    ("popcount mismatch", lambda a, t: _corrupt_bitmap(t), "bits set"),
    ("wrong n", lambda a, t: a.update(n=14), "elements, expected"),
    ("nan scale", lambda a, t: t["scales"].__setitem__(3, np.nan), "scales must be"),
    ("negative scale", lambda a, t: t["scales"].__setitem__(0, -1.0), "scales must be"),
    ("inf bias", lambda a, t: t["bias"].__setitem__(0, np.inf), "bias must be"),
    ("nan fp16 value", lambda a, t: t["values"].view(np.float16).__setitem__(0, np.nan), "NaN"),
]


@pytest.mark.parametrize("name,corrupt,message", CASES, ids=[c[0] for c in CASES])
def test_corrupted_tensors_raise_format_error(name, corrupt, message):
    attrs, tensors = _good()
    corrupt(attrs, tensors)
    with pytest.raises(FormatError) as e:
        BitmapLinearWeights.from_tensors(attrs, tensors)
    assert message in str(e.value) and "fix:" in str(e.value)


def test_bits_in_padding_with_consistent_offsets():
    attrs, t = _good(bias=False)
    p = BitmapLinearWeights.from_tensors(attrs, t)
    w = np.zeros((16, 130), np.float32)
    w[:13] = p.unpack()
    w[15, 0] = 1.0  # a weight in a padding row, packed as if the layer had 16 rows
    q = BitmapLinearWeights.pack(w)
    t2 = {**q.to_tensors(), "scales": t["scales"]}
    with pytest.raises(FormatError, match="outside the 13x130 matrix"):
        BitmapLinearWeights.from_tensors({**q.node_attributes(), "n": 13}, t2)


def test_pack_rejects_bad_input():
    with pytest.raises(FormatError, match="float matrix"):
        BitmapLinearWeights.pack(np.ones((3,)))
    with pytest.raises(FormatError, match="float matrix"):
        BitmapLinearWeights.pack(np.ones((3, 4), np.int32))
    with pytest.raises(FormatError, match="NaN"):
        BitmapLinearWeights.pack(np.full((3, 4), np.nan))
    with pytest.raises(FormatError, match="not supported"):
        BitmapLinearWeights.pack(np.ones((3, 4)), "bfloat16")
    with pytest.raises(FormatError, match="fp16 range"):
        BitmapLinearWeights.pack(np.full((3, 4), 1e6))
    with pytest.raises(FormatError, match="scales"):
        BitmapLinearWeights.pack(np.ones((3, 4)), "int8", scales=np.ones(2))
    with pytest.raises(FormatError, match="bias"):
        BitmapLinearWeights.pack(np.ones((3, 4)), bias=np.ones(4))
    p = BitmapLinearWeights.pack(np.ones((3, 4)))
    with pytest.raises(EdgeSDKError, match=r"\[\.\.\., 4\]"):
        bitmap_linear(np.ones((2, 5), np.float32), p)
    with pytest.raises(EdgeSDKError, match="rank"):
        bitmap_linear(np.ones(4, np.float32), p)


def test_reference_fp16_rounding_and_tolerance():
    rng = np.random.default_rng(3)
    p = BitmapLinearWeights.pack(sparse(rng, 33, 100, 0.7), "int8", bias=rng.standard_normal(33))
    x = rng.standard_normal((5, 100)).astype(np.float16)
    y = bitmap_linear(x, p)
    exact = bitmap_linear(x, p, out_dtype=np.float64)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, exact.astype(np.float16))
    tol = tolerance(x, p)
    assert (np.abs(y.astype(np.float64) - exact) <= tol).all()
    # the tolerance is tight enough to catch one wrong weight
    w = p.unpack()
    w[4, 17] = w[4, 17] + 0.05 if w[4, 17] else 0.05
    wrong = x.astype(np.float64) @ w.astype(np.float64).T + p.bias
    assert (np.abs(wrong - exact) > tol).any()


def test_launcher_config_is_valid_everywhere():
    """Launch geometry (pure Python): block ≤ 512 threads, smem ≤ 227 KB, grid covers N and M."""
    from edgesdk.kernels import bitmap_linear as kbl

    attrs = {"n": 4096, "k": 4096, "value_dtype": "float16", "has_bias": 0}
    assert kbl.valid_tactics(attrs)[0] == 1 and kbl.workspace_bytes(attrs, 16) == 0
    for n, k in [(1, 1), (37, 203), (4096, 4096), (896, 4864), (11008, 4096)]:
        s, g = fmt.geometry(n, k)
        for m in (1, 7, 16, 17, 33, 64, 513):
            for vd in fmt.VALUE_DTYPES:
                for xd in ("float16", "float32"):
                    for tac in kbl.valid_tactics(attrs):
                        for sms in (16, 132):
                            c = kbl.config(n, k, m, xd, vd, tac, sms)
                            assert c["block"][0] <= 512 and c["block"][0] == 32 * c["ks"] * c["spb"]
                            assert c["smem"] <= 163 * 1024  # Orin's per-block maximum
                            assert c["grid"][0] * c["spb"] * c.get("spw", 1) >= s
                            if c["name"].startswith("bitmap_gemv"):
                                assert xd == "float16" and m <= 16 and k % 8 == 0 and c["grid"][1] == 1
                                assert tac in kbl.GEMV_TACTICS
                            elif c["name"].startswith("bitmap_dec"):
                                assert xd == "float16" and m <= 16 and k % 8 == 0 and c["grid"][1] == 1
                                r80 = tac == kbl.R80_HEURISTIC or tac in kbl.R80_TACTICS
                                xs = tac == kbl.XS_HEURISTIC or tac in kbl.XS_TACTICS
                                xs80 = tac == kbl.XS80_HEURISTIC or tac in kbl.XS80_TACTICS
                                assert tac in (1, kbl.PREV_DEFAULT) or tac in kbl.DEC_TACTICS or r80 or xs or xs80
                                assert tac in (1, kbl.PREV_DEFAULT) or c["name"].endswith(("_r80", "_r80n")) == r80
                                assert tac == 1 or c["name"].endswith("_xs") == xs
                                assert tac == 1 or c["name"].endswith("_xs80") == xs80
                                assert c["spw"] == 2 and c["name"].split("_mb")[1][0] == ("1" if m <= 8 else "2")
                            else:
                                mt = int(c["name"].split("_mt")[1].split("_")[0])
                                assert c["grid"][1] * 16 * mt >= m
                                assert c["name"].startswith(f"bitmap_linear_{'f16' if xd == 'float16' else 'f32'}")
    with pytest.raises(EdgeSDKError, match="tactic"):
        kbl.config(8, 8, 1, "float16", "float16", 99)


def test_default_takes_x_staged_kernels():
    """Tactic 1 takes the X-staged decode kernels (``_xs``), their 80-register build (``_xs80``) only for
    M <= 4 where its modelled cost is <= 3/4 of the 16-warp one's, with the same MB as the other decode
    kernels; fp32 X, odd K and M > 16 keep the generic path."""
    from edgesdk.kernels import bitmap_linear as kbl

    for (k, n), want80 in {(4096, 4096): {"float16": False, "int8": False},
                           (4096, 11008): {"float16": False, "int8": True},
                           (2048, 5632): {"float16": False, "int8": True},
                           (1536, 576): {"float16": False, "int8": False}}.items():
        for m in (1, 4, 5, 16):
            for vd in fmt.VALUE_DTYPES:
                c = kbl.config(n, k, m, "float16", vd, 1, 132)
                c60 = kbl.config(n, k, m, "float16", vd, kbl.XS_HEURISTIC, 132)
                c70 = kbl.config(n, k, m, "float16", vd, kbl.XS80_HEURISTIC, 132)
                if (k, n) == (4096, 11008) and m > 4:
                    continue  # the M > 4 cost model: test_default_k_split_cost_model_above_m4
                strip = lambda d: {key: v for key, v in d.items() if key != "cost"}  # noqa: E731
                assert strip(c) == strip(c70 if want80[vd] and m <= 4 else c60), (k, n, m, vd, c)
                assert c["name"].endswith("_xs80" if want80[vd] and m <= 4 else "_xs")
                assert c["name"].split("_mb")[1][0] == ("1" if m <= 8 else "2")


def test_default_k_split_cost_model_above_m4():
    """Tactic 1 counts 4 groups of fill and reduction per warp for M > 4 (3 for M <= 4): on the LLM layers of
    the benchmark this changes only 4096x11008 at M 5-16, from 8 K splits to 2 (measured faster, see the
    launcher), and the 60 heuristic (always 3) keeps 8 there."""
    from edgesdk.kernels import bitmap_linear as kbl

    for vd in fmt.VALUE_DTYPES:
        for m in (5, 8, 9, 16):
            c = kbl.config(11008, 4096, m, "float16", vd, 1, 132)
            assert c["ks"] == 2 and c["name"].endswith("_xs"), c
            assert kbl.config(11008, 4096, m, "float16", vd, kbl.XS_HEURISTIC, 132)["ks"] == 8
        for m in (1, 4):
            c = kbl.config(11008, 4096, m, "float16", vd, 1, 132)
            assert c["ks"] != 2, c
    # every other layer of the benchmark: the M > 4 choice equals the 60 heuristic's (fill 3)
    for k, n in [(4096, 4096), (11008, 4096), (2048, 5632), (5632, 2048), (896, 4864), (4864, 896), (576, 1536),
                 (1536, 576)]:
        for sms in (16, 132):
            for vd in fmt.VALUE_DTYPES:
                for m in (5, 8, 9, 16):
                    c = kbl.config(n, k, m, "float16", vd, 1, sms)
                    c60 = kbl.config(n, k, m, "float16", vd, kbl.XS_HEURISTIC, sms)
                    assert (c["name"], c["grid"], c["block"], c["ks"]) == (c60["name"], c60["grid"], c60["block"],
                                                                          c60["ks"]), (k, n, m, vd, sms)


def test_heuristic_picks_80_register_kernel_only_when_cheaper():
    """Tactic 59 (the round-2 default) takes the 80-register decode kernel where its modelled cost is ≤ 3/4 of the
    108-register kernel's (one wave instead of several, or half the groups per warp), else the latter."""
    from edgesdk.kernels import bitmap_linear as kbl

    for (k, n), want in {(4096, 4096): False, (4096, 11008): True, (2048, 5632): True, (5632, 2048): False,
                         (896, 4864): True, (1536, 576): False}.items():
        for m in (1, 16):
            for vd in fmt.VALUE_DTYPES:
                c = kbl.config(n, k, m, "float16", vd, kbl.PREV_DEFAULT, 132)
                c16 = kbl.config(n, k, m, "float16", vd, 40, 132)  # any 108-register tactic: name family
                assert c["name"].endswith(("_r80", "_r80n")) == want, (k, n, m, vd, c)
                assert c["name"].split("_mb")[1][0] == c16["name"].split("_mb")[1][0]
    # fp32 X, odd K and M > 16 never take a decode kernel
    assert kbl.config(4096, 4096, 17, "float16", "float16", 1)["name"].startswith("bitmap_linear_")
    assert kbl.config(5632, 2048, 1, "float32", "float16", 1)["name"].startswith("bitmap_linear_")
    with pytest.raises(EdgeSDKError, match="dtype"):
        kbl.config(8, 8, 1, "bfloat16", "float16", 1)
