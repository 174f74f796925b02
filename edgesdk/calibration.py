"""Calibration and verification inputs: readers for the sources ``--calibration`` accepts.

* ``.npz``: one array per model input name (a single-input model may use any one key);
* ``.npy``: the array for a single-input model;
* a folder of ``.npy`` (single-input) or ``.npz`` (feed dicts) files;
* a folder of images (png/jpg/bmp/...): resized to the input's H×W, scaled to [0, 1], normalized
  with ``image_mean``/``image_std`` (ImageNet's for 3 channels unless given), NCHW or NHWC;
* a ``.txt`` file of token ids (whitespace-separated ints): concatenated and cut into sequences of
  the input's length; ``attention_mask``/``position_ids`` inputs are filled in. For a decoder exported with
  its KV cache (``past_key_values.*`` inputs, ``present.*`` outputs), each sample's cache is the model's own:
  it runs once on the P tokens before the sample with an empty cache (P = the cache length of the shape
  asked for), and its ``present.*`` outputs become the sample's ``past_key_values.*``, with positions P.. ;
  or, with ``prefill=True`` (what a build calibrates on), the whole window of P + new tokens is one sample
  after an empty cache.

Arrays hold samples along axis 0: their other dims must equal the input's non-batch dims, and
they are split into feeds of the input's batch size. Without a source, seeded random data is
generated (token ids below the embedding table size, masks of ones, positions 0..T-1; a decoder's KV cache
computed by the model from random tokens, as for a ``.txt``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from edgesdk.errors import EdgeSDKError

Specs = dict[str, tuple[list[int], np.dtype]]
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
MISMATCH_FIX = "give one array per model input, named like the input, shaped [samples, *input dims without batch]."


def load_feeds(source: Path | None, specs: Specs, count: int, seed: int = 0, model: onnx.ModelProto | None = None,
               image_mean: list[float] | None = None, image_std: list[float] | None = None,
               prefill: bool = False, skip: int = 0) -> list[dict[str, np.ndarray]]:
    """Up to ``count`` feed dicts for a model whose inputs are described by ``specs``.

    Args:
        source: Calibration file/folder, or None for seeded random data.
        specs: Input name → (concrete shape, dtype), from :func:`edgesdk.onnx_io.input_specs`.
        count: Most feeds to return.
        seed: Seed of the random data.
        model: The model (used to bound random token ids by its embedding table).
        image_mean: Per-channel mean for image folders.
        image_std: Per-channel std for image folders.

    Raises:
        EdgeSDKError: missing/unreadable source, or data that does not match the model inputs.
    """
    if source is None:
        return random_feeds(specs, count, seed, model, prefill)
    source = Path(source)
    if not source.exists():
        raise EdgeSDKError(f"calibration source {source} does not exist.",
                           "pass an .npz/.npy file, a folder of .npy/.npz or images, or a .txt of token ids.")
    if source.is_dir():
        files = sorted(p for p in source.iterdir() if p.is_file())
        images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
        arrays = [p for p in files if p.suffix.lower() in (".npy", ".npz")]
        if images:
            return _split(_images(images[: count * max(1, _batch(specs))], specs, image_mean, image_std), specs, count,
                          str(source))
        if not arrays:
            raise EdgeSDKError(f"calibration folder {source} holds no .npy, .npz or image files.",
                               "put one .npy per sample (or .npz feed dicts, or images) in it.")
        data: dict[str, list[np.ndarray]] = {}
        for p in arrays:
            for k, v in _read_arrays(p, specs).items():
                data.setdefault(k, []).append(v if v.shape[1:] == tuple(specs[k][0][1:]) else v[None])
        return _split({k: np.concatenate(v) for k, v in data.items()}, specs, count, str(source))
    if source.suffix.lower() in (".npy", ".npz"):
        return _split(_read_arrays(source, specs), specs, count, str(source))
    if source.suffix.lower() == ".txt":
        return _tokens(source, specs, count, model, prefill, skip)
    raise EdgeSDKError(f"calibration source {source} has an unknown type ({source.suffix or 'no suffix'}).",
                       "use .npz, .npy, .txt (token ids) or a folder of .npy/.npz/images.")


def _batch(specs: Specs) -> int:
    return max(shape[0] if shape else 1 for shape, _ in specs.values())


def _read_arrays(path: Path, specs: Specs) -> dict[str, np.ndarray]:
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise EdgeSDKError(f"cannot read calibration file {path} ({e}).", "write it with numpy.save/numpy.savez.") from None
    if isinstance(data, np.ndarray):
        arrays = {"": data}
    else:
        with data:
            arrays = {k: data[k] for k in data.files}
    if set(arrays) - set(specs):
        if len(specs) == 1 and len(arrays) == 1:
            return {next(iter(specs)): next(iter(arrays.values()))}
        unknown = sorted(set(arrays) - set(specs))
        raise EdgeSDKError(f"calibration data {path} does not match the model inputs: it has {unknown or ['(unnamed)']}, "
                           f"the model takes {sorted(specs)}.", MISMATCH_FIX)
    return arrays


def _split(arrays: dict[str, np.ndarray], specs: Specs, count: int, source: str) -> list[dict[str, np.ndarray]]:
    """Check arrays against the specs and cut them into feeds of the inputs' batch size."""
    missing = [n for n in specs if n not in arrays and _filler(n) is None]
    if missing:
        raise EdgeSDKError(f"calibration data {source} does not match the model inputs: no data for {missing}.",
                           MISMATCH_FIX)
    total = None
    for name, a in arrays.items():
        shape, dtype = specs[name]
        if a.ndim != len(shape) or tuple(a.shape[1:]) != tuple(shape[1:]):
            raise EdgeSDKError(
                f"calibration data {source} does not match the model inputs: {name!r} has shape {list(a.shape)}, "
                f"the model needs [samples, {', '.join(map(str, shape[1:]))}].", MISMATCH_FIX)
        if np.issubdtype(dtype, np.floating) != np.issubdtype(a.dtype, np.floating):
            raise EdgeSDKError(f"calibration data {source} does not match the model inputs: {name!r} is {a.dtype}, "
                               f"the model takes {dtype}.", MISMATCH_FIX)
        if not np.all(np.isfinite(a)) if np.issubdtype(a.dtype, np.floating) else False:
            raise EdgeSDKError(f"calibration data {source}: {name!r} holds NaN or Inf.", "remove those samples.")
        total = a.shape[0] if total is None else min(total, a.shape[0])
    batch = _batch(specs)
    n = min(count, total // batch) if total else 0
    if n == 0:
        raise EdgeSDKError(f"calibration data {source} holds {total or 0} samples, fewer than one batch of {batch}.",
                           "add samples or lower the batch size with --shape.")
    feeds = []
    for i in range(n):
        feed = {k: np.ascontiguousarray(a[i * batch:(i + 1) * batch], dtype=specs[k][1]) for k, a in arrays.items()}
        _fill(feed, specs)
        feeds.append(feed)
    return feeds


def _token_inputs(specs: Specs) -> list[str]:
    """Integer inputs that carry tokens (``input_ids``): not masks or positions."""
    return [n for n, (_, d) in specs.items() if np.issubdtype(d, np.integer) and _filler(n) is None]


def _filler(name: str):
    low = name.lower()
    if "attention_mask" in low:
        return "ones"
    if "position_ids" in low:
        return "positions"
    return None


def _fill(feed: dict, specs: Specs) -> None:
    """Add attention masks (ones) and position ids (0..T-1) the data did not provide."""
    for name, (shape, dtype) in specs.items():
        if name in feed:
            continue
        kind = _filler(name)
        if kind == "ones":
            feed[name] = np.ones(shape, dtype)
        elif kind == "positions":
            feed[name] = np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()


def _images(paths: list[Path], specs: Specs, mean, std) -> dict[str, np.ndarray]:
    from PIL import Image, UnidentifiedImageError

    floats = [n for n, (s, d) in specs.items() if np.issubdtype(d, np.floating) and len(s) == 4]
    if len(floats) != 1:
        raise EdgeSDKError(f"image calibration needs a model with one 4-D float input; it has {list(specs)}.",
                           "pass arrays in an .npz instead.")
    name = floats[0]
    shape = specs[name][0]
    nhwc = shape[3] in (1, 3) and shape[1] not in (1, 3)
    c, h, w = (shape[3], shape[1], shape[2]) if nhwc else (shape[1], shape[2], shape[3])
    if c not in (1, 3):
        raise EdgeSDKError(f"input {name!r} {shape} is not an image (1 or 3 channels).", "pass arrays in an .npz.")
    mean = np.asarray(mean if mean is not None else (IMAGENET_MEAN if c == 3 else [0.0]), np.float32)
    std = np.asarray(std if std is not None else (IMAGENET_STD if c == 3 else [1.0]), np.float32)
    if mean.size not in (1, c) or std.size not in (1, c) or np.any(std == 0):
        raise EdgeSDKError(f"image_mean/image_std need 1 or {c} values (std non-zero).", "fix --config image_mean/std.")
    out = []
    for p in paths:
        try:
            with Image.open(p) as im:
                im = im.convert("RGB" if c == 3 else "L").resize((w, h), Image.BILINEAR)
                a = np.asarray(im, np.float32) / 255.0
        except (UnidentifiedImageError, OSError) as e:
            raise EdgeSDKError(f"cannot read image {p} ({e}).", "remove it from the calibration folder.") from None
        a = a.reshape(h, w, c)
        a = (a - mean.reshape(1, 1, -1)) / std.reshape(1, 1, -1)
        out.append(a if nhwc else a.transpose(2, 0, 1))
    return {name: np.stack(out).astype(np.float32)}


def _tokens(path: Path, specs: Specs, count: int, model: onnx.ModelProto | None = None,
            prefill: bool = False, skip: int = 0) -> list[dict[str, np.ndarray]]:
    past = past_inputs(model, specs) if model is not None else {}
    ints = _token_inputs(specs)
    if len(ints) != 1:
        raise EdgeSDKError(f"token-id calibration needs one integer input (input_ids); the model has {list(specs)}.",
                           "pass arrays in an .npz instead.")
    name = ints[0]
    shape = specs[name][0]
    ids = token_ids(path.read_text(), str(path))[skip:]
    if past:
        return _tokens_with_cache(ids, name, past, specs, count, model, str(path), prefill)
    seq = shape[-1]
    n = ids.size // seq
    return _split({name: ids[: n * seq].reshape(n, *shape[1:])}, specs, count, str(path))


def token_ids(text: str, where: str, fix: str = "tokenize the text first (tokenizer(text)['input_ids']).") -> np.ndarray:
    """Whitespace-separated non-negative integer token ids, as int64; ``where`` names the source in errors."""
    try:
        ids = np.array(text.split(), dtype=np.int64)
    except ValueError:
        raise EdgeSDKError(f"{where} must hold whitespace-separated integer token ids.", fix) from None
    if ids.size and ids.min() < 0:
        raise EdgeSDKError(f"{where} holds negative token ids.", "write the tokenizer's ids unchanged.")
    return ids


def sample_tokens(specs: Specs, model: onnx.ModelProto | None = None) -> int:
    """Token ids one sample of a token-id source takes: batch x sequence, and the cached tokens of a decoder with a
    KV cache (:func:`past_inputs`)."""
    past = past_inputs(model, specs) if model is not None else {}
    ints = _token_inputs(specs)
    if len(ints) != 1:
        return 0
    shape = specs[ints[0]][0]
    cached = 0
    if past:
        first = next(iter(past))
        cached = specs[first][0][past[first][1]]
    return shape[0] * (cached + shape[-1])


def past_inputs(model: onnx.ModelProto, specs: Specs) -> dict[str, tuple[str, int]]:
    """KV-cache inputs of a decoder export: ``{input: (output, cache axis)}`` for each float input named
    ``past...`` (``past_key_values.N.key``) whose output of the same name with ``present`` in its place exists; the
    cache axis is the input's dim whose symbolic name starts with ``past``. Empty for other models."""
    outputs = {o.name for o in model.graph.output}
    dims = {vi.name: [d.dim_param for d in vi.type.tensor_type.shape.dim] for vi in model.graph.input}
    out = {}
    for name, (shape, dtype) in specs.items():
        if not (name.startswith("past") and np.issubdtype(dtype, np.floating)):
            continue
        present = "present" + name[len("past_key_values"):] if name.startswith("past_key_values") else \
            "present" + name[len("past"):]
        axes = [i for i, d in enumerate(dims.get(name, [])) if d.startswith("past")]
        if present in outputs and len(axes) == 1:
            out[name] = (present, axes[0])
    return out


def _tokens_with_cache(ids: np.ndarray, name: str, past: dict, specs: Specs, count: int, model: onnx.ModelProto,
                       source: str, prefill: bool = False) -> list[dict[str, np.ndarray]]:
    """Feeds whose KV cache the model computed itself from the tokens before each sample (see the module doc), or
    with ``prefill`` the whole windows as new tokens after an empty cache."""
    from edgesdk.ort import make_session

    batch, seq = specs[name][0][0], specs[name][0][-1]
    first = next(iter(past))
    plen = specs[first][0][past[first][1]]
    window = plen + seq
    n = min(count, ids.size // (window * batch))
    if n == 0:
        raise EdgeSDKError(f"calibration data {source} holds {ids.size} tokens, fewer than one sample of {batch} x "
                           f"({plen} cached + {seq} new) tokens.", "add tokens or shorten the cache with --shape.")
    if prefill:
        feeds = []
        for i in range(n):
            feed = {name: ids[i * batch * window:(i + 1) * batch * window].reshape(batch, window).astype(specs[name][1])}
            for p, (_, axis) in past.items():
                shape = list(specs[p][0])
                shape[axis] = 0
                feed[p] = np.zeros(shape, specs[p][1])
            _fill_positions(feed, specs, batch, 0, window)
            feeds.append(feed)
        return feeds
    try:
        sess = make_session(model)
        outs = [o.name for o in sess.get_outputs()]
    except Exception as e:
        raise EdgeSDKError(f"ONNX Runtime cannot load the model to fill the KV cache of the calibration samples: {e}",
                           "pass calibration arrays (.npz with the past_key_values inputs) instead.") from None
    feeds = []
    for i in range(n):
        block = ids[i * batch * window:(i + 1) * batch * window].reshape(batch, window)
        feed = {name: np.ascontiguousarray(block[:, plen:]).astype(specs[name][1])}
        if plen:
            pre = {name: np.ascontiguousarray(block[:, :plen]).astype(specs[name][1])}
            for p, (_, axis) in past.items():
                shape = list(specs[p][0])
                shape[axis] = 0
                pre[p] = np.zeros(shape, specs[p][1])
            _fill_positions(pre, specs, batch, 0, plen)
            try:
                got = dict(zip(outs, sess.run(None, pre)))
            except Exception as e:
                raise EdgeSDKError(f"ONNX Runtime could not run the model on the {plen} tokens before a calibration "
                                   f"sample (to fill its KV cache): {e}",
                                   "pass calibration arrays (.npz with the past_key_values inputs) instead.") from None
            for p, (present, _) in past.items():
                feed[p] = np.ascontiguousarray(got[present], dtype=specs[p][1])
        else:
            for p in past:
                feed[p] = np.zeros(specs[p][0], specs[p][1])
        _fill_positions(feed, specs, batch, plen, seq)
        feeds.append(feed)
    return feeds


def _fill_positions(feed: dict, specs: Specs, batch: int, start: int, seq: int) -> None:
    """Attention masks (ones over cache + new tokens) and position ids start..start+seq-1 of a cached decoder."""
    for name, (shape, dtype) in specs.items():
        kind = _filler(name)
        if kind == "ones":
            feed[name] = np.ones((batch, start + seq), dtype)
        elif kind == "positions":
            feed[name] = np.broadcast_to(np.arange(start, start + seq, dtype=dtype), (batch, seq)).copy()


def embedding_rows(model: onnx.ModelProto, input_name: str) -> int | None:
    """Rows of the embedding table gathered by ``input_name`` (the vocabulary size), if found."""
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == input_name:
            t = inits.get(node.input[0])
            if t is not None and t.dims:
                return int(t.dims[0])
    return None


def random_feeds(specs: Specs, count: int, seed: int = 0, model: onnx.ModelProto | None = None,
                 prefill: bool = False) -> list[dict[str, np.ndarray]]:
    """Seeded random feeds: N(0, 1) floats, token ids below the vocabulary size, masks and positions; a decoder's
    KV cache (:func:`past_inputs`) is the model's own, computed from random tokens before each sample."""
    rng = np.random.default_rng(seed)
    past = past_inputs(model, specs) if model is not None else {}
    ints = _token_inputs(specs)
    if past and len(ints) == 1:
        shape = specs[ints[0]][0]
        first = next(iter(past))
        window = specs[first][0][past[first][1]] + shape[-1]
        high = embedding_rows(model, ints[0]) or 100
        ids = rng.integers(0, high, size=count * shape[0] * window)
        return _tokens_with_cache(ids, ints[0], past, specs, count, model, "random tokens", prefill)
    feeds = []
    for _ in range(count):
        feed = {}
        for name, (shape, dtype) in specs.items():
            if _filler(name) is not None:
                continue
            if np.issubdtype(dtype, np.floating):
                feed[name] = rng.standard_normal(shape).astype(dtype)
            elif dtype == np.bool_:
                feed[name] = np.ones(shape, dtype)
            else:
                high = (embedding_rows(model, name) if model is not None else None) or 100
                feed[name] = rng.integers(0, high, size=shape).astype(dtype)
        _fill(feed, specs)
        feeds.append(feed)
    return feeds
