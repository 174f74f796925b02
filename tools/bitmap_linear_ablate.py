#!/usr/bin/env python3
"""Where the time of EdgeBitmapLinear's default decode kernel (tactic 1) goes: leave-one-stage-out timing.

The kernel source is copied to a temporary file with switches (``BL_ABLATE`` bits) spliced in; they act on
the decode kernels' shared body, so on the X-staged builds tactic 1 launches (``_xs``, ``_xs80``):
  1   no tile decode: each A register is ``word ^ address`` of the scan's output (no popc, shared loads,
      byte permutes); the scan, ``ldmatrix`` of X and the mma stay
  2   no scan shuffles (each word's value address is its own popcount: wrong, same loads and stores)
  4   no mma: the A registers and X fragments are folded into the accumulator by XOR (keeps them live)
  8   no value copies (``cp.async`` of the nonzero values left out: the decode reads stale shared memory)
  16  no bitmap and no X copies
  32  X rows >= M not copied (no zero fill; outside the K tail): exact, since those rows only feed columns of
      D that are never stored; checked bit for bit like variant 0
Variant 0 (every switch compiled in, all off) must equal the production kernel bit for bit; it is checked.
The others compute wrong results by design: timing only. Each variant's time, side by side with cuBLAS fp16
and the production kernel, shows which part sets the time: e.g. bits 7 (copy pipeline alone: the ring,
its waits and the epilogue) against bits 24 (everything but the DRAM traffic).

Timing as ``tools/bitmap_linear_explore.py``: CUDA graphs over operand copies rotated beyond 2 × L2,
median of 10 replays; ``--rounds R`` times the variant list R times in turn, median of the R medians.

Usage: python tools/bitmap_linear_ablate.py [--shapes 4096x4096,...] [--m 1,16] [--cases float16:0.5,...]
       [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import meta, time_graph  # noqa: E402
from bench.bench_bitmap_linear import _copies  # noqa: E402
from bitmap_linear_explore import _pack  # noqa: E402  (tools/ is the script's directory)

SWITCHES = [  # (exact text, replacement): each must occur exactly once in the source
    ("  uint32_t v0, v1;\n  lds_u16x2(ea + 2u * __popc(w & below), v0, v1);",
     "  if (BL_ABLATE & 1) return w ^ ea;\n  uint32_t v0, v1;\n  lds_u16x2(ea + 2u * __popc(w & below), v0, v1);"),
    ("  uint32_t v0, v1;\n  lds_u8x2(ea + __popc(w & below), v0, v1);",
     "  if (BL_ABLATE & 1) return w ^ ea;\n  uint32_t v0, v1;\n  lds_u8x2(ea + __popc(w & below), v0, v1);"),
    ("      for (int d = 1; d < 16; d *= 2) {\n        const uint32_t y = __shfl_up_sync(0xffffffffu, x, d, 16);",
     "      for (int d = 1; d < 16 && !(BL_ABLATE & 2); d *= 2) {\n"
     "        const uint32_t y = __shfl_up_sync(0xffffffffu, x, d, 16);"),
    ("        for (int b = 0; b < MB; ++b) mma16816(acc[b], a, xb[b][2 * (kk & 1)], xb[b][2 * (kk & 1) + 1]);",
     "        for (int b = 0; b < MB; ++b) {\n"
     "          if (BL_ABLATE & 4)\n"
     "            acc[b][0] += __uint_as_float((a[0] ^ a[1] ^ a[2] ^ a[3] ^ xb[b][2 * (kk & 1)] ^\n"
     "                                          xb[b][2 * (kk & 1) + 1]) & 0x007fffffu);\n"
     "          else\n"
     "            mma16816(acc[b], a, xb[b][2 * (kk & 1)], xb[b][2 * (kk & 1) + 1]);\n"
     "        }"),
    ("        if (pa + q * 32 * kVPC < a1) cp_async16_s(da + 512 * q, va + 512 * q);",
     "        if (!(BL_ABLATE & 8) && pa + q * 32 * kVPC < a1) cp_async16_s(da + 512 * q, va + 512 * q);"),
    ("        if (pb + q * 32 * kVPC < b1) cp_async16_s(da + kW + 512 * q, vb + 512 * q);",
     "        if (!(BL_ABLATE & 8) && pb + q * 32 * kVPC < b1) cp_async16_s(da + kW + 512 * q, vb + 512 * q);"),
    ("      if (blane)\n        asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n\"",
     "      if (blane && !(BL_ABLATE & 16))\n        asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\\n\""),
    ("            cp_async16_zfill_s(xs + (q & 1 ? xd1 : xd0) + 1024 * (q >> 1), X + (xoff[q] + kj), (xsz >> q) & 1);",
     "            if (!(BL_ABLATE & 32) || ((xsz >> q) & 1))\n"
     "              cp_async16_zfill_s(xs + (q & 1 ? xd1 : xd0) + 1024 * (q >> 1), X + (xoff[q] + kj), (xsz >> q) & 1);"),
    ("      if constexpr (XS) {\n        const int kj = j * kGroupK;",
     "      if constexpr (XS) if (!(BL_ABLATE & 16)) {\n        const int kj = j * kGroupK;"),
]
VARIANTS = [  # (name, BL_ABLATE bits)
    ("full", 0),
    ("no_decode", 1),
    ("no_decode_no_scan", 3),
    ("copies_only", 7),
    ("no_value_copies", 8),
    ("no_copies", 24),
    ("x_rows_below_m", 32),
]
EXACT = {"full", "x_rows_below_m"}  # variants that must equal the production kernel bit for bit


def patched_source(src: Path) -> Path:
    text = src.read_text()
    for old, new in SWITCHES:
        if text.count(old) != 1:
            raise SystemExit(f"switch point not found exactly once in {src}: {old.strip()[:70]!r}")
        text = text.replace(old, new)
    text = text.replace('#include "common/ampere.cuh"',
                        '#include "common/ampere.cuh"\n#ifndef BL_ABLATE\n#define BL_ABLATE 0\n#endif', 1)
    d = Path(tempfile.mkdtemp(prefix="bl_ablate_"))
    (d / "bitmap_linear_ablate.cu").write_text(text)
    return d / "bitmap_linear_ablate.cu"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x4096,4096x11008,11008x4096,2048x5632,5632x2048,896x4864,4864x896")
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--cases", default="float16:0.5,float16:0.7,int8:0.5", help="value dtype:sparsity, ...")
    ap.add_argument("--variants", default="", help="comma-separated names to keep (default: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    from concurrent.futures import ProcessPoolExecutor

    import torch

    from edgesdk.formats import bitmap_linear as fmt
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import bitmap_linear as kbl

    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    ms = [int(v) for v in a.m.split(",")]
    cases = [(c.split(":")[0], float(c.split(":")[1])) for c in a.cases.split(",")]
    variants = VARIANTS if not a.variants else [v for v in VARIANTS if v[0] in a.variants.split(",")]
    src = patched_source(_cuda.PLUGINS_DIR / kbl.SOURCE)
    orig_get = _cuda.get_kernel
    state = {"bits": None}

    def get_kernel(source, name, options=()):
        if state["bits"] is not None and str(source) == kbl.SOURCE:
            return orig_get(src, name, (*options, f"-DBL_ABLATE={state['bits']}"))
        return orig_get(source, name, options)

    def use(bits):  # switch the launcher to a variant (None: production); plans are cached per kernel
        state["bits"] = bits
        _cuda.thread_cache(kbl._tls).clear()

    jobs = [(k, n, s, vd, 7 * i + int(10 * s)) for i, (k, n) in enumerate(shapes) for vd, s in cases]
    with ProcessPoolExecutor(12) as ex:
        packed = {j[:4]: p for j, p in ex.map(_pack, jobs)}
    torch.zeros(1, device="cuda")
    _cuda.init()
    kbl._cuda.get_kernel = get_kernel
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    info = meta({"tool": "bitmap_linear_ablate", "rounds": a.rounds, "variants": dict(variants)})
    rows = []

    def write():
        if a.json:
            tmp = a.json.with_suffix(".tmp")
            tmp.write_text(json.dumps({"meta": info, "method": "CUDA graphs over operand copies rotated beyond "
                                       "2 x L2, median of 10 replays, median over rounds; ablated variants compute "
                                       "wrong results by design (timing only)", "rows": rows}, indent=1))
            tmp.replace(a.json)

    for (k, n) in shapes:
        nd = _copies(fmt.dense_fp16_bytes(n, k), l2)
        w0 = torch.randn(n, k, device="cuda", dtype=torch.float16)
        wd = [w0] + [w0.clone() for _ in range(nd - 1)]
        for vd, s in cases:
            p = packed[(k, n, s, vd)]
            base = [torch.from_numpy(v).cuda() for v in p.to_tensors().values()]
            nc = _copies(p.nbytes, l2)
            copies = [base] + [[t.clone() for t in base] for _ in range(nc - 1)]
            attrs = p.node_attributes()
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                y = torch.empty(m, n, device="cuda", dtype=torch.float16)
                it = [0]

                def dense():
                    torch.mm(x, wd[it[0] % nd].t(), out=y)
                    it[0] += 1

                def run(cc):  # on torch's current stream, read at the call: the capture stream inside time_graph
                    kbl.launch(attrs, "float16", m, [x.data_ptr(), *[t.data_ptr() for t in cc]], [y.data_ptr()],
                               torch.cuda.current_stream().cuda_stream, 1)

                use(None)
                y.fill_(float("nan"))
                run(copies[0])
                torch.cuda.synchronize()
                ref = y.clone()
                names = ["cublas", "production"] + [v[0] for v in variants]
                ts = {nm: [] for nm in names}
                sms = torch.cuda.get_device_properties(0).multi_processor_count
                row = {"K": k, "N": n, "M": m, "sparsity": s, "vd": vd, "bytes": p.nbytes,
                       "dense_bytes": fmt.dense_fp16_bytes(n, k),
                       "cfg": kbl.config(n, k, m, "float16", vd, 1, sms)["name"]}
                for _ in range(a.rounds):
                    ts["cublas"].append(time_graph(dense, inner=nd, reps=10))
                    for nm, bits in [("production", None)] + list(variants):
                        use(bits)
                        if nm in EXACT:  # must be the production kernel's output
                            y.fill_(float("nan"))
                            run(copies[0])
                            torch.cuda.synchronize()
                            row[f"{nm}_bit_identical"] = bool(torch.equal(y.view(torch.int16), ref.view(torch.int16)))
                        j = [0]

                        def ours():
                            run(copies[j[0] % nc])
                            j[0] += 1

                        if nm == "production":
                            y.fill_(float("nan"))
                        ts[nm].append(time_graph(ours, inner=nc, reps=10))
                        if nm == "production":  # the timed graph really ran the kernel: it wrote Y
                            torch.cuda.synchronize()
                            if not torch.equal(y.view(torch.int16), ref.view(torch.int16)):
                                raise SystemExit(f"{k}x{n} M={m}: the timed production graph did not write Y")
                use(None)
                for nm in names:
                    row[nm] = round(float(np.median(ts[nm])), 3)
                    row[f"{nm}_speedup"] = round(row["cublas"] / row[nm], 3)
                row["production_GBps"] = round(p.nbytes / row["production"] / 1e3, 1)
                row["cublas_GBps"] = round(row["dense_bytes"] / row["cublas"] / 1e3, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
                write()
            copies = base = None
        wd = w0 = None
        torch.cuda.empty_cache()
    write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
