"""The wheel holds what an installed edgesdk needs: every module, the CUDA sources (as edgesdk/_plugins, read from
there when installed; the Docker images install with `pip install .`) and the entry points."""

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if importlib.util.find_spec("setuptools") is None or importlib.util.find_spec("wheel") is None:
        pytest.skip("needs setuptools and wheel to build the wheel without network")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):  # a clean copy: no build/ left over from an earlier build
        shutil.copy(ROOT / name, src / name)
    for name in ("edgesdk", "plugins"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = out.glob("edgesdk-*.whl")
    return whl


def test_wheel_holds_every_module_and_cuda_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "edgesdk").rglob("*.py")}
    assert modules and modules <= names, sorted(modules - names)
    sources = {"edgesdk/_plugins/" + p.relative_to(ROOT / "plugins").as_posix()
               for p in (ROOT / "plugins").rglob("*") if p.suffix in (".cu", ".cuh")}
    assert sources and sources <= names, sorted(sources - names)
    (eps,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(eps).decode()
    assert "edgesdk = edgesdk.cli:main" in text and "polygraphy.run.plugins" in text


def test_installed_layout_reads_its_own_cuda_sources(wheel, tmp_path):
    """Unpacked as pip installs it, away from the repository: the launchers find the sources inside the package,
    and each operator's source is there."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("from edgesdk.kernels import _cuda, bitmap_linear, sparse_kv, vitbit_gemm\n"
            "print(_cuda.PLUGINS_DIR)\n"
            "assert all((_cuda.PLUGINS_DIR / m.SOURCE).is_file() for m in (bitmap_linear, sparse_kv, vitbit_gemm))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert Path(r.stdout.strip()) == site / "edgesdk" / "_plugins"
