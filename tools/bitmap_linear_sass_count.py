"""Count the SASS instructions of a decode kernel's main loop by section (round 6, CPU only).

Builds plugins/bitmap_linear/bitmap_linear.cu for one arch with nvcc, disassembles the named kernels with
cuobjdump -sass and walks the main loop (the backward branch that closes the loop containing the HMMAs)
along its common path: every instruction is counted once except those inside blocks that the common case
skips (offset-window reload, K-tail X group), which are listed separately. Sections by address range:
  issue  = loop top .. the LDGDEPBAR (copy issue, incl. the per-group/pair parity test),
  scan   = after the DEPBAR .. the WARPSYNC before the scratch read-back,
  decode = the rest up to the loop branch (scratch loads, tile decode, ldmatrix, mma, loop control).
G2 kernels (_xg, round 6, commit 94950a2) alternate: the default path is the even group of a pair (copy issue
of both groups), --odd the odd group's.
Usage: python tools/bitmap_linear_sass_count.py [--arch sm_90] [--odd] KERNEL...
"""
import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "plugins" / "bitmap_linear" / "bitmap_linear.cu"


def sass(cubin: Path, kernel: str) -> list[tuple[int, str]]:
    out = subprocess.run(["cuobjdump", "-sass", "-fun", kernel, str(cubin)], capture_output=True, text=True,
                         check=True).stdout
    ins = []
    for line in out.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    return ins


def main_loop(ins):
    hmma = [a for a, t in ins if "HMMA" in t]
    best = None
    for a, t in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", t)
        if m and "BRA.DIV" not in t:
            tgt = int(m.group(1), 16)
            if (t.startswith("@") and tgt < min(hmma) and a > max(hmma)
                    and (best is None or a - tgt < best[1] - best[0])):
                best = (tgt, a)
    return best


def walk(ins, lo, hi, odd=False):
    """Common path: follow fall-through; take forward unconditional BRAs; at a conditional forward BRA
    whose skipped block loads offsets (LDG, no LDGSTS: the window reload) take it; the K-tail X block is
    jumped over by an unconditional BRA on the common path."""
    addr = {a: i for i, (a, _) in enumerate(ins)}
    i = addr[lo]
    path, skipped = [], collections.Counter()
    while ins[i][0] <= hi:
        a, t = ins[i]
        path.append((a, t))
        m = re.search(r"BRA (0x[0-9a-f]+)", t)
        if m and "BRA.DIV" not in t and a != hi:
            tgt = int(m.group(1), 16)
            if tgt > a:
                block = [u for b, u in ins[i + 1:addr[tgt]]]
                cond = t.startswith("@")
                rare = (any("LDG.E" in u and "LDGSTS" not in u for u in block)
                        and not any("LDGSTS" in u for u in block))  # offset-window reload
                # --odd (G2 kernels): the odd group of a pair skips the copy issue and the even-only
                # shuffle of the group's value total
                odd_skip = odd and cond and any("LDGSTS" in u or re.search(r"SHFL.IDX .*, 0xf,", u) for u in block)
                if not cond or rare or odd_skip:
                    if rare and cond:
                        skipped["window reload"] += len(block)
                    i = addr[tgt]
                    continue
        i += 1
    return path


def sections(path):
    sec = collections.Counter()
    cur = "issue"
    for a, t in path:
        if cur == "issue" and "DEPBAR.LE" in t:
            cur = "scan"
        if cur == "scan" and "WARPSYNC" in t:
            sec[cur] += 1
            cur = "decode"
            continue
        sec[cur] += 1
    return sec


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--odd", action="store_true", help="G2 kernels: path of the odd group of a pair")
    ap.add_argument("kernels", nargs="+")
    a = ap.parse_args()
    if not shutil.which("nvcc") or not shutil.which("cuobjdump"):
        print("needs nvcc and cuobjdump on PATH")
        return 1
    with tempfile.TemporaryDirectory() as td:
        cubin = Path(td) / "k.cubin"
        subprocess.run(["nvcc", "-cubin", f"-arch={a.arch}", "-O3", "-std=c++17", f"-I{SRC.parent}",
                        f"-I{ROOT / 'plugins'}", "-o", str(cubin), str(SRC)], check=True)
        for k in a.kernels:
            ins = sass(cubin, k)
            lo, hi = main_loop(ins)
            path = walk(ins, lo, hi, a.odd)
            sec = sections(path)
            ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for _, t in path)
            print(f"{k} ({a.arch}): loop {lo:#x}..{hi:#x}, common path {len(path)} instructions: "
                  + ", ".join(f"{s} {n}" for s, n in sec.items()))
            print("   ", dict(ops.most_common(16)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
