"""``edgesdk run`` and ``edgesdk bench``: the runtime API (:class:`edgesdk.Engine`) from the shell.

Registered on the main CLI by :func:`register`::

    edgesdk run BUILD --input x.npy [--input name=y.npy | --input inputs.npz] [--output out.npz]
    edgesdk bench BUILD [--batch 8] [--iterations 200] [--cuda-graph] [--json bench.json]

Both take ``--backend tensorrt`` (default) or ``--backend onnxruntime``.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer
from rich.console import Console
from rich.text import Text

from edgesdk.errors import EdgeSDKError
from edgesdk.tables import Fit, Ident, compact_table, key_column, num_column, text_column
from edgesdk.runtime import BACKENDS, Engine, TensorInfo

console = Console()

BuildArg = Annotated[Path, typer.Argument(help="Build folder from `edgesdk build` (or a .plan / .onnx file).")]
BackendOpt = Annotated[str, typer.Option("--backend", help=f"One of: {', '.join(BACKENDS)}.")]
GraphOpt = Annotated[bool, typer.Option("--cuda-graph/--no-cuda-graph",
                                        help="TensorRT: replay the engine as a CUDA graph.")]


def load_inputs(specs: list[str], inputs: list[TensorInfo]) -> dict[str, np.ndarray]:
    """Feeds from ``--input`` values: ``x.npy`` (single-input models), ``name=x.npy``, or ``a.npz``.

    Raises:
        EdgeSDKError: unreadable file, ambiguous or unknown input name.
    """
    names = [t.name for t in inputs]
    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = "", spec
        p = Path(path)
        if not p.is_file():
            raise EdgeSDKError(f"input file {p} does not exist", "pass --input NAME=FILE.npy or FILE.npz")
        try:
            data = np.load(p, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise EdgeSDKError(f"cannot read {p} as .npy/.npz ({e})", "save inputs with numpy.save") from e
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                feeds.update({k: data[k] for k in data.files})
            continue
        if not name:
            if len(names) != 1:
                raise EdgeSDKError(f"the model has inputs {names}; {p} does not say which it is",
                                   "pass --input NAME=FILE.npy for each input")
            name = names[0]
        feeds[name] = data
    return feeds


def random_inputs(inputs: list[TensorInfo], batch: int = 1, shapes: dict[str, tuple] | None = None,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random feeds: dynamic leading dims → ``batch``; other dynamic dims from ``shapes``.

    Raises:
        EdgeSDKError: an input has a dynamic dimension that neither rule fixes.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in inputs:
        shape = tuple(shapes[t.name]) if shapes and t.name in shapes else tuple(
            batch if (d < 0 and i == 0) else d for i, d in enumerate(t.shape))
        if any(d < 0 for d in shape):
            raise EdgeSDKError(f"input {t.name!r} has dynamic dims {t.shape}",
                               f"pass --shape {t.name}=" + "x".join("N" for _ in t.shape))
        if t.dtype.kind == "f":
            feeds[t.name] = rng.standard_normal(shape).astype(t.dtype)
        elif t.dtype.kind == "b":
            feeds[t.name] = rng.random(shape) < 0.5
        else:
            feeds[t.name] = rng.integers(0, 10, size=shape).astype(t.dtype)
    return feeds


def benchmark(engine: Engine, feeds: dict, warmup: int = 10, iterations: int = 100) -> dict:
    """Time ``engine.infer(feeds)`` end to end (host arrays in, host arrays out).

    Returns:
        dict: ``latency_ms`` (p50, p90, p99, mean, min, max), ``throughput`` (inferences/s and
        samples/s, samples = the leading dim of the first input), ``iterations``.
    """
    if iterations < 1 or warmup < 0:
        raise EdgeSDKError(f"iterations={iterations}, warmup={warmup}", "use iterations >= 1, warmup >= 0")
    for _ in range(warmup):
        engine.infer(feeds)
    times = []
    t_all = time.perf_counter()
    for _ in range(iterations):
        t0 = time.perf_counter()
        engine.infer(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    total = time.perf_counter() - t_all
    first = next(iter(feeds.values()))
    samples = int(np.shape(first)[0]) if np.ndim(first) else 1
    q = np.percentile(times, [50, 90, 99])
    return {
        "latency_ms": {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
                       "mean": statistics.fmean(times), "min": min(times), "max": max(times)},
        "throughput": {"inferences_per_s": iterations / total, "samples_per_s": samples * iterations / total},
        "iterations": iterations, "warmup": warmup, "samples_per_inference": samples,
    }


def _parse_shapes(values: list[str]) -> dict[str, tuple]:
    out = {}
    for v in values:
        name, sep, dims = v.partition("=")
        try:
            out[name] = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            sep = ""
        if not sep or not name:
            raise EdgeSDKError(f"--shape {v!r} is not NAME=DxDxD", "e.g. --shape pixels=8x1x8x8")
    return out


# the runtime's messages name Engine's arguments; on the command line the same choices are flags
_CLI_WORDS = [(re.compile(r"Engine\((?:path|\.\.\.), backend='onnxruntime'\)|backend='onnxruntime'"), "--backend onnxruntime"),
              (re.compile(r"cuda_graph=True"), "--cuda-graph"), (re.compile(r"drop cuda_graph"), "drop --cuda-graph")]


def cli_words(text: str) -> str:
    for pattern, flag in _CLI_WORDS:
        text = pattern.sub(flag, text)
    return text


def _fail(e: EdgeSDKError):
    console.print(Text.assemble(("error:", "red"), " ", cli_words(e.problem)))
    if e.fix:
        console.print(Text.assemble("  ", ("fix:", "bold"), " ", cli_words(e.fix)))
    raise typer.Exit(1)


def run(build: BuildArg,
        input: Annotated[list[str], typer.Option("--input", "-i", help="FILE.npy, NAME=FILE.npy or FILE.npz (repeatable).")],
        output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Save outputs to this .npz.")] = None,
        backend: BackendOpt = "tensorrt", cuda_graph: GraphOpt = False) -> None:
    """Run a build once on the given inputs and summarize (or save) the outputs."""
    try:
        with Engine(build, backend=backend, cuda_graph=cuda_graph) as engine:
            outs = engine.infer(load_inputs(input, engine.inputs))
    except EdgeSDKError as e:
        _fail(e)
    table = compact_table()
    key_column(table, "output", list(outs))
    for c in ("shape", "dtype", "min", "max", "mean"):
        num_column(table, c, justify="left" if c in ("shape", "dtype") else "right")
    text_column(table, "argmax\n(last dim)")
    for name, y in outs.items():
        finite = y.size and np.issubdtype(y.dtype, np.number)
        stats = [f"{float(f(y)):.5g}" if finite else "-" for f in (np.min, np.max, np.mean)]
        arg = str(np.argmax(y, axis=-1).reshape(-1)[:16].tolist()) if finite and y.ndim >= 1 else "-"
        table.add_row(Ident(name), str(tuple(y.shape)), str(y.dtype), *stats, arg)
    console.print(Fit(table))
    if output is not None:
        output = output if output.suffix == ".npz" else output.with_suffix(".npz")
        tmp = output.with_name(f".{output.stem}.tmp{os.getpid()}.npz")
        np.savez(tmp, **outs)
        os.replace(tmp, output)
        console.print(Text(f"saved {output}"))


def bench(build: BuildArg, backend: BackendOpt = "tensorrt", cuda_graph: GraphOpt = False,
          batch: Annotated[int, typer.Option(help="Size of a dynamic leading (batch) dim.")] = 1,
          shape: Annotated[Optional[list[str]], typer.Option(help="NAME=DxDxD for inputs with other dynamic dims.")] = None,
          warmup: Annotated[int, typer.Option(help="Untimed runs first.")] = 10,
          iterations: Annotated[int, typer.Option(help="Timed runs.")] = 100,
          json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the results here.")] = None,
          seed: int = 0) -> None:
    """Latency percentiles (p50/p90/p99) and throughput of a build on random inputs."""
    try:
        with Engine(build, backend=backend, cuda_graph=cuda_graph) as engine:
            feeds = random_inputs(engine.inputs, batch, _parse_shapes(shape or []), seed)
            res = benchmark(engine, feeds, warmup, iterations)
    except EdgeSDKError as e:
        _fail(e)
    res.update(build=str(build), backend=backend, cuda_graph=cuda_graph,
               inputs={k: list(v.shape) for k, v in feeds.items()})
    lat, thr = res["latency_ms"], res["throughput"]
    table = compact_table()
    num_column(table, "backend", justify="left")
    for c in ("p50 ms", "p90 ms", "p99 ms", "mean ms", "inferences/s", "samples/s"):
        num_column(table, c)
    table.add_row(backend + (" +graph" if cuda_graph else ""), *(f"{lat[k]:.3f}" for k in ("p50", "p90", "p99", "mean")),
                  f"{thr['inferences_per_s']:.1f}", f"{thr['samples_per_s']:.1f}")
    console.print(table)
    if json_path is not None:
        tmp = json_path.with_name(f".{json_path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(res, indent=2))
        os.replace(tmp, json_path)


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``bench`` to the main ``edgesdk`` app."""
    app.command("run")(run)
    app.command("bench")(bench)
