"""TensorRT smoke test for edgesdk's plugins: run this first on a machine with TensorRT (the Jetson).

Nothing here has ever run: TensorRT could not be installed where edgesdk was written. This is the
first program to exercise, on a real TensorRT, everything in ``edgesdk/trt`` and the TensorRT side
of ``edgesdk.Engine``. Steps (each printed as it runs, failures do not stop the others):

1. versions: TensorRT, CUDA driver, compute capability; registering the plugin creators.
2. one-layer networks per plugin, per weight variant, for fp16 and fp32 X:
   a. through the ONNX parser (the production path: node attributes → creator fields), with the
      builder choosing the tactic; run with ``edgesdk.Engine`` at batch 1, 2 and 4, and a
      deserialized re-load, against the numpy reference;
   b. through the network API, one engine per tactic (``get_valid_tactics`` restricted to it),
      against the numpy reference.
3. the sparse KV cache node (``EdgeSparseKVAttention``, aliased state): the two-layer test decoder of head_dim 64
   (``tests/data/optimum/llama_d64_past``) rewritten by ``edgesdk kv-sparsify`` at 50 % / 70 %, built for one new
   token per call (batch 1), decoded for 40 tokens by ``edgesdk.generate.Decoder`` on TensorRT against the same
   model on ONNX Runtime (the node's reference op);
4. the bundled demo model (``models/digits_vit.onnx``) built by ``edgesdk build`` with
   ``--kernels bitmap`` and ``--kernels vitbit``, compared through Polygraphy (TensorRT vs ONNX
   Runtime with edgesdk's reference ops, the ``--trt --onnxrt`` comparison) and through
   ``edgesdk.Engine`` (tensorrt with and without CUDA graphs vs onnxruntime).

    python tools/trt_smoke.py [--demo models/digits_vit.onnx] [--skip-demo] [--json smoke.json]

Exit status 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from _plugin_ref import compare, one_layer_model, plugin_layers  # noqa: E402

from edgesdk.errors import EdgeSDKError  # noqa: E402
from edgesdk.trt import _logic  # noqa: E402

TOKENS = 17
RESULTS: list[dict] = []


def record(name: str, ok: bool, **info) -> bool:
    RESULTS.append({"check": name, "ok": bool(ok), **info})
    extra = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items())
    print(f"[{'PASS' if ok else 'FAIL'}] {name} {extra}", flush=True)
    return ok


def guarded(name: str, fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except Exception as e:  # one failing check must not hide the others
        traceback.print_exc()
        record(name, False, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
        return None


def variants(rng):
    """(label, op, packed weights) covering every weight format the plugins take."""
    from edgesdk.formats.bitmap_linear import BitmapLinearWeights
    from edgesdk.formats.vitbit_gemm import VitBitWeights, quantize_weights

    def w(n, k, sparsity):
        a = rng.standard_normal((n, k))
        a[rng.random(a.shape) < sparsity] = 0
        return a

    return [
        ("bitmap fp16 values, bias, 50%", "bitmap_linear",
         BitmapLinearWeights.pack(w(72, 136, 0.5), "float16", bias=rng.standard_normal(72).astype(np.float32))),
        ("bitmap int8 values, 70%", "bitmap_linear", BitmapLinearWeights.pack(w(40, 200, 0.7), "int8")),
        ("vitbit 8-bit, bias, gelu", "vitbit_gemm", VitBitWeights.pack(
            *quantize_weights(w(96, 64, 0)), 8, bias=rng.standard_normal(96), x_scale=0.03, gelu=True)),
        ("vitbit 4-bit", "vitbit_gemm", VitBitWeights.pack(*quantize_weights(w(33, 80, 0), 4), 4, x_scale=0.03)),
    ]


def make_x(op, packed, batch, dtype, rng):
    x = rng.standard_normal((batch, TOKENS, int(packed.node_attributes()["k"])))
    if op == "vitbit_gemm":
        x = x * packed.x_scale * 45
    return x.astype(dtype)


def one_layer_onnx(label, op, packed, dtype, work: Path, rng) -> None:
    """2a: ONNX parser path, builder-chosen tactic, edgesdk.Engine at several batch sizes."""
    from edgesdk.runtime import Engine
    from edgesdk.trt.engine import build_engine

    name = f"{label} / {np.dtype(dtype).name} / onnx"
    k = int(packed.node_attributes()["k"])
    model = one_layer_model(op, packed, dtype, ["batch", TOKENS, k], quantize_x=bool(getattr(packed, "y_dtype", "")))
    folder = work / f"{op}-{abs(hash(name)) % 10**8}"
    folder.mkdir()
    onnx.save(model, folder / "model.onnx")
    (layer,) = plugin_layers(model)
    t0 = time.perf_counter()
    res = build_engine(folder / "model.onnx", folder, SimpleNamespace(workspace_mb=1024),
                       SimpleNamespace(shape_hints={"X": [2, TOKENS, k]}, max_batch=4))
    if not record(f"{name}: build", res["built"], reason=res["reason"], seconds=time.perf_counter() - t0):
        return
    for graph in (False, True):
        with Engine(folder, cuda_graph=graph) as eng:
            for batch in (1, 2, 4):
                x = make_x(op, packed, batch, dtype, rng)
                y = eng.infer({"X": x})["Y"]
                ok, err, rule = compare(layer, x, y)
                record(f"{name}: batch {batch}{' cuda-graph' if graph else ''}", ok, max_abs_err=err, rule=rule)


def one_layer_per_tactic(label, op, packed, dtype, work: Path, rng) -> None:
    """2b: network API, one engine per tactic."""
    import tensorrt as trt

    from edgesdk.runtime import Engine
    from edgesdk.trt.plugins import plugin_classes

    spec = _logic.spec_for(op)
    attrs, tensors = packed.node_attributes(), packed.to_tensors()
    k = int(attrs["k"])
    model = one_layer_model(op, packed, dtype, ["batch", TOKENS, k])
    (layer,) = plugin_layers(model)
    creator = plugin_classes(op)[1]()
    logger = trt.Logger(trt.Logger.WARNING)
    for tactic in _logic.tactics(spec, layer.attrs, 4 * TOKENS):  # the profile's largest M, as the build lists them
        name = f"{label} / {np.dtype(dtype).name} / tactic {tactic}"
        builder = trt.Builder(logger)
        net = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        x_t = net.add_input("X", trt.float16 if dtype == np.float16 else trt.float32, (-1, TOKENS, k))
        consts = [net.add_constant(v.shape, trt.Weights(np.ascontiguousarray(v))).get_output(0)
                  for v in tensors.values()]
        fields = [trt.PluginField(n, d, getattr(trt.PluginFieldType, t))
                  for n, d, t in _logic.encode_fields(spec, layer.attrs)]
        plugin = creator.create_plugin(spec.op_type, trt.PluginFieldCollection(fields), trt.TensorRTPhase.BUILD)
        plugin.forced_tactics = [tactic]
        out = net.add_plugin_v3([x_t, *consts], [], plugin).get_output(0)
        out.name = "Y"
        net.mark_output(out)
        cfg = builder.create_builder_config()
        prof = builder.create_optimization_profile()
        prof.set_shape("X", (1, TOKENS, k), (2, TOKENS, k), (4, TOKENS, k))
        cfg.add_optimization_profile(prof)
        plan = builder.build_serialized_network(net, cfg)
        if not record(f"{name}: build", plan is not None):
            continue
        path = work / f"{op}-t{tactic}-{np.dtype(dtype).name}-{abs(hash(label)) % 10**6}.plan"
        path.write_bytes(bytes(plan))
        with Engine(path) as eng:
            x = make_x(op, packed, 3 if tactic % 2 else 1, dtype, rng)
            ok, err, rule = compare(layer, x, eng.infer({"X": x})["Y"])
            record(f"{name}: run", ok, max_abs_err=err, rule=rule)


def sparse_kv_decode(sparsity: float, work: Path) -> None:
    """3: the sparse KV node through the ONNX parser, decoded step by step, against ONNX Runtime."""
    from edgesdk.generate import Decoder
    from edgesdk.rewrite.sparse_kv import sparsify_kv
    from edgesdk.runtime import Engine
    from edgesdk.trt.engine import build_engine

    name = f"sparse_kv {sparsity:.0%} / decode"
    src = onnx.load(str(ROOT / "tests" / "data" / "optimum" / "llama_d64_past" / "model.onnx"))
    model, _, cfg = sparsify_kv(src, sparsity, capacity=96, window=8, group=8)
    folder = work / f"sparse_kv-{int(sparsity * 100)}"
    folder.mkdir()
    onnx.save(model, folder / "model.onnx")
    hints = {"input_ids": [1, 1], "position_ids": [1, 1], "kv_lengths": [1]}
    for vi in model.graph.input:
        if vi.name.startswith("past_sparse_kv."):
            hints[vi.name] = [1] + [d.dim_value for d in vi.type.tensor_type.shape.dim[1:]]
    t0 = time.perf_counter()
    res = build_engine(folder / "model.onnx", folder, SimpleNamespace(workspace_mb=1024),
                       SimpleNamespace(shape_hints=hints, max_batch=1))
    if not record(f"{name}: build", res["built"], reason=res["reason"], seconds=time.perf_counter() - t0):
        return
    ids = [int(t) for t in np.random.default_rng(7).integers(0, 64, 40)]
    with Engine(folder) as eng:
        got = Decoder(eng).feed(ids, chunk=1)
    with Engine(folder / "model.onnx", backend="onnxruntime") as eng:
        want = Decoder(eng).feed(ids, chunk=1)
    err = float(np.abs(got - want).max())
    record(name, err <= 2e-2 * float(np.abs(want).max()), max_abs_err=err, compressed=cfg.n_compressed(len(ids)))


def sparse_kv_folder(work: Path) -> None:
    """3: `edgesdk kv-sparsify BUILD -o FOLDER` with TensorRT: the engine built from the profile it writes, its
    verification against ONNX Runtime (first and last call's feeds), and a prompt of several tokens per call."""
    from edgesdk.build import build
    from edgesdk.config import BuildConfig
    from edgesdk.generate import Decoder
    from edgesdk.kv_build import kv_build
    from edgesdk.runtime import Engine

    name = "sparse_kv 70% / kv-sparsify folder"
    src = work / "kv-source"
    build(ROOT / "tests" / "data" / "optimum" / "llama_d64_past" / "model.onnx",
          BuildConfig(device="host", output=src, kernels="none", quantize="none", verify=False,
                      shape_hints={"input_ids": [1, 1], "past_key_values.0.key": [1, 2, 15, 64]},
                      min_shapes={"past_key_values.0.key": [1, 2, 0, 64]},
                      max_shapes={"past_key_values.0.key": [1, 2, 95, 64]}))
    report = kv_build(src, work / "kv-70", 0.7, window=8, group=8, max_tokens=8)
    rows = [r for r in report["verify"] if r.get("against") == "tensorrt"]
    if not record(f"{name}: build", report["engine"]["built"], reason=report["engine"]["reason"]):
        return
    record(f"{name}: verified its engine against ONNX Runtime", bool(rows) and all(r["passed"] for r in rows),
           **{f"{r['output']}_{k}": r.get(k) for r in rows for k in ("mean_abs", "cosine", "error")})
    ids = [int(t) for t in np.random.default_rng(8).integers(0, 64, 50)]
    with Engine(work / "kv-70") as eng:
        got = Decoder(eng).feed(ids)  # calls of 8 tokens
    with Engine(work / "kv-70", backend="onnxruntime") as eng:
        want = Decoder(eng).feed(ids, chunk=1)
    err = float(np.abs(got - want).max())
    record(f"{name}: 8 tokens per call vs 1 on ONNX Runtime", err <= 2e-2 * float(np.abs(want).max()),
           max_abs_err=err)


def demo(model_path: Path, work: Path, kernels: str, atol: float, rtol: float, min_cosine: float) -> None:
    """3: the demo model built by edgesdk, TensorRT vs ONNX Runtime (Polygraphy) and via edgesdk.Engine."""
    from polygraphy.backend.onnxrt import OnnxrtRunner
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner
    from polygraphy.comparator import Comparator

    from edgesdk.build import build
    from edgesdk.config import BuildConfig
    from edgesdk.ort import make_session
    from edgesdk.runtime import Engine
    from edgesdk.runtime_cli import random_inputs
    from edgesdk.verify import metrics, simple_compare_func

    out = work / f"demo-{kernels}"
    report = build(model_path, BuildConfig(device="host", output=out, kernels=kernels, sparsity=0.5,
                                           prune="magnitude"))
    ops = sorted({l.op for l in plugin_layers(onnx.load(str(out / "model.onnx")))})
    if not record(f"demo kernels={kernels}: build", report["engine"]["built"], reason=report["engine"]["reason"],
                  plugin_ops=",".join(ops) or "none"):
        return
    engine_rows = [r for r in report["verify"] if r.get("against") == "tensorrt"]
    record(f"demo kernels={kernels}: edgesdk build verified its engine against ONNX Runtime",
           bool(engine_rows) and all(r["passed"] for r in engine_rows),
           **{f"{r['output']}_{k}": r.get(k) for r in engine_rows for k in ("mean_abs", "cosine", "error")})
    with Engine(out, backend="onnxruntime") as cpu:
        feeds = [random_inputs(cpu.inputs, batch=b, seed=s) for s, b in ((1, 1), (2, 2), (3, 1))]
        refs = [cpu.infer(f) for f in feeds]
    runners = [TrtRunner(EngineFromBytes((out / "model.plan").read_bytes()), name="trt"),
               OnnxrtRunner(lambda: make_session(out / "model.onnx"), name="onnxrt")]
    results = Comparator.run(runners, data_loader=feeds)
    acc = Comparator.compare_accuracy(results, compare_func=simple_compare_func(atol, rtol, "mean"))
    record(f"demo kernels={kernels}: polygraphy --trt --onnxrt (mean err atol={atol} rtol={rtol})", bool(acc))
    for graph in (False, True):
        with Engine(out, cuda_graph=graph) as gpu:
            for f, ref in zip(feeds, refs):
                y = gpu.infer(f)
                for name in ref:
                    m = metrics(ref[name], y[name])
                    record(f"demo kernels={kernels}: Engine{' cuda-graph' if graph else ''} {name} "
                           f"batch {next(iter(f.values())).shape[0]}", m["cosine"] >= min_cosine, **m)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", type=Path, default=ROOT / "models" / "digits_vit.onnx")
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--atol", type=float, default=0.05)
    ap.add_argument("--rtol", type=float, default=0.05)
    ap.add_argument("--min-cosine", type=float, default=0.999)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        import tensorrt as trt
    except ImportError:
        print("TensorRT is not installed: this smoke test needs it (JetPack 6.1+ ships TensorRT 10.3).")
        return 2
    from edgesdk.trt.engine import tensorrt_info
    from edgesdk.trt.registry import register_plugins

    info = tensorrt_info()
    print(f"TensorRT {trt.__version__}, CUDA driver {info['cuda']}, compute capability {info['compute_capability']}")
    names = guarded("register plugins", register_plugins)
    if names is not None:
        reg = trt.get_plugin_registry()
        found = [n for n in names if reg.get_creator(n.split("::")[1], _logic.PLUGIN_VERSION,
                                                     _logic.PLUGIN_NAMESPACE) is not None]
        record("register plugins", found == names and len(names) == len(_logic.OPS) + 1,  # + EdgeSparseKVAttention
               creators=",".join(found))
        register_plugins()  # idempotent
    rng = np.random.default_rng(2026)
    with tempfile.TemporaryDirectory(prefix="edgesdk-trt-smoke-") as td:
        work = Path(td)
        for label, op, packed in variants(rng):
            for dtype in (np.float16, np.float32):
                guarded(f"{label} / {np.dtype(dtype).name} / onnx", one_layer_onnx, label, op, packed, dtype, work, rng)
                guarded(f"{label} / {np.dtype(dtype).name} / tactics", one_layer_per_tactic, label, op, packed,
                        dtype, work, rng)
        # the rewrite's default VitBit layout: QuantizeLinear -> plugin reading int8 X (fp32 X, opset 17);
        # does TensorRT accept Q -> plugin(INT8), and does its Q round exactly as the reference's x / x_scale?
        from edgesdk.formats.vitbit_gemm import VitBitWeights, quantize_weights

        p8 = VitBitWeights.pack(*quantize_weights(rng.standard_normal((96, 64))), 8, bias=rng.standard_normal(96),
                                x_scale=0.03, y_dtype="float32")
        guarded("vitbit 8-bit, int8 X (QuantizeLinear in front) / float32 / onnx", one_layer_onnx,
                "vitbit 8-bit, int8 X (QuantizeLinear in front)", "vitbit_gemm", p8, np.float32, work, rng)
        for sparsity in (0.5, 0.7):
            guarded(f"sparse_kv {sparsity:.0%} / decode", sparse_kv_decode, sparsity, work)
        guarded("sparse_kv 70% / kv-sparsify folder", sparse_kv_folder, work)
        if not args.skip_demo:
            if not args.demo.is_file():
                record("demo model", False, error=f"{args.demo} not found (pass --demo or --skip-demo)")
            else:
                for kernels in ("bitmap", "vitbit"):
                    guarded(f"demo kernels={kernels}", demo, args.demo, work, kernels, args.atol, args.rtol,
                            args.min_cosine)
    failed = [r for r in RESULTS if not r["ok"]]
    print(f"\n{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    if args.json:
        args.json.write_text(json.dumps({"tensorrt": trt.__version__, **info, "results": RESULTS}, indent=1,
                                        default=str))
    return 1 if failed or not RESULTS else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except EdgeSDKError as e:
        print(f"error: {e}")
        sys.exit(1)
