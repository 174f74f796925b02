"""Can a plugin's *first* launch happen inside a CUDA stream capture? (GPU probe, not a test.)

A TensorRT plugin's first ``enqueue`` for a shape compiles (or reads from the disk cache) and loads its CUDA
module. If TensorRT timed tactics inside a stream capture, that first launch would run in one. This probe runs,
in a fresh process per case, the first launch of each launcher inside ``cuStreamBeginCapture`` in each capture
mode (global: what ``torch.cuda.graph`` uses by default; thread-local; relaxed), with the on-disk cubin cache
cold (empty ``EDGESDK_CACHE``) and warm, then replays the graph and checks Y against the numpy reference.

    python tools/capture_probe.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("global", "thread_local", "relaxed")
OPS = ("bitmap_linear", "vitbit_gemm")


def one(op: str, mode: str) -> dict:
    """In this process: the first launch of ``op`` inside a capture in ``mode``; replay; compare."""
    import numpy as np
    import torch

    from edgesdk.kernels import _cuda

    cu = _cuda._driver()
    _cuda.init()
    torch.cuda.init()
    rng = np.random.default_rng(7)
    m, n, k = 5, 333, 999
    if op == "bitmap_linear":
        from edgesdk.formats.bitmap_linear import BitmapLinearWeights
        from edgesdk.kernels import bitmap_linear as K
        from edgesdk.reference.bitmap_linear import bitmap_linear, tolerance

        w = rng.standard_normal((n, k)).astype(np.float32)
        w[rng.random((n, k)) < 0.5] = 0
        p = BitmapLinearWeights.pack(w, "float16", bias=rng.standard_normal(n))
        x = rng.uniform(-2, 2, (m, k)).astype(np.float16)
        ref = bitmap_linear(x, p, out_dtype=np.float64)
        names, ydt, tol = list(p.to_tensors()), torch.float16, tolerance(x, p)
    else:
        from edgesdk.formats import vitbit_gemm as F
        from edgesdk.kernels import vitbit_gemm as K
        from edgesdk.reference import vitbit_gemm as R

        w = rng.integers(-128, 128, (n, k)).astype(np.int8)
        p = F.VitBitWeights.pack(w, rng.uniform(0.002, 0.03, n).astype(np.float32), 8,
                                 bias=rng.normal(0, 2, n).astype(np.float32), x_scale=0.02)
        x = rng.uniform(-2, 2, (m, k)).astype(np.float16)
        ref = np.asarray(R.vitbit_gemm(x, p), np.float64)
        names, ydt, tol = [t for t in F.TENSOR_NAMES if t in p.to_tensors()], torch.float16, 1e-2 + 2e-3 * np.abs(ref)
    t = {k2: torch.from_numpy(np.ascontiguousarray(v)).cuda() for k2, v in p.to_tensors().items()}
    xd = torch.from_numpy(x).cuda()
    y = torch.full((m, n), float("nan"), dtype=ydt, device="cuda")
    ws = torch.zeros(max(K.workspace_bytes(p.node_attributes(), m), 1), dtype=torch.uint8, device="cuda")
    ins = [xd.data_ptr()] + [t[k2].data_ptr() for k2 in names]
    stream = _cuda.check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    torch.cuda.synchronize()
    mode_enum = getattr(cu.CUstreamCaptureMode, f"CU_STREAM_CAPTURE_MODE_{mode.upper()}")
    _cuda.check(cu.cuStreamBeginCapture(stream, mode_enum))
    t0 = time.perf_counter()
    launch_error = None
    try:
        kw = {"workspace": ws.data_ptr()} if op == "vitbit_gemm" else {}
        K.launch(p.node_attributes(), "float16", m, ins, [y.data_ptr()], int(stream), 1, **kw)
    except Exception as e:  # noqa: BLE001 - the probe reports whatever the first launch raises
        launch_error = f"{type(e).__name__}: {e}"
    first_s = time.perf_counter() - t0
    err, graph = cu.cuStreamEndCapture(stream)
    out = {"op": op, "mode": mode, "launch_error": launch_error, "end_capture": int(err), "first_launch_s": first_s}
    if launch_error is None and int(err) == 0:
        gexec = _cuda.check(cu.cuGraphInstantiate(graph, 0))
        _cuda.check(cu.cuGraphLaunch(gexec, stream))
        _cuda.check(cu.cuStreamSynchronize(stream))
        got = y.float().cpu().numpy().astype(np.float64)
        out["replay_ok"] = bool(np.isfinite(got).all() and (np.abs(got - ref) <= tol).all())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", nargs=2, metavar=("OP", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(*a.one)))
        return 0
    rows = []
    for cache in ("cold", "warm"):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, EDGESDK_CACHE=d, PYTHONPATH=str(ROOT))
            if cache == "warm":  # fill the disk cache outside any capture first
                for op in OPS:
                    subprocess.run([sys.executable, __file__, "--one", op, "relaxed"], env=env, check=False,
                                   capture_output=True)
            for op in OPS:
                for mode in MODES:
                    r = subprocess.run([sys.executable, __file__, "--one", op, mode], env=env, capture_output=True,
                                       text=True)
                    try:
                        row = json.loads(r.stdout.strip().splitlines()[-1])
                    except (IndexError, ValueError):
                        row = {"op": op, "mode": mode, "crashed": (r.stderr or r.stdout)[-800:]}
                    row["disk_cache"] = cache
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if a.json:
        a.json.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
