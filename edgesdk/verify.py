"""Verification: ONNX Runtime on the original model vs ONNX Runtime on the processed one, via Polygraphy;
and, where a TensorRT engine was built, the engine vs ONNX Runtime on the processed model.

The ONNX Runtime sides run in :func:`edgesdk.ort.make_session` (CPU, ``ORT_DISABLE_ALL``, plugin nodes
through their reference ops) under Polygraphy's ``Comparator``; pass/fail per output comes from
``SimpleCompareFunc``/``CompareFunc.simple`` (mean absolute error ≤ atol, or mean relative error ≤ rtol) together with
a cosine-similarity floor. The figures reported per output: ``max_abs``, ``rel_l2``
(‖a−b‖₂/‖a‖₂), ``cosine`` and, for outputs that look like class scores (float, last dim ≥ 2),
``top1_agreement`` (fraction of rows whose argmax over the last axis agrees), and Polygraphy's own mean absolute
and relative errors of the worst sample (``worst_mean_abs``, ``worst_mean_rel``: what ``atol``/``rtol`` are held
against); a failing row says ``why``.
"""

from __future__ import annotations

import numpy as np
import onnx

ORIGINAL, PROCESSED, ENGINE = "onnxrt-original", "onnxrt-processed", "tensorrt-engine"


def verify(original: onnx.ModelProto, processed: onnx.ModelProto, feeds: list[dict[str, np.ndarray]],
           config) -> list[dict]:
    """Compare ``processed`` against ``original`` on ``feeds``.

    Args:
        original: The model as loaded.
        processed: The model after quantization/rewrite.
        feeds: Input dicts (each one inference).
        config: Reads ``atol``, ``rtol``, ``min_cosine``.

    Returns:
        One dict per output: ``output, runners, samples, max_abs, mean_abs, rel_l2, cosine,
        top1_agreement (or None), worst_mean_abs, worst_mean_rel, atol, rtol, min_cosine, passed`` and, where it
        failed, ``why``.
    """
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from edgesdk.ort import make_session

    return compare([OnnxrtRunner(lambda: make_session(original), name=ORIGINAL),
                    OnnxrtRunner(lambda: make_session(processed), name=PROCESSED)], feeds, config)


def verify_engine(plan: bytes, processed: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], config) -> list[dict]:
    """Compare a TensorRT engine (``plan``, serialized) against ONNX Runtime on ``processed`` on ``feeds``.

    Registers edgesdk's plugin creators before TensorRT deserializes the plan. Never run: TensorRT cannot be
    installed where this was written (``tools/trt_smoke.py`` exercises it through ``edgesdk build``).

    Returns:
        As :func:`verify`, runners ``onnxrt-processed`` and ``tensorrt-engine``.

    Raises:
        EdgeSDKError: TensorRT is not installed or refused edgesdk's plugins.
    """
    from polygraphy.backend.onnxrt import OnnxrtRunner
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    from edgesdk.ort import make_session
    from edgesdk.trt.registry import register_plugins

    register_plugins()
    return compare([OnnxrtRunner(lambda: make_session(processed), name=PROCESSED),
                    TrtRunner(EngineFromBytes(plan), name=ENGINE)], feeds, config)


def simple_compare_func(atol: float, rtol: float, check_error_stat: str = "mean"):
    """Polygraphy's simple comparison: ``SimpleCompareFunc`` (PyPI's 0.53) or ``CompareFunc.simple`` (0.49, the
    version in TensorRT's own repository, ``tools/Polygraphy``, and the oldest pyproject.toml allows; same arguments
    and results)."""
    try:
        from polygraphy.comparator import SimpleCompareFunc
    except ImportError:
        from polygraphy.comparator import CompareFunc

        return CompareFunc.simple(atol=atol, rtol=rtol, check_error_stat=check_error_stat)
    return SimpleCompareFunc(atol=atol, rtol=rtol, check_error_stat=check_error_stat)


