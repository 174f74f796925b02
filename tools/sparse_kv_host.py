"""Host time per call of the sparse KV launchers with the real CUDA driver, and the wall time a caller waits.

The GPU side of ``decode_attention`` is a few µs at batch 1; a Python launcher that spends more than that per call
makes every decode step (and every token of a prompt fed through the ``EdgeSparseKVAttention`` node, one step per
token) host-bound. For one layer shape (default Llama-3.2-1B-like attention, batch 1, 4096 cached tokens, 70 %),
per launcher module — this repository's ``edgesdk.kernels.sparse_kv`` and, with ``--launcher FILE`` (repeatable),
other versions of that file (e.g. ``git show REV:edgesdk/kernels/sparse_kv.py``), loaded side by side in one process
on the same cache — it measures (a ``.cu`` file beside ``FILE`` with the same stem is taken as that version's kernel
source: launchers and kernels of one commit belong together):

* ``host_us``: µs of Python per call, calls timed in batches without waiting for the GPU (synchronised between
  batches, outside the timing), median over rounds in which every launcher version takes its turn (the host's
  drift falls on all of them alike);
* ``wall_us``: µs from the call to the end of its GPU work (call, then ``cudaStreamSynchronize``), median;
* ``gpu_us`` (``decode_attention`` only): µs per call in CUDA-graph replays (what the GPU itself spends).

Cases: ``decode_attention``; ``run_node`` (the node's TensorRT ``enqueue``) with 1 and 16 new tokens, the state
aliased, the same lengths every call (the steps re-append the same positions; timing only). Every launcher's
``decode_attention`` output is compared with the first one's (bit-identical expected: same kernels).

    git show REV:edgesdk/kernels/sparse_kv.py > /tmp/old.py; git show REV:plugins/sparse_kv/sparse_kv.cu > /tmp/old.cu
    python tools/sparse_kv_host.py [--launcher /tmp/old.py] [--json bench/results/sparse_kv_host.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench._common import meta, print_table, time_graph, write_json  # noqa: E402
from edgesdk.formats.sparse_kv import SparseKVConfig  # noqa: E402
from edgesdk.kernels import sparse_kv as ks  # noqa: E402


def load_launcher(path: str, i: int):
    """Another version of ``edgesdk/kernels/sparse_kv.py`` as its own module (its own plan caches)."""
    spec = importlib.util.spec_from_file_location(f"edgesdk.kernels._sparse_kv_alt{i}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cu = Path(path).with_suffix(".cu")
    if cu.is_file():
        mod.SOURCE = str(cu.resolve())
    return mod


def host_us(call, per_batch: int, batches: int) -> float:
    samples = []
    for _ in range(batches):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(per_batch):
            call()
        samples.append((time.perf_counter() - t0) / per_batch * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def wall_us(call, reps: int) -> float:
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launcher", action="append", default=[], help="another sparse_kv.py to time beside this one")
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--sparsity", type=float, default=0.7)
    ap.add_argument("--batches", type=int, default=30, help="rounds (each launcher: one host batch, 3 waited calls)")
    ap.add_argument("--json", default=None, help="write the results here (bench/results/...)")
    a = ap.parse_args()

    mods = [("this", ks)] + [(p, load_launcher(p, i)) for i, p in enumerate(a.launcher)]
    d, B, ctx, S_max = 64, 1, a.context, 16
    cfg = SparseKVConfig(d, a.hq, a.hkv, a.sparsity, a.sparsity, ctx + S_max)
    gen = torch.Generator(device="cuda").manual_seed(7)
    rnd = lambda *shape: torch.randn(shape, device="cuda", dtype=torch.float16, generator=gen)  # noqa: E731
    k, v, q = rnd(B, a.hkv, ctx, d), rnd(B, a.hkv, ctx, d), rnd(B, a.hq, d)
    lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    state = [torch.zeros((B, a.hkv, cfg.record_capacity, cfg.rk), device="cuda", dtype=torch.int8),
             torch.zeros((B, a.hkv, cfg.record_capacity, cfg.rv), device="cuda", dtype=torch.int8),
             torch.zeros((B, a.hkv, cfg.ring, d), device="cuda", dtype=torch.float16),
             torch.zeros((B, a.hkv, cfg.ring, d), device="cuda", dtype=torch.float16)]
    cache = ks.CachePtrs(*(t.data_ptr() for t in state), lens.data_ptr())
    stream = torch.cuda.current_stream().cuda_stream
    ks.prefill(cfg, B, ctx, k.data_ptr(), v.data_ptr(), cache, stream)
    torch.cuda.synchronize()

    # Per launcher: its workspace, output and the callables of the three cases. The decode outputs are compared
    # first, before any node call writes to the cache.
    calls, first_out, same = {}, None, {}
    node_in = {S: (rnd(B, a.hq, S, d), rnd(B, a.hkv, S, d), rnd(B, a.hkv, S, d),
                   torch.full((B,), ctx + S, dtype=torch.int32, device="cuda"),
                   torch.empty((B, a.hq, S, d), device="cuda", dtype=torch.float16)) for S in (1, S_max)}
    ptrs = [t.data_ptr() for t in state]
    for label, mod in mods:
        _, ns = mod.plan_cache(cfg, B, ctx)
        _, node_ws = mod.node_plan(cfg, B)
        ws = torch.zeros(max(mod.workspace_bytes(a.hq, d, B, ns), node_ws) // 4 + 1, device="cuda")
        out = torch.empty((B, a.hq, d), device="cuda", dtype=torch.float16)

        def attend(mod=mod, out=out, ws=ws, stream=stream):
            mod.decode_attention(cfg, B, ctx, q.data_ptr(), cache, out.data_ptr(), ws.data_ptr(), stream)

        def node(S, mod=mod, ws=ws):
            qn, kn, vn, lengths, node_out = node_in[S]
            mod.run_node(cfg, 0.125, B, S, qn.data_ptr(), kn.data_ptr(), vn.data_ptr(), ptrs, ptrs,
                         lengths.data_ptr(), node_out.data_ptr(), ws.data_ptr(), stream)

        attend()
        torch.cuda.synchronize()
        if first_out is None:
            first_out = out.clone()
        same[label] = bool(torch.equal(out, first_out))
        gpu = time_graph(lambda attend=attend: attend(stream=torch.cuda.current_stream().cuda_stream), inner=20,
                         reps=10)
        calls[label] = {f"decode_attention B={B} ctx={ctx}": (attend, 20, gpu),
                        f"run_node B={B} S=1 (per call)": (lambda node=node: node(1), 20, None),
                        f"run_node B={B} S={S_max} (per call)": (lambda node=node: node(S_max), 2, None)}
        for fn, _, _ in calls[label].values():
            fn()  # plans built, modules loaded
    torch.cuda.synchronize()

    # Rounds: every launcher in turn, one host batch and a few waited calls each, so that the host's drift (clock,
    # other tenants) falls on all of them alike; medians over the rounds.
    host = {(lb, c): [] for lb in calls for c in calls[lb]}
    wall = {(lb, c): [] for lb in calls for c in calls[lb]}
    for _ in range(a.batches):
        for case in calls[mods[0][0]]:
            for label, _ in mods:
                fn, per_batch, _ = calls[label][case]
                host[(label, case)].append(host_us(fn, per_batch, 1))
                wall[(label, case)].append(wall_us(fn, 3))
    rows = [{"launcher": label, "case": case, "host_us": statistics.median(host[(label, case)]),
             "wall_us": statistics.median(wall[(label, case)]), "gpu_us": calls[label][case][2],
             "same_output": same[label] if case.startswith("decode") else None}
            for label, _ in mods for case in calls[label]]

    print_table(rows, ["launcher", "case", "host_us", "wall_us", "gpu_us", "same_output"])
    if a.json:
        write_json(Path(a.json), rows, meta({"shape": {"hq": a.hq, "hkv": a.hkv, "d": d, "batch": B,
                                                                "context": ctx, "sparsity": a.sparsity},
                                                      "launchers": [m[0] for m in mods]}))
    return 0 if all(r["same_output"] in (None, True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
