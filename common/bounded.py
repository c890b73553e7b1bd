"""Bounded reads: a file or archive member is refused by its size before it is read into memory.

Every file sac-edge reads may come from elsewhere (bundles, run dirs, SB3 zips); a huge or decompression-
bomb member would otherwise exhaust memory before any check runs. Sizes are checked against the declared
size first and reads never take more than the cap plus one byte, so a lying header cannot get further.

Every such file is also opened as a regular file only (``open_regular``): a FIFO or a device file in its
place (``/dev/zero``, a pipe nobody writes) would block or never end, and is refused without reading.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import zipfile
import zlib
from pathlib import Path

from .errors import SacEdgeError

#: The largest JSON file sac-edge reads (manifests, configs, sidecars are a few KiB to a few MiB).
MAX_JSON_BYTES = 16 << 20
#: The largest member of an archive read whole (an SB3 ``policy.pth`` of a 1024x1024 MLP is ~30 MiB).
MAX_MEMBER_BYTES = 512 << 20
#: The most bytes a verified bundle holds in memory in all (``open_bundle`` keeps every listed file): a
#: bundle of a 1024x1024 policy with every precision and engine is ~150 MiB.
MAX_BUNDLE_BYTES = 1 << 30
#: What ``zipfile`` raises on a damaged archive besides ``BadZipFile``: a header offset before the start
#: (ValueError: negative seek), a name that is not UTF-8 (UnicodeDecodeError), an unknown zip version or
#: compression method (NotImplementedError), an encrypted member (RuntimeError), a bad CRC or stream.
ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    EOFError,
    OSError,
    KeyError,
    ValueError,
    OverflowError,
    struct.error,
    NotImplementedError,
    RuntimeError,
)


def open_regular(
    path: Path, what: str, fix: str, *, follow: bool = True, flags: int = os.O_RDONLY, mode: int = 0o644
) -> int:
    """A file descriptor of ``path`` opened with ``flags``, refused (one SacEdgeError line, nothing read or
    written) unless it is a regular file; with ``follow=False`` a symlink as the last component is refused too.

    ``O_NONBLOCK`` keeps the open itself from blocking on a FIFO (it is then refused by its type); it is
    cleared again before the descriptor is returned.
    """
    extra = os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags | extra, mode)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow:
            raise SacEdgeError(f"{path}: {what} is a symlink, which sac-edge never follows here; {fix}") from None
        if err.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise SacEdgeError(f"{path}: {what} is not a regular file (a FIFO); {fix}") from None
        raise
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            shown = (
                "a FIFO"
                if stat.S_ISFIFO(kind)
                else "a device"
                if stat.S_ISCHR(kind) or stat.S_ISBLK(kind)
                else "a directory"
                if stat.S_ISDIR(kind)
                else "not a file"
            )
            raise SacEdgeError(f"{path}: {what} is not a regular file ({shown}); {fix}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_capped(path: Path, max_bytes: int, what: str, fix: str, *, follow: bool = True) -> bytes:
    """The bytes of ``path``, refusing (one SacEdgeError line) a file larger than ``max_bytes`` before it
    is read whole; at most ``max_bytes + 1`` bytes are ever read, even if the file grows meanwhile. Only a
    regular file is read (``open_regular``); with ``follow=False`` not through a symlink."""
    with os.fdopen(open_regular(path, what, fix, follow=follow), "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SacEdgeError(f"{path}: {what} is larger than {_size(max_bytes)}, not one sac-edge wrote; {fix}")
    return data


def safetensors_shapes(path: Path, what: str, fix: str) -> dict[str, tuple[int, ...]]:
    """The shape each tensor of a safetensors file declares, from its header alone (8-byte length, then at
    most MAX_JSON_BYTES of JSON), so sizes can be checked before the file is mapped; one SacEdgeError line
    for a header that is not one."""
    with os.fdopen(open_regular(path, what, fix, follow=False), "rb") as fh:
        head = fh.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < size <= MAX_JSON_BYTES:
            raise SacEdgeError(f"{path}: {what} has no safetensors header of at most 16 MiB; {fix}")
        raw = fh.read(size)
    try:
        header = json.loads(raw)
        shapes = {
            name: tuple(int(d) for d in info["shape"])
            for name, info in header.items()
            if name != "__metadata__" and all(type(d) is int and d >= 0 for d in info["shape"])
        }
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        raise SacEdgeError(f"{path}: {what} has a malformed safetensors header; {fix}") from None
    if len(shapes) != len(header) - ("__metadata__" in header):
        raise SacEdgeError(f"{path}: {what} declares a tensor shape that is not a list of sizes; {fix}")
    return shapes


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
