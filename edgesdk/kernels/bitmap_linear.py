"""Launcher for ``EdgeBitmapLinear`` (``plugins/bitmap_linear/bitmap_linear.cu``): the plugin launch API.

Three kernel families (``docs/bitmap_linear.md``):

* decode path ``bitmap_dec_*`` (fp16 X, M ≤ 16, K % 8 == 0, X 16-byte aligned; tactics 1 and 40–75):
  weights as the mma A operand (two strips per m16 fragment), X as the B operand (M ≤ 8 or ≤ 16 rows,
  never padded in memory); per warp a cp.async ring of compressed groups, a per-group warp scan of the
  bitmap-word popcounts, and a branch-free tile decode (two shared loads and a byte permute); in the
  X-staged builds (``_xs``/``_xs80``, the default) the group's X rows ride in the ring slot and the B
  fragments come from ``ldmatrix``, and the copies are issued from loop-invariant per-lane addresses;
* decode path v1 ``bitmap_gemv_*`` (same conditions; tactics 20–31): X as the A operand, one strip per B
  fragment, kept for comparison;
* generic path ``bitmap_linear_*`` (fp32 X, odd K, any M; tactics 2–11): X read from global memory per
  fragment, ``MT`` m16 blocks per warp (MT = 4 and grid.y over 64-row tiles for prefill sizes).

Warps that share a strip (pair) split K (``KS``) and are reduced in shared memory: no workspace, no
atomics, deterministic.

Where dense wins (a build-time decision for the rewrite pass, not made here): measured on an H100
(``bench/results/bitmap_linear.json``, 2026-11-22T14:52Z) the decode path runs at 0.70–1.51× of cuBLAS
fp16 for M ≤ 16 at 30–70 % sparsity (median over the large LLM layers 1.11× for fp16 values and 1.18× for
int8 values at 50 %); at ≥ 50 % it beats cuBLAS on the layers with K ≥ 4096 or 5632×2048 (M = 16: only
4096², 11008×4096, 5632×2048), not on 896×4864 or 576×1536. It is bound by instruction issue (~21
warp-instructions per 8×8 tile at ~0.6 per scheduler-cycle with 16 warps per SM) and launch latency, not by
bandwidth (Nsight Compute, docs/bitmap_linear.md). For prefill (M ≫ 16) decoding is repeated per
64-row tile of M and dense is faster still. Elsewhere choose this op for its footprint (0.57× / 0.32× of
dense fp16 bytes at 50 %), or let tactic timing against a dense layer decide.

Tactics (``valid_tactics``): 1 = heuristic (from M, N, K and the SM count of the current context);
2–11 fix generic-path (strips per block, K splits, stages) configurations; 20–31 fix v1 decode-path
(strips per warp, strip blocks per block, K splits) configurations; 40–48 fix decode-path (K splits,
strip pairs per block, stage set) configurations; 49 (heuristic) and 50–57 (K splits, strip pairs per
block) use the 80-register decode kernels (``bitmap_dec_*_r80``/``_r80n``, up to 24 warps per SM); 59 = the
round-2 default (40–48 or 49–57 configurations by the 3/4 cost rule); 60 (heuristic) and 61–65 use the
X-staged 16-warp kernels (``_xs``), 70 and 71–75 their 80-register builds (``_xs80``). Tactic 1 takes
tactic 60's configuration (for M > 4 with 4 instead of 3 groups of fill and reduction in its cost model), or
tactic 70's for M ≤ 4 where it cuts the modelled cost by ≥ 1/4. Decode-path
tactics act like tactic 1 where the decode path does not apply. Shared memory per block stays ≤ 163 KB (Orin's limit).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.formats import bitmap_linear as fmt
from edgesdk.kernels import _cuda

SOURCE = "bitmap_linear/bitmap_linear.cu"
_X = {"float16": ("f16", 2), "float32": ("f32", 4)}
_V = {"float16": ("f16", 2), "int8": ("i8", 1)}
#: Generic path tactics → (strips per block, K splits per strip, stages); tactic 1 is the heuristic.
TACTICS: dict[int, tuple[int, int, int]] = {
    2: (4, 1, 8), 3: (2, 2, 8), 4: (2, 4, 8), 5: (1, 4, 8), 6: (1, 8, 8), 7: (4, 2, 4),
    8: (2, 4, 4), 9: (8, 1, 4), 10: (1, 16, 4), 11: (4, 4, 8),
}
#: Decode path tactics → (strips per warp, strip blocks per block, K splits); 4 stages.
GEMV_TACTICS: dict[int, tuple[int, int, int]] = {
    20: (4, 1, 8), 21: (4, 2, 4), 22: (4, 1, 4), 23: (2, 1, 8), 24: (2, 2, 4), 25: (2, 1, 12),
    26: (1, 1, 16), 27: (1, 4, 4), 28: (4, 4, 2), 29: (2, 4, 2), 30: (4, 1, 2), 31: (1, 2, 8),
}
#: Decode path v2 (``bitmap_dec_*``) tactics → (K splits, strip pairs per block, stage set: 0 = default
#: stages (fp16 values 4, int8 values 8), 1 = alternative (6 for both)).
DEC_TACTICS: dict[int, tuple[int, int, int]] = {
    40: (8, 1, 0), 41: (4, 2, 0), 42: (2, 4, 0), 43: (1, 8, 0), 44: (16, 1, 0), 45: (8, 2, 0),
    46: (8, 1, 1), 47: (4, 2, 1), 48: (2, 4, 1),
}
_DEC_STAGES = {"float16": (4, 6), "int8": (8, 6)}
#: Decode path, 80-register kernels (``bitmap_dec_*_r80`` / ``_r80n``: up to 24 resident warps per SM)
#: → (K splits, strip pairs per block); 49 = their heuristic. Stages: fp16 values 4, int8 values 6.
R80_TACTICS: dict[int, tuple[int, int]] = {
    50: (12, 1), 51: (8, 1), 52: (6, 2), 53: (4, 2), 54: (16, 1), 55: (4, 4), 56: (3, 4), 57: (2, 8),
}
R80_HEURISTIC = 49
_R80_STAGES = {"float16": 4, "int8": 6}
#: Decode path, X-staged kernels (``bitmap_dec_*_xs``: the group's X rows travel in the ring slot by
#: cp.async and the mma B fragments come from ldmatrix) → (K splits, strip pairs per block); 60 = their
#: heuristic. Stages by (value dtype, MB): the slot grows by MB KB of X.
XS_TACTICS: dict[int, tuple[int, int]] = {61: (8, 1), 62: (4, 2), 63: (16, 1), 64: (8, 2), 65: (2, 4)}
XS_HEURISTIC = 60
#: Their 80-register builds (``bitmap_dec_*_xs80``: up to 24 warps per SM where the rings fit) →
#: (K splits, strip pairs per block); 70 = their heuristic.
XS80_TACTICS: dict[int, tuple[int, int]] = {71: (12, 1), 72: (8, 1), 73: (6, 2), 74: (4, 2), 75: (4, 4)}
XS80_HEURISTIC = 70
#: The round-2 default (tactic 1 until 2026-11-22T06:35Z): 16-warp ``bitmap_dec_*`` kernels or their
#: 80-register builds by the 3/4 cost rule; kept to compare side by side with the new default.
PREV_DEFAULT = 59
_XS_STAGES = {("float16", 1): 3, ("float16", 2): 3, ("int8", 1): 4, ("int8", 2): 3}
_R80_WARPS_PER_SM = 25  # 80 registers × 32 lanes per warp: 65 536 / 2 560
_BLOCK_RESERVED_SMEM = 1024  # per-block shared memory the driver keeps (sm_80+)
_SMEM_PER_SM = 233472  # H100 / sm_90 default for the pure config(); launches query the device
_DEC_SCRATCH = 256  # bytes per warp: (bitmap word, value address) of 2 strips × 16 words
_MAX_WARPS = 16
_SMEM_LIMIT = 163 * 1024  # sm_87 (Orin) opt-in maximum per block; portable tactics
_GEMV_STAGES = 4


def _attrs(attrs: dict) -> tuple[int, int, str, int]:
    n, k, vd = int(attrs["n"]), int(attrs["k"]), attrs["value_dtype"]
    vd = vd.decode() if isinstance(vd, bytes) else vd
    if vd not in _V or n < 1 or k < 1:
        raise EdgeSDKError(f"EdgeBitmapLinear: bad attributes n={n}, k={k}, value_dtype={vd!r}",
                           "rebuild the node from edgesdk.formats.bitmap_linear.BitmapLinearWeights")
    return n, k, vd, int(attrs.get("has_bias", 0))


def valid_tactics(attrs: dict, m: int | None = None) -> list[int]:
    """Tactic ids valid for any M (1 = heuristic, then the fixed configurations)."""
    _attrs(attrs)
    return [1, *TACTICS, *GEMV_TACTICS, *DEC_TACTICS, R80_HEURISTIC, *R80_TACTICS, PREV_DEFAULT, XS_HEURISTIC,
            *XS_TACTICS, XS80_HEURISTIC, *XS80_TACTICS]


def workspace_bytes(attrs: dict, m: int) -> int:
    """No workspace: K splits are reduced in shared memory."""
    return 0


def _gemv_slot(value_dtype: str, spw: int, m: int) -> int:
    """Bytes of one pipeline stage: X rows (8 or 16 × 128 B) + per strip bitmaps, values, 16 B slack."""
    return (8 if m <= 8 else 16) * 128 + spw * (fmt.TILES_PER_GROUP * 8 + fmt.GROUP_K * fmt.STRIP
                                                * _V[value_dtype][1] + 16)


def _gemv_config(n, k, m, value_dtype, tactic, sm_count):
    s, g = fmt.geometry(n, k)
    if tactic in GEMV_TACTICS:
        spw, sbpb, ks = GEMV_TACTICS[tactic]
    else:
        # Heuristic. Decoding costs ~20 instructions per 8×8 tile whatever M is, so the kernel wants
        # many resident warps (~24 per SM); X is staged per warp, so larger M shares it over more
        # strips per warp (X bytes per group = 128·M vs ~600 B of weights per strip at 50 %).
        spw = 1 if m <= 4 else 2 if m <= 8 else 4
        slot = _gemv_slot(value_dtype, spw, m)
        per_sm = max(1, min(24, (228 * 1024) // (_GEMV_STAGES * slot)))  # smem-resident warps per SM
        target = sm_count * per_sm
        sb = -(-s // spw)
        ks = max(1, min(16, -(-target // sb), max(1, g // 3)))
        sbpb = max(1, min(max(1, 8 // ks), sb))
    slot = _gemv_slot(value_dtype, spw, m)
    sbpb = max(1, min(sbpb, _SMEM_LIMIT // (_GEMV_STAGES * slot)))
    ks = max(1, min(ks, _SMEM_LIMIT // (_GEMV_STAGES * slot * sbpb)))
    warps = sbpb * ks
    smem = max(warps * _GEMV_STAGES * slot, warps * spw * 4 * 32 * 4)
    return {"name": f"bitmap_gemv_{_V[value_dtype][0]}_w{spw}_s{_GEMV_STAGES}",
            "grid": (-(-s // (spw * sbpb)), 1, 1), "block": (32 * warps, 1, 1), "smem": smem,
            "ks": ks, "spb": sbpb, "spw": spw}


def _dec_slot(value_dtype: str) -> int:
    """Bytes of one v2 pipeline stage: two strips × (bitmaps + max values + 16 B slack)."""
    return 2 * (fmt.TILES_PER_GROUP * 8 + fmt.GROUP_K * fmt.STRIP * _V[value_dtype][1] + 16)


def _dec_config(n, k, m, value_dtype, tactic, sm_count):
    s, g = fmt.geometry(n, k)
    pairs = -(-s // 2)
    if tactic in DEC_TACTICS:
        ks, pb, st = DEC_TACTICS[tactic]
        stages = _DEC_STAGES[value_dtype][st]
    else:
        # Heuristic: one wave of ≤ 16 resident warps per SM (≤ 128 registers by __launch_bounds__,
        # 2 blocks of 8 warps fit Orin's 164 KB of shared memory), K split as finely as needed to fill
        # it; cost = waves × (groups per warp + ~3 groups of pipeline fill and reduction).
        stages = _DEC_STAGES[value_dtype][0]
        best = None
        for ks_ in (1, 2, 4, 8, 16):
            if ks_ > 1 and ks_ > g:
                break
            pb_ = max(1, min(8 // ks_, pairs))
            warps = pb_ * ks_
            waves = -(-(-(-pairs // pb_)) // (max(1, 16 // warps) * sm_count))
            cost = waves * (-(-g // ks_) + 3)
            if best is None or cost < best[0]:
                best = (cost, ks_, pb_)
        _, ks, pb = best
    slot = _dec_slot(value_dtype) * stages + _DEC_SCRATCH  # per warp: ring + scan scratch
    pb = max(1, min(pb, pairs, _SMEM_LIMIT // (slot * ks)))
    ks = max(1, min(ks, _SMEM_LIMIT // (slot * pb)))
    warps = pb * ks
    mb = 1 if m <= 8 else 2
    smem = max(warps * slot, warps * mb * 4 * 32 * 4)
    waves = -(-(-(-pairs // pb)) // (max(1, _MAX_WARPS // warps) * sm_count))
    return {"name": f"bitmap_dec_{_V[value_dtype][0]}_mb{mb}_s{stages}", "grid": (-(-pairs // pb), 1, 1),
            "block": (32 * warps, 1, 1), "smem": smem, "ks": ks, "spb": pb, "spw": 2,
            "cost": waves * (-(-g // ks) + 3)}


def _r80_config(n, k, m, value_dtype, tactic, sm_count, smem_per_sm, xs="", fill=3):
    """80-register decode kernels: same layout as :func:`_dec_config`, up to 24 warps per SM; with
    ``xs="xs"`` the X-staged 16-warp kernels (≤ 128 registers: ≤ 16 warps per SM), ``xs="xs80"`` their
    80-register builds. ``fill``: groups of pipeline fill and reduction per warp in the cost model."""
    s, g = fmt.geometry(n, k)
    pairs = -(-s // 2)
    mb = 1 if m <= 8 else 2
    if xs:
        stages = _XS_STAGES[(value_dtype, mb)]
        slot = (_dec_slot(value_dtype) + 1024 * mb) * stages + _DEC_SCRATCH
        wps, table = (_MAX_WARPS, XS_TACTICS) if xs == "xs" else (_R80_WARPS_PER_SM, XS80_TACTICS)
    else:
        stages = _R80_STAGES[value_dtype]
        slot = _dec_slot(value_dtype) * stages + _DEC_SCRATCH  # per warp: ring + scan scratch
        wps, table = _R80_WARPS_PER_SM, R80_TACTICS
    if tactic in table:
        ks, pb = table[tactic]
    else:
        # Heuristic: one wave if possible, as many resident warps per SM as registers (25) and shared
        # memory allow, K split as finely as needed; cost = waves × (groups per warp + ~3 groups of
        # pipeline fill and reduction); ties keep the coarser K split.
        best = None
        for ks_ in (1, 2, 3, 4, 6, 8, 12, 16):
            if ks_ > 1 and ks_ > g:
                break
            for pb_ in (1, 2, 4, 8, 16):
                warps = pb_ * ks_
                if warps > _MAX_WARPS or (pb_ > 1 and pb_ > pairs) or warps * slot > _SMEM_LIMIT:
                    continue
                bps = min(wps // warps, smem_per_sm // (warps * slot + _BLOCK_RESERVED_SMEM))
                if bps < 1:
                    continue
                waves = -(-(-(-pairs // pb_)) // (bps * sm_count))
                cost = waves * (-(-g // ks_) + fill)
                if best is None or cost < best[0]:
                    best = (cost, ks_, pb_)
        _, ks, pb = best
    pb = max(1, min(pb, pairs, _SMEM_LIMIT // (slot * ks)))
    ks = max(1, min(ks, _SMEM_LIMIT // (slot * pb)))
    warps = pb * ks
    smem = max(warps * slot, warps * mb * 4 * 32 * 4)
    sfx = xs if xs else "r80" if mb == 1 else "r80n"  # r80n: X per group (prefetch would spill at 80)
    bps = max(1, min(wps // warps, smem_per_sm // (warps * slot + _BLOCK_RESERVED_SMEM)))
    waves = -(-(-(-pairs // pb)) // (bps * sm_count))
    return {"name": f"bitmap_dec_{_V[value_dtype][0]}_mb{mb}_s{stages}_{sfx}", "grid": (-(-pairs // pb), 1, 1),
            "block": (32 * warps, 1, 1), "smem": smem, "ks": ks, "spb": pb, "spw": 2,
            "cost": waves * (-(-g // ks) + fill)}


def config(n: int, k: int, m: int, x_dtype: str, value_dtype: str, tactic: int = 1,
           sm_count: int = 132, x_aligned: bool = True, smem_per_sm: int = _SMEM_PER_SM) -> dict:
    """Kernel name, grid, block and dynamic shared memory for one launch (pure function).

    fp16 X with M ≤ 16 and K % 8 == 0 takes the decode path (``bitmap_gemv_*``) under tactic 1 and
    tactics 20+ (X must be 16-byte aligned: cp.async); everything else (and tactics 2–11) takes the
    generic ``bitmap_linear_*`` kernel.
    """
    if x_dtype not in _X:
        raise EdgeSDKError(f"EdgeBitmapLinear: X dtype {x_dtype!r} is not supported",
                           "feed float16 or float32 activations")
    if tactic not in valid_tactics({"n": n, "k": k, "value_dtype": value_dtype}):
        raise EdgeSDKError(f"EdgeBitmapLinear: tactic {tactic} is not valid",
                           f"use one of {valid_tactics({'n': n, 'k': k, 'value_dtype': value_dtype})}")
    gemv_ok = x_dtype == "float16" and m <= 16 and k % 8 == 0 and x_aligned
    if gemv_ok and tactic in GEMV_TACTICS:
        return _gemv_config(n, k, m, value_dtype, tactic, sm_count)
    if gemv_ok and (tactic == R80_HEURISTIC or tactic in R80_TACTICS):
        return _r80_config(n, k, m, value_dtype, tactic, sm_count, smem_per_sm)
    if gemv_ok and (tactic == XS_HEURISTIC or tactic in XS_TACTICS):
        return _r80_config(n, k, m, value_dtype, tactic, sm_count, smem_per_sm, xs="xs")
    if gemv_ok and (tactic == XS80_HEURISTIC or tactic in XS80_TACTICS):
        return _r80_config(n, k, m, value_dtype, tactic, sm_count, smem_per_sm, xs="xs80")
    if gemv_ok and tactic == 1:
        # X-staged kernels (X rows by cp.async into the ring slot, B fragments by ldmatrix). H100,
        # 2026-11-22T06:32Z (tools/bitmap_linear_explore.py, commit d54e679, 50 % sparsity, 4096², 4096×11008,
        # 11008×4096, 2048×5632, M = 1/8/16): the 16-warp X-staged heuristic (60) ran at 1.00-1.67× of the
        # round-2 default (59) in all 24 cases
        # (M = 1: 1.00-1.20×, 8: 1.16-1.37×, 16: 1.33-1.67×); the 80-register build (70) was faster still only for
        # M = 1 where its modelled cost is ≤ 3/4 of the 16-warp one's (4096×11008 and 2048×5632, int8
        # values: 1.05×, 1.04×), and slower at M = 8 on 2048×5632 (0.90×): so it is taken only for M ≤ 4.
        # M > 4: 4 groups of fill and reduction instead of 3 in the cost model. H100, 2026-11-22T14:46Z
        # (tools/bitmap_linear_explore.py --rounds 3, commit 0267662, tactic 82 then): of the 7 LLM layers with
        # K·N ≥ 4M this moves only 4096×11008 at M 5–16, from 8 K splits to 2: 1.022–1.068× faster in all 8
        # cases (M 8/16, fp16/int8 values, 50/70 %), as in the K-split sweep of 9a3550b (14:18Z). At M ≤ 4 the
        # same constant tips the 80-register comparison below into slower choices (0.94–0.96×), so it stays 3.
        c16 = _r80_config(n, k, m, value_dtype, tactic, sm_count, smem_per_sm, xs="xs", fill=4 if m > 4 else 3)
        if m <= 4:
            c24 = _r80_config(n, k, m, value_dtype, tactic, sm_count, smem_per_sm, xs="xs80")
            if 4 * c24["cost"] <= 3 * c16["cost"]:
                return c24
        return c16
    if gemv_ok and tactic == PREV_DEFAULT:
        # Two decode kernels of one design: 103-127 registers (≤ 16 warps per SM) and 80 registers (≤ 24).
        # At the same configuration and occupancy the 80-register kernel is ~4 % slower (H100,
        # 2026-11-22T05:51Z, tactics 51 vs 40 on six layers: 0.91-1.06×), and more warps per SM alone did
        # not pay (4096², fp16 values: 12 K splits × 23 warps/SM at 0.90-1.00× of 8 × 15.5); it pays where
        # it removes a wave or halves the groups per warp (2048×5632, 896×4864: 1.17-1.43×). So it is taken
        # only when its modelled cost (waves × (groups per warp + 3)) is ≤ 3/4 of the other kernel's.
        c16 = _dec_config(n, k, m, value_dtype, tactic, sm_count)
        c24 = _r80_config(n, k, m, value_dtype, tactic, sm_count, smem_per_sm)
        return c24 if 4 * c24["cost"] <= 3 * c16["cost"] else c16
    if gemv_ok and tactic not in TACTICS:
        return _dec_config(n, k, m, value_dtype, tactic, sm_count)
    s, g = fmt.geometry(n, k)
    mt = 1 if m <= 16 else 2 if m <= 32 else 4
    gy = -(-m // (16 * mt))
    if tactic in TACTICS:
        spb, ks, stages = TACTICS[tactic]
    else:
        target = sm_count * 32  # resident warps wanted across the GPU (bytes in flight)
        ks = max(1, min(16, -(-target // (s * gy)), g // 2 if g >= 2 else 1))
        ks = 1 << (ks.bit_length() - 1)  # power of two
        spb = max(1, min(8 // ks if ks < 8 else 1, s))
        stages = 8
    if mt != 1 or x_dtype != "float16":
        stages = 4
    warps = spb * ks
    assert warps <= _MAX_WARPS
    slot = fmt.TILES_PER_GROUP * 8 + fmt.GROUP_K * fmt.STRIP * _V[value_dtype][1]
    smem = max(warps * stages * slot, warps * mt * 4 * 32 * 4)
    name = f"bitmap_linear_{_X[x_dtype][0]}_{_V[value_dtype][0]}_mt{mt}_s{stages}"
    return {"name": name, "grid": (-(-s // spb), gy, 1), "block": (32 * warps, 1, 1), "smem": smem,
            "ks": ks, "spb": spb}


_layers: dict = {}  # raw attribute values -> validated (n, k, value_dtype, has_bias)
_tls = threading.local()  # per-thread launch plans (their arg blocks are written per call)


def _layer(attrs: dict) -> tuple[int, int, str, int]:
    """:func:`_attrs`, cached by the raw attribute values (validation runs once per layer)."""
    key = None
    try:
        key = (attrs["n"], attrs["k"], attrs["value_dtype"], attrs.get("has_bias", 0))
        return _layers[key]
    except (KeyError, TypeError):  # first call for this layer, or unhashable / missing values
        a = _attrs(attrs)
        if key is not None:
            try:
                _layers[key] = a
            except TypeError:
                pass
        return a


def _plan(n: int, k: int, vd: str, x_dtype: str, m: int, tactic: int, x_aligned: bool) -> _cuda.Launch:
    """Kernel (resolved in the current context), grid, block, smem and arg block of one launch shape."""
    ctx = _cuda.current_context()
    c = config(n, k, m, x_dtype, vd, tactic, _cuda.context_sm_count(ctx), x_aligned,
               _cuda.context_attribute("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", ctx))
    kern = _cuda.get_kernel(SOURCE, c["name"])
    if c["name"].endswith(("_r80", "_r80n", "_xs", "_xs80")):  # up to 24 warps of rings per SM: ask for the full carveout
        cu = _cuda._driver()
        _cuda.check(cu.cuFuncSetAttribute(
            kern.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100))
    slots, addr = _cuda.ArgBlock.pointer_slots(7)  # X, bitmaps, values, offsets, scales, bias, Y
    args = _cuda.ArgBlock([*addr, *(ctypes.c_int(v) for v in (m, n, k, c["ks"], c["spb"]))], slots)
    return kern.plan(c["grid"], c["block"], args, c["smem"])


def launch(attrs: dict, x_dtype: str, m: int, inputs: list[int], outputs: list[int], stream: int,
           tactic: int = 1, workspace: int = 0) -> None:
    """Enqueue ``Y = X · Wᵀ · diag(scales) + bias`` on ``stream``.

    Args:
        attrs (dict): Node attributes (``n``, ``k``, ``value_dtype``, ``has_bias``).
        x_dtype (str): ``"float16"`` or ``"float32"`` (Y has the same dtype).
        m (int): Rows of X (product of its leading dims).
        inputs (list[int]): Device pointers ``[X, bitmaps, values, offsets, scales, (bias)]``; the
            weight tensors 16-byte aligned (TensorRT and torch allocations are). An X that is not
            16-byte aligned takes the generic path.
        outputs (list[int]): ``[Y]``.
        stream (int): ``cudaStream_t``.
        tactic (int): From :func:`valid_tactics`.
        workspace (int): Unused (``workspace_bytes`` is 0).

    No allocation, no host synchronisation; the module is compiled once and cached. Attributes are
    validated on the first call for a layer; grid, kernel handle and argument block are planned once
    per (layer, X dtype, M, tactic, X alignment, CUDA context) and thread, then only the pointers are
    rewritten.
    """
    n, k, vd, has_bias = _layer(attrs)
    if m <= 0:
        return
    if len(inputs) != 5 + has_bias or len(outputs) != 1:
        want = 5 + has_bias
        raise EdgeSDKError(f"EdgeBitmapLinear: expected {want} inputs and 1 output, got {len(inputs)} and "
                           f"{len(outputs)}", "pass [X, bitmaps, values, offsets, scales(, bias)] and [Y]")
    x = inputs[0]
    key = (n, k, vd, x_dtype, m, tactic, x % 16 == 0, _cuda.current_context())
    plans = _cuda.thread_cache(_tls)
    plan = plans.get(key)
    if plan is None:
        plan = plans[key] = _plan(n, k, vd, x_dtype, int(m), int(tactic), x % 16 == 0)
    plan.args.set_pointers(x, inputs[1], inputs[2], inputs[3], inputs[4], inputs[5] if has_bias else 0,
                           outputs[0])
    _cuda.launch_all((plan,), stream)


def time_us(weights: "fmt.BitmapLinearWeights", m: int, tactic: int = 1, stream: int | None = None,
            seed: int = 0) -> float:
    """GPU µs of one ``launch`` of this packed layer with fp16 X of ``m`` rows on the current device
    (:func:`edgesdk.kernels._cuda.time_layer_us`: operand copies rotated beyond 2 × L2, CUDA graph, median)."""
    attrs = weights.node_attributes()
    x = np.random.default_rng(seed).standard_normal((m, weights.k)).astype(np.float16)
    return _cuda.time_layer_us(list(weights.to_tensors().values()), x, 2 * m * weights.n,
                               lambda ins, outs, ws, st: launch(attrs, "float16", m, ins, outs, st, tactic),
                               stream=stream)


def measure_vs_dense(weights: "fmt.BitmapLinearWeights", m: int, int8_dense: bool = False) -> dict:
    """Time this packed layer (tactic 1) against the dense layer it replaces, on the current GPU.

    The dense side is cuBLAS fp16 (``edgesdk.kernels.dense``); with ``int8_dense`` (the layer came from
    an INT8 Q/DQ linear, which TensorRT would run in INT8) also cuBLAS INT8, and the faster of the two
    counts. Returns ``{"bitmap_us", "dense_us", "dense", "fp16_us", "int8_us", "m", "gpu", "sm_count"}``
    (``int8_us`` None when not timed or not supported by cuBLAS for the shape), ``"plugin": "bitmap"``."""
    from edgesdk.kernels import dense

    facts = _cuda.device_facts()
    ours = time_us(weights, m)
    fp16 = dense.time_us(weights.n, weights.k, m, "float16")
    i8 = dense.time_us(weights.n, weights.k, m, "int8") if int8_dense else None
    best, kind = (i8, "cuBLAS int8") if i8 is not None and i8 < fp16 else (fp16, "cuBLAS fp16")
    return {"plugin": "bitmap", "bitmap_us": round(ours, 3), "dense_us": round(best, 3), "dense": kind,
            "fp16_us": round(fp16, 3), "int8_us": None if i8 is None else round(i8, 3), "m": int(m),
            "gpu": facts["name"], "sm_count": facts["sm_count"]}
