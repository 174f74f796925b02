"""Terminal output at 80 columns (an SSH session on a Jetson): names whole, numbers never cut, notes readable."""

import re
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from rich.console import Console
from typer.testing import CliRunner

from edgesdk.cli import app
from edgesdk.devices import PROFILES
from edgesdk.report import print_summary
from edgesdk.tables import grouped_notes, wrap_ident

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "models" / "digits_vit.onnx"
runner = CliRunner()

NOTE = "auto: decode-style (M=1) but sparsity 0.00 < 0.3: the dense kernel reads fewer bytes"
LONG = "model.layers.29.mlp.down_projection_with_a_rather_long_name"  # 58 characters: must be folded at 80
REPORT = {
    "layers": [
        dict(name="lm.head_proj", kind="Gemm", shape=(576, 10), quantized=True, sparsity=0.0, kernel="none",
             bytes_dense=11520, bytes_packed=None, reason=NOTE),
        dict(name="model.layers.0.self_attn.q_proj", kind="MatMul", shape=(576, 576), quantized=True, sparsity=0.5,
             kernel="bitmap", bytes_dense=663552, bytes_packed=381000,
             measured=dict(plugin="bitmap", bitmap_us=5.0, dense_us=8.0)),
        dict(name=LONG, kind="MatMul", shape=(1536, 576), quantized=True, sparsity=0.5, kernel="bitmap",
             bytes_dense=1769472, bytes_packed=1017000),
    ],
    "verify": [dict(against="pruned_reference", output="logits", samples=4, max_abs=0.112, mean_abs=0.0284,
                    rel_l2=0.0221, cosine=0.999761, top1_agreement=1.0, passed=True),
               dict(against="original", output="logits", samples=4, max_abs=1.5e-05, mean_abs=2.25e-06,
                    rel_l2=0.0312, cosine=0.99512, top1_agreement=0.75, passed=True, gate=False)],
    "engine": {"built": False, "reason": "TensorRT is not installed on this machine"},
}


def invoke_at(width: int, args: list[str]):
    """The CLI on a terminal ``width`` columns wide. The CLI's consoles are made at import, where rich reads
    COLUMNS once if it is set (pytest-xdist sets it), so the width is given to them, not through the environment."""
    import edgesdk.cli as cli

    saved = cli.console.width, cli.err_console.width
    cli.console.width = cli.err_console.width = width
    try:
        return runner.invoke(app, args, env={"COLUMNS": str(width)})
    finally:
        cli.console.width, cli.err_console.width = saved


def render(width: int, report=REPORT) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    print_summary(report, console)
    return console.export_text().splitlines()


def flat(lines) -> str:
    return re.sub(r"\s+", " ", " ".join(lines))


def test_build_summary_at_80_columns():
    lines = render(80)
    assert max(map(len, lines)) <= 80 and not any("…" in ln for ln in lines), "\n".join(lines)
    # the 58-character name does not fit: the name column is folded (names broken onto more lines, not cut),
    # each line of it ending after a separator
    first = next(i for i, ln in enumerate(lines) if ln.startswith("model.layers.29"))
    pieces = [lines[first].split("  ")[0]]
    for ln in lines[first + 1:]:
        if ln.startswith(" ") or len(ln.split()) != 1:  # not a continuation of the name cell
            break
        pieces.append(ln.strip())
    assert LONG not in "\n".join(lines) and "".join(pieces).startswith(LONG), "\n".join(lines)
    assert all(piece[-1] in "._" for piece in pieces[:-1]), pieces
    # every number of every row is whole
    for cell in ("576×576", "1536×576", "0.66", "0.38", "1.77", "1.02", "0.112", "0.0284", "0.99976", "1.5e-05",
                 "0.7500", "PASS", "(cost)"):
        assert re.search(rf"(^|\s){re.escape(cell)}(\s|$)", "\n".join(lines)), cell
    # the notes do not fit beside the table: they follow it, one per layer, wrapped at word boundaries
    text = flat(lines)
    assert f"lm.head_proj: {NOTE}" in text
    assert "model.layers.0.self_attn.q_proj: measured: 5.0 µs vs dense 8.0 µs (1.60×)" in text


def test_build_summary_at_80_columns_keeps_names_whole_where_they_fit():
    lines = render(80, {**REPORT, "layers": REPORT["layers"][:2]})
    assert max(map(len, lines)) <= 80 and not any("…" in ln for ln in lines), "\n".join(lines)
    assert any(ln.startswith("model.layers.0.self_attn.q_proj ") for ln in lines)


def test_build_summary_llm_names_at_80_columns():
    """Llama-style names (32 characters): the INT8 state every layer shares is said once above the table, so the
    names stay whole; sparsity differs between layers, so it stays a column."""
    layers = [dict(name=f"model.layers.{i}.{p}", kind="MatMul", shape=(k, n), quantized=True, sparsity=s,
                   kernel="bitmap", bytes_dense=2 * k * n, bytes_packed=k * n)
              for i in (0, 15) for p, (k, n), s in (("self_attn.q_proj", (2048, 2048), 0.5),
                                                    ("self_attn.k_proj", (2048, 512), 0.3),
                                                    ("mlp.down_proj", (8192, 2048), 0.7))]
    layers[1]["reason"] = NOTE
    lines = render(80, {"layers": layers})
    assert max(map(len, lines)) <= 80 and not any("…" in ln for ln in lines), "\n".join(lines)
    for r in layers:
        assert any(ln.startswith(r["name"] + " ") for ln in lines), "\n".join(lines)
    assert any(ln.strip() == "every row: int8 yes" for ln in lines), "\n".join(lines)
    assert any(re.match(r"layer\s+K×N\s+sparsity\s+kernel\s", ln) for ln in lines), "\n".join(lines)
    assert any(re.search(r"\s2048×512\s+0\.30\s+bitmap\s+2\.10\s+1\.05$", ln) for ln in lines), "\n".join(lines)
    assert f"model.layers.0.self_attn.k_proj: {NOTE}" in flat(lines)
    # a wide terminal keeps every column and the note beside its row
    lines = render(200, {"layers": layers})
    assert not any("every row" in ln for ln in lines) and any(ln.rstrip().endswith(NOTE) for ln in lines)
    assert any(re.match(r"layer\s+K×N\s+int8\s+sparsity", ln) for ln in lines), "\n".join(lines)


