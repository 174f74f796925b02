#!/usr/bin/env python3
"""Ceiling of the Ampere instructions on this GPU (tools/vitbit_gemm_ceiling.cu), full device and 16-SM green context.

Measures, with CUDA events around single launches of a few ms (median of 5) and clock64/globaltimer
inside the kernel (SM clock):
  * mma.sync.m16n8k32.s8 from registers (8 independent accumulators per warp), 4..32 warps per SM;
  * the same with the GEMM's ldmatrix.x4 traffic (warp tiles 64x32 and 64x64) from a swizzled smem tile;
  * co-running: 8 mma.sync warps per SM alone vs with 2/4/8 warps issuing dp4a or FFMA in the same block
    (tensor-core rate from the mma warps' own clock64 spans), and the CUDA-core rate alone vs co-running.
Writes JSON (``--json``). TOPS = 2 x MACs / time; one mma.sync.m16n8k32 = 4096 MACs, one warp dp4a = 128,
one warp FFMA = 32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from edgesdk.kernels import _cuda  # noqa: E402

SRC = ROOT / "tools" / "vitbit_gemm_ceiling.cu"
MMA_MACS = 16 * 8 * 32


def _i(v):
    import ctypes
    return ctypes.c_int(int(v))


def _p(t):
    import ctypes
    return ctypes.c_void_p(t.data_ptr())


class Ctx:
    def __init__(self, ctx, sms):
        from cuda.bindings import driver as cu
        self.cu, self.ctx, self.sms = cu, ctx, sms
        _cuda.check(cu.cuCtxSetCurrent(ctx))
        self.stream = _cuda.check(cu.cuStreamCreate(1))
        self.ev = [_cuda.check(cu.cuEventCreate(0)) for _ in range(2)]

    def time(self, name, grid, block, args, smem=0, reps=5):
        cu = self.cu
        _cuda.check(cu.cuCtxSetCurrent(self.ctx))
        k = _cuda.get_kernel(SRC, name)
        k.launch(grid, block, args, int(self.stream), smem)  # warm-up (and module load)
        ts = []
        for _ in range(reps):
            _cuda.check(cu.cuEventRecord(self.ev[0], self.stream))
            k.launch(grid, block, args, int(self.stream), smem)
            _cuda.check(cu.cuEventRecord(self.ev[1], self.stream))
            _cuda.check(cu.cuEventSynchronize(self.ev[1]))
            ts.append(_cuda.check(cu.cuEventElapsedTime(self.ev[0], self.ev[1])) * 1e-3)
        return statistics.median(ts)


def run_config(c: Ctx) -> dict:
    sms = c.sms
    res: dict = {"sms": sms}
    maxb = 64 * 1024
    out = torch.empty(maxb, dtype=torch.int32, device="cuda")
    spans = torch.zeros(2 * 4096, dtype=torch.int64, device="cuda")
    wsp = torch.zeros(2 * 32 * 4096, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    # SM clock: clock64 / globaltimer spans of a single-wave run (the 8-warp, 1-block-per-SM row), then used
    # for every MAC/SM/clk figure (per-row estimates are noisy where blocks start at different times).
    # 1. mma.sync from registers: warps per SM sweep.
    iters = 4096
    best = None
    sweep = []
    for warps, bps in [(8, 1), (4, 1), (8, 2), (16, 1), (8, 4), (32, 1)]:
        grid = sms * bps
        t = c.time("ceil_mma_reg", (grid,), (32 * warps,), [_i(iters), _p(out), _p(spans)])
        torch.cuda.synchronize()
        sp = spans[: 2 * grid].view(grid, 2).cpu().numpy().astype(np.float64)
        if warps == 8 and bps == 1:
            res["sm_clock_mhz"] = float(np.median(sp[:, 0] / sp[:, 1] * 1e3))
        mhz = res.get("sm_clock_mhz", float(np.median(sp[:, 0] / sp[:, 1] * 1e3)))
        macs = grid * warps * iters * 8 * MMA_MACS
        row = {"warps_per_sm": warps * bps, "block_warps": warps, "time_s": t, "TOPS": 2 * macs / t / 1e12,
               "sm_clock_mhz": mhz, "mac_per_sm_per_clk": macs / sms / (t * mhz * 1e6)}
        sweep.append(row)
        if best is None or row["TOPS"] > best["TOPS"]:
            best = row
    res["mma_reg"] = {"sweep": sweep, "best": best}
    # 2. mma.sync + ldmatrix from swizzled smem.
    for name, ni, cfgs in [("ceil_mma_ldm_w64x32", 4, [(8, 1), (8, 2)]), ("ceil_mma_ldm_w64x64", 8, [(8, 1), (4, 2)])]:
        rows = []
        for warps, bps in cfgs:
            grid = sms * bps
            it = 2048
            t = c.time(name, (grid,), (32 * warps,), [_i(it), _p(out), _p(spans)])
            torch.cuda.synchronize()
            mhz = res["sm_clock_mhz"]
            macs = grid * warps * it * 4 * ni * MMA_MACS
            rows.append({"warps_per_sm": warps * bps, "time_s": t, "TOPS": 2 * macs / t / 1e12, "sm_clock_mhz": mhz,
                         "mac_per_sm_per_clk": macs / sms / (t * mhz * 1e6),
                         "ldmatrix_x4_per_mma": (4 + ni // 2) / (4 * ni)})
        res[name[5:]] = {"rows": rows, "best": max(rows, key=lambda r: r["TOPS"])}
    # 3. co-running: 8 mma warps per SM (1 block per SM) + x warps of dp4a / FFMA.
    tc_iters = 4096
    co = []

    def corun(tc_warps, x_warps, x_iters, mode):
        nw = tc_warps + x_warps
        t = c.time("ceil_corun", (sms,), (32 * nw,), [_i(tc_iters), _i(tc_warps), _i(x_iters), _i(mode), _p(out),
                                                        _p(wsp)], reps=3)
        torch.cuda.synchronize()
        w = wsp[: 2 * 32 * sms].view(sms, 32, 2).cpu().numpy().astype(np.float64)
        tc_span = np.median(w[:, :tc_warps, 1].max(1) - w[:, :tc_warps, 0].min(1)) if tc_warps else 0.0
        x_span = np.median(w[:, tc_warps:nw, 1].max(1) - w[:, tc_warps:nw, 0].min(1)) if x_warps else 0.0
        return t, tc_span, x_span

    t, tc_alone, _ = corun(8, 0, 0, 1)
    tc_rate = 8 * tc_iters * 8 * MMA_MACS / tc_alone
    for mode, label, per in [(1, "dp4a", 128), (2, "ffma", 32)]:
        for xw in (2, 4, 8):
            # calibrate x_iters so the CUDA-core warps alone run ~1.5x the tensor-core span
            _, _, xs = corun(0, xw, 20000, mode)
            x_iters = int(20000 * 1.5 * tc_alone / xs)
            _, _, x_alone = corun(0, xw, x_iters, mode)
            _, tc_co, x_co = corun(8, xw, x_iters, mode)
            x_macs = xw * x_iters * 8 * per
            co.append({"x_kind": label, "x_warps": xw, "tc_warps": 8,
                       "tc_mac_per_sm_clk_alone": tc_rate,
                       "tc_mac_per_sm_clk_corun": 8 * tc_iters * 8 * MMA_MACS / tc_co,
                       "tc_slowdown": tc_co / tc_alone,
                       "x_mac_per_sm_clk_alone": x_macs / x_alone, "x_mac_per_sm_clk_corun": x_macs / x_co,
                       "x_slowdown": x_co / x_alone})
    res["corun"] = co
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    from cuda.bindings import driver as cu

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    _cuda.init()
    prim = _cuda.check(cu.cuCtxGetCurrent())
    import datetime
    import os

    from bench._common import git_commit

    res = {"device": torch.cuda.get_device_name(0),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "commit": os.environ.get("EDGESDK_COMMIT") or git_commit()}
    res["full"] = run_config(Ctx(prim, torch.cuda.get_device_properties(0).multi_processor_count))
    try:
        g, sms = _cuda.green_context(16)
        res[f"green{sms}"] = run_config(Ctx(g, sms))
    except Exception as e:  # reported, not hidden
        res["green_error"] = repr(e)
    _cuda.check(cu.cuCtxSetCurrent(prim))
    for k in ("full", "green16"):
        r = res.get(k)
        if not r:
            continue
        print(f"[{k}] mma.sync reg-only best {r['mma_reg']['best']['TOPS']:.0f} TOPS "
              f"({r['mma_reg']['best']['mac_per_sm_per_clk']:.0f} MAC/SM/clk at {r['mma_reg']['best']['sm_clock_mhz']:.0f} MHz, "
              f"{r['mma_reg']['best']['warps_per_sm']} warps/SM); +ldmatrix 64x32 {r['mma_ldm_w64x32']['best']['TOPS']:.0f}, "
              f"64x64 {r['mma_ldm_w64x64']['best']['TOPS']:.0f} TOPS")
        for s in r["mma_reg"]["sweep"]:
            print(f"   reg-only {s['warps_per_sm']:2d} warps/SM: {s['TOPS']:.0f} TOPS, {s['mac_per_sm_per_clk']:.0f} MAC/SM/clk")
        for x in r["corun"]:
            print(f"   corun 8 mma warps + {x['x_warps']} {x['x_kind']} warps: TC {x['tc_mac_per_sm_clk_alone']:.0f} -> "
                  f"{x['tc_mac_per_sm_clk_corun']:.0f} MAC/SM/clk (x{x['tc_slowdown']:.2f} time); {x['x_kind']} "
                  f"{x['x_mac_per_sm_clk_alone']:.0f} -> {x['x_mac_per_sm_clk_corun']:.0f} MAC/SM/clk")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
