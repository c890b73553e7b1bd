"""An exclusive lock file that names its owner and cannot go stale.

``pid_lock(path, what)`` takes ``fcntl.flock`` on ``path`` and writes the owner's pid into it. The kernel
drops the lock when the owner exits, however it dies (kill -9, power loss), so a lock left by a dead
process is recovered by simply taking it again; a live owner makes the second taker fail at once with one
line naming the pid. The lock file is opened without following a symlink and only as a regular file: a
directory copied from elsewhere could otherwise make the pid write truncate any file the process can write.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from .bounded import open_regular
from .errors import SacEdgeError


@contextlib.contextmanager
def pid_lock(path: Path, what: str) -> Iterator[None]:
    """Hold ``path`` exclusively for the ``with`` block; ``what`` names the guarded thing in the error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fix = "remove it (sac-edge creates the lock file itself)"
    fd = open_regular(path, "lock file", fix, follow=False, flags=os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            raise SacEdgeError(
                f"{what} is in use by process {owner} (lock {path}); stop that process first or use another directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, its pid is overwritten by the next owner
