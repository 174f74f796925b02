#!/usr/bin/env bash
# JetPack 6's Python (3.10) with the lowest versions pyproject.toml allows (.ci/lowest.txt): edgesdk installed as a
# wheel (as the Docker images install it) and used from outside the repository, the plugin kernels compiled by
# NVRTC 12.6 (JetPack 6's CUDA), then the README's test command.   Usage: bash .ci/lowest.sh PYTHON3.10
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$1" -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q -c .ci/lowest.txt ".[gpu,dev,llm]" nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# cuda-python 12.6 loads libnvrtc.so.12 by name; the headers are those of the same wheel set
export LD_LIBRARY_PATH="$site/nvidia/cuda_nvrtc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CUDA_HOME="$site/nvidia/cuda_runtime"
cd "$work"  # the installed wheel, not the repository
PATH="$work/venv/bin:/usr/bin:/bin" "$py" - "$repo/.ci/lowest.txt" <<'PY'
import importlib.metadata as md
import sys
from pathlib import Path

import edgesdk
from edgesdk.kernels import _cuda

want = dict(line.split("==") for line in Path(sys.argv[1]).read_text().splitlines() if "==" in line)
got = {name: md.version(name) for name in want}
print("python", sys.version.split()[0], "|", _cuda.compiler_id(), "|", ", ".join(f"{k} {v}" for k, v in got.items()))
assert sys.version_info[:2] == (3, 10), sys.version
assert got == want, {k: (got[k], want[k]) for k in want if got[k] != want[k]}
assert _cuda.compiler_id() == "nvrtc 12.6" and "site-packages" in edgesdk.__file__, (_cuda.compiler_id(), edgesdk.__file__)
PY
PATH="$work/venv/bin:/usr/bin:/bin" EDGESDK_CACHE="$work/cache" edgesdk kernels --arch sm_87 --op sparse_kv
"$work/venv/bin/edgesdk" build "$repo/models/digits_vit.onnx" -o "$work/digits" --calibration "$repo/calibration/digits.npz" --quiet
test -f "$work/digits/report.json"
cd "$repo"
"$py" -m pytest -q tests
