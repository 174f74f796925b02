"""Unstructured pruning of linear weights: magnitude and Wanda, per layer or global.

Weights are dense float arrays in the formats' orientation ``[N, K]`` (one row per output
channel). Both methods prune **per output row**: every row of a layer loses the same number of
weights (``round(sparsity * K)``), the comparison group Wanda uses and the one that balances
the work of the sparse kernels across output rows.

* ``magnitude``: score ``|W[n, k]|``.
* ``wanda`` (Sun et al., 2023): score ``|W[n, k]| * ||X[:, k]||_2``, where ``X`` are the
  layer's input activations on calibration data (all tokens of all samples as rows).

Sparsity ``scope``:

* ``"layer"``: every layer gets the requested sparsity.
* ``"global"``: one score threshold over all layers decides how many weights each layer loses
  (layers whose scores are small overall lose more); inside a layer the weights are then
  still pruned per row at that layer's share. Scores of different layers are compared as they
  are, so with ``wanda`` the activation scale of each layer takes part in the allocation.

Layers are excluded by name: each pattern is a regular expression searched in the layer name
(``re.search``), so ``lm_head`` or ``attn\\.proj$`` both work.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgesdk.errors import EdgeSDKError

METHODS = ("magnitude", "wanda")
SCOPES = ("layer", "global")


@dataclass(frozen=True)
class PruneStats:
    """What pruning did to one layer.

    Attributes:
        name: Layer name.
        method: ``magnitude``, ``wanda`` or ``excluded``.
        target: Sparsity this layer was asked for (0 when excluded).
        sparsity: Fraction of exact zeros in the returned weights.
    """

    name: str
    method: str
    target: float
    sparsity: float


def _check_sparsity(sparsity: float) -> float:
    s = float(sparsity)
    if not 0.0 <= s <= 1.0 or not np.isfinite(s):
        raise EdgeSDKError(f"sparsity {sparsity!r} is outside [0, 1]", "pass a fraction such as 0.5 for 50 % zeros")
    return s


def is_excluded(name: str, exclude: Iterable[str]) -> bool:
    """Whether ``name`` matches one of the ``exclude`` patterns (``re.search``).

    Raises:
        EdgeSDKError: A pattern is not a valid regular expression.
    """
    for pattern in exclude:
        try:
            if re.search(pattern, name):
                return True
        except re.error as err:
            raise EdgeSDKError(
                f"exclude pattern {pattern!r} is not a valid regular expression ({err})",
                "escape special characters, e.g. 'blocks\\.0\\.' instead of 'blocks.0.('",
            ) from None
    return False


def scores(weight: np.ndarray, method: str = "magnitude", act_norm: np.ndarray | None = None) -> np.ndarray:
    """Importance of every weight (float64, same shape as ``weight``); small scores go first.

    Args:
        weight: Dense weights ``[N, K]``.
        method: ``magnitude`` or ``wanda``.
        act_norm: For ``wanda``: ``||X[:, k]||_2`` per input feature, shape ``[K]``.

    Raises:
        EdgeSDKError: Unknown method, missing or mis-shaped ``act_norm``, non-finite values.
    """
    w = np.asarray(weight)
    if w.ndim != 2:
        raise EdgeSDKError(f"weight has shape {w.shape}; pruning needs [N, K]", "pass a 2-D weight matrix")
    s = np.abs(w.astype(np.float64))
    if method == "magnitude":
        return s
    if method != "wanda":
        raise EdgeSDKError(f"unknown pruning method {method!r}", f"use one of {', '.join(METHODS)}")
    if act_norm is None:
        raise EdgeSDKError("Wanda pruning needs calibration activations", "pass calibration data, or use --prune magnitude")
    a = np.asarray(act_norm, dtype=np.float64).reshape(-1)
    if a.shape[0] != w.shape[1]:
        raise EdgeSDKError(
            f"activation norms have {a.shape[0]} features but the weight has K={w.shape[1]}",
            "compute the norms on this layer's input (see activation_norms)",
        )
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise EdgeSDKError("activation norms contain negative or non-finite values", "check the calibration data")
    return s * a[None, :]


def row_mask(score: np.ndarray, sparsity: float) -> np.ndarray:
    """Boolean keep-mask ``[N, K]`` that drops ``round(sparsity * K)`` lowest scores of each row.

    Ties are broken by position (a stable sort), so the result is deterministic.
    """
    s = _check_sparsity(sparsity)
    n, k = score.shape
    drop = int(round(s * k))
    keep = np.ones((n, k), dtype=bool)
    if drop == 0 or n == 0:
        return keep
    order = np.argsort(score, axis=1, kind="stable")[:, :drop]
    np.put_along_axis(keep, order, False, axis=1)
    return keep


def activation_norms(x: np.ndarray) -> np.ndarray:
    """``||X[:, k]||_2`` over all rows of a layer input ``[..., K]`` (float64, shape ``[K]``)."""
    a = np.asarray(x, dtype=np.float64)
    a = a.reshape(-1, a.shape[-1])
    return np.sqrt(np.einsum("mk,mk->k", a, a))


def _global_targets(score: Mapping[str, np.ndarray], sparsity: float) -> dict[str, float]:
    """Per-layer sparsity from one threshold over all scores (ties broken deterministically)."""
    sizes = {name: s.size for name, s in score.items()}
    total = sum(sizes.values())
    drop = int(round(sparsity * total))
    if drop == 0 or total == 0:
        return {name: 0.0 for name in score}
    flat = np.concatenate([s.reshape(-1) for s in score.values()])
    owner = np.repeat(np.arange(len(sizes)), list(sizes.values()))
    dropped = owner[np.argsort(flat, kind="stable")[:drop]]
    counts = np.bincount(dropped, minlength=len(sizes))
    return {name: (counts[i] / sizes[name] if sizes[name] else 0.0) for i, name in enumerate(score)}


def prune(
    weights: Mapping[str, np.ndarray],
    sparsity: float,
    method: str = "magnitude",
    act_norms: Mapping[str, np.ndarray] | None = None,
    scope: str = "layer",
    exclude: Sequence[str] = (),
) -> tuple[dict[str, np.ndarray], list[PruneStats]]:
    """Prune a set of layers.

    Args:
        weights: Layer name → dense weights ``[N, K]`` (float or int8; dtype is kept).
        sparsity: Fraction of weights to set to zero, in ``[0, 1]``.
        method: ``magnitude`` or ``wanda``.
        act_norms: For ``wanda``: layer name → ``||X[:, k]||_2`` (see :func:`activation_norms`).
        scope: ``layer`` (same sparsity everywhere) or ``global`` (one threshold, see module doc).
        exclude: Regular expressions; matching layers are returned unchanged.

    Returns:
        The pruned weights (new arrays, same dtypes) and one :class:`PruneStats` per layer.

    Raises:
        EdgeSDKError: Bad sparsity, method, scope, pattern or activation norms.
    """
    s = _check_sparsity(sparsity)
    if method not in METHODS:
        raise EdgeSDKError(f"unknown pruning method {method!r}", f"use one of {', '.join(METHODS)}")
    if scope not in SCOPES:
        raise EdgeSDKError(f"unknown sparsity scope {scope!r}", f"use one of {', '.join(SCOPES)}")
    chosen = [name for name in weights if not is_excluded(name, exclude)]
    if method == "wanda":
        missing = [n for n in chosen if act_norms is None or n not in act_norms]
        if missing:
            raise EdgeSDKError(
                f"Wanda pruning has no calibration activations for {len(missing)} layer(s), e.g. {missing[0]!r}",
                "pass calibration data that reaches every layer, or use --prune magnitude",
            )
    score = {n: scores(weights[n], method, None if act_norms is None else act_norms.get(n)) for n in chosen}
    targets = _global_targets(score, s) if scope == "global" else {n: s for n in chosen}
    out: dict[str, np.ndarray] = {}
    stats: list[PruneStats] = []
    for name, w in weights.items():
        if name not in score:
            out[name] = np.array(w, copy=True)
            stats.append(PruneStats(name, "excluded", 0.0, float(np.mean(np.asarray(w) == 0)) if np.size(w) else 0.0))
            continue
        keep = row_mask(score[name], targets[name])
        pruned = np.where(keep, w, np.zeros((), dtype=np.asarray(w).dtype)).astype(np.asarray(w).dtype)
        out[name] = pruned
        stats.append(PruneStats(name, method, float(targets[name]), float(np.mean(pruned == 0)) if pruned.size else 0.0))
    return out, stats
