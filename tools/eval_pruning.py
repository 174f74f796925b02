"""Measure what pruning + the plugin rewrite cost on real models (CPU, ONNX Runtime).

    python tools/eval_pruning.py smollm2 MODEL.onnx [--sparsity 0.5] [--window 128]
        Perplexity of SmolLM2-135M (exported by ``python -m models.recipes smollm2``) on real
        English text shipped in installed packages (``models.recipes.english_text``): dense,
        magnitude and Wanda at the given sparsity (lm_head kept dense). The first quarter of the
        token windows calibrates Wanda, the rest is evaluated. Then one evaluation window runs
        through the rewritten graph with ``EdgeBitmapLinear`` nodes (every linear but lm_head).

        ``--mask tile8``: instead of per output row, every 8 x 8 tile of W (8 rows x 8 consecutive input
        channels) keeps exactly its ``round((1 - sparsity) * 64)`` highest scores ("balanced" pruning, the records of
        ``tools/bitmap_balanced.cu``; layers whose N or K is not a multiple of 8 stay per row). Not an SDK option:
        it measures what that constraint costs against per-row pruning. ``--mask tile8half``: the tile's even and
        odd columns balanced separately; ``--mask tile8pair``: pairs of adjacent channels kept or pruned together,
        ``round((1 - sparsity) * 32)`` pairs per tile (the walks of ``tools/bitmap_lanebank.cu``).

    python tools/eval_pruning.py rewrite MODEL.onnx [--sparsity 0.5] [--kernels bitmap]
        Rewrites a model (e.g. ViT-B/16 from ``models.recipes``) and reports per-layer kernels,
        bytes, time and peak memory, plus one ORT run of the rewritten graph vs the original.

Prints JSON; every figure is measured by this run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgesdk.config import BuildConfig  # noqa: E402
from edgesdk.devices import PROFILES  # noqa: E402
from edgesdk.ort import make_session  # noqa: E402
from edgesdk.rewrite import rewrite_model  # noqa: E402
from edgesdk.sparsify import row_mask as _row_mask  # noqa: E402  (the SDK's, kept before --mask tile8 patches it)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def nll(sess, windows) -> tuple[float, int]:
    """Summed next-token negative log-likelihood and token count over ``windows`` [1, T]."""
    total, count = 0.0, 0
    for ids in windows:
        logits = sess.run(None, {"input_ids": ids})[0][0].astype(np.float64)
        logits -= logits.max(-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        total -= float(logp[np.arange(ids.shape[1] - 1), ids[0, 1:]].sum())
        count += ids.shape[1] - 1
    return total, count


def tile8_mask(score: np.ndarray, sparsity: float) -> np.ndarray:
    """Keep-mask ``[N, K]`` with exactly ``round((1 - sparsity) * 64)`` kept per 8 x 8 tile (highest scores; ties to
    the lower index, as ``row_mask``); per row (the SDK's own ``row_mask``, even while this one replaces it) where N
    or K is not a multiple of 8."""
    n, k = score.shape
    if n % 8 or k % 8:
        return _row_mask(score, sparsity)
    keep = int(round((1.0 - sparsity) * 64))
    t = _tile_scores(score)
    return _untile8(_top_last(t.reshape(*t.shape[:2], 64), keep).reshape(t.shape), n, k)


def _tile_scores(score: np.ndarray) -> np.ndarray:
    n, k = score.shape
    return score.reshape(n // 8, 8, k // 8, 8).transpose(0, 2, 1, 3)  # [strip, k-tile, row, column]


def _untile8(m: np.ndarray, n: int, k: int) -> np.ndarray:
    return m.transpose(0, 2, 1, 3).reshape(n, k)


def _top_last(t: np.ndarray, keep: int) -> np.ndarray:
    order = np.argsort(-t, axis=-1, kind="stable")[..., :keep]
    m = np.zeros(t.shape, dtype=bool)
    np.put_along_axis(m, order, True, axis=-1)
    return m


def tile8half_mask(score: np.ndarray, sparsity: float) -> np.ndarray:
    """As ``tile8_mask``, but the tile's even and odd columns balanced separately: ``(keep + 1) // 2`` of its 32
    even-column and ``keep // 2`` of its 32 odd-column weights (``tools/bitmap_lanebank.cu``'s WALK 1)."""
    n, k = score.shape
    if n % 8 or k % 8:
        return _row_mask(score, sparsity)
    keep = int(round((1.0 - sparsity) * 64))
    t = _tile_scores(score)
    m = np.zeros(t.shape, dtype=bool)
    m[..., 0::2] = _top_last(t[..., 0::2].reshape(*t.shape[:2], 32), (keep + 1) // 2).reshape(*t.shape[:3], 4)
    m[..., 1::2] = _top_last(t[..., 1::2].reshape(*t.shape[:2], 32), keep // 2).reshape(*t.shape[:3], 4)
    return _untile8(m, n, k)


def tile8pair_mask(score: np.ndarray, sparsity: float) -> np.ndarray:
    """Pairs of adjacent input channels (2 j, 2 j + 1) kept or pruned together: ``round((1 - sparsity) * 32)`` of the
    tile's 32 pairs, by the pair's summed score (``tools/bitmap_lanebank.cu``'s WALK 2)."""
    n, k = score.shape
    if n % 8 or k % 8:
        return _row_mask(score, sparsity)
    keep = int(round((1.0 - sparsity) * 32))
    t = _tile_scores(score)
    pairs = t.reshape(*t.shape[:3], 4, 2).sum(axis=-1)  # [strip, k-tile, row, pair]
    m = _top_last(pairs.reshape(*t.shape[:2], 32), keep).reshape(*t.shape[:3], 4)
    return _untile8(np.repeat(m, 2, axis=-1), n, k)


MASKS = {"tile8": tile8_mask, "tile8half": tile8half_mask, "tile8pair": tile8pair_mask}


def smollm2(path: Path, sparsity: float, window: int, mask: str = "row", ppl_only: bool = False) -> dict:
    from transformers import AutoTokenizer

    from models.recipes import english_text, smollm2_gguf

    g = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
    with contextlib.redirect_stdout(io.StringIO()):  # `import this` prints the Zen of Python once
        text = english_text()
    ids = np.array(tok(text)["input_ids"], dtype=np.int64)
    windows = [ids[None, i:i + window] for i in range(0, len(ids) - window + 1, window)]
    n_cal = max(1, len(windows) // 4)
    calib = [{"input_ids": w} for w in windows[:n_cal]]
    evals = windows[n_cal:]
    model = onnx.load(str(path))
    out = {"model": path.name, "tokens": int(len(ids)), "window": window, "calibration_windows": n_cal,
           "eval_windows": len(evals), "sparsity": sparsity, "mask": mask, "text": "models.recipes.english_text()"}
    if mask in MASKS:
        import edgesdk.sparsify as sp

        sp.row_mask = MASKS[mask]  # prune() looks it up in its module at call time (this process only)
    dense_sess = make_session(model)
    s, c = nll(dense_sess, evals)
    out["ppl_dense"] = float(np.exp(s / c))
    for method in ("magnitude", "wanda"):
        t = time.time()
        pruned, report = rewrite_model(model, BuildConfig(sparsity=sparsity, prune=method, kernels="none"),
                                       calib, PROFILES["orin"])
        out[f"rewrite_s_{method}"] = round(time.time() - t, 1)
        s, c = nll(make_session(pruned), evals)
        out[f"ppl_{method}"] = float(np.exp(s / c))
        out[f"layers_pruned_{method}"] = sum(r["sparsity"] > 0 for r in report)
    if ppl_only:
        out["peak_rss_mb"] = round(_peak_mb())
        return out
    # the same pruning through plugin nodes: every linear but lm_head becomes EdgeBitmapLinear
    bitmap, report = rewrite_model(model, BuildConfig(sparsity=sparsity, prune="wanda", kernels="bitmap"),
                                   calib, PROFILES["orin"])
    out["bitmap_nodes"] = sum(n.op_type == "EdgeBitmapLinear" for n in bitmap.graph.node)
    out["linears"] = len(report)
    out["left_alone"] = {r["name"]: r["reason"] for r in report if r["kernel"] == "none"}
    wanda_dense, _ = rewrite_model(model, BuildConfig(sparsity=sparsity, prune="wanda", kernels="none"),
                                   calib, PROFILES["orin"])
    one = evals[:1]
    a = nll(make_session(bitmap), one)[0]
    b = nll(make_session(wanda_dense), one)[0]
    out["one_window_nll_bitmap_vs_dense_pruned"] = [a, b]
    out["peak_rss_mb"] = round(_peak_mb())
    return out


def rewrite(path: Path, sparsity: float, kernels: str) -> dict:
    model = onnx.load(str(path))
    t = time.time()
    new, report = rewrite_model(model, BuildConfig(sparsity=sparsity, prune="magnitude", kernels=kernels),
                                None, PROFILES["orin"])
    dt = time.time() - t
    feed = {}
    for i in model.graph.input:
        dims = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
        feed[i.name] = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    y0 = make_session(model).run(None, feed)[0]
    t = time.time()
    y1 = make_session(new).run(None, feed)[0]
    return {"model": path.name, "sparsity": sparsity, "kernels": kernels, "rewrite_s": round(dt, 1),
            "ort_run_s": round(time.time() - t, 1), "linears": len(report),
            "plugin_nodes": sum(n.domain == "edgesdk" for n in new.graph.node),
            "kernels_used": sorted({r["kernel"] for r in report}),
            "bytes_dense": sum(r["bytes_dense"] for r in report),
            "bytes_packed": sum(r["bytes_packed"] or 0 for r in report),
            "max_abs_diff_vs_original": float(np.abs(y1.astype(np.float64) - y0).max()),
            "peak_rss_mb": round(_peak_mb())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["smollm2", "rewrite"])
    ap.add_argument("model", type=Path)
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--kernels", default="bitmap")
    ap.add_argument("--mask", choices=["row", *MASKS], default="row",
                    help="smollm2: prune per output row (the SDK's) or per 8 x 8 tile (see above)")
    ap.add_argument("--ppl-only", action="store_true", help="smollm2: perplexities only (no plugin-node run)")
    a = ap.parse_args()
    res = (smollm2(a.model, a.sparsity, a.window, a.mask, a.ppl_only) if a.what == "smollm2"
           else rewrite(a.model, a.sparsity, a.kernels))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
