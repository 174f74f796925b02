"""Calibration readers: .npz/.npy, folders of arrays, image folders with preprocessing, token ids, random data."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgesdk.calibration import IMAGENET_MEAN, IMAGENET_STD, load_feeds, random_feeds
from edgesdk.errors import EdgeSDKError

RNG = np.random.default_rng(11)
IMG = {"x": ([2, 3, 5, 7], np.dtype(np.float32))}
LM = {"input_ids": ([1, 6], np.dtype(np.int64)), "attention_mask": ([1, 6], np.dtype(np.int64)),
      "position_ids": ([1, 6], np.dtype(np.int64))}


def test_npz_is_split_into_batches(tmp_path):
    x = RNG.standard_normal((7, 3, 5, 7)).astype(np.float32)
    np.savez(tmp_path / "c.npz", x=x)
    feeds = load_feeds(tmp_path / "c.npz", IMG, count=10)
    assert len(feeds) == 3  # 7 samples → 3 whole batches of 2
    np.testing.assert_array_equal(feeds[1]["x"], x[2:4])
    assert len(load_feeds(tmp_path / "c.npz", IMG, count=2)) == 2
    np.save(tmp_path / "c.npy", x)  # single-input model: a bare .npy
    np.testing.assert_array_equal(load_feeds(tmp_path / "c.npy", IMG, 1)[0]["x"], x[:2])


def test_folder_of_npy_one_sample_each(tmp_path):
    xs = [RNG.standard_normal((3, 5, 7)).astype(np.float32) for _ in range(4)]
    for i, a in enumerate(xs):
        np.save(tmp_path / f"{i:02d}.npy", a)
    feeds = load_feeds(tmp_path, IMG, 5)
    assert len(feeds) == 2
    np.testing.assert_array_equal(feeds[1]["x"], np.stack(xs[2:4]))


def test_image_folder_resized_and_normalized(tmp_path):
    from PIL import Image

    pixels = [RNG.integers(0, 256, (10, 14, 3), dtype=np.uint8) for _ in range(2)]
    for i, p in enumerate(pixels):
        Image.fromarray(p).save(tmp_path / f"img{i}.png")
    (feed,) = load_feeds(tmp_path, IMG, 3)
    x = feed["x"]
    assert x.shape == (2, 3, 5, 7) and x.dtype == np.float32
    ref = np.asarray(Image.fromarray(pixels[1]).resize((7, 5), Image.BILINEAR), np.float64) / 255.0
    ref = (ref - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    np.testing.assert_allclose(x[1], ref.transpose(2, 0, 1), rtol=1e-5, atol=1e-5)
    gray = {"x": ([1, 1, 4, 4], np.dtype(np.float32))}
    (g,) = load_feeds(tmp_path, gray, 1, image_mean=[0.5], image_std=[0.25])
    ref = np.asarray(Image.fromarray(pixels[0]).convert("L").resize((4, 4), Image.BILINEAR), np.float64) / 255.0
    np.testing.assert_allclose(g["x"][0, 0], (ref - 0.5) / 0.25, rtol=1e-5, atol=1e-5)
    (tmp_path / "img9.png").write_bytes(b"not a png")
    with pytest.raises(EdgeSDKError, match="cannot read image"):
        load_feeds(tmp_path, IMG, 3)


def test_token_ids_text_fills_mask_and_positions(tmp_path):
    ids = RNG.integers(0, 500, 20)
    (tmp_path / "t.txt").write_text(" ".join(map(str, ids[:9])) + "\n" + " ".join(map(str, ids[9:])) + "\n")
    feeds = load_feeds(tmp_path / "t.txt", LM, 10)
    assert len(feeds) == 3  # 20 ids → 3 sequences of 6
    np.testing.assert_array_equal(feeds[2]["input_ids"], ids[12:18].reshape(1, 6))
    np.testing.assert_array_equal(feeds[0]["attention_mask"], np.ones((1, 6)))
    np.testing.assert_array_equal(feeds[0]["position_ids"], np.arange(6)[None])
    (tmp_path / "bad.txt").write_text("1 2 three")
    with pytest.raises(EdgeSDKError, match="integer token ids"):
        load_feeds(tmp_path / "bad.txt", LM, 1)
    (tmp_path / "short.txt").write_text("1 2 3")
    with pytest.raises(EdgeSDKError, match="fewer than one batch"):
        load_feeds(tmp_path / "short.txt", LM, 1)


def test_random_feeds_are_seeded_and_bounded_by_the_vocabulary():
    emb = onnx.numpy_helper.from_array(np.zeros((37, 4), np.float32), "emb")
    g = helper.make_graph([helper.make_node("Gather", ["emb", "input_ids"], ["h"])], "g",
                          [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 6])],
                          [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 6, 4])], [emb])
    model = helper.make_model(g)
    a = random_feeds(LM, 50, seed=3, model=model)
    b = random_feeds(LM, 50, seed=3, model=model)
    assert all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))
    ids = np.concatenate([f["input_ids"] for f in a])
    assert ids.min() >= 0 and ids.max() == 36
    f = random_feeds(IMG, 1, seed=3)[0]["x"]
    assert f.shape == (2, 3, 5, 7) and np.all(np.isfinite(f)) and not np.all(f == 0)


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(EdgeSDKError, match="does not exist"):
        load_feeds(tmp_path / "none.npz", IMG, 1)
    (tmp_path / "x.csv").write_text("1,2")
    with pytest.raises(EdgeSDKError, match="unknown type"):
        load_feeds(tmp_path / "x.csv", IMG, 1)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EdgeSDKError, match="holds no"):
        load_feeds(empty, IMG, 1)
    np.savez(tmp_path / "nan.npz", x=np.full((2, 3, 5, 7), np.nan, np.float32))
    with pytest.raises(EdgeSDKError, match="NaN"):
        load_feeds(tmp_path / "nan.npz", IMG, 1)
