"""Static check of the package: pyflakes finds no undefined names, unused imports or the like in ``edgesdk/``.

Much of ``edgesdk/trt/`` runs only where TensorRT is installed, which no machine here has; a name used there but
never defined would first fail on a user's Jetson. (It happened: ``_build`` used a ``profile`` it was not given.)
"""

from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edgesdk"


def test_pyflakes_clean():
    api = pytest.importorskip("pyflakes.api", reason="pyflakes is not installed (pip install -e '.[dev]')")
    from pyflakes.reporter import Reporter

    class Collect(Reporter):
        def __init__(self):
            self.messages = []

        def unexpectedError(self, filename, message):
            self.messages.append(f"{filename}: {message}")

        def syntaxError(self, filename, msg, lineno, offset, text):
            self.messages.append(f"{filename}:{lineno}: {msg}")

        def flake(self, message):
            self.messages.append(str(message))

    rep = Collect()
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 30
    for f in files:
        api.checkPath(str(f), rep)
    assert rep.messages == []
