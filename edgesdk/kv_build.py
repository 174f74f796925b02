"""``edgesdk kv-sparsify BUILD -o FOLDER``: a decoder's build folder rewritten to run its attention on the sparse KV
cache, written as a build folder of its own (as ``edgesdk build`` writes one, atomically): the rewritten
``model.onnx`` (:func:`edgesdk.rewrite.sparse_kv.sparsify_kv`), its verification, the TensorRT engine where TensorRT
is installed (``model.plan``: the plugin's cache state aliased in place), ``report.json`` and ``manifest.json``.
:class:`edgesdk.Engine`, :class:`edgesdk.generate.Decoder`, ``edgesdk generate``/``perplexity``/``check`` take it.

The optimization profile: the source build's batch range, 1 to ``max_tokens`` new tokens per call (default: the
source's), the cache state at its fixed size. The capacity defaults to the most tokens the source build's profile
holds (its longest cache + its most new tokens): the positions it was calibrated and verified on.

Verification (ONNX Runtime, Polygraphy's comparison, the source build's tolerances), on one sequence of tokens
decoded from an empty cache (from the build's ``.txt`` calibration text after its calibration windows, else seeded
random ids), the logits of every position:

* **gating**: the rewritten model vs the source build with its dense cache held as the sparse cache holds it
  (:class:`edgesdk.generate.Decoder` ``kv_sparsity``: fp16, the rows that left the dense window pruned per token in
  numpy, the model's own attention): an independent path to the same function, which checks the rewrite, the node's
  semantics and its op (``against: "kv_emulated"``);
* **cost** (not gating): vs the source build with its dense cache (``against: "source"``): what the sparsity does;
* where an engine was built, **gating**: TensorRT vs ONNX Runtime on the rewritten model, on the inputs of its first
  call (the prompt from an empty cache) and its last (the longest cache), outputs and new state
  (``against: "tensorrt"``; never run here: TensorRT cannot be installed where this was written).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import onnx

from edgesdk.errors import EdgeSDKError

KIND = "kv-sparsify"
SEQ_SAMPLES = 1  # sequences decoded by the verification (each costs a decode of verify_tokens tokens per model)


def _source_build(source: Path) -> tuple[dict, dict, Path]:
    """``(report, manifest, processed model)`` of an ``edgesdk build`` folder, checked whole (the sha256 of its files,
    :func:`edgesdk.build.read_build_folder`)."""
    from edgesdk.build import MODEL_NAME, read_build_folder
    from edgesdk.manifest import MANIFEST_NAME
    from edgesdk.report import REPORT_NAME

    if not source.is_dir() or not (source / REPORT_NAME).is_file() or not (source / MANIFEST_NAME).is_file():
        raise EdgeSDKError(f"{source} is not an edgesdk build folder (a folder is written from one: the decoder "
                           "built with its KV cache)",
                           "build the decoder first (edgesdk build MODEL --shape input_ids:1x1 ...; --quantize none "
                           "keeps it float), or pass -o NAME.onnx for the rewritten model alone")
    report, manifest = read_build_folder(source)
    if report.get("kind") == KIND:
        raise EdgeSDKError(f"{source} already runs its attention on the sparse KV cache",
                           f"rewrite its source build ({(report.get('source_build') or {}).get('path')}) instead")
    return report, manifest, source / report.get("processed_model", MODEL_NAME)


def kv_profile(model: onnx.ModelProto, batch: tuple[int, int, int], max_tokens: int) -> dict:
    """The optimization profile of a rewritten decoder (every input with a dynamic dim, as report.json
    ``model.profile``): ``batch`` (min, opt, max) on the leading dim, 1 (opt 1) to ``max_tokens`` on the token dim of
    the token and position inputs, every other dim fixed."""
    from edgesdk.onnx_io import graph_inputs, tensor_dims

    out = {}
    for vi in graph_inputs(model):
        dims = tensor_dims(vi)
        lo, opt, hi = [], [], []
        for i, d in enumerate(dims):
            if isinstance(d, int) and d >= 0:
                lo.append(d), opt.append(d), hi.append(d)
            elif i == 0:
                lo.append(batch[0]), opt.append(batch[1]), hi.append(batch[2])
            elif i == len(dims) - 1 and len(dims) == 2:
                lo.append(1), opt.append(1), hi.append(max_tokens)
            else:
                raise EdgeSDKError(f"input {vi.name} of the rewritten decoder has a dynamic dim {i} ({dims})",
                                   "report this: edgesdk kv-sparsify writes fixed state shapes")
        if not all(isinstance(d, int) and d >= 0 for d in dims):
            out[vi.name] = {"min": lo, "opt": opt, "max": hi}
    return out


def _source_limits(report: dict) -> tuple[tuple[int, int, int], int, int]:
    """``((batch min, opt, max), most new tokens, most cached tokens)`` of the source build's profile."""
    from edgesdk.calibration import _token_inputs

    prof = (report.get("model") or {}).get("profile") or {}
    shapes = (report.get("model") or {}).get("shapes") or {}
    specs = {k: (v, np.dtype(np.int64)) for k, v in shapes.items()}
    ints = [n for n in _token_inputs(specs) if n.startswith("input")] or _token_inputs(specs)
    past = sorted(n for n in shapes if n.startswith("past"))
    if not ints or not past:
        raise EdgeSDKError("the source build is not a decoder with a KV cache (no input_ids and past_key_values.* "
                           "in its report)", "build the decoder exported with its cache (text-generation-with-past)")
    tok, first = ints[0], past[0]

    def rng(name):
        r = prof.get(name)
        return (shapes[name], shapes[name], shapes[name]) if r is None else (r["min"], r["opt"], r["max"])

    t_lo, t_opt, t_hi = rng(tok)
    p_hi = rng(first)[2]
    return (int(t_lo[0]), int(t_opt[0]), int(t_hi[0])), int(t_hi[-1]), int(p_hi[-2])


