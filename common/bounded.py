"""Bounded reads: a file or archive member is refused by its size before it is read into memory.

Every file sac-edge reads may come from elsewhere (bundles, run dirs, SB3 zips); a huge or decompression-
bomb member would otherwise exhaust memory before any check runs. Sizes are checked against the declared
size first and reads never take more than the cap plus one byte, so a lying header cannot get further.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from .errors import SacEdgeError

#: The largest JSON file sac-edge reads (manifests, configs, sidecars are a few KiB to a few MiB).
MAX_JSON_BYTES = 16 << 20
#: The largest member of an archive read whole (an SB3 ``policy.pth`` of a 1024x1024 MLP is ~30 MiB).
MAX_MEMBER_BYTES = 512 << 20


def read_capped(path: Path, max_bytes: int, what: str, fix: str) -> bytes:
    """The bytes of ``path``, refusing (one SacEdgeError line) a file larger than ``max_bytes`` before it
    is read whole; at most ``max_bytes + 1`` bytes are ever read, even if the file grows meanwhile."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SacEdgeError(f"{path}: {what} is larger than {_size(max_bytes)}, not one sac-edge wrote; {fix}")
    return data


def read_zip_member(archive: zipfile.ZipFile, name: str, max_bytes: int, source: Path) -> bytes:
    """Member ``name`` of ``archive`` (read from ``source``), refused in one line when it inflates to more
    than ``max_bytes`` (a zip bomb): by its declared size before decompressing, and by a capped read."""
    info = archive.getinfo(name)
    if info.file_size > max_bytes:
        raise SacEdgeError(
            f"{source}: archive member {name} inflates to {_size(info.file_size)}, more than the "
            f"{_size(max_bytes)} limit (a corrupt or hostile archive); use the original file"
        )
    with archive.open(info) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SacEdgeError(f"{source}: archive member {name} inflates past {_size(max_bytes)}; use the original file")
    return data


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
