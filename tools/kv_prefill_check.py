"""Dense prefill vs decode-step prompts on the sparse KV cache: the continuation's perplexity after a prompt.

For windows of ``--prompt + --continue`` tokens of a text (token ids), the ``--continue`` tokens after the prompt are
scored (teacher forcing) three ways: by the dense decoder (``--dense``: the build ``edgesdk kv-sparsify`` rewrote,
or its export), by the rewritten decoder (``--kv``) with the prompt fed as decode steps of the sparse cache (the
node's semantics: each prompt token is pruned as it leaves the window, and later prompt tokens attend to the
pruned ones), and by the rewritten decoder after a dense prefill (``Decoder(prefill=...)``: the prompt through the
dense model, its cache compressed, as MUSTAFAR prefills). ONNX Runtime on the CPU::

    python tools/kv_prefill_check.py --kv out/llm_kv70 --dense llm/model.onnx --tokens text_ids.txt \\
        --prompt 192 --continue 64 --windows 4 --json kv_prefill.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import git_commit  # noqa: E402

import edgesdk  # noqa: E402
from edgesdk.calibration import token_ids  # noqa: E402
from edgesdk.generate import Decoder  # noqa: E402


def nll(logits: np.ndarray, targets: np.ndarray) -> float:
    """Summed negative log-likelihood of ``targets`` under ``logits`` [n, vocab] (float64 log-softmax)."""
    x = np.asarray(logits, np.float64)
    x = x - x.max(-1, keepdims=True)
    logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(targets)), targets].sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv", type=Path, required=True, help="the rewritten decoder (folder or .onnx)")
    ap.add_argument("--dense", type=Path, required=True, help="the dense decoder it was rewritten from")
    ap.add_argument("--tokens", type=Path, required=True, help="whitespace-separated token ids")
    ap.add_argument("--prompt", type=int, default=192)
    ap.add_argument("--continue", dest="cont", type=int, default=64)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    ids = token_ids(a.tokens.read_text(), str(a.tokens))[a.skip:]
    n = a.prompt + a.cont
    if ids.size < a.windows * n:
        raise SystemExit(f"{a.tokens} holds {ids.size} tokens after --skip, fewer than {a.windows} windows of {n}")
    totals = {"dense": [0.0, 0.0], "sparse, prompt as decode steps": [0.0, 0.0],
              "sparse, dense prefill": [0.0, 0.0]}
    with edgesdk.Engine(a.kv, backend="onnxruntime") as kv, edgesdk.Engine(a.dense, backend="onnxruntime") as dense:
        for w in range(a.windows):
            win = ids[w * n:(w + 1) * n]
            target = win[a.prompt:]
            t0 = time.perf_counter()
            got = Decoder(dense).feed(win[:-1])[a.prompt - 1:]
            totals["dense"][0] += nll(got, target)
            t1 = time.perf_counter()
            totals["dense"][1] += t1 - t0
            got = Decoder(kv).feed(win[:-1])[a.prompt - 1:]
            totals["sparse, prompt as decode steps"][0] += nll(got, target)
            t2 = time.perf_counter()
            totals["sparse, prompt as decode steps"][1] += t2 - t1
            dec = Decoder(kv, prefill=dense)
            first = dec.prefill(win[:a.prompt])[-1:]
            got = np.concatenate([first, dec.feed(win[a.prompt:-1])])
            totals["sparse, dense prefill"][0] += nll(got, target)
            totals["sparse, dense prefill"][1] += time.perf_counter() - t2
    scored = a.windows * a.cont
    rows = [{"method": k, "perplexity": math.exp(v[0] / scored), "nll": v[0] / scored, "seconds": v[1]}
            for k, v in totals.items()]
    base = rows[0]["perplexity"]
    print(f"{a.windows} windows: {a.prompt} prompt tokens, then {a.cont} scored ({scored} in all)")
    for r in rows:
        print(f"  {r['method']:34s} perplexity {r['perplexity']:8.3f} ({r['perplexity'] / base - 1:+.2%})  "
              f"{r['seconds']:.1f} s")
    if a.json:
        a.json.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": git_commit(), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (ONNX Runtime "
                                               f"{onnxruntime.__version__}, CPU)",
            "kv": str(a.kv), "dense": str(a.dense), "tokens": str(a.tokens),
                                      "prompt": a.prompt, "continue": a.cont, "windows": a.windows, "skip": a.skip,
                                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
