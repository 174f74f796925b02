"""Does ``--split-compile`` change the plugins' machine code? Compile each plugin source with one thread and with
every CPU, for each architecture and compiler, and compare the cubins kernel by kernel.

``edgesdk.kernels._cuda.compile_cubin`` passes ``--split-compile=<CPUs>`` to nvcc and NVRTC for the sources in
``_cuda.SPLIT_COMPILE`` and leaves it out of the cubin cache key; that is only right while their code is the same.
This checks any source, listed or not (exit 1 where a kernel differs). Compared per ``extern "C"`` kernel, straight from the
ELF (no cuobjdump needed): the bytes of its ``.text`` section (its SASS), the section's flags and info (registers,
barriers), its ``.nv.info`` attributes, and its static shared memory and parameter bank sizes. Relocations are
compared by the names of the symbols they point at.

    python tools/split_compile_check.py [--arch sm_87 --arch sm_90] [--compiler nvcc --compiler nvrtc] [--json F]

NVRTC is cuda-python's; for another version run this in an environment with that cuda-python (PYTHONPATH=. is
enough: only ``edgesdk.kernels._cuda`` is imported).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgesdk.kernels import _cuda  # noqa: E402

SOURCES = ["bitmap_linear/bitmap_linear.cu", "vitbit_gemm/vitbit_gemm.cu", "sparse_kv/sparse_kv.cu"]


def kernel_parts(cubin: bytes) -> dict[str, tuple]:
    """Per kernel: (.text bytes, flags, info, .nv.info bytes, .nv.shared size, .nv.constant0 size, relocations)."""
    assert cubin[:4] == b"\x7fELF" and cubin[4] == 2 and cubin[5] == 1, "not an ELF64 little-endian file"
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def cstr(off: int) -> str:
        return cubin[off:cubin.index(b"\0", off)].decode()

    names = [cstr(secs[shstrndx][4] + s[0]) for s in secs]
    by_name = {n: i for i, n in enumerate(names)}
    symtab = next(i for i, s in enumerate(secs) if s[1] == 2)
    sym_off, sym_size, sym_link, sym_ent = secs[symtab][4], secs[symtab][5], secs[symtab][6], secs[symtab][9]
    sym_names = [cstr(secs[sym_link][4] + struct.unpack_from("<I", cubin, sym_off + j * sym_ent)[0])
                 for j in range(sym_size // sym_ent)]
    out = {}
    for i, n in enumerate(names):
        if not n.startswith(".text.") or n[6:].startswith(("_Z", "$")):
            continue
        k = n[6:]
        _, _, flags, _, off, size, _, info, _, _ = secs[i]
        nv_info = by_name.get(f".nv.info.{k}")
        shared = by_name.get(f".nv.shared.{k}")
        const0 = by_name.get(f".nv.constant0.{k}")
        relocs = []
        for j, s in enumerate(secs):
            if s[1] in (4, 9) and s[7] == i:  # SHT_RELA / SHT_REL applying to this .text
                ent = s[9]
                for r in range(s[5] // ent):
                    r_off, r_info = struct.unpack_from("<QQ", cubin, s[4] + r * ent)
                    addend = struct.unpack_from("<q", cubin, s[4] + r * ent + 16)[0] if s[1] == 4 else 0
                    relocs.append((r_off, r_info & 0xFFFFFFFF, sym_names[r_info >> 32], addend))
        out[k] = (cubin[off:off + size], flags, info,
                  cubin[secs[nv_info][4]:secs[nv_info][4] + secs[nv_info][5]] if nv_info is not None else b"",
                  secs[shared][5] if shared is not None else 0, secs[const0][5] if const0 is not None else 0,
                  sorted(relocs))
    return out


def compile_with(src: Path, arch: str, compiler: str, threads: int, cache: Path) -> tuple[bytes, float]:
    os.environ["EDGESDK_CACHE"] = str(cache)
    _cuda.compile_threads = lambda: threads  # the launcher's own compile path, thread count forced,
    _cuda.SPLIT_COMPILE = frozenset({src.name})  # split whether or not the source is listed
    t = time.perf_counter()
    data = _cuda.compile_cubin(src, arch, compiler=compiler)
    return data, time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", action="append", help="default: sm_87 and sm_90")
    ap.add_argument("--compiler", action="append", choices=["nvcc", "nvrtc"], help="default: both")
    ap.add_argument("--source", action="append", help=f"default: {', '.join(SOURCES)}")
    ap.add_argument("--threads", type=int, default=None, help="split-compile threads (default: every CPU)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    many = a.threads or len(os.sched_getaffinity(0))
    if many < 2:
        ap.error("one CPU here: nothing to split (pass --threads 2 to check the code anyway)")
    rows, bad = [], 0
    with tempfile.TemporaryDirectory() as td:
        for rel in a.source or SOURCES:
            src = _cuda.PLUGINS_DIR / rel
            for arch in a.arch or ["sm_87", "sm_90"]:
                for compiler in a.compiler or ["nvcc", "nvrtc"]:
                    one, t1 = compile_with(src, arch, compiler, 1, Path(td) / f"{compiler}1")
                    split, tn = compile_with(src, arch, compiler, many, Path(td) / f"{compiler}n")
                    p1, pn = kernel_parts(one), kernel_parts(split)
                    differ = sorted(k for k in set(p1) | set(pn) if p1.get(k) != pn.get(k))
                    bad += bool(differ) or not p1
                    row = {"source": src.name, "arch": arch, "compiler": _cuda.compiler_id(compiler),
                           "kernels": len(p1), "differ": differ, "seconds_1_thread": round(t1, 1),
                           f"seconds_{many}_threads": round(tn, 1)}
                    rows.append(row)
                    print(f"{src.name:20s} {arch} {row['compiler']:14s} {len(p1):4d} kernels  "
                          f"{'SAME' if not differ else 'DIFFER: ' + ', '.join(differ[:4])}  "
                          f"{t1:6.1f} s -> {tn:6.1f} s ({many} threads)", flush=True)
    if a.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parents[1]).stdout.strip() or None
        res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "commit": os.environ.get("EDGESDK_COMMIT", commit), "machine": "CPU only", "cpus": os.cpu_count(),
               "threads": many, "rows": rows}
        tmp = a.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1) + "\n")
        os.replace(tmp, a.json)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
