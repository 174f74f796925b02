#!/usr/bin/env python3
"""The fp16-Y GELU of EdgeVitBitGemm (``gelu_h`` in ``plugins/vitbit_gemm/vitbit_gemm.cu``): fit its polynomial,
and measure any version of it against float64 erf.

``gelu_h(y) = y * Phi(y)`` with ``Phi(-t) = 2^(S(min(t, clamp)) - t^2 log2(e) / 2)``, ``t = |y|``, and
``Phi(y) = 1 - Phi(-t)`` for y >= 0. S is a polynomial fit of ``log2(Phi(-t)) + t^2 log2(e) / 2`` on
``[0, clamp]``: least squares on Chebyshev-spaced points, reweighted by the error (Lawson's iteration) toward the
minimax fit. :func:`evaluate` repeats the kernel's fp32 steps in numpy (each fmaf rounded once from float64; ex2
from float64 exp2, the GPU's ``ex2.approx`` differs from it by about 2^-22 relative), so the accuracy it reports is
that of the formula and its fp32 arithmetic.

    python tools/fit_gelu_poly.py [--degree 7] [--clamp 5.9]       # fit, print the C lines and the accuracy table
    python tools/fit_gelu_poly.py --source                         # the accuracy of the coefficients in the source
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgesdk.reference import vitbit_gemm as R  # noqa: E402

SOURCE = ROOT / "plugins" / "vitbit_gemm" / "vitbit_gemm.cu"
HALF_LOG2E = -0.72134752044448170  # - log2(e) / 2
FP16_MIN_NORMAL = 6.103515625e-05


def _phi_tail_log2(t: np.ndarray) -> np.ndarray:
    from scipy.special import log_ndtr

    return log_ndtr(-t) / np.log(2.0)


def fit(degree: int = 7, clamp: float = 5.9, points: int = 4000, iterations: int = 300) -> np.ndarray:
    """float32 coefficients of S, highest degree first."""
    t = 0.5 * clamp * (1.0 - np.cos(np.linspace(0.0, np.pi, points)))
    target = _phi_tail_log2(t) - HALF_LOG2E * t * t
    w = np.ones_like(t)
    for _ in range(iterations):
        a = np.vander(t, degree + 1) * np.sqrt(w)[:, None]
        c = np.linalg.lstsq(a, target * np.sqrt(w), rcond=None)[0]
        e = np.abs(np.polyval(c, t) - target)
        w = w * (e + 1e-300)
        w /= w.sum()
    return c.astype(np.float32)


def read_source(text: str | None = None) -> tuple[np.ndarray, float]:
    """(coefficients, clamp) of ``gelu_h`` as written in the plugin source."""
    text = SOURCE.read_text() if text is None else text
    m = re.search(r"GELU_H_COEFFS begin[^\n]*\n(.*?)// GELU_H_COEFFS end", text, re.S)
    clamp = re.search(r"fminf\(fabsf\(y\), ([0-9.eE+-]+)f\);\s*// GELU_H_CLAMP", text)
    if not m or not clamp:
        raise RuntimeError(f"gelu_h's coefficients or clamp were not found in {SOURCE}: update the tool")
    coeffs = re.findall(r"(-?[0-9.]+(?:e[+-]?[0-9]+)?)f\)?;", m.group(1))
    return np.array([float(c) for c in coeffs], np.float32), float(clamp.group(1))


def _fma(a: np.ndarray, b, c) -> np.ndarray:
    return (a.astype(np.float64) * np.float64(b) + np.asarray(c, np.float64)).astype(np.float32)


def evaluate(y: np.ndarray, coeffs: np.ndarray, clamp: float) -> np.ndarray:
    """``gelu_h`` in numpy, fp32 step by step (see the module docstring for the two approximations)."""
    y = np.asarray(y, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        t = np.minimum(np.abs(y), np.float32(clamp))
        t = np.where(np.isnan(y), np.float32(clamp), t)  # fminf(NaN, c) is c
        s = np.full_like(t, coeffs[0])
        for c in coeffs[1:]:
            s = _fma(s, t, c)
        p = _fma((y * y).astype(np.float32), np.float32(HALF_LOG2E), s)
        q = np.exp2(p.astype(np.float64)).astype(np.float32)
        q = np.where(q < np.float32(2.0**-126), np.float32(0), q)  # .ftz
        phi = np.where(y < 0, q, (np.float32(1) - q).astype(np.float32))
        return (y * phi).astype(np.float32)


def erf_form(y: np.ndarray) -> np.ndarray:
    """``0.5 y (1 + erf(y / sqrt 2))`` in fp32 with a correctly rounded fp32 erf (CUDA's erff is within 2 ulp)."""
    from scipy.special import erf

    y = np.asarray(y, np.float32)
    e = erf((y * np.float32(0.70710678118654752)).astype(np.float64)).astype(np.float32)
    return (np.float32(0.5) * y * (np.float32(1) + e)).astype(np.float32)


def exact(y: np.ndarray) -> np.ndarray:
    from scipy.special import ndtr

    y = np.asarray(y, np.float64)
    return y * ndtr(y)


def grid(n: int = 2_000_001, lim: float = 10.0, seed: int = 0) -> np.ndarray:
    """A dense uniform grid on [-lim, lim] and as many N(0, 2^2) samples (where layer outputs mostly are)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([np.linspace(-lim, lim, n).astype(np.float32),
                           (rng.standard_normal(n) * 2).astype(np.float32)])


def accuracy(g: np.ndarray, y: np.ndarray) -> dict:
    ex = exact(y)
    u = R.fp16_ulps(g, ex)
    big = np.abs(ex) > FP16_MIN_NORMAL
    rel = np.abs(g.astype(np.float64) - ex)[big] / np.abs(ex[big])
    tail = y < -3
    return {"max_fp16_ulps": int(u.max()), "fp16_differ": float((u > 0).mean()),
            "tail_max_fp16_ulps": int(u[tail].max()), "tail_fp16_differ": float((u[tail] > 0).mean()),
            "max_rel_error": float(rel.max())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--degree", type=int, default=7)
    ap.add_argument("--clamp", type=float, default=5.9)
    ap.add_argument("--source", action="store_true", help="measure the source's coefficients instead of fitting")
    args = ap.parse_args()
    if args.source:
        coeffs, clamp = read_source()
    else:
        coeffs, clamp = fit(args.degree, args.clamp), args.clamp
        print("  // GELU_H_COEFFS begin (S, highest degree first)")
        print(f"  float s = {float(coeffs[0])!r}f;")
        for c in coeffs[1:]:
            print(f"  s = fmaf(s, t, {float(c)!r}f);")
        print("  // GELU_H_COEFFS end")
    y = grid()
    print(f"{'form':<28} {'max ulp':>8} {'differ':>8} {'y<-3 max':>9} {'y<-3 differ':>12} {'max rel':>9}")
    for name, g in ((f"gelu_h (degree {len(coeffs) - 1}, clamp {clamp})", evaluate(y, coeffs, clamp)),
                    ("0.5 y (1 + erf(y / sqrt 2))", erf_form(y))):
        a = accuracy(g, y)
        print(f"{name:<28} {a['max_fp16_ulps']:>8} {a['fp16_differ']:>8.2%} {a['tail_max_fp16_ulps']:>9} "
              f"{a['tail_fp16_differ']:>12.2%} {a['max_rel_error']:>9.1e}")
    print("(fp16 ulps against the correctly rounded y * Phi(y); relative error where |GELU| > fp16's smallest normal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
