#!/usr/bin/env python3
"""Round 7 of EdgeVitBitGemm (docs/vitbit_gemm.md): what the large-M tensor-core tactics lose, and the 16-SM proxy
run at Orin's occupancy.

Times chosen tactics of ``plugins/vitbit_gemm/vitbit_gemm.cu`` on the ViT-B/16 shapes of issue 5 (pre-quantized
int8 X, fp16 Y with bias: the bench's "ours gemm") with the bench's timer (``bench/bench_vitbit_gemm.py``:
spin kernel, bursts, medians, 4 weight copies), on the full GPU and on the 16-SM green context, in three kinds:

* ``shipped``: the plugin source as it is;
* ``noepi`` (``--ablate``): a timing-only copy whose persistent kernels skip the epilogue (``regs_epilogue_any`` runs
  only when M < 0, which the compiler cannot rule out, so every mma stays): outputs are not written. Its time
  against ``shipped`` is the share of the epilogue that the main loop does not hide;
* ``orin`` (``--orin``, 16-SM context only): an identical copy (its own module, so the attribute does not leak)
  whose kernels ask for a 164 KB shared-memory carveout (Orin's per-SM shared memory) and whose persistent grid is
  16 x the blocks an Orin SM holds (from the kernel's registers, threads and shared memory, :func:`orin_blocks`).
  On the H100's 228 KB two 96 KB blocks of tp_128x128 share an SM; on Orin one does.

Every ``shipped`` output is checked once per shape against an int64 numpy reference of the same epilogue
(``edgesdk.reference.vitbit_gemm``), with Y poisoned first. JSON: ``bench/results/vitbit_gemm_explore_<commit>.json``.

    python tools/vitbit_gemm_explore.py [--tactics 30,34,80,81] [--ablate] [--orin] [--gelu] [--configs full,green16]
        [--shapes 768:2304,384:1536] [--tokens 197] [--batches 1,8,32] [--name TAG]

Other layers than ViT-B/16's (``--shapes K:N``, M = tokens x batch) feed ``tools/vitbit_gemm_fit_auto.py``.
Tactic 1 (the launcher's per-shape choice) may be in ``--tactics`` (``shipped`` rows only): its rows record the
tactic it resolved to (``resolved``) and that kernel's occupancy; the fit tool reports them as "t1 as run".
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from edgesdk.formats import vitbit_gemm as F  # noqa: E402

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
BATCHES = [1, 8, 32]
ORIN_SMEM_PER_SM = 164 * 1024  # sm_87: 164 KB of shared memory per SM (163 KB per block)
ORIN_REGS_PER_SM, ORIN_THREADS_PER_SM, ORIN_BLOCKS_PER_SM = 65536, 1536, 16
SMEM_RESERVED_PER_BLOCK = 1024  # the driver's per-block reservation on sm_80+
# Of the H100's 228 KB: 71 % = 161.9 KB, which the driver rounds up to its 164 KB configuration. (72 % = 164.2 KB was
# rounded up to the next one, 196 KB: the first run's occupancy query said so; docs/vitbit_gemm.md, round 7.)
ORIN_CARVEOUT_PERCENT = 71


def orin_blocks(regs: int, threads: int, smem: int) -> int:
    """Blocks of one kernel that an Orin SM (sm_87) holds at once: the least of the register, shared-memory,
    thread and block limits (registers allocated per warp in units of 256)."""
    warps = -(-threads // 32)
    regs_per_warp = -(-regs * 32 // 256) * 256
    by_regs = ORIN_REGS_PER_SM // max(1, warps * regs_per_warp)
    by_smem = ORIN_SMEM_PER_SM // (smem + SMEM_RESERVED_PER_BLOCK)
    by_threads = ORIN_THREADS_PER_SM // threads
    return max(0, min(by_regs, by_smem, by_threads, ORIN_BLOCKS_PER_SM))


def ablated_source(src: str) -> str:
    """The plugin source with the persistent kernels' epilogue skipped at run time (timing only)."""
    calls = re.findall(r"regs_epilogue_any(?:<\w+>)?\(emode, o, tc, \(tile / tiles_n\) \* BM", src)
    if len(calls) != 1:
        raise RuntimeError("the persistent epilogue call was not found once in the plugin source: update the tool")
    return src.replace(calls[0], "if (o.M < 0) " + calls[0])


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"768:2304,384:384"`` -> [(768, 2304), (384, 384)] (K, N of each layer)."""
    out = []
    for part in text.split(","):
        if not part:
            continue
        try:
            k, n = (int(v) for v in part.split(":"))
        except ValueError:
            raise SystemExit(f"--shapes: {part!r} is not K:N (two integers, e.g. 768:2304)") from None
        if k < 1 or n < 1:
            raise SystemExit(f"--shapes: {part!r} needs K >= 1 and N >= 1")
        out.append((k, n))
    if not out:
        raise SystemExit("--shapes: no layer given (e.g. --shapes 768:2304,768:768)")
    return out


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_vitbit_gemm", ROOT / "bench" / "bench_vitbit_gemm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tactics", default="30,34,80,81")
    ap.add_argument("--orin-tactics", default="30,31,33,34,80,81")
    ap.add_argument("--ablate", action="store_true")
    ap.add_argument("--orin", action="store_true")
    ap.add_argument("--configs", default="full,green16")
    ap.add_argument("--source", help="time this copy of the plugin source as 'shipped' (A/B against another commit: "
                    "git show REV:plugins/vitbit_gemm/vitbit_gemm.cu > /tmp/x/vitbit_gemm.cu)")
    ap.add_argument("--name", default="", help="results file tag")
    ap.add_argument("--gelu", action="store_true", help="layers with GELU fused (fc1; the kernels' _gelu builds, so "
                    "not with --source of a commit before round 8); not bit for bit: checked within rtol 2e-3, "
                    "atol 1e-3, and the fp16 ulps from the float64 reference are recorded per output")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--shapes", default=",".join(f"{k}:{n}" for k, n in SHAPES),
                    help="layers as K:N, comma-separated (default: issue 5's ViT-B/16 layers)")
    ap.add_argument("--tokens", type=int, default=197, help="M = tokens x batch (197: ViT-B/16 at 224 px)")
    args = ap.parse_args()
    tactics = [int(t) for t in args.tactics.split(",") if t]
    orin_tactics = [int(t) for t in args.orin_tactics.split(",") if t]
    if 1 in orin_tactics:
        raise SystemExit("--orin-tactics: tactic 1 resolves per context; time it in --tactics (shipped rows)")
    batches = [int(b) for b in args.batches.split(",") if b]
    shapes = parse_shapes(args.shapes)

    import torch
    from cuda.bindings import driver as cu

    from bench._common import meta, write_results
    from edgesdk.kernels import _cuda
    from edgesdk.kernels import vitbit_gemm as K
    from edgesdk.reference import vitbit_gemm as R

    B = _bench_module()
    torch.zeros(1, device="cuda")
    _cuda.init()
    prim = _cuda.check(cu.cuCtxGetCurrent())
    arch = _cuda.current_arch()
    shipped = str(Path(args.source).resolve()) if args.source else str(_cuda.PLUGINS_DIR / K.SOURCE)
    tmp = Path(tempfile.mkdtemp(prefix="vitbit_explore_"))
    text = Path(shipped).read_text()
    sources = {"shipped": shipped}
    if args.ablate:
        (tmp / "noepi").mkdir()
        sources["noepi"] = str(tmp / "noepi" / "vitbit_gemm.cu")
        Path(sources["noepi"]).write_text(ablated_source(text))
    if args.orin:
        (tmp / "orin").mkdir()
        sources["orin"] = str(tmp / "orin" / "vitbit_gemm.cu")
        Path(sources["orin"]).write_text(text)
    with concurrent.futures.ThreadPoolExecutor(len(sources)) as ex:  # nvcc runs in parallel
        list(ex.map(lambda s: _cuda.compile_cubin(Path(s), arch), sources.values()))

    def kernel(kind: str, t: int):
        cfg, _ = K.config(t)
        return cfg, _cuda.get_kernel(sources[kind], K.kernel_name(cfg, args.gelu))

    A = cu.CUfunction_attribute
    orin_info = {}

    def orin_setup(label: str) -> None:
        """In the current context: ask the "orin" copy's kernels for Orin's carveout; their Orin residency."""
        for t in orin_tactics:
            cfg, kern = kernel("orin", t)
            kern.set_max_dynamic_smem(cfg.smem)
            _cuda.check(cu.cuFuncSetAttribute(kern.function, A.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                              ORIN_CARVEOUT_PERCENT))
            regs = _cuda.check(cu.cuFuncGetAttribute(A.CU_FUNC_ATTRIBUTE_NUM_REGS, kern.function))
            per_sm = _cuda.check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(kern.function, cfg.threads, cfg.smem))
            orin_info[t] = {"kernel": cfg.name, "regs": regs, "threads": cfg.threads, "smem": cfg.smem,
                            "orin_blocks_per_sm": orin_blocks(regs, cfg.threads, cfg.smem),
                            "occupancy_query_at_carveout": per_sm}
            print(f"[{label}] orin occupancy t{t}: {orin_info[t]}", flush=True)

    occ: dict = {}
    resolved: dict = {}  # config label -> what tactic 1 resolved to on the current layer and M

    def blocks_per_sm(label: str, kind: str, t: int) -> int:
        """Resident blocks per SM of tactic ``t``'s GEMM kernel in the current context (the head kernel of a
        split-M tactic; Orin's count for the ``orin`` rows): what a wave-aware rule needs besides the shape."""
        if kind == "orin":
            return orin_info[t]["orin_blocks_per_sm"]
        if t == K.AUTO:
            t = resolved[label]
        if (label, kind, t) not in occ:
            cfg, kern = kernel(kind, t)
            kern.set_max_dynamic_smem(cfg.smem)
            occ[(label, kind, t)] = int(_cuda.check(
                cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(kern.function, cfg.threads, cfg.smem)))
        return occ[(label, kind, t)]

    rows: list[dict] = []
    ulps: dict = {}
    bad_total = checked = 0

    def save(complete: bool) -> Path:
        """Write what is measured so far (after every layer, so a run cut short keeps its rows)."""
        info = meta({"source": args.source or "plugins/vitbit_gemm/vitbit_gemm.cu", "tactics": tactics,
                     "orin": orin_info, "ablate": args.ablate, "gelu": args.gelu, "shapes": shapes,
                     "tokens": args.tokens, "batches": batches, "complete": complete, "checked_outputs": checked,
                     "mismatched_values": bad_total, "method": __doc__.split("\n\n")[1]})
        if os.environ.get("EDGESDK_COMMIT"):
            info["commit"] = os.environ["EDGESDK_COMMIT"]
        tag = ("_gelu" if args.gelu else "") + (f"_{args.name}" if args.name else "")
        return write_results(f"vitbit_gemm_explore{tag}_{info.get('commit', 'local')}", rows, info)
    rng = np.random.default_rng(0)
    for label in args.configs.split(","):
        if label == "full":
            ctx, stream = prim, torch.cuda.Stream().cuda_stream
        else:
            ctx, sms = _cuda.green_context(int(label.removeprefix("green")))
            _cuda.check(cu.cuCtxSetCurrent(ctx))
            stream = int(_cuda.check(cu.cuStreamCreate(1)))
        _cuda.check(cu.cuCtxSetCurrent(ctx))
        timer = B.Timer(stream, ctx, _cuda.get_kernel("common/selftest.cu", "edgesdk_ffma_spin"))
        if args.orin and label != "full":
            orin_setup(label)
        for (k, n) in shapes:
            for b in batches:
                m = args.tokens * b
                w = [rng.integers(-128, 128, (n, k)).astype(np.int8) for _ in range(B.ROT)]
                p = [F.VitBitWeights.pack(wi, rng.uniform(0.001, 0.01, n).astype(np.float32),
                                          bias=rng.normal(0, 1, n).astype(np.float32), x_scale=0.02,
                                          gelu=args.gelu, y_dtype="float16") for wi in w]
                a = p[0].node_attributes()
                dev = [{kk: torch.from_numpy(v).cuda() for kk, v in pi.to_tensors().items()} for pi in p]
                xq_h = rng.integers(-128, 128, (m, k)).astype(np.int8)
                xq = torch.from_numpy(xq_h).cuda()
                y = torch.empty(m, n, device="cuda", dtype=torch.float16)
                ws = torch.zeros(K.workspace_bytes(a, m), dtype=torch.uint8, device="cuda")  # split-K partials
                ins = [[d[t].data_ptr() for t in F.TENSOR_NAMES] for d in dev]
                ref = R.vitbit_gemm(xq_h, p[0])
                res = {}

                def run(kind, t, i, cap=None):
                    K.SOURCE = sources[kind]
                    old = K.PERSISTENT_GRID_CAP
                    K.PERSISTENT_GRID_CAP = cap
                    try:
                        K.gemm(a, "int8", m, xq.data_ptr(), ins[i % B.ROT][0], ins[i % B.ROT][1], ins[i % B.ROT][2],
                               y.data_ptr(), stream, t, part=ws.data_ptr() + K._xq_bytes(m, k))
                    finally:
                        K.PERSISTENT_GRID_CAP = old
                        K.SOURCE = "vitbit_gemm/vitbit_gemm.cu"

                ok_t = set(K.valid_tactics(a, m))  # split-K tactics have a size limit (workspace)
                variants = [("shipped", t, None) for t in tactics if t in ok_t]
                if K.AUTO in tactics:
                    _cuda.check(cu.cuCtxSetCurrent(ctx))
                    resolved[label] = K.resolve_tactic(a, m)
                concrete = [t for t in tactics if t != K.AUTO]
                if args.ablate:
                    variants += [("noepi", t, None) for t in concrete if t in ok_t and K.config(t)[0].persistent]
                if args.orin and label != "full":
                    variants += [("orin", t, 16 * orin_info[t]["orin_blocks_per_sm"]) for t in orin_tactics
                                 if t in ok_t and t != K.AUTO]
                for kind, t, cap in variants:
                    if kind == "shipped":  # check the output once: Y poisoned, int64 reference
                        _cuda.check(cu.cuCtxSetCurrent(ctx))
                        y.fill_(float("nan"))
                        run(kind, t, 0)
                        _cuda.check(cu.cuCtxSynchronize())
                        got = y.cpu().numpy()
                        if args.gelu:
                            ok = np.isclose(got.astype(np.float64), ref.astype(np.float64), rtol=2e-3, atol=1e-3)
                            bad = int((~ok).sum())
                            u = R.fp16_ulps(got, ref)
                            ulps[(label, k, n, m, t)] = {"max_fp16_ulps": int(u.max()),
                                                         "fp16_differ": int((u > 0).sum()), "values": int(u.size)}
                        else:
                            bad = int((got.view(np.uint16) != ref.view(np.uint16)).sum())
                        bad_total += bad
                        checked += 1
                        if bad:
                            print(f"BAD {label} t{t} {k}x{n}x{m}: {bad} of {ref.size} differ", flush=True)
                    us = timer(lambda i, kind=kind, t=t, cap=cap: run(kind, t, i, cap))
                    name = f"{kind} t{t}"
                    res[name] = us
                    rt = resolved[label] if t == K.AUTO else t
                    rows.append({"config": label, "K": k, "N": n, "M": m, "kind": kind, "tactic": t,
                                 "kernel": K.config(rt)[0].name, "grid_cap": cap,
                                 "blocks_per_sm": blocks_per_sm(label, kind, t), "us": us,
                                 "TOPS": 2.0 * m * n * k / us / 1e6} | ({"resolved": rt} if t == K.AUTO else {})
                                | (ulps.get((label, k, n, m, t), {}) if kind == "shipped" else {}))
                print(f"[{label}] K={k} N={n} M={m}: " + ", ".join(f"{kk} {v:.2f}" for kk, v in res.items()),
                      flush=True)
            save(complete=False)
    _cuda.check(cu.cuCtxSetCurrent(prim))
    path = save(complete=True)
    if ulps:
        differ = sum(v["fp16_differ"] for v in ulps.values())
        total = sum(v["values"] for v in ulps.values())
        print(f"GELU: largest fp16 ulps from the float64 reference {max(v['max_fp16_ulps'] for v in ulps.values())}, "
              f"{differ} of {total} values ({differ / total:.3%}) differ")
    print(f"checked {checked} outputs, {bad_total} values differ; wrote {path}")
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main())
