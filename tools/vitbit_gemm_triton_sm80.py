#!/usr/bin/env python3
"""Triton's int8 matmul compiled for an Ampere target (sm_80 PTX: mma.sync, ldmatrix, cp.async; no wgmma).

The same-instruction baseline Orin would see: the Triton kernel that ``bench/bench_vitbit_gemm.py``
autotunes (:func:`int8_matmul_kernel`, defined once here, same 8 configs) compiled with ``target=GPUTarget("cuda", 80, 32)``; the PTX is JIT-compiled
by the driver for the GPU at hand (sm_90 here). Pointers, N and K are specialised as multiples of 16 (true
for the ViT-B shapes; ``Sm80Matmul`` refuses others), M is not.

    python tools/vitbit_gemm_triton_sm80.py OUTDIR      # build the PTX (CPU is enough; triton installed)

The built PTX is Triton output, kept outside the repository (e.g. /work/main/.ext/vitbit_triton_sm80).
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

CONFIGS = [(128, 128, 64, 4, 8), (128, 256, 64, 3, 8), (64, 128, 64, 4, 4), (128, 64, 128, 4, 4),
           (64, 64, 128, 4, 4), (256, 128, 64, 3, 8), (64, 256, 128, 3, 8), (32, 64, 128, 4, 4)]


def int8_matmul_kernel():
    """The Triton int8 matmul, C int32 [M, N] = A int8 [M, K] @ B int8 [K, N] with B given as [N, K], as a
    plain ``@triton.jit`` function: the bench autotunes it over :data:`CONFIGS` for the GPU at hand,
    :func:`build` compiles each config for sm_80."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.int32)
        for k0 in range(0, K, BK):
            am = (rm[:, None] < M) & (k0 + rk[None, :] < K)
            bm = (rn[None, :] < N) & (k0 + rk[:, None] < K)
            x = tl.load(a + rm[:, None] * K + k0 + rk[None, :], mask=am, other=0)
            y = tl.load(b + rn[None, :] * K + k0 + rk[:, None], mask=bm, other=0)
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))

    return kernel


def build(outdir: str | Path) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = int8_matmul_kernel()
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    d16 = [["tt.divisibility", 16]]
    meta = []
    for bm, bn, bk, st, nw in CONFIGS:
        src = ASTSource(fn=kernel, signature={"a": "*i8", "b": "*i8", "c": "*i32", "M": "i32", "N": "i32", "K": "i32",
                                              "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"},
                        constexprs={"BM": bm, "BN": bn, "BK": bk},
                        attrs={(0,): d16, (1,): d16, (2,): d16, (4,): d16, (5,): d16})
        k = triton.compile(src, target=GPUTarget("cuda", 80, 32), options={"num_warps": nw, "num_stages": st})
        ptx = k.asm["ptx"]
        assert "mma.sync" in ptx and "wgmma" not in ptx
        name = f"tt_{bm}x{bn}x{bk}_s{st}_w{nw}"
        (out / f"{name}.ptx").write_text(ptx)
        meta.append({"name": name, "entry": k.name, "bm": bm, "bn": bn, "bk": bk, "stages": st, "warps": nw,
                     "shared": k.metadata.shared, "triton": triton.__version__})
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


class Sm80Matmul:
    """Loads the built PTX into the current context; ``run(cfg_index, a, b_nk, c, stream)`` (torch int8
    tensors, c int32) launches one config; ``tune(...)`` picks the fastest per shape with ``timer``."""

    def __init__(self, ptxdir: str | Path):
        from cuda.bindings import driver as cu

        from edgesdk.kernels import _cuda

        self.cu, self._cuda = cu, _cuda
        self.meta = json.loads((Path(ptxdir) / "meta.json").read_text())
        self.fns = {}
        self.dir = Path(ptxdir)
        self.best: dict = {}

    def _fn(self, i):
        ctx = self._cuda.current_context()
        key = (i, ctx)
        if key not in self.fns:
            cu, m = self.cu, self.meta[i]
            mod = self._cuda.check(cu.cuModuleLoadData((self.dir / f"{m['name']}.ptx").read_bytes() + b"\0"))
            f = self._cuda.check(cu.cuModuleGetFunction(mod, m["entry"].encode()))
            k = self._cuda.Kernel(f, m["name"])
            if m["shared"] > 48 * 1024:
                k.set_max_dynamic_smem(m["shared"])
            self.fns[key] = k
        return self.fns[key]

    def run(self, i, a, b_nk, c, stream):
        m_, k_ = a.shape
        n_ = b_nk.shape[0]
        if n_ % 16 or k_ % 16:
            raise ValueError("sm_80 Triton build assumes N and K multiples of 16")
        cfg = self.meta[i]
        grid = (-(-m_ // cfg["bm"]), -(-n_ // cfg["bn"]), 1)
        self._fn(i).launch(grid, (32 * cfg["warps"],),
                           [ctypes.c_void_p(a.data_ptr()), ctypes.c_void_p(b_nk.data_ptr()),
                            ctypes.c_void_p(c.data_ptr()), ctypes.c_int(m_), ctypes.c_int(n_), ctypes.c_int(k_),
                            ctypes.c_void_p(0), ctypes.c_void_p(0)], stream, cfg["shared"])

    def tune(self, key, timer, make_fn):
        """Fastest config for ``key`` (cached): ``make_fn(i)`` returns the timed callable of config i."""
        if key not in self.best:
            ts = {}
            for i in range(len(self.meta)):
                try:
                    ts[i] = timer(make_fn(i))
                except Exception:  # a config that cannot launch here is skipped
                    pass
            self.best[key] = min(ts, key=ts.get)
        return self.best[key]


if __name__ == "__main__":
    build(sys.argv[1])
    print("built", sys.argv[1])
