"""Replay protection for signed bundles: the newest release accepted from each signing key, kept on the device.

A signature says who built a bundle, not whether it is still the one to run: any bundle ever signed by a
trusted key verifies forever, so an old, known-bad bundle could be copied over a newer one. sac-export
stamps every manifest with ``release``, an integer that only grows (the export time in milliseconds), and
the signature covers it. Under ``--trusted-keys`` the runtime accepts a bundle only if its release is not
older than the newest it has accepted from the same key, and records a newer one
(``$SAC_EDGE_STATE_DIR/accepted_releases.json``, default ``~/.local/state/sac-edge``). Going back on
purpose takes ``--allow-downgrade``; the record keeps the newest release either way.

The record is a security record, so it fails closed: a record that is not a regular file (a symlink, a
FIFO), is over 16 MiB, is not a JSON object of ``{key id: {"release": int}}``, or is missing once one was
written (``accepted_releases.created`` says one was) refuses every signed bundle in one line naming the
file and ``--allow-downgrade``, which accepts the bundle and writes a fresh record. The record is written
atomically (temp file, rename): a symlink in its place is replaced, never written through.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .atomic import atomic_write_json, atomic_write_text
from .bounded import MAX_JSON_BYTES, read_capped
from .errors import SacEdgeError
from .jsonfile import parse_json_object

RELEASE = "release"
STATE_ENV = "SAC_EDGE_STATE_DIR"
RECORD = "accepted_releases.json"
#: Written beside the record when it is first created: a record missing after that was deleted.
CREATED = "accepted_releases.created"
DOWNGRADE_FLAG = "--allow-downgrade"


def new_release() -> int:
    """The release number of a bundle exported now."""
    return time.time_ns() // 1_000_000


def state_dir() -> Path:
    """Where the device keeps its record: ``$SAC_EDGE_STATE_DIR``, else ``$XDG_STATE_HOME/sac-edge``, else
    ``~/.local/state/sac-edge``."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sac-edge"


def release_of(manifest: dict[str, Any]) -> int:
    """The manifest's release (0 for a bundle exported before releases were stamped)."""
    value = manifest.get(RELEASE)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def read_record(path: Path) -> dict[str, dict[str, Any]]:
    """The accepted releases in ``path`` by key id ({} before the first is recorded); any damage is one
    SacEdgeError line naming the file and the downgrade flag."""
    fix = (
        f"it holds the newest release accepted from each signing key: restore it, or pass {DOWNGRADE_FLAG} to "
        "accept this bundle and start a new record"
    )
    if not os.path.lexists(path):
        if os.path.lexists(path.with_name(CREATED)):
            raise SacEdgeError(f"{path}: record of accepted releases is missing (deleted?); {fix}")
        return {}
    raw = read_capped(path, MAX_JSON_BYTES, "record of accepted releases", fix, follow=False)
    record = parse_json_object(raw, path, "record of accepted releases", fix)
    for key, entry in record.items():
        newest = entry.get(RELEASE) if isinstance(entry, dict) else None
        if not (isinstance(newest, int) and not isinstance(newest, bool) and newest >= 0):
            raise SacEdgeError(f"{path}: record of accepted releases has no integer release for key {key[:40]}; {fix}")
    return record


def check_release(bundle: Path, manifest: dict[str, Any], key_id: str, *, allow_downgrade: bool = False) -> int:
    """Refuse (one line) a bundle older than the newest accepted from ``key_id`` unless ``allow_downgrade``;
    record a newer one. Call only once the signature and every file are verified. Returns the release."""
    release = release_of(manifest)
    path = state_dir() / RECORD
    try:
        record = read_record(path)
    except SacEdgeError:
        if not allow_downgrade:
            raise
        record = {}  # the damaged record is replaced by a fresh one (atomically: never written through)
    entry = record.get(key_id)
    newest = entry[RELEASE] if entry is not None else None
    if newest is not None and release < newest and not allow_downgrade:
        raise SacEdgeError(
            f"{bundle}: release {release} is older than release {newest} already accepted from key {key_id} "
            f"(a replayed bundle?); run the newer bundle, or pass {DOWNGRADE_FLAG} to go back on purpose"
        )
    if newest is None or release > newest:
        record[key_id] = {RELEASE: release, "bundle": str(bundle), "accepted_unix": round(time.time(), 3)}
        try:
            atomic_write_json(path, record)
            if not path.with_name(CREATED).is_file():
                atomic_write_text(path.with_name(CREATED), f"{RECORD} first written at unix {time.time():.0f}\n")
        except OSError as err:
            raise SacEdgeError(
                f"cannot record the accepted release in {path} ({err.strerror or err}); set {STATE_ENV} to a "
                "directory this user can write"
            ) from None
    return release
