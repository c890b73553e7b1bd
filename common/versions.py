"""Versions: of the native stacks (TensorRT, CUDA, cuda-python) as comparable tuples, and of installed
distributions, read from package metadata (nothing is imported)."""

from __future__ import annotations

import importlib.metadata
import re

from .errors import SacEdgeError


def parse_version(version: str, what: str = "TensorRT") -> tuple[int, int, int]:
    """``"8.5.2.2"`` -> ``(8, 5, 2)``; a string without major.minor is a one-line error."""
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", str(version).strip())
    if match is None:
        raise SacEdgeError(f"cannot read the {what} version {version!r}; reinstall {what}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def installed_version(*names: str) -> str | None:
    """The installed version of the first of the distributions ``names`` that is installed, else None."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
