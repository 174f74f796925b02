"""edgesdk pack: files + index.json with sha256 sums, atomic folder, read back and validated."""

import hashlib
import json

import numpy as np
import onnx
import pytest

from edgesdk.config import BuildConfig
from edgesdk.errors import EdgeSDKError, FormatError
from edgesdk.formats.bitmap_linear import BitmapLinearWeights
from edgesdk.formats.vitbit_gemm import VitBitWeights
from edgesdk.inspect import find_linears
from edgesdk.pack import load_pack, pack_model
from edgesdk.quantize import quantize_int8
from test_rewrite import feeds_for, linear_model


@pytest.fixture()
def model_file(tmp_path):
    m = linear_model("matmul_add_3d", k=130, n=67)
    path = tmp_path / "fc.onnx"
    onnx.save(m, str(path))
    return path, m


def test_pack_writes_index_and_files(model_file, tmp_path):
    path, m = model_file
    out = tmp_path / "packed"
    cfg = BuildConfig(sparsity=0.5, prune="magnitude", kernels="bitmap")
    summary = pack_model(path, out, cfg)
    assert summary["layers"] == 1 and summary["skipped"] == 0
    index = json.loads((out / "index.json").read_text())
    assert index["source"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    (layer,) = index["layers"]
    assert layer["name"] == "fc" and layer["op_type"] == "EdgeBitmapLinear"
    assert [t["name"] for t in layer["tensors"]] == ["bitmaps", "values", "offsets", "scales", "bias"]
    for t in layer["tensors"]:
        data = (out / t["file"]).read_bytes()
        assert len(data) == t["bytes"] and hashlib.sha256(data).hexdigest() == t["sha256"]
    assert layer["bytes_packed"] == summary["bytes_packed"] == sum(t["bytes"] for t in layer["tensors"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".packed")]  # no temp folder left
    # read back: the dense weights are the pruned original rounded to fp16
    packed = load_pack(out)["fc"]
    assert isinstance(packed, BitmapLinearWeights)
    w = onnx.numpy_helper.to_array([t for t in m.graph.initializer if t.name == "fc.weight"][0]).T
    dense = packed.unpack()
    kept = dense != 0
    assert np.all(kept.sum(1) == 65)  # 130 - round(0.5 * 130) per output row
    np.testing.assert_array_equal(dense[kept], w[kept].astype(np.float16).astype(np.float32))


def test_pack_qdq_model_as_vitbit(tmp_path):
    m = linear_model("gemm_transB", k=40, n=24)
    q = quantize_int8(m, feeds_for(m), find_linears(m))
    path = tmp_path / "q.onnx"
    onnx.save(q, str(path))
    pack_model(path, tmp_path / "v", BuildConfig(kernels="vitbit"))
    packed = load_pack(tmp_path / "v")["fc"]
    assert isinstance(packed, VitBitWeights) and packed.w_q().shape == (24, 40)


def test_pack_is_atomic_and_refuses_to_overwrite(model_file, tmp_path):
    path, _ = model_file
    out = tmp_path / "packed"
    cfg = BuildConfig(kernels="bitmap", prune="magnitude")
    pack_model(path, out, cfg)
    before = (out / "index.json").read_text()
    with pytest.raises(EdgeSDKError, match="already exists"):
        pack_model(path, out, cfg)
    with pytest.raises(EdgeSDKError, match="packs nothing"):
        pack_model(path, out, BuildConfig(kernels="none", force=True))
    assert (out / "index.json").read_text() == before  # a failed run leaves the old folder whole
    pack_model(path, out, BuildConfig(kernels="bitmap", prune="magnitude", sparsity=0.7, force=True))
    assert json.loads((out / "index.json").read_text())["options"]["sparsity"] == 0.7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fc.onnx", "packed"]


def test_load_pack_detects_corruption(model_file, tmp_path):
    path, _ = model_file
    out = tmp_path / "packed"
    pack_model(path, out, BuildConfig(kernels="bitmap", prune="magnitude", sparsity=0.5))
    f = out / "fc" / "values.bin"
    data = bytearray(f.read_bytes())
    data[3] ^= 0x40
    f.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="sha256"):
        load_pack(out)
    f.write_bytes(bytes(data[:-2]))
    with pytest.raises(FormatError, match="sha256"):
        load_pack(out)
    # an index whose sums match but whose offsets disagree with the bitmaps: the format refuses it
    pack_model(path, out, BuildConfig(kernels="bitmap", prune="magnitude", sparsity=0.5, force=True))
    index = json.loads((out / "index.json").read_text())
    off = next(t for t in index["layers"][0]["tensors"] if t["name"] == "offsets")
    arr = np.frombuffer((out / off["file"]).read_bytes(), "<i4").copy()
    arr[1:] += 8
    raw = arr.tobytes()
    (out / off["file"]).write_bytes(raw)
    off["sha256"] = hashlib.sha256(raw).hexdigest()
    (out / "index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError):
        load_pack(out)


def test_pack_reads_an_already_rewritten_model(model_file, tmp_path):
    from edgesdk.rewrite import rewrite_model

    _, m = model_file
    new, _ = rewrite_model(m, BuildConfig(kernels="bitmap", prune="magnitude", sparsity=0.5), None, None)
    path = tmp_path / "rewritten.onnx"
    onnx.save(new, str(path))
    pack_model(path, tmp_path / "p", BuildConfig(kernels="none"))  # options unused: nodes are read as they are
    assert list(load_pack(tmp_path / "p")) == ["fc"]
