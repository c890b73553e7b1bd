"""Telemetry JSONL (one object per line: the config, one record per second, every governor event) and the
live status line.

The file is a log, written as the run goes and flushed per record so a crash keeps everything up to it;
it is not rewritten atomically like the other artifacts. A record the disk refuses (full, gone, read-only
after an error) is dropped and counted (``dropped``, in the summary), and the loop goes on: control
matters more than its log.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from sac_edge.common.bounded import open_regular
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.summary import strict_json


class TelemetryWriter:
    """Appends JSON records to ``path`` (or drops them when ``path`` is None)."""

    def __init__(self, path: str | Path | None, *, overwrite: bool = False) -> None:
        self.path = Path(path) if path else None
        self._fh: IO[str] | None = None
        self.records = 0
        self._size = 0  # bytes of whole records written
        self.dropped = 0
        """Records the disk refused."""
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # Never through a symlink, only a regular file, and an existing one only when asked to.
                flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
                fd = open_regular(
                    self.path, "telemetry file", "choose another --telemetry path", follow=False, flags=flags
                )
                self._fh = open(fd, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
            except OSError as err:
                raise SacEdgeError(f"cannot write telemetry to {self.path}: {err.strerror or err}") from None

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        data = (strict_json(record, sort_keys=True) + "\n").encode()
        fd = self._fh.fileno()
        try:  # one system call a record, past the file object's buffer: a refused record leaves nothing behind
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
        except OSError:  # ENOSPC, EFBIG, EIO: the record is lost, the run is not
            self.dropped += 1
            with contextlib.suppress(OSError):  # a partial line is cut off, so the file stays whole lines
                os.ftruncate(fd, self._size)
                os.lseek(fd, self._size, os.SEEK_SET)
            return
        self._size += len(data)
        self.records += 1

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            with contextlib.suppress(OSError):
                fh.close()

    def __enter__(self) -> TelemetryWriter:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class StatusLine:
    """A one-line status rewritten in place on stderr; only used when stderr is a terminal."""

    def __init__(self, stream: IO[str] = sys.stderr) -> None:
        self.stream = stream
        self._width = 0

    def __call__(self, text: str) -> None:
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        """Blank the line (before a log line is written; the next status rewrites it)."""
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0

    def finish(self) -> None:
        if self._width:
            self.stream.write("\n")
            self.stream.flush()
