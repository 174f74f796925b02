"""The ``edgesdk`` command line (typer + rich).

Commands: ``build``, ``inspect``, ``check``, ``devices``, ``pack``, and those other modules add
through a ``register(app)`` function listed in :data:`EXTENSIONS` (``run``, ``bench``, ``generate``, ``perplexity``).
Every failure prints the problem and its fix and exits with code 1; a build or check whose
verification fails exits with code 2.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.padding import Padding
from rich.text import Text

from edgesdk.errors import EdgeSDKError
from edgesdk.tables import Fit, Grid, Ident, compact_table, grouped_notes, key_column, num_column, text_column

app = typer.Typer(
    name="edgesdk",
    help="Deploy INT8-quantized and sparse vision transformers and small LLMs to Jetson Orin through TensorRT.\n\n"
         "Start with `edgesdk inspect MODEL.onnx`, then `edgesdk build MODEL.onnx --device orin -o OUT`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

# Modules that add commands with ``register(app: typer.Typer)``.
EXTENSIONS = ("edgesdk.runtime_cli", "edgesdk.generate_cli")


def fail(e: EdgeSDKError, code: int = 1):
    err_console.print(f"[bold red]error:[/] {escape(e.problem)}", highlight=False, soft_wrap=True)
    if e.fix:
        err_console.print(f"  [bold]fix:[/] {escape(e.fix)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def progress_steps(quiet: bool = False):
    """A ``step(title)`` context-manager factory drawing one rich progress line per pipeline step."""
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f}"),
                        TimeElapsedColumn(), console=err_console, disable=quiet, transient=False)

    @contextlib.contextmanager
    def step(title: str):
        task = progress.add_task(title, total=1)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=max(total, 1))

        yield advance
        progress.update(task, completed=progress.tasks[task].total)

    return progress, step


def _exclude(values: list[str] | None):
    return values or None


@app.command()
def build(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help="ONNX model: float, or already Q/DQ-quantized.")],
    device: Annotated[Optional[str], typer.Option("--device", "-d", help="Target profile (`edgesdk devices`). \\[default: orin]")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Build folder to write. \\[default: out/MODEL_NAME]")] = None,
    force: Annotated[Optional[bool], typer.Option("--force", help="Replace an existing build folder.")] = None,
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML file of build options (keys as below, with _ or -); flags override it.")] = None,
    quantize: Annotated[Optional[str], typer.Option("--quantize", "-q", help="int8 (symmetric Q/DQ on linear layers) | none. \\[default: int8]")] = None,
    calibration: Annotated[Optional[Path], typer.Option("--calibration", help=".npz/.npy, folder of .npy/.npz/images, or .txt of token ids. \\[default: seeded random data]")] = None,
    calibration_count: Annotated[Optional[int], typer.Option("--calibration-count", help="Calibration samples. \\[default: 16]")] = None,
    calibrate_method: Annotated[Optional[str], typer.Option("--calibrate-method", help="minmax | percentile activation ranges. \\[default: minmax]")] = None,
    smooth_quant: Annotated[Optional[float], typer.Option("--smooth-quant", help="SmoothQuant alpha in (0, 1), e.g. 0.75 for SmolLM2: move activation outliers into the weights before INT8. \\[default: off]")] = None,
    shape: Annotated[Optional[list[str]], typer.Option("--shape", help="Shape of an input with dynamic dims, NAME:1x3x224x224 (repeatable); binds the input's dim names, so inputs sharing them need one hint. Build, calibration and verification run at it (TensorRT's opt shape).")] = None,
    min_shape: Annotated[Optional[list[str]], typer.Option("--min-shape", help="TensorRT profile min shape, NAME:1x1 (repeatable, as trtexec --minShapes). \\[default: batch 1, other dims as --shape]")] = None,
    max_shape: Annotated[Optional[list[str]], typer.Option("--max-shape", help="TensorRT profile max shape, NAME:1x512 (repeatable, as trtexec --maxShapes); the build also verifies at min and max. \\[default: batch --max-batch, other dims as --shape]")] = None,
    sparsity: Annotated[Optional[float], typer.Option("--sparsity", help="Fraction of weights to prune in rewritten layers. \\[default: 0]")] = None,
    prune: Annotated[Optional[str], typer.Option("--prune", help="magnitude | wanda. \\[default: wanda]")] = None,
    sparsity_scope: Annotated[Optional[str], typer.Option("--sparsity-scope", help="layer (each layer at --sparsity) | global (one threshold over all rewritten layers). \\[default: layer]")] = None,
    kernels: Annotated[Optional[str], typer.Option("--kernels", help="auto | bitmap | vitbit | none (plain ONNX ops). \\[default: auto]")] = None,
    measure: Annotated[Optional[str], typer.Option("--measure", help="auto | on | off: with --kernels auto, time each plugin candidate (bitmap or VitBit) against the dense layer on this GPU and keep dense where it is faster (auto: only when this GPU is the target device). \\[default: auto]")] = None,
    vitbit_input: Annotated[Optional[str], typer.Option("--vitbit-input", help="int8 | float: EdgeVitBitGemm reads the int8 output of the layer's QuantizeLinear (kept, so TensorRT can fuse it into the producer) or the float activation (quantized inside the plugin). \\[default: int8]")] = None,
    exclude: Annotated[Optional[list[str]], typer.Option("--exclude", help="Regex on layer names to leave alone (repeatable).")] = None,
    include_lm_head: Annotated[Optional[bool], typer.Option("--include-lm-head", help="Also quantize/rewrite an LLM's output head.")] = None,
    atol: Annotated[Optional[float], typer.Option("--atol", help="Verification: mean absolute error bound. \\[default: 0.1]")] = None,
    rtol: Annotated[Optional[float], typer.Option("--rtol", help="Verification: mean relative error bound. \\[default: 0.1]")] = None,
    min_cosine: Annotated[Optional[float], typer.Option("--min-cosine", help="Verification: lowest cosine similarity per output. \\[default: 0.99]")] = None,
    verify: Annotated[Optional[bool], typer.Option("--verify/--no-verify", help="Compare processed vs original on ONNX Runtime. \\[default: verify]")] = None,
    verify_count: Annotated[Optional[int], typer.Option("--verify-count", help="Samples for the verification. \\[default: 4]")] = None,
    workspace_mb: Annotated[Optional[int], typer.Option("--workspace-mb", help="TensorRT workspace. \\[default: the device profile's]")] = None,
    builder_optimization_level: Annotated[Optional[int], typer.Option("--builder-optimization-level", help="TensorRT builder optimization level 0-5 (as trtexec). \\[default: 3]")] = None,
    timing_cache: Annotated[Optional[Path], typer.Option("--timing-cache-file", help="TensorRT timing cache, reused across builds (as trtexec). \\[default: ~/.cache/edgesdk/trt/timing-<trt>-sm<XY>-<SMs>sm-edgesdk<version>.cache]")] = None,
    dla_core: Annotated[Optional[int], typer.Option("--use-dla-core", help="Build for this DLA core, GPU fallback on (as trtexec --useDLACore --allowGPUFallback). \\[default: GPU only]")] = None,
    max_batch: Annotated[Optional[int], typer.Option("--max-batch", help="Largest batch of the TensorRT optimization profile when the batch dim is dynamic. \\[default: 8]")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed of random inputs. \\[default: 0]")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars or summary.")] = False,
):
    """Quantize, rewrite and verify MODEL for a device; write OUT/ with model.onnx, report.json, manifest.json.

    \b
    Examples:
      edgesdk build models/digits_vit.onnx --device orin -o out/digits --calibration calibration/digits.npz
      edgesdk build vit_b16.onnx --shape input:1x3x224x224 --calibration images/ --exclude 'head'
      edgesdk build llm.onnx --shape input_ids:1x128 --calibration tokens.txt --kernels none
      edgesdk build decoder_with_past.onnx --shape input_ids:1x1 --shape past_key_values.0.key:1x3x127x64 \\
          --min-shape past_key_values.0.key:1x3x0x64 --max-shape past_key_values.0.key:1x3x2047x64
    """
    from edgesdk.build import build as run_build
    from edgesdk.config import load_config
    from edgesdk.report import print_summary

    flags = dict(device=device, output=output, force=force, quantize=quantize, calibration=calibration,
                 calibration_count=calibration_count, calibrate_method=calibrate_method, smooth_quant=smooth_quant, shape_hints=shape or None,
                 min_shapes=min_shape or None, max_shapes=max_shape or None,
                 sparsity=sparsity, prune=prune, sparsity_scope=sparsity_scope, kernels=kernels, measure=measure, vitbit_input=vitbit_input,
                 exclude=_exclude(exclude), include_lm_head=include_lm_head, atol=atol, rtol=rtol, min_cosine=min_cosine, verify=verify,
                 verify_count=verify_count, workspace_mb=workspace_mb, seed=seed,
                 builder_optimization_level=builder_optimization_level, timing_cache=timing_cache,
                 dla_core=dla_core, max_batch=max_batch)
    try:
        cfg = load_config(config, flags)
        progress, step = progress_steps(quiet)
        with progress:
            report = run_build(model, cfg, step)
    except EdgeSDKError as e:
        fail(e)
    if not quiet:
        print_summary(report, console)
    if report["verified"] is False:
        verification_failed(report["verify"], build_dir=report["output"], layers=report["layers"])


@app.command("inspect")
def inspect_cmd(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help="ONNX model to inspect.")],
    exclude: Annotated[Optional[list[str]], typer.Option("--exclude", help="Regex on layer names (as for build).")] = None,
    include_lm_head: Annotated[bool, typer.Option("--include-lm-head", help="As for build.")] = False,
    device: Annotated[str, typer.Option("--device", "-d", help="Target profile for the kernel preview (as for build).")] = "orin",
    quantize: Annotated[str, typer.Option("--quantize", "-q", help="int8 | none, as for build.")] = "int8",
    sparsity: Annotated[float, typer.Option("--sparsity", help="Planned pruned fraction, as for build.")] = 0.0,
    kernels: Annotated[str, typer.Option("--kernels", help="auto | bitmap | vitbit | none, as for build.")] = "auto",
    shape: Annotated[Optional[list[str]], typer.Option("--shape", help="Shape of an input with dynamic dims, as for build (rows per call of the preview).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
):
    """List MODEL's inputs, outputs and linear layers: shapes, quantization state, what build would process,
    and which kernel build would pick for each (a preview: the build's report.json is authoritative)."""
    from edgesdk.build import io_info
    from edgesdk.devices import get_profile
    from edgesdk.inspect import find_linears, quant_state
    from edgesdk.config import parse_shape
    from edgesdk.onnx_io import load_model, opset, shape_ranges
    from edgesdk.quantize import select_layers
    from edgesdk.rewrite import plan_kernels

    try:
        if quantize not in ("int8", "none"):
            raise EdgeSDKError(f"unknown --quantize {quantize!r}", "use int8 or none")
        if not 0.0 <= sparsity < 1.0:
            raise EdgeSDKError(f"--sparsity {sparsity} is outside [0, 1)", "give the pruned fraction, e.g. 0.5")
        hints = dict(parse_shape(h) for h in shape or [])
        m = load_model(model)
        if hints:
            shape_ranges(m, hints)  # a hint that does not fit the model fails here, as in build
        passed_over: dict[str, str] = {}
        linears = find_linears(m, passed_over)
        chosen, skipped = select_layers(m, linears, exclude or [], include_lm_head)
        # a model already in Q/DQ form is built as it is (edgesdk.build.quantize_step): nothing more is quantized
        plan = plan_kernels(m, linears, {li.name for li in chosen}, kernels, sparsity,
                            quantize == "int8" and quant_state(m) != "qdq", get_profile(device), hints)
    except EdgeSDKError as e:
        fail(e)
    state = quant_state(m)
    plugins: dict[str, int] = {}
    for n in m.graph.node:
        if n.domain == "edgesdk":
            plugins[n.op_type] = plugins.get(n.op_type, 0) + 1
    info = {"model": str(model), "opset": opset(m), "quant_state": state, **io_info(m), "plugin_nodes": plugins,
            "passed_over": passed_over,
            "preview": {"device": device, "quantize": quantize, "sparsity": sparsity, "kernels": kernels,
                        "shapes": hints},
            "linears": [{**li.to_dict(), "selected": li.name not in skipped, "reason": skipped.get(li.name),
                         **({"rows_per_call": plan[li.name]["rows_per_call"], "kernel": plan[li.name]["kernel"],
                             "kernel_reason": plan[li.name]["reason"]} if li.name in plan else {})}
                        for li in linears]}
    if as_json:
        print(json.dumps(info, indent=2))
        return
    console.print(f"[bold]{escape(str(model))}[/]: opset {info['opset']}, {state}, {len(linears)} linear layers")
    if plugins:  # a build's output: its rewritten linears are plugin nodes, not MatMul/Gemm
        said = ", ".join(f"{k} {v}" for k, v in sorted(plugins.items()))
        console.print(Text(f"an edgesdk build: plugin nodes {said} (their layers: the build's report.json); "
                           "inspect the original model to preview a build"), soft_wrap=True)
    io = compact_table("Inputs / outputs")
    rows = [(kind[:-1], t["name"], t["dtype"], str(t["shape"])) for kind in ("inputs", "outputs") for t in info[kind]]
    num_column(io, "", justify="left")
    key_column(io, "name", [r[1] for r in rows])
    num_column(io, "dtype", justify="left")
    text_column(io, "shape")
    for r in rows:
        io.add_row(r[0], Ident(r[1]), *r[2:])
    console.print(Fit(io, keys=(1,)))
    t = Grid("Linear layers")
    t.key("layer")
    for c in ("op", "K×N", "weight", "bias", "int8", "act\nscale"):
        t.num(c, justify="right" if c == "K×N" else "left", shared=c != "K×N")
    t.text("build would")
    t.num("M")
    t.num(f"kernel\n({kernels})", justify="left", shared=False)
    for li in linears:
        p = plan.get(li.name)
        if skipped.get(li.name):
            would = skipped[li.name]
        elif p is not None and p["kernel"] == "none":  # stays a plain ONNX op for TensorRT's own kernels
            would = "keep (Q/DQ)" if li.quantized else "quantize" if quantize == "int8" else "keep"
        else:
            would = "rewrite (already Q/DQ)" if li.quantized else "quantize + rewrite"
        kern = "–" if p is None else p["kernel"] or "?"
        t.add_row(li.name, li.kind + (" (transA)" if li.trans_a else ""), f"{li.k}×{li.n}",
                  li.weight_layout, "yes" if li.bias else "no", "yes" if li.quantized else "no",
                  "yes" if li.act_scale else "no", would, "–" if p is None else str(p["rows_per_call"] or "?"), kern)
    console.print(t)
    for line in grouped_notes([(name, p["reason"] if p["kernel"] is None else f"no plugin kernel: {p['reason']}")
                               for name, p in plan.items() if p["reason"]],
                              every=len(linears)):
        console.print(Padding(Text(line), (0, 0, 0, 2)))
    for line in grouped_notes([(k, f"not a linear: {v}") for k, v in passed_over.items()]):
        console.print(Padding(Text(line), (0, 0, 0, 2)))  # MatMul/Gemm that build leaves to TensorRT, and why
    shapes = "".join(f" --shape {k}:{'x'.join(map(str, v))}" for k, v in hints.items())
    console.print(f"kernel preview for --device {device} --quantize {quantize} --sparsity {sparsity} "
                  f"--kernels {kernels}{shapes}; `build` writes the final choice to report.json")
    if state == "qoperator":
        err_console.print("[yellow]note:[/] this model is in QOperator form; `build` refuses it (TensorRT needs Q/DQ).")


@app.command()
def check(
    build_dir: Annotated[Path, typer.Argument(metavar="OUT", help="Build folder written by `edgesdk build`.")],
    model: Annotated[Optional[Path], typer.Option("--model", help="Original ONNX, if it moved since the build (a folder of `edgesdk kv-sparsify`: its source build folder).")] = None,
    calibration: Annotated[Optional[Path], typer.Option("--calibration", help="The build's calibration data, if it moved since the build.")] = None,
    atol: Annotated[Optional[float], typer.Option("--atol", help="Override the build's atol.")] = None,
    rtol: Annotated[Optional[float], typer.Option("--rtol", help="Override the build's rtol.")] = None,
    min_cosine: Annotated[Optional[float], typer.Option("--min-cosine", help="Override the build's min cosine.")] = None,
):
    """Re-run the verification of a build folder: file checksums, then original vs processed on ONNX Runtime,
    and its TensorRT engine vs ONNX Runtime where the folder has one and TensorRT is installed."""
    from edgesdk.build import check_build, verified
    from edgesdk.report import print_summary

    try:
        progress, step = progress_steps()
        with progress:
            rows = check_build(build_dir, model, {"atol": atol, "rtol": rtol, "min_cosine": min_cosine}, step,
                               calibration=calibration)
    except EdgeSDKError as e:
        fail(e)
    print_summary({"verify": rows, "layers": []}, console)
    if not any(r.get("against") == "tensorrt" for r in rows):
        console.print(Text("TensorRT engine: not run by check (" + engine_absence(build_dir) + ")"))
    if verified(rows) is False:
        verification_failed(rows)


AGAINST = {"pruned_reference": "pruned dense", "tensorrt": "TensorRT", "kv_emulated": "source, KV pruned alike",
           "source": "source build"}  # what a failing row was compared with, in words


def verification_failed(rows: list[dict], build_dir: str | None = None, layers: list[dict] | None = None,
                        advice: str | None = None):
    """Say which gating comparison failed and why, and the INT8 layers of largest error where they were measured
    (on stderr, even with --quiet), then exit 2. ``advice`` replaces the build's advice (what to try)."""
    import re

    from edgesdk.report import lowest_sqnr

    for v in rows:
        if not v["passed"] and v.get("gate", True):
            against = AGAINST.get(v.get("against"), "original")
            against += f", at the profile's {v['shape']} shape" if v.get("shape") else ""
            err_console.print(Text(f"FAIL {v['output']} (processed vs {against}): "
                                   f"{v.get('why') or v.get('error') or 'see report.json'}"), soft_wrap=True)
    kept = f"the folder {build_dir} is written; " if build_dir else ""
    err_console.print(Text("verification failed: " + kept + (advice or (
        "if this error is acceptable for the model (e.g. LLM logits of ±20), loosen --atol/--rtol/--min-cosine; else "
        "calibrate on more, real samples (--calibration, --calibration-count), keep sensitive layers float "
        "(--exclude), try --smooth-quant, or lower --sparsity."))), soft_wrap=True)
    # INT8 error is what a failed comparison with the original can come from: per failing shape, its worst layers
    failed = {v.get("shape") or "build" for v in rows
              if not v["passed"] and v.get("gate", True) and v.get("against", "original") == "original"}
    parts, names = [], []
    for shape in ("build", "min", "max"):
        low = lowest_sqnr(layers or [], 3, shape) if shape in failed else []
        if low:
            parts.append(f"at the {shape} shape " + ", ".join(f"{n} ({db:.1f} dB)" for n, db in low))
            names += [n for n, _ in low if n not in names]
    if names:
        pattern = "|".join(re.escape(n) for n in names)
        err_console.print(Text("the INT8 layers of largest error (lowest output SQNR, report.json layers[]."
                               f"sqnr_by_shape): {'; '.join(parts)}; to keep them float: --exclude '^({pattern})$'"),
                          soft_wrap=True)
    raise typer.Exit(2)


def engine_absence(build_dir: Path) -> str:
    """Why ``check`` did not run a build folder's engine."""
    from edgesdk.runtime import PLAN_NAME

    if not (build_dir / PLAN_NAME).is_file():
        return f"the folder has no {PLAN_NAME}: it was built without TensorRT"
    return "TensorRT is not installed here"


@app.command()
def devices(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False):
    """List device profiles (Jetson Orin modules, and `host`: this machine's GPU if it has one)."""
    from edgesdk.devices import PROFILES, host_profile

    profiles = list(PROFILES.values())
    host_note = None
    try:
        profiles.append(host_profile())
    except EdgeSDKError as e:
        host_note = e.problem
    if as_json:
        absent = {"host": None, "host_reason": host_note} if host_note else {}  # null says nothing on its own
        print(json.dumps({p.name: p.model_dump() for p in profiles} | absent, indent=2))
        return
    t = compact_table("Device profiles (--device NAME)")
    key_column(t, "name", [p.name for p in profiles])
    text_column(t, "module")
    for c in ("SM", "SMs", "MHz", "GB", "GB/s", "L2\nMB", "DLA", "INT8\nTOPS", "FP16\nTFLOPS", "workspace\nMB"):
        num_column(t, c)
    for p in profiles:
        t.add_row(Ident(p.name), p.description.removeprefix("Jetson "), p.compute_capability, str(p.sm_count),
                  f"{p.gpu_clock_mhz:.0f}", f"{p.memory_gb:g}", f"{p.bandwidth_gbs:g}", f"{p.l2_mb:g}", str(p.dla_cores),
                  f"{p.tensor_int8_tops or '-'}", f"{p.tensor_fp16_tflops or '-'}", str(p.workspace_mb))
    console.print(Fit(t))
    if host_note:
        console.print(f"host: [yellow]{host_note}[/]", highlight=False, soft_wrap=True)


@app.command()
def pack(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help="ONNX model: float, Q/DQ, or a build's model.onnx.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the packed weights.")],
    config: Annotated[Optional[Path], typer.Option("--config", "-c", help="YAML build options.")] = None,
    device: Annotated[Optional[str], typer.Option("--device", "-d", help="Target profile. \\[default: orin]")] = None,
    sparsity: Annotated[Optional[float], typer.Option("--sparsity", help="Fraction of weights to prune. \\[default: 0]")] = None,
    kernels: Annotated[Optional[str], typer.Option("--kernels", help="bitmap | vitbit (needs a Q/DQ model) | auto. \\[default: bitmap]")] = None,
    prune: Annotated[Optional[str], typer.Option("--prune", help="magnitude | wanda (needs --calibration). \\[default: magnitude]")] = None,
    calibration: Annotated[Optional[Path], typer.Option("--calibration", help="Samples for --prune wanda, as for build.")] = None,
    force: Annotated[Optional[bool], typer.Option("--force", help="Replace a folder `edgesdk pack` wrote.")] = None,
):
    """Pack MODEL's linear weights into the plugin formats without building (see `edgesdk.pack`).

    \b
    Examples:
      edgesdk pack models/digits_vit.onnx -o out/digits_pack --sparsity 0.5
      edgesdk pack out/digits/model.onnx -o out/digits_pack --force
    """
    from edgesdk.config import load_config

    try:
        # pack's own defaults (bitmap kernels, magnitude pruning: a float model packs without calibration data)
        # under the YAML file, the flags over both
        cfg = load_config(config, dict(device=device, sparsity=sparsity, kernels=kernels, prune=prune,
                                       calibration=calibration, force=force, output=output),
                          defaults=dict(kernels="bitmap", prune="magnitude"))
        try:
            pack_mod = importlib.import_module("edgesdk.pack")
        except ImportError as e:
            raise EdgeSDKError(f"`edgesdk pack` is unavailable ({e}).", "use `edgesdk build`.") from None
        result = pack_mod.pack_model(model, output, cfg)
    except EdgeSDKError as e:
        fail(e)
    mb = "-" if result["bytes_dense"] is None else f"{result['bytes_dense'] / 1e6:.2f}"
    console.print(Text(f"Packed {result['layers']} linears into {result['output']} "
                       f"({result['skipped']} left alone; {result['output']}/index.json lists each): "
                       f"{result['bytes_packed'] / 1e6:.2f} MB packed, dense {mb} MB."))


