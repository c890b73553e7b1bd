"""Atomic file and directory writes: a reader sees the old complete version or the new one, never half.

Temp file in the same directory, fsync, rename, fsync of the directory: the POSIX recipe that survives
a crash or power loss (rename is atomic on one filesystem). An output that must not replace anything is
claimed by the rename itself (``rename_noreplace``: the existence check and the rename are one operation),
so of two concurrent writers of one path the later loses with one line instead of deleting the other's.
Temp files and staging directories carry the writer's pid (``.NAME.PID.*.tmp|partial|old``); the next write
of the same target removes those whose writer is gone (killed mid-write), and leaves a live writer's alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import SacEdgeError
from .summary import strict_json


def check_output_path(path: str | os.PathLike[str], flag: str, *, directory: bool = False) -> None:
    """Refuse (one SacEdgeError line) an output path that cannot be written, before any slow work: an
    existing directory where a file is wanted or the reverse, or a nearest existing parent that is not a
    writable directory."""
    target = Path(path)
    want, other = ("directory", "file") if directory else ("file", "directory")
    if target.exists() and target.is_dir() != directory:
        raise SacEdgeError(f"{flag} {target} is a {other}; pass a {want} path")
    parent = target if directory and target.is_dir() else target.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise SacEdgeError(f"{flag} {target}: {parent} is not a writable directory; choose another path")


def check_new_file(path: str | os.PathLike[str], flag: str, *, replace: bool, replace_flag: str) -> None:
    """``check_output_path`` for a file, and an existing one (a dangling symlink too) refused in one line
    naming ``replace_flag`` unless ``replace``: no command replaces a file it was not told to. The write
    itself then claims the path (``atomic_path(path, replace=replace)``), so a file that appears meanwhile
    is not replaced either."""
    check_output_path(path, flag)
    if os.path.lexists(path) and not replace:
        raise SacEdgeError(f"{flag} {path} already exists; choose another path or pass {replace_flag}")


def fsync_dir(path: Path) -> None:
    """Flush a directory entry so a completed rename survives power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


LEFTOVER_SUFFIXES = (".tmp", ".partial", ".old")
_AT_FDCWD, _RENAME_NOREPLACE = -100, 1


def _renameat2(src: Path, dst: Path) -> bool:
    """``renameat2(src, dst, RENAME_NOREPLACE)``; False where the libc or filesystem lacks it."""
    func = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if func is None:
        return False
    if func(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(dst))


def rename_noreplace(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst`` unless ``dst`` exists in any form (a dangling symlink too): FileExistsError.

    One kernel operation (``renameat2`` with ``RENAME_NOREPLACE``); where the filesystem lacks it, a file is
    claimed by ``link`` (which never replaces nor follows) and a directory by ``rename``, which fails onto
    anything but an empty directory."""
    if _renameat2(src, dst):
        return
    if src.is_dir() and not src.is_symlink():
        if os.path.lexists(dst) and not (dst.is_dir() and not dst.is_symlink() and not any(dst.iterdir())):
            raise FileExistsError(errno.EEXIST, "exists", str(dst))
        try:
            os.rename(src, dst)
        except OSError as err:
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise FileExistsError(errno.EEXIST, "exists", str(dst)) from None
            raise
        return
    os.link(src, dst, follow_symlinks=False)
    os.unlink(src)


def _taken(final: Path) -> SacEdgeError:
    return SacEdgeError(
        f"{final} was written by another writer while this one ran; it was left as it is and this output was "
        "discarded: choose another path, or run again to replace it"
    )


def remove_stale(final: Path) -> list[Path]:
    """Remove the temp files and staging dirs that writers of ``final`` left when killed (their pid is gone);
    returns what was removed."""
    prefix = f".{final.name}."
    removed = []
    for leftover in final.parent.glob(f".{glob.escape(final.name)}.*"):
        pid = leftover.name[len(prefix) :].split(".", 1)[0]
        if leftover.suffix not in LEFTOVER_SUFFIXES or not pid.isdigit() or _alive(int(pid)):
            continue
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
        removed.append(leftover)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, replace: bool = True) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it replaces ``path`` atomically, on failure it is
    removed and ``path`` is untouched. For writers that want a filename (np.save, safetensors). With
    ``replace=False`` the temp file claims ``path`` only if nothing is there (else one SacEdgeError line)."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(final)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.{os.getpid()}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        if replace:
            os.replace(tmp, final)
        else:
            try:
                rename_noreplace(tmp, final)
            except FileExistsError:
                raise _taken(final) from None
        fsync_dir(final.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, replace: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (``replace=False``: only if nothing is there, as ``atomic_path``)."""
    with atomic_path(path, replace=replace) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, replace: bool = True) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"), replace=replace)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, replace: bool = True) -> None:
    """Write ``obj`` as indented strict JSON atomically (a missing figure is null)."""
    atomic_write_text(path, strict_json(obj, indent=2, sort_keys=True) + "\n", replace=replace)


def _identity(path: Path) -> tuple[int, int] | None:
    """``path``'s device and inode (not followed), or None when nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str], *, replace: bool = False) -> Iterator[Path]:
    """Build a directory in a hidden sibling and move it into place only when complete.

    With ``replace`` an existing directory is swapped out (renamed aside, then deleted) only after the
    new one is complete, so an interrupted write leaves the old one in place; only the directory that was
    there when the write began is ever replaced. Whatever another writer put at ``path`` meanwhile is left
    as it is, and this write fails with one SacEdgeError line.
    """
    final = Path(path)
    if final.exists() and not replace:
        raise FileExistsError(final)
    seen = _identity(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(final)
    staging = final.parent / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial"
    staging.mkdir()
    try:
        yield staging
        for child in staging.rglob("*"):
            if child.is_file():
                with open(child, "rb") as fh:
                    os.fsync(fh.fileno())
        old = None
        if seen is not None and replace:
            old = final.parent / f".{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.old"
            with contextlib.suppress(FileNotFoundError):
                os.rename(final, old)
            if _identity(old) != seen:  # not the directory this write was asked to replace: put it back
                if os.path.lexists(old):
                    rename_noreplace(old, final)
                raise _taken(final)
        try:
            rename_noreplace(staging, final)
        except FileExistsError:
            if old is not None:  # the one this write was asked to replace: gone either way
                shutil.rmtree(old, ignore_errors=True)
            raise _taken(final) from None
        fsync_dir(final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
