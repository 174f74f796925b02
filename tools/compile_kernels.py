#!/usr/bin/env python3
"""Compile every CUDA source under plugins/ for sm_87 (Orin) and sm_90, print a resource table.

For each kernel: registers, static shared memory, stack, spill stores/loads. A kernel that spills
fails the run unless its source carries a comment ``// spill-ok: <kernel name or *> <reason>``.
Writes the table as JSON when ``--json PATH`` is given. Exit code 0 only if every file compiled and
no unexplained spill was found.

Usage: python tools/compile_kernels.py [--arch sm_87 --arch sm_90] [--json out.json] [files...]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def demangle(names: list[str]) -> dict[str, str]:
    cxxfilt = shutil.which("cu++filt") or shutil.which("c++filt")
    if not cxxfilt or not names:
        return {n: n for n in names}
    r = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True)
    out = r.stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def parse_ptxas(log: str) -> list[dict]:
    rows: list[dict] = []
    cur: dict | None = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = {"kernel": m.group(1), "arch": m.group(2), "registers": None, "smem": 0,
                   "stack": 0, "spill_stores": 0, "spill_loads": 0}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = _PROPS.search(line)
        if m:
            cur["stack"], cur["spill_stores"], cur["spill_loads"] = map(int, m.groups())
            continue
        m = _USED.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            cur["smem"] = int(m.group(2) or 0)
    return rows


def compile_one(src: Path, arch: str) -> tuple[list[dict], str | None]:
    with tempfile.TemporaryDirectory() as td:
        cmd = ["nvcc", "-cubin", f"-arch={arch}", "-O3", "-std=c++17", "-Xptxas", "-v",
               f"-I{src.parent}", f"-I{PLUGINS}", "-o", str(Path(td) / "k.cubin"), str(src)]
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return [], r.stderr[-4000:]
    rows = parse_ptxas(r.stderr + r.stdout)
    for row in rows:
        row["file"] = str(src.relative_to(ROOT))
    return rows, None


def spill_allowed(src: Path, kernel: str) -> str | None:
    for line in src.read_text().splitlines():
        m = re.search(r"//\s*spill-ok:\s*(\S+)\s+(.*)", line)
        if m and (m.group(1) == "*" or m.group(1) in kernel):
            return m.group(2).strip()
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", type=Path, help="sources (default: plugins/**/*.cu)")
    ap.add_argument("--arch", action="append", help="target (repeatable; default sm_87 and sm_90)")
    ap.add_argument("--json", type=Path, help="write the table here")
    args = ap.parse_args(argv)
    if not shutil.which("nvcc"):
        print("nvcc not found on PATH: install the CUDA toolkit (CI needs it to check the kernels)")
        return 2
    archs = args.arch or ["sm_87", "sm_90"]
    files = [f.resolve() for f in args.files] or sorted(PLUGINS.rglob("*.cu"))
    if not files:
        print("no CUDA sources under plugins/")
        return 0
    jobs = [(f, a) for f in files for a in archs]
    with ThreadPoolExecutor(max_workers=2) as ex:
        results = list(ex.map(lambda fa: (fa, compile_one(*fa)), jobs))
    failed = 0
    table: list[dict] = []
    for (src, arch), (rows, err) in results:
        if err is not None:
            failed += 1
            print(f"FAILED  {src.relative_to(ROOT)} [{arch}]\n{err}")
            continue
        table.extend(rows)
    names = demangle(sorted({r["kernel"] for r in table}))
    print(f"{'kernel':<72} {'arch':<6} {'regs':>4} {'smem':>6} {'stack':>5} {'spill st/ld':>11}")
    for r in sorted(table, key=lambda r: (r["file"], r["kernel"], r["arch"])):
        r["name"] = names.get(r["kernel"], r["kernel"])
        note = ""
        if r["spill_stores"] or r["spill_loads"]:
            why = spill_allowed(ROOT / r["file"], r["name"])
            if why:
                r["spill_explained"] = why
                note = f"  (spill explained: {why})"
            else:
                failed += 1
                note = "  <-- UNEXPLAINED SPILL"
        print(f"{r['name'][:72]:<72} {r['arch']:<6} {r['registers'] or 0:>4} {r['smem']:>6} "
              f"{r['stack']:>5} {r['spill_stores']:>5}/{r['spill_loads']:<5}{note}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))
    print(f"{len(files)} source(s), {len(table)} kernel build(s), {failed} problem(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
