"""Replay protection for signed bundles: the newest release accepted from each signing key, kept on the device.

A signature says who built a bundle, not whether it is still the one to run: any bundle ever signed by a
trusted key verifies forever, so an old, known-bad bundle could be copied over a newer one. sac-export
stamps every manifest with ``release``, an integer that only grows (the export time in milliseconds), and
the signature covers it. Under ``--trusted-keys`` the runtime accepts a bundle only if its release is not
older than the newest it has accepted from the same key, and records a newer one
(``$SAC_EDGE_STATE_DIR/accepted_releases.json``, default ``~/.local/state/sac-edge``). Going back on
purpose takes ``--allow-downgrade``; the record keeps the newest release either way.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .atomic import atomic_write_json
from .errors import SacEdgeError
from .jsonfile import read_json_or_none

RELEASE = "release"
STATE_ENV = "SAC_EDGE_STATE_DIR"
RECORD = "accepted_releases.json"


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


def check_release(bundle: Path, manifest: dict[str, Any], key_id: str, *, allow_downgrade: bool = False) -> int:
    """Refuse (one line) a bundle older than the newest accepted from ``key_id`` unless ``allow_downgrade``;
    record a newer one. Call only once the signature and every file are verified. Returns the release."""
    release = release_of(manifest)
    path = state_dir() / RECORD
    record = read_json_or_none(path, follow=False) or {}
    entry = record.get(key_id)
    newest = entry.get(RELEASE) if isinstance(entry, dict) else None
    newest = newest if isinstance(newest, int) and not isinstance(newest, bool) else None
    if newest is not None and release < newest and not allow_downgrade:
        raise SacEdgeError(
            f"{bundle}: release {release} is older than release {newest} already accepted from key {key_id} "
            "(a replayed bundle?); run the newer bundle, or pass --allow-downgrade to go back on purpose"
        )
    if newest is None or release > newest:
        record[key_id] = {RELEASE: release, "bundle": str(bundle), "accepted_unix": round(time.time(), 3)}
        try:
            atomic_write_json(path, record)
        except OSError as err:
            raise SacEdgeError(
                f"cannot record the accepted release in {path} ({err.strerror or err}); set {STATE_ENV} to a "
                "directory this user can write"
            ) from None
    return release
