"""The benchmark's Triton flash-decoding baseline (``bench/triton_decode.py``) against float64 attention, run on
the CPU by Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess so that no other test sees it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import numpy as np, torch
sys.path.insert(0, sys.argv[1])
from bench.triton_decode import FlashDecode

def reference(q, k, v, lens, g):
    B, hq, d = q.shape
    o = np.zeros((B, hq, d))
    for b in range(B):
        for h in range(hq):
            if lens[b] == 0:
                continue
            kk = k[b, h // g, :lens[b]].astype(np.float64)
            vv = v[b, h // g, :lens[b]].astype(np.float64)
            s = kk @ q[b, h].astype(np.float64) / np.sqrt(d)
            p = np.exp(s - s.max())
            o[b, h] = (p / p.sum()) @ vv
    return o

res = []
for case in json.loads(sys.argv[2]):
    B, hkv, g, d, T, lens, splits, cfg, fused = case
    rng = np.random.default_rng(len(res) + 7)
    hq = hkv * g
    q = rng.standard_normal((B, hq, d)).astype(np.float16)
    k = rng.standard_normal((B, hkv, T, d)).astype(np.float16)
    v = rng.standard_normal((B, hkv, T, d)).astype(np.float16)
    lens = np.array(lens, np.int32)
    out = torch.full((B, hq, d), float("nan"), dtype=torch.float16)  # poisoned
    fd = FlashDecode(hq, hkv, d, B, T, splits, tuple(cfg), fused=fused)
    errs, finite = [], True
    for call in range(2):  # twice: the fused merge must leave its counters as it found them
        out.fill_(float("nan"))
        fd(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), torch.from_numpy(lens), out)
        got = out.numpy().astype(np.float64)
        finite = finite and bool(np.isfinite(got).all())
        errs.append(float(np.abs(got - reference(q, k, v, lens, g)).max()))
    res.append({"case": case, "splits": fd.ns, "finite": finite, "err": max(errs),
                "counters": None if fd.cnt is None else fd.cnt.tolist()})
print(json.dumps(res))
"""

# (B, Hkv, G, d, T, lens, splits, (BLOCK_N, warps, stages), fused merge): odd lengths, ragged batches, an empty
# sequence, more splits than a short sequence has tokens for, the two benchmark GQA groups (4, 3) and a full group
# of 8; more splits than the fused merge's chunk of 8.
CASES = [
    (2, 2, 3, 64, 77, [77, 40], 3, (32, 4, 3), False),
    (3, 1, 4, 64, 131, [131, 0, 17], 5, (16, 4, 2), False),
    (1, 3, 8, 128, 45, [45], 1, (16, 4, 2), False),
    (2, 2, 4, 64, 200, [199, 3], 7, (32, 4, 3), False),
    (2, 2, 3, 64, 77, [77, 40], 3, (32, 4, 3), True),
    (3, 1, 4, 64, 131, [131, 0, 17], 5, (16, 4, 2), True),
    (1, 3, 8, 128, 45, [45], 1, (16, 4, 2), True),
    (2, 1, 4, 64, 333, [333, 150], 11, (16, 4, 2), True),
]


def test_flash_decode_matches_float64():
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT), json.dumps(CASES)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(res) == len(CASES)
    for r in res:
        assert r["finite"], r  # every output written (poisoned with NaN before)
        # fp16 output, P rounded to fp16 for the P.V product: a few fp16 ulps of |O| <= ~1
        assert r["err"] < 2e-3, r
    assert [r["splits"] for r in res] == [3, 5, 1, 7, 3, 5, 1, 11]
    for r in res[4:]:
        assert r["counters"] == [0] * len(r["counters"]), r
