"""Launcher for ``EdgeVitBitGemm`` (``plugins/vitbit_gemm/vitbit_gemm.cu``): the plugin launch API.

A launch is two or three kernels on the caller's stream, with no allocation and no host sync:

1. ``vitbit_quantize_*``: X -> int8 ``Xq [M, K16]`` in the workspace (one fp32 division per element).
   An int8 X (already quantized with ``x_scale``: the graph's QuantizeLinear output) skips this step; the GEMM
   reads X itself when K % 16 == 0 and X is 16-byte aligned, else ``vitbit_pad_i8`` copies it into Xq;
2. ``vitbit_gemm_<config>``: the fused GEMM, whose block tile is split by columns between tensor-core,
   INT-core and FP-core warps (the tactic's :class:`~edgesdk.formats.vitbit_gemm.CoreSplit`); with
   split-K it writes int32 partials to the workspace instead of Y;
3. ``vitbit_splitk_epilogue[8]`` (split-K only): exact int32 sum of the partials, then the epilogue
   (8 columns per thread with 16-byte loads when N % 8 == 0).

Tactics (``valid_tactics``): 1 = the default, a per-shape choice among the tensor-core-only tactics
(:func:`auto_tactic`, from measurements); 3, 9, 25, 28, 29 tc2 kernels (epilogue staged through shared
memory) of other tile sizes / pipeline depths, 4, 5, 26, 27 with split-K for small M (second kernel sums the
partials); 30, 31, 33, 34 persistent kernels ("tp": grid = the blocks resident on the current context's
SMs, each walks tiles through one cp.async pipeline, epilogue from registers); 50 split-K summed
inside the GEMM kernel by each tile's last block ("tk", small M, no second kernel); 71-73 tp and tc2
kernels with 64 x 32, 32 x 32 and 32 x 64 tiles (warps of 16 x 32) for small M; 60 split-M (tp_128x128
on the rows that fill whole waves of its blocks, tp_64x64 on the rest: two GEMM launches); 10-19 hybrids
(TC : INT : FP column ratios from 128:8:0 to 96:0:32); 22-23 hybrids with split-K; 20-21 hybrids whose
INT share uses packed 16-bit fields (4- and 5-bit weights only). Every tactic gives bit-identical results.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.formats.vitbit_gemm import CoreSplit, check_x_dtype, k_padded, validate_attributes
from edgesdk.kernels import _cuda

SOURCE = "vitbit_gemm/vitbit_gemm.cu"
BK = 128
SPLITK_MAX_ELEMS = 1 << 21  # split-K only where M*N is small (partials stay <= 4 x 8 MB)
_FLAG_HALF, _FLAG_BIAS, _FLAG_GELU = 1, 2, 4


@dataclass(frozen=True)
class Config:
    """One compiled GEMM kernel: tile BM x (tc + int + fp) columns, warp tile, pipeline depth."""

    name: str
    bm: int
    split: CoreSplit
    wm: int
    wn: int
    stages: int
    tm: int = 4
    int_mode: int = 0  # 0 dp4a, 4/5 packed fields for 4/5-bit weights
    tc2: bool = False  # second-generation tensor-core-only kernel (epilogue staged through smem)
    persistent: bool = False  # "tp": resident blocks walk the tiles, one pipeline, epilogue from registers
    inkernel_splitk: bool = False  # "tk": split-K partials summed by the tile's last block (no 2nd kernel)

    @property
    def bn(self) -> int:
        return self.split.width

    @property
    def threads(self) -> int:
        tc_warps = (self.bm // self.wm) * (self.split.tc // self.wn)
        return 32 * tc_warps + self.bm * (self.split.int_ + self.split.fp) // (self.tm * 8)

    @property
    def smem(self) -> int:
        pipe = self.stages * (self.bm + self.bn) * BK
        staged = self.tc2 and not (self.persistent or self.inkernel_splitk)
        return max(pipe, self.bm * (self.bn + 8) * 4) if staged else pipe


_C = {c.name: c for c in [
    Config("tc2_256x128", 256, CoreSplit(128), 64, 64, 3, tc2=True),
    Config("tc2_64x128s3", 64, CoreSplit(128), 64, 32, 3, tc2=True),
    Config("tc2_64x64", 64, CoreSplit(64), 32, 32, 4, tc2=True),
    Config("tc2_64x64s3", 64, CoreSplit(64), 32, 32, 3, tc2=True),
    Config("tc2_64x64s6", 64, CoreSplit(64), 32, 32, 6, tc2=True),
    Config("tp_128x128", 128, CoreSplit(128), 64, 32, 3, tc2=True, persistent=True),
    Config("tp_64x128", 64, CoreSplit(128), 64, 32, 3, tc2=True, persistent=True),
    Config("tp_64x64", 64, CoreSplit(64), 32, 32, 4, tc2=True, persistent=True),
    Config("tp_128x128w4", 128, CoreSplit(128), 64, 64, 3, tc2=True, persistent=True),
    Config("tk_64x64", 64, CoreSplit(64), 32, 32, 4, tc2=True, inkernel_splitk=True),
    # small-M tiles (round 6): more, shorter tiles than 64 x 64 where a 197-row M leaves most SMs idle
    Config("tc2_32x64", 32, CoreSplit(64), 16, 32, 4, tc2=True),
    Config("tp_64x32", 64, CoreSplit(32), 16, 32, 4, tc2=True, persistent=True),
    Config("tp_32x32", 32, CoreSplit(32), 16, 32, 4, tc2=True, persistent=True),
    # round 7, warps of 64 x 64: 8 warps, 144 KB (one block per SM, within Orin's 163 KB per block) ...
    Config("tp_256x128", 256, CoreSplit(128), 64, 64, 3, tc2=True, persistent=True),
    Config("tp_128x256", 128, CoreSplit(256), 64, 64, 3, tc2=True, persistent=True),
    # ... and 4 warps with 2 stages, 64 KB: two blocks per SM on the H100 and on Orin (the default for large M)
    Config("tp_128x128w4s2", 128, CoreSplit(128), 64, 64, 2, tc2=True, persistent=True),
    Config("h128_tc128_i8", 128, CoreSplit(128, 8), 64, 32, 3),
    Config("h128_tc128_i8_f8", 128, CoreSplit(128, 8, 8), 64, 32, 3, tm=2),
    Config("h64_tc64_i8", 64, CoreSplit(64, 8), 32, 32, 4, tm=2),
    Config("h64_tc128_i8", 64, CoreSplit(128, 8), 32, 32, 4, tm=2),
    Config("h128_tc96_i32", 128, CoreSplit(96, 32), 64, 32, 3),
    Config("h128_tc96_i16_f16", 128, CoreSplit(96, 16, 16), 64, 32, 3),
    Config("h128_tc96_f32", 128, CoreSplit(96, 0, 32), 64, 32, 3),
    Config("h128_tc128_i32", 128, CoreSplit(128, 32), 64, 32, 3),
    Config("h64_tc64_i16", 64, CoreSplit(64, 16), 32, 32, 4),
    Config("h64_tc64_i8_f8", 64, CoreSplit(64, 8, 8), 32, 32, 4, tm=2),
    Config("h128_tc96_i32_field4", 128, CoreSplit(96, 32), 64, 32, 3, int_mode=4),
    Config("h128_tc96_i32_field5", 128, CoreSplit(96, 32), 64, 32, 3, int_mode=5),
    Config("h64_tc64_i16_field4", 64, CoreSplit(64, 16), 32, 32, 4, int_mode=4),
    Config("h64_tc64_i16_field5", 64, CoreSplit(64, 16), 32, 32, 4, int_mode=5),
]}

# tactic -> (config name, or "field:<base>" for the bits-dependent field variant; K splits)
TACTICS: dict[int, tuple[str, int]] = {
    # 1 (AUTO, the default) is not in this table: it resolves per shape to one of the tactics below
    # (auto_tactic). Removed in round 3 (never within 3 % of the fastest tactic on any shape measured in
    # rounds 1-2, bench/results/vitbit_gemm.json and vitbit_gemm_tp.json): the old 1 (tc2_128x128, slower
    # than 30 everywhere), 2, 6, 7, 8, 24, 32 and the first-generation kernels 41-48 (4 stays: the
    # shared launch-overhead tool and test use it as the three-kernel split-K case).
    # tensor cores only, second generation (tc2: epilogue staged through smem, 16-byte stores)
    3: ("tc2_64x64", 1),
    4: ("tc2_64x64", 2),
    5: ("tc2_64x64", 4),
    9: ("tc2_256x128", 1),
    25: ("tc2_64x64s6", 1),
    26: ("tc2_64x64s6", 2),
    27: ("tc2_64x64s6", 4),
    28: ("tc2_64x64s3", 1),
    29: ("tc2_64x128s3", 1),
    # tensor cores only, persistent (grid = blocks resident on the current context's SMs; no split-K)
    30: ("tp_128x128", 1),
    31: ("tp_64x128", 1),
    33: ("tp_64x64", 1),
    34: ("tp_128x128w4", 1),
    # tensor cores only, split-K summed inside the GEMM kernel by each tile's last block (small M; round 3
    # also measured 3 and 4 splits and a 64 x 128 tile: never the fastest, removed)
    50: ("tk_64x64", 2),
    # tensor cores only, small tiles for small M (round 6; warps of 16 x 32; 71, 72 persistent, 73 tc2). Also
    # measured then and removed (never within 3 % of the fastest tactic on a ViT-B shape,
    # bench/results/vitbit_gemm_r6_small_*.json): 70 tp_32x64, 74 tk_32x64 and 76 tk_32x32 (split-K 2),
    # 75 tp_32x32 with 6 stages
    71: ("tp_64x32", 1),
    72: ("tp_32x32", 1),
    73: ("tc2_32x64", 1),
    # tensor cores only, persistent, warps of 64 x 64 (round 7: fewer ldmatrix per mma than tp_128x128's 64 x 32
    # warps): 80, 81 large tiles of 8 warps; 82 tp_128x128w4 (34) with 2 stages (measured fastest at large M,
    # bench/results/vitbit_gemm_r7_*.json)
    80: ("tp_256x128", 1),
    81: ("tp_128x256", 1),
    82: ("tp_128x128w4s2", 1),
    # (round 3 also measured 8 warps of 16 x 32 on a 64 x 64 tile as tp/tc2/tk tactics 38-40: 1.02-1.64x
    # slower than the best tactic everywhere, removed)
    # hybrids: tensor-core warps + INT-core (dp4a) and/or FP-core warps
    10: ("h128_tc96_i32", 1),
    11: ("h128_tc96_i16_f16", 1),
    12: ("h128_tc96_f32", 1),
    13: ("h128_tc128_i32", 1),
    14: ("h64_tc64_i16", 1),
    15: ("h64_tc64_i8_f8", 1),
    16: ("h128_tc128_i8", 1),
    17: ("h128_tc128_i8_f8", 1),
    18: ("h64_tc64_i8", 1),
    19: ("h64_tc128_i8", 1),
    22: ("h64_tc64_i8", 4),
    23: ("h64_tc128_i8", 2),
    20: ("field:h128_tc96_i32", 1),
    21: ("field:h64_tc64_i16", 1),
}
#: Split-M tactics (round 5): the persistent 128 x 128 kernel on the first rows, as many 128-row tile rows as
#: fill whole waves of its resident blocks, then a second persistent kernel with smaller tiles on the rest of
#: M (no fixup, no partials: each output tile is computed once). Tactic -> (head config, tail config).
#: Measured (H100, 2026-11-22T18:21Z, bench/results/vitbit_gemm_r5_splitm_34b641f.json): 60 is 1.03x /
#: 1.07x faster than tp_128x128 (30) at M = 6304 on 768x2304 / 3072x768 and 0.95-0.96x on 768x768 /
#: 768x3072; a tp_64x128 tail (61 then) was never the fastest tactic and was removed.
SPLIT_M: dict[int, tuple[str, str]] = {60: ("tp_128x128", "tp_64x64")}
AUTO = TC_ONLY = 1
MAX_SPLITS = max(s for _, s in TACTICS.values())


def shape_class(n: int, k: int, m: int, sms: int) -> tuple[float, int]:
    """r, the 128 x 128 output tiles per SM of the context, and kt, the k-tiles (of BK) per output tile (the
    features of the round-10 rule that :func:`auto_tactic` replaced; ``tools/vitbit_gemm_fit_auto.py`` bins by them)."""
    return -(-m // 128) * -(-n // 128) / max(1, sms), -(-k_padded(k) // BK)


#: Tactic 1's wave model (round 13): predicted µs of tensor-core-only tactic t = a + b W + c W kt / splits, with
#: W = ceil(tiles x splits / (resident blocks per SM x SMs of the context)) waves and kt k-tiles of BK. Tactic ->
#: (a, b, c), fitted (least squares on relative error) to every timed case of the round-12 refit on an H200
#: (16 layers of ViT-Ti/S/B/L x M = 197 x {1, 2, 4, 8, 16, 32}, full GPU and 16-SM green context, kernels of
#: ed6347d; 2,238 outputs checked exact) by ``python tools/vitbit_gemm_fit_auto.py
#: bench/results/vitbit_gemm_explore_r10{fit,fit2,hold,hold2}_h200_ed6347d.json --hold "" --loo --wave-tactics
#: 3,29,30,31,33,34,71,72,73,82 --judge ...`` (bench/results/vitbit_gemm_autofit_all_h200_ed6347d.json, which
#: tests/test_vitbit_gemm_format.py checks this table against). Not candidates: split-M 60 (two kernels) and the
#: in-kernel split-K 50, whose predictions were too low at K = 3072 (left out, the full-GPU regret left one layer out
#: fell from 1.0220 to 1.0199 on the H200 and from 1.0249 to 1.0185 on the H100; docs/vitbit_gemm.md, round 13).
WAVE_MODEL: dict[int, tuple[float, float, float]] = {
    3: (0.7033, 2.875, 0.4998),
    29: (-1.345, 6.54, 0.6565),
    30: (-0.2, 3.783, 0.9561),
    31: (0.1874, 3.028, 0.7144),
    33: (1.431, 1.543, 0.492),
    34: (0.1845, 3.692, 0.9322),
    71: (1.478, 1.224, 0.4773),
    72: (1.881, 0.9526, 0.3943),
    73: (0.8988, 2.095, 0.4496),
    82: (0.08389, 3.715, 0.9319),
}


def wave_prediction(tactic: int, n: int, k: int, m: int, sms: int, blocks_per_sm: int) -> float | None:
    """Predicted µs of ``tactic`` (a :data:`WAVE_MODEL` tactic) for an M x N x K layer on a context of ``sms`` SMs
    where the tactic's kernel keeps ``blocks_per_sm`` blocks resident; None where it cannot run the shape
    (split-K not allowed, fewer k-tiles than splits, no resident block)."""
    a, b, c = WAVE_MODEL[tactic]
    cfg, splits = config(tactic)
    kt = -(-k_padded(k) // BK)
    if splits > 1 and (kt < splits or not _splitk_ok(m, n)):
        return None
    if blocks_per_sm <= 0 or sms <= 0:
        return None
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn) * splits
    w = -(-tiles // (blocks_per_sm * sms))
    return a + b * w + c * w * kt / splits


def auto_tactic(n: int, k: int, m: int, sms: int, blocks_per_sm) -> int:
    """Tactic 1 (the default): the tensor-core-only tactic of least :func:`wave_prediction` for this shape on a
    context of ``sms`` SMs. ``blocks_per_sm``: tactic -> resident blocks per SM of its kernel (a mapping or a
    function; the launcher asks the driver, :func:`resident_blocks`), so the rule sees the device's occupancy
    (Orin's 164 KB of shared memory per SM holds fewer blocks than an H100's 228 KB).

    Measured (docs/vitbit_gemm.md, round 13), as the geometric mean of regret (picked tactic's time / the best
    tactic's): on the round-12 H200 runs with each layer left out of the fit in turn, full GPU 1.020 (the round-10
    rule it replaces, which binned by tiles per SM and k-tiles: 1.050), 16 SMs 1.019 (1.049), 16 SMs at Orin's
    occupancy 1.009 (1.026); on the H100's runs (not fitted on) 1.019 (1.049) and 1.019 (1.049); tactic 1 as run on an
    H100 (ViT-B/16, M = 197 x 1..32) 1.019 (1.037) full GPU, 1.015 (1.038) 16 SMs, GELU builds 1.019 (1.086)."""
    get = blocks_per_sm if callable(blocks_per_sm) else (lambda t: blocks_per_sm.get(t, 0))
    best, best_us = None, float("inf")
    for t in sorted(WAVE_MODEL):
        us = wave_prediction(t, n, k, m, sms, int(get(t) or 0))
        if us is not None and us < best_us:
            best, best_us = t, us
    if best is None:
        raise EdgeSDKError(f"EdgeVitBitGemm: no tensor-core-only tactic can keep a block resident for M={m}, "
                           f"N={n}, K={k} on this device", "pick a tactic from valid_tactics(attrs, m) explicitly")
    return best


def config(tactic: int, bits: int = 8) -> tuple[Config, int]:
    """The kernel config and K splits of ``tactic`` (for weights of ``bits`` bits); tactic 1 (AUTO) must be
    resolved to a concrete tactic first (:func:`auto_tactic`)."""
    if tactic == AUTO:
        raise EdgeSDKError("EdgeVitBitGemm: tactic 1 is the per-shape choice; config() needs a concrete tactic",
                           "use resolve_tactic(attrs, m) (or auto_tactic) to resolve it")
    if tactic in SPLIT_M:  # the head kernel; the tail's is SPLIT_M[tactic][1]
        return _C[SPLIT_M[tactic][0]], 1
    if tactic not in TACTICS:
        raise EdgeSDKError(f"EdgeVitBitGemm: unknown tactic {tactic!r}",
                           f"use one of {sorted([*TACTICS, *SPLIT_M])}")
    name, splits = TACTICS[tactic]
    if name.startswith("field:"):
        if bits not in (4, 5):
            raise EdgeSDKError(f"EdgeVitBitGemm: tactic {tactic} (packed fields) needs 4- or 5-bit weights, "
                               f"the layer has {bits}-bit", "pick a tactic from valid_tactics(attrs, m)")
        name = f"{name[6:]}_field{bits}"
    return _C[name], splits


def _splitk_ok(m: int | None, n: int) -> bool:
    return m is None or m * n <= SPLITK_MAX_ELEMS


def valid_tactics(attrs: dict, m: int | None = None) -> list[int]:
    """Tactics usable for this layer (all exact); 1 = the per-shape tensor-core-only choice, the default."""
    a = validate_attributes(attrs)
    kt = -(-k_padded(a["k"]) // BK)
    out = [AUTO]
    for t, (name, splits) in TACTICS.items():
        if name.startswith("field:") and a["bits"] not in (4, 5):
            continue
        if splits > 1 and (kt < splits or not _splitk_ok(m, a["n"])):
            continue
        out.append(t)
    return out + list(SPLIT_M)


def _xq_bytes(m: int, k: int) -> int:
    return -(-(m * k_padded(k)) // 256) * 256


def _tk_tiles(cfg: Config, m: int, n: int) -> int:
    return -(-m // cfg.bm) * -(-n // cfg.bn)


def _partials_bytes(m: int, n: int) -> int:
    """Bytes of the split-K partials region (after Xq), enough for every split-K tactic: M x N int32 per
    split for the tc2 tactics, whole tiles per split for the tk tactics; 0 where split-K is off."""
    if not _splitk_ok(m, n):
        return 0
    b = 4 * MAX_SPLITS * m * n
    for name, splits in TACTICS.values():
        cfg = _C.get(name)
        if cfg is not None and cfg.inkernel_splitk:
            b = max(b, 4 * _tk_tiles(cfg, m, n) * splits * cfg.bm * cfg.bn)
    return -(-b // 256) * 256


def _counters(m: int, n: int) -> int:
    """Tile counters of the tk tactics, after the partials region (one int32 per tile of the tk tactic with
    the most tiles). They sit where no tactic writes partials, so they stay zero between launches (each tk
    launch leaves them zero) whichever tactics share the workspace."""
    if not _splitk_ok(m, n):
        return 0
    return max(_tk_tiles(_C[name], m, n) for name, _ in TACTICS.values() if name in _C and _C[name].inkernel_splitk)


def workspace_bytes(attrs: dict, m: int) -> int:
    """Workspace for ``m`` rows, enough for every tactic: int8 Xq, split-K int32 partials, tk tile counters."""
    a = validate_attributes(attrs)
    m, n = int(m), a["n"]
    return _xq_bytes(m, a["k"]) + _partials_bytes(m, n) + 4 * _counters(m, n)


def _kernel(name: str) -> _cuda.Kernel:
    return _cuda.get_kernel(SOURCE, name)


def kernel_name(cfg: Config, gelu: bool) -> str:
    """The CUDA kernel of ``cfg`` for a layer with or without GELU: the persistent ("tp") and in-kernel split-K
    ("tk") kernels come in two builds, ``vitbit_gemm_<name>`` (no GELU code) and ``vitbit_gemm_<name>_gelu``."""
    gelu_build = bool(gelu) and (cfg.persistent or cfg.inkernel_splitk)
    return f"vitbit_gemm_{cfg.name}" + ("_gelu" if gelu_build else "")


# Tests set this to a small number so that each block of a persistent tactic walks many tiles.
PERSISTENT_GRID_CAP: int | None = None


def _context_sms() -> int:
    """SMs of the current context: all of the device's, or a green context's share (asked once per context)."""
    return _cuda.context_sm_count()


_resident: dict[tuple[int, int, int], int] = {}


def _blocks_per_sm(kernel: _cuda.Kernel, cfg: Config) -> int:
    """Resident blocks per SM of ``kernel`` at ``cfg``'s block size and shared memory (the driver's occupancy
    query, once per loaded kernel: kernels are loaded once per context and kept)."""
    key = (id(kernel), cfg.threads, cfg.smem)
    v = _resident.get(key)
    if v is None:
        kernel.set_max_dynamic_smem(cfg.smem)
        cu = _cuda._driver()
        v = _resident[key] = int(_cuda.check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            kernel.function, cfg.threads, cfg.smem)))
    return v


def resident_blocks(tactic: int, gelu: bool = False) -> int:
    """Resident blocks per SM of ``tactic``'s kernel (its GELU build where ``gelu``) on the current device."""
    cfg, _ = config(tactic)
    return _blocks_per_sm(_kernel(kernel_name(cfg, gelu)), cfg)