def _default_tokens(capacity: int, window: int, group: int, cached_hi: int) -> int:
    """The verified sequence's default length: two groups compressed and the window in use (window + 3 groups), within
    the capacity and the source profile's longest cache + 1."""
    return min(capacity, cached_hi + 1, window + 3 * group)


def _tokens(report: dict, source_model: Path, count: int, seed: int) -> tuple[list[int], str]:
    """``count`` token ids to verify on and where they came from: the source build's ``.txt`` calibration text after
    its calibration windows (as its own verification takes them), else seeded random ids below the vocabulary."""
    from edgesdk.build import build_ranges, longest_specs
    from edgesdk.calibration import embedding_rows, sample_tokens, token_ids
    from edgesdk.config import BuildConfig

    config = BuildConfig.model_validate(report["config"])
    cal = config.calibration
    model = onnx.load(str(source_model), load_external_data=False)
    if cal and Path(cal).suffix.lower() == ".txt" and Path(cal).is_file():
        ids = token_ids(Path(cal).read_text(), cal)
        skip = config.calibration_count * sample_tokens(longest_specs(model, build_ranges(model, config)), model)
        if ids.size >= skip + count:
            return [int(t) for t in ids[skip:skip + count]], f"{cal} after the {skip} calibration tokens"
        if ids.size >= count:
            return [int(t) for t in ids[-count:]], f"the last {count} tokens of {cal} (it holds too few past the " \
                                                   f"{skip} calibration tokens)"
    vocab = embedding_rows(model, "input_ids") or 100
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, count)], f"seeded random ids < {vocab}"


