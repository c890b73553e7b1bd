"""A model of ``pycuda.driver`` for the runner's pycuda path (JetPack 5's): the real pycuda builds here
(``scripts/cuda_surface.py``) but cannot run without a GPU, so its behaviour is modelled and its names are
checked against the real module's surface (``tests/trt_surfaces/pycuda-*.json``; ``test_cuda_surfaces.py``).

What is modelled is what the product depends on, as pycuda's own source has it (``src/cpp/cuda.hpp``,
``pycuda/driver.py``): ``init``, ``Device(n).retain_primary_context()``, ``Context.push`` and the static
``Context.pop``, and a context stack per thread that must be empty when its thread ends or the interpreter
exits (pycuda's ``context_stack`` destructor prints "The context stack was not empty upon module cleanup"
and aborts the process; here the thread is recorded in ``fake.aborts``). Streams, allocations, copies and
frees need a current context (pycuda raises ``LogicError``). Copies move real bytes between host arrays
and device buffers kept here; an async copy from or to memory that ``pagelocked_empty`` did not allocate
is recorded in ``fake.pageable_copies`` (CUDA runs it synchronously). ``FakePyCuda(no_device=message)``
is a driver that sees no GPU: ``init()`` raises pycuda's ``RuntimeError`` with the real one's message.
"""

from __future__ import annotations

import builtins
import itertools
import sys
import threading
import types
from typing import Any

import numpy as np
import pytest


class FakePyCuda:
    """One fake ``pycuda``: module objects to install and the state a test asserts on."""

    def __init__(self, no_device: str | None = None) -> None:
        self.no_device = no_device  # pycuda's init() message where the driver sees no GPU, else a device
        self.aborts: list[str] = []  # threads that ended with a context still pushed
        self.pageable_copies: list[str] = []
        self.device: dict[int, bytearray] = {}  # live device allocations by address
        self._pinned: list[np.ndarray] = []
        self._local = threading.local()
        self._addresses = itertools.count(0x10000, 0x1000)
        self.driver = self._driver()
        self.package = types.ModuleType("pycuda")
        self.package.driver = self.driver  # type: ignore[attr-defined]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(sys.modules, "pycuda", self.package)
        monkeypatch.setitem(sys.modules, "pycuda.driver", self.driver)

    def stack(self) -> list[Any]:
        """This thread's context stack (pycuda keeps one per thread)."""
        holder = getattr(self._local, "holder", None)
        if holder is None:
            holder = self._local.holder = _Stack(self, threading.current_thread().name)
        return holder.items

    def _require_context(self, what: str) -> None:
        if not self.stack():
            raise self.driver.LogicError(f"{what} failed: invalid device context - no currently active context?")

    def _is_pinned(self, array: np.ndarray) -> bool:
        start = array.__array_interface__["data"][0]
        for block in self._pinned:
            base = block.__array_interface__["data"][0]
            if base <= start and start + array.nbytes <= base + block.nbytes:
                return True
        return False

    def _driver(self) -> types.ModuleType:
        fake = self
        driver = types.ModuleType("pycuda.driver")

        class Error(Exception):
            pass

        class LogicError(Error):
            pass

        class RuntimeError(Error):
            pass

        class Context:
            def push(self) -> None:
                fake.stack().append(self)

            @staticmethod
            def pop() -> None:
                if not fake.stack():
                    raise LogicError("cannot pop non-current context")
                fake.stack().pop()

        class Device:
            def __init__(self, index: int) -> None:
                if not getattr(fake, "initialised", False):
                    raise LogicError("cuInit has not been called")
                self.index = index

            def retain_primary_context(self) -> Context:
                return Context()

        class Stream:
            def __init__(self) -> None:
                fake._require_context("cuStreamCreate")
                self._handle = next(fake._addresses)

            @property
            def handle(self) -> int:
                return self._handle

            def synchronize(self) -> None:
                fake._require_context("cuStreamSynchronize")

        class DeviceAllocation:
            def __init__(self, *args: Any) -> None:  # pycuda's has no constructor: mem_alloc makes them
                raise builtins.RuntimeError("This class cannot be instantiated from Python")

            @classmethod
            def _allocate(cls, nbytes: int) -> DeviceAllocation:
                fake._require_context("cuMemAlloc")
                self = object.__new__(cls)
                self._address = next(fake._addresses)
                fake.device[self._address] = bytearray(nbytes)
                return self

            def __int__(self) -> int:
                return self._address

            def free(self) -> None:
                fake._require_context("cuMemFree")
                del fake.device[self._address]

        def init() -> None:
            if fake.no_device is not None:
                raise RuntimeError(fake.no_device)
            fake.initialised = True  # type: ignore[attr-defined]

        def pagelocked_empty(shape: Any, dtype: Any) -> np.ndarray:
            fake._require_context("cuMemHostAlloc")
            out = np.empty(shape, dtype)
            fake._pinned.append(out)
            return out

        def memcpy_htod_async(dst: int, src: np.ndarray, stream: Stream) -> None:
            fake._require_context("cuMemcpyHtoDAsync")
            if not fake._is_pinned(src):
                fake.pageable_copies.append("htod")
            fake.device[int(dst)][: src.nbytes] = np.ascontiguousarray(src).tobytes()

        def memcpy_dtoh_async(dst: np.ndarray, src: int, stream: Stream) -> None:
            fake._require_context("cuMemcpyDtoHAsync")
            if not fake._is_pinned(dst):
                fake.pageable_copies.append("dtoh")
            dst.view(np.uint8).reshape(-1)[:] = np.frombuffer(bytes(fake.device[int(src)][: dst.nbytes]), np.uint8)

        def mem_alloc(nbytes: int) -> DeviceAllocation:
            return DeviceAllocation._allocate(nbytes)

        for name, value in dict(locals()).items():
            if name not in ("self", "fake", "driver"):
                setattr(driver, name, value)
        return driver


class _Stack:
    """A thread's context stack; like pycuda's, it objects when its thread ends with contexts on it."""

    def __init__(self, fake: FakePyCuda, thread: str) -> None:
        self.fake, self.thread, self.items = fake, thread, []  # type: ignore[var-annotated]

    def __del__(self) -> None:
        if self.items:
            self.fake.aborts.append(self.thread)


def fake_runner(version: str, monkeypatch: pytest.MonkeyPatch) -> tuple[types.ModuleType, list[str], FakePyCuda]:
    """The TensorRT runner module on ``version``'s fake ``tensorrt`` and this fake pycuda, a device present;
    the backend is built directly, not through the registry that gates it (no engine computes).
    Returns the runner module, the names used and the pycuda."""
    from fake_tensorrt import fake_tensorrt

    from sac_edge.common.trt import builder
    from sac_edge.edge_runtime.backends.trt import runner
    from sac_edge.edge_runtime.backends.trt.cuda import PyCuda

    trt, used = fake_tensorrt(version)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(builder, "_probe_cuda", lambda index=0: builder.CudaDevice("Xavier", "7.2"))
    pycuda = FakePyCuda()
    pycuda.install(monkeypatch)
    monkeypatch.setattr(runner, "open_cuda", PyCuda)
    return runner, used, pycuda
