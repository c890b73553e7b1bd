"""Named numpy arrays in one ``multiprocessing.shared_memory`` block, for the learner process.

The main process creates a block from a *layout* (name, dtype, shape per array, in order) and passes the
block's name and the layout to the learner process as JSON; the child attaches with the same layout and
both see the same numpy views. Nothing is pickled: arrays cross by memory, small facts by JSON. The
creator unlinks the block (``unlink``); mappings go with the views and the processes.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from multiprocessing import shared_memory
from typing import Any, Tuple

import numpy as np

# typing's aliases: on the device's Python 3.8, tuple and collections.abc.Sequence cannot be subscripted
Layout = typing.Sequence[Tuple[str, str, Tuple[int, ...]]]

ALIGN = 64  # a cache line, so the control thread's rows and the counters do not share lines needlessly


def layout_of(arrays: Mapping[str, np.ndarray]) -> list[tuple[str, str, tuple[int, ...]]]:
    """The layout of ``arrays`` (in their order), e.g. learner tensors that will be copied in."""
    return [(name, np.asarray(a).dtype.str, tuple(int(n) for n in np.shape(a))) for name, a in arrays.items()]


class SharedArrays:
    """A layout's arrays over one shared-memory block: created when ``name`` is None, else attached."""

    def __init__(self, layout: Layout, name: str | None = None) -> None:
        self.layout = [(str(n), str(d), tuple(int(x) for x in s)) for n, d, s in layout]
        offsets, size = [], 0
        for _, dtype, shape in self.layout:
            offsets.append(size)
            size += -(-int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize // ALIGN) * ALIGN
        self.created = name is None
        self.shm = shared_memory.SharedMemory(name=name, create=self.created, size=max(size, ALIGN))
        self.name = self.shm.name
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
