"""The TensorRT plugins' decisions, tested without TensorRT (edgesdk/trt/_logic.py)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.trt import _logic as L

RNG = np.random.default_rng(6)


def _packed(op: str, n: int, k: int, bias: bool, variant: str):
    """Real packed weights of slice ``op`` (odd sizes, random, no zeros-only data)."""
    if op == "bitmap_linear":
        from edgesdk.formats.bitmap_linear import BitmapLinearWeights

        w = RNG.standard_normal((n, k)).astype(np.float32)
        w[RNG.random((n, k)) < 0.55] = 0
        return BitmapLinearWeights.pack(w, value_dtype=variant,
                                        bias=RNG.standard_normal(n).astype(np.float32) if bias else None)
    from edgesdk.formats.vitbit_gemm import VitBitWeights, quantize_weights

    bits = int(variant)
    w_q, scale = quantize_weights(RNG.standard_normal((n, k)), bits=bits)
    return VitBitWeights.pack(w_q, scale, bits, bias=RNG.standard_normal(n) if bias else None,
                              x_scale=0.0173, gelu=bias)


CASES = [("bitmap_linear", "float16"), ("bitmap_linear", "int8"),
         ("vitbit_gemm", "8"), ("vitbit_gemm", "5"), ("vitbit_gemm", "4")]


@pytest.mark.parametrize("op,variant", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_fields_round_trip_creator_to_plugin_and_back(op, variant, bias):
    spec = L.spec_for(op)
    packed = _packed(op, 37, 83, bias, variant)
    attrs = packed.node_attributes()
    # The creator declares exactly the node attributes, typed as the parser maps them.
    assert dict(L.field_names(spec)) == {a: L.FIELD_TYPES[t] for a, t in spec.attributes.items()}
    assert set(dict(L.field_names(spec))) == set(attrs)

    # Build phase: the ONNX parser hands ints as int32 arrays, floats as float32, strings NUL-terminated.
    parser_fields = []
    for name, t in spec.attributes.items():
        v = attrs[name]
        data = (np.frombuffer(v.encode() + b"\0", np.int8) if t is str
                else np.array([v], np.int32 if t is int else np.float32))
        parser_fields.append((name, data))
    parser_fields.append(("plugin_version_unrelated", np.array([7], np.int32)))  # ignored
    built = L.attrs_from_fields(spec, parser_fields)
    # Runtime phase: what get_fields_to_serialize wrote is all a deserialized plugin gets.
    serialized = L.encode_fields(spec, built)
    assert [n for n, _, _ in serialized] == list(spec.attributes)
    assert all(t == L.FIELD_TYPES[spec.attributes[n]] for n, _, t in serialized)
    runtime = L.attrs_from_fields(spec, [(n, d) for n, d, _ in serialized])
    for name, t in spec.attributes.items():
        if t is float:  # float32 field: equal to float32 rounding
            assert runtime[name] == pytest.approx(attrs[name], rel=1e-7)
        else:
            assert runtime[name] == attrs[name] and type(runtime[name]) is t
    assert L.encode_fields(spec, runtime)[0][1].tobytes() == serialized[0][1].tobytes()
    assert L.timing_cache_id(spec, runtime) == L.timing_cache_id(spec, built)


@pytest.mark.parametrize("data", [b"int8\0", b"int8", "int8", "int8\0",
                                  np.frombuffer(b"int8\0", np.uint8), np.frombuffer(b"int8\0", np.int8),
                                  np.array([b"i", b"n", b"t", b"8", b"\0"]), np.array(list("int8"))])
def test_char_fields_decode_every_way_tensorrt_may_hand_them(data):
    assert L.decode_char(data) == "int8"


def test_missing_or_malformed_fields_are_clear_errors():
    spec = L.spec_for("vitbit_gemm")
    attrs = _packed("vitbit_gemm", 9, 17, True, "8").node_attributes()
    fields = [(n, d) for n, d, _ in L.encode_fields(spec, attrs)]
    with pytest.raises(EdgeSDKError, match="x_scale"):
        L.attrs_from_fields(spec, [f for f in fields if f[0] != "x_scale"])
    with pytest.raises(EdgeSDKError, match="holds 2 values"):
        L.attrs_from_fields(spec, [(n, np.array([1, 2], np.int32)) if n == "n" else (n, d) for n, d in fields])
    with pytest.raises(EdgeSDKError, match="bits"):  # the format's own validation runs too
        L.attrs_from_fields(spec, [(n, np.array([3], np.int32)) if n == "bits" else (n, d) for n, d in fields])
    with pytest.raises(EdgeSDKError, match="must be positive"):
        L.attrs_from_fields(spec, [(n, np.array([0], np.int32)) if n == "k" else (n, d) for n, d in fields])
    with pytest.raises(EdgeSDKError, match="int32"):
        L.encode_fields(spec, {**attrs, "n": 2**31})


@pytest.mark.parametrize("op", L.OPS)
@pytest.mark.parametrize("rank", [2, 3, 4, 5])
def test_output_shapes_for_all_input_ranks(op, rank):
    spec = L.spec_for(op)
    attrs = _packed(op, 29, 71, False, "int8" if op == "bitmap_linear" else "8").node_attributes()
    lead = tuple(int(d) for d in RNG.integers(1, 7, size=rank - 1))
    assert L.output_dims(spec, attrs, (*lead, 71), int) == [*lead, 29]
    assert L.rows((*lead, 71)) == int(np.prod(lead))
    # dynamic leading dims (-1) pass through; the last dim becomes N
    dyn = (-1, *lead[1:], 71)
    assert L.output_dims(spec, attrs, dyn, int) == [-1, *lead[1:], 29]
    # TensorRT dimension expressions: const() builds them, value_of() reads constants
    class E:  # a minimal stand-in for IDimensionExpr, for the expression code path only
        def __init__(self, v):
            self.v = v
    out = L.output_dims(spec, attrs, [E(d) for d in (*lead, 71)], E, lambda e: e.v)
    assert [e.v for e in out] == [*lead, 29]
    with pytest.raises(EdgeSDKError, match="K=71"):
        L.output_dims(spec, attrs, (*lead, 70), int)
    with pytest.raises(EdgeSDKError, match="rank 1"):
        L.output_dims(spec, attrs, (71,), int)


@pytest.mark.parametrize("op", L.OPS)
def test_supported_format_combinations(op):
    spec = L.spec_for(op)
    for has_bias in (0, 1):
        n_in = L.num_inputs(spec, {"has_bias": has_bias})
        assert n_in == 1 + len(spec.tensor_names) - (1 - has_bias)
        combos = L.format_combinations(spec, n_in)
        w = spec.tensor_dtypes[: n_in - 1]
        assert combos == [("float16", *w, "float16"), ("float32", *w, "float32")]
        good = list(combos[0])
        lin = ["LINEAR"] * (n_in + 1)
        assert all(L.supports_format(spec, p, good, lin, n_in) for p in range(n_in + 1))
        for p in range(n_in + 1):  # any non-LINEAR format is refused
            assert not L.supports_format(spec, p, good, lin[:p] + ["CHW32"] + lin[p + 1:], n_in)
        assert not L.supports_format(spec, n_in, [*good[:-1], "float32"], lin, n_in)  # Y != X dtype
        assert not L.supports_format(spec, 0, ["int8"], lin, n_in)  # X must be float
        assert not L.supports_format(spec, 1, ["float16", "float16"], lin, n_in)
    assert L.output_dtype(spec, ["float16", "int8"]) == "float16"
    with pytest.raises(EdgeSDKError, match="float16 or float32"):
        L.output_dtype(spec, ["int8"])


@pytest.mark.parametrize("y", ["float16", "float32"])
def test_vitbit_int8_input_formats(y):
    """A VitBit node with y_dtype takes X int8 (the QuantizeLinear output) or X in y_dtype; Y is y_dtype."""
    spec = L.spec_for("vitbit_gemm")
    attrs = {"has_bias": 1, "y_dtype": y}
    n_in = L.num_inputs(spec, attrs)
    w = spec.tensor_dtypes
    assert L.format_combinations(spec, n_in, attrs) == [(y, *w, y), ("int8", *w, y)]
    lin = ["LINEAR"] * (n_in + 1)
    assert L.supports_format(spec, n_in, ["int8", *w, y], lin, n_in, attrs)
    other = "float32" if y == "float16" else "float16"
    assert not L.supports_format(spec, n_in, ["int8", *w, other], lin, n_in, attrs)  # Y must be y_dtype
    assert not L.supports_format(spec, 0, [other], lin, n_in, attrs)  # a float X must be y_dtype
    assert L.output_dtype(spec, ["int8"], attrs) == y
    with pytest.raises(EdgeSDKError, match="y_dtype is"):
        L.output_dtype(spec, [other], attrs)
    # the bitmap operator has no int8 X, whatever the attributes say
    bspec = L.spec_for("bitmap_linear")
    assert not L.supports_format(bspec, 0, ["int8"], lin, n_in, attrs)
    with pytest.raises(EdgeSDKError, match="takes float16 or float32"):
        L.output_dtype(bspec, ["int8"], attrs)


def test_vitbit_fields_default_y_dtype():
    """Nodes written before y_dtype existed (no such field) get y_dtype "" = Y in X's dtype."""
    spec = L.spec_for("vitbit_gemm")
    fields = [("n", np.array([8], np.int32)), ("k", np.array([32], np.int32)), ("bits", np.array([8], np.int32)),
              ("x_scale", np.array([0.5], np.float32)), ("has_bias", np.array([0], np.int32)),
              ("gelu", np.array([0], np.int32))]
    got = L.attrs_from_fields(spec, fields)
    assert got["y_dtype"] == "" and L.output_dtype(spec, ["float16"], got) == "float16"
    ser = L.encode_fields(spec, dict(got, y_dtype="float32"))
    assert L.attrs_from_fields(spec, [(n, d) for n, d, _ in ser])["y_dtype"] == "float32"


