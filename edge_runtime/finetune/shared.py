"""Named numpy arrays in one ``multiprocessing.shared_memory`` block, for the learner process.

The main process creates a block from a *layout* (name, dtype, shape per array, in order) and passes the
block's name and the layout to the learner process as JSON; the child attaches with the same layout and
both see the same numpy views. Nothing is pickled: arrays cross by memory, small facts by JSON. The
creator unlinks the block (``unlink``); mappings go with the views and the processes.

A created block has every page reserved (``posix_fallocate``) before any view exists: ``shm_open`` and
``ftruncate`` reserve nothing, so on a full ``/dev/shm`` (Fast DDS keeps its transport there; Docker gives
64 MiB) the first store into an untouched page would raise SIGBUS and kill the process with no line. Reserved,
a full ``/dev/shm`` is an ``OSError`` at creation (a one-line refusal) and can no longer hurt a running loop.
``check_shm_space`` refuses up front, before the learner process starts, when the blocks cannot fit.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping, Sequence
from multiprocessing import shared_memory
from typing import Any, Tuple

import numpy as np

from sac_edge.common.errors import SacEdgeError

# typing's aliases: on the device's Python 3.8, tuple and collections.abc.Sequence cannot be subscripted
Layout = typing.Sequence[Tuple[str, str, Tuple[int, ...]]]

ALIGN = 64  # a cache line, so the control thread's rows and the counters do not share lines needlessly
SHM_DIR = "/dev/shm"  # where Linux's shm_open keeps its blocks
SHM_FIX = "free space there or give it more (docker run --shm-size=..., or mount -o remount,size=... /dev/shm)"
MIB = 1 << 20


def _offsets(layout: Layout) -> tuple[list[int], int]:
    offsets, size = [], 0
    for _, dtype, shape in layout:
        offsets.append(size)
        size += -(-int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize // ALIGN) * ALIGN
    return offsets, max(size, ALIGN)


def block_bytes(layout: Layout) -> int:
    """Bytes a block for ``layout`` reserves in ``/dev/shm`` (whole pages)."""
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    return -(-_offsets(layout)[1] // page) * page


def check_shm_space(need: int, what: str, root: str = SHM_DIR) -> None:
    """Refuse in one line when ``root`` (a tmpfs) has less than ``need`` bytes free for ``what``."""
    try:
        st = os.statvfs(root)
    except OSError:  # no /dev/shm (not Linux): creation itself reserves and refuses
        return
    free = st.f_bavail * st.f_frsize
    if free < need:
        raise SacEdgeError(
            f"{root} has {free / MIB:.2f} MiB free, {what} needs {need / MIB:.2f} MiB of shared memory; {SHM_FIX}"
        )


def _reserve(shm: shared_memory.SharedMemory, size: int) -> None:
    """Give every page of a new block its memory now (ENOSPC here, not SIGBUS at the first store later)."""
    fd = getattr(shm, "_fd", -1)  # POSIX only; Windows' named memory is backed by the page file at creation
    if fd < 0:
        return
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        else:  # macOS: writes allocate pages (and fail with ENOSPC), stores into a mapping do not
            zeros = bytes(MIB)
            for start in range(0, size, MIB):
                os.pwrite(fd, zeros[: min(MIB, size - start)], start)
    except OSError as err:
        raise SacEdgeError(
            f"{SHM_DIR}: cannot reserve {size / MIB:.1f} MiB of shared memory for the learner ({err.strerror}); "
            f"{SHM_FIX}"
        ) from None


def layout_of(arrays: Mapping[str, np.ndarray]) -> list[tuple[str, str, tuple[int, ...]]]:
    """The layout of ``arrays`` (in their order), e.g. learner tensors that will be copied in."""
    return [(name, np.asarray(a).dtype.str, tuple(int(n) for n in np.shape(a))) for name, a in arrays.items()]


class SharedArrays:
    """A layout's arrays over one shared-memory block: created when ``name`` is None, else attached."""

    def __init__(self, layout: Layout, name: str | None = None) -> None:
        self.layout = [(str(n), str(d), tuple(int(x) for x in s)) for n, d, s in layout]
        offsets, size = _offsets(self.layout)
        self.created = name is None
        self.shm = shared_memory.SharedMemory(name=name, create=self.created, size=size)
        self.name = self.shm.name
        if self.created:
            try:
                _reserve(self.shm, size)
            except BaseException:
                self.shm.close()
                self.shm.unlink()
                raise
        self.arrays: dict[str, np.ndarray] = {
            n: np.ndarray(shape, np.dtype(dtype), buffer=self.shm.buf, offset=offsets[i])
            for i, (n, dtype, shape) in enumerate(self.layout)
        }

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def describe(self) -> dict[str, Any]:
        """What the other process needs to attach (JSON-ready)."""
        return {"name": self.name, "layout": [[n, d, list(s)] for n, d, s in self.layout]}

    @classmethod
    def attach(cls, described: Mapping[str, Any]) -> SharedArrays:
        """Attach to a block ``describe`` described."""
        return cls([(n, d, tuple(s)) for n, d, s in described["layout"]], str(described["name"]))

    def write(self, values: Mapping[str, np.ndarray]) -> None:
        """Copy ``values`` into the arrays of the same names."""
        for name, value in values.items():
            self.arrays[name][...] = value

    def copy(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Copies of the named arrays (they stay valid after the block is reused or closed)."""
        return {name: self.arrays[name].copy() for name in names}

    def unlink(self) -> None:
        """Remove the block's name from the system (the creator's job). This process's mapping stays until
        the views and the block are garbage: objects that still hold views (the staging ring, the counters)
        stay readable after the learner process is gone."""
        self.shm.unlink()
