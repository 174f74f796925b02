"""Engine build and plan checks that need no TensorRT (edgesdk/trt/engine.py, registry.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.trt import engine as E

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None


@pytest.mark.skipif(HAVE_TRT, reason="checks the TensorRT-less path")
def test_build_without_tensorrt_says_so_plainly(tmp_path):
    r = E.build_engine(Path("model.onnx"), tmp_path, SimpleNamespace(workspace_mb=1024), SimpleNamespace())
    assert r["built"] is False and r["plan"] is None and r["tensorrt"] == "absent"
    assert "TensorRT is not installed" in r["reason"] and "Jetson" in r["reason"]
    assert {"cuda", "compute_capability"} <= set(r)
    assert not (tmp_path / E.PLAN_NAME).exists()
    with pytest.raises(EdgeSDKError, match="TensorRT is not installed") as e:
        from edgesdk.trt.registry import register_plugins

        register_plugins()
    assert "onnxruntime" in e.value.fix


@pytest.mark.parametrize("v,want", [("8.7", "8.7"), ("sm_87", "8.7"), ((8, 7), "8.7"), (87, "8.7"),
                                    ("sm_90", "9.0"), ("SM_100", "10.0"), ("12.1", "12.1"), (None, None)])
def test_normalize_cc(v, want):
    assert E.normalize_cc(v) == want


@pytest.mark.parametrize("bad", ["orin", "8", "sm_", "8.x"])
def test_normalize_cc_rejects(bad):
    with pytest.raises(EdgeSDKError, match="compute capability"):
        E.normalize_cc(bad)


HERE = {"tensorrt": "10.3.0.30", "cuda": "12.6", "compute_capability": "8.7"}


def test_plan_compatibility():
    E.check_plan_compatible({"tensorrt": "10.3.0.26", "compute_capability": "sm_87"}, HERE)  # same 10.3.0
    cases = [({"tensorrt": "10.16.1", "compute_capability": "8.7"}, "TensorRT 10.16.1; this machine has 10.3.0.30"),
             ({"tensorrt": "10.3.0", "compute_capability": "9.0"}, "compute capability 9.0; this GPU is 8.7"),
             ({"tensorrt": "absent", "compute_capability": None}, "no TensorRT engine"),
             ({"tensorrt": "10.3.0.30", "compute_capability": "8.7", "built": False, "reason": "boom"},
              "says the engine build failed")]
    for rec, msg in cases:
        with pytest.raises(EdgeSDKError, match=msg.replace(".", r"\.")) as e:
            E.check_plan_compatible(rec, HERE)
        assert "rebuild" in e.value.fix
    with pytest.raises(EdgeSDKError, match="not installed here"):
        E.check_plan_compatible({"tensorrt": "10.3.0", "compute_capability": "8.7"},
                                {"tensorrt": "absent", "compute_capability": None})


def test_engine_record_found_top_level_or_nested():
    rec = {"built": True, "tensorrt": "10.3.0", "cuda": "12.6", "compute_capability": "8.7"}
    assert E.engine_record({"engine": rec, "model": "x"}) is rec
    top = {"tensorrt": "10.3.0", "compute_capability": "8.7", "files": {}}
    assert E.engine_record(top) is top
    assert E.engine_record({"model": "x"}) is None


def test_refuses_to_build_for_another_gpu():
    orin = SimpleNamespace(workspace_mb=64, compute_capability="sm_87")
    reason = E.target_mismatch(orin, "9.0")
    assert "targets compute capability 8.7" in reason and "9.0" in reason and "build on the target" in reason
    assert E.target_mismatch(orin, "8.7") is None
    assert E.target_mismatch(SimpleNamespace(workspace_mb=64), "9.0") is None  # no target: any GPU


def test_timing_cache_default_is_per_version_and_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path))
    from edgesdk import __version__

    p = E.default_timing_cache("10.3.0", "8.7", 16)
    assert p == tmp_path / "trt" / f"timing-10.3.0-sm87-16sm-edgesdk{__version__}.cache"
    # another TensorRT, another Orin module (same sm_87, other SM count): other files
    assert len({p, E.default_timing_cache("10.16.1", "8.7", 16), E.default_timing_cache("10.3.0", "8.7", 8)}) == 3


def test_atomic_write_leaves_no_temp(tmp_path):
    E._atomic_write(tmp_path / "model.plan", memoryview(b"abc"))
    assert (tmp_path / "model.plan").read_bytes() == b"abc"
    assert [p.name for p in tmp_path.iterdir()] == ["model.plan"]


def test_optimization_profile_shapes():
    assert E.profile_shapes({"x": (2, 3)}, {}) == {}
    assert E.profile_shapes({"x": (-1, 3, 8, 8)}, {}, 8) == {"x": ((1, 3, 8, 8), (1, 3, 8, 8), (8, 3, 8, 8))}
    assert E.profile_shapes({"ids": (-1, -1)}, {"ids": [4, 77]}, 2) == {"ids": ((1, 77), (4, 77), (4, 77))}
    assert E.profile_shapes({"x": (5, -1)}, {"x": [5, 9]}) == {"x": ((5, 9), (5, 9), (5, 9))}
    with pytest.raises(EdgeSDKError, match="besides the batch") as e:
        E.profile_shapes({"ids": (-1, -1)}, {})
    assert "--shape ids:NxN" in e.value.fix
    with pytest.raises(EdgeSDKError, match="does not fit"):
        E.profile_shapes({"x": (-1, 3)}, {"x": [2, 4]})
