"""Probe the GPU machine: launcher infra, green context, torch on a green-context stream."""
import ctypes, time, json, os, sys
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np, torch
from edgesdk.kernels import _cuda
from cuda.bindings import driver as cu

out = {}
torch.cuda.init(); torch.zeros(1, device="cuda")
_cuda.init()
out["arch"] = _cuda.current_arch()
t0 = time.time(); k = _cuda.get_kernel("common/selftest.cu", "edgesdk_axpy"); out["compile_s"] = time.time() - t0
n = 1000003
x = torch.randn(n, device="cuda"); y = torch.randn(n, device="cuda"); y0 = y.clone()
s = torch.cuda.current_stream().cuda_stream
k.launch(((n + 255) // 256,), (256,), [ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(x.data_ptr()), ctypes.c_float(2.5), ctypes.c_int(n)], s)
torch.cuda.synchronize()
out["axpy_maxerr"] = float((y - (2.5 * x + y0)).abs().max())
# graph capture of our launch
g = torch.cuda.CUDAGraph(); st = torch.cuda.Stream()
with torch.cuda.stream(st):
    with torch.cuda.graph(g, stream=st):
        k.launch(((n + 255) // 256,), (256,), [ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(x.data_ptr()), ctypes.c_float(1.0), ctypes.c_int(n)], st.cuda_stream)
y1 = y.clone(); g.replay(); torch.cuda.synchronize(); out["graph_ok"] = bool(torch.allclose(y, y1 + x))
spin = _cuda.get_kernel("common/selftest.cu", "edgesdk_ffma_spin")
nsm = torch.cuda.get_device_properties(0).multi_processor_count
o = torch.empty(nsm * 16 * 256, device="cuda")
def tspin(stream_int):
    ev = [cu.cuEventCreate(0)[1] for _ in range(2)]
    args = [ctypes.c_void_p(o.data_ptr()), ctypes.c_float(1.0001), ctypes.c_float(0.5), ctypes.c_int(4096)]
    for _ in range(2): spin.launch((nsm * 16,), (256,), args, stream_int)
    cu.cuEventRecord(ev[0], cu.CUstream(stream_int))
    for _ in range(5): spin.launch((nsm * 16,), (256,), args, stream_int)
    cu.cuEventRecord(ev[1], cu.CUstream(stream_int)); cu.cuEventSynchronize(ev[1])
    return cu.cuEventElapsedTime(ev[0], ev[1])[1] / 5
out["spin_full_ms"] = tspin(s)
prim = _cuda.check(cu.cuCtxGetCurrent())
gctx, gsms = _cuda.green_context(16); out["green_sms"] = gsms
_cuda.check(cu.cuCtxSetCurrent(gctx))
gstream = _cuda.check(cu.cuStreamCreate(1))
spin_g = _cuda.get_kernel("common/selftest.cu", "edgesdk_ffma_spin")
spin = spin_g
out["spin_green_ms"] = tspin(int(gstream))
out["spin_ratio"] = out["spin_green_ms"] / out["spin_full_ms"]
# torch (cuBLAS) on the green stream, torch memory from the primary context
try:
    _cuda.check(cu.cuCtxSetCurrent(prim))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    def tmm(stream):
        with torch.cuda.stream(stream):
            for _ in range(2): a @ a
            e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
            e0.record(); [a @ a for _ in range(5)]; e1.record(); e1.synchronize()
        return e0.elapsed_time(e1) / 5
    out["mm_full_ms"] = tmm(torch.cuda.current_stream())
    ext = torch.cuda.ExternalStream(int(gstream))
    out["mm_green_ms"] = tmm(ext)
    out["mm_ratio"] = out["mm_green_ms"] / out["mm_full_ms"]
except Exception as e:
    out["torch_green_error"] = repr(e)
# our kernel on green ctx reading torch memory
try:
    _cuda.check(cu.cuCtxSetCurrent(gctx))
    kg = _cuda.get_kernel("common/selftest.cu", "edgesdk_axpy")
    y2 = y.clone()
    kg.launch(((n + 255) // 256,), (256,), [ctypes.c_void_p(y.data_ptr()), ctypes.c_void_p(x.data_ptr()), ctypes.c_float(1.0), ctypes.c_int(n)], int(gstream))
    _cuda.check(cu.cuStreamSynchronize(gstream)); _cuda.check(cu.cuCtxSetCurrent(prim))
    out["green_reads_torch_mem"] = bool(torch.allclose(y, y2 + x))
except Exception as e:
    out["green_mem_error"] = repr(e)
print(json.dumps(out, indent=1))