@pytest.mark.parametrize("op,variant", CASES)
def test_declared_tensor_dtypes_match_the_formats_tensors(op, variant):
    spec = L.spec_for(op)
    tensors = _packed(op, 23, 45, True, variant).to_tensors()
    assert tuple(tensors) == spec.tensor_names
    assert tuple(t.dtype.name for t in tensors.values()) == spec.tensor_dtypes


def _fake_launcher(name: str, tactics, with_workspace: bool):
    """A recording launcher module: checks how _logic calls the launcher API (no GPU involved)."""
    mod = types.ModuleType(name)
    mod.calls = []
    mod.valid_tactics = lambda attrs, m=None: list(tactics)
    mod.workspace_bytes = lambda attrs, m: 4 * m * attrs["n"]
    if with_workspace:
        def launch(attrs, x_dtype, m, inputs, outputs, stream, tactic=1, workspace=0):
            mod.calls.append((x_dtype, m, inputs, outputs, stream, tactic, workspace))
    else:
        def launch(attrs, x_dtype, m, inputs, outputs, stream, tactic=1):
            mod.calls.append((x_dtype, m, inputs, outputs, stream, tactic))
    mod.launch = launch
    sys.modules[name] = mod
    return mod


def _spec(launcher: str) -> L.OpSpec:
    return L.OpSpec(op="t", op_type="EdgeT", attributes={"n": int, "k": int, "has_bias": int},
                    tensor_names=("w", "bias"), tensor_dtypes=("int8", "float32"), launcher=launcher)