@app.command("kernels")
def kernels_cmd(
    arch: Annotated[Optional[str], typer.Option("--arch", help="sm_87 (Orin) | sm_90 | 8.7 ... \\[default: this machine's GPU]")] = None,
    op: Annotated[Optional[list[str]], typer.Option("--op", help="bitmap_linear | vitbit_gemm | sparse_kv (repeatable). \\[default: all]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
):
    """Compile the plugin kernels into the cache (EDGESDK_CACHE, else ~/.cache/edgesdk) ahead of their first use.

    A first build or inference otherwise compiles them on the spot (up to minutes per source on a small CPU); run
    this once on the Jetson, or with --arch sm_87 while building a container image (nvcc or cuda-python's NVRTC
    needed, no GPU; the cache is per compiler version, so compile with the toolkit the image runs).
    """
    import time

    from edgesdk.kernels import _cuda, bitmap_linear, sparse_kv, vitbit_gemm
    from edgesdk.trt.engine import normalize_cc

    try:
        if arch is None:
            if not _cuda.gpu_available():
                raise EdgeSDKError("no GPU here to take the architecture from.",
                                   "pass --arch sm_87 for Jetson Orin (or the GPU's sm_XY).")
            arch = _cuda.current_arch()
        else:
            try:
                cc = normalize_cc(arch)
            except EdgeSDKError:
                cc = None
            if cc is None:
                raise EdgeSDKError(f"--arch {arch!r} is not a compute capability.", "write e.g. --arch sm_87 or 8.7.")
            arch = "sm_" + cc.replace(".", "")
        mods = {"bitmap_linear": bitmap_linear, "vitbit_gemm": vitbit_gemm, "sparse_kv": sparse_kv}
        unknown = sorted(set(op or ()) - set(mods))
        if unknown:
            raise EdgeSDKError(f"--op {unknown[0]!r} is not an operator.", f"use one of {', '.join(mods)}.")
        rows = []
        compiler = _cuda.compiler_id()
        for mod in [mods[o] for o in (op or mods)]:
            src = _cuda.PLUGINS_DIR / mod.SOURCE
            path = _cuda.cubin_path(src, arch)
            cached = path.exists()
            t0 = time.perf_counter()
            try:
                data = _cuda.compile_cubin(src, arch)
            except (ImportError, RuntimeError, OSError) as e:
                raise EdgeSDKError(f"compiling {mod.SOURCE} for {arch} failed: {str(e).strip()[:600]}",
                                   "install the CUDA toolkit (nvcc) or cuda-python (NVRTC) matching the driver"
                                   ) from None
            rows.append({"source": mod.SOURCE, "arch": arch, "compiler": compiler,
                         "state": "cached" if cached else "compiled",
                         "seconds": round(time.perf_counter() - t0, 2), "bytes": len(data), "cubin": str(path)})
    except EdgeSDKError as e:
        fail(e)
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    t = compact_table(f"Plugin kernels for {arch}, {compiler} (cache: {rows[0]['cubin'].rsplit('/', 1)[0]})")
    key_column(t, "source", [r["source"] for r in rows])
    for c in ("state", "s", "KB"):
        num_column(t, c, justify="left" if c == "state" else "right")
    for r in rows:
        t.add_row(Ident(r["source"]), r["state"], f"{r['seconds']:.1f}", f"{r['bytes'] / 1024:.0f}")
    console.print(Fit(t, keys=(0,)))


def _register_extensions() -> None:
    for name in EXTENSIONS:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            if e.name != name:  # the module exists but is broken: say so
                raise
            continue
        mod.register(app)


_register_extensions()


def main() -> None:
    """Console-script entry point. A command line click cannot parse is bad input like any other: exit 1 (click's
    own code for it, 2, means "verification failed" here)."""
    from typer import rich_utils

    # click's base of usage errors (typer vendors click from 0.2x on, so it is found through a public subclass)
    click_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    try:
        rc = app(standalone_mode=False)
    except click_error as e:  # usage errors: unknown option, bad value, missing argument
        rich_utils.rich_format_error(e)
        sys.exit(1)
    except typer.Abort:
        err_console.print("Aborted.")
        sys.exit(1)
    except EdgeSDKError as e:  # raised outside a command's own handler
        err_console.print(f"error: {escape(str(e))}")
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
