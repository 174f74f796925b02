"""Shared benchmark helpers: CUDA-graph timing, the 16-SM green-context proxy, results files.

Method (``../shared/GPU.md``): compare variants side by side in one run, time CUDA-graph replays
(many launches per event pair), rotate weight copies so the working set exceeds L2, take medians.
Results go to ``bench/results/<name>.json`` with device, date and commit.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).resolve().parent / "results"


def git_commit() -> str:
    """Short commit of the benchmarked sources: ``$EDGESDK_COMMIT`` when set (a copy of the tree run
    elsewhere, e.g. staged on the GPU machine, has no git history of its own), else ``git rev-parse``."""
    env = os.environ.get("EDGESDK_COMMIT")
    if env:
        return env
    try:
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return (out.stdout.strip() or "unknown") + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def meta(extra: dict | None = None) -> dict:
    import torch

    p = torch.cuda.get_device_properties(0)
    m = {
        "device": torch.cuda.get_device_name(0),
        "sm_count": p.multi_processor_count,
        "l2_bytes": getattr(p, "L2_cache_size", None),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    m.update(extra or {})
    return m


def time_graph(fn: Callable[[], None], inner: int = 20, reps: int = 15, warmup: int = 3,
               stream=None) -> float:
    """Median microseconds per ``fn()`` call: ``inner`` calls captured in one CUDA graph,
    replayed ``reps`` times between CUDA events. ``fn`` launches on torch's current stream
    (pass ``torch.cuda.current_stream().cuda_stream`` to our launchers)."""
    import torch

    s = stream or torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(inner):
                fn()
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record(s)
            g.replay()
            b.record(s)
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000.0 / inner)
    return statistics.median(times)


def write_results(name: str, rows: list[dict], info: dict) -> Path:
    """Write ``bench/results/<name>.json`` atomically; returns the path."""
    return write_json(RESULTS / f"{name}.json", rows, info)


def write_json(path: Path, rows: list[dict], info: dict) -> Path:
    """Write ``{"meta": info, "rows": rows}`` to ``path`` atomically (temp file + rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"meta": info, "rows": rows}, indent=1))
    os.replace(tmp, path)
    return path


def print_table(rows: list[dict], cols: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in cols} if rows else {}
    print("  ".join(c.rjust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).rjust(widths[c]) for c in cols))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"
    return "" if v is None else str(v)
