"""Run the TensorRT plugins' launch path on a GPU without TensorRT, against the numpy reference.

For every plugin node of the given rewritten ONNX model(s) (``EdgeBitmapLinear``,
``EdgeVitBitGemm``), this does what TensorRT does around a plugin's ``enqueue``: the attributes go
through the plugin-field round trip, the weight tensors are copied to device memory allocated with
``cuMemAlloc``, a raw stream comes from ``cuStreamCreate``, and
:func:`edgesdk.trt._logic.enqueue` (the very function ``IPluginV3.enqueue`` calls) is called with
raw pointers, the raw stream handle and each tactic from ``get_valid_tactics``. Outputs are
poisoned (NaN) before each launch and compared with the numpy reference. It also captures one
launch per layer in a CUDA graph (global capture mode: any sync or allocation would fail it),
times graph replays per tactic, and round-trips the runtime's pinned and mapped host buffers.

    python tools/plugin_launch_check.py BUILD/model.onnx [...] --json out.json

The JSON carries the device, date and commit, one row per launch with ``--with-rows``, and per (build
folder, operator, X dtype, M) a group: launches, worst error, and the medians over the group's layers of the GPU time
with the default tactic (what TensorRT's 0 resolves to) and with each layer's best tactic.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _plugin_ref import compare, plugin_layers  # noqa: E402

from edgesdk.kernels._cuda import _driver, check, current_arch, init  # noqa: E402
from edgesdk.trt import _logic  # noqa: E402

cu = _driver()


class Dev:
    """A device allocation (freed on close)."""

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self.ptr = check(cu.cuMemAlloc(self.nbytes))

    def __int__(self):
        return int(self.ptr)

    def upload(self, a: np.ndarray) -> "Dev":
        a = np.ascontiguousarray(a)
        if a.nbytes:
            check(cu.cuMemcpyHtoD(self.ptr, a.ctypes.data, a.nbytes))
        return self

    def download(self, shape, dtype) -> np.ndarray:
        out = np.empty(shape, dtype)
        check(cu.cuMemcpyDtoH(out.ctypes.data, self.ptr, out.nbytes))
        return out

    def poison(self) -> None:
        check(cu.cuMemsetD8(self.ptr, 0xFF, self.nbytes))  # all-ones = NaN in fp16 and fp32

    def free(self) -> None:
        check(cu.cuMemFree(self.ptr))


def x_dims(m: int, k: int) -> tuple[int, ...]:
    """Rank 2 for one row, else rank 3 [batch, tokens, K] (TensorRT hands X's full dims)."""
    if m == 1:
        return (1, k)
    return (m // 17, 17, k) if m % 17 == 0 else (1, m, k)


def make_x(layer, dims, dtype, rng) -> np.ndarray:
    if np.dtype(dtype) == np.int8:  # an already quantized X (a VitBit node reading the QuantizeLinear output)
        x = rng.integers(-128, 128, dims).astype(np.int8)
        x.reshape(-1)[:2] = [-128, 127]
        return x
    x = rng.standard_normal(dims)
    if layer.op == "vitbit_gemm":  # spread over the int8 grid, with some clipping at ±127
        x = x * float(layer.attrs["x_scale"]) * 45
    return x.astype(dtype)


def check_layer(layer, ms, stream, rng, timing_reps: int) -> list[dict]:
    spec = _logic.spec_for(layer.op)
    weights = [Dev(t.nbytes).upload(t) for t in layer.tensors.values()]
    rows = []
    # every X dtype the node accepts (fp16 and fp32, or, for a VitBit node reading the QuantizeLinear output,
    # int8 and its y_dtype); timing and the graph check on the X the deployed graph feeds (int8, else fp16)
    x_dtypes = [np.dtype(d) for d in _logic.input_dtypes_allowed(spec, 0, layer.attrs)]
    main = np.dtype(np.int8) if np.dtype(np.int8) in x_dtypes else np.dtype(np.float16)
    try:
        for dtype in x_dtypes:
            y_dtype = np.dtype(_logic.output_dtype(spec, [dtype.name], layer.attrs))
            for m in ms:
                dims = x_dims(m, layer.k)
                x = make_x(layer, dims, dtype, rng)
                xd, yd = Dev(x.nbytes).upload(x), Dev(m * layer.n * y_dtype.itemsize)
                ws_bytes = _logic.workspace_bytes(spec, layer.attrs, m)
                ws = Dev(ws_bytes) if ws_bytes else None
                inputs = [int(xd), *(int(w) for w in weights)]
                for tactic in _logic.tactics(spec, layer.attrs, m):
                    yd.poison()
                    _logic.enqueue(spec, layer.attrs, np.dtype(dtype).name, dims, inputs, [int(yd)],
                                   int(ws) if ws else 0, int(stream), tactic)
                    check(cu.cuStreamSynchronize(stream))
                    y = yd.download((*dims[:-1], layer.n), y_dtype)
                    ok, err, rule = compare(layer, x, y)
                    row = {"layer": layer.name, "op": layer.op, "x_dtype": np.dtype(dtype).name, "m": m,
                           "n": layer.n, "k": layer.k, "tactic": tactic, "ok": ok, "max_abs_err": err,
                           "rule": rule}
                    if timing_reps and dtype == main:
                        row.update(_time(spec, layer, dims, dtype, inputs, yd, ws, stream, tactic, timing_reps))
                    rows.append(row)
                if dtype == main and m == max(ms):
                    rows.append(_graph_check(spec, layer, dims, dtype, x, inputs, yd, ws, stream, y_dtype))
                for d in (xd, yd, ws):
                    if d is not None:
                        d.free()
    finally:
        for w in weights:
            w.free()
    return rows


def _capture(fn, stream, mode):
    check(cu.cuStreamBeginCapture(stream, mode))
    try:
        fn()
    finally:
        graph = check(cu.cuStreamEndCapture(stream))
    exe = check(cu.cuGraphInstantiate(graph, 0))
    check(cu.cuGraphDestroy(graph))
    return exe


def _graph_check(spec, layer, dims, dtype, x, inputs, yd, ws, stream, y_dtype=None) -> dict:
    """Capture one default-tactic enqueue in global mode (a sync/alloc inside would fail), replay it."""
    mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
    exe = _capture(lambda: _logic.enqueue(spec, layer.attrs, np.dtype(dtype).name, dims, inputs, [int(yd)],
                                          int(ws) if ws else 0, int(stream), 0), stream, mode)
    yd.poison()
    check(cu.cuGraphLaunch(exe, stream))
    check(cu.cuStreamSynchronize(stream))
    check(cu.cuGraphExecDestroy(exe))
    ok, err, rule = compare(layer, x, yd.download((*dims[:-1], layer.n), y_dtype or dtype))
    return {"layer": layer.name, "op": layer.op, "x_dtype": np.dtype(dtype).name, "m": int(np.prod(dims[:-1])),
            "n": layer.n, "k": layer.k, "tactic": "graph(default)", "ok": ok, "max_abs_err": err, "rule": rule}


def _time(spec, layer, dims, dtype, inputs, yd, ws, stream, tactic, reps) -> dict:
    """GPU µs per launch (median of graph replays of ``reps`` launches) and host µs per enqueue call."""
    def launch():
        _logic.enqueue(spec, layer.attrs, np.dtype(dtype).name, dims, inputs, [int(yd)],
                       int(ws) if ws else 0, int(stream), tactic)

    t0 = time.perf_counter()
    for _ in range(reps):
        launch()
    host_us = (time.perf_counter() - t0) / reps * 1e6
    check(cu.cuStreamSynchronize(stream))
    exe = _capture(lambda: [launch() for _ in range(reps)], stream,
                   cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
    start, end = (check(cu.cuEventCreate(0)) for _ in range(2))
    samples = []
    for _ in range(7):
        check(cu.cuEventRecord(start, stream))
        check(cu.cuGraphLaunch(exe, stream))
        check(cu.cuEventRecord(end, stream))
        check(cu.cuEventSynchronize(end))
        samples.append(check(cu.cuEventElapsedTime(start, end)) * 1e3 / reps)
    for e in (start, end):
        check(cu.cuEventDestroy(e))
    check(cu.cuGraphExecDestroy(exe))
    return {"gpu_us": statistics.median(samples[1:]), "host_enqueue_us": host_us}


def check_runtime_buffers() -> list[dict]:
    """The runtime's pinned (discrete GPU) and mapped (Jetson) host buffers round-trip through the GPU."""
    from edgesdk.runtime import _Buffer

    rows, rng = [], np.random.default_rng(3)
    stream = check(cu.cuStreamCreate(1))
    for mapped in (False, True):
        buf, dst = _Buffer(cu, mapped), None
        try:
            data = rng.integers(0, 256, 4099, dtype=np.uint8)
            buf.ensure(data.nbytes)
            buf.view[: data.nbytes] = data
            if not mapped:
                check(cu.cuMemcpyHtoDAsync(cu.CUdeviceptr(buf.device), buf.host, data.nbytes, stream))
            dst = Dev(data.nbytes)
            check(cu.cuMemcpyDtoDAsync(dst.ptr, cu.CUdeviceptr(buf.device), data.nbytes, stream))
            check(cu.cuStreamSynchronize(stream))
            back = dst.download(data.shape, np.uint8)
            buf.ensure(10**6)  # growth reallocates
            rows.append({"check": f"runtime _Buffer mapped={mapped}", "ok": bool(np.array_equal(back, data))
                         and buf.capacity >= 10**6})
        finally:
            buf.free()
            if dst is not None:
                dst.free()
    check(cu.cuStreamDestroy(stream))
    return rows


def group_rows(rows: list[dict]) -> list[dict]:
    """One summary per (build, op, X dtype, M): launches, worst error, GPU µs medians over layers.

    ``gpu_us_default`` is the launcher's default tactic (what tactic 0 resolves to: TensorRT picked
    no custom tactic);
    ``gpu_us_best`` is each layer's fastest tactic; both are medians over the group's layers.
    """
    keyed: dict[tuple, list[dict]] = {}
    for r in rows:
        keyed.setdefault((r.get("build", ""), r["op"], r["x_dtype"], r["m"]), []).append(r)
    out = []
    for (build, op, dtype, m), rs in keyed.items():
        layers = sorted({r["layer"] for r in rs})
        g = {"build": build, "op": op, "x_dtype": dtype, "m": m, "layers": len(layers), "launches": len(rs),
             "all_ok": all(r["ok"] for r in rs), "max_abs_err": max(r["max_abs_err"] for r in rs),
             "rules": sorted({str(r["rule"]) for r in rs})}
        timed = [r for r in rs if "gpu_us" in r]
        if timed:
            default = [r["gpu_us"] for r in timed if r["tactic"] == _logic.resolve_tactic(0)]
            best = [min(r["gpu_us"] for r in timed if r["layer"] == name) for name in layers
                    if any(r["layer"] == name for r in timed)]
            g["gpu_us_default_median_over_layers"] = statistics.median(default) if default else None
            g["gpu_us_best_median_over_layers"] = statistics.median(best)
            g["host_us_per_enqueue_median"] = statistics.median(r["host_enqueue_us"] for r in timed)
        out.append(g)
    return out


def run_meta() -> dict:
    """Device (driver name and version), UTC date and commit of this run."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from _common import git_commit

    dev = check(cu.cuCtxGetDevice())
    raw = check(cu.cuDeviceGetName(256, dev))
    name = raw.split(b"\0", 1)[0].decode() if isinstance(raw, bytes) else str(raw)
    sms = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    driver = check(cu.cuDriverGetVersion())
    return {"device": f"{name} ({sms} SMs, CUDA driver API {driver // 1000}.{driver % 1000 // 10})",
            "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "commit": git_commit()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", type=Path, help="rewritten ONNX models with plugin nodes")
    ap.add_argument("--m", default="1,17,136", help="rows M to test (comma-separated)")
    ap.add_argument("--timing-reps", type=int, default=20, help="launches per timed graph (0: no timing)")
    ap.add_argument("--json", type=Path, help="write device, date, commit, summary and groups here")
    ap.add_argument("--with-rows", action="store_true", help="also write every launch's row into --json")
    args = ap.parse_args()
    init()
    arch = current_arch()
    ms = [int(v) for v in args.m.split(",")]
    stream = check(cu.cuStreamCreate(1))  # CU_STREAM_NON_BLOCKING: a raw stream, as TensorRT's
    rng = np.random.default_rng(66)
    rows, seen = [], 0
    for path in args.models:
        layers = plugin_layers(onnx.load(str(path)))
        print(f"{path}: {len(layers)} plugin layers "
              f"({', '.join(sorted({l.op for l in layers}))}) on {arch}", flush=True)
        for layer in layers:
            seen += 1
            rows += [{"build": path.parent.name, **r}
                     for r in check_layer(layer, ms, stream, rng, args.timing_reps)]
    extra = check_runtime_buffers()
    check(cu.cuStreamDestroy(stream))
    bad = [r for r in rows + extra if not r["ok"]]
    print(f"{'layer':40s} {'dtype':8s} {'m':>5s} {'tactic':>14s} {'ok':>3s} {'max_err':>9s} {'gpu_us':>8s} {'host_us':>8s}")
    for r in rows:
        print(f"{r['layer'][-40:]:40s} {r['x_dtype']:8s} {r['m']:5d} {str(r['tactic']):>14s} "
              f"{'ok' if r['ok'] else 'BAD':>3s} {r['max_abs_err']:9.2e} "
              f"{r.get('gpu_us', float('nan')):8.2f} {r.get('host_enqueue_us', float('nan')):8.2f}")
    for r in extra:
        print(f"{r['check']}: {'ok' if r['ok'] else 'BAD'}")
    summary = {"arch": arch, "layers": seen, "launches": len(rows), "failed": len(bad)}
    print(json.dumps(summary))
    if args.json:
        doc = {"name": "trt_launch_path", **run_meta(), "tool": "tools/plugin_launch_check.py "
               + " ".join(str(p) for p in args.models), "summary": summary,
               "graph_capture": {"layers": sum(r["tactic"] == "graph(default)" for r in rows),
                                 "all_ok": all(r["ok"] for r in rows if r["tactic"] == "graph(default)")},
               "runtime_buffers": extra, "groups": group_rows(rows)}
        if args.with_rows:
            doc["rows"] = rows
        tmp = args.json.with_name(args.json.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(args.json)
    if seen == 0:
        print("no plugin layers found", file=sys.stderr)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
