"""One exception type for every user-facing failure: it names the problem and the fix."""

from __future__ import annotations


class EdgeSDKError(Exception):
    """A problem the user can fix. ``str(err)`` reads "problem\\n  fix: ...".

    Args:
        problem (str): What is wrong, naming the file, tensor or layer concerned.
        fix (str): What to do about it.
    """

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem if not fix else f"{problem}\n  fix: {fix}")


class FormatError(EdgeSDKError):
    """Packed weights that are corrupted or do not match their header."""
