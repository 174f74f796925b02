"""Rewrite graphs from real exporters: ViT and Llama-style decoders via torch.onnx legacy and dynamo.

Small dims for speed; the structure (LayerNorm/RMSNorm, qkv/proj/fc1/fc2, q/k/v/o/gate/up/down with
GQA, lm_head, dynamic batch/sequence) is what the full-size models have.
"""

import numpy as np
import onnx
import pytest

from edgesdk.inspect import find_linears
from edgesdk.quantize import quantize_int8
from test_rewrite import ORIN, cfg, check_plugin_nodes, check_structure, polygraphy_compare

torch = pytest.importorskip("torch")
nn = torch.nn


class Block(nn.Module):
    def __init__(self, d=32, heads=2):
        super().__init__()
        self.h = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = ((qkv[0] @ qkv[1].transpose(-2, -1)) * (d // self.h) ** -0.5).softmax(-1)
        x = x + self.proj((a @ qkv[2]).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


class TinyViT(nn.Module):
    """16x16 one-channel images, 4x4 patches → 17 tokens (class token + 16)."""

    def __init__(self, d=32):
        super().__init__()
        self.patch = nn.Conv2d(1, d, 4, 4)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 17, d) * 0.02)
        self.blocks = nn.Sequential(Block(d), Block(d))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Decoder(nn.Module):
    """Llama layer: RMSNorm, q/k/v/o with grouped KV heads, SiLU gate/up/down; tied-free lm_head."""

    def __init__(self, vocab=101, d=32, heads=4, kv=2, ffn=88, layers=2):
        super().__init__()
        self.heads, self.kv, self.hd = heads, kv, d // heads
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            m = nn.Module()
            m.input_layernorm, m.post_attention_layernorm = RMSNorm(d), RMSNorm(d)
            m.q_proj, m.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, kv * self.hd, bias=False)
            m.v_proj, m.o_proj = nn.Linear(d, kv * self.hd, bias=False), nn.Linear(d, d, bias=False)
            m.gate_proj, m.up_proj = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False)
            m.down_proj = nn.Linear(ffn, d, bias=False)
            self.layers.append(m)
        self.norm, self.lm_head = RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        b, t, _ = x.shape
        mask = torch.full((t, t), float("-inf")).triu(1)
        for m in self.layers:
            h = m.input_layernorm(x)
            q = m.q_proj(h).view(b, t, self.heads, self.hd).transpose(1, 2)
            k = m.k_proj(h).view(b, t, self.kv, self.hd).transpose(1, 2).repeat_interleave(self.heads // self.kv, 1)
            v = m.v_proj(h).view(b, t, self.kv, self.hd).transpose(1, 2).repeat_interleave(self.heads // self.kv, 1)
            a = ((q @ k.transpose(-2, -1)) * self.hd ** -0.5 + mask).softmax(-1)
            x = x + m.o_proj((a @ v).transpose(1, 2).reshape(b, t, -1))
            h = m.post_attention_layernorm(x)
            x = x + m.down_proj(nn.functional.silu(m.gate_proj(h)) * m.up_proj(h))
        return self.lm_head(self.norm(x))


def _export(module, args, path, names, dynamo, dyn_axes):
    torch.manual_seed(0)
    kw = dict(input_names=names[:1], output_names=names[1:])
    if dynamo:
        shapes = ({ax: torch.export.Dim(n, min=2, max=64) for ax, n in dyn_axes.items()},)
        torch.onnx.export(module, args, str(path), dynamic_shapes=shapes, dynamo=True, opset_version=18, **kw)
    else:
        torch.onnx.export(module, args, str(path), dynamic_axes={names[0]: dyn_axes}, dynamo=False,
                          opset_version=17, **kw)
    m = onnx.load(str(path))
    m.ir_version = min(m.ir_version, 10)
    return m


@pytest.fixture(scope="module", params=["legacy", "dynamo"])
def vit(request, tmp_path_factory):
    torch.manual_seed(0)
    model = TinyViT().eval()
    path = tmp_path_factory.mktemp("vit") / f"vit_{request.param}.onnx"
    m = _export(model, (torch.randn(2, 1, 16, 16),), path, ["pixels", "logits"], request.param == "dynamo", {0: "batch"})
    rng = np.random.default_rng(0)
    feeds = [{"pixels": rng.standard_normal((3, 1, 16, 16)).astype(np.float32)} for _ in range(2)]
    return m, feeds


@pytest.fixture(scope="module", params=["legacy-llama", "dynamo-llama", "dynamo-hf-llama"])
def decoder(request, tmp_path_factory):
    torch.manual_seed(0)
    kind = request.param
    if kind == "dynamo-hf-llama":
        transformers = pytest.importorskip("transformers")
        conf = transformers.LlamaConfig(vocab_size=101, hidden_size=32, intermediate_size=88, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        hf = transformers.LlamaForCausalLM(conf).eval()

        class Logits(nn.Module):
            def __init__(self):
                super().__init__()
                self.m = hf

            def forward(self, ids):
                return self.m(input_ids=ids, use_cache=False).logits

        module = Logits()
    else:
        module = Decoder().eval()
    path = tmp_path_factory.mktemp("llm") / f"{kind}.onnx"
    ids = torch.randint(0, 101, (1, 7))
    m = _export(module, (ids,), path, ["input_ids", "logits"], kind.startswith("dynamo"), {1: "seq"})
    rng = np.random.default_rng(1)
    feeds = [{"input_ids": rng.integers(0, 101, (1, t)).astype(np.int64)} for t in (5, 9)]
    return m, feeds


def test_vit_every_linear_to_bitmap(vit):
    m, feeds = vit
    n_lin = len(find_linears(m))
    assert n_lin == 9  # 2 x (qkv, proj, fc1, fc2) + head
    new, report = rewrite_model_checked(m, cfg(sparsity=0.5, kernels="bitmap"))
    check_structure(m, new, n_lin)
    assert all(r["kernel"] == "bitmap" and abs(r["sparsity"] - 0.5) < 0.02 for r in report)
    assert check_plugin_nodes(new, feeds) == n_lin


def test_vit_int8_every_linear_to_vitbit_and_auto(vit):
    m, feeds = vit
    q = quantize_int8(m, feeds, find_linears(m))
    # auto: Q/DQ linears with 17 tokens per image → vitbit; the head sees one row per image
    # (decode-style, dense) → left to TensorRT with its reason
    new, report = rewrite_model_checked(q, cfg(kernels="auto"))
    check_structure(q, new, 8)
    assert [r["kernel"] for r in report] == ["vitbit"] * 8 + ["none"]
    assert "M=1 row per call (memory-bound" in report[-1]["reason"]
    new, report = rewrite_model_checked(q, cfg(kernels="vitbit"))
    nodes = check_structure(q, new, 9)
    assert [r["kernel"] for r in report] == ["vitbit"] * 9
    ops = [n.op_type for n in new.graph.node]
    assert not {"DequantizeLinear", "Erf"} & set(ops)
    # every node reads the int8 output of a QuantizeLinear kept in the graph
    qout = {n.output[0] for n in new.graph.node if n.op_type == "QuantizeLinear"}
    assert all(n.input[0] in qout for n in nodes) and len(qout) == ops.count("QuantizeLinear") == 9
    gelu = [n.name for n in nodes if any(a.name == "gelu" and a.i == 1 for a in n.attribute)]
    assert gelu == ["blocks.0.fc1/EdgeVitBitGemm", "blocks.1.fc1/EdgeVitBitGemm"]  # fc1 + GELU fused
    assert check_plugin_nodes(new, feeds) == 9
    assert polygraphy_compare(q, new, feeds, atol=2e-3, rtol=2e-3)
    # --vitbit-input float: the nodes quantize X themselves, no Q/DQ left; same int8 math
    flt, _ = rewrite_model_checked(q, cfg(kernels="vitbit", vitbit_input="float"))
    assert not {"QuantizeLinear", "DequantizeLinear", "Erf"} & {n.op_type for n in flt.graph.node}
    assert check_plugin_nodes(flt, feeds) == 9
    assert polygraphy_compare(new, flt, feeds, atol=0, rtol=0)


def test_decoder_every_linear_to_bitmap(decoder):
    m, feeds = decoder
    n_lin = len(find_linears(m))
    assert n_lin == 15  # 2 x (q, k, v, o, gate, up, down) + lm_head
    new, report = rewrite_model_checked(m, cfg(sparsity=0.5, kernels="auto", include_lm_head=True))
    # auto: sequence is symbolic → decode-style (M = 1) and 50 % sparse → bitmap everywhere
    assert [r["kernel"] for r in report] == ["bitmap"] * n_lin
    check_structure(m, new, n_lin)
    assert check_plugin_nodes(new, feeds) == n_lin
    # without include_lm_head the head is left alone, with its reason
    new, report = rewrite_model_checked(m, cfg(sparsity=0.5, kernels="bitmap"))
    head = [r for r in report if r["kernel"] == "none"]
    assert len(head) == 1 and "LM head" in head[0]["reason"]
    check_structure(m, new, n_lin - 1)
    # sparsity 0 with fp16 values: the function of the original model, up to fp16 weight rounding
    dense, _ = rewrite_model_checked(m, cfg(sparsity=0.0, kernels="bitmap", include_lm_head=True))
    assert polygraphy_compare(m, dense, feeds, atol=5e-3, rtol=5e-3)


def test_decoder_int8_bitmap_and_vitbit(decoder):
    m, feeds = decoder
    q = quantize_int8(m, feeds, find_linears(m))
    new, report = rewrite_model_checked(q, cfg(sparsity=0.5, kernels="auto"))
    assert [r["kernel"] for r in report].count("bitmap") == 14  # lm_head not quantized, not included
    check_structure(q, new, 14)
    check_plugin_nodes(new, feeds)
    dense, _ = rewrite_model_checked(q, cfg(sparsity=0.0, kernels="bitmap"))
    assert polygraphy_compare(q, dense, feeds, atol=1e-4, rtol=1e-4)
    # --kernels vitbit --include-lm-head: every linear, the head included, is an EdgeVitBitGemm
    new, report = rewrite_model_checked(q, cfg(kernels="vitbit", include_lm_head=True))
    assert [r["kernel"] for r in report] == ["vitbit"] * 15
    check_structure(q, new, 15)
    assert check_plugin_nodes(new, feeds) == 15


def rewrite_model_checked(model, config):
    from edgesdk.rewrite import rewrite_model

    new, report = rewrite_model(model, config, None, ORIN)
    assert len(report) == len(find_linears(model))
    return new, report
