"""The deployment bundle's manifest: every file with its sha256, checked before anything is loaded."""

from __future__ import annotations

import hashlib
import importlib.metadata
from pathlib import Path
from typing import Any

from .atomic import atomic_write_json
from .errors import SacEdgeError
from .jsonfile import read_json

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, streamed."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_entry(bundle: Path, name: str, *, kind: str, precision: str | None = None) -> dict[str, Any]:
    """A manifest ``files`` entry for ``bundle/name``."""
    path = bundle / name
    return {
        "sha256": sha256_file(path),
        "bytes": path.stat().st_size,
        "kind": kind,
        "precision": precision,
    }


def write_manifest(bundle: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` atomically, stamping the format version."""
    atomic_write_json(bundle / MANIFEST, {**manifest, "format_version": FORMAT_VERSION})


def _own_version() -> str:
    try:
        return importlib.metadata.version("sac-edge")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def read_manifest(bundle: str | Path, *, verify: bool = True) -> dict[str, Any]:
    """Read a bundle's manifest; with ``verify`` check format_version and every file's sha256.

    Raises SacEdgeError with one line naming the problem and the fix.
    """
    root = Path(bundle)
    if not (root / MANIFEST).is_file():
        raise SacEdgeError(f"{root} is not a bundle: {MANIFEST} is missing (create one with sac-export)")
    path = root / MANIFEST
    manifest = read_json(path, "bundle manifest", "re-export the bundle")
    version = manifest.get("format_version")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise SacEdgeError(
            f"{path} has format_version {version}, newer than the {FORMAT_VERSION} this sac-edge "
            f"({_own_version()}) reads: pip install -U sac-edge, or re-export with this sac-edge's sac-export"
        )
    if version != FORMAT_VERSION:
        raise SacEdgeError(
            f"{path} has format_version {version!r}, this sac-edge reads {FORMAT_VERSION}; "
            "re-export the bundle with this version"
        )
    if verify:
        verify_files(root, manifest)
    return manifest


def verify_files(root: Path, manifest: dict[str, Any], names: list[str] | None = None) -> None:
    """Check the sha256 of the bundle files (all, or ``names``) against the manifest."""
    files = manifest.get("files", {})
    for name in names if names is not None else sorted(files):
        entry = files.get(name)
        if entry is None:
            raise SacEdgeError(f"{root}: {name} is not listed in the manifest; re-export the bundle")
        target = root / name
        if not target.is_file():
            raise SacEdgeError(f"{root}: {name} is listed in the manifest but missing; re-export the bundle")
        actual = sha256_file(target)
        if actual != entry.get("sha256"):
            raise SacEdgeError(f"{root}: checksum mismatch for {name} (file changed or corrupt); re-export the bundle")
