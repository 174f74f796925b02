"""``report.json`` writing and the human-readable summary printed at the end of a build."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

from rich.console import Console, ConsoleOptions
from rich.markup import escape
from rich.padding import Padding
from rich.text import Text

from edgesdk.onnx_io import _umask
from edgesdk.tables import Fit, Grid, Ident, compact_table, grouped_notes, key_column, natural_width, num_column, text_column

REPORT_NAME = "report.json"


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically (temp name + ``os.replace``)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
            f.write("\n")
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def _timed(r: dict) -> str:
    """Note of a layer that kept its plugin after timing (``measured``), else ""."""
    m = r.get("measured")
    if not m or r.get("kernel") == "none":
        return ""
    ours = m[f"{m.get('plugin', 'bitmap')}_us"]
    return f"measured: {ours:.1f} µs vs dense {m['dense_us']:.1f} µs ({m['dense_us'] / ours:.2f}×)"


def _layers_grid(layers: list[dict], title: str, notes: bool) -> Grid:
    """INT8 state and sparsity, where every layer shares them, may move above the table (``Grid``); the shape,
    kernel, sizes and INT8 error stay in it."""
    sqnr = any(r.get("sqnr_db") is not None for r in layers)
    t = Grid(title)
    t.key("layer")
    t.num("K×N", shared=False)  # the op kind: `edgesdk inspect`
    t.num("int8", justify="center")
    t.num("sparsity")
    t.num("kernel", justify="left", shared=False)
    t.num("MB\ndense", shared=False)
    t.num("MB\npacked", shared=False)
    if sqnr:
        t.num("SQNR\ndB", shared=False)
    if notes:
        t.text("note", shared=False)
    for r in layers:
        k, n = r["shape"]
        cells = [r["name"], f"{k}×{n}", "yes" if r["quantized"] else "no", f"{r['sparsity']:.2f}",
                 r["kernel"], _mb(r.get("bytes_dense")), _mb(r.get("bytes_packed"))]
        if sqnr:
            cells.append(_num(r.get("sqnr_db"), ".1f"))
        t.add_row(*cells, *([_note(r)] if notes else []))
    return t


def lowest_sqnr(layers: list[dict], count: int = 3, shape: str | None = None) -> list[tuple[str, float]]:
    """``(name, dB)`` of the ``count`` INT8 layers of lowest output SQNR (:mod:`edgesdk.sensitivity`), lowest first:
    at the verified ``shape`` (``"build"``, ``"min"``, ``"max"``: ``sqnr_by_shape``), or at each layer's worst
    (``sqnr_db``)."""
    def value(r):
        return r.get("sqnr_db") if shape is None else (r.get("sqnr_by_shape") or {}).get(shape)

    return sorted(((r["name"], value(r)) for r in layers if value(r) is not None), key=lambda nv: nv[1])[:count]


def sqnr_line(layers: list[dict], count: int = 3) -> str | None:
    """One line on the INT8 error of the layers: the lowest output SQNRs and the median, or None if not measured."""
    low = lowest_sqnr(layers, count)
    if not low:
        return None
    vals = [v for _, v in lowest_sqnr(layers, len(layers))]
    mid = statistics.median(vals)
    shapes = {k for r in layers for k in (r.get("sqnr_by_shape") or {})}
    by = {r["name"]: r.get("sqnr_by_shape") or {} for r in layers}

    def at(name, db):  # the shape where a layer's SQNR is lowest, where several shapes were verified
        return next((f" at the {k} shape" for k, v in by[name].items() if v == db), "") if len(shapes) > 1 else ""

    said = ", ".join(f"{n} {v:.1f} dB{at(n, v)}" for n, v in low)
    return (f"INT8 error per layer (output SQNR, higher is better; layers[].sqnr_db): lowest {said}; median "
            f"{mid:.1f} dB over {len(vals)} layers")


def _note(r: dict) -> str:
    return r.get("reason") or _timed(r)


class LayersView:
    """The layers table; its notes go in a last column where the whole table fits unwrapped, else as lines below
    it (grouped where layers share one), and then the values every layer shares move above it where it is still
    too wide."""

    def __init__(self, layers: list[dict], title: str = "Linear layers"):
        self.layers, self.title = layers, title

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        with_notes = _layers_grid(self.layers, self.title, notes=True)
        noted = [r for r in self.layers if _note(r)]
        if not noted or natural_width(console, options, with_notes.table(title=self.title))[1] <= options.max_width:
            yield _layers_grid(self.layers, self.title, notes=bool(noted))
            return
        yield _layers_grid(self.layers, self.title, notes=False)
        for line in grouped_notes([(r["name"], _note(r)) for r in noted], every=len(self.layers)):
            yield Padding(Text(line), (0, 0, 0, 2))


def layers_table(layers: list[dict], title: str = "Linear layers") -> LayersView:
    return LayersView(layers, title)


_AGAINST = {"original": "original", "pruned_reference": "pruned dense", "tensorrt": "TensorRT",
            "kv_emulated": "source, KV\npruned alike", "source": "source"}


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


VERIFY_OUTPUTS_SHOWN = 6  # more outputs than this (an LLM's present.* KV outputs): one row per comparison


def verify_view(rows: list[dict], most: int | None = None) -> list[dict]:
    """The verification rows to print: all of them for models with few outputs; else, per comparison (against,
    shape), its worst output (a failing one first, then the lowest cosine) labelled with the number of outputs, and
    the largest errors over all of them."""
    if len({v["output"] for v in rows}) <= (VERIFY_OUTPUTS_SHOWN if most is None else most):
        return rows
    groups: dict[tuple, list[dict]] = {}
    for v in rows:
        groups.setdefault((v.get("against"), v.get("shape")), []).append(v)
    out = []
    for part in groups.values():
        worst = min(part, key=lambda v: (v["passed"], v["cosine"] if v["cosine"] is not None else -2.0))
        row = dict(worst)
        row["output"] = f"{worst['output']} (worst of {len(part)})"
        for k in ("max_abs", "mean_abs", "rel_l2"):
            vals = [v[k] for v in part if v.get(k) is not None]
            row[k] = max(vals) if vals else None
        row["passed"] = all(v["passed"] for v in part)
        out.append(row)
    return out


def print_summary(report: dict, console: Console | None = None) -> None:
    """Layers, verification and engine status of a build report, as rich tables."""
    console = console or Console()
    layers = report.get("layers", [])
    if not layers:
        pass
    elif len(layers) > 24:
        shown = layers[:12] + layers[-4:]
        console.print(layers_table(shown, f"Linear layers ({len(layers)}; first 12 and last 4 shown, all in report.json)"))
    else:
        console.print(layers_table(layers))
    line = sqnr_line(layers)
    if line:
        console.print(Text(line))
    for note in sorted({r["choice"] for r in layers if r.get("choice")}):
        console.print(Text(f"Kernel choice (--kernels auto): {note}"))
    for note in report.get("notes", []):
        console.print(Text(f"Note: {note}"))
    if report.get("verify"):
        engines = " and TensorRT" if any(v.get("against") == "tensorrt" for v in report["verify"]) else ""
        rows = verify_view(report["verify"])
        grouped = len(rows) < len(report["verify"])
        t = compact_table(f"Verification (ONNX Runtime{engines}, Polygraphy; n samples"
                          + ("; worst output of each comparison, every output in report.json)" if grouped else ")"))
        text_column(t, "processed\nvs")
        key_column(t, "output", [v["output"] for v in rows])
        for c in ("n", "max\nabs", "mean\nabs", "rel\nl2", "cosine", "top1", "result"):
            num_column(t, c)
        for v in rows:
            top1 = _num(v.get("top1_agreement"), ".4f")
            against = _AGAINST.get(v.get("against"), "original") + (f" @{v['shape']}" if v.get("shape") else "")
            result = "[green]PASS[/]" if v["passed"] else "[red]FAIL[/]"
            if not v.get("gate", True):
                result = "(cost)"  # pruning changes the model on purpose: reported, not gating
            t.add_row(against, Ident(v["output"]), str(v["samples"]), _num(v["max_abs"], ".3g"),
                      _num(v["mean_abs"], ".3g"), _num(v["rel_l2"], ".3g"), _num(v["cosine"], ".5f"), top1, result)
        console.print(Fit(t, keys=(1,)))
    if "engine" in report:
        eng = report["engine"]
        state = "[green]built[/]" if eng.get("built") else f"[yellow]not built[/]: {escape(str(eng.get('reason')))}"
        console.print(f"TensorRT engine: {state}")
    for v in report.get("verify", []):
        if v.get("error"):
            console.print(Text(f"verification against {_AGAINST.get(v.get('against'), v.get('against'))} failed: "
                               f"{v['error']}"))
    if report.get("output"):
        console.print(f"Build folder: [bold]{escape(str(report['output']))}[/] ({report.get('seconds', 0):.1f} s)")
