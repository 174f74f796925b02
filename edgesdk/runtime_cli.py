"""``edgesdk run`` and ``edgesdk bench``: the runtime API (:class:`edgesdk.Engine`) from the shell.

Registered on the main CLI by :func:`register`::

    edgesdk run BUILD --input x.npy [--input name=y.npy | --input inputs.npz] [--output out.npz]
    edgesdk bench BUILD [--batch 8] [--shape NAME=DxDxD] [--iterations 200] [--cuda-graph] [--json bench.json]

Both take ``--backend tensorrt`` (default) or ``--backend onnxruntime``. Errors go to stderr as
``edgesdk build``'s do (problem + fix, exit 1); output files are written atomically.
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
from edgesdk.runtime import BACKENDS, Engine, TensorInfo, _foreign_errors

console = Console()

BuildArg = Annotated[Path, typer.Argument(help="Build folder from `edgesdk build` (or a .plan / .onnx file).")]
BackendOpt = Annotated[str, typer.Option("--backend", help=f"One of: {', '.join(BACKENDS)}.")]
GraphOpt = Annotated[bool, typer.Option("--cuda-graph/--no-cuda-graph",
                                        help="TensorRT: replay the engine as a CUDA graph.")]


_NPY_MAGIC, _ZIP_MAGIC = b"\x93NUMPY", b"PK"  # how .npy and .npz (zip) files begin
_SAVE_FIX = "save arrays with numpy: np.save('x.npy', x), or np.savez('inputs.npz', NAME=x, ...) for several inputs"


def _read_arrays(p: Path) -> np.ndarray | dict[str, np.ndarray]:
    """The array of an .npy file or the arrays of an .npz file (never unpickles)."""
    try:
        with open(p, "rb") as f:
            magic = f.read(len(_NPY_MAGIC))
    except OSError as e:
        raise EdgeSDKError(f"cannot read input file {p} ({e.strerror or e})", "check that the file is readable") from None
    if not magic.startswith((_NPY_MAGIC, _ZIP_MAGIC)):
        raise EdgeSDKError(f"input file {p} is not a NumPy .npy or .npz file", _SAVE_FIX)
    try:
        data = np.load(p, allow_pickle=False)
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:  # members are read here, so their errors (object arrays, bad zip data) are caught too
                return {k: data[k] for k in data.files}
        return data
    except Exception as e:  # a damaged file fails in many ways (ValueError, EOFError, BadZipFile, zlib.error)
        raise EdgeSDKError(f"cannot read {p} as .npy/.npz ({e})",
                           _SAVE_FIX + " (numeric arrays: no dtype=object)") from None


def load_inputs(specs: list[str], inputs: list[TensorInfo]) -> dict[str, np.ndarray]:
    """Feeds from ``--input`` values: ``x.npy`` (single-input models), ``name=x.npy``, or ``a.npz``.

    Raises:
        EdgeSDKError: missing or unreadable file, not .npy/.npz, ambiguous or unknown input name,
            an input that no file gives.
    """
    names = [t.name for t in inputs]
    feeds: dict[str, np.ndarray] = {}
    source: dict[str, str] = {}  # input name -> where it came from, for the messages
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or Path(spec).is_file():  # a file whose path holds '=' is a file, not NAME=FILE
            name, path = "", spec
        p = Path(path)
        if not p.is_file():
            raise EdgeSDKError(f"input file {p} does not exist", "pass --input NAME=FILE.npy or FILE.npz")
        data = _read_arrays(p)
        if isinstance(data, dict):
            feeds.update(data)
            source.update({k: f"{p} holds array {k!r}" for k in data})
            continue
        if not name:
            if len(names) != 1:
                raise EdgeSDKError(f"the model has inputs {names}; {p} does not say which it is",
                                   "pass --input NAME=FILE.npy for each input")
            name = names[0]
        feeds[name] = data
        source[name] = f"--input {spec} names {name!r}"
    unknown = [k for k in feeds if k not in names]
    if unknown:
        raise EdgeSDKError(f"{source[unknown[0]]}, which is not an input of the model; its inputs are {names}",
                           f"name the arrays after the inputs: --input {names[0]}=FILE.npy, or np.savez('inputs.npz', "
                           + ", ".join(f"{n}=..." for n in names) + ")")
    missing = [n for n in names if n not in feeds]
    if missing:
        raise EdgeSDKError(f"no --input gives the model's input {missing[0]!r} (inputs: {names})",
                           f"add --input {missing[0]}=FILE.npy, or an .npz holding an array named {missing[0]!r}")
    return feeds


def random_inputs(inputs: list[TensorInfo], batch: int = 1, shapes: dict[str, tuple] | None = None,
                  seed: int = 0, defaults: dict[str, tuple] | None = None) -> dict[str, np.ndarray]:
    """Seeded random feeds: dynamic leading dims → ``batch``; other dynamic dims from ``shapes``, else from
    ``defaults`` (a build folder's build shape, ``Engine.profile``'s opt: its leading dim still ``batch``).

    Raises:
        EdgeSDKError: an input has a dynamic dimension that neither rule fixes; batch < 1, seed < 0;
            a ``shapes`` entry that names no input, has another rank, a dim < 1 or changes a fixed dim;
            inputs too large to allocate.
    """
    if batch < 1:
        raise EdgeSDKError(f"batch {batch} is not a size", "use a batch of at least 1")
    if seed < 0:
        raise EdgeSDKError(f"seed {seed} is negative", "use a seed >= 0")
    _check_shapes(inputs, shapes or {}, batch)
    rng = np.random.default_rng(seed)
    feeds = {}
    for t in inputs:
        shape = tuple(shapes[t.name]) if shapes and t.name in shapes else tuple(
            batch if (d < 0 and i == 0) else d for i, d in enumerate(t.shape or ()))  # None: rank unknown, a scalar
        opt = (defaults or {}).get(t.name)
        if any(d < 0 for d in shape) and opt is not None and len(opt) == len(shape):
            shape = tuple(d if d >= 0 else int(o) for d, o in zip(shape, opt))
        if any(d < 0 for d in shape):
            raise EdgeSDKError(f"input {t.name!r} has dynamic dims {_dims(t.shape)} (N = any size)",
                               f"pass --shape {t.name}={_example(t.shape, batch)} with a size for each N")
        try:
            if t.dtype.kind == "f":
                feeds[t.name] = rng.standard_normal(shape).astype(t.dtype)
            elif t.dtype.kind == "b":
                feeds[t.name] = rng.random(shape) < 0.5
            else:
                feeds[t.name] = rng.integers(0, 10, size=shape).astype(t.dtype)
        except (MemoryError, ValueError) as e:  # numpy: "Unable to allocate ..." / "array is too big"
            raise EdgeSDKError(f"random input {t.name!r} of shape {'x'.join(map(str, shape))} does not fit "
                               f"in memory ({e})", "use a smaller --batch or --shape") from None
    _empty_sparse_kv(feeds)
    return feeds


def _empty_sparse_kv(feeds: dict[str, np.ndarray]) -> None:
    """A decoder on the sparse KV cache (``edgesdk kv-sparsify``) takes no random state: its cache state becomes
    empty (zeros) and ``kv_lengths`` the new tokens, i.e. a prompt from an empty cache."""
    from edgesdk.formats.sparse_kv import LENGTHS_INPUT

    if LENGTHS_INPUT not in feeds:
        return
    tokens = next((a for n, a in feeds.items() if n.startswith("input_ids")), None)
    for name in feeds:
        if name.startswith("past_sparse_kv."):
            feeds[name] = np.zeros_like(feeds[name])
    if tokens is not None:
        feeds[LENGTHS_INPUT] = np.full(feeds[LENGTHS_INPUT].shape, tokens.shape[-1], feeds[LENGTHS_INPUT].dtype)
        if "position_ids" in feeds:
            feeds["position_ids"] = np.broadcast_to(np.arange(tokens.shape[-1]), tokens.shape).astype(
                feeds["position_ids"].dtype)


def _bind_shapes(build: Path, shapes: dict[str, tuple], defaults: dict[str, tuple], batch: int) -> dict[str, tuple]:
    """``--shape`` values completed through the ONNX model's symbolic dim names (a build folder's ``model.onnx``, or
    an ``.onnx``): inputs sharing a name with a given one follow it, the rest take ``defaults`` (the build shape)
    with ``batch`` for their dynamic leading dim. Unchanged where there is no ONNX model or no --shape."""
    path = Path(build) / "model.onnx" if Path(build).is_dir() else Path(build)
    if not shapes or path.suffix != ".onnx" or not path.is_file():
        return shapes
    import onnx

    from edgesdk.onnx_io import graph_inputs, shapes_with_fallback, tensor_dims

    model = onnx.load(str(path), load_external_data=False)
    dims = {vi.name: tensor_dims(vi) for vi in graph_inputs(model)}
    lead = {k for k, d in dims.items() if d and not isinstance(d[0], int)}
    fallback = {k: [batch if i == 0 and k in lead else d for i, d in enumerate(v)] for k, v in defaults.items()}
    bound = shapes_with_fallback(model, {k: list(v) for k, v in shapes.items()}, fallback)
    return {k: tuple(v) for k, v in bound.items()}


def _dims(shape: tuple) -> str:
    """``(-1, 1, 8, 8)`` -> ``"Nx1x8x8"``: a shape as --shape writes it."""
    return "x".join("N" if d < 0 else str(d) for d in shape)


def _example(shape: tuple, batch: int = 1) -> str:
    """A --shape value for ``shape``: the batch for a dynamic leading dim, N for other dynamic dims."""
    return "x".join(str(d) if d >= 0 else str(batch) if i == 0 else "N" for i, d in enumerate(shape))


def _check_shapes(inputs: list[TensorInfo], shapes: dict[str, tuple], batch: int = 1) -> None:
    """``--shape`` values must name an input, give one positive size per dim and keep its fixed dims."""
    by_name = {t.name: t for t in inputs}
    for name, dims in shapes.items():
        given = f"--shape {name}={'x'.join(map(str, dims))}"
        t = by_name.get(name)
        if t is None:
            raise EdgeSDKError(f"{given} names no input of the model; its inputs are {list(by_name)}",
                               "use one of those names")
        if t.shape is None:  # the model does not give the rank: any shape (ONNX Runtime checks it)
            if any(d < 1 for d in dims):
                raise EdgeSDKError(f"{given}: every dim must be at least 1", "give positive sizes")
            continue
        fit = f"give {len(t.shape)} dims and keep the fixed ones, e.g. --shape {name}={_example(t.shape, batch)}"
        if len(dims) != len(t.shape):
            raise EdgeSDKError(f"{given} has {len(dims)} dims; input {name!r} has rank {len(t.shape)}, shape "
                               f"{_dims(t.shape)} (N = any size)", fit)
        if any(d < 1 for d in dims):
            raise EdgeSDKError(f"{given}: every dim must be at least 1", fit)
        for i, (d, want) in enumerate(zip(dims, t.shape)):
            if want >= 0 and d != want:
                raise EdgeSDKError(f"{given}: dim {i} of input {name!r} is fixed at {want} (shape {_dims(t.shape)}, "
                                   "N = any size)", fit)


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
    """``NAME=DxDxD`` or ``NAME:DxDxD`` (as ``edgesdk build`` takes) -> {NAME: dims}.

    Split on the last '=' or ':': ONNX names may hold either (``input:0`` from TensorFlow), dims never do.
    """
    out = {}
    for v in values:
        cut = max(v.rfind("="), v.rfind(":"))
        name, dims = v[:cut], v[cut + 1:]
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        example = "e.g. --shape x=8x1x8x8 (or x:8x1x8x8, as `edgesdk build` takes)"
        if cut < 1 or not shape:
            raise EdgeSDKError(f"--shape {v!r} is not NAME=DxDxD or NAME:DxDxD", example)
        if any(d < 1 for d in shape):
            raise EdgeSDKError(f"--shape {v!r}: every dim must be at least 1", example)
        out[name] = shape
    return out


def _at_least(flag: str, value: int, low: int) -> None:
    if value < low:
        raise EdgeSDKError(f"{flag} {value} is less than {low}", f"pass {flag} {low} or more")


def _check_writable(path: Path, flag: str, default_name: str) -> None:
    """Refuse, before any work, an output path that cannot be written (as ``edgesdk build -o`` does)."""
    if path.is_dir():
        raise EdgeSDKError(f"{flag} {path} is a folder", f"name a file in it, e.g. {flag} {path / default_name}")
    anc = path.absolute().parent
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir() or not os.access(anc, os.W_OK | os.X_OK):
        raise EdgeSDKError(f"{flag} {path} cannot be written ({anc} is not a folder you can write to)",
                           f"choose a {flag} path inside a folder you can write to")


def _write_atomic(path: Path, flag: str, write) -> None:
    """``write(binary_file)`` into a temporary file beside ``path``, then rename it into place.

    Missing parent folders are created. Nothing half-written is left behind: on any failure
    (or Ctrl-C) the temporary file is removed and ``path`` keeps its old content, if any.
    """
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except OSError as e:
        raise EdgeSDKError(f"cannot write {path} ({e.strerror or e})",
                           f"choose a {flag} path inside a folder you can write to, with free space") from None
    finally:
        tmp.unlink(missing_ok=True)


# the runtime names ONNX/ONNX Runtime/protobuf failures itself; the CLI keeps the same net around Engine()
def _open_engine(build: Path, backend: str, cuda_graph: bool) -> Engine:
    with _foreign_errors(f"cannot load the model of {build}", "rebuild the folder with `edgesdk build`"):
        return Engine(build, backend=backend, cuda_graph=cuda_graph)


# the runtime's messages name Engine's arguments; on the command line the same choices are flags
_CLI_WORDS = [(re.compile(r"Engine\((?:path|\.\.\.), backend='onnxruntime'\)|backend='onnxruntime'"), "--backend onnxruntime"),
              (re.compile(r"cuda_graph=True"), "--cuda-graph"), (re.compile(r"drop cuda_graph"), "drop --cuda-graph")]


def cli_words(text: str) -> str:
    for pattern, flag in _CLI_WORDS:
        text = pattern.sub(flag, text)
    return text


def _fail(e: EdgeSDKError):
    """Print to stderr and exit 1, exactly as ``edgesdk build`` does (``edgesdk.cli.fail``)."""
    from edgesdk.cli import fail  # here, not at the top: edgesdk.cli imports this module to register it

    fail(EdgeSDKError(cli_words(e.problem), cli_words(e.fix) if e.fix else None))


def run(build: BuildArg,
        input: Annotated[list[str], typer.Option("--input", "-i", help="FILE.npy, NAME=FILE.npy or FILE.npz (repeatable).")],
        output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Save outputs to this .npz.")] = None,
        backend: BackendOpt = "tensorrt", cuda_graph: GraphOpt = False) -> None:
    """Run a build once on the given inputs and summarize (or save) the outputs."""
    try:
        if output is not None:
            # np.savez's rule: add .npz unless the name has it (res.v2 -> res.v2.npz, not res.npz)
            output = output if output.suffix == ".npz" or output.is_dir() else output.with_name(output.name + ".npz")
            _check_writable(output, "--output", "outputs.npz")
        with _open_engine(build, backend, cuda_graph) as engine:
            feeds = load_inputs(input, engine.inputs)
            shapes = ", ".join(f"{k} {'x'.join(map(str, np.shape(v)))}" for k, v in feeds.items())
            with _foreign_errors(f"the {backend} backend failed on inputs {shapes}",
                                 "check the inputs' shapes and values against `edgesdk inspect` of the model"):
                outs = engine.infer(feeds)
        if output is not None:
            _write_atomic(output, "--output", lambda f: np.savez(f, **outs))
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
        console.print(Text(f"saved {output}"))


def bench(build: BuildArg, backend: BackendOpt = "tensorrt", cuda_graph: GraphOpt = False,
          batch: Annotated[int, typer.Option(help="Size of a dynamic leading (batch) dim.")] = 1,
          shape: Annotated[Optional[list[str]], typer.Option(help="NAME=DxDxD (or NAME:DxDxD) for inputs with other dynamic dims. \\[default for a build folder: its build shape]")] = None,
          warmup: Annotated[int, typer.Option(help="Untimed runs first.")] = 10,
          iterations: Annotated[int, typer.Option(help="Timed runs.")] = 100,
          json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the results here.")] = None,
          seed: int = 0) -> None:
    """Latency percentiles (p50/p90/p99) and throughput of a build on random inputs."""
    try:
        for flag, value, low in (("--batch", batch, 1), ("--iterations", iterations, 1), ("--warmup", warmup, 0),
                                 ("--seed", seed, 0)):
            _at_least(flag, value, low)
        shapes = _parse_shapes(shape or [])
        if json_path is not None:
            _check_writable(json_path, "--json", "bench.json")
        with _open_engine(build, backend, cuda_graph) as engine:
            defaults = {k: v[1] for k, v in (getattr(engine, "profile", None) or {}).items()}
            _check_shapes(engine.inputs, shapes, batch)  # the runtime's own messages for a --shape that cannot fit
            shapes = _bind_shapes(build, shapes, defaults, batch)
            feeds = random_inputs(engine.inputs, batch, shapes, seed, defaults)
            sizes = ", ".join(f"{k} {'x'.join(map(str, v.shape))}" for k, v in feeds.items())
            with _foreign_errors(f"the {backend} backend failed on random inputs {sizes}",
                                 "check --batch and --shape against `edgesdk inspect` of the model"):
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
        try:
            _write_atomic(json_path, "--json", lambda f: f.write(json.dumps(res, indent=2).encode()))
        except EdgeSDKError as e:
            _fail(e)


def register(app: typer.Typer) -> None:
    """Add ``run`` and ``bench`` to the main ``edgesdk`` app."""
    app.command("run")(run)
    app.command("bench")(bench)
