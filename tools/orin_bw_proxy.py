#!/usr/bin/env python3
"""How far the 16-SM "Orin proxy" is from an Orin's memory, and two ways to narrow the gap.

The issues' Orin proxy is a 16-SM green context: Orin's SM count with the H100/H200's memory behind it. An
Orin gives its 16 SMs 204.8 GB/s at 1.3 GHz, 9.85 bytes per SM-clock at peak (NVIDIA's Jetson AGX Orin
64GB data sheet); on the proxy a dense fp16 GEMV streams about 2.5x that per SM-clock (level ``none``
below measures it). For kernels that trade bytes for decode instructions (EdgeBitmapLinear, the sparse KV
attention) that ratio decides the comparison, so the plain proxy is harsher on them than an Orin is.

1. Measured, a contended proxy: one green context of 16 SMs runs the benchmarks while a second one with the
   remaining SMs loads the memory system during every timing call (``tools/orin_bw_proxy.cu``): ``loadW``
   = ``bw_hog``, streaming reads with W warps per SM; ``paceP`` = ``bw_pace``, one 128-byte L2 prefetch
   per lane of 8 warps per SM every P SM-clocks (a fixed requested rate). Each level records the dense
   baseline's bytes per SM-clock (GB/s over 16 SMs and the SM clock: ``clock64`` spins over CUDA-event
   time), so the levels nearest Orin's rate can be read off; nothing is interpolated. What it is not: an
   Orin. A memory system shared with a co-runner gives each kernel a share that grows with its own bytes in
   flight, so it models an Orin whose CPU, DLA or cameras load the same LPDDR5, not one whose GPU runs alone.
2. A model, not a measurement (``quiet_orin_model``): the GPU alone on an Orin, from the level-``none``
   rows (decode capacity per SM-clock) and Orin's peak rate; see the function.

Timing method (unchanged from the benchmarks): ``bench/bench_bitmap_linear.py``'s CUDA-graph timer over
weight copies rotated beyond 2 x L2 (our kernel, tactic 1, and cuBLAS fp16 through torch) and
``bench/bench_sparse_kv.py``'s timers (``--kv``); the load is started before and stopped after each timing
call, so nothing else (allocation, packing, device-wide syncs) runs beside it.

Usage: python tools/orin_bw_proxy.py [--levels none,pace2667,load16] [--ms 1,4,16] [--kv] [--quick]
       python tools/orin_bw_proxy.py --hog-check        (the load alone: its GB/s)
       python tools/orin_bw_proxy.py --from-json PATH    (no GPU: summary and model of an earlier run)
Writes bench/results/orin_bw_proxy_<commit>.json.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SRC = ROOT / "tools" / "orin_bw_proxy.cu"
ORIN = {"device": "Jetson AGX Orin 64GB", "dram_GBps": 204.8, "gpu_max_mhz": 1300, "sms": 16,
        "source": "NVIDIA Jetson AGX Orin series data sheet (LPDDR5 204.8 GB/s; GPU 1.3 GHz max; 2048 CUDA cores "
                  "= 16 SMs)"}
KV_SHAPES = [("llama3.2-1b", 1, 4096), ("llama3.2-1b", 1, 32768), ("llama3.2-1b", 4, 16384), ("llama3.2-1b", 16, 4096),
             ("llama3.2-1b", 16, 32768), ("smollm2-135m", 1, 4096), ("smollm2-135m", 4, 16384),
             ("smollm2-135m", 16, 32768)]  # (model, batch, context) of issue 7's table, 70 % and 50 %
ORIN_B_PER_SM_CLK = ORIN["dram_GBps"] * 1e9 / (ORIN["sms"] * ORIN["gpu_max_mhz"] * 1e6)


class Hog:
    """The load on the other SMs. ``start(level)``: ``"none"``; ``"loadW"``: ``bw_hog`` with W warps per SM
    (a latency-bound streaming read); ``"paceP"``: ``bw_pace``, 8 warps per SM, one 128-byte L2 prefetch per
    lane every P SM clocks (a fixed requested rate). ``stop()`` ends it and returns what it counted. The stop
    flag is written by a DMA copy (a memset kernel could not start while the hog holds its SMs)."""

    def __init__(self, ctx, sms: int, buf_bytes: int = 1 << 30, random: bool = True):
        import torch

        from edgesdk.kernels import _cuda

        self.cu, self.ck, self.ctx, self.sms = _cuda._driver(), _cuda.check, ctx, sms
        n = buf_bytes // 8
        self.buf = (torch.randint(-2**62, 2**62, (n,), dtype=torch.int64, device="cuda") if random
                    else torch.arange(n, dtype=torch.int64, device="cuda"))
        self.flag = torch.zeros(4, dtype=torch.int32, device="cuda")
        self.count = torch.zeros(2, dtype=torch.int64, device="cuda")
        self.sink = torch.zeros(4, dtype=torch.int32, device="cuda")
        self.one = torch.ones(4, dtype=torch.int32).pin_memory()
        self.zero = torch.zeros(4, dtype=torch.int32).pin_memory()
        self.host_count = torch.zeros(2, dtype=torch.int64).pin_memory()
        torch.cuda.synchronize()
        prev = self.ck(self.cu.cuCtxGetCurrent())
        self.ck(self.cu.cuCtxSetCurrent(ctx))
        try:
            self.k_load = _cuda.get_kernel(SRC, "bw_hog")
            self.k_pace = _cuda.get_kernel(SRC, "bw_pace")
            self.stream = self.ck(self.cu.cuStreamCreate(1))
            self.ctl = self.ck(self.cu.cuStreamCreate(1))
        finally:
            self.ck(self.cu.cuCtxSetCurrent(prev))
        self.running = ""
        self.t_start = 0.0

    def start(self, level: str) -> None:
        if level == "none":
            self.running = ""
            return
        cu, ck = self.cu, self.ck
        prev = ck(cu.cuCtxGetCurrent())
        ck(cu.cuCtxSetCurrent(self.ctx))
        try:
            ck(cu.cuMemcpyHtoDAsync(self.flag.data_ptr(), self.zero.data_ptr(), 16, self.stream))
            ck(cu.cuMemsetD8Async(self.count.data_ptr(), 0, 16, self.stream))
            nbytes = self.buf.numel() * 8
            common = [ctypes.c_void_p(self.flag.data_ptr()), ctypes.c_void_p(self.count.data_ptr()),
                      ctypes.c_ulonglong(60 * 10**9)]
            if level.startswith("load"):
                w = int(level[4:])
                fits = ck(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.k_load.function, 128, 0)) * 4
                if w > fits:  # blocks beyond one wave would only start after the stop flag
                    raise ValueError(f"level {level}: bw_hog fits {fits} warps per SM; use load<= {fits}")
                self.k_load.launch((self.sms * w // 4,), (128,), [ctypes.c_void_p(self.buf.data_ptr()),
                                   ctypes.c_ulonglong(nbytes // 16 - 1), *common, ctypes.c_void_p(self.sink.data_ptr())],
                                   self.stream)
            elif level.startswith("pace"):
                self.k_pace.launch((self.sms * 2,), (128,), [ctypes.c_void_p(self.buf.data_ptr()),
                                   ctypes.c_ulonglong(nbytes // 128 - 1), *common, ctypes.c_longlong(int(level[4:]))],
                                   self.stream)
            else:
                raise ValueError(f"unknown level {level!r}: use none, load<warps per SM> or pace<SM clocks>")
        finally:
            ck(cu.cuCtxSetCurrent(prev))
        self.running = level
        self.t_start = time.perf_counter()

    def stop(self) -> dict:
        if not self.running:
            return {"hog_GBps_gt": 0.0, "hog_s_gt": 0.0, "hog_s_host": 0.0, "hog_GBps_host": 0.0}
        cu, ck = self.cu, self.ck
        prev = ck(cu.cuCtxGetCurrent())
        ck(cu.cuCtxSetCurrent(self.ctx))
        try:
            ck(cu.cuMemcpyHtoDAsync(self.flag.data_ptr(), self.one.data_ptr(), 16, self.ctl))
            ck(cu.cuStreamSynchronize(self.stream))
            host_s = time.perf_counter() - self.t_start
            ck(cu.cuMemcpyDtoHAsync(self.host_count.data_ptr(), self.count.data_ptr(), 16, self.stream))
            ck(cu.cuStreamSynchronize(self.stream))
        finally:
            ck(cu.cuCtxSetCurrent(prev))
        nbytes, ns = (int(v) for v in self.host_count.tolist())
        self.running = ""
        # hog_GBps_gt: bytes read (load) or prefetches issued (pace) over the globaltimer span of block 0;
        # hog_s_host: host time from launch to the end of the hog (>= its device span).
        return {"hog_GBps_gt": nbytes / max(ns, 1), "hog_s_gt": ns * 1e-9, "hog_s_host": host_s,
                "hog_GBps_host": nbytes / max(host_s, 1e-9) / 1e9}


class Clock:
    """SM clock (MHz) of the measured context: ``sm_clock`` spins a fixed number of SM clocks on each SM;
    the clock is those clocks over the CUDA-event time of the launch (``mhz``), and over the kernel's own
    ``%globaltimer`` span (``mhz_gt``, a check of that timer)."""

    def __init__(self, ctx, sms: int):
        import torch

        from edgesdk.kernels import _cuda

        self.cu, self.ck, self.ctx, self.sms = _cuda._driver(), _cuda.check, ctx, sms
        self.out = torch.zeros(2 * sms, dtype=torch.int64, device="cuda")
        self.host = torch.zeros(2 * sms, dtype=torch.int64).pin_memory()
        prev = self.ck(self.cu.cuCtxGetCurrent())
        self.ck(self.cu.cuCtxSetCurrent(ctx))
        try:
            self.kernel = _cuda.get_kernel(SRC, "sm_clock")
            self.stream = self.ck(self.cu.cuStreamCreate(1))
            self.ev = [self.ck(self.cu.cuEventCreate(0)) for _ in range(2)]
        finally:
            self.ck(self.cu.cuCtxSetCurrent(prev))

    def mhz(self, cycles: int = 10_000_000) -> tuple[float, float]:
        cu, ck = self.cu, self.ck
        prev = ck(cu.cuCtxGetCurrent())
        ck(cu.cuCtxSetCurrent(self.ctx))
        try:
            ck(cu.cuEventRecord(self.ev[0], self.stream))
            self.kernel.launch((self.sms,), (32,), [ctypes.c_ulonglong(cycles), ctypes.c_void_p(self.out.data_ptr())],
                               self.stream)
            ck(cu.cuEventRecord(self.ev[1], self.stream))
            ck(cu.cuMemcpyDtoHAsync(self.host.data_ptr(), self.out.data_ptr(), 16 * self.sms, self.stream))
            ck(cu.cuStreamSynchronize(self.stream))
            ms = ck(cu.cuEventElapsedTime(self.ev[0], self.ev[1]))
        finally:
            ck(cu.cuCtxSetCurrent(prev))
        v = self.host.tolist()
        spans = [v[2 * i] for i in range(self.sms)]
        gt = statistics.median(v[2 * i] / v[2 * i + 1] * 1e3 for i in range(self.sms) if v[2 * i + 1] > 0)
        return max(spans) / (ms * 1e3), gt


class Loaded:
    """Wraps a timing callable: hog on, ramp, SM clock, the timing, SM clock, hog off; keeps the samples."""

    def __init__(self, hog: Hog, clock: Clock):
        self.hog, self.clock, self.level = hog, clock, "none"
        self.samples: list[dict] = []

    def wrap(self, fn):
        def run(*a, **kw):
            self.hog.start(self.level)
            time.sleep(0.02)
            m0, g0 = self.clock.mhz()
            try:
                return fn(*a, **kw)
            finally:
                m1, g1 = self.clock.mhz()
                h = self.hog.stop()
                self.samples.append({"level": self.level, "mhz": (m0 + m1) / 2, "mhz_gt": (g0 + g1) / 2, **h})
        return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="none,pace4000,pace2667,pace2000,pace1333,pace1000,load16,load32,load48",
                    help="load on the other SMs per level: none, load<warps per SM> (streaming reads), "
                         "pace<SM clocks between a warp's 4 KB of prefetches> (fixed requested rate)")
    ap.add_argument("--ms", default="1,4,16", help="rows of X (EdgeBitmapLinear)")
    ap.add_argument("--quick", action="store_true", help="three layers only")
    ap.add_argument("--kv", action="store_true", help="also the sparse KV attention vs SDPA (a few shapes)")
    ap.add_argument("--no-bitmap", action="store_true")
    ap.add_argument("--tactics", default="1", help="EdgeBitmapLinear tactics timed per case (comma-separated; "
                    "'decode': every decode-path tactic); rows 'default' (tactic 1) and 'best' (fastest)")
    ap.add_argument("--label-tactics", default="", help="timed tactics that also get rows of their own (bitmap_<vd>_t<id>)")
    ap.add_argument("--shapes", default="", help="EdgeBitmapLinear layers KxN,... (default: the benchmark's nine)")
    ap.add_argument("--hog-check", action="store_true",
                    help="only time the load levels alone (0.5 s each) with 1 GiB (arange / random) and 4 GiB buffers")
    ap.add_argument("--out", type=Path, help="JSON path (default bench/results/orin_bw_proxy_<commit>.json)")
    ap.add_argument("--from-json", type=Path, help="no GPU: recompute the summary and the model of an earlier run's "
                    "JSON (rewritten in place)")
    args = ap.parse_args(argv)
    if args.from_json:
        import json

        from bench._common import print_table, write_json

        doc = json.loads(args.from_json.read_text())
        doc["meta"]["summary"] = summarize(doc["rows"], doc["meta"]["levels"])
        doc["meta"]["model_quiet_orin"] = quiet_orin_model(doc["rows"], doc["meta"]["measured_sms"])
        print_table(doc["meta"]["summary"], list(doc["meta"]["summary"][0]))
        _print_model(doc["meta"]["model_quiet_orin"])
        write_json(args.from_json, doc["rows"], doc["meta"])
        return 0
    import torch

    import bench.bench_bitmap_linear as bbl
    import bench.bench_sparse_kv as bkv
    from bench._common import git_commit, meta, print_table, write_json
    from edgesdk.kernels import _cuda

    levels = args.levels.split(",")
    ms = [int(v) for v in args.ms.split(",")]
    shapes = [bbl.SHAPES[0], bbl.SHAPES[1], bbl.SHAPES[2]] if args.quick else bbl.SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")]
    if args.tactics == "decode":
        from edgesdk.kernels import bitmap_linear as kbl

        tactics = [1, *kbl.DEC_TACTICS, kbl.R80_HEURISTIC, *kbl.R80_TACTICS, kbl.XS_HEURISTIC, *kbl.XS_TACTICS,
                   kbl.XS80_HEURISTIC, *kbl.XS80_TACTICS]
    else:
        tactics = [int(t) for t in args.tactics.split(",")]
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    _cuda.init()
    cu = _cuda._driver()
    prim = _cuda.check(cu.cuCtxGetCurrent())
    (actx, asms), (hctx, hsms) = _cuda.green_context(16, rest=True)
    if args.hog_check:
        for gib, rnd in ((1, False), (1, True), (4, True)):
            h = Hog(hctx, hsms, gib << 30, rnd)
            for lv in ("load16", "load48", "pace2667", "pace1333"):
                h.start(lv)
                time.sleep(0.5)
                r = h.stop()
                print(f"hog {lv} alone, {gib} GiB {'random' if rnd else 'arange'}: {r['hog_GBps_host']:.0f} GB/s "
                      f"(bytes read, or prefetches issued, over host time {r['hog_s_host']:.2f} s)", flush=True)
            del h
            torch.cuda.empty_cache()
        return 0
    hog, clock = Hog(hctx, hsms), Clock(actx, asms)
    loaded = Loaded(hog, clock)
    bbl.GraphTimer.__call__ = loaded.wrap(bbl.GraphTimer.__call__)
    bkv.Timer.ours = loaded.wrap(bkv.Timer.ours)
    bkv.Timer.torch_op = loaded.wrap(bkv.Timer.torch_op)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    info = meta({"tactics": tactics, "measured_sms": asms, "hog_sms": hsms, "levels": levels, "orin": ORIN,
                 "orin_bytes_per_sm_clock": ORIN_B_PER_SM_CLK,
                 "method": "16-SM green context; during each timing call the other SMs load the memory system "
                           "(level: none, loadW = bw_hog streaming reads with W warps per SM, paceP = bw_pace L2 "
                           "prefetches, 8 warps per SM, 4 KB per warp every P SM clocks); timings as "
                           "bench/bench_bitmap_linear.py (tactic 1 vs cuBLAS fp16) and bench/bench_sparse_kv.py; "
                           "B/SM-clk = GB/s / (SMs x SM MHz by CUDA events around a clock64 spin)"})
    packed = None if args.no_bitmap else bbl._pack_all(shapes)
    astream = None
    if packed is not None:
        _cuda.check(cu.cuCtxSetCurrent(actx))
        astream = _cuda.check(cu.cuStreamCreate(1))
        _cuda.check(cu.cuCtxSetCurrent(prim))
    rows: list[dict] = []
    t0 = time.time()
    for level in levels:
        loaded.level = level
        first = len(loaded.samples)
        lrows: list[dict] = []
        if packed is not None:
            lrows += bbl.bench(shapes, ms, packed, l2, tactics, green=(actx, prim, astream), check_outputs=False,
                               label_tactics=[int(t) for t in args.label_tactics.split(",") if t])
        if args.kv:
            kt = bkv.Timer.__new__(bkv.Timer)
            kt.cu, kt.green, kt.prim, kt.ctx, kt.sms = cu, True, prim, actx, asms
            _cuda.check(cu.cuCtxSetCurrent(actx))
            kt.stream = int(_cuda.check(cu.cuStreamCreate(1)))
            _cuda.check(cu.cuCtxSetCurrent(prim))
            kt.torch_stream = torch.cuda.ExternalStream(kt.stream)
            kvrows: list[dict] = []
            for model, B, ctxlen in KV_SHAPES:
                hq, hkv, d = bkv.MODELS[model]
                bkv.bench_shape([kt], model, hq, hkv, d, B, ctxlen, kvrows, False)
                torch.cuda.empty_cache()
            lrows += [dict(r, kernel="sparse_kv") for r in kvrows]
        samp = loaded.samples[first:]
        mhz = statistics.median(s["mhz"] for s in samp)
        agg = {k: statistics.median(s[k] for s in samp) for k in samp[0] if k not in ("level",)}
        for r in lrows:
            r.update(level=level, sm_mhz=mhz, **{k: v for k, v in agg.items() if k != "mhz"})
            if r.get("kernel") == "cublas_fp16":
                r["B_per_sm_clk"] = r["GBps"] * 1e9 / (asms * mhz * 1e6)
            if r.get("kernel") == "sparse_kv" and r.get("variant") == "sdpa":
                dense = 2 * r["batch"] * bkv.MODELS[r["model"]][1] * r["context"] * 64 * 2
                r["GBps_green16"] = dense / r["green16"] / 1e3
                r["B_per_sm_clk"] = r["GBps_green16"] * 1e9 / (asms * mhz * 1e6)
        rows += lrows
        print(f"level {level} on {hsms} SMs: SM clock {mhz:.0f} MHz (globaltimer: {agg['mhz_gt']:.0f}), hog "
              f"{agg['hog_GBps_gt']:.0f} GB/s by globaltimer, {agg['hog_GBps_host']:.0f} by host time, "
              f"{time.time() - t0:.0f} s", flush=True)
    summary = summarize(rows, levels)
    print_table(summary, list(summary[0]) if summary else [])
    info["summary"] = summary
    info["model_quiet_orin"] = quiet_orin_model(rows, asms)
    _print_model(info["model_quiet_orin"])
    info["samples"] = loaded.samples
    out = args.out or ROOT / "bench" / "results" / f"orin_bw_proxy_{git_commit()}.json"
    write_json(out, rows, info)
    print(f"wrote {out}")
    return 0


def summarize(rows: list[dict], levels: list[int]) -> list[dict]:
    """Per level: the dense rate (bytes per SM-clock, median over the layers with K·N ≥ 4M), and the median
    speed-up of our kernel vs cuBLAS fp16 over those layers per (values, sparsity); KV: sparse 70 % vs SDPA."""
    out = []
    for lv in levels:
        sel = [r for r in rows if r["level"] == lv and "K" in r and r["K"] * r["N"] >= 4 * 1024 * 1024]
        dense = [r["B_per_sm_clk"] for r in sel if r["kernel"] == "cublas_fp16"]
        row = {"level": lv, "dense_B_per_sm_clk": statistics.median(dense) if dense else None}
        for r in rows:
            if r["level"] == lv:
                row.setdefault("sm_mhz", r["sm_mhz"])
                row.setdefault("hog_GBps_gt", r["hog_GBps_gt"])
        for vd in ("float16", "int8"):
            for s in (0.3, 0.5, 0.7):
                v = [r["speedup"] for r in sel if r["kernel"] == f"bitmap_{vd}_default" and r["sparsity"] == s]
                if v:
                    row[f"{vd[:4]}_{int(s * 100)}"] = statistics.median(v)
        kv = [r for r in rows if r["level"] == lv and r.get("kernel") == "sparse_kv"]
        sd = [r["B_per_sm_clk"] for r in kv if r["variant"] == "sdpa"]
        if sd:
            row["sdpa_B_per_sm_clk"] = statistics.median(sd)
            row["kv70_vs_best_dense"] = statistics.median(r["vs_best_dense_green16"] for r in kv
                                                          if r["variant"] == "sparse0.7")
        out.append(row)
    return out


BUS_FRACTIONS = (1.0, 0.85, 0.7)


def quiet_orin_model(rows: list[dict], sms: int = 16) -> list[dict]:
    """A model, not a measurement: what the level-"none" rows (16 SMs, nothing else running) imply for an Orin
    whose GPU has the memory to itself. Our kernel's rate on 16 SMs, expressed as dense-fp16-equivalent bytes
    per SM-clock (``cap``: the dense operand's bytes over our time), is taken as its decode capacity on any
    Ampere-class SM at any clock; the dense baseline and our kernel are both assumed to stream at
    ``f`` x Orin's peak bytes per SM-clock (f in BUS_FRACTIONS) when not decode-bound. Then

        speed-up = 1 / max(our bytes / dense bytes, f x 9.85 / cap)     (EdgeBitmapLinear vs cuBLAS fp16)
        time ratio = max(KV bytes / dense KV bytes, f x 9.85 / cap)      (sparse KV attention vs dense)

    Medians over the layers with K·N ≥ 4M (all M of the run) per (values, sparsity); KV per shape at 70 %. Rows
    whose dense baseline does not reach Orin's peak rate even on these 16 SMs (latency-bound: small layers,
    batch-1 attention at 4k) are outside the model: left out (bitmap) or None (KV)."""
    out = []
    base = [r for r in rows if r.get("level") == "none"]
    dense = {(r["K"], r["N"], r["M"]): r for r in base if r.get("kernel") == "cublas_fp16"}
    for vd in ("float16", "int8"):
        for s in (0.3, 0.5, 0.7):
            sel = [r for r in base if r.get("kernel") == f"bitmap_{vd}_default" and r["sparsity"] == s
                   and r["K"] * r["N"] >= 4 * 1024 * 1024]
            if not sel:
                continue
            caps, ratios = [], []
            for r in sel:
                d = dense[(r["K"], r["N"], r["M"])]
                if d["B_per_sm_clk"] < ORIN_B_PER_SM_CLK:  # dense not bandwidth-bound even here: outside the model
                    continue
                caps.append(d["bytes"] / r["us"] / (sms * r["sm_mhz"]))  # bytes per µs over SM-clocks per µs
                ratios.append(r["bytes"] / d["bytes"])
            if not caps:
                continue
            row = {"op": "bitmap_linear", "values": vd, "sparsity": s, "cap_dense_eq_B_per_sm_clk": statistics.median(caps),
                   "cap_weights_per_sm_clk": statistics.median(caps) / 2, "bytes_ratio": statistics.median(ratios)}
            for f in BUS_FRACTIONS:
                row[f"speedup_f{f}"] = statistics.median(1 / max(q, f * ORIN_B_PER_SM_CLK / c) for q, c in zip(ratios, caps))
            out.append(row)
    kv = [r for r in base if r.get("kernel") == "sparse_kv" and r.get("variant") == "sparse0.7"]
    sdpa = {(r["model"], r["batch"], r["context"]): r for r in base
            if r.get("kernel") == "sparse_kv" and r.get("variant") == "sdpa"}
    for r in kv:
        sd = sdpa[(r["model"], r["batch"], r["context"])]
        dense_bytes = 2 * r["batch"] * _KV_HKV[r["model"]] * r["context"] * 64 * 2
        cap = dense_bytes / r["green16"] / (sms * r["sm_mhz"])
        row = {"op": "sparse_kv", "model": r["model"], "batch": r["batch"], "context": r["context"], "sparsity": 0.7,
               "cap_dense_eq_B_per_sm_clk": cap, "bytes_ratio": r["kv_ratio"]}
        row["sdpa_B_per_sm_clk"] = sd["B_per_sm_clk"]
        for f in BUS_FRACTIONS:  # only where SDPA streams at least that fast on these 16 SMs
            ok = sd["B_per_sm_clk"] >= f * ORIN_B_PER_SM_CLK
            row[f"time_ratio_f{f}"] = max(r["kv_ratio"], f * ORIN_B_PER_SM_CLK / cap) if ok else None
        out.append(row)
    return out


def _print_model(rows: list[dict]) -> None:
    from bench._common import print_table

    for op in ("bitmap_linear", "sparse_kv"):
        sel = [r for r in rows if r["op"] == op]
        if sel:
            print_table(sel, list(sel[0]))


_KV_HKV = {"llama3.2-1b": 8, "smollm2-135m": 3}  # KV heads (bench/bench_sparse_kv.py MODELS), d = 64


if __name__ == "__main__":
    sys.exit(main())