@pytest.mark.parametrize("with_workspace", [True, False])
def test_enqueue_calls_the_launcher_with_raw_pointers(with_workspace):
    mod = _fake_launcher(f"_edgesdk_test_launcher_{with_workspace}", [1, 3, 2], with_workspace)
    spec, attrs = _spec(mod.__name__), {"n": 5, "k": 7, "has_bias": 1}
    assert L.tactics(spec, attrs, 6) == [1, 3, 2]
    assert L.workspace_bytes(spec, attrs, 6) == 120
    L.enqueue(spec, attrs, "float16", (2, 3, 7), [11, 12, 13], [21], 99, 1234, 0)
    L.enqueue(spec, attrs, "float32", (4, 7), [11, 12, 13], [21], 99, 1234, 3)
    L.enqueue(spec, attrs, "float32", (0, 3, 7), [11, 12, 13], [21], 99, 1234, 3)  # M = 0: no launch
    ws = (99,) if with_workspace else ()
    assert mod.calls == [("float16", 6, [11, 12, 13], [21], 1234, 1, *ws),
                         ("float32", 4, [11, 12, 13], [21], 1234, 3, *ws)]


@pytest.mark.parametrize("bad", [[], [1, 1], [0, 1], [-2]])
def test_invalid_tactic_lists_are_refused(bad):
    mod = _fake_launcher(f"_edgesdk_test_bad_{len(bad)}_{sum(bad)}", bad, False)
    with pytest.raises(EdgeSDKError, match="invalid tactics"):
        L.tactics(_spec(mod.__name__), {"n": 5, "k": 7, "has_bias": 1})


@pytest.mark.parametrize("op,variant", CASES)
def test_real_launchers_offer_valid_tactics(op, variant):
    pytest.importorskip(f"edgesdk.kernels.{op}", reason=f"edgesdk/kernels/{op}.py not committed yet")
    spec = L.spec_for(op)
    attrs = _packed(op, 40, 96, True, variant).node_attributes()
    for m in (None, 1, 7, 197, 4096):
        ts = L.tactics(spec, attrs, m)
        assert 1 in ts, "tactic 1 is the launcher's default and must always be valid"


def test_spec_rejects_inconsistent_declarations():
    with pytest.raises(EdgeSDKError, match="'n'"):
        L.OpSpec(op="t", op_type="EdgeT", attributes={"k": int}, tensor_names=(), tensor_dtypes=())
    with pytest.raises(EdgeSDKError, match="TENSOR_DTYPES"):
        L.OpSpec(op="t", op_type="EdgeT", attributes={"n": int, "k": int}, tensor_names=("w",))
    with pytest.raises(EdgeSDKError, match="int, float or str"):
        L.OpSpec(op="t", op_type="EdgeT", attributes={"n": int, "k": int, "l": list}, tensor_names=())
    with pytest.raises(EdgeSDKError, match="unknown plugin operator"):
        L.spec_for("sparse_kv")