def compare(runners: list, feeds: list[dict[str, np.ndarray]], config) -> list[dict]:
    """Run two Polygraphy runners (reference first) on ``feeds`` and compare them, one row per output."""
    from polygraphy.comparator import Comparator
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.CRITICAL  # our own table reports the results
    results = Comparator.run(runners, data_loader=feeds)
    compare_func = simple_compare_func(config.atol, config.rtol, "mean")
    accuracy = Comparator.compare_accuracy(results, compare_func=compare_func)
    if not hasattr(accuracy, "values"):  # polygraphy >= 0.53: AccuracyResults, one AccuracyResult per compare func
        accuracy = accuracy[0]
    verdicts: dict[str, bool] = {}
    worst: dict[str, list[float]] = {}  # Polygraphy's mean abs / rel error of the worst sample (what the tolerances see)
    for iteration in next(iter(accuracy.values())):
        for name, res in iteration.items():
            verdicts[name] = verdicts.get(name, True) and bool(res)
            got = [float(getattr(res, f, np.nan)) for f in ("mean_absdiff", "mean_reldiff")]
            worst[name] = [np.nanmax([a, b]) for a, b in zip(worst.get(name, got), got)]

    (_, ref_iters), (_, out_iters) = results[0], results[1]
    rows = []
    for name in ref_iters[0].keys():
        a = np.concatenate([np.asarray(it[name], np.float64).reshape(-1) for it in ref_iters])
        b = np.concatenate([np.asarray(it[name], np.float64).reshape(-1) for it in out_iters])
        m = metrics(a, b)
        last = np.asarray(ref_iters[0][name])
        top1 = None
        if np.issubdtype(last.dtype, np.floating) and last.ndim >= 2 and last.shape[-1] >= 2:
            ra = np.concatenate([np.asarray(it[name]).reshape(-1, last.shape[-1]).argmax(-1) for it in ref_iters])
            rb = np.concatenate([np.asarray(it[name]).reshape(-1, last.shape[-1]).argmax(-1) for it in out_iters])
            top1 = float(np.mean(ra == rb))
        passed = verdicts.get(name, False) and m["cosine"] >= config.min_cosine
        w_abs, w_rel = (None if not np.isfinite(x) else float(x) for x in worst.get(name, [np.nan, np.nan]))
        row = {"output": name, "runners": [r.name for r in runners], "samples": len(feeds), **m,
               "top1_agreement": top1, "worst_mean_abs": w_abs, "worst_mean_rel": w_rel, "atol": config.atol,
               "rtol": config.rtol, "min_cosine": config.min_cosine, "passed": bool(passed)}
        if not passed:
            row["why"] = why(row, verdicts.get(name, False))
        rows.append(row)
    return rows


def why(row: dict, within_tolerance: bool) -> str:
    """The failed criteria of a row, with the figures and the flags that set them."""
    def g(v):
        return "-" if v is None else format(v, ".3g")

    def flag(v):  # a threshold as the user gave it (--min-cosine 0.99999 is not "1")
        return "-" if v is None else format(v, ".15g")

    out = []
    if not within_tolerance:
        out.append(f"mean abs error {g(row['worst_mean_abs'])} > --atol {flag(row['atol'])} and mean rel error "
                   f"{g(row['worst_mean_rel'])} > --rtol {flag(row['rtol'])} (worst sample)")
    if row["cosine"] < row["min_cosine"]:
        out.append(f"cosine {_below(row['cosine'], row['min_cosine'])} < --min-cosine {flag(row['min_cosine'])}")
    return "; ".join(out)


def _below(value: float, limit: float) -> str:
    """``value`` with as few decimals (5 at least) as show it below ``limit`` (0.999994 < 0.999995, not 0.99999)."""
    for d in range(5, 13):
        text = f"{value:.{d}f}"
        if float(text) < limit:
            return text
    return repr(value)


def metrics(ref: np.ndarray, out: np.ndarray) -> dict:
    """``max_abs``, ``mean_abs``, ``rel_l2`` and ``cosine`` of ``out`` against ``ref`` (float64)."""
    ref = np.asarray(ref, np.float64).reshape(-1)
    out = np.asarray(out, np.float64).reshape(-1)
    if not (np.all(np.isfinite(ref)) and np.all(np.isfinite(out))):
        return {"max_abs": float("inf"), "mean_abs": float("inf"), "rel_l2": float("inf"), "cosine": -1.0}
    d = out - ref
    nr, no = np.linalg.norm(ref), np.linalg.norm(out)
    cos = float(ref @ out / (nr * no)) if nr > 0 and no > 0 else float(nr == no)
    return {"max_abs": float(np.max(np.abs(d))) if d.size else 0.0,
            "mean_abs": float(np.mean(np.abs(d))) if d.size else 0.0,
            "rel_l2": float(np.linalg.norm(d) / nr) if nr > 0 else float(np.linalg.norm(d)),
            "cosine": cos}
