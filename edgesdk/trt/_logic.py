"""Everything the TensorRT plugins decide, as plain functions tested without TensorRT.

The plugin classes in :mod:`edgesdk.trt.plugins` only translate TensorRT's objects (``DataType``,
``TensorFormat``, ``DimsExprs``, ``PluginField``) into the plain values used here (dtype names such
as ``"float16"``, format names such as ``"LINEAR"``, ints) and back.

An operator is described by an :class:`OpSpec` built from its format module
(``edgesdk.formats.<op>``: ``OP_TYPE``, ``TENSOR_NAMES``, ``ATTRIBUTES``) and launched through its
launcher module (``edgesdk.kernels.<op>``: ``valid_tactics``, ``launch``, ``workspace_bytes``).
:func:`enqueue` is the one function the plugin's ``enqueue`` calls; ``tools/plugin_launch_check.py``
calls the same function with raw device pointers on a GPU.
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence, TypeVar

import numpy as np

from edgesdk.errors import EdgeSDKError

PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = "edgesdk"
# The plugin operators, by slice name (same name at every layer of the SDK).
OPS = ("bitmap_linear", "vitbit_gemm")

# ONNX attribute type → TensorRT plugin field type (name of a trt.PluginFieldType member).
FIELD_TYPES = {int: "INT32", float: "FLOAT32", str: "CHAR"}
X_DTYPES = ("float16", "float32")
# dtype of each node input after X, per operator, where the format module has no TENSOR_DTYPES
# (tests check this table against each format's ``to_tensors()``).
KNOWN_TENSOR_DTYPES = {
    "bitmap_linear": ("int8", "int8", "int32", "float32", "float32"),
    "vitbit_gemm": ("int8", "float32", "float32"),
}


@dataclass(frozen=True)
class OpSpec:
    """What the plugin layer needs to know about one operator.

    Args:
        op (str): Slice name, e.g. ``"bitmap_linear"``.
        op_type (str): ONNX op_type = TensorRT plugin name, e.g. ``"EdgeBitmapLinear"``.
        attributes (dict[str, type]): Node attributes = plugin fields (int, float or str).
        tensor_names (tuple[str, ...]): Node inputs after X; the last is the bias, present only when
            attribute ``has_bias`` is 1.
        tensor_dtypes (tuple[str, ...]): dtype of each of ``tensor_names`` (the format module's
            ``TENSOR_DTYPES``, else :data:`KNOWN_TENSOR_DTYPES`).
        n_attr (str): Attribute holding the output features N.
        k_attr (str): Attribute holding the input features K.
        launcher (str): Module with ``valid_tactics``, ``launch`` and ``workspace_bytes``.
        validate (Callable): The format's ``validate_attributes(attrs) -> attrs`` where it has one.
        x_dtypes (tuple[str, ...]): dtypes X may have (the format's ``X_DTYPES``, else fp16/fp32); an int8 X
            needs a non-empty ``y_dtype`` attribute, which is then Y's dtype.
        defaults (dict): attributes a node may omit, with their value then (``ATTRIBUTE_DEFAULTS``).
    """

    op: str
    op_type: str
    attributes: dict[str, type]
    tensor_names: tuple[str, ...]
    tensor_dtypes: tuple[str, ...] = ()
    n_attr: str = "n"
    k_attr: str = "k"
    launcher: str = ""
    validate: Callable[[dict], dict] | None = None
    x_dtypes: tuple[str, ...] = X_DTYPES
    defaults: dict = field(default_factory=dict)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        if len(self.tensor_dtypes) != len(self.tensor_names):
            raise EdgeSDKError(f"{self.op_type}: {len(self.tensor_names)} tensor names but "
                               f"{len(self.tensor_dtypes)} tensor dtypes",
                               f"declare TENSOR_DTYPES in edgesdk/formats/{self.op}.py")
        for a in (self.n_attr, self.k_attr):
            if self.attributes.get(a) is not int:
                raise EdgeSDKError(f"{self.op_type}: attribute {a!r} must be an int attribute, "
                                   f"attributes are {sorted(self.attributes)}",
                                   f"declare {a!r}: int in edgesdk/formats/{self.op}.py ATTRIBUTES")
        for name, t in self.attributes.items():
            if t not in FIELD_TYPES:
                raise EdgeSDKError(f"{self.op_type}: attribute {name!r} has type {t!r}; TensorRT "
                                   "plugin fields here are int, float or str",
                                   "encode it as one of those")

    def launcher_module(self):
        """The launcher module (imported once)."""
        mod = self._cache.get("launcher")
        if mod is None:
            mod = importlib.import_module(self.launcher or f"edgesdk.kernels.{self.op}")
            self._cache["launcher"] = mod
            self._cache["launch_takes_workspace"] = "workspace" in inspect.signature(mod.launch).parameters
        return mod


def spec_for(op: str) -> OpSpec:
    """The :class:`OpSpec` of slice ``op`` from ``edgesdk.formats.<op>``."""
    if op not in OPS:
        raise EdgeSDKError(f"unknown plugin operator {op!r}", f"use one of {', '.join(OPS)}")
    fmt = importlib.import_module(f"edgesdk.formats.{op}")
    dtypes = getattr(fmt, "TENSOR_DTYPES", None) or KNOWN_TENSOR_DTYPES.get(op, ())
    return OpSpec(op=op, op_type=fmt.OP_TYPE, attributes=dict(fmt.ATTRIBUTES),
                  tensor_names=tuple(fmt.TENSOR_NAMES),
                  tensor_dtypes=tuple(np.dtype(d).name for d in dtypes),
                  validate=getattr(fmt, "validate_attributes", None),
                  x_dtypes=tuple(getattr(fmt, "X_DTYPES", X_DTYPES)),
                  defaults=dict(getattr(fmt, "ATTRIBUTE_DEFAULTS", {})))


# ------------------------------------------------------------------------------------------------
# Fields: creator field names, serialization, deserialization
# ------------------------------------------------------------------------------------------------


def field_names(spec: OpSpec) -> list[tuple[str, str]]:
    """``[(name, field type)]`` for the creator's ``field_names`` (the parser forwards only these)."""
    return [(name, FIELD_TYPES[t]) for name, t in spec.attributes.items()]


def encode_fields(spec: OpSpec, attrs: dict) -> list[tuple[str, np.ndarray, str]]:
    """``[(name, data, field type)]`` for ``get_fields_to_serialize``: every attribute.

    Strings are UTF-8 bytes with a trailing NUL (as the ONNX parser hands them over); ints are one
    int32, floats one float32. A deserialized plugin needs nothing else (the packed weights are
    node inputs baked into the engine by TensorRT).
    """
    out = []
    for name, t in spec.attributes.items():
        if name not in attrs:
            raise EdgeSDKError(f"{spec.op_type}: attribute {name!r} missing",
                               "rebuild the model with this edgesdk version")
        v = attrs[name]
        if t is int:
            if not -2**31 <= int(v) < 2**31:
                raise EdgeSDKError(f"{spec.op_type}: attribute {name}={v} does not fit int32",
                                   "this layer is too large for the plugin")
            data = np.array([int(v)], dtype=np.int32)
        elif t is float:
            data = np.array([float(v)], dtype=np.float32)
        else:
            data = np.frombuffer(str(v).encode("utf-8") + b"\0", dtype=np.int8).copy()
        out.append((name, data, FIELD_TYPES[t]))
    return out


def decode_char(data: Any) -> str:
    """A CHAR field's value as str: accepts str, bytes or an int8/uint8/bytes numpy array.

    Trailing NULs are stripped (the ONNX parser appends one; ``non_zero_plugin.py`` strips it too).
    """
    if isinstance(data, str):
        return data.rstrip("\0")
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
    else:
        arr = np.asarray(data)
        raw = arr.tobytes() if arr.dtype.kind != "U" else "".join(arr.ravel().tolist()).encode()
    return raw.rstrip(b"\0").decode("utf-8")


def attrs_from_fields(spec: OpSpec, fields: Iterable[tuple[str, Any]]) -> dict:
    """Attributes from ``(name, data)`` pairs as a creator receives them (build or runtime phase).

    Unknown fields are ignored; every attribute of ``spec`` must be present.

    Raises:
        EdgeSDKError: a field is missing or holds a value of the wrong size.
    """
    got = {}
    for name, data in fields:
        t = spec.attributes.get(name)
        if t is None:
            continue
        if t is str:
            got[name] = decode_char(data)
            continue
        arr = np.asarray(data).ravel()
        if arr.size != 1:
            raise EdgeSDKError(f"{spec.op_type}: field {name!r} holds {arr.size} values, expected 1",
                               "re-export the ONNX model with edgesdk (one value per attribute)")
        got[name] = int(arr[0]) if t is int else float(arr[0])
    for name, value in spec.defaults.items():
        got.setdefault(name, value)
    missing = [n for n in spec.attributes if n not in got]
    if missing:
        raise EdgeSDKError(f"{spec.op_type}: plugin fields {missing} missing",
                           "rewrite the model again with edgesdk (node attributes are plugin fields)")
    for a in (spec.n_attr, spec.k_attr):
        if got[a] <= 0:
            raise EdgeSDKError(f"{spec.op_type}: {a}={got[a]} must be positive", "repack the weights")
    return dict(spec.validate(got)) if spec.validate is not None else got


def timing_cache_id(spec: OpSpec, attrs: dict) -> str:
    """Layers with equal attributes share tactic timings (also across builds, via the cache file)."""
    return ";".join(f"{k}={attrs[k]}" for k in sorted(spec.attributes))


# ------------------------------------------------------------------------------------------------
# Shapes, types, formats
# ------------------------------------------------------------------------------------------------


def num_inputs(spec: OpSpec, attrs: dict) -> int:
    """Node inputs: X, the packed tensors, and the bias only when ``has_bias`` is 1."""
    has_bias = int(attrs.get("has_bias", 1)) == 1
    return 1 + len(spec.tensor_names) - (0 if has_bias else 1)


D = TypeVar("D")


def output_dims(spec: OpSpec, attrs: dict, x_dims: Sequence[D], const: Callable[[int], D],
                value_of: Callable[[D], int | None] = lambda d: d if isinstance(d, int) and d >= 0 else None,
                ) -> list[D]:
    """Y's dims from X's: ``[..., K]`` → ``[..., N]``, any rank ≥ 2.

    Works on ints (``const=int``) and on TensorRT dimension expressions
    (``const=expr_builder.constant``, ``value_of`` reading constant expressions).

    Raises:
        EdgeSDKError: rank < 2, or a known last dim that is not K.
    """
    if len(x_dims) < 2:
        raise EdgeSDKError(f"{spec.op_type}: X has rank {len(x_dims)}; it must be [..., K] with rank >= 2",
                           "reshape the input to [batch, ..., K]")
    k = value_of(x_dims[-1])
    if k is not None and k != attrs[spec.k_attr]:
        raise EdgeSDKError(f"{spec.op_type}: X's last dim is {k} but the packed weights have "
                           f"K={attrs[spec.k_attr]}", "feed the layer an input with K features")
    return [*x_dims[:-1], const(int(attrs[spec.n_attr]))]


def output_dtype(spec: OpSpec, input_dtypes: Sequence[str], attrs: dict | None = None) -> str:
    """Y's dtype: X's (float16 or float32), or, where the node has a non-empty ``y_dtype`` attribute (required
    for an int8 X), that one."""
    x = input_dtypes[0]
    y = str((attrs or {}).get("y_dtype") or "")
    if x not in spec.x_dtypes or (x not in X_DTYPES and not y):
        raise EdgeSDKError(f"{spec.op_type}: X is {x}; the plugin takes "
                           f"{' or '.join(spec.x_dtypes)}" + (" (int8 with attribute y_dtype set)"
                                                            if "int8" in spec.x_dtypes else ""),
                           "cast the layer input to float16 or float32")
    if y and x in X_DTYPES and y != x:
        raise EdgeSDKError(f"{spec.op_type}: X is {x} but attribute y_dtype is {y}",
                           f"cast X to {y}, or rewrite the node with edgesdk")
    return y or x


def input_dtypes_allowed(spec: OpSpec, pos: int, attrs: dict | None = None) -> tuple[str, ...]:
    """dtypes allowed for node input ``pos`` (0 = X; int8 only where the node sets ``y_dtype``)."""
    if pos:
        return (spec.tensor_dtypes[pos - 1],)
    y = str((attrs or {}).get("y_dtype") or "")
    return tuple(d for d in spec.x_dtypes if d in X_DTYPES and (not y or d == y)) + \
        (("int8",) if y and "int8" in spec.x_dtypes else ())


def supports_format(spec: OpSpec, pos: int, dtypes: Sequence[str], formats: Sequence[str],
                    n_inputs: int, attrs: dict | None = None) -> bool:
    """``supports_format_combination``: everything LINEAR; X fp16/fp32 (or int8 where the node sets
    ``y_dtype``); Y = :func:`output_dtype`.

    Only entries ``0..pos`` of ``dtypes``/``formats`` are looked at (TensorRT: reading later ones is
    undefined behaviour).
    """
    if formats[pos] != "LINEAR":
        return False
    if pos < n_inputs:
        return dtypes[pos] in input_dtypes_allowed(spec, pos, attrs)
    if pos != n_inputs or dtypes[0] not in input_dtypes_allowed(spec, 0, attrs):
        return False
    return dtypes[pos] == output_dtype(spec, dtypes[:1], attrs)


def format_combinations(spec: OpSpec, n_inputs: int, attrs: dict | None = None) -> list[tuple[str, ...]]:
    """Every (input dtypes..., output dtype) combination :func:`supports_format` accepts (all LINEAR)."""
    choices = [input_dtypes_allowed(spec, p, attrs) for p in range(n_inputs)]
    combos: list[tuple[str, ...]] = [()]
    for c in choices:
        combos = [(*prefix, d) for prefix in combos for d in c]
    n = n_inputs + 1
    out = []
    for cmb in combos:
        full = (*cmb, output_dtype(spec, cmb[:1], attrs))
        if all(supports_format(spec, p, full, ["LINEAR"] * n, n_inputs, attrs) for p in range(n)):
            out.append(full)
    return out


def rows(dims: Sequence[int]) -> int:
    """M = product of X's leading dims."""
    return int(math.prod(int(d) for d in dims[:-1]))


# ------------------------------------------------------------------------------------------------
# Tactics, workspace, launch
# ------------------------------------------------------------------------------------------------


def tactics(spec: OpSpec, attrs: dict, m: int | None = None) -> list[int]:
    """The launcher's ``valid_tactics``, checked: non-empty, unique, positive ints."""
    ts = [int(t) for t in spec.launcher_module().valid_tactics(attrs, m)]
    if not ts or len(set(ts)) != len(ts) or min(ts) <= 0:
        raise EdgeSDKError(f"{spec.op_type}: launcher returned invalid tactics {ts}",
                           f"fix valid_tactics in edgesdk/kernels/{spec.op}.py (unique positive ints)")
    return ts


def select_tactics(valid: list[int], forced: Sequence[int] | None) -> list[int]:
    """``valid``, or only the ``forced`` ones (to build one engine per tactic); refuses unknown ones."""
    if forced is None:
        return valid
    bad = [t for t in forced if t not in valid]
    if bad or not forced:
        raise EdgeSDKError(f"forced tactics {list(forced)} are not among the valid ones {valid}",
                           "pick tactics from get_valid_tactics()")
    return [int(t) for t in forced]


def resolve_tactic(tactic: int) -> int:
    """TensorRT passes 0 when it chose no custom tactic; the launcher's default is 1."""
    return int(tactic) if int(tactic) > 0 else 1


def workspace_bytes(spec: OpSpec, attrs: dict, m: int) -> int:
    """Scratch bytes for ``m`` rows (``get_workspace_size`` asks with the profile's max M)."""
    fn = getattr(spec.launcher_module(), "workspace_bytes", None)
    return int(fn(attrs, m)) if fn is not None else 0


def enqueue(spec: OpSpec, attrs: dict, x_dtype: str, x_dims: Sequence[int], inputs: Sequence[int],
            outputs: Sequence[int], workspace: int, stream: int, tactic: int) -> None:
    """Launch the operator on ``stream``: exactly what the TensorRT plugin's ``enqueue`` does.

    Args:
        spec (OpSpec): The operator.
        attrs (dict): Its attributes (plugin fields).
        x_dtype (str): ``"float16"`` or ``"float32"`` (or ``"int8"`` where the operator takes it).
        x_dims (Sequence[int]): X's resolved dims.
        inputs (Sequence[int]): Raw device pointers in node order.
        outputs (Sequence[int]): ``[Y]``.
        workspace (int): Device pointer to ``workspace_bytes`` of scratch (0 if none).
        stream (int): Raw ``cudaStream_t``.
        tactic (int): Chosen tactic (0 → the default).

    No allocation, no host synchronisation: capturable in a CUDA graph.
    """
    m = rows(x_dims)
    if m == 0:
        return
    launcher = spec.launcher_module()
    kw = {"workspace": int(workspace)} if spec._cache["launch_takes_workspace"] else {}
    launcher.launch(attrs, x_dtype, m, [int(p) for p in inputs], [int(p) for p in outputs],
                    int(stream), resolve_tactic(tactic), **kw)