def test_tensorrt_free_imports():
    import edgesdk.trt.bitmap_linear
    import edgesdk.trt.engine
    import edgesdk.trt.plugins
    import edgesdk.trt.registry
    import edgesdk.trt.vitbit_gemm  # noqa: F401

    import importlib.util

    # importing the plugin layer never imports TensorRT (it is imported lazily, where installed)
    assert importlib.util.find_spec("tensorrt") is not None or "tensorrt" not in sys.modules


def test_forced_tactics_select_a_subset():
    assert L.select_tactics([1, 2, 3], None) == [1, 2, 3]
    assert L.select_tactics([1, 2, 3], [3]) == [3]
    for bad in ([4], []):
        with pytest.raises(EdgeSDKError, match="forced tactics"):
            L.select_tactics([1, 2, 3], bad)
    assert L.resolve_tactic(0) == 1 and L.resolve_tactic(5) == 5


# Python-side methods of the TensorRT 10.x V3-One plugin interfaces with their positional parameters
# after self (pyPlugin.cpp bindings; tensorrt-stubs 10.13 agree). All are required except
# get_workspace_size / get_valid_tactics, which edgesdk needs anyway.
PLUGIN_METHODS = {
    "get_capability_interface": 1, "clone": 0, "get_output_data_types": 1, "get_output_shapes": 3,
    "supports_format_combination": 3, "configure_plugin": 2, "get_workspace_size": 2, "get_valid_tactics": 0,
    "set_tactic": 1, "on_shape_change": 2, "attach_to_context": 1, "get_fields_to_serialize": 0, "enqueue": 6,
}
PLUGIN_ATTRS = {"plugin_name", "plugin_version", "plugin_namespace", "num_outputs", "timing_cache_id"}
CREATOR_ATTRS = {"name", "plugin_version", "plugin_namespace", "field_names"}


def test_plugin_classes_define_every_required_method():
    """Read edgesdk/trt/plugins.py without TensorRT: every method TensorRT calls is there with its arity."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(L.__file__).with_name("plugins.py").read_text())
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    plugin, creator = classes["Plugin"], classes["Creator"]

    def methods(cls):
        return {f.name: len(f.args.args) - 1 for f in cls.body if isinstance(f, ast.FunctionDef)}

    def self_attrs(cls):
        init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
        return {t.attr for node in ast.walk(init) if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Attribute)} | {
            e.attr for node in ast.walk(init) if isinstance(node, ast.Assign) for t in node.targets
            if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Attribute)}

    got = methods(plugin)
    assert {m: got.get(m) for m in PLUGIN_METHODS} == PLUGIN_METHODS
    assert PLUGIN_ATTRS <= self_attrs(plugin)
    assert methods(creator).get("create_plugin") == 3 and CREATOR_ATTRS <= self_attrs(creator)
    assert {ast.unparse(b) for b in plugin.bases} == {"trt.IPluginV3", "trt.IPluginV3OneCore",
                                                      "trt.IPluginV3OneBuild", "trt.IPluginV3OneRuntime"}
    assert [ast.unparse(b) for b in creator.bases] == ["trt.IPluginCreatorV3One"]


def test_registry_lookup_lists_creators_instead_of_asking_for_missing_ones():
    """TensorRT logs an API-usage error for every get_creator miss, so registration looks in all_creators;
    only a registry without that listing is asked (edgesdk/trt/registry.py)."""
    from edgesdk.trt.registry import _registered

    class C:
        def __init__(self, name, version=L.PLUGIN_VERSION, ns=L.PLUGIN_NAMESPACE):
            self.name, self.plugin_version, self.plugin_namespace = name, version, ns

    class Listing:
        all_creators = [C("EdgeBitmapLinear"), C("EdgeVitBitGemm", ns="other"), C("EdgeVitBitGemm", version="2")]

        def get_creator(self, *a):
            raise AssertionError("get_creator must not be called where all_creators lists the creators")

    assert _registered(Listing(), "EdgeBitmapLinear") and not _registered(Listing(), "EdgeVitBitGemm")

    class Asking:
        asked: list = []

        def get_creator(self, *a):
            self.asked.append(a)
            return None

    r = Asking()
    assert not _registered(r, "EdgeBitmapLinear") and r.asked == [("EdgeBitmapLinear", L.PLUGIN_VERSION,
                                                                     L.PLUGIN_NAMESPACE)]