def _runner(path: Path, name: str, kv_sparsity=None, window: int = 32, group: int = 32, chunk: int | None = None,
            record: list | None = None, memo: dict | None = None):
    """A Polygraphy runner that decodes the sequence in ``input_ids`` [1, L] from an empty cache (calls of ``chunk``
    tokens, default: the profile's most; one at a time under ``kv_sparsity``) and returns the logits of every position
    [1, L, vocab]; ``record`` keeps the feeds of the first and the last call (:class:`_Recording`); ``memo`` (token
    bytes -> logits), shared between runners of the same model, decodes each sequence once."""
    from polygraphy.backend.base import BaseRunner
    from polygraphy.common import TensorMetadata

    import edgesdk
    from edgesdk.generate import Decoder

    class DecodeRunner(BaseRunner):
        def __init__(self):
            super().__init__(name=name)
            self.engine = None

        def activate_impl(self):  # the session opens at the first sequence not in ``memo``
            pass

        def get_input_metadata_impl(self):
            return TensorMetadata().add("input_ids", np.int64, (1, None))

        def infer_impl(self, feed_dict):
            ids = np.asarray(feed_dict["input_ids"], np.int64).reshape(-1)
            t0 = time.perf_counter()
            key = ids.tobytes()
            if memo is None or key not in memo:
                self.engine = self.engine or edgesdk.Engine(path, backend="onnxruntime")
                engine = self.engine if record is None else _Recording(self.engine, record)
                dec = Decoder(engine, kv_sparsity=kv_sparsity, window=window, group=group)
                logits = dec.feed(ids.tolist(), chunk=1 if kv_sparsity is not None else chunk).astype(np.float32)
                if memo is not None:
                    memo[key] = logits
            else:
                logits = memo[key]
            self.inference_time = time.perf_counter() - t0
            return OrderedDict(logits=logits[None])

        def deactivate_impl(self):
            if self.engine is not None:
                self.engine.close()
            self.engine = None

    return DecodeRunner()


class _Recording:
    """An Engine that keeps the feeds of its first and its latest call (``record``: [first, latest])."""

    def __init__(self, engine, record: list):
        self._engine, self._record = engine, record
        record.clear()

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def infer(self, feeds):
        kept = {k: np.array(v, copy=True) for k, v in feeds.items()}
        if not self._record:
            self._record.append(kept)
        else:
            self._record[1:] = [kept]
        return self._engine.infer(feeds)


def verify_kv(kv_path: Path, source_path: Path, policy: dict, tokens: list[int], config) -> tuple[list[dict], list]:
    """The ONNX Runtime rows (module doc) and the rewritten model's recorded feeds (first and last call).
    ``policy``: the cache policy and ``max_tokens`` (new tokens per call of the rewritten model)."""
    from edgesdk.verify import ORIGINAL, PROCESSED, compare

    record: list = []
    memo: dict = {}
    ks, vs = policy["k_sparsity"], policy["v_sparsity"]
    emulated = _runner(source_path, "onnxrt-source-kv-emulated", (ks, vs), policy["window"], policy["group"])
    kv = _runner(kv_path, PROCESSED, chunk=policy["max_tokens"], record=record, memo=memo)
    feeds = [{"input_ids": np.asarray(tokens, np.int64)[None]}]
    rows = compare([emulated, kv], feeds, config)
    for r in rows:
        r["against"], r["gate"], r["tokens"] = "kv_emulated", True, len(tokens)
    recorded = list(record)
    for r in compare([_runner(source_path, ORIGINAL), _runner(kv_path, PROCESSED, memo=memo)], feeds, config):
        r["against"], r["gate"], r["tokens"] = "source", False, len(tokens)
        rows.append(r)
    return rows, recorded


