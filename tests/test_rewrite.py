"""Graph rewrite on the linear forms exporters write: every layer → one plugin node, run in ORT.

Helpers here (``check_plugin_nodes``, ``polygraphy_compare``) are reused by
``test_rewrite_exporters.py``.
"""

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.devices import PROFILES
from edgesdk.errors import EdgeSDKError
from edgesdk.formats.bitmap_linear import BitmapLinearWeights
from edgesdk.formats.vitbit_gemm import VitBitWeights
from edgesdk.inspect import find_linears
from edgesdk.ort import make_session
from edgesdk.quantize import quantize_int8
from edgesdk.reference.bitmap_linear import tolerance
from edgesdk.rewrite import rewrite_model
from edgesdk.rewrite.choose import LayerFacts, choose
from test_ort_ops import vitbit_int64

ORIN = PROFILES["orin"]
NP = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def cfg(**kw):
    base = dict(sparsity=0.0, prune="magnitude", kernels="auto", exclude=[], include_lm_head=False)
    base.update(kw)
    return SimpleNamespace(**base)


# --------------------------------------------------------------------------------------------- checkers
def _attrs(node):
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def plugin_nodes(model):
    return [n for n in model.graph.node if n.domain == "edgesdk"]


def check_structure(orig, new, expect_plugins):
    """Checker, IR 10, I/O names kept, plugin attributes, int8 raw bytes, expected plugin count."""
    onnx.checker.check_model(new)
    assert new.ir_version == 10
    assert [i.name for i in new.graph.input] == [i.name for i in orig.graph.input]
    assert [o.name for o in new.graph.output] == [o.name for o in orig.graph.output]
    nodes = plugin_nodes(new)
    assert len(nodes) == expect_plugins
    inits = {t.name: t for t in new.graph.initializer}
    for n in nodes:
        a = _attrs(n)
        assert a["plugin_version"] == "1" and a["plugin_namespace"] == "edgesdk"
        for name in n.input[1:]:
            assert inits[name].data_type in (TensorProto.INT8, TensorProto.INT32, TensorProto.FLOAT)
    return nodes


def check_plugin_nodes(model, feeds):
    """Run ``model`` in ORT exposing every plugin node's X and Y; check Y against independent references.

    EdgeVitBitGemm: bit-exact vs an int64 numpy GEMM. EdgeBitmapLinear: within the fp32-accumulation
    bound of ``reference.bitmap_linear.tolerance`` of a float64 product of the stored weights.
    Returns the number of nodes checked.
    """
    nodes = plugin_nodes(model)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output} | {i.name for i in probe.graph.input}
    for n in nodes:
        for t in (n.input[0], n.output[0]):
            if t not in have:
                probe.graph.output.append(onnx.ValueInfoProto(name=t))
                have.add(t)
    sess = make_session(probe)
    names = [o.name for o in sess.get_outputs()]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for feed in feeds:
        vals = dict(zip(names, sess.run(None, feed)))
        vals.update(feed)
        for n in nodes:
            x, y, a = vals[n.input[0]], vals[n.output[0]], _attrs(n)
            y_dtype = np.dtype(a.get("y_dtype") or x.dtype)
            assert y.dtype == y_dtype and y.shape == x.shape[:-1] + (a["n"],)
            assert (x.dtype == np.int8) == (n.op_type == "EdgeVitBitGemm" and bool(a.get("y_dtype")))
            if n.op_type == "EdgeVitBitGemm":
                w = VitBitWeights.from_tensors(a, dict(zip(("weight", "w_scale", "bias"), (inits[i] for i in n.input[1:]))))
                ref = vitbit_int64(x, w.w_q(), w.w_scale, w.x_scale, w.bias, w.gelu, y_dtype)
                if w.gelu:
                    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)
                else:
                    np.testing.assert_array_equal(y, ref)
            else:
                names_ = ("bitmaps", "values", "offsets", "scales", "bias")
                w = BitmapLinearWeights.from_tensors(a, dict(zip(names_, (inits[i] for i in n.input[1:]))))
                ref = (x.reshape(-1, w.k).astype(np.float64) @ (w.raw_values() * w.scales.astype(np.float64)[:, None]).T)
                if w.bias is not None:
                    ref = ref + w.bias
                err = np.abs(y.reshape(ref.shape).astype(np.float64) - ref)
                assert np.all(err <= tolerance(x, w).reshape(ref.shape) + 1e-12 * np.abs(ref))
    return len(nodes)