_resolved: dict[tuple, int] = {}


def resolve_tactic(a: dict, m: int, tactic: int = AUTO) -> int:
    """``tactic``, with tactic 1 resolved for ``m`` rows of layer ``a`` (validated attributes) on the current
    context: :func:`auto_tactic` with the driver's occupancy of each candidate's kernel (once per shape and
    context: :func:`gemm` resolves on every call)."""
    if tactic != AUTO:
        return tactic
    key = (a["n"], a["k"], bool(a["gelu"]), int(m), _cuda.current_context())
    t = _resolved.get(key)
    if t is None:
        t = _resolved[key] = auto_tactic(a["n"], a["k"], m, _context_sms(),
                                         lambda t: resident_blocks(t, bool(a["gelu"])))
    return t


def persistent_grid(kernel: _cuda.Kernel, cfg: Config, tiles: int) -> int:
    """Blocks of a persistent tactic: min(tiles, resident blocks per SM x SMs of the current context)."""
    g = max(1, _blocks_per_sm(kernel, cfg)) * _context_sms()
    if PERSISTENT_GRID_CAP:
        g = min(g, PERSISTENT_GRID_CAP)
    return max(1, min(tiles, g))


def split_m_rows(head_slots: int, m: int, n: int, bm: int = 128, bn: int = 128) -> int:
    """Rows of M that a split-M tactic gives its head kernel (pure): the most whole ``bm``-row tile rows whose
    tiles fit in whole waves of ``head_slots`` resident blocks; 0 when there is less than one wave (the tail
    kernel then takes all of M), ``m`` when the tiles fill whole waves exactly (no tail)."""
    ncol = -(-n // bn)
    tiles = -(-m // bm) * ncol
    waves = tiles // max(1, head_slots)
    return min(m, (waves * head_slots // ncol) * bm)


def _split_m(a: dict, m: int, tactic: int) -> tuple[Config, Config, int]:
    """Head config, tail config and head rows of split-M ``tactic`` on the current context."""
    head, tail = (_C[nm] for nm in SPLIT_M[tactic])
    slots = persistent_grid(_kernel(kernel_name(head, a["gelu"])), head, 1 << 30)
    return head, tail, split_m_rows(slots, m, a["n"], head.bm, head.bn)


def _y_itemsize(a: dict, x_dtype: str) -> int:
    return 2 if y_dtype(a, x_dtype) == "float16" else 4


_layers: dict = {}  # raw attribute values -> (validated attributes, their key)
_tls = threading.local()  # per-thread launch plans (their arg blocks are written per call)


def _layer(attrs: dict) -> tuple[dict, tuple]:
    """``validate_attributes(attrs)`` and a hashable key of it, cached by the raw attribute values."""
    raw = None
    try:
        raw = (attrs["n"], attrs["k"], attrs["bits"], attrs["has_bias"], attrs["gelu"], attrs["x_scale"],
               attrs.get("y_dtype", ""))
        return _layers[raw]
    except (KeyError, TypeError):  # first call for this layer, or unhashable / missing values
        a = validate_attributes(attrs)
        out = (a, (a["n"], a["k"], a["bits"], a["has_bias"], a["gelu"], a["x_scale"], a["y_dtype"]))
        if raw is not None:
            try:
                _layers[raw] = out
            except TypeError:
                pass
        return out


def launch(attrs: dict, x_dtype: str, m: int, inputs: list[int], outputs: list[int], stream: int,
           tactic: int = 1, *, workspace: int = 0) -> None:
    """Run the layer on ``stream``: ``inputs`` = [X, weight, w_scale, (bias)], ``outputs`` = [Y] (device
    pointers); ``workspace`` = a device buffer of at least ``workspace_bytes(attrs, m)`` bytes.

    Split-K tactics fall back to one split (same tile) where ``m * n`` is too large for split-K.
    Attributes are validated on the first call for a layer; kernels, grids and argument blocks are
    planned once per (layer, X dtype, M, tactic, CUDA context) and thread, then only the pointers
    are rewritten.
    """
    a, akey = _layer(attrs)
    check_x_dtype(x_dtype, a)
    if len(inputs) != 3 + a["has_bias"] or len(outputs) != 1:
        raise EdgeSDKError(f"EdgeVitBitGemm: expected {3 + a['has_bias']} inputs and 1 output, got "
                           f"{len(inputs)} and {len(outputs)}", "pass [X, weight, w_scale, (bias)] and [Y]")
    if m <= 0:
        return
    if not workspace:
        raise EdgeSDKError("EdgeVitBitGemm: launch needs a workspace (quantized X, split-K partials)",
                           "allocate workspace_bytes(attrs, m) bytes and pass workspace=<pointer>")
    direct = x_dtype == "int8" and a["k"] % 16 == 0 and int(inputs[0]) % 16 == 0
    key = (akey, x_dtype, direct, m, tactic, _cuda.current_context(), PERSISTENT_GRID_CAP)
    plans = _cuda.thread_cache(_tls)
    plan = plans.get(key)
    if plan is None:
        plan = plans[key] = _plan(a, x_dtype, int(m), int(tactic), direct)
    launches, part_off, ctr_off, (xoff, yoff), ptrs = plan
    gx = inputs[0] if direct else workspace  # the GEMM's X: int8 X in place, or Xq at the workspace's start
    ptrs.set_pointers(inputs[0], workspace, inputs[1], inputs[2], inputs[3] if a["has_bias"] else 0,
                      outputs[0], workspace + part_off if part_off else 0, workspace + ctr_off if ctr_off else 0,
                      gx + xoff, outputs[0] + yoff)
    _cuda.launch_all(launches, stream)


def _plan(a: dict, x_dtype: str, m: int, tactic: int, direct: bool = False
          ) -> tuple[tuple[_cuda.Launch, ...], int, int, tuple[int, int], _cuda.ArgBlock]:
    """Launches of :func:`launch` over shared pointer slots (X, Xq, W, w_scale, bias, Y, partials, tile
    counters, and a split-M tail's X and Y); the byte offsets of the partials and the counters in the
    workspace (0: none); the split-M tail's byte offsets into the GEMM's X and into Y; and the arg block
    that writes the slots. ``direct``: int8 X that the GEMM reads in place (no copy)."""
    slots, (x, xq, w, ws, bias, y, part, ctr, xq2, y2) = _cuda.ArgBlock.pointer_slots(10)
    cfg, splits = _gemm_config(a, m, tactic)
    xoff = yoff = 0
    mh = _split_m(a, m, tactic)[2] if tactic in SPLIT_M else None
    if mh is not None:  # the tail kernel's X and Y start mh rows in
        xoff, yoff = mh * k_padded(a["k"]), mh * a["n"] * _y_itemsize(a, x_dtype)
    part_off = _xq_bytes(m, a["k"]) if splits > 1 else 0
    ctr_off = nctr = 0
    if cfg.inkernel_splitk and splits > 1:  # the first kernel zeroes this tactic's tile counters
        ctr_off, nctr = part_off + _partials_bytes(m, a["n"]), _tk_tiles(cfg, m, a["n"])
    first: list[_cuda.Launch] = []
    if x_dtype != "int8":
        first.append(_quantize_launch(a, x_dtype, m, x, xq, slots, ctr_off // 4, nctr))
    elif not direct or nctr:  # copy X into Xq, and/or zero the tk counters
        first.append(_pad_launch(a, 0 if direct else m, x, xq, slots, ctr_off // 4, nctr))
    gemm = _gemm_launches(a, x_dtype, m, tactic, x if direct else xq, w, ws, bias, y, part, ctr, xq2, y2, mh)
    return (*first, *gemm), part_off, ctr_off, (xoff, yoff), _cuda.ArgBlock((), slots)


def _pad_launch(a: dict, m: int, x, xq, slots=None, ctr_off: int = 0, nctr: int = 0) -> _cuda.Launch:
    """``vitbit_pad_i8``: int8 X [m, K] -> Xq [m, K16] (pad 0), and zero ``nctr`` tk counters (m = 0: only that)."""
    kp = k_padded(a["k"])
    groups = m * kp // 4
    args = _cuda.ArgBlock([x, xq, ctypes.c_int(m), ctypes.c_int(a["k"]), ctypes.c_int(kp), ctypes.c_int64(ctr_off),
                           ctypes.c_int(nctr)], slots)
    return _kernel("vitbit_pad_i8").plan((max(1, min(-(-groups // 256), 4096)),), (256,), args)


def _gemm_config(a: dict, m: int, tactic: int) -> tuple[Config, int]:
    """Config and effective K splits of ``tactic`` for ``m`` rows."""
    cfg, splits = config(resolve_tactic(a, m, tactic), a["bits"])
    if splits > 1 and not _splitk_ok(m, a["n"]):
        splits = 1
    kt = -(-k_padded(a["k"]) // BK)
    splits = min(splits, kt)
    if cfg.inkernel_splitk:  # no empty split: every block of a tile takes part in its counter
        splits = -(-kt // -(-kt // splits))
    return cfg, splits


def _quantize_launch(a: dict, x_dtype: str, m: int, x, xq, slots=None, ctr_off: int = 0,
                     nctr: int = 0) -> _cuda.Launch:
    """The quantize kernel's launch; pointer arguments are ctypes values or pointer-slot addresses. It also
    zeroes ``nctr`` tile counters of a tk tactic at int32 word ``ctr_off`` of the workspace (Xq's base)."""
    kp = k_padded(a["k"])
    qk = _kernel("vitbit_quantize_f16" if x_dtype == "float16" else "vitbit_quantize_f32")
    groups = m * kp // 4
    args = _cuda.ArgBlock([x, xq, ctypes.c_float(a["x_scale"]), ctypes.c_int(m), ctypes.c_int(a["k"]),
                           ctypes.c_int(kp), ctypes.c_int64(ctr_off), ctypes.c_int(nctr)], slots)
    return qk.plan((min(-(-groups // 256), 4096),), (256,), args)


def _gemm_launches(a: dict, x_dtype: str, m: int, tactic: int, xq, w, ws, bias, y, part,
                   ctr=None, xq2=None, y2=None, mh: int | None = None) -> list[_cuda.Launch]:
    """The GEMM (and split-K epilogue) launches; pointer arguments as in :func:`_quantize_launch`. A split-M
    tactic launches its head kernel on rows [0, mh) and its tail kernel on rows [mh, m), whose X and Y
    pointers ``xq2`` (= X + mh · K16) and ``y2`` (= Y + mh · N) the caller provides, with ``mh`` when it has it."""
    if tactic in SPLIT_M:
        head, tail = (_C[nm] for nm in SPLIT_M[tactic])
        if mh is None:
            mh = _split_m(a, m, tactic)[2]
        out = _one_gemm(a, x_dtype, mh, head, 1, xq, w, ws, bias, y, part, ctr) if mh > 0 else []
        if mh < m:
            out += _one_gemm(a, x_dtype, m - mh, tail, 1, xq2, w, ws, bias, y2, part, ctr)
        return out
    cfg, splits = _gemm_config(a, m, tactic)
    return _one_gemm(a, x_dtype, m, cfg, splits, xq, w, ws, bias, y, part, ctr)


def _one_gemm(a: dict, x_dtype: str, m: int, cfg: Config, splits: int, xq, w, ws, bias, y, part,
              ctr=None) -> list[_cuda.Launch]:
    n, k = a["n"], a["k"]
    kp = k_padded(k)
    flags = (_FLAG_HALF if y_dtype(a, x_dtype) == "float16" else 0) | (_FLAG_BIAS if a["has_bias"] else 0) | \
        (_FLAG_GELU if a["gelu"] else 0)
    xs = ctypes.c_float(a["x_scale"])
    kt = -(-kp // BK)
    kps = -(-kt // splits)  # K tiles per split
    kern = _kernel(kernel_name(cfg, a["gelu"]))
    grid = (-(-n // cfg.bn), -(-m // cfg.bm), splits)
    if cfg.persistent:  # one split; the kernel walks tiles blockIdx.x, + gridDim.x, ...
        grid = (persistent_grid(kern, cfg, grid[0] * grid[1]), 1, 1)
    out = [kern.plan(
        grid, (cfg.threads,),
        _cuda.ArgBlock([xq, w, y, part, ws, bias, xs, ctypes.c_int(flags), ctypes.c_int(m), ctypes.c_int(n),
                        ctypes.c_int(kp), ctypes.c_int(kps)] + ([ctr] if cfg.inkernel_splitk else [])), cfg.smem)]
    if splits > 1 and not cfg.inkernel_splitk:
        per = 8 if n % 8 == 0 else 1  # 8 consecutive columns per thread where rows are whole chunks
        out.append(_kernel("vitbit_splitk_epilogue8" if per == 8 else "vitbit_splitk_epilogue").plan(
            (min(-(-(m * n // per) // 256), 4096),), (256,),
            _cuda.ArgBlock([part, ctypes.c_int(splits), y, ws, bias, xs, ctypes.c_int(flags), ctypes.c_int(m),
                            ctypes.c_int(n)])))
    return out


def y_dtype(a: dict, x_dtype: str) -> str:
    """Y's dtype: attribute ``y_dtype`` where set (required for an int8 X), else X's."""
    return a["y_dtype"] or x_dtype


def _p(ptr: int) -> ctypes.c_void_p:
    return ctypes.c_void_p(int(ptr))


def quantize(a: dict, x_dtype: str, m: int, x: int, xq: int, stream: int) -> None:
    """Step 1 of :func:`launch`: X -> int8 Xq [m, K16] (``a``: validated attributes)."""
    _cuda.launch_all((_quantize_launch(a, x_dtype, m, _p(x), _p(xq)),), stream)


def gemm(a: dict, x_dtype: str, m: int, xq: int, w: int, ws: int, bias: int, y: int, stream: int,
         tactic: int = 1, part: int = 0) -> None:
    """Steps 2-3 of :func:`launch` on an already quantized Xq; ``part``: the split-K region of a workspace
    (``workspace + _xq_bytes(m, k)``). For the in-kernel split-K tactic (50) its tile counters (after
    the partials) must be zero on entry: zero the workspace once; every tk launch leaves them zero and no
    tactic writes there (``launch`` also zeroes them itself, in the quantize kernel)."""
    _, splits = _gemm_config(a, m, tactic)
    if splits == 1:
        part = 0
    elif not part:
        raise EdgeSDKError("EdgeVitBitGemm: split-K tactic without a partials buffer",
                           "pass the workspace (workspace_bytes) to launch")
    ctr = part + _partials_bytes(m, a["n"]) if part else 0  # the tk tile counters follow the partials
    mh = _split_m(a, m, tactic)[2] if tactic in SPLIT_M else 0
    _cuda.launch_all(_gemm_launches(a, x_dtype, m, tactic, _p(xq), _p(w), _p(ws), _p(bias), _p(y), _p(part),
                                    _p(ctr), _p(xq + mh * k_padded(a["k"])),
                                    _p(y + mh * a["n"] * _y_itemsize(a, x_dtype)), mh), stream)


def time_us(weights, m: int, tactic: int = 1, x_dtype: str = "float16", stream: int | None = None,
            seed: int = 0) -> float:
    """GPU µs of one ``launch`` (what the plugin runs: quantize + GEMM for a float X, the GEMM alone for an
    int8 X) of this packed layer with X of ``m`` rows on the current device
    (:func:`edgesdk.kernels._cuda.time_layer_us`: operand copies rotated beyond 2 × L2, CUDA graph, median)."""
    attrs = weights.node_attributes()
    rng = np.random.default_rng(seed)
    if x_dtype == "int8":
        attrs["y_dtype"] = attrs.get("y_dtype") or "float16"
        x = rng.integers(-128, 128, (m, weights.k), dtype=np.int8)
    else:
        x = (rng.standard_normal((m, weights.k)) * 40 * weights.x_scale).astype(x_dtype)
    y_bytes = m * weights.n * np.dtype(y_dtype(attrs, x_dtype)).itemsize
    return _cuda.time_layer_us(
        list(weights.to_tensors().values()), x, y_bytes,
        lambda ins, outs, ws, st: launch(attrs, x_dtype, m, ins, outs, st, tactic, workspace=ws),
        workspace_bytes=workspace_bytes(attrs, m), stream=stream)


def measure_vs_dense(weights, m: int, x_dtype: str | None = None) -> dict:
    """Time this packed layer (tactic 1) against the dense layer it replaces on the current GPU: an INT8
    Q/DQ linear, which TensorRT runs as an int8 GEMM — cuBLAS int8 × int8 → int32 stands in for it
    (``edgesdk.kernels.dense``; without the dequantize/bias epilogue), or cuBLAS fp16 where cuBLAS has no int8
    kernel for the shape. ``x_dtype``: the node's X, by default int8 where the layer has ``y_dtype`` (the
    rewrite's int8-input nodes: both sides then start from the graph's quantized X) and float16 otherwise
    (ours then also pays the quantization of X). Returns ``{"plugin": "vitbit", "vitbit_us", "dense_us",
    "dense", "fp16_us", "int8_us", "x_dtype", "m", "gpu", "sm_count"}``."""
    from edgesdk.kernels import dense

    facts = _cuda.device_facts()
    x_dtype = x_dtype or ("int8" if weights.y_dtype else "float16")
    ours = time_us(weights, m, x_dtype=x_dtype)
    i8 = dense.time_us(weights.n, weights.k, m, "int8")
    fp16 = dense.time_us(weights.n, weights.k, m, "float16") if i8 is None else None
    best, kind = (i8, "cuBLAS int8") if i8 is not None else (fp16, "cuBLAS fp16")
    return {"plugin": "vitbit", "vitbit_us": round(ours, 3), "dense_us": round(best, 3), "dense": kind,
            "fp16_us": None if fp16 is None else round(fp16, 3), "int8_us": None if i8 is None else round(i8, 3),
            "x_dtype": x_dtype, "m": int(m), "gpu": facts["name"], "sm_count": facts["sm_count"]}
