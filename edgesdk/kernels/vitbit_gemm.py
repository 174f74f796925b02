"""Launcher for ``EdgeVitBitGemm`` (``plugins/vitbit_gemm/vitbit_gemm.cu``): the plugin launch API.

A launch is two or three kernels on the caller's stream, with no allocation and no host sync:

1. ``vitbit_quantize_*``: X -> int8 ``Xq [M, K16]`` in the workspace (one fp32 division per element);
2. ``vitbit_gemm_<config>``: the fused GEMM, whose block tile is split by columns between tensor-core,
   INT-core and FP-core warps (the tactic's :class:`~edgesdk.formats.vitbit_gemm.CoreSplit`); with
   split-K it writes int32 partials to the workspace instead of Y;
3. ``vitbit_splitk_epilogue`` (split-K only): exact int32 sum of the partials, then the epilogue.

Tactics (``valid_tactics``): 1 = tensor cores only, 128x128 tiles (default); 2, 3, 8 other tile sizes;
4-7 split-K for small M; 10-19 hybrids (TC : INT : FP column ratios from 128:8:0 to 96:0:32); 22-23
hybrids with split-K; 20-21 hybrids whose INT share uses packed 16-bit fields (4- and 5-bit weights
only). Every tactic gives bit-identical results.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from edgesdk.errors import EdgeSDKError
from edgesdk.formats.vitbit_gemm import CoreSplit, k_padded, validate_attributes

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

    @property
    def bn(self) -> int:
        return self.split.width

    @property
    def threads(self) -> int:
        tc_warps = (self.bm // self.wm) * (self.split.tc // self.wn)
        return 32 * tc_warps + self.bm * (self.split.int_ + self.split.fp) // (self.tm * 8)

    @property
    def smem(self) -> int:
        return self.stages * (self.bm + self.bn) * BK


_C = {c.name: c for c in [
    Config("tc_128x128", 128, CoreSplit(128), 64, 32, 3),
    Config("tc_64x128", 64, CoreSplit(128), 32, 32, 4),
    Config("tc_64x64", 64, CoreSplit(64), 32, 32, 4),
    Config("tc_128x256", 128, CoreSplit(256), 64, 64, 3),
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
    1: ("tc_128x128", 1),
    2: ("tc_64x128", 1),
    3: ("tc_64x64", 1),
    4: ("tc_64x64", 2),
    5: ("tc_64x64", 4),
    6: ("tc_64x128", 2),
    7: ("tc_128x128", 2),
    8: ("tc_128x256", 1),
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
TC_ONLY = 1
MAX_SPLITS = max(s for _, s in TACTICS.values())


def config(tactic: int, bits: int = 8) -> tuple[Config, int]:
    """The kernel config and K splits of ``tactic`` (for weights of ``bits`` bits)."""
    if tactic not in TACTICS:
        raise EdgeSDKError(f"EdgeVitBitGemm: unknown tactic {tactic!r}", f"use one of {sorted(TACTICS)}")
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
    """Tactics usable for this layer (all exact); 1 = tensor cores only, the default."""
    a = validate_attributes(attrs)
    kt = -(-k_padded(a["k"]) // BK)
    out = []
    for t, (name, splits) in TACTICS.items():
        if name.startswith("field:") and a["bits"] not in (4, 5):
            continue
        if splits > 1 and (kt < splits or not _splitk_ok(m, a["n"])):
            continue
        out.append(t)
    return out


def _xq_bytes(m: int, k: int) -> int:
    return -(-(m * k_padded(k)) // 256) * 256


def workspace_bytes(attrs: dict, m: int) -> int:
    """Workspace for ``m`` rows, enough for every tactic: int8 Xq, plus split-K int32 partials."""
    a = validate_attributes(attrs)
    m = int(m)
    part = 4 * MAX_SPLITS * m * a["n"] if _splitk_ok(m, a["n"]) else 0
    return _xq_bytes(m, a["k"]) + part


def _kernel(name: str):
    from edgesdk.kernels._cuda import get_kernel

    return get_kernel(SOURCE, name)


def launch(attrs: dict, x_dtype: str, m: int, inputs: list[int], outputs: list[int], stream: int,
           tactic: int = 1, *, workspace: int = 0) -> None:
    """Run the layer on ``stream``: ``inputs`` = [X, weight, w_scale, (bias)], ``outputs`` = [Y] (device
    pointers); ``workspace`` = a device buffer of at least ``workspace_bytes(attrs, m)`` bytes.

    Split-K tactics fall back to one split (same tile) where ``m * n`` is too large for split-K.
    """
    a = validate_attributes(attrs)
    n, k = a["n"], a["k"]
    m = int(m)
    if x_dtype not in ("float16", "float32"):
        raise EdgeSDKError(f"EdgeVitBitGemm: X must be float16 or float32, got {x_dtype}", "cast X")
    if len(inputs) != 3 + a["has_bias"] or len(outputs) != 1:
        raise EdgeSDKError(f"EdgeVitBitGemm: expected {3 + a['has_bias']} inputs and 1 output, got "
                           f"{len(inputs)} and {len(outputs)}", "pass [X, weight, w_scale, (bias)] and [Y]")
    if m <= 0:
        return
    if not workspace:
        raise EdgeSDKError("EdgeVitBitGemm: launch needs a workspace (quantized X, split-K partials)",
                           "allocate workspace_bytes(attrs, m) bytes and pass workspace=<pointer>")
    x, w, ws = (int(p) for p in inputs[:3])
    bias = int(inputs[3]) if a["has_bias"] else 0
    quantize(a, x_dtype, m, x, int(workspace), stream)
    gemm(a, x_dtype, m, int(workspace), w, ws, bias, int(outputs[0]), stream, tactic,
         part=int(workspace) + _xq_bytes(m, k))


def quantize(a: dict, x_dtype: str, m: int, x: int, xq: int, stream: int) -> None:
    """Step 1 of :func:`launch`: X -> int8 Xq [m, K16] (``a``: validated attributes)."""
    kp = k_padded(a["k"])
    qk = _kernel("vitbit_quantize_f16" if x_dtype == "float16" else "vitbit_quantize_f32")
    groups = m * kp // 4
    qk.launch((min(-(-groups // 256), 4096),), (256,),
              [ctypes.c_void_p(x), ctypes.c_void_p(xq), ctypes.c_float(a["x_scale"]), ctypes.c_int(m),
               ctypes.c_int(a["k"]), ctypes.c_int(kp)], stream)


def gemm(a: dict, x_dtype: str, m: int, xq: int, w: int, ws: int, bias: int, y: int, stream: int,
         tactic: int = 1, part: int = 0) -> None:
    """Steps 2-3 of :func:`launch` on an already quantized Xq; ``part``: split-K partials buffer."""
    n, k = a["n"], a["k"]
    cfg, splits = config(tactic, a["bits"])
    if splits > 1 and not _splitk_ok(m, n):
        splits = 1
    kp = k_padded(k)
    kt = -(-kp // BK)
    splits = min(splits, kt)
    if splits == 1:
        part = 0
    elif not part:
        raise EdgeSDKError("EdgeVitBitGemm: split-K tactic without a partials buffer",
                           "pass the workspace (workspace_bytes) to launch")
    flags = (_FLAG_HALF if x_dtype == "float16" else 0) | (_FLAG_BIAS if a["has_bias"] else 0) | \
        (_FLAG_GELU if a["gelu"] else 0)
    xs = ctypes.c_float(a["x_scale"])
    gk = _kernel(f"vitbit_gemm_{cfg.name}")
    kps = -(-kt // splits)
    gk.launch((-(-n // cfg.bn), -(-m // cfg.bm), splits), (cfg.threads,),
              [ctypes.c_void_p(xq), ctypes.c_void_p(w), ctypes.c_void_p(y), ctypes.c_void_p(part),
               ctypes.c_void_p(ws), ctypes.c_void_p(bias), xs, ctypes.c_int(flags), ctypes.c_int(m),
               ctypes.c_int(n), ctypes.c_int(kp), ctypes.c_int(kps)], stream, cfg.smem)
    if splits > 1:
        ek = _kernel("vitbit_splitk_epilogue")
        ek.launch((min(-(-(m * n) // 256), 4096),), (256,),
                  [ctypes.c_void_p(part), ctypes.c_int(splits), ctypes.c_void_p(y), ctypes.c_void_p(ws),
                   ctypes.c_void_p(bias), xs, ctypes.c_int(flags), ctypes.c_int(m), ctypes.c_int(n)], stream)