def test_build_summary_wide_terminal_keeps_notes_in_the_table():
    lines = render(220)
    assert any(ln.startswith("lm.head_proj ") and ln.rstrip().endswith(NOTE) for ln in lines), "\n".join(lines)
    assert any(ln.startswith(LONG + " ") for ln in lines)


def test_devices_and_inspect_at_80_columns():
    r = invoke_at(80, ["devices"])
    assert r.exit_code == 0, r.output
    table = [ln for ln in r.output.splitlines() if not ln.startswith("host:")]  # the host note wraps as text
    assert max(map(len, table)) <= 80 and "…" not in r.output, r.output
    starts = {ln.split(" ")[0] for ln in table}
    assert {name for name in PROFILES} <= starts, r.output  # every name, whole, at the start of its row
    assert any(re.search(r"\s204\.8\s.*\s85\.2\s", ln) for ln in table)
    r = invoke_at(80, ["inspect", str(DIGITS), "--exclude", "head"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in r.output, r.output
    for name in ("blocks.0.qkv", "blocks.1.proj", "head"):
        assert any(ln.startswith(name + " ") for ln in lines), name
    assert all(w in r.output for w in ("excluded", "--exclude", "'head'"))


def test_wrap_ident():
    name = "lm.model.layers.10.self_attn.q_proj"
    for width in range(1, 40):
        lines = wrap_ident(name, width)
        assert "".join(lines) == name and all(len(ln) <= width for ln in lines), (width, lines)
    assert wrap_ident(name, 40) == [name]
    assert wrap_ident(name, 30) == ["lm.model.layers.10.self_attn.", "q_proj"]  # after a dot, not after "q_"
    assert wrap_ident(name, 14) == ["lm.model.", "layers.10.", "self_attn.", "q_proj"]
    assert wrap_ident("a_very_long_identifier", 12) == ["a_very_long_", "identifier"]  # no dot: after "_"
    assert wrap_ident("abcdefghijklmnopqrstuvwxyz", 12) == ["abcdefghijkl", "mnopqrstuvwx", "yz"]


def test_grouped_notes():
    notes = [("a.q", "slow"), ("a.k", "slow"), ("head", "float"), ("b.q", "slow")]
    assert grouped_notes(notes) == ["3 layers (a.q ... b.q): slow", "head: float"]
    assert grouped_notes(notes[:2], every=2) == ["every layer: slow"]
    assert grouped_notes(notes[:2], every=3) == ["2 layers (a.q, a.k): slow"]


def _llm_like(path: Path, layers: int = 3) -> list[str]:
    """A decoder-shaped chain of MatMuls named as Hugging Face names them (31-32 characters)."""
    rng = np.random.default_rng(3)
    names, nodes, inits, x = [], [], [], "x"
    for i in range(layers):
        for p in ("q", "k", "v", "o"):
            name = f"model.layers.{i}.self_attn.{p}_proj"
            w = (rng.standard_normal((64, 64)) * 0.1).astype(np.float32)
            inits.append(numpy_helper.from_array(w, name + ".weight"))
            nodes.append(helper.make_node("MatMul", [x, name + ".weight"], [name + ".out"], name=f"/{name}/MatMul"))
            names.append(name)
            x = name + ".out"
    graph = helper.make_graph(nodes, "llm_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 64])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 1, 64])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return names


def test_inspect_llm_names_at_80_columns(tmp_path):
    names = _llm_like(tmp_path / "llm.onnx")
    r = invoke_at(80, ["inspect", str(tmp_path / "llm.onnx")])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in r.output, r.output
    # every layer name whole at the start of its row: the values all rows share are said once above the table
    for name in names:
        assert any(ln.startswith(name + " ") for ln in lines), r.output
    assert "every row: op MatMul, weight KN, bias no" in r.output  # as many as it takes, in column order
    assert not any(re.match(r"layer\s+op\s", ln) for ln in lines), r.output
    # one note for the 12 layers that share it, not 12
    assert flat(lines).count("no plugin kernel") == 1 and "every layer: no plugin kernel: auto:" in flat(lines)
    # a wide terminal keeps every column
    r = invoke_at(200, ["inspect", str(tmp_path / "llm.onnx")])
    assert r.exit_code == 0 and "every row" not in r.output, r.output
    assert any(re.match(r"layer\s+op\s+K×N\s+weight\s+bias\s+int8", ln) for ln in r.output.splitlines()), r.output


def test_build_summary_prints_the_report_notes():
    lines = render(80, {**REPORT, "notes": ["verification skipped (--no-verify)"]})
    assert "Note: verification skipped (--no-verify)" in lines