def polygraphy_compare(orig, new, feeds, atol, rtol):
    """Polygraphy Comparator: ORT on the original vs ORT (with plugin ops) on the rewritten model."""
    from polygraphy.backend.onnxrt import OnnxrtRunner
    from polygraphy.comparator import Comparator

    from edgesdk.verify import simple_compare_func

    runners = [OnnxrtRunner(lambda: make_session(orig), name="original"),
               OnnxrtRunner(lambda: make_session(new), name="rewritten")]
    results = Comparator.run(runners, data_loader=feeds)
    return bool(Comparator.compare_accuracy(results, compare_func=simple_compare_func(atol, rtol, "elemwise")))


# --------------------------------------------------------------------------------------------- models
def linear_model(form, dtype=TensorProto.FLOAT, k=70, n=37, seed=0):
    """One linear (+ a Relu behind it) in the given exporter form; X dynamic in its batch dims."""
    rng = np.random.default_rng(seed)
    npd = NP[dtype]
    w_kn = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(npd)
    b = rng.standard_normal(n).astype(npd)
    inits, nodes = [], []
    x_shape = ["B", 5, k]
    if form == "matmul_add_3d":
        inits = [numpy_helper.from_array(w_kn, "fc.weight"), numpy_helper.from_array(b, "fc.bias")]
        nodes = [helper.make_node("MatMul", ["X", "fc.weight"], ["t"], name="/fc/MatMul"),
                 helper.make_node("Add", ["fc.bias", "t"], ["h"], name="/fc/Add")]  # bias first
    elif form == "matmul_transposed_w":
        inits = [numpy_helper.from_array(np.ascontiguousarray(w_kn.T), "fc.weight")]
        nodes = [helper.make_node("Transpose", ["fc.weight"], ["wt"], name="/fc/T", perm=[1, 0]),
                 helper.make_node("MatMul", ["X", "wt"], ["h"], name="/fc/MatMul")]
    elif form == "gemm_transB":
        x_shape = ["M", k]
        inits = [numpy_helper.from_array(np.ascontiguousarray(w_kn.T), "fc.weight"), numpy_helper.from_array(b, "fc.bias")]
        nodes = [helper.make_node("Gemm", ["X", "fc.weight", "fc.bias"], ["h"], name="/fc/Gemm", transB=1)]
    elif form == "gemm_transA":
        x_shape = [k, "M"]
        inits = [numpy_helper.from_array(w_kn, "fc.weight"), numpy_helper.from_array(b, "fc.bias")]
        nodes = [helper.make_node("Gemm", ["X", "fc.weight", "fc.bias"], ["h"], name="/fc/Gemm", transA=1)]
    else:
        raise ValueError(form)
    nodes.append(helper.make_node("Relu", ["h"], ["Y"], name="/act/Relu"))
    y_shape = ["M", n] if form.startswith("gemm") else ["B", 5, n]
    g = helper.make_graph(nodes, form, [helper.make_tensor_value_info("X", dtype, x_shape)],
                          [helper.make_tensor_value_info("Y", dtype, y_shape)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def feeds_for(model, count=2, seed=1, batch=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        feed = {}
        for i in model.graph.input:
            t = i.type.tensor_type
            dims = [d.dim_value if d.dim_value else batch for d in t.shape.dim]
            feed[i.name] = rng.standard_normal(dims).astype(NP[t.elem_type])
        out.append(feed)
    return out


FORMS = ["matmul_add_3d", "matmul_transposed_w", "gemm_transB", "gemm_transA"]


# --------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_float_forms_become_bitmap_nodes(form, dtype):
    m = linear_model(form, dtype)
    feeds = feeds_for(m)
    new, report = rewrite_model(m, cfg(sparsity=0.5, kernels="bitmap"), None, ORIN)
    check_structure(m, new, 1)
    assert {n.op_type for n in new.graph.node} <= {"EdgeBitmapLinear", "Relu", "Transpose"}
    (row,) = report
    assert row["kernel"] == "bitmap" and row["reason"] is None and row["shape"] == [70, 37]
    assert abs(row["sparsity"] - 35 / 70) < 1e-9 and row["bytes_dense"] == 2 * 70 * 37
    assert check_plugin_nodes(new, feeds) == 1
    # sparsity 0: same function as the original up to fp16 weight rounding
    dense, _ = rewrite_model(m, cfg(sparsity=0.0, kernels="bitmap"), None, ORIN)
    tol = 2e-2 if dtype == TensorProto.FLOAT16 else 3e-3
    assert polygraphy_compare(m, dense, feeds, atol=tol, rtol=tol)


@pytest.mark.parametrize("vitbit_input", ["int8", "float"])
@pytest.mark.parametrize("form", FORMS)
def test_qdq_forms_fold_into_vitbit_bit_exact(form, vitbit_input):
    m = linear_model(form)
    feeds = feeds_for(m, count=3)
    q = quantize_int8(m, feeds, find_linears(m))
    assert sum(n.op_type == "QuantizeLinear" for n in q.graph.node) == 1
    (qnode,) = [n for n in q.graph.node if n.op_type == "QuantizeLinear"]
    new, (row,) = rewrite_model(q, cfg(kernels="vitbit", vitbit_input=vitbit_input), None, ORIN)
    (node,) = check_structure(q, new, 1)
    ops = [n.op_type for n in new.graph.node]
    assert "DequantizeLinear" not in ops  # the DQ pair is folded into the node
    if vitbit_input == "int8":  # the node reads the QuantizeLinear's int8 output, Y in the float dtype
        assert ops.count("QuantizeLinear") == 1 and node.input[0] in (qnode.output[0], f"{row['name']}.x_t")
        assert _attrs(node)["y_dtype"] == {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16"}[
            next(i for i in q.graph.input).type.tensor_type.elem_type]
    else:  # the node quantizes X itself
        assert "QuantizeLinear" not in ops and _attrs(node)["y_dtype"] == ""
    assert row["kernel"] == "vitbit" and row["quantized"] and row["bytes_packed"] <= 70 * 37 + 16 * 37 + 8 * 37
    if node.input[0] != "X":  # the plugin's X is typed in the file (a Q output, a transposed X), [..., K] (K = 70)
        (t,) = [v.type.tensor_type for v in new.graph.value_info if v.name == node.input[0]]
        want = TensorProto.INT8 if vitbit_input == "int8" else TensorProto.FLOAT
        assert t.elem_type == want and t.shape.dim[-1].dim_value == 70
    assert check_plugin_nodes(new, feeds) == 1
    # vs the Q/DQ model: same int8 math, only the fp32 rounding of the dequantization differs
    assert polygraphy_compare(q, new, feeds, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("form", ["matmul_add_3d", "gemm_transB"])
def test_qdq_to_bitmap_keeps_int8_weights(form):
    m = linear_model(form)
    feeds = feeds_for(m, count=2)
    q = quantize_int8(m, feeds, find_linears(m))
    new, (row,) = rewrite_model(q, cfg(kernels="bitmap", sparsity=0.5), None, ORIN)
    (node,) = check_structure(q, new, 1)
    assert _attrs(node)["value_dtype"] == "int8" and row["bytes_dense"] == 70 * 37 + 4 * 37
    # bitmap nodes read the fake-quantized activation: the activation Q/DQ pair stays
    assert "QuantizeLinear" in {n.op_type for n in new.graph.node}
    check_plugin_nodes(new, feeds)
    dense, _ = rewrite_model(q, cfg(kernels="bitmap"), None, ORIN)
    assert polygraphy_compare(q, dense, feeds, atol=1e-4, rtol=1e-4)  # int8 values are stored exactly
    # kernels none: the pruned int8 weights go back behind the same DequantizeLinear
    kept, (row,) = rewrite_model(q, cfg(kernels="none", sparsity=0.5), None, ORIN)
    assert [n.op_type for n in kept.graph.node] == [n.op_type for n in q.graph.node] and row["sparsity"] == 0.5
    (w,) = [numpy_helper.to_array(t) for t in kept.graph.initializer if t.data_type == TensorProto.INT8 and len(t.dims) == 2]
    assert np.all((w.reshape(-1, 37) == 0).sum(0) == 35) if form == "matmul_add_3d" else np.all((w == 0).sum(1) == 35)
    make_session(kept).run(None, feeds[0])


@pytest.mark.parametrize("quantized", [False, True])
def test_report_bytes_at_half_sparsity(quantized):
    """Issue targets: packed bytes at 50 % <= 0.65 of dense fp16 (fp16 values), <= 0.40 (int8 values)."""
    m = linear_model("matmul_add_3d", k=512, n=256)
    if quantized:
        m = quantize_int8(m, feeds_for(m, count=1), find_linears(m))
    new, (row,) = rewrite_model(m, cfg(kernels="bitmap", sparsity=0.5), None, ORIN)
    packed = sum(t.ByteSize() - len(t.name) for t in new.graph.initializer)  # ~ raw bytes, names excluded
    assert abs(packed - row["bytes_packed"]) < 0.01 * row["bytes_packed"]
    assert row["bytes_packed"] <= (0.40 if quantized else 0.65) * 2 * 512 * 256


def test_auto_rule_and_reasons():
    # decode-style (M = 1 token) and sparse → bitmap; quantized with many tokens → vitbit; else none
    f = dict(name="l", k=768, n=3072)
    assert choose(LayerFacts(**f, m=1, int8_weights=False, int8_act=False, sparsity=0.5), "auto", ORIN) == ("bitmap", None)
    assert choose(LayerFacts(**f, m=197, int8_weights=True, int8_act=True, sparsity=0.5), "auto", ORIN) == ("vitbit", None)
    assert choose(LayerFacts(**f, m=1, int8_weights=True, int8_act=True, sparsity=0.5), "auto", ORIN)[0] == "bitmap"
    k, why = choose(LayerFacts(**f, m=1, int8_weights=False, int8_act=False, sparsity=0.2), "auto", ORIN)
    assert k == "none" and "0.20 < 0.3" in why
    k, why = choose(LayerFacts(**f, m=197, int8_weights=False, int8_act=False, sparsity=0.5), "auto", ORIN)
    assert k == "none" and "float linear" in why
    k, why = choose(LayerFacts(**f, m=197, int8_weights=False, int8_act=False, sparsity=0.5), "vitbit", ORIN)
    assert k == "none" and "quantize the model first" in why
    # a device whose dense math is slow enough makes M=16 compute-bound
    slow = ORIN.model_copy(update={"tensor_fp16_tflops": 0.05})
    k, why = choose(LayerFacts(**f, m=16, int8_weights=False, int8_act=False, sparsity=0.5), "auto", slow)
    assert k == "none" and "compute-bound" in why


def test_exclusion_lm_head_and_kernels_none_write_back():
    m = linear_model("matmul_add_3d")
    new, (row,) = rewrite_model(m, cfg(sparsity=0.5, kernels="bitmap", exclude=[r"^fc$"]), None, ORIN)
    assert row["kernel"] == "none" and "exclude" in row["reason"] and not plugin_nodes(new)
    assert onnx.printer.to_text(new.graph) == onnx.printer.to_text(m.graph)
    # kernels none + sparsity: pruned weights written back densely, same ops
    new, (row,) = rewrite_model(m, cfg(sparsity=0.5, kernels="none"), None, ORIN)
    assert row["kernel"] == "none" and row["reason"] == "--kernels none" and row["sparsity"] == 0.5
    assert [n.op_type for n in new.graph.node] == [n.op_type for n in m.graph.node]
    w = [numpy_helper.to_array(t) for t in new.graph.initializer if t.dims == [70, 37]][0]
    assert np.all((w == 0).sum(0) == 35)  # per output column of W[K, N] = per row of W[N, K]


def test_wanda_uses_calibration_and_requires_it():
    m = linear_model("matmul_add_3d", k=64, n=24)
    rng = np.random.default_rng(5)
    scale = np.exp(rng.standard_normal(64) * 1.5).astype(np.float32)
    feeds = [{"X": (rng.standard_normal((4, 5, 64)) * scale).astype(np.float32)} for _ in range(2)]
    with pytest.raises(EdgeSDKError, match="calibration"):
        rewrite_model(m, cfg(sparsity=0.5, prune="wanda", kernels="bitmap"), None, ORIN)
    wanda, _ = rewrite_model(m, cfg(sparsity=0.5, prune="wanda", kernels="bitmap"), feeds, ORIN)
    mag, _ = rewrite_model(m, cfg(sparsity=0.5, prune="magnitude", kernels="bitmap"), feeds, ORIN)
    ref = make_session(m)

    def err(model):
        s = make_session(model)
        return sum(np.linalg.norm(s.run(None, f)[0] - ref.run(None, f)[0]) for f in feeds)

    assert err(wanda) < err(mag)


def test_shared_activation_qdq_is_folded_for_all_consumers():
    """q/k/v style: three linears reading one Q/DQ'd activation."""
    rng = np.random.default_rng(9)
    k = 40
    inits, nodes = [], []
    for name in ("q", "k", "v"):
        inits.append(numpy_helper.from_array(rng.standard_normal((k, 24)).astype(np.float32), f"{name}.weight"))
        nodes.append(helper.make_node("MatMul", ["X", f"{name}.weight"], [name], name=f"/{name}/MatMul"))
    nodes.append(helper.make_node("Sum", ["q", "k", "v"], ["Y"], name="/sum"))
    g = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", 19, k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["B", 19, 24])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    feeds = feeds_for(m)
    q = quantize_int8(m, feeds, find_linears(m))
    new, report = rewrite_model(q, cfg(kernels="auto"), None, ORIN)  # M = 19 tokens → vitbit
    assert [r["kernel"] for r in report] == ["vitbit"] * 3
    nodes = check_structure(q, new, 3)
    ops = [n.op_type for n in new.graph.node]
    assert "DequantizeLinear" not in ops and ops.count("QuantizeLinear") == 1  # one Q feeds all three (int8 X)
    (qnode,) = [n for n in new.graph.node if n.op_type == "QuantizeLinear"]
    assert {n.input[0] for n in nodes} == {qnode.output[0]}
    check_plugin_nodes(new, feeds)
    flt, _ = rewrite_model(q, cfg(kernels="auto", vitbit_input="float"), None, ORIN)
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in flt.graph.node}
    check_plugin_nodes(flt, feeds)


def _gelu_model(variant):
    """fc (MatMul + Add) followed by a GELU written the way ``variant`` says, then a Relu."""
    rng = np.random.default_rng(11)
    k, n = 24, 40
    c = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)  # noqa: E731
    inits = [numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32) / 4, "fc.weight"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "fc.bias"),
             c("sqrt2", 2 ** 0.5), c("isqrt2", 2 ** -0.5), c("one", 1.0), c("half", 0.5), c("c044", 0.044715),
             c("s2pi", (2 / np.pi) ** 0.5)]
    mk = helper.make_node
    nodes = [mk("MatMul", ["X", "fc.weight"], ["t"], name="/fc/MatMul"), mk("Add", ["t", "fc.bias"], ["y"], name="/fc/Add")]
    opset = 17
    if variant == "Gelu":
        opset = 20
        nodes.append(mk("Gelu", ["y"], ["g"], name="gelu"))
    elif variant in ("legacy", "dynamo", "mul_half_first", "extra_consumer"):
        if variant == "dynamo":
            nodes += [mk("Mul", ["y", "isqrt2"], ["d"], name="d")]
        else:
            nodes += [mk("Div", ["y", "sqrt2"], ["d"], name="d")]
        nodes += [mk("Erf", ["d"], ["e"], name="e"), mk("Add", ["e", "one"], ["a"], name="a")]
        if variant == "dynamo":
            nodes += [mk("Mul", ["half", "a"], ["m1"], name="m1"), mk("Mul", ["y", "m1"], ["g"], name="m2")]
        elif variant == "mul_half_first":
            nodes += [mk("Mul", ["y", "half"], ["h"], name="h"), mk("Mul", ["h", "a"], ["g"], name="m1")]
        else:
            nodes += [mk("Mul", ["y", "a"], ["m1"], name="m1"), mk("Mul", ["m1", "half"], ["g"], name="m2")]
        if variant == "extra_consumer":
            nodes += [mk("Add", ["g", "y"], ["g2"], name="extra")]
    elif variant == "tanh":  # 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3))): not the exact GELU
        nodes += [mk("Mul", ["y", "y"], ["y2"], name="p1"), mk("Mul", ["y2", "y"], ["y3"], name="p2"),
                  mk("Mul", ["y3", "c044"], ["y3c"], name="p3"), mk("Add", ["y", "y3c"], ["s"], name="p4"),
                  mk("Mul", ["s", "s2pi"], ["s2"], name="p5"), mk("Tanh", ["s2"], ["th"], name="p6"),
                  mk("Add", ["th", "one"], ["a"], name="p7"), mk("Mul", ["y", "a"], ["m1"], name="p8"),
                  mk("Mul", ["m1", "half"], ["g"], name="p9")]
    last = "g2" if variant == "extra_consumer" else "g"
    nodes.append(mk("Relu", [last], ["Y"], name="relu"))
    g = helper.make_graph(nodes, variant, [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", 19, k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["B", 19, n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


@pytest.mark.parametrize("variant,fused", [("legacy", True), ("dynamo", True), ("mul_half_first", True),
                                           ("Gelu", True), ("tanh", False), ("extra_consumer", False)])
def test_vitbit_fuses_exact_gelu(variant, fused):
    m = _gelu_model(variant)
    feeds = feeds_for(m)
    q = quantize_int8(m, feeds, find_linears(m))
    new, (row,) = rewrite_model(q, cfg(kernels="vitbit"), None, ORIN)
    (node,) = check_structure(q, new, 1)
    assert _attrs(node)["gelu"] == int(fused)
    ops = [n.op_type for n in new.graph.node]
    assert ("Erf" in ops or "Gelu" in ops or "Tanh" in ops) != fused
    check_plugin_nodes(new, feeds)
    assert polygraphy_compare(q, new, feeds, atol=1e-4, rtol=1e-4)


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(1, 150), n=st.integers(1, 70), sparsity=st.sampled_from([0.0, 0.3, 0.5, 0.9, 1.0]),
       form=st.sampled_from(FORMS), dtype=st.sampled_from([TensorProto.FLOAT, TensorProto.FLOAT16]))
def test_bitmap_rewrite_property(k, n, sparsity, form, dtype):
    """Odd sizes (K, N not multiples of 64, down to 1), sparsity 0 and 1 included: the rewritten node
    computes the pruned layer and every row keeps K - round(s·K) weights (the reported sparsity also counts
    weights that were zero already, e.g. a 7e-9 that fp16 rounds to 0)."""
    m = linear_model(form, dtype, k=k, n=n, seed=k * 1000 + n)
    native_zeros = float(np.mean(numpy_helper.to_array(next(i for i in m.graph.initializer
                                                            if i.name == "fc.weight")) == 0))
    new, (row,) = rewrite_model(m, cfg(sparsity=sparsity, kernels="bitmap"), None, ORIN)
    check_structure(m, new, 1)
    pruned = round(sparsity * k) / k
    assert pruned - 1e-12 <= row["sparsity"] <= pruned + native_zeros + 1e-12
    check_plugin_nodes(new, feeds_for(m, count=1))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(1, 150), n=st.integers(1, 70), sparsity=st.sampled_from([0.0, 0.5, 1.0]))
def test_vitbit_rewrite_property(k, n, sparsity):
    m = linear_model("matmul_add_3d", k=k, n=n, seed=k + 7 * n)
    feeds = feeds_for(m, count=2)
    q = quantize_int8(m, feeds, find_linears(m))
    new, (row,) = rewrite_model(q, cfg(sparsity=sparsity, kernels="vitbit"), None, ORIN)
    check_structure(q, new, 1)
    check_plugin_nodes(new, feeds)
