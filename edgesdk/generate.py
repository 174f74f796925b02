"""Decoding with an LLM build that carries its KV cache: greedy generation and perplexity.

A decoder exported with its cache (optimum's ``text-generation-with-past``: ``input_ids``, ``attention_mask``,
``position_ids``, ``past_key_values.N.key/value`` in, ``logits`` and ``present.N.key/value`` out) runs one call
per step; :class:`Decoder` feeds each call's ``present.*`` back as the next ``past_key_values.*``, fills the mask
and positions, and keeps every call inside the build's optimization profile (the new tokens per call and the
cache length it allows)::

    import edgesdk
    from edgesdk.generate import Decoder

    with edgesdk.Engine("build/smollm2", backend="onnxruntime") as engine:
        dec = Decoder(engine)
        out = dec.generate([1, 504, 3458], max_new_tokens=32, eos=2)   # greedy
        print(out.tokens, out.stopped)                                   # "eos", "length" or "cache_full"
        print(dec.perplexity(ids, context=256)["perplexity"])

:func:`perplexity` takes any causal LM build: one with its cache through :class:`Decoder`, one without (``input_ids``
→ ``logits`` of every position) a window per call.

A decoder rewritten by ``edgesdk kv-sparsify`` (:mod:`edgesdk.rewrite.sparse_kv`: its attention on the sparse KV cache,
``EdgeSparseKVAttention`` nodes) decodes the same way: its cache is the nodes' fixed-size state
(``past_sparse_kv.N.*`` in, ``present_sparse_kv.N.*`` out, zeros when empty), fed back each call with ``kv_lengths``
(tokens cached after the call); decoding stops with ``cache_full`` at the nodes' capacity.

**KV sparsity** (``kv_sparsity=0.7``): the cache is held as :mod:`edgesdk.formats.sparse_kv` holds it, so that
its effect on a model's accuracy can be measured on the CPU before a kernel runs it: every cached K and V value
rounded to fp16 (the format's dtype, so ``kv_sparsity=0`` is the fp16 cache), and the K and V rows of the tokens
that have left the dense window (the most recent ``window`` tokens, compressed ``group`` at a time, MUSTAFAR's
rule) pruned per (token, head) to the ``keep_count`` largest magnitudes, the GPU's tie rule included. Pruning
happens before each call, to the tokens the kernel holds compressed once the call's new token is appended
(``sparse_kv_append`` runs before the attention), so every query sees exactly the cache the sparse attention
kernel reads; the model computes attention on that pruned dense cache, as ``edgesdk.reference.sparse_kv`` does
for the kernel. The build's own attention still runs dense: this measures accuracy, not speed or memory. With
more than one new token per call, the tokens of one call see each other densely (a prefill, as in MUSTAFAR), so
:meth:`Decoder.perplexity` steps one token at a time under KV sparsity.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from edgesdk.errors import EdgeSDKError
from edgesdk.formats import sparse_kv as skv

_EXPORT_FIX = ("export the decoder with its KV cache (optimum-cli export onnx --task text-generation-with-past) "
               "and build that")


@dataclass(frozen=True)
class DecoderLayout:
    """The names and limits of a decoder-with-cache model (see :func:`decoder_layout`).

    Attributes:
        tokens (str): The token-id input (``input_ids``).
        mask (str | None), positions (str | None): ``attention_mask`` (past + new) and ``position_ids``, if any.
        logits (str): The logits output.
        cache (tuple): ``(past input, present output, cache axis)`` for every cached tensor.
        new_range (tuple[int, int | None]): New tokens one call takes (the profile's; None = any).
        max_cache (int | None): Most cached tokens a call takes (the profile's; None = any).
        state (tuple): ``(input, output)`` of every cache-state tensor of a model whose attention runs on the sparse
            KV cache (``edgesdk kv-sparsify``: ``EdgeSparseKVAttention`` nodes); ``cache`` is then empty.
        lengths (str | None): That model's input of cached tokens after the call (``kv_lengths``).
        sparse_kv (dict | None): That model's cache policy (``k_sparsity``, ``v_sparsity``, ``window``, ``group``,
            ``capacity``: its nodes' attributes).
    """

    tokens: str
    mask: str | None
    positions: str | None
    logits: str
    cache: tuple[tuple[str, str, int], ...]
    new_range: tuple[int, int | None]
    max_cache: int | None
    state: tuple[tuple[str, str], ...] = ()
    lengths: str | None = None
    sparse_kv: dict | None = None


def _sparse_state(model, specs: dict) -> tuple[tuple[tuple[str, str], ...], dict] | None:
    """``(state pairs, policy)`` of a model rewritten by :func:`edgesdk.rewrite.sparse_kv.sparsify_kv`, else None."""
    from onnx import helper

    if skv.LENGTHS_INPUT not in specs:
        return None
    nodes = [n for n in model.graph.node if n.op_type == skv.OP_TYPE]
    caps = {a.i for n in nodes for a in n.attribute if a.name == "capacity"}
    if not nodes or len(caps) != 1:
        raise EdgeSDKError(f"the model takes {skv.LENGTHS_INPUT} but has {len(nodes)} {skv.OP_TYPE} nodes with "
                           f"capacities {sorted(caps)}", "rewrite the decoder again with `edgesdk kv-sparsify`")
    outputs = {o.name for o in model.graph.output}
    pairs = []
    for n in nodes:
        for past, present in zip(n.input[3:7], n.output[1:5]):
            if past not in specs or present not in outputs:
                raise EdgeSDKError(f"{n.name}: cache state {past} -> {present} is not graph input -> output",
                                   "rewrite the decoder again with `edgesdk kv-sparsify`")
            pairs.append((past, present))
    attrs = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    policy = {k: attrs.get(k) for k in ("k_sparsity", "v_sparsity", "window", "group", "capacity")}
    for k in ("k_sparsity", "v_sparsity"):
        policy[k] = round(float(policy[k]), 6) if policy[k] is not None else None
    return tuple(pairs), policy


def _cache_inputs(engine) -> tuple[dict, dict, tuple | None]:
    """``(specs, past, sparse)``: the engine's inputs as ``{name: (shape, dtype)}``,
    :func:`edgesdk.calibration.past_inputs` of its ONNX model (read without weights) and, for a model on the sparse
    KV cache, ``(state pairs, policy)`` (:func:`_sparse_state`)."""
    import onnx

    from edgesdk.calibration import past_inputs
    from edgesdk.runtime import find_build

    specs = {t.name: (list(t.shape or ()), t.dtype) for t in engine.inputs}
    onnx_path = find_build(engine.path).onnx
    if onnx_path is None:
        raise EdgeSDKError(f"{engine.path} has no ONNX model beside its plan, to read the KV-cache axes from",
                           "pass the build folder written by `edgesdk build` (it holds model.onnx)")
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as e:  # a damaged file: Engine() opened it, so this is rare
        raise EdgeSDKError(f"cannot read {onnx_path} ({e})", "rebuild the folder with `edgesdk build`") from None
    return specs, past_inputs(model, specs), _sparse_state(model, specs)


def decoder_layout(engine, found: tuple | None = None) -> DecoderLayout:
    """Find the decoder-with-cache inputs and outputs of an :class:`edgesdk.Engine` and its profile's limits.

    The cache axis of each ``past...`` input is its dim whose ONNX name starts with ``past`` (read from the
    build's ONNX model, weights not loaded), as :func:`edgesdk.calibration.past_inputs` finds it for calibration.

    Raises:
        EdgeSDKError: the model is not a decoder exported with its KV cache, or its profile allows no decoding.
    """
    specs, past, sparse = found if found is not None else _cache_inputs(engine)  # found: _cache_inputs', if known
    if sparse is not None:
        state, policy = sparse
        tokens, mask, positions, logits, new_range = _io(engine, specs, {p for p, _ in state} | {skv.LENGTHS_INPUT},
                                                         {p for _, p in state})
        return DecoderLayout(tokens, mask, positions, logits, (), new_range, int(policy["capacity"]) - 1,
                             tuple(state), skv.LENGTHS_INPUT, policy)
    if not past:
        raise EdgeSDKError(f"{engine.path} is not a decoder with a KV cache (no past_key_values.* inputs with "
                           "matching present.* outputs)", _EXPORT_FIX)
    tokens, mask, positions, logits, new_range = _io(engine, specs, set(), {p for p, _ in past.values()})
    cache = []
    for name, (present, axis) in past.items():
        rank = len(specs[name][0])
        if axis in (0, rank - 1):
            raise EdgeSDKError(f"{name}'s cache axis is {axis} of {rank}", "export the cache as "
                               "[batch, heads, tokens, head_dim] (optimum's layout)")
        cache.append((name, present, axis))
    max_cache = None
    profile = engine.profile or {}
    first = cache[0]
    if first[0] in profile:
        least, max_cache = profile[first[0]][0][first[2]], profile[first[0]][2][first[2]]
        if least > 0:
            raise EdgeSDKError(f"the build's profile takes at least {least} cached tokens; decoding starts from an "
                               "empty cache", f"rebuild with --min-shape {first[0]}:...x0x... (an empty cache)")
    if max_cache is not None and max_cache < 1:
        raise EdgeSDKError(f"the build's profile holds the cache at {max_cache} tokens", "rebuild with --max-shape "
                           f"{first[0]}:...x<most cached tokens>x... covering the context you decode")
    return DecoderLayout(tokens, mask, positions, logits, tuple(cache), new_range, max_cache)


def _io(engine, specs: dict, cached: set, presents: set) -> tuple:
    """``(tokens, mask, positions, logits, new_range)`` of a decoder: its one token-id input (integer inputs other
    than ``cached``), mask and positions inputs, logits output (outputs other than ``presents``) and the new tokens
    per call its profile allows."""
    from edgesdk.calibration import _filler, _token_inputs

    ints = [n for n in _token_inputs(specs) if n not in cached]
    if len(ints) != 1:
        raise EdgeSDKError(f"the decoder needs one token-id input; its integer inputs are {ints}",
                           "export it with input_ids (and attention_mask/position_ids) as its only integer inputs")
    rest = [t.name for t in engine.outputs if t.name not in presents]
    logits = "logits" if "logits" in rest else (rest[0] if len(rest) == 1 else None)
    if logits is None:
        raise EdgeSDKError(f"cannot tell the logits among the outputs {rest}", "export the decoder with a 'logits' "
                           "output (optimum does)")
    new_range = (1, None)
    profile = engine.profile or {}
    if ints[0] in profile:
        lo, _, hi = profile[ints[0]]
        if lo[0] > 1:
            raise EdgeSDKError(f"the build's profile takes batches of {lo[0]} to {hi[0]}; decoding runs batch 1",
                               "rebuild with a profile whose batch starts at 1 (the default)")
        new_range = (max(1, lo[-1]), hi[-1])
    mask = next((n for n in specs if _filler(n) == "ones"), None)
    positions = next((n for n in specs if _filler(n) == "positions"), None)
    return ints[0], mask, positions, logits, new_range


def _share(past: str, kv_sparsity) -> float:
    """The sparsity of cache input ``past``: ``kv_sparsity``, or of a ``(K, V)`` pair the one its name ends in
    (``past_key_values.N.key`` / ``.value``, optimum's names)."""
    if not isinstance(kv_sparsity, (tuple, list)):
        return float(kv_sparsity)
    for suffix, s in (("key", kv_sparsity[0]), ("value", kv_sparsity[1])):
        if past.endswith(suffix):
            return float(s)
    raise EdgeSDKError(f"cannot tell whether the cache input {past} holds keys or values (for K and V sparsities "
                       f"{tuple(kv_sparsity)})", "pass one sparsity for both, or export the cache as optimum does "
                       "(past_key_values.N.key / .value)")


class Generation(NamedTuple):
    """Result of :meth:`Decoder.generate`: the new tokens and why it stopped (``"eos"``, ``"length"``, or
    ``"cache_full"``: the build's profile holds no more cached tokens)."""

    tokens: list[int]
    stopped: str


class Decoder:
    """Decode with an :class:`edgesdk.Engine` of a decoder-with-cache build (batch 1).

    Args:
        engine: An open :class:`edgesdk.Engine` (either backend).
        kv_sparsity (float | tuple[float, float] | None): Hold the cache as ``sparse_kv`` does (module doc), one
            sparsity or ``(K, V)``; None = as the model gives it.
        window, group (int): The dense window and the compression group of ``kv_sparsity`` (MUSTAFAR: 32, 32).
        layout (DecoderLayout | None): :func:`decoder_layout` of ``engine``, if already found.
        prefill: For a model on the sparse KV cache: an :class:`edgesdk.Engine` of the same decoder with its dense
            cache (the build ``edgesdk kv-sparsify`` rewrote, or its export). :meth:`generate`'s prompt then runs
            through it (dense attention over the prompt, MUSTAFAR's prefill) and its cache is compressed into this
            model's state (:meth:`prefill`); without it the prompt's tokens are decode steps of the sparse model.
    """

    def __init__(self, engine, *, kv_sparsity: float | None = None, window: int = 32, group: int = 32,
                 layout: DecoderLayout | None = None, prefill=None):
        self.engine = engine
        self.layout = layout if layout is not None else decoder_layout(engine)
        if window < 1 or group < 1:
            raise EdgeSDKError(f"KV window {window} / group {group}", "pass window >= 1 and group >= 1")
        self.kv_sparsity, self.window, self.group = kv_sparsity, window, group
        self._keep = {}
        if kv_sparsity is not None and self.layout.state:
            raise EdgeSDKError(f"{engine.path} already holds its KV cache sparse (EdgeSparseKVAttention nodes)",
                               "drop kv_sparsity (--kv-sparsity): the model's own sparsity applies")
        if kv_sparsity is not None:
            for past, _, _ in self.layout.cache:
                d = int(self._spec(past)[0][-1])
                if d < 1:
                    raise EdgeSDKError(f"{past} has a dynamic head dim", "export the cache with a fixed head_dim")
                self._keep[past] = skv.keep_count(d, _share(past, kv_sparsity))
        self.reset()
        self._dense = None if prefill is None else _DensePrefill(self, prefill)

    def _spec(self, name):
        t = next(t for t in self.engine.inputs if t.name == name)
        return t.shape, t.dtype

    @property
    def length(self) -> int:
        """Tokens in the cache."""
        return self._length

    def reset(self) -> None:
        """Empty the cache."""
        self._cache = {}
        for past, _, axis in self.layout.cache:
            shape, dtype = self._spec(past)
            shape = [1 if i == 0 else (0 if i == axis else int(d)) for i, d in enumerate(shape)]
            if any(d < 0 for d in shape):
                raise EdgeSDKError(f"{past} has dynamic dims besides batch and cache: {shape}",
                                   "export the cache with fixed heads and head_dim")
            self._cache[past] = np.zeros(shape, dtype)
        for past, _ in self.layout.state:  # the sparse cache's state: all zeros is an empty cache
            shape, dtype = self._spec(past)
            shape = [1 if i == 0 else int(d) for i, d in enumerate(shape)]
            if any(d < 1 for d in shape):
                raise EdgeSDKError(f"{past} has dynamic dims besides batch: {shape}",
                                   "rewrite the decoder again with `edgesdk kv-sparsify`")
            self._cache[past] = np.zeros(shape, dtype)
        self._length = 0
        self._compressed = 0

    def step(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed ``tokens`` (one call; their count within the profile's new-token range) after the cache.

        Returns:
            np.ndarray: float logits ``[len(tokens), vocab]``.
        """
        lay = self.layout
        n = len(tokens)
        lo, hi = lay.new_range
        if n < lo or (hi is not None and n > hi):
            raise EdgeSDKError(f"{n} new tokens in one call; the build's profile takes {lo} to {hi}",
                               "feed the tokens in chunks the profile allows (Decoder.feed does)")
        if lay.max_cache is not None and self._length > lay.max_cache:
            raise EdgeSDKError(f"the cache holds {self._length} tokens; the build's profile takes at most "
                               f"{lay.max_cache}", "reset() the decoder, or rebuild with a longer --max-shape")
        if self.kv_sparsity is not None:  # what the kernel holds once these tokens are appended, of the cached ones
            self._prune(min(self._length, skv.n_compressed(self._length + n, self.window, self.group)))
        tok_dtype = self._spec(lay.tokens)[1]
        feeds = {lay.tokens: np.asarray(tokens, dtype=tok_dtype).reshape(1, n)}
        if lay.mask is not None:
            feeds[lay.mask] = np.ones((1, self._length + n), self._spec(lay.mask)[1])
        if lay.positions is not None:
            feeds[lay.positions] = np.arange(self._length, self._length + n, dtype=self._spec(lay.positions)[1])[None]
        if lay.lengths is not None:
            if self._length + n > lay.max_cache + 1:
                raise EdgeSDKError(f"{self._length} cached + {n} new tokens exceed the sparse KV cache's capacity "
                                   f"{lay.max_cache + 1}", "reset() the decoder, or rewrite with a larger --capacity")
            feeds[lay.lengths] = np.array([self._length + n], self._spec(lay.lengths)[1])
        feeds.update(self._cache)
        out = self.engine.infer(feeds)
        for past, present in lay.state:
            self._cache[past] = np.asarray(out[present])
        for past, present, axis in lay.cache:
            got = out[present]
            if got.shape[axis] != self._length + n:
                raise EdgeSDKError(f"{present} holds {got.shape[axis]} tokens after {self._length} cached + {n} new",
                                   "export the decoder so that present.* = past_key_values.* + the new tokens")
            self._cache[past] = np.ascontiguousarray(got, dtype=self._spec(past)[1])
        self._length += n
        if self.kv_sparsity is not None:
            for past, _, axis in lay.cache:  # the new rows in fp16, as the dense window holds them
                c = np.moveaxis(self._cache[past], axis, -2)  # a view [..., tokens, head_dim]
                c[..., -n:, :] = c[..., -n:, :].astype(np.float16)
        logits = out[lay.logits]
        return np.asarray(logits).reshape(-1, logits.shape[-1])[-n:]

    def _prune(self, upto: int) -> None:
        """Prune the cached tokens ``self._compressed .. upto`` per (token, head), as compression does."""
        if upto <= self._compressed:
            return
        for past, _, axis in self.layout.cache:
            rows = np.moveaxis(self._cache[past], axis, -2)[..., self._compressed:upto, :]
            rows[...] = skv.prune(rows, self._keep[past])
        self._compressed = upto

    def _chunks(self, count: int, chunk: int | None):
        lo, hi = self.layout.new_range
        size = hi if chunk is None else chunk
        size = count if size is None else min(size, count)
        if size < 1 or (hi is not None and size > hi) or size < lo:
            raise EdgeSDKError(f"chunks of {size} new tokens; the build's profile takes {lo} to {hi}",
                               f"pass a chunk between {lo} and {hi}")
        i = 0
        while i < count:
            n = min(size, count - i)
            if n < lo:
                raise EdgeSDKError(f"{count} tokens end in a call of {n}, fewer than the {lo} the profile takes",
                                   f"feed a multiple of {lo} tokens, or rebuild with --min-shape taking 1 new token")
            yield i, n
            i += n

    def feed(self, tokens: Sequence[int], chunk: int | None = None) -> np.ndarray:
        """Feed ``tokens`` in calls of ``chunk`` (default: as many as the profile allows; 1 under KV sparsity).

        Returns:
            np.ndarray: logits ``[len(tokens), vocab]`` (float64).
        """
        tokens = [int(t) for t in tokens]
        if chunk is None and self.kv_sparsity is not None:
            chunk = 1
        cap = self.layout.max_cache
        calls = list(self._chunks(len(tokens), chunk))
        if cap is not None and calls and self._length + calls[-1][0] > cap:
            raise EdgeSDKError(f"{self._length} cached + {len(tokens)} new tokens do not fit the build's profile: its "
                               f"last call would find {self._length + calls[-1][0]} cached, at most {cap} allowed",
                               "feed a shorter context, or rebuild with a longer --max-shape for the past_key_values "
                               "inputs")
        parts = [np.asarray(self.step(tokens[i:i + n]), np.float64) for i, n in calls]
        return np.concatenate(parts) if parts else np.zeros((0, 0))

    def prefill(self, tokens: Sequence[int]) -> np.ndarray:
        """Empty the cache, run ``tokens`` through the dense ``prefill`` engine (its calls as its profile allows) and
        hold its K and V as this model's sparse cache state (:meth:`edgesdk.formats.sparse_kv.SparseKVCache.prefill`:
        the tokens that left the dense window compressed, the rest in the window), as MUSTAFAR prefills.

        Returns:
            np.ndarray: the dense model's logits ``[len(tokens), vocab]`` (float64).
        """
        if self._dense is None:
            raise EdgeSDKError("this Decoder has no dense prefill engine", "pass prefill=Engine(dense build) to it")
        return self._dense.run(tokens)

    def generate(self, prompt: Sequence[int], max_new_tokens: int = 32, eos: int | Sequence[int] | None = None,
                 chunk: int | None = None) -> Generation:
        """Greedy decoding after ``prompt`` (the cache is reset first).

        Returns:
            Generation: the new tokens and why it stopped.
        """
        if len(prompt) < 1:
            raise EdgeSDKError("the prompt is empty", "pass at least one token (e.g. the tokenizer's BOS)")
        if max_new_tokens < 1:
            raise EdgeSDKError(f"max_new_tokens {max_new_tokens}", "pass 1 or more")
        stop = set() if eos is None else ({int(eos)} if isinstance(eos, (int, np.integer)) else {int(e) for e in eos})
        self.reset()
        cap = self.layout.max_cache
        if cap is not None and len(prompt) - 1 > cap:
            raise EdgeSDKError(f"the prompt has {len(prompt)} tokens; the build's profile holds at most {cap} cached",
                               "shorten the prompt, or rebuild with a longer --max-shape for the past_key_values inputs")
        logits = (self.feed(prompt, chunk) if self._dense is None else self.prefill(prompt))[-1]
        out: list[int] = []
        while True:
            t = int(np.argmax(logits))
            out.append(t)
            if t in stop:
                return Generation(out, "eos")
            if len(out) >= max_new_tokens:
                return Generation(out, "length")
            if cap is not None and self._length > cap:
                return Generation(out, "cache_full")
            logits = self.step([t])[-1]

    def perplexity(self, tokens: Sequence[int], context: int | None = None, windows: int | None = None,
                   chunk: int | None = None) -> dict:
        """Perplexity of ``tokens`` cut into windows of ``context`` tokens, each from an empty cache.

        Every token after a window's first is scored given the ones before it in its window (teacher forcing):
        ``exp(mean −log p)`` over all scored tokens, log-softmax in float64.

        Args:
            context (int | None): Tokens per window; default and most: the profile's longest cache + 1.
            windows (int | None): Score only the first this many windows.

        Returns:
            dict: ``perplexity``, ``nll`` (mean), ``scored`` tokens, ``windows``, ``context``, ``seconds``,
            ``kv_sparsity``, ``kv_model`` (the sparse KV cache policy of a model that runs its attention on one,
            else None).
        """
        cap = self.layout.max_cache
        most = None if cap is None else cap + 1
        context = most if context is None else int(context)
        if context is None:
            raise EdgeSDKError("the model takes any cache length, so the window has no default",
                               "pass the tokens per window (context=, or --context on the command line), e.g. 256")
        if context < 2 or (most is not None and context > most):
            raise EdgeSDKError(f"context {context}", f"pass 2 .. {most} (the build's profile caches at most {cap})"
                               if most is not None else "pass 2 or more")

        def window_logits(win):
            self.reset()
            return self.feed(win[:-1], chunk)

        out = _score(tokens, context, windows, window_logits)
        out["kv_sparsity"] = self.kv_sparsity
        out["kv_model"] = self.layout.sparse_kv
        return out


class _DensePrefill:
    """The dense decoder whose prompt cache :meth:`Decoder.prefill` compresses into a sparse model's state: per
    layer N, ``past_key_values.N.key/value`` (optimum's names, as ``edgesdk kv-sparsify`` matched them) become
    ``past_sparse_kv.N.*``."""

    def __init__(self, sparse: Decoder, engine):
        lay = sparse.layout
        if not lay.state:
            raise EdgeSDKError(f"prefill= is for a model on the sparse KV cache; {sparse.engine.path} holds a dense "
                               "cache", "drop prefill")
        self.sparse, self.dense = sparse, Decoder(engine)
        pol = lay.sparse_kv
        states = {p: sparse._spec(p) for p, _ in lay.state}
        dense = {p: a for p, _, a in self.dense.layout.cache}
        self.layers = []
        for past in sorted({p.split(".")[1] for p in states}, key=int):
            names = {n: f"past_sparse_kv.{past}.{n}" for n in skv.STATE_NAMES}
            k_name, v_name = f"past_key_values.{past}.key", f"past_key_values.{past}.value"
            if k_name not in dense or v_name not in dense or dense[k_name] != 2:
                raise EdgeSDKError(f"the prefill model has no {k_name}/{v_name} [batch, heads, tokens, head_dim] for "
                                   f"layer {past} of the sparse model",
                                   "pass the build `edgesdk kv-sparsify` rewrote (or its export) as prefill")
            shape = states[names["k_window"]][0]
            hkv, d = int(shape[1]), int(shape[-1])
            cfg = skv.SparseKVConfig(d, hkv, hkv, pol["k_sparsity"], pol["v_sparsity"], capacity=pol["capacity"],
                                     window=pol["window"], group=pol["group"])
            want = {n: tuple(v) for n, v in skv.state_shapes(cfg, 1).items()}
            got = {n: tuple(int(x) for x in [1, *states[names[n]][0][1:]]) for n in skv.STATE_NAMES}
            if want != got or [int(x) for x in self.dense._spec(k_name)[0][1::2]] != [hkv, d]:
                raise EdgeSDKError(f"layer {past}: the sparse model's state {got} is not the prefill model's cache "
                                   f"[{self.dense._spec(k_name)[0]}] under its policy {want}",
                                   "pass the build `edgesdk kv-sparsify` rewrote (or its export) as prefill")
            self.layers.append((cfg, k_name, v_name, names))

    def run(self, tokens: Sequence[int]) -> np.ndarray:
        sp, n = self.sparse, len(tokens)
        cap = sp.layout.max_cache + 1
        if n < 1 or n > cap:
            raise EdgeSDKError(f"a prompt of {n} tokens; the sparse KV cache holds {cap}", "pass 1 .. that many")
        self.dense.reset()
        logits = self.dense.feed(tokens)
        sp.reset()
        for cfg, k_name, v_name, names in self.layers:
            c = skv.SparseKVCache.prefill(cfg, self.dense._cache[k_name], self.dense._cache[v_name], [n])
            for name, a in zip(skv.STATE_NAMES, (c.k_rec, c.v_rec, c.k_ring, c.v_ring)):
                sp._cache[names[name]] = a.view(np.int8) if a.dtype == np.uint8 else a.astype(
                    sp._spec(names[name])[1])
        sp._length = n
        return logits


def _score(tokens: Sequence[int], context: int, windows: int | None, window_logits) -> dict:
    """Mean NLL over windows of ``context`` tokens; ``window_logits(window)`` gives the logits after each of its
    first ``context - 1`` tokens."""
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    n = ids.size // context if windows is None else min(int(windows), ids.size // context)
    if n < 1:
        raise EdgeSDKError(f"{ids.size} tokens make no window of {context}", "pass more text or a shorter context")
    nll, scored, t0 = 0.0, 0, time.perf_counter()
    for w in range(n):
        win = ids[w * context:(w + 1) * context]
        logits = np.asarray(window_logits(win), np.float64)
        if logits.shape[0] != context - 1:
            raise EdgeSDKError(f"the model returns logits for {logits.shape[0]} of {context - 1} tokens fed",
                               "score with chunk=1 (a model that returns the last token's logits only)")
        m = logits.max(axis=-1, keepdims=True)
        logp = logits - (m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True)))
        nll -= float(logp[np.arange(context - 1), win[1:]].sum())
        scored += context - 1
    mean = nll / scored
    return {"perplexity": math.exp(mean), "nll": mean, "scored": scored, "windows": n, "context": context,
            "seconds": time.perf_counter() - t0}


def perplexity(engine, tokens: Sequence[int], context: int | None = None, windows: int | None = None, *,
               kv_sparsity: float | None = None, window: int = 32, chunk: int | None = None) -> dict:
    """Perplexity of ``tokens`` under a causal LM build, with or without a KV cache.

    A decoder with its cache goes through :meth:`Decoder.perplexity`. One without (``input_ids`` → ``logits``
    for every position, as ``python -m models.recipes smollm2`` exports it) scores each window in one call, the
    window as long as its fixed sequence length (or the profile's longest, or ``context``).

    Raises:
        EdgeSDKError: not a causal LM, a window the model cannot take, or ``kv_sparsity`` without a KV cache.
    """
    specs, past, sparse = _cache_inputs(engine)
    if past or sparse:  # the ONNX model is read once
        dec = Decoder(engine, kv_sparsity=kv_sparsity, window=window, group=window,
                      layout=decoder_layout(engine, (specs, past, sparse)))
        return dec.perplexity(tokens, context, windows, chunk)
    if kv_sparsity is not None:
        raise EdgeSDKError(f"{engine.path} has no KV cache to hold sparse",
                           "drop kv_sparsity (--kv-sparsity), or " + _EXPORT_FIX)
    return _score_plain(engine, specs, tokens, context, windows)


def _score_plain(engine, specs, tokens, context: int | None, windows: int | None) -> dict:
    from edgesdk.calibration import _filler, _token_inputs

    ints = _token_inputs(specs)
    others = [n for n in specs if n not in ints and _filler(n) is None]
    if len(ints) != 1 or others:
        raise EdgeSDKError(f"{engine.path} is not a causal language model taking token ids (inputs: {list(specs)})",
                           "score a model whose inputs are input_ids (and attention_mask/position_ids)")
    name = ints[0]
    fixed = specs[name][0][-1] if specs[name][0] else -1
    prof = (engine.profile or {}).get(name)
    lo, hi = (prof[0][-1], prof[2][-1]) if prof else (1, None)
    if fixed > 0:
        lo = hi = fixed
    context = (hi if context is None else int(context))
    if context is None:
        raise EdgeSDKError("the model takes any sequence length, so the window has no default",
                           "pass the tokens per window (context=, or --context on the command line), e.g. 256")
    if context < 2 or context < lo or (hi is not None and context > hi):
        raise EdgeSDKError(f"context {context}: the model takes sequences of {lo} to {hi} tokens",
                           f"pass a context in {max(lo, 2)} .. {hi}" if hi is not None else "pass 2 or more")
    logits_name = "logits" if any(t.name == "logits" for t in engine.outputs) else engine.outputs[0].name

    def window_logits(win):
        feeds = {name: np.asarray(win, specs[name][1])[None]}
        for n, (_, dtype) in specs.items():
            kind = _filler(n)
            if kind == "ones":
                feeds[n] = np.ones((1, context), dtype)
            elif kind == "positions":
                feeds[n] = np.arange(context, dtype=dtype)[None]
        y = np.asarray(engine.infer(feeds)[logits_name])
        if y.ndim < 2 or y.size != context * y.shape[-1]:
            raise EdgeSDKError(f"output {logits_name!r} has shape {y.shape}, not logits for each of {context} tokens",
                               "export the language model with logits for every position (a causal LM head)")
        return y.reshape(context, -1)[:-1]

    out = _score(tokens, context, windows, window_logits)
    out["kv_sparsity"] = None
    return out
