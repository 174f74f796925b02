"""``report.json`` writing and the human-readable summary printed at the end of a build."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from rich.console import Console

from edgesdk.onnx_io import _umask
from rich.table import Table

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


def layers_table(layers: list[dict], title: str = "Linear layers") -> Table:
    t = Table(title=title, title_justify="left")
    for c, j in [("layer", "left"), ("kind", "left"), ("K×N", "right"), ("int8", "center"), ("sparsity", "right"),
                 ("kernel", "left"), ("MB dense", "right"), ("MB packed", "right"), ("note", "left")]:
        t.add_column(c, justify=j, overflow="fold", no_wrap=c in ("layer", "K×N", "kernel"))
    for r in layers:
        k, n = r["shape"]
        t.add_row(r["name"], r["kind"], f"{k}×{n}", "yes" if r["quantized"] else "no", f"{r['sparsity']:.2f}",
                  r["kernel"], _mb(r.get("bytes_dense")), _mb(r.get("bytes_packed")), r.get("reason") or _timed(r))
    return t


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
    for note in sorted({r["choice"] for r in layers if r.get("choice")}):
        console.print(f"Kernel choice (--kernels auto): {note}")
    if report.get("verify"):
        t = Table(title="Verification (ONNX Runtime, Polygraphy): processed vs ...", title_justify="left")
        for c in ("vs", "output", "samples", "max_abs", "mean_abs", "rel_l2", "cosine", "top1", "result"):
            t.add_column(c, justify="left" if c == "output" else "right", no_wrap=True)
        for v in report["verify"]:
            top1 = "-" if v.get("top1_agreement") is None else f"{v['top1_agreement']:.4f}"
            against = {"pruned_reference": "pruned dense"}.get(v.get("against"), "original")
            result = "[green]PASS[/]" if v["passed"] else "[red]FAIL[/]"
            if not v.get("gate", True):
                result = "(cost)"  # pruning changes the model on purpose: reported, not gating
            t.add_row(against, v["output"], str(v["samples"]), f"{v['max_abs']:.3g}", f"{v['mean_abs']:.3g}",
                      f"{v['rel_l2']:.3g}", f"{v['cosine']:.5f}", top1, result)
        console.print(t)
    eng = report.get("engine", {})
    state = "[green]built[/]" if eng.get("built") else f"[yellow]not built[/]: {eng.get('reason')}"
    console.print(f"TensorRT engine: {state}")
    if report.get("output"):
        console.print(f"Build folder: [bold]{report['output']}[/] ({report.get('seconds', 0):.1f} s)")