def kv_build(source: Path | str, output: Path | str, k_sparsity: float, v_sparsity: float | None = None, *,
             capacity: int | None = None, window: int = 32, group: int = 32, max_tokens: int | None = None,
             verify: bool = True, verify_tokens: int | None = None, tolerances: dict | None = None,
             force: bool = False, step=None) -> dict:
    """Rewrite the decoder of build folder ``source`` onto the sparse KV cache and write build folder ``output``.

    Args:
        source: An ``edgesdk build`` folder of a decoder with its KV cache.
        output: The folder to write (replaced only with ``force``, and only if it is a build folder).
        k_sparsity, v_sparsity, window, group: The cache policy (:func:`edgesdk.rewrite.sparse_kv.sparsify_kv`).
        capacity: Most tokens one sequence caches; default: the most the source build's profile holds.
        max_tokens: Most new tokens per call of the engine's profile; default: the source build's.
        verify_tokens: Length of the verified sequence; default ``min(capacity, window + 3 * group)``, at most the
            source profile's longest cache + 1.
        tolerances: ``atol``/``rtol``/``min_cosine`` replacing the source build's (None values ignored).

    Returns:
        The report (also ``report.json``); ``verified`` False when a gating comparison failed (the folder is written).

    Raises:
        EdgeSDKError: bad input; nothing is left on disk then.
    """
    from edgesdk.build import (MODEL_NAME, _quiet_step, assembling, check_output, engine_rows, engine_step,
                               engine_summary, finish_folder, io_info, verified)
    from edgesdk.config import BuildConfig
    from edgesdk.devices import DeviceProfile
    from edgesdk.onnx_io import load_model, save_model, sha256_file
    from edgesdk.rewrite.sparse_kv import sparsify_kv

    t0 = time.time()
    step = step or _quiet_step
    source, out = Path(source), Path(output)
    report, _, src_model = _source_build(source)
    batch, new_hi, cached_hi = _source_limits(report)
    capacity = cached_hi + new_hi if capacity is None else int(capacity)
    max_tokens = new_hi if max_tokens is None else int(max_tokens)
    if max_tokens < 1 or max_tokens > capacity:
        raise EdgeSDKError(f"--max-tokens {max_tokens}: new tokens per call must be 1 .. the capacity {capacity}",
                           "pass a smaller --max-tokens (or a larger --capacity)")
    most = min(capacity, cached_hi + 1)  # the source build decodes as many tokens as its profile caches, + 1
    verify_tokens = _default_tokens(capacity, window, group, cached_hi) if verify_tokens is None else int(verify_tokens)
    if verify and not 2 <= verify_tokens <= most:
        raise EdgeSDKError(f"--verify-tokens {verify_tokens}: the verified sequence must be 2 .. {most} tokens (the "
                           f"capacity {capacity}, and the {cached_hi} cached + 1 the source build's profile decodes)",
                           "pass a --verify-tokens in that range")
    config = BuildConfig.model_validate({**report["config"], "output": str(out), "force": force,
                                         **{k: v for k, v in (tolerances or {}).items() if v is not None}})
    device = DeviceProfile.model_validate(report["device"])
    check_output(out, force, inputs=(source,))
    with assembling(out) as tmp:
        with step("Rewrite the attention onto the sparse KV cache"):
            model = load_model(src_model)
            rewritten, layers, cfg = sparsify_kv(model, k_sparsity, v_sparsity, capacity=capacity, window=window,
                                                 group=group)
            origin = (report.get("model") or {}).get("path")
            if origin:
                rewritten.metadata_props.add(key="edgesdk.source_model", value=origin)
            del model
            profile = kv_profile(rewritten, batch, max_tokens)
            onnx_path = save_model(rewritten, tmp / MODEL_NAME)
        policy = {"k_sparsity": cfg.k_sparsity, "v_sparsity": cfg.v_sparsity, "window": cfg.window,
                  "group": cfg.group, "capacity": cfg.capacity, "max_tokens": max_tokens}
        rows, recorded, origin_of_tokens = [], [], None
        if verify:
            tokens, origin_of_tokens = _tokens(report, src_model, verify_tokens, config.seed)
            with step(f"Verify on ONNX Runtime: {verify_tokens} tokens decoded by both models (Polygraphy)"):
                rows, recorded = verify_kv(onnx_path, src_model, policy, tokens, config)
        with step("Build the TensorRT engine"):
            engine = engine_step(onnx_path, tmp, device, config, profile)
        if verify and engine.get("built"):
            rows += engine_rows(Path(engine["plan"]), rewritten, recorded, config, step)
        sparse = {**policy, "head_dim": cfg.head_dim, "num_q_heads": cfg.num_q_heads,
                  "num_kv_heads": cfg.num_kv_heads, "layers": [lay.layer for lay in layers],
                  "scales": [lay.scale for lay in layers], "keep_k": cfg.keep_k, "keep_v": cfg.keep_v,
                  "kv_bytes_per_sequence": cfg.kv_bytes(cfg.capacity) * cfg.num_kv_heads * len(layers),
                  "memory_ratio": cfg.memory_ratio(cfg.capacity),
                  "verify_tokens": verify_tokens if verify else None, "verify_token_source": origin_of_tokens}
        notes = [f"source build {source.resolve()}: {len(layers)} attention layers on the sparse KV cache, K "
                 f"{cfg.k_sparsity:.0%} / V {cfg.v_sparsity:.0%}, window {cfg.window}, group {cfg.group}, capacity "
                 f"{cfg.capacity} tokens ({sparse['memory_ratio']:.3f} of the dense fp16 cache)"]
        if report.get("verified") is False:
            notes.append("the source build failed its own verification (its report.json): this folder inherits that")
        if capacity > cached_hi + new_hi:
            notes.append(f"capacity {capacity} exceeds the {cached_hi + new_hi} tokens the source build's profile holds:"
                         " the positions past them were not in its calibration or verification")
        if verify:
            notes.append(f"verified on one sequence of {verify_tokens} tokens ({origin_of_tokens}), logits of every "
                         "position")
        else:
            notes.append("verification skipped (--no-verify)")
        src_sha = sha256_file(src_model)
        out_report = {
            "edgesdk_report": 1,
            "kind": KIND,
            "device": device.model_dump(),
            "model": {**(report.get("model") or {}), **io_info(rewritten),
                      "shapes": {k: v["opt"] for k, v in profile.items()}, "profile": profile},
            "source_build": {"path": str(source.resolve()), "processed_model": src_model.name,
                             "sha256": src_sha},
            "processed_model": MODEL_NAME,
            "config": config.model_dump(mode="json"),
            "sparse_kv": sparse,
            "notes": notes,
            "layers": [],
            "verify": rows,
            "verified": verified(rows),
            "engine": engine_summary(engine),
            "output": str(out),
            "seconds": round(time.time() - t0, 2),
        }
        try:
            finish_folder(tmp, out, out_report, src_model.resolve(), src_sha, device, engine)
        except OSError as e:
            raise EdgeSDKError(f"could not write the build folder {out}: {e}",
                               "free disk space, or choose an -o on another disk.") from None
    return out_report


