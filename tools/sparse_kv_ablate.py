#!/usr/bin/env python3
"""Where the time of the default decode attention (tactic 1) goes: time variants that leave one stage out.

The kernel source is copied to a temporary file with switches (``SKV_ABLATE`` bits) spliced in:
  1  compressed K rows are not decoded (no zero fill, no scatter: the K tile keeps stale data)
  2  compressed V rows are not decoded
  4  the zero fill of decoded rows is left out (values scattered over stale data)
  8  the records are not staged (no cp.async of K/V records: the decode reads stale shared memory)
and ``merge=0`` leaves the second launch (the split merge) out of the CUDA graph. Results of ablated
variants are wrong by design; only variant 0 (the switches compiled in, all off) is checked: it must
equal the production kernel bit for bit. Timing as ``tools/sparse_kv_explore.py`` (CUDA-graph replays,
caches replicated beyond L2 and rotated, medians), heuristic split.

``--extra NAME=OPTIONS`` adds a variant built from the same patched source with extra compiler options
(``-D`` switches of a layout experiment; such a variant's output is checked bit for bit too; session 7 timed
an 8-byte shift of the V records in the stage this way, ``bench/results/sparse_kv_vshift_16158dc.json``, and
session 14 the lean record issue against the previous one, ``bench/results/sparse_kv_lean_*.json``);
``--variants full,...`` keeps only the named variants; ``--rounds R`` times the variant list R times in turn.

Usage: python tools/sparse_kv_ablate.py [--out FILE] [--shapes llama:16:32768,...] [--extra NAME=OPTS]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench._common import meta, time_graph  # noqa: E402
from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402
from edgesdk.kernels import _cuda  # noqa: E402
from edgesdk.kernels import sparse_kv as ks  # noqa: E402
from sparse_kv_explore import MODELS, compressed_copies, random_problem  # noqa: E402

SWITCHES = [  # (exact text, replacement): each must occur once
    ("  for (int i = 0; i < 8; ++i) row4[i] = make_uint4(0u, 0u, 0u, 0u);",
     "  if (!(SKV_ABLATE & 4)) for (int i = 0; i < 8; ++i) row4[i] = make_uint4(0u, 0u, 0u, 0u);"),
    ("        decode_row_desc<D>(st_dec, dkeep, drow);",
     "        if (!(SKV_ABLATE & (dv ? 2 : 1))) decode_row_desc<D>(st_dec, dkeep, drow);"),
    ("    if (ii < cnt) {",
     "    if (!(SKV_ABLATE & 8) && ii < cnt) {"),
]
VARIANTS = [  # (name, SKV_ABLATE bits, merge launched)
    ("full", 0, True),
    ("no_merge", 0, False),
    ("no_K_decode", 1, True),
    ("no_V_decode", 2, True),
    ("no_KV_decode", 3, True),
    ("no_zero_fill", 4, True),
    ("no_KV_decode_no_staging", 11, True),
    ("no_KV_decode_no_staging_no_merge", 11, False),
]


def patched_source(source: str | None = None) -> Path:
    src = Path(source or ks.SOURCE)
    src = src if src.is_absolute() or source else _cuda.PLUGINS_DIR / src
    text = src.read_text()
    for old, new in SWITCHES:
        if text.count(old) != 1:
            raise SystemExit(f"switch point not found exactly once in {src}: {old.strip()[:60]}")
        text = text.replace(old, new)
    text = text.replace('#include "common/ampere.cuh"', '#include "common/ampere.cuh"\n#ifndef SKV_ABLATE\n#define SKV_ABLATE 0\n#endif', 1)
    d = Path(tempfile.mkdtemp(prefix="skv_ablate_"))
    (d / "sparse_kv_ablate.cu").write_text(text)
    return d / "sparse_kv_ablate.cu"


class _NoLaunch:
    def launch(self, *a, **k):
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sparse_kv_ablate.json")
    ap.add_argument("--sparsity", type=float, default=0.7)
    ap.add_argument("--shapes", default="llama:16:32768,smollm:16:32768,llama:4:16384,llama:1:4096,smollm:1:4096")
    ap.add_argument("--extra", action="append", default=[], help="NAME=OPTIONS: a variant with extra compiler options")
    ap.add_argument("--variants", default="", help="comma-separated names to keep (default: all)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--source", default=None,
                    help="kernel source to patch for the variants (default: the shipped one), e.g. an earlier revision "
                         "saved with git show REV:plugins/sparse_kv/sparse_kv.cu > FILE, to time it against production")
    a = ap.parse_args()
    src = patched_source(a.source)
    orig_kernel = ks._kernel
    state = {"bits": 0, "merge": True, "opts": ()}
    variants = [(name, bits, merge, ()) for name, bits, merge in VARIANTS]
    for e in a.extra:
        name, opts = e.split("=", 1)
        variants.append((name, 0, True, tuple(opts.split())))
    if a.variants:
        keep = a.variants.split(",")
        variants = [v for v in variants if v[0] in keep]

    def kernel(name, max_smem_carveout=False):
        if name.startswith("sparse_kv_combine") and not state["merge"]:
            return _NoLaunch()
        if name.startswith("sparse_kv_attn2"):
            k = _cuda.get_kernel(src, name, (f"-DSKV_ABLATE={state['bits']}", *state["opts"]))
            if max_smem_carveout and id(k) not in ks._carveout_set:
                cu = _cuda._driver()
                attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
                _cuda.check(cu.cuFuncSetAttribute(k.function, attr, 100))
                ks._carveout_set.add(id(k))
            return k
        return orig_kernel(name, max_smem_carveout)

    rows = []
    info = meta()

    def write(rows):
        res = dict(meta=info, sparsity=a.sparsity, method="CUDA-graph replays, caches beyond L2 rotated, medians; "
                   "ablated variants compute wrong results by design (timing only)", rows=rows)
        tmp = Path(a.out + ".tmp")
        tmp.write_text(json.dumps(res, indent=1))
        tmp.replace(a.out)

    st = torch.cuda.Stream()
    sp = st.cuda_stream
    for shape in a.shapes.split(","):
        model, B, ctx = shape.split(":")
        B, ctx = int(B), int(ctx)
        hq, hkv, d = MODELS[model]
        k, v, q, lens, out = random_problem(model, B, ctx)
        cfg = SparseKVConfig(d, hq, hkv, a.sparsity, a.sparsity, ctx + 1)
        _keep, cptr = compressed_copies(cfg, B, ctx, k, v, lens, sp)
        del k, v
        n = len(cptr)
        ts, ns = ks.plan_cache(cfg, B, ctx)
        ws = torch.zeros(ks.workspace_bytes(hq, d, B, ns) // 4, device="cuda")
        inner = max(20, n)
        # production kernel: reference output and time
        it = iter(range(1 << 30))

        def fn():
            ks.decode_attention(cfg, B, ctx, q.data_ptr(), cptr[next(it) % n], out.data_ptr(), ws.data_ptr(), sp)
        us = time_graph(fn, inner=inner, stream=st)
        ks.decode_attention(cfg, B, ctx, q.data_ptr(), cptr[0], out.data_ptr(), ws.data_ptr(), sp)
        torch.cuda.synchronize()
        ref = out.clone()
        rows.append(dict(shape=shape, variant="production", us=us, tokens_per_split=ts, splits=ns))
        print(f"{shape:16s} {'production':34s} {us:9.2f} us", flush=True)
        ks._kernel = kernel
        try:
            for rnd, (name, bits, merge, opts) in ((r, v) for r in range(a.rounds) for v in variants):
                state.update(bits=bits, merge=merge, opts=opts)
                it = iter(range(1 << 30))
                us = time_graph(fn, inner=inner, stream=st)
                row = dict(shape=shape, variant=name, bits=bits, merge=merge, us=us, round=rnd, options=list(opts))
                if name == "full" or opts:
                    out.fill_(float("nan"))
                    ks.decode_attention(cfg, B, ctx, q.data_ptr(), cptr[0], out.data_ptr(), ws.data_ptr(), sp)
                    torch.cuda.synchronize()
                    row["bit_identical_to_production"] = bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))
                rows.append(row)
                print(f"{shape:16s} {name:34s} {us:9.2f} us {row.get('bit_identical_to_production', '')}", flush=True)
        finally:
            ks._kernel = orig_kernel
        del _keep, cptr
        torch.cuda.empty_cache()
        write(rows)  # after every shape: a run cut short keeps what it measured
    print("wrote", a.out)


if __name__ == "__main__":
    main()
