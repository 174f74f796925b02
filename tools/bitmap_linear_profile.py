#!/usr/bin/env python3
"""Launch an EdgeBitmapLinear tactic (default: 1, the default kernel) on a few decode cases, for a profiler.

Each case is launched 3 times (outputs checked against the float64 reference after the last one);
run under Nsight Compute, e.g.
  ncu --kernel-name regex:bitmap_dec --launch-skip 2 --launch-count 1 --section SchedulerStats ...
  python tools/bitmap_linear_profile.py --cases 4096x4096:1:0.5:float16

``--ablate BITS`` launches a variant of ``tools/bitmap_linear_ablate.py`` instead of the production kernel (same
kernel names; e.g. 7 = copies only, 24 = no copies); ablated variants compute wrong results by design (ok=False).

Usage: python tools/bitmap_linear_profile.py [--cases KxN:M:sparsity:value_dtype,...] [--tactic 1] [--ablate BITS]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_bitmap_linear import random_packed


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="4096x4096:1:0.5:float16,4096x4096:1:0.5:int8,4096x4096:16:0.5:float16")
    ap.add_argument("--tactic", type=int, default=1)
    ap.add_argument("--ablate", type=int, default=None, help="BL_ABLATE bits of tools/bitmap_linear_ablate.py")
    a = ap.parse_args(argv)
    import torch

    from edgesdk.kernels import _cuda
    from edgesdk.kernels import bitmap_linear as kbl

    if a.ablate is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bitmap_linear_ablate import patched_source

        src, orig_get = patched_source(_cuda.PLUGINS_DIR / kbl.SOURCE), _cuda.get_kernel

        def get_kernel(source, name, options=()):
            if str(source) == kbl.SOURCE:
                return orig_get(src, name, (*options, f"-DBL_ABLATE={a.ablate}"))
            return orig_get(source, name, options)

        kbl._cuda.get_kernel = get_kernel

    torch.zeros(1, device="cuda")
    _cuda.init()
    for case in a.cases.split(","):
        kn, m, s, vd = case.split(":")
        k, n = (int(v) for v in kn.split("x"))
        m, s = int(m), float(s)
        p = random_packed(k, n, s, vd, 11)
        t = [torch.from_numpy(v).cuda() for v in p.to_tensors().values()]
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        c = kbl.config(n, k, m, "float16", vd, a.tactic, torch.cuda.get_device_properties(0).multi_processor_count)
        for _ in range(3):
            kbl.launch(p.node_attributes(), "float16", m, [x.data_ptr(), *[v.data_ptr() for v in t]], [y.data_ptr()],
                       torch.cuda.current_stream().cuda_stream, a.tactic)
        torch.cuda.synchronize()
        xd = x.double().cpu().numpy()
        ref = (xd @ p.raw_values().astype(np.float64).T) * p.scales.astype(np.float64)
        tol = 2.0**-10 * np.abs(ref) + 2.0**-16 * (np.abs(xd) @ np.abs(p.raw_values().astype(np.float64)).T) * p.scales + 2.0**-24
        ok = bool((np.abs(y.double().cpu().numpy() - ref) <= tol).all())
        print(f"case {case}: {c['name']} grid {c['grid'][0]} warps {c['block'][0] // 32} ks {c['ks']} ok={ok}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
