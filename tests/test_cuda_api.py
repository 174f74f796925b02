"""Every CUDA driver/NVRTC name edgesdk calls exists in the installed cuda-python.

CI runs this with the newest cuda-python (13.x) and, in .ci/lowest.sh, with 12.6.2 (JetPack 6's line), so a name
one of them lacks is found without a GPU (the GPU tests that call them are skipped here)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CALL = re.compile(r"(?:\b(?:cu|driver|nvrtc)|_driver\(\))\.((?:cu|nvrtc)[A-Z]\w*|CU\w+)")


def used_names() -> set[str]:
    return {m.group(1) for p in (ROOT / "edgesdk").rglob("*.py") for m in CALL.finditer(p.read_text())}


def test_the_scan_finds_the_calls():
    names = used_names()
    assert {"cuModuleLoadData", "cuLaunchKernel", "nvrtcCompileProgram", "CUstream"} <= names, sorted(names)


def test_every_name_exists_in_cuda_python():
    bindings = pytest.importorskip("cuda.bindings", reason="needs cuda-python (extra [gpu])")
    from cuda.bindings import driver, nvrtc

    missing = sorted(n for n in used_names() if not (hasattr(driver, n) or hasattr(nvrtc, n)))
    assert not missing, f"cuda-python {bindings.__version__} lacks {missing}"
