"""Per-layer INT8 error: which quantized linears cost the most accuracy.

When a build fails its verification, ``--exclude`` (layers left float) is one of the fixes, but a model has tens
to hundreds of linears. This module measures each INT8 linear's own error, the way per-layer sensitivity tools
(ModelOpt, AIMET, Polygraphy's layer-wise comparison) do, so the report can name the layers to try first.

For every quantized linear of the Q/DQ model, the float activation ``X`` that reaches its QuantizeLinear is taken
from a run of the Q/DQ model itself on the verification inputs (so it carries the error of the layers before it, as
the deployed model's would), and the layer's output is recomputed in numpy four ways:

* ``Y = X · W`` with ``W`` the float weight ONNX Runtime quantized (the source model's, with SmoothQuant's factors
  applied when the build smoothed),
* with ``X`` quantized per tensor at the model's activation scale (``clip(rint(X / s), -128, 127) · s``, as
  QuantizeLinear + DequantizeLinear compute it),
* with ``W`` dequantized from its INT8 values and per-channel scales,
* with both (what the Q/DQ model computes).

Each error is reported as a signal-to-quantization-noise ratio of the output,
``SQNR = 10 · log10(Σ Y² / Σ (Y − Ŷ)²)`` in dB (higher is better; 20 dB ≈ 10 % relative RMS error, 40 dB ≈ 1 %):
``sqnr_db`` (both), ``sqnr_act_db`` (activation only), ``sqnr_weight_db`` (weight only); an exact result reads
``EXACT_DB`` (300 dB: JSON has no infinity). A model that arrived already in Q/DQ form has no float weights: its
layers get the activation figure only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx

from edgesdk.inspect import GraphIndex, LinearInfo, find_linears, weight_kn

EXACT_DB = 300.0  # no error at all (float64 noise floors are far below a real INT8 error of 10-50 dB)
ROWS = 512  # activation rows used per layer (evenly spaced over all rows of all samples): enough for a stable dB


def _sqnr(signal: float, noise: float) -> float | None:
    if signal <= 0:
        return None
    if noise <= signal * 10.0 ** (-EXACT_DB / 10):
        return EXACT_DB
    return round(10.0 * math.log10(signal / noise), 2)


def qdq(x: np.ndarray, scale: float) -> np.ndarray:
    """Symmetric INT8 QuantizeLinear then DequantizeLinear (zero point 0), in float32 as ONNX Runtime does it."""
    s = np.float32(scale)
    return (np.clip(np.rint(x.astype(np.float32) / s), -128, 127) * s).astype(np.float32)


def _rows(x: np.ndarray, info: LinearInfo) -> np.ndarray:
    x = np.asarray(x)
    x = x.T if info.trans_a else x.reshape(-1, x.shape[-1])
    return x


def _pick(parts: list[np.ndarray], limit: int) -> np.ndarray:
    x = np.concatenate(parts, 0) if len(parts) > 1 else parts[0]
    if len(x) > limit:
        x = x[np.linspace(0, len(x) - 1, limit).round().astype(int)]
    return x.astype(np.float32)


def layer_errors(quantized: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]],
                 source: onnx.ModelProto | None = None, smoothing: dict | None = None,
                 rows: int = ROWS) -> dict[str, dict[str, float | None]]:
    """Per quantized linear of ``quantized``: ``{"sqnr_db", "sqnr_act_db", "sqnr_weight_db"}`` (dB, see module).

    Args:
        quantized: The Q/DQ model (before the rewrite into plugin nodes).
        feeds: Inputs to run it on (the verification samples).
        source: The float model that was quantized (its weights, as loaded); None when it came quantized, and then
            only ``sqnr_act_db`` is measured (``sqnr_db`` equals it; ``sqnr_weight_db`` is None).
        smoothing: The factors :func:`edgesdk.quantize.quantize_int8` applied (its ``smoothing`` dict), or None.
        rows: Activation rows per layer at most.

    Layers without a symmetric per-tensor activation scale (nothing to recompute exactly) are left out.
    """
    return layer_errors_by(quantized, {"": feeds}, source, smoothing, rows)[""]


def layer_errors_by(quantized: onnx.ModelProto, groups: dict[str, Sequence[dict[str, np.ndarray]]],
                    source: onnx.ModelProto | None = None, smoothing: dict | None = None,
                    rows: int = ROWS) -> dict[str, dict[str, dict[str, float | None]]]:
    """:func:`layer_errors` of each group of inputs (label → feeds; e.g. the build shape and the optimization
    profile's ends, whose activations can differ a lot: an LLM's first token alone), from one session.
    Returns label → layer → errors."""
    from edgesdk.ort import make_session
    from edgesdk.rewrite import _act_scale

    ix = GraphIndex(quantized)
    layers = [li for li in find_linears(quantized) if li.quantized]
    scales = {li.name: _act_scale(ix, li) for li in layers}
    layers = [li for li in layers if scales[li.name] is not None]
    groups = {k: v for k, v in groups.items() if v}
    if not layers or not groups:
        return {k: {} for k in groups}
    src = {li.name: li for li in find_linears(source)} if source is not None else {}
    src_ix = GraphIndex(source) if source is not None else None
    probes = sorted({li.input for li in layers})
    sess = make_session(quantized, outputs=probes)
    names = [o.name for o in sess.get_outputs()]
    got: dict[str, dict[str, list[np.ndarray]]] = {}
    for label, feeds in groups.items():
        got[label] = {p: [] for p in probes}
        for f in feeds:
            for n, v in zip(names, sess.run(None, f)):
                if n in got[label] and np.asarray(v).size:
                    got[label][n].append(np.asarray(v))
    del sess
    out: dict[str, dict[str, dict[str, float | None]]] = {label: {} for label in groups}
    for li in layers:
        wq = weight_kn(quantized, li, ix).astype(np.float32)  # dequantized INT8 weight, [K, N]
        s = src.get(li.name)
        w = None
        if s is not None and not s.quantized and (s.k, s.n) == (li.k, li.n):
            w = weight_kn(source, s, src_ix).astype(np.float64)
            r, c, _ = (smoothing or {}).get(li.name, (None, None, None))
            if r is not None:
                w = w * np.asarray(r, np.float64)[:, None]
            if c is not None:
                w = w / np.asarray(c, np.float64)[None, :]
            w = w.astype(np.float32)
        for label in groups:
            parts = [p for p in (_rows(v, li) for v in got[label][li.input]) if p.shape[-1] == li.k and len(p)]
            if parts:
                out[label][li.name] = _errors(_pick(parts, rows), scales[li.name], w, wq)
    return out


def _errors(x: np.ndarray, scale: float, w: np.ndarray | None, wq: np.ndarray) -> dict[str, float | None]:
    xq = qdq(x, scale)
    wf = w if w is not None else wq
    y = x @ wf
    e_act = (x - xq) @ wf
    signal = float(np.sum(y.astype(np.float64) ** 2))
    act = _sqnr(signal, float(np.sum(e_act.astype(np.float64) ** 2)))
    if w is None:
        return {"sqnr_db": act, "sqnr_act_db": act, "sqnr_weight_db": None}
    d = wf - wq
    e_w = x @ d
    e_both = e_act + xq @ d  # X·W − Q(X)·Ŵ = (X − Q(X))·W + Q(X)·(W − Ŵ)
    return {"sqnr_db": _sqnr(signal, float(np.sum(e_both.astype(np.float64) ** 2))), "sqnr_act_db": act,
            "sqnr_weight_db": _sqnr(signal, float(np.sum(e_w.astype(np.float64) ** 2)))}