def check_kv(build_dir: Path, report: dict, overrides: dict | None = None, step=None,
             source: Path | None = None) -> list[dict]:
    """``edgesdk check`` of a folder :func:`kv_build` wrote (its files' sha256 already checked): the source build
    (``source``, if it moved) still there and unchanged, then the verification again."""
    import importlib.util

    from edgesdk.build import _quiet_step, engine_rows
    from edgesdk.config import BuildConfig
    from edgesdk.onnx_io import load_model, sha256_file

    step = step or _quiet_step
    src = report.get("source_build") or {}
    src_model = Path(source or src.get("path", "")) / src.get("processed_model", "model.onnx")
    if not src_model.is_file():
        raise EdgeSDKError(f"the source build's model {src_model} is not there any more",
                           "pass the source build folder's new path with --model, or rewrite it again with "
                           "edgesdk kv-sparsify")
    if sha256_file(src_model) != src.get("sha256"):
        raise EdgeSDKError(f"{src_model} is not the model this folder was rewritten from (sha256 differs)",
                           "rewrite the source build again with edgesdk kv-sparsify --force")
    config = BuildConfig.model_validate({**report["config"], **{k: v for k, v in (overrides or {}).items()
                                                               if v is not None}})
    sparse = report["sparse_kv"]
    kv_path = build_dir / report.get("processed_model", "model.onnx")
    src_report = json.loads((src_model.parent / "report.json").read_text())
    count = sparse.get("verify_tokens") or _default_tokens(sparse["capacity"], sparse["window"], sparse["group"],
                                                           _source_limits(src_report)[2])  # built with --no-verify
    tokens, _ = _tokens(src_report, src_model, count, config.seed)
    with step(f"Verify on ONNX Runtime: {len(tokens)} tokens decoded by both models (Polygraphy)"):
        rows, recorded = verify_kv(kv_path, src_model, sparse, tokens, config)
    plan = (report.get("engine") or {}).get("plan")
    if plan and importlib.util.find_spec("tensorrt") is not None:
        rows += engine_rows(build_dir / plan, load_model(kv_path), recorded, config, step)
    return rows
