#!/usr/bin/env python3
"""Shared-memory wavefronts per (token, KV head) of three record-decode schemes, d = 64, by bank arithmetic.

A model, not a profile: random records (kept channels uniform at random, exactly `keep` per token, as
per-token magnitude pruning of random data gives), 32 banks of 4 bytes; a warp-wide access costs, per
128-byte wavefront rule, the largest number of distinct 4-byte words (16-byte chunks for 16-byte
accesses) that fall in one bank (bank group); K and V each decode 16 tokens per tile.

  current   tactic 1 (attn2): one lane per record (lanes 0-15 K, 16-31 V) reads its staged record
            (8-byte loads), zero-fills its dense row (16-byte stores), scatters the kept values
            (16-bit stores, highest channel first, rows of 72 halves), then ldmatrix reads K and V
            tiles (4 wavefronts per x4, 8 of them), plus the cp.async staging writes.
  gather    decode straight into mma fragments from the *current* records: lane (g, q) of the K
            A-fragment gathers its 16 channel pairs of tokens g, g + 8 (32-bit loads of the word(s)
            holding each pair, located by popc of the token bitmap); V (A operand of O^T = V^T P^T,
            element pairs along tokens) gathers its 32 elements one by one (16-bit loads).
  lanemajor proposed layout: per 16-token tile, one 32-bit mask per lane (its 32 fragment positions)
            and each lane's kept values contiguous (lane-major), loaded with 16-byte loads covering
            [offset, offset + count) (offsets by a warp scan); no dense tile, no zero fill, no ldmatrix.

Usage: python tools/sparse_kv_banksim.py [--keep 19] [--trials 400] [--json FILE]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

D, T = 64, 16


def wavefronts(addr: np.ndarray, width: int) -> int:
    """Wavefronts of one warp access: addresses (bytes) of the active lanes, access width 2, 4, 8 or 16."""
    if len(addr) == 0:
        return 0
    unit = max(4, width)
    words = np.unique(addr // unit)
    if unit == 4:
        banks = words % 32
    else:  # 8- or 16-byte units: unit/4 banks each; count distinct units per bank group
        banks = words % (128 // unit)
    per = np.bincount(banks)
    need = int(per.max())
    return max(need, -(-len(words) * unit // 128))


def records(rng, keep: int) -> np.ndarray:
    """Kept-channel masks [T, D] bool with exactly `keep` per token."""
    m = np.zeros((T, D), bool)
    for t in range(T):
        m[t, rng.choice(D, keep, replace=False)] = True
    return m


def current(rng, keep: int) -> dict:
    kp = -(-keep // 4) * 4
    R = D // 8 + 2 * kp
    km, vm = records(rng, keep), records(rng, keep)
    w = dict(staging=2 * -(-T * R // 128))
    # record reads: bitmap (8 B) + kp / 4 value groups (8 B) per lane, K records then V records staged
    base = np.array([t * R for t in range(T)] + [-(-T * R // 16) * 16 + t * R for t in range(T)])
    w["record_loads"] = sum(wavefronts(base + 8 * j, 8) for j in range(1 + kp // 4))
    TR = D + 8
    tile = np.array([t * TR * 2 for t in range(T)] + [T * TR * 2 + t * TR * 2 for t in range(T)])
    w["zero_fill"] = sum(wavefronts(tile + 16 * j, 16) for j in range(D * 2 // 16))
    seqs = [np.flatnonzero(km[t])[::-1] for t in range(T)] + [np.flatnonzero(vm[t])[::-1] for t in range(T)]
    w["scatter"] = sum(wavefronts(tile + 2 * np.array([s[j] for s in seqs]), 2) for j in range(keep))
    w["ldmatrix"] = 2 * (D // 16) * 4
    return w


def gather(rng, keep: int) -> dict:
    kp = -(-keep // 4) * 4
    R = D // 8 + 2 * kp
    km, vm = records(rng, keep), records(rng, keep)
    w = dict(staging=2 * -(-T * R // 128))
    lanes = np.arange(32)
    g, q = lanes // 4, lanes % 4
    kl = 0
    for row in (g, g + 8):
        kl += wavefronts(row * R, 8)  # bitmap of the lane's token (broadcast within 4 lanes)
        for j in range(8):  # channel pairs 2q + 8j, +1
            c = 2 * q + 8 * j
            idx = np.array([km[t, :c].sum() for t, c in zip(row, c)])
            a = row * R + 8 + 2 * idx
            kl += wavefronts(a & ~3, 4) + wavefronts((a & ~3) + 4, 4)
    w["k_gather"] = kl
    vr = T * R
    vl = 0
    for toks in (2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9):
        vl += wavefronts(vr + toks * R, 8)
        for mt in range(D // 16):
            for c in (g + 16 * mt, g + 8 + 16 * mt):
                idx = np.array([vm[t, :cc].sum() for t, cc in zip(toks, c)])
                vl += wavefronts(vr + toks * R + 8 + 2 * idx, 2)
    w["v_gather"] = vl
    return w


def lanemajor(rng, keep: int) -> dict:
    km, vm = records(rng, keep), records(rng, keep)
    lanes = np.arange(32)
    g, q = lanes // 4, lanes % 4
    # fragment positions of each lane: K (A of S^T = K Q^T): tokens g, g+8 x channels 2q+{0,1,8,9}+16ks
    kcnt = np.array([sum(km[t, c] for t in (gg, gg + 8) for ks in range(4)
                         for c in (2 * qq + 16 * ks, 2 * qq + 1 + 16 * ks, 2 * qq + 8 + 16 * ks, 2 * qq + 9 + 16 * ks))
                     for gg, qq in zip(g, q)])
    # V (A of O^T = V^T P^T): channels g, g+8 (+16 mt) x tokens 2q+{0,1,8,9}
    vcnt = np.array([sum(vm[t, c] for t in (2 * qq, 2 * qq + 1, 2 * qq + 8, 2 * qq + 9) for mt in range(4)
                         for c in (gg + 16 * mt, gg + 8 + 16 * mt)) for gg, qq in zip(g, q)])
    assert kcnt.sum() == T * keep and vcnt.sum() == T * keep
    tile_bytes = 32 * 4 + 2 * T * keep
    w = dict(staging=2 * -(-tile_bytes // 128), masks=2 * wavefronts(lanes * 4, 4))
    for name, cnt in (("k_values", kcnt), ("v_values", vcnt)):
        off = 128 + 2 * np.concatenate([[0], np.cumsum(cnt)[:-1]])
        first, last = off // 16, (off + 2 * cnt - 1) // 16
        n = np.where(cnt > 0, last - first + 1, 0)
        w[name] = sum(wavefronts(16 * (first[n > j] + j), 16) for j in range(int(n.max())))
        w[name + "_loads_per_lane_max"] = int(n.max())
    return w


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=int, default=19)
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--json")
    a = ap.parse_args()
    rng = np.random.default_rng(7)
    res = {}
    for name, f in (("current", current), ("gather", gather), ("lanemajor", lanemajor)):
        acc: dict = {}
        for _ in range(a.trials):
            for k, v in f(rng, a.keep).items():
                acc.setdefault(k, []).append(v)
        per_token = {k: float(np.mean(v)) / T for k, v in acc.items() if "per_lane" not in k}
        total = sum(per_token.values())
        res[name] = dict(per_token_head=per_token, total_per_token_head=total)
        print(f"{name:10s} {total:6.2f} wavefronts per (token, KV head)  " +
              "  ".join(f"{k} {v:.2f}" for k, v in per_token.items()))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(keep=a.keep, d=D, trials=a.trials, model="bank arithmetic, not a profile", **res), fh, indent=1)


if __name__ == "__main__":
    main()
