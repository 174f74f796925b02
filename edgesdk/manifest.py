"""``manifest.json``: what made a build folder (tool versions, device profile) and sha256 of every file."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
from pathlib import Path

from edgesdk.onnx_io import sha256_file

MANIFEST_NAME = "manifest.json"
PACKAGES = ("edgesdk", "onnx", "onnxruntime", "onnxruntime-extensions", "onnx-graphsurgeon", "polygraphy", "numpy")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        if dist == "edgesdk":
            import edgesdk

            return edgesdk.__version__
        return "absent"


def tensorrt_version() -> str:
    """TensorRT's version, or ``"absent"`` when the ``tensorrt`` module cannot be found."""
    if importlib.util.find_spec("tensorrt") is None:
        return "absent"
    try:
        import tensorrt

        return str(tensorrt.__version__)
    except Exception as e:  # noqa: BLE001 - a broken install is reported, not fatal
        return f"unusable ({type(e).__name__})"


def versions() -> dict[str, str]:
    """Versions of Python, the packages a build depends on, and TensorRT (or ``"absent"``)."""
    out = {"python": platform.python_version()}
    out.update({p: _version(p) for p in PACKAGES})
    out["tensorrt"] = tensorrt_version()
    return out


def make_manifest(folder: Path, model_path: Path, model_sha256: str, device, engine: dict,
                  extra_inputs: dict[str, Path] | None = None) -> dict:
    """The manifest of ``folder`` (sha256 of every file already in it, except the manifest itself).

    Args:
        folder: Build folder (possibly still under its temporary name).
        model_path: Input model path (recorded as given).
        model_sha256: sha256 of the input model.
        device: The ``DeviceProfile`` built for.
        engine: ``build_engine``'s result (``built``, ``reason``, ``plan``, ``tensorrt``, ``cuda``,
            ``compute_capability``).
        extra_inputs: Other input files (e.g. calibration data) to hash.
    """
    inputs = {"model": {"path": str(model_path), "sha256": model_sha256}}
    for name, p in (extra_inputs or {}).items():
        if p is not None and Path(p).is_file():
            inputs[name] = {"path": str(p), "sha256": sha256_file(p)}
    files = {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != MANIFEST_NAME}
    eng = {k: engine.get(k) for k in ("built", "reason", "tensorrt", "cuda", "compute_capability")}
    eng["plan"] = Path(engine["plan"]).name if engine.get("plan") else None
    return {"versions": versions(), "device": device.model_dump(), "engine": eng, "inputs": inputs, "files": files}
