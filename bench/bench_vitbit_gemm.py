#!/usr/bin/env python3
"""Benchmark EdgeVitBitGemm tactics vs torch._int_mm, an autotuned Triton int8 matmul and cuBLAS fp16.

ViT-B/16 GEMMs (K, N) in {(768, 2304), (768, 768), (768, 3072), (3072, 768)}, M = 197 * B, B in {1, 8, 32},
on the full GPU and on a 16-SM green context ("Orin proxy": same GPU, 16 SMs, memory not Orin's).

Timing: every variant is timed the same way on the same stream: a long spin kernel is queued first, so
the host has enqueued the whole burst of ``INNER`` calls before the GPU reaches it; CUDA events around the
burst then measure back-to-back GPU time (this works on a green-context stream, where torch's graph
capture is not usable with our driver-API modules). Median of ``REPS`` bursts. Weights rotate over
``ROT`` copies. TOPS = 2 M N K / time. The tensor-core peak of each configuration is measured in the
same run: the best of torch._int_mm and our tactics 1 and 8 on an 8192^3 int8 GEMM.

"ours op" = the full node (quantize X + GEMM + epilogue, fp16 out); "ours gemm" = the GEMM kernel on
pre-quantized int8 X with the fp16 epilogue, comparable to the int32-output baselines (which do less:
no dequantization, no fp16 rounding).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench._common import meta, print_table, write_results  # noqa: E402
from edgesdk.formats import vitbit_gemm as F  # noqa: E402
from edgesdk.kernels import _cuda  # noqa: E402
from edgesdk.kernels import vitbit_gemm as K  # noqa: E402

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
BATCHES = [1, 8, 32]
INNER, REPS, ROT = 20, 7, 4
# Exploration knobs (the committed results use the defaults: every tactic, both configurations):
#   VITBIT_BENCH_TACTICS=1,30,...  only these tactics;  VITBIT_BENCH_CONFIGS=full  skip the green context;
#   VITBIT_BENCH_NAME=name  results file name;  VITBIT_TRITON_SM80=DIR  PTX of the sm_80 Triton build
#   (tools/vitbit_gemm_triton_sm80.py; default /work/main/.ext/vitbit_triton_sm80 or ../../.ext/... ).
_ENV_TACTICS = [int(t) for t in os.environ.get("VITBIT_BENCH_TACTICS", "").split(",") if t.strip()]
_ENV_CONFIGS = os.environ.get("VITBIT_BENCH_CONFIGS", "full,green16").split(",")


def _triton_sm80():
    """The sm_80 (mma.sync) build of the Triton kernel, or None when its PTX is not there."""
    root = Path(__file__).resolve().parents[1]
    cands = [os.environ.get("VITBIT_TRITON_SM80", ""), str(root / ".ext" / "vitbit_triton_sm80"),
             str(root.parents[1] / ".ext" / "vitbit_triton_sm80"), "/work/main/.ext/vitbit_triton_sm80"]
    d = next((c for c in cands if c and (Path(c) / "meta.json").exists()), None)
    if d is None:
        print("Triton sm_80 build not found (tools/vitbit_gemm_triton_sm80.py builds it): column skipped")
        return None
    return _triton_tool().Sm80Matmul(d)


def _triton_tool():
    """``tools/vitbit_gemm_triton_sm80.py`` (the Triton kernel source and its sm_80 build)."""
    path = Path(__file__).resolve().parents[1] / "tools" / "vitbit_gemm_triton_sm80.py"
    spec = importlib.util.spec_from_file_location("vitbit_gemm_triton_sm80", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------------------------------
# Triton int8 matmul baseline (autotuned), C int32 = A int8 [M, K] @ B int8 [K, N] (B given as [N, K]).
# --------------------------------------------------------------------------------------------------
def _triton_matmul():
    import triton

    tool = _triton_tool()
    configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_stages=st, num_warps=w)
               for bm, bn, bk, st, w in tool.CONFIGS]
    kernel = triton.autotune(configs=configs, key=["M", "N", "K"])(tool.int8_matmul_kernel())

    def run(a, b_nk, c):
        m, k = a.shape
        n = b_nk.shape[0]
        kernel[lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"]))](a, b_nk, c, m, n, k)

    return run


# --------------------------------------------------------------------------------------------------
# Timing on any stream (primary or green context).
# --------------------------------------------------------------------------------------------------
class Timer:
    def __init__(self, stream_int: int, ctx, spin):
        from cuda.bindings import driver as cu

        self.cu, self.stream, self.ctx, self.spin = cu, stream_int, ctx, spin
        self.spin_out = torch.empty(256, device="cuda")
        self.ev = [_cuda.check(cu.cuEventCreate(0)) for _ in range(2)]

    def __call__(self, fn) -> float:
        cu = self.cu
        _cuda.check(cu.cuCtxSetCurrent(self.ctx))
        for i in range(3):
            fn(i)
        times = []
        st = cu.CUstream(self.stream)
        for _ in range(REPS):
            _cuda.check(cu.cuCtxSetCurrent(self.ctx))
            self.spin.launch((1,), (256,), [ctypes.c_void_p(self.spin_out.data_ptr()), ctypes.c_float(1.0001),
                                            ctypes.c_float(0.5), ctypes.c_int(1 << 21)], self.stream)
            _cuda.check(cu.cuEventRecord(self.ev[0], st))
            for i in range(INNER):
                _cuda.check(cu.cuCtxSetCurrent(self.ctx))
                fn(i)
            _cuda.check(cu.cuCtxSetCurrent(self.ctx))
            _cuda.check(cu.cuEventRecord(self.ev[1], st))
            _cuda.check(cu.cuEventSynchronize(self.ev[1]))
            times.append(_cuda.check(cu.cuEventElapsedTime(self.ev[0], self.ev[1])) * 1000.0 / INNER)
        return statistics.median(times)


def bench_config(label: str, ctx, prim, stream_int: int, tstream, triton_mm, rng, tt80=None) -> list[dict]:
    from cuda.bindings import driver as cu

    _cuda.check(cu.cuCtxSetCurrent(ctx))
    spin = _cuda.get_kernel("common/selftest.cu", "edgesdk_ffma_spin")
    timer = Timer(stream_int, ctx, spin)
    rows: list[dict] = []

    def torch_call(f):
        def g(i):
            _cuda.check(cu.cuCtxSetCurrent(prim))
            with torch.cuda.stream(tstream):
                f(i)
        return g

    # Tensor-core peak of this configuration: a big int8 GEMM.
    big = 8192
    a8 = torch.randint(-128, 128, (big, big), dtype=torch.int8, device="cuda")
    b8 = torch.randint(-128, 128, (big, big), dtype=torch.int8, device="cuda")
    c32 = torch.empty(big, big, dtype=torch.int32, device="cuda")
    peak = {}
    try:
        peak["torch._int_mm"] = 2 * big**3 / timer(torch_call(lambda i: torch._int_mm(a8, b8.t(), out=c32))) / 1e6
    except Exception as e:
        print(f"[{label}] torch._int_mm peak failed: {e!r}")
        _cuda.check(cu.cuCtxSetCurrent(prim))
    pa = F.validate_attributes({"n": big, "k": big, "bits": 8, "x_scale": 0.01, "has_bias": 0, "gelu": 0})
    ws1 = torch.full((big,), 0.001, device="cuda")
    y16 = torch.empty(big, big, dtype=torch.float16, device="cuda")
    if tt80 is not None:  # mma.sync Triton, its 128x128x64 config (the best of its configs at 8192^3 here)
        for j in (0,):
            try:
                peak[f"triton sm80 {tt80.meta[j]['name']}"] = 2 * big**3 / timer(
                    lambda i, j=j: tt80.run(j, a8, b8, c32, stream_int)) / 1e6
            except Exception as e:
                print(f"[{label}] triton sm80 peak failed: {e!r}")
                _cuda.check(cu.cuCtxSetCurrent(prim))
    for t in (9, 30):
        if _ENV_TACTICS and t not in _ENV_TACTICS:
            continue
        peak[f"ours tactic {t}"] = 2 * big**3 / timer(
            lambda i, t=t: K.gemm(pa, "float16", big, a8.data_ptr(), b8.data_ptr(), ws1.data_ptr(), 0,
                                  y16.data_ptr(), stream_int, t)) / 1e6
    peak_tops = max(peak.values())
    print(f"[{label}] int8 tensor-core peak (8192^3): " + ", ".join(f"{k} {v:.0f} TOPS" for k, v in peak.items()))
    del a8, b8, c32, y16

    for (k, n) in SHAPES:
        for b in BATCHES:
            m = 197 * b
            ops = 2.0 * m * n * k
            w = [rng.integers(-128, 128, (n, k)).astype(np.int8) for _ in range(ROT)]
            p = [F.VitBitWeights.pack(wi, rng.uniform(0.001, 0.01, n).astype(np.float32),
                                      bias=rng.normal(0, 1, n).astype(np.float32), x_scale=0.02) for wi in w]
            a = p[0].node_attributes()
            dev = [{kk: torch.from_numpy(v).cuda() for kk, v in pi.to_tensors().items()} for pi in p]
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            xq = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
            y = torch.empty(m, n, device="cuda", dtype=torch.float16)
            c = torch.empty(m, n, device="cuda", dtype=torch.int32)
            wf = [torch.from_numpy(wi.astype(np.float16)).cuda() for wi in w]
            # zeroed once: the tk tactics' tile counters must be 0 on entry to gemm() (each launch resets them)
            ws = torch.zeros(K.workspace_bytes(a, m), dtype=torch.uint8, device="cuda")
            ins = [[x.data_ptr()] + [d[t].data_ptr() for t in F.TENSOR_NAMES] for d in dev]
            res: dict[str, float] = {}

            def rec(name, us):
                res[name] = us
                rows.append({"config": label, "K": k, "N": n, "B": b, "M": m, "variant": name, "us": us,
                             "TOPS": ops / us / 1e6, "frac_peak": ops / us / 1e6 / peak_tops})

            def safe(name, fn):
                try:
                    rec(name, timer(fn))
                except Exception as e:  # a baseline that cannot run here is reported, not hidden
                    rows.append({"config": label, "K": k, "N": n, "B": b, "M": m, "variant": name,
                                 "error": repr(e)[:200]})
                    _cuda.check(cu.cuCtxSetCurrent(prim))

            safe("torch._int_mm", torch_call(lambda i: torch._int_mm(xq, dev[i % ROT]["weight"].t(), out=c)))
            safe("triton int8", torch_call(lambda i: triton_mm(xq, dev[i % ROT]["weight"], c)))
            safe("cublas fp16", torch_call(lambda i: torch.matmul(x, wf[i % ROT].t(), out=y)))
            if tt80 is not None:
                def tt_fn(j):
                    return lambda i: tt80.run(j, xq, dev[i % ROT]["weight"], c, stream_int)
                try:
                    j = tt80.tune((label, m, n, k), timer, tt_fn)
                    safe("triton int8 sm80", tt_fn(j))
                    rows[-1]["triton_sm80_config"] = tt80.meta[j]["name"]
                except Exception as e:
                    rows.append({"config": label, "K": k, "N": n, "B": b, "M": m, "variant": "triton int8 sm80",
                                 "error": repr(e)[:200]})
                    _cuda.check(cu.cuCtxSetCurrent(prim))
            for t in K.valid_tactics(a, m):
                if _ENV_TACTICS and t not in _ENV_TACTICS:
                    continue
                if t == K.AUTO:  # the default: resolved per shape on this context
                    _cuda.check(cu.cuCtxSetCurrent(ctx))
                    auto_t = K.resolve_tactic(a, m)
                    name = f"auto=t{auto_t}"
                elif t in K.SPLIT_M:  # two persistent kernels: head rows, then the tail rows
                    name = "+".join(K.SPLIT_M[t]) + " split-M"
                else:
                    name = K.config(t)[0].name + (f"/splitk{K.TACTICS[t][1]}" if K.TACTICS[t][1] > 1 else "")
                safe(f"ours gemm t{t} {name}",
                     lambda i, t=t: K.gemm(a, "float16", m, xq.data_ptr(), ins[i % ROT][1], ins[i % ROT][2],
                                           ins[i % ROT][3], y.data_ptr(), stream_int, t,
                                           part=ws.data_ptr() + K._xq_bytes(m, k)))
                if t == 1:
                    safe("ours op t1 (quantize+gemm)",
                         lambda i: K.launch(a, "float16", m, ins[i % ROT], [y.data_ptr()], stream_int, 1,
                                            workspace=ws.data_ptr()))
            safe("ours gemm t1 repeat (noise check)",
                 lambda i: K.gemm(a, "float16", m, xq.data_ptr(), ins[i % ROT][1], ins[i % ROT][2],
                                  ins[i % ROT][3], y.data_ptr(), stream_int, 1,
                                  part=ws.data_ptr() + K._xq_bytes(m, k)))
            ours = {kk: v for kk, v in res.items() if kk.startswith("ours gemm") and "repeat" not in kk}
            best = min(ours, key=ours.get)
            tc1 = next((v for kk, v in ours.items() if kk.startswith("ours gemm t1 ")), None)
            tc1_name = next((kk for kk in ours if kk.startswith("ours gemm t1 ")), None)
            hyb = {kk: v for kk, v in ours.items() if " h" in kk}
            bh = min(hyb, key=hyb.get) if hyb else None
            # tensor-core-only tactics with a fixed kernel (tc2, tp persistent, tk in-kernel split-K)
            tc_only = {kk: v for kk, v in ours.items() if " tc2_" in kk or " tp_" in kk or " tk_" in kk}
            btc = min(tc_only, key=tc_only.get)
            rows.append({"config": label, "K": k, "N": n, "B": b, "M": m, "variant": "summary",
                         "tuned": best, "tuned_us": ours[best], "tc1_us": tc1, "tc1": tc1_name,
                         "best_tc_only": btc, "best_tc_only_us": tc_only[btc],
                         "best_hybrid": bh, "best_hybrid_us": hyb.get(bh),
                         "hybrid_vs_best_tc": (tc_only[btc] / hyb[bh]) if bh else None,
                         "int_mm_us": res.get("torch._int_mm"), "triton_us": res.get("triton int8"),
                         "triton_sm80_us": res.get("triton int8 sm80"),
                         "cublas_fp16_us": res.get("cublas fp16"),
                         "speedup_vs_int_mm": (res["torch._int_mm"] / tc_only[btc]) if "torch._int_mm" in res
                         else None,
                         "speedup_vs_triton": (res["triton int8"] / tc_only[btc]) if "triton int8" in res
                         else None,
                         "speedup_vs_triton_sm80": (res["triton int8 sm80"] / tc_only[btc])
                         if "triton int8 sm80" in res else None})
            s = rows[-1]
            print(f"[{label}] K={k} N={n} M={m}: int_mm {s['int_mm_us']} triton {s['triton_us']} "
                  f"triton-sm80 {s['triton_sm80_us']} "
                  f"fp16 {s['cublas_fp16_us']} | t1 {tc1} best-TC {btc} {tc_only[btc]:.2f} | "
                  f"best hybrid {bh} {hyb.get(bh, float('nan')):.2f} | tuned {best}", flush=True)
            del dev, wf, ws, x, xq, y, c
    return rows, peak


def main() -> int:
    from cuda.bindings import driver as cu

    torch.cuda.init()
    torch.zeros(1, device="cuda")
    _cuda.init()
    prim = _cuda.check(cu.cuCtxGetCurrent())
    rng = np.random.default_rng(0)
    triton_mm = _triton_matmul()
    tt80 = _triton_sm80()
    all_rows, peaks = [], {}
    # Full GPU.
    full_stream = torch.cuda.Stream()
    if "full" in _ENV_CONFIGS:
        rows, peaks["full"] = bench_config("full", prim, prim, full_stream.cuda_stream, full_stream, triton_mm, rng,
                                           tt80)
        all_rows += rows
    # 16-SM green context.
    try:
        if "green16" not in _ENV_CONFIGS:
            raise RuntimeError("skipped (VITBIT_BENCH_CONFIGS)")
        gctx, sms = _cuda.green_context(16)
        _cuda.check(cu.cuCtxSetCurrent(gctx))
        gstream = _cuda.check(cu.cuStreamCreate(1))
        _cuda.check(cu.cuCtxSetCurrent(prim))
        rows, peaks[f"green{sms}"] = bench_config(f"green{sms}", gctx, prim, int(gstream),
                                                  torch.cuda.ExternalStream(int(gstream)), triton_mm, rng, tt80)
        all_rows += rows
    except Exception as e:
        print(f"green context failed: {e!r}")
        peaks["green_error"] = repr(e)
    _cuda.check(cu.cuCtxSetCurrent(prim))
    info = meta({"peaks_tops": peaks, "method": __doc__.strip().split("\n\n")[1], "inner": INNER, "reps": REPS,
                 "rotations": ROT, "tactics": _ENV_TACTICS or "all", "configs": _ENV_CONFIGS,
                 "triton_sm80": tt80.meta if tt80 is not None else None})
    if os.environ.get("EDGESDK_COMMIT"):  # a staged copy of a worktree: git would name the enclosing checkout
        info["commit"] = os.environ["EDGESDK_COMMIT"]
    path = write_results(os.environ.get("VITBIT_BENCH_NAME", "vitbit_gemm"), all_rows, info)
    summ = [r for r in all_rows if r.get("variant") == "summary"]
    print_table(summ, ["config", "K", "N", "M", "int_mm_us", "triton_us", "triton_sm80_us", "cublas_fp16_us", "tc1_us",
                       "best_tc_only_us", "best_hybrid_us", "tuned_us", "speedup_vs_int_mm", "speedup_vs_triton",
                       "hybrid_vs_best_tc", "tuned"])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
