"""The deployment bundle's manifest: every file with its sha256, checked before anything is loaded.

A bundle is untrusted input (it is copied between machines by people and scripts), so the manifest is
validated before any file it names is opened: its size is capped, its schema checked (types, sizes), and
every file name must be a plain relative path that stays inside the bundle after symlinks are resolved
(``bundle_file``). A name that escapes would make the checksum check read, and its error message leak,
any file the process can read, and would let a bundle serve a graph from elsewhere. ``manifest.json`` itself
is read once, never through a symlink, and ``verify_files`` returns the bytes it hashed, so that what is
served is what was verified (a file swapped after the check is never read).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path, PurePosixPath
from typing import Any

from .atomic import atomic_write_json
from .bounded import MAX_BUNDLE_BYTES, MAX_JSON_BYTES, MAX_MEMBER_BYTES, read_capped
from .bundle_format import FILE_KINDS, FORMAT_VERSION, MANIFEST
from .errors import SacEdgeError
from .jsonfile import parse_json_object
from .versions import installed_version

MAX_MANIFEST_BYTES = 4 << 20
MAX_FILES = 256
MAX_NAME_CHARS = 255
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FIX = "re-export the bundle with sac-export"


def sha256_bytes(data: bytes) -> str:
    """The sha256 of bytes already in memory (a verified bundle file's), as ``sha256_file`` gives it."""
    return hashlib.sha256(data).hexdigest()


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


def files_table(bundle: Path) -> dict[str, dict[str, Any]]:
    """The manifest's ``files`` for a bundle being written: an entry for every file of the format
    (``bundle_format.FILE_KINDS``, with its kind and precision) present in ``bundle``."""
    files = {}
    for child in sorted(bundle.iterdir()):
        if child.is_file() and child.name in FILE_KINDS:
            kind, precision = FILE_KINDS[child.name]
            files[child.name] = file_entry(bundle, child.name, kind=kind, precision=precision)
    return files


def write_manifest(bundle: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` atomically, stamping the format version."""
    atomic_write_json(bundle / MANIFEST, {**manifest, "format_version": FORMAT_VERSION})


def manifest_bytes(bundle: str | Path) -> bytes:
    """The bytes of ``bundle/manifest.json`` (a regular file, not a symlink, at most MAX_MANIFEST_BYTES):
    read once, so the bytes a signature is checked on are the bytes parsed."""
    root = Path(bundle)
    path = root / MANIFEST
    if not path.is_file() and not path.is_symlink():
        raise SacEdgeError(f"{root} is not a bundle: {MANIFEST} is missing (create one with sac-export)")
    try:
        return read_capped(path, MAX_MANIFEST_BYTES, "bundle manifest", _FIX, follow=False)
    except OSError as err:
        raise SacEdgeError(f"{path}: cannot read the bundle manifest ({err.strerror or err}); {_FIX}") from None


def read_manifest(bundle: str | Path, *, verify: bool = True, data: bytes | None = None) -> dict[str, Any]:
    """Read a bundle's manifest (or parse ``data``, its bytes as ``manifest_bytes`` read them), validate its
    schema and confine every file name to the bundle; with ``verify`` also check every file's sha256.

    Raises SacEdgeError with one line naming the problem and the fix.
    """
    root = Path(bundle)
    path = root / MANIFEST
    raw = manifest_bytes(root) if data is None else data
    manifest = parse_json_object(raw, path, "bundle manifest", _FIX)
    version = manifest.get("format_version")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise SacEdgeError(
            f"{path} has format_version {version}, newer than the {FORMAT_VERSION} this sac-edge "
            f"({installed_version('sac-edge') or 'not installed'}) reads: pip install -U sac-edge, or re-export "
            "with this sac-edge's sac-export"
        )
    if version != FORMAT_VERSION:
        raise SacEdgeError(
            f"{path} has format_version {repr(version)[:20]}, this sac-edge reads {FORMAT_VERSION}; "
            "re-export the bundle with this version"
        )
    validate_manifest(root, manifest)
    if verify:
        verify_files(root, manifest)
    return manifest


def is_sac_edge_manifest(manifest: dict[str, Any]) -> bool:
    """Whether a manifest has the fields sac-export writes (what ``--force`` may replace)."""
    return (
        isinstance(manifest.get("format_version"), int)
        and isinstance(manifest.get("files"), dict)
        and isinstance(manifest.get("spec"), dict)
        and isinstance(manifest.get("source"), dict)
    )


def validate_manifest(root: Path, manifest: dict[str, Any]) -> None:
    """The manifest's schema (a ``files`` table of at most ``MAX_FILES`` entries with a hex sha256, a byte
    count, a kind and a precision each; a ``spec`` object) and every name confined to ``root``."""
    where = root / MANIFEST
    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(manifest.get("spec"), dict):
        raise SacEdgeError(f"{where}: 'files' and 'spec' must be JSON objects; {_FIX}")
    if len(files) > MAX_FILES:
        raise SacEdgeError(f"{where}: lists {len(files)} files, more than {MAX_FILES}; {_FIX}")
    for name, entry in files.items():
        bundle_file(root, name)
        shown = name[:80]
        if not isinstance(entry, dict):
            raise SacEdgeError(f"{where}: the entry for {shown!r} is not a JSON object; {_FIX}")
        if not isinstance(entry.get("sha256"), str) or not _SHA256.fullmatch(entry["sha256"]):
            raise SacEdgeError(f"{where}: the entry for {shown!r} has no hex sha256; {_FIX}")
        size = entry.get("bytes", 0)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise SacEdgeError(f"{where}: the entry for {shown!r} has a bad byte count; {_FIX}")
        if not isinstance(entry.get("kind"), str) or not isinstance(entry.get("precision"), (str, type(None))):
            raise SacEdgeError(f"{where}: the entry for {shown!r} needs a string kind and precision; {_FIX}")


def bundle_file(root: Path, name: object) -> Path:
    """``root/name`` for a manifest file name, refused (one line) unless ``name`` is a plain relative path
    (no absolute path, no ``..``, no backslash or NUL) that stays inside ``root`` once symlinks are resolved."""
    where = root / MANIFEST
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or "\\" in name or "\0" in name:
        raise SacEdgeError(f"{where}: file name {str(name)[:80]!r} is not a plain relative path; {_FIX}")
    pure = PurePosixPath(name)
    if pure.is_absolute() or any(part in ("..", ".") for part in pure.parts) or name != pure.as_posix():
        raise SacEdgeError(f"{where}: file name {name[:80]!r} points outside the bundle; {_FIX}")
    target = root / name
    base = root.resolve()
    resolved = target.resolve()
    if resolved != base and base not in resolved.parents:
        raise SacEdgeError(f"{where}: file name {name[:80]!r} leads outside the bundle (a symlink); {_FIX}")
    return target


def verify_files(root: Path, manifest: dict[str, Any], names: list[str] | None = None) -> dict[str, bytes]:
    """Check the sha256 of the bundle files (all, or ``names``) against the manifest; each name is confined
    to the bundle (``bundle_file``) before it is opened. Returns the bytes that were hashed, by name: serve
    those, never the file read again."""
    files = manifest.get("files", {})
    wanted = names if names is not None else sorted(files)
    targets = {}
    for name in wanted:
        if files.get(name) is None:
            raise SacEdgeError(f"{root}: {name} is not listed in the manifest; re-export the bundle")
        targets[name] = bundle_file(root, name)
        if not targets[name].is_file():
            raise SacEdgeError(f"{root}: {name} is listed in the manifest but missing; re-export the bundle")
    # The total is checked by the files' sizes before any is read (sparse files count at their full size),
    # and each read is capped by what is left of it, so a file growing meanwhile cannot get past it either.
    left = MAX_BUNDLE_BYTES
    if sum(target.stat().st_size for target in targets.values()) > left:
        raise SacEdgeError(
            f"{root}: the listed files hold more than {MAX_BUNDLE_BYTES >> 20} MiB in all, not a bundle sac-export "
            "wrote; re-export the bundle"
        )
    verified = {}
    for name in wanted:
        entry, target = files[name], targets[name]
        cap = min(MAX_JSON_BYTES if name.endswith(".json") else MAX_MEMBER_BYTES, left)
        data = read_capped(target, cap, "bundle file", "re-export the bundle")
        left -= len(data)
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise SacEdgeError(f"{root}: checksum mismatch for {name} (file changed or corrupt); re-export the bundle")
        verified[name] = data
    return verified
