#!/usr/bin/env python3
"""Launch chosen EdgeVitBitGemm GEMM tactics once each on one shape (for ncu):
    ncu --section WarpStateStats ... python tools/vitbit_gemm_profile.py K N M TACTIC [TACTIC ...]"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from edgesdk.formats import vitbit_gemm as F  # noqa: E402
from edgesdk.kernels import vitbit_gemm as K  # noqa: E402


def main() -> int:
    k, n, m = (int(v) for v in sys.argv[1:4])
    rng = np.random.default_rng(0)
    p = F.VitBitWeights.pack(rng.integers(-128, 128, (n, k)).astype(np.int8), rng.uniform(1e-3, 1e-2, n).astype(np.float32),
                             bias=rng.normal(0, 1, n).astype(np.float32), x_scale=0.02)
    a = p.node_attributes()
    d = {kk: torch.from_numpy(v).cuda() for kk, v in p.to_tensors().items()}
    xq = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
    y = torch.empty(m, n, dtype=torch.float16, device="cuda")
    ws = torch.zeros(K.workspace_bytes(a, m), dtype=torch.uint8, device="cuda")  # tk counters: 0 on entry
    s = torch.cuda.current_stream().cuda_stream
    for t in (int(v) for v in sys.argv[4:]):
        K.gemm(a, "float16", m, xq.data_ptr(), d["weight"].data_ptr(), d["w_scale"].data_ptr(), d["bias"].data_ptr(),
               y.data_ptr(), s, t, part=ws.data_ptr() + K._xq_bytes(m, k))
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
