"""``edgesdk generate`` and ``edgesdk perplexity``: decode with an LLM build that carries its KV cache.

Registered on the main CLI by :func:`register`::

    edgesdk generate BUILD --prompt "The capital of France is" [--max-new-tokens 32] [--reference ORIG.onnx]
    edgesdk perplexity BUILD --text notes.txt [--context 256] [--windows 8] [--kv-sparsity 0.5 --kv-sparsity 0.7]
                             [--reference ORIG.onnx] [--json ppl.json]

Text goes through a Hugging Face ``tokenizer.json`` (``--tokenizer``; default: the one beside the model the build
was made from, as optimum exports it, or in the build folder), or token ids are given directly (``--prompt-ids``,
``--tokens FILE`` of whitespace-separated ids, as ``--calibration`` takes). ``--reference`` runs the original
model too (ONNX Runtime, as the build's verification does) and puts the two side by side. The work is
:mod:`edgesdk.generate`'s; errors are printed as ``edgesdk build``'s are (problem + fix, exit 1).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.text import Text

from edgesdk.errors import EdgeSDKError
from edgesdk.generate import Decoder
from edgesdk.generate import perplexity as score
from edgesdk.runtime_cli import BackendOpt, BuildArg, _at_least, _check_writable, _fail, _open_engine, _write_atomic
from edgesdk.tables import Fit, compact_table, num_column, text_column

console = Console()
TOKENIZER_NAME = "tokenizer.json"

TokenizerOpt = Annotated[Optional[Path], typer.Option(
    "--tokenizer", help="A Hugging Face tokenizer.json. \\[default: beside the model the build was made from, or in "
                        "the build folder]")]
ReferenceOpt = Annotated[Optional[Path], typer.Option(
    "--reference", help="The original .onnx (with its KV cache): run it too, with ONNX Runtime, side by side.")]
KvOpt = Annotated[Optional[list[float]], typer.Option(
    "--kv-sparsity", metavar="S", help="Also hold the KV cache as sparse_kv does at this sparsity (repeatable; 0 = fp16 cache).")]
WindowOpt = Annotated[int, typer.Option("--kv-window", help="Under --kv-sparsity: the dense window of the most recent tokens, also the tokens compressed at once (MUSTAFAR: 32).")]


def find_tokenizer(build: Path, given: Path | None) -> Path | None:
    """``given``, else ``tokenizer.json`` beside the build's source model (its report's ``model.path``) or in the
    build folder; None if there is none."""
    if given is not None:
        if not given.is_file():
            raise EdgeSDKError(f"--tokenizer {given} is not a file", "pass the tokenizer.json of the model "
                                                                    "(optimum exports it beside model.onnx)")
        return given
    from edgesdk.runtime import _build_report, find_build

    folder = build if build.is_dir() else build.parent
    places = [folder / TOKENIZER_NAME]
    onnx_path = find_build(build).onnx
    source = ((_build_report(onnx_path) or {}).get("model") or {}).get("path") if onnx_path else None
    if onnx_path is not None and source is None:  # written by `edgesdk kv-sparsify`: its source, recorded
        source = _metadata(onnx_path).get(SOURCE_KEY)
    if isinstance(source, str) and source:
        places.insert(0, Path(source).parent / TOKENIZER_NAME)
    return next((p for p in places if p.is_file()), None)


SOURCE_KEY = "edgesdk.source_model"


def _metadata(onnx_path: Path) -> dict:
    import onnx

    try:
        return {p.key: p.value for p in onnx.load(str(onnx_path), load_external_data=False).metadata_props}
    except Exception:
        return {}


class Tokenizer:
    """A Hugging Face ``tokenizers`` tokenizer (the library optimum's exports are written for)."""

    def __init__(self, path: Path):
        try:
            import tokenizers
        except ImportError:
            raise EdgeSDKError("reading text needs the `tokenizers` package", "pip install tokenizers (or give token "
                               "ids: --prompt-ids / --tokens)") from None
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:
            raise EdgeSDKError(f"cannot read {path} as a tokenizer.json ({e})",
                               "pass the tokenizer.json the model was exported with") from None
        self.path = path

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def parse_ids(text: str, where: str) -> list[int]:
    """Whitespace-separated non-negative token ids (:func:`edgesdk.calibration.token_ids`)."""
    from edgesdk.calibration import token_ids

    return token_ids(text, where, "tokenize the text first, or pass text with --prompt/--text and a "
                                  "--tokenizer").tolist()


def _read(path: Path, flag: str) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise EdgeSDKError(f"cannot read {flag} {path} ({getattr(e, 'strerror', None) or e})",
                           "pass a readable UTF-8 text file") from None


def _tokenizer(build: Path, given: Path | None, needed: bool) -> Tokenizer | None:
    path = find_tokenizer(build, given)
    if path is None:
        if needed:
            raise EdgeSDKError(f"no {TOKENIZER_NAME} given or found beside the build's source model or in {build}",
                               "pass --tokenizer PATH/tokenizer.json, or token ids (--prompt-ids / --tokens)")
        return None
    return Tokenizer(path)


def default_eos(tokenizer: Path | None) -> list[int] | None:
    """``eos_token_id`` of the ``generation_config.json`` (else ``config.json``) beside the tokenizer, as optimum
    exports them; None if neither says."""
    if tokenizer is None:
        return None
    for name in ("generation_config.json", "config.json"):
        try:
            eos = json.loads((tokenizer.parent / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(eos, int):
            return [eos]
        if isinstance(eos, list) and eos and all(isinstance(e, int) for e in eos):
            return eos
    return None


def generate(build: BuildArg,
             prompt: Annotated[Optional[str], typer.Option(help="Prompt text (through the tokenizer).")] = None,
             prompt_ids: Annotated[Optional[str], typer.Option("--prompt-ids", help="Prompt as token ids, e.g. '1 504 3458'.")] = None,
             max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Most tokens to generate.")] = 32,
             eos: Annotated[Optional[int], typer.Option(help="Stop at this token id. \\[default: eos_token_id of the generation_config.json or config.json beside the tokenizer]")] = None,
             tokenizer: TokenizerOpt = None, reference: ReferenceOpt = None,
             kv_sparsity: Annotated[Optional[float], typer.Option("--kv-sparsity", help="Hold the KV cache as sparse_kv does (0 = fp16 cache).")] = None,
             kv_window: WindowOpt = 32, backend: BackendOpt = "tensorrt",
             prefill: Annotated[Optional[Path], typer.Option("--prefill", help="A model on the sparse KV cache (edgesdk kv-sparsify): run the prompt through this dense build of the same decoder (its source build, or the export) and compress its cache, as MUSTAFAR prefills. \\[default: the prompt's tokens are decode steps of the sparse model]")] = None) -> None:
    """Greedy generation after a prompt (batch 1), the KV cache fed back each step."""
    try:
        if (prompt is None) == (prompt_ids is None):
            raise EdgeSDKError("give the prompt once: --prompt TEXT or --prompt-ids IDS",
                               "e.g. --prompt 'The capital of France is'")
        _at_least("--max-new-tokens", max_new_tokens, 1)
        tok = _tokenizer(build, tokenizer, needed=prompt is not None)
        ids = tok.encode(prompt) if prompt is not None else parse_ids(prompt_ids, "--prompt-ids")
        stop = [eos] if eos is not None else default_eos(tok.path if tok is not None else None)
        runs = [("build", build, backend)] + ([("reference", reference, "onnxruntime")] if reference else [])
        results = []
        for label, path, be in runs:
            with _open_engine(path, be, False) as engine, contextlib.ExitStack() as dense:
                first = dense.enter_context(_open_engine(prefill, be, False)) if prefill and label == "build" else None
                dec = Decoder(engine, kv_sparsity=kv_sparsity, window=kv_window, group=kv_window, prefill=first)
                t0 = time.perf_counter()
                out = dec.generate(ids, max_new_tokens, stop)
                results.append((label, out, time.perf_counter() - t0))
    except EdgeSDKError as e:
        _fail(e)
    console.print(Text(f"prompt: {len(ids)} tokens; stop at: {' '.join(map(str, stop)) if stop else 'none'}",
                       style="dim"))
    for label, out, sec in results:
        path = build if label == "build" else reference
        how = f"; prompt prefilled densely by {prefill}" if prefill and label == "build" else ""
        console.print(Text(f"{label} ({path}, {backend if label == 'build' else 'onnxruntime'}{how}): "
                           f"{len(out.tokens)} tokens in {sec:.2f} s, stopped: {out.stopped}", style="bold"))
        console.print(Text(tok.decode(ids + out.tokens) if tok is not None else " ".join(map(str, out.tokens))))
        if tok is not None:
            console.print(Text("ids: " + " ".join(map(str, out.tokens)), style="dim"))
    if len(results) == 2:
        a, b = results[0][1].tokens, results[1][1].tokens
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        console.print(Text(f"the build and the reference agree on the first {same} of {max(len(a), len(b))} tokens"))


def perplexity(build: BuildArg,
               text: Annotated[Optional[Path], typer.Option(help="A UTF-8 text file (through the tokenizer).")] = None,
               tokens: Annotated[Optional[Path], typer.Option(help="A file of whitespace-separated token ids.")] = None,
               context: Annotated[Optional[int], typer.Option(help="Tokens per window, each from an empty cache. \\[default: the build's longest cache + 1; without a cache, its sequence length]")] = None,
               windows: Annotated[Optional[int], typer.Option(help="Score only the first N windows. \\[default: all]")] = None,
               skip: Annotated[int, typer.Option(help="Tokens to skip first (e.g. the ones the build calibrated on).")] = 0,
               kv_sparsity: KvOpt = None, kv_window: WindowOpt = 32,
               tokenizer: TokenizerOpt = None, reference: ReferenceOpt = None, backend: BackendOpt = "tensorrt",
               json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the results here.")] = None) -> None:
    """Perplexity of a text under a causal LM build (and --reference): with a KV cache, fed back token by token
    (dense or held sparse); without one, each window in one call."""
    try:
        if (text is None) == (tokens is None):
            raise EdgeSDKError("give the text once: --text FILE or --tokens FILE", "e.g. --text notes.txt")
        _at_least("--skip", skip, 0)
        if windows is not None:
            _at_least("--windows", windows, 1)
        if json_path is not None:
            _check_writable(json_path, "--json", "perplexity.json")
        if text is not None:
            ids = _tokenizer(build, tokenizer, needed=True).encode(_read(text, "--text"))
        else:
            ids = parse_ids(_read(tokens, "--tokens"), f"--tokens {tokens}")
        ids = ids[skip:]
        runs = [("build", build, backend)] + ([("reference", reference, "onnxruntime")] if reference else [])
        rows = []
        for label, path, be in runs:
            with _open_engine(path, be, False) as engine:
                own = kv_sparsity and _holds_sparse_kv(engine)  # emulating on top of the real thing: not asked for
                for kv in [None] if own else [None, *(kv_sparsity or [])]:
                    r = score(engine, ids, context, windows, kv_sparsity=kv, window=kv_window)
                    if context is None:  # the build's longest: the reference then scores the same windows
                        context = r["context"]
                    r.update(model=label, path=str(path), backend=be, kv_window=kv_window if kv is not None else None)
                    rows.append(r)
    except EdgeSDKError as e:
        _fail(e)
    base = next((r["perplexity"] for r in rows if r["model"] == "reference" and r["kv_sparsity"] is None), None)
    table = compact_table()
    text_column(table, "model")
    for c in ("KV cache", "perplexity", "vs reference", "tokens", "s"):
        num_column(table, c)
    for r in rows:
        kv = "dense" if r["kv_sparsity"] is None else f"{r['kv_sparsity']:.0%} sparse"
        if r.get("kv_model"):
            ks, vs = r["kv_model"]["k_sparsity"], r["kv_model"]["v_sparsity"]
            kv = (f"{ks:.0%}" if ks == vs else f"K {ks:.0%} V {vs:.0%}") + " sparse (model)"
        rel = "-" if base is None else f"{r['perplexity'] / base - 1:+.2%}"
        table.add_row(r["model"], kv, f"{r['perplexity']:.3f}", rel, str(r["scored"]), f"{r['seconds']:.1f}")
    console.print(Fit(table))
    console.print(Text(f"build: {build} ({backend})" + (f"; reference: {reference} (onnxruntime)" if reference else ""),
                       style="dim"))
    if any(r.get("kv_model") for r in rows):
        console.print(Text("sparse (model): the model's attention runs on the sparse KV cache (EdgeSparseKVAttention "
                           "nodes, edgesdk kv-sparsify)", style="dim"))
    console.print(Text(f"{rows[0]['windows']} windows of {rows[0]['context']} tokens after skipping {skip}" +
                       ("; KV sparsity: K and V rows pruned per token outside the dense window, cache in fp16 "
                        "(emulated on the dense cache: accuracy only)" if kv_sparsity else ""), style="dim"))
    if json_path is not None:
        try:
            _write_atomic(json_path, "--json", lambda f: f.write(json.dumps({"skip": skip, "rows": rows}, indent=2).encode()))
        except EdgeSDKError as e:
            _fail(e)


def _holds_sparse_kv(engine) -> bool:
    from edgesdk.generate import _cache_inputs

    return _cache_inputs(engine)[2] is not None


def kv_sparsify(source: Annotated[Path, typer.Argument(help="A decoder exported with its KV cache (.onnx), or a build folder of one.")],
                output: Annotated[Path, typer.Option("-o", "--output", help="The .onnx to write, or a build folder (from a build folder: model, verification, engine, report).")],
                sparsity: Annotated[float, typer.Option(help="Fraction of each K row (and V row) pruned once its token leaves the dense window.")],
                v_sparsity: Annotated[Optional[float], typer.Option("--v-sparsity", help="V's fraction, if not --sparsity's.")] = None,
                capacity: Annotated[Optional[int], typer.Option(help="Most tokens one sequence caches (fixes the cache's size). \\[default: a folder: the most the source build's profile holds; an .onnx: 2048]")] = None,
                window: Annotated[int, typer.Option(help="Dense window of the most recent tokens (MUSTAFAR: 32).")] = 32,
                group: Annotated[int, typer.Option(help="Tokens compressed at once when the window is full.")] = 32,
                max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", help="Folder: most new tokens per call in the engine's profile. \\[default: the source build's]")] = None,
                verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Folder: decode a sequence with the rewritten model and the source build (its cache pruned the same way) and compare.")] = True,
                verify_tokens: Annotated[Optional[int], typer.Option("--verify-tokens", help="Folder: length of the verified sequence. \\[default: min(capacity, window + 3 x group)]")] = None,
                atol: Annotated[Optional[float], typer.Option("--atol", help="Folder: verification mean absolute error bound. \\[default: the source build's]")] = None,
                rtol: Annotated[Optional[float], typer.Option("--rtol", help="Folder: mean relative error bound. \\[default: the source build's]")] = None,
                min_cosine: Annotated[Optional[float], typer.Option("--min-cosine", help="Folder: lowest cosine similarity. \\[default: the source build's]")] = None,
                force: Annotated[bool, typer.Option("--force", help="Folder: replace an existing build folder.")] = False) -> None:
    """Run a decoder's attention on the bitmap-sparse KV cache: one EdgeSparseKVAttention node per layer.

    \b
    Examples:
      edgesdk kv-sparsify out/llm -o out/llm_kv70 --sparsity 0.7      # a build folder: verified, engine where TensorRT is
      edgesdk kv-sparsify llm/model.onnx -o llm_kv70.onnx --sparsity 0.7 --capacity 256   # the rewritten model only
    """
    if output.suffix != ".onnx":
        _kv_folder(source, output, sparsity, v_sparsity, capacity, window, group, max_tokens, verify, verify_tokens,
                   {"atol": atol, "rtol": rtol, "min_cosine": min_cosine}, force)
        return
    from edgesdk.onnx_io import is_large, load_model, save_model
    from edgesdk.rewrite.sparse_kv import sparsify_kv
    from edgesdk.runtime import _build_report, find_build

    capacity = 2048 if capacity is None else capacity
    try:
        _check_writable(output, "-o", "model_kv.onnx")
        found = find_build(source)
        if found.onnx is None:
            raise EdgeSDKError(f"{source} holds no ONNX model", "pass the decoder's .onnx or its build folder")
        if output.resolve() == found.onnx.resolve():
            raise EdgeSDKError(f"-o {output} is the source model", "write the rewritten decoder to a new file")
        _at_least("--capacity", capacity, 1)
        _at_least("--window", window, 1)
        _at_least("--group", group, 1)
        t0 = time.perf_counter()
        model = load_model(found.onnx)
        out, layers, cfg = sparsify_kv(model, sparsity, v_sparsity, capacity=capacity, window=window, group=group)
        origin = ((_build_report(found.onnx) or {}).get("model") or {}).get("path") or str(found.onnx.resolve())
        meta = {p.key: p for p in out.metadata_props}
        if SOURCE_KEY in meta:
            meta[SOURCE_KEY].value = origin
        else:
            out.metadata_props.add(key=SOURCE_KEY, value=origin)
        output.parent.mkdir(parents=True, exist_ok=True)
        save_model(out, output)
    except EdgeSDKError as e:
        _fail(e)
    _kv_summary(layers, cfg, time.perf_counter() - t0)
    console.print(Text(f"wrote {output}{' (+ external data)' if is_large(out) else ''}; decode it with "
                       f"`edgesdk generate {output} --backend onnxruntime` or score it with `edgesdk perplexity`"))


def _kv_summary(layers, cfg, seconds: float) -> None:
    from edgesdk.rewrite.sparse_kv import default_scale_check

    console.print(Text(f"{len(layers)} attention layers on the sparse KV cache ({seconds:.1f} s): "
                       f"{cfg.num_q_heads} query / {cfg.num_kv_heads} KV heads of {cfg.head_dim}; K {cfg.k_sparsity:.0%}"
                       f" ({cfg.keep_k} of {cfg.head_dim} kept), V {cfg.v_sparsity:.0%} ({cfg.keep_v} kept); window "
                       f"{cfg.window}, group {cfg.group}, capacity {cfg.capacity} tokens", style="bold"))
    ratio = cfg.memory_ratio(cfg.capacity)
    per = cfg.kv_bytes(cfg.capacity) * cfg.num_kv_heads * len(layers)
    console.print(Text(f"KV cache at {cfg.capacity} tokens: {per / 2**20:.1f} MiB per sequence, {ratio:.3f} of dense "
                       f"fp16 ({cfg.capacity * 4 * cfg.head_dim * cfg.num_kv_heads * len(layers) / 2**20:.1f} MiB)"))
    odd = default_scale_check(layers, cfg.head_dim)
    if odd:
        console.print(Text(f"layers {odd} scale scores by other than 1/sqrt({cfg.head_dim}) (kept as found)",
                           style="yellow"))


def _kv_folder(source: Path, output: Path, sparsity, v_sparsity, capacity, window, group, max_tokens, verify,
               verify_tokens, tolerances: dict, force: bool) -> None:
    """``kv-sparsify`` into a build folder (:func:`edgesdk.kv_build.kv_build`)."""
    from edgesdk.cli import progress_steps, verification_failed
    from edgesdk.kv_build import kv_build
    from edgesdk.report import print_summary

    try:
        for flag, v in (("--capacity", capacity), ("--max-tokens", max_tokens), ("--verify-tokens", verify_tokens)):
            if v is not None:
                _at_least(flag, v, 1)
        _at_least("--window", window, 1)
        _at_least("--group", group, 1)
        progress, step = progress_steps()
        with progress:
            report = kv_build(source, output, sparsity, v_sparsity, capacity=capacity, window=window, group=group,
                              max_tokens=max_tokens, verify=verify, verify_tokens=verify_tokens,
                              tolerances=tolerances, force=force, step=step)
    except EdgeSDKError as e:
        _fail(e)
    print_summary(report, console)
    if report["verified"] is False:
        verification_failed(report["verify"], build_dir=report["output"], advice=KV_ADVICE)


KV_ADVICE = ("the rewritten decoder's logits differ from its source build's with the cache pruned the same way. In an "
             "INT8 build, fake-quantized activations turn the sparse path's fp16 rounding into whole quantization "
             "steps: where the difference is acceptable, loosen --atol/--rtol/--min-cosine; in a float build this is a "
             "defect of the rewrite (please report it with report.json).")


def register(app: typer.Typer) -> None:
    """Add ``generate``, ``perplexity`` and ``kv-sparsify`` to the main ``edgesdk`` app."""
    app.command("generate")(generate)
    app.command("perplexity")(perplexity)
    app.command("kv-sparsify")(kv_sparsify)
