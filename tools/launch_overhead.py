"""Host (Python) cost of one plugin launch, measured on any machine with the CUDA driver *stubbed*.

Every ``cuda.bindings.driver`` call the launchers make (``cuCtxGetCurrent``, ``cuModuleLoadData``,
``cuLaunchKernel``, ...) is replaced by a Python function that returns success at once, and
compilation is skipped, so what is timed is only the Python work of ``edgesdk.trt._logic.enqueue``
(the body of the TensorRT plugins' ``enqueue``) and of the launchers: argument checks, plan and
kernel look-ups, argument blocks. The driver's own launch cost (and cuda-python's argument
conversion inside the real bindings) is NOT included: on a GPU, ``tools/plugin_launch_check.py``
reports the real per-call host time.

    python tools/launch_overhead.py [--calls 2000] [--batches 25]

Prints, per case, the median over ``batches`` of the mean µs per call within a batch, and the
number of stubbed ``cuLaunchKernel`` calls per enqueue.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgesdk.kernels import _cuda  # noqa: E402


class StubDriver(types.SimpleNamespace):
    """``cuda.bindings.driver`` with every function the launch path calls answering success at once.

    Types and enums (``CUstream``, ``CUresult``, ...) are the real ones; ``calls`` counts the calls
    per function name; ``on_launch`` (tests) is called with the arguments of every ``cuLaunchKernel``
    while the parameter memory is valid.
    """

    def __init__(self, real, ctx: int = 0x7000, sms: int = 132, on_launch=None):
        super().__init__()
        self._real, self.ctx, self.sms, self.on_launch = real, ctx, sms, on_launch
        self.calls: dict[str, int] = {}
        self._ok = real.CUresult.CUDA_SUCCESS

    def __getattr__(self, name):  # types, enums, anything not stubbed below
        return getattr(self._real, name)

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def cuInit(self, flags):
        self._count("cuInit")
        return (self._ok,)

    def cuCtxGetCurrent(self):
        self._count("cuCtxGetCurrent")
        return self._ok, self._real.CUcontext(self.ctx)

    def cuCtxSetCurrent(self, ctx):
        self._count("cuCtxSetCurrent")
        self.ctx = int(ctx)
        return (self._ok,)

    def cuCtxGetDevice(self):
        self._count("cuCtxGetDevice")
        return self._ok, self._real.CUdevice(0)

    def cuDeviceGet(self, i):
        return self._ok, self._real.CUdevice(i)

    def cuDevicePrimaryCtxRetain(self, dev):
        return self._ok, self._real.CUcontext(0x7000)

    def cuDeviceGetAttribute(self, attr, dev):
        self._count("cuDeviceGetAttribute")
        A = self._real.CUdevice_attribute
        table = {A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: self.sms,
                 A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
                 A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
                 A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: 233472,  # H100: 228 KB
                 A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: 232448}
        return self._ok, table[attr]

    def cuCtxGetDevResource(self, ctx, kind):
        self._count("cuCtxGetDevResource")
        return self._ok, types.SimpleNamespace(sm=types.SimpleNamespace(smCount=self.sms))

    def cuModuleLoadData(self, image):
        self._count("cuModuleLoadData")
        return self._ok, self._real.CUmodule(0x100 + self.calls["cuModuleLoadData"])

    def cuModuleGetFunction(self, mod, name):
        self._count("cuModuleGetFunction")
        return self._ok, self._real.CUfunction(0x10000 + self.calls["cuModuleGetFunction"])

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, fn, threads, smem):
        self._count("cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return self._ok, 2

    def cuFuncGetAttribute(self, attr, fn):
        self._count("cuFuncGetAttribute")
        return self._ok, 0  # no static shared memory

    def cuFuncSetAttribute(self, fn, attr, value):
        self._count("cuFuncSetAttribute")
        return (self._ok,)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self._count("cuLaunchKernel")
        if self.on_launch is not None:
            self.on_launch(f, (gx, gy, gz), (bx, by, bz), smem, stream, params)
        return (self._ok,)


def install_stub(**kw) -> StubDriver:
    """Route ``edgesdk.kernels._cuda`` to a :class:`StubDriver`, with empty caches and no compilation."""
    stub = StubDriver(_cuda._driver(), **kw)
    _cuda._driver = lambda: stub
    _cuda.compile_cubin = lambda *a, **k: b"stub cubin"
    _cuda._modules.clear()
    _cuda._functions.clear()
    _cuda._initialized = False
    return stub


def cases():
    """(label, op, attrs, x_dtype, m, inputs, workspace, tactic) of typical ViT-B layers."""
    bm = {"n": 768, "k": 3072, "value_dtype": "int8", "has_bias": 1, "plugin_version": "1",
          "plugin_namespace": "edgesdk"}
    vb = {"n": 3072, "k": 768, "bits": 8, "has_bias": 1, "gelu": 1, "x_scale": 0.05, "plugin_version": "1",
          "plugin_namespace": "edgesdk"}
    ptr = 0x7F0000000000
    bm_in = [ptr + i * 0x100000 for i in range(6)]
    vb_in = [ptr + i * 0x100000 for i in range(4)]
    return [
        ("bitmap_linear int8 values, M=1 (decode path)", "bitmap_linear", bm, "float16", 1, bm_in, 0, 1),
        ("bitmap_linear int8 values, M=197 (generic path)", "bitmap_linear", bm, "float16", 197, bm_in, 0, 1),
        ("vitbit_gemm 8-bit, M=197, tactic 1 (2 kernels)", "vitbit_gemm", vb, "float16", 197, vb_in, ptr, 1),
        ("vitbit_gemm 8-bit, M=17, tactic 4 split-K (3 kernels)", "vitbit_gemm", vb, "float16", 17, vb_in, ptr, 4),
    ]


def median_us(fn, calls: int, batches: int) -> float:
    """Median over ``batches`` of the mean µs per ``fn()`` in a batch of ``calls`` (after one untimed call, which builds
    the plan and loads the modules)."""
    fn()
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def measure(calls: int, batches: int) -> list[dict]:
    """Median µs per ``_logic.enqueue`` call (and per launcher ``launch`` call) for every case."""
    from edgesdk.trt import _logic

    stub = install_stub()
    out = []
    for label, op, attrs, xd, m, inputs, ws, tactic in cases():
        spec = _logic.spec_for(op)
        dims = (m, attrs["k"])
        outputs = [0x7E0000000000]
        launcher = spec.launcher_module()
        kw = {"workspace": ws} if op == "vitbit_gemm" else {}

        def enqueue():
            _logic.enqueue(spec, attrs, xd, dims, inputs, outputs, ws, 0x5000, tactic)

        def launch():
            launcher.launch(attrs, xd, m, inputs, outputs, 0x5000, tactic, **kw)

        row = {"case": label}
        for what, fn in (("enqueue_us", enqueue), ("launch_us", launch)):
            row[what] = median_us(fn, calls, batches)
        before = stub.calls.get("cuLaunchKernel", 0)
        enqueue()
        row["kernels_per_enqueue"] = stub.calls["cuLaunchKernel"] - before
        out.append(row)
    return out


def measure_sparse_kv(calls: int, batches: int) -> list[dict]:
    """Median µs per call of the sparse KV launcher (``decode_attention``) and of the node's TensorRT ``enqueue``
    (``edgesdk.trt.sparse_kv.enqueue`` = ``run_node``, state aliased) for 1 and 16 new tokens, per step."""
    from edgesdk.formats import sparse_kv as fmt
    from edgesdk.kernels import sparse_kv as ks
    from edgesdk.trt import sparse_kv as tkv

    stub = install_stub()
    cfg = fmt.SparseKVConfig(64, 32, 8, 0.7, 0.7, 4096)  # Llama-3.2-1B-like attention layer
    attrs = fmt.node_attributes(cfg, 0.125)
    p = 0x7F0000000000
    cache = ks.CachePtrs(*(p + i * 0x1000000 for i in range(5)))
    out = []

    def timed(label, fn, per):
        us = median_us(fn, calls, batches) / per
        before = stub.calls.get("cuLaunchKernel", 0)
        fn()
        out.append({"case": label, "launch_us": us, "kernels_per_call": (stub.calls["cuLaunchKernel"] - before) // per})

    timed("sparse_kv decode_attention, B=1, 4096 tokens", lambda: ks.decode_attention(
        cfg, 1, 4096, p, cache, p + 0x10000000, p + 0x20000000, 0x5000), 1)
    for S in (1, 16):
        ins = [p + i * 0x1000000 for i in range(8)]  # q, k, v, 4 state tensors, lengths
        outs = [p + 0x30000000, *ins[3:7]]  # out, the state aliased
        timed(f"sparse_kv node enqueue, B=1, S={S} (per step)", lambda S=S, ins=ins, outs=outs: tkv.enqueue(
            attrs, (1, 32, S, 64), ins, outs, p + 0x20000000, 0x5000), S)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per timed batch")
    ap.add_argument("--batches", type=int, default=25, help="timed batches (the median is reported)")
    args = ap.parse_args()
    rows = measure(args.calls, args.batches)
    print(f"driver STUBBED (host Python cost only; the real driver's launch cost is not included); "
          f"Python {sys.version.split()[0]}; median of {args.batches} batches of {args.calls} calls")
    print(f"{'case':58s} {'enqueue µs':>10s} {'launch µs':>10s} {'kernels':>8s}")
    for r in rows:
        print(f"{r['case']:58s} {r['enqueue_us']:10.2f} {r['launch_us']:10.2f} {r['kernels_per_enqueue']:8d}")
    for r in measure_sparse_kv(args.calls, args.batches):
        print(f"{r['case']:58s} {'':>10s} {r['launch_us']:10.2f} {r['kernels_per_call']:8d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
