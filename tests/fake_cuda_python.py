"""A stand-in cuda-python for one real release, built from its committed surface (``api_surface``).

The module layout is the release's: only the modules that imported when the surface was read are
importable (``cuda.cudart`` up to 12.x, ``cuda.bindings.runtime`` from 11.8.6/12.6, ``cuda.bindings.utils``
from 12.9), so the product's import choice runs as on that release. A runtime function the release lacks
raises AttributeError, a call whose argument count its signature does not take raises TypeError, and each
call returns as many values as its docstring says (``cudaError_t`` first), so ``_check``'s unpacking meets
the real shapes. Enums hold the release's members and values.

With a driver (``driver`` a CUDA version such as 12020), memory and copies are real: ``cudaMallocHost``
returns the address of host memory kept here, device memory is a ``bytearray`` per allocation, and
``cudaMemcpyAsync`` moves the bytes, so a round trip through the runner's buffers checks the pointers it
passes. A runtime newer than the driver answers device calls with ``cudaErrorInsufficientDriver`` (the
CUDA runtime's rule; ``cudaDriverGetVersion`` still answers). Without a driver (``driver=None``) each
call does what the real release did when the surface was read (11.8 and 12.2 raise ``RuntimeError``;
later releases return ``cudaErrorInsufficientDriver`` and report driver version 0).
"""

from __future__ import annotations

import ctypes
import enum
import importlib.machinery
import itertools
import sys
import types
from typing import Any

import pytest
from api_surface import CudaPythonSurface, arity, load_cuda_python

INSUFFICIENT_DRIVER = "cudaErrorInsufficientDriver"


class FakeStream:
    """A ``cudaStream_t``: ``int()`` gives its address, as the real one does."""

    def __init__(self, address: int) -> None:
        self.address = address

    def __int__(self) -> int:
        return self.address


class FakeCudaPython:
    """One release's modules (``install`` puts them in ``sys.modules``) and the state a test asserts on."""

    def __init__(self, version: str, driver: int | None) -> None:
        self.surface: CudaPythonSurface = load_cuda_python(version)
        self.driver = driver
        self.used: list[str] = []  # runtime names read, in order
        self.device: dict[int, bytearray] = {}
        self.host: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self.streams: set[int] = set()
        self._addresses = itertools.count(0x10000, 0x1000)
        self.modules = self._modules()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in [n for n in sys.modules if n == "cuda" or n.startswith("cuda.")]:
            monkeypatch.delitem(sys.modules, name)
        for name, module in self.modules.items():
            monkeypatch.setitem(sys.modules, name, module)

    def _modules(self) -> dict[str, types.ModuleType]:
        out = {"cuda": _package("cuda")}
        if any(self.surface.imports(n) for n in self.surface.modules if n.startswith("cuda.bindings.")):
            out["cuda.bindings"] = _package("cuda.bindings")
        for name, record in self.surface.modules.items():
            if not self.surface.imports(name):
                continue
            module = self._runtime(name) if "runtime" in record else _module(name)
            for fname in self.surface.utils() if name == "cuda.bindings.utils" else ():
                setattr(module, fname, self._checked(fname, f"{fname}{self.surface.utils()[fname]}", _native_handle))
            out[name] = module
        return out

    def _runtime(self, name: str) -> types.ModuleType:
        table = self.surface.runtime(name)
        enums = {k: enum.IntEnum(k, v) for k, v in table["enums"].items()}  # type: ignore[misc]
        fake = self

        class Runtime(types.ModuleType):
            def __getattr__(self, attr: str) -> Any:
                fake.used.append(attr)
                if attr in enums:
                    return enums[attr]
                if attr in table["classes"]:
                    return FakeStream if attr == "cudaStream_t" else type(attr, (), {})
                record = table["functions"].get(attr)
                if record is None:
                    raise AttributeError(
                        f"module {name!r} has no attribute {attr!r} in cuda-python {fake.surface.version}"
                    )
                return fake._checked(attr, record["signature"], fake._call(attr, record["returns"], enums))

        module = Runtime(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        return module

    def _checked(self, name: str, signature: str, call: Any) -> Any:
        taken = arity(signature, method=False)

        def function(*args: Any) -> Any:
            if not taken.least <= len(args) <= taken.most:
                raise TypeError(f"{signature} takes {taken.least} to {taken.most} arguments ({len(args)} given)")
            return call(*args)

        function.__name__ = name
        return function

    def _call(self, name: str, returns: list[str], enums: dict[str, Any]) -> Any:
        errors = enums["cudaError_t"]
        outs = len(returns) - 1

        def call(*args: Any) -> Any:
            if self.driver is None:
                return self._without_driver(name, errors, outs)
            if name != "cudaDriverGetVersion" and self.driver // 1000 < _major(self.surface.version):
                return (errors[INSUFFICIENT_DRIVER], *[None] * outs)
            values = self._with_driver(name, args, enums)
            if isinstance(values, enum.Enum):  # an error answer, no values
                return (values, *[None] * outs)
            assert len(values) == outs, f"{name} returns {outs} values in cuda-python {self.surface.version}"
            return (errors.cudaSuccess, *values)

        return call

    def _without_driver(self, name: str, errors: Any, outs: int) -> Any:
        for text, outcome in self.surface.probes:
            if text.startswith(f"{name}("):
                if "raises" in outcome:
                    kind, _, message = outcome["raises"].partition(": ")
                    raise {"RuntimeError": RuntimeError}[kind](message)
                first, *rest = outcome["returns"]
                return (errors[first], *[v if isinstance(v, int) else None for v in rest])
        raise AssertionError(f"{name} was not probed without a driver in cuda-python {self.surface.version}")

    def _with_driver(self, name: str, args: tuple[Any, ...], enums: dict[str, Any]) -> Any:
        invalid = enums["cudaError_t"].cudaErrorInvalidValue
        if name == "cudaDriverGetVersion":
            return (self.driver,)
        if name == "cudaMalloc":
            address = next(self._addresses)
            self.device[address] = bytearray(args[0])
            return (address,)
        if name == "cudaMallocHost":
            buffer = ctypes.create_string_buffer(args[0])
            self.host[ctypes.addressof(buffer)] = buffer
            return (ctypes.addressof(buffer),)
        if name == "cudaStreamCreate":
            stream = FakeStream(next(self._addresses))
            self.streams.add(stream.address)
            return (stream,)
        if name in ("cudaFree", "cudaFreeHost"):
            pool: dict[int, Any] = self.device if name == "cudaFree" else self.host
            return () if pool.pop(int(args[0]), None) is not None else invalid
        if name in ("cudaStreamSynchronize", "cudaStreamDestroy"):
            if int(args[0]) not in self.streams:
                return enums["cudaError_t"].cudaErrorInvalidResourceHandle
            if name == "cudaStreamDestroy":
                self.streams.discard(int(args[0]))
            return ()
        if name == "cudaMemcpyAsync":
            return self._copy(*args, kinds=enums["cudaMemcpyKind"], invalid=invalid)
        return ()

    def _copy(self, dst: int, src: int, count: int, kind: Any, stream: Any, kinds: Any, invalid: Any) -> Any:
        if not isinstance(kind, kinds) or int(stream) not in self.streams:
            return invalid
        if kind == kinds.cudaMemcpyHostToDevice and dst in self.device:
            self.device[dst][:count] = ctypes.string_at(src, count)
        elif kind == kinds.cudaMemcpyDeviceToHost and src in self.device:
            ctypes.memmove(dst, bytes(self.device[src][:count]), count)
        else:
            return invalid
        return ()


def _native_handle(obj: Any) -> int:
    return int(obj.address)


def _major(version: str) -> int:
    return int(version.split(".")[0])


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return module


def _package(name: str) -> types.ModuleType:
    """A package with nothing more to find: a submodule not installed here fails to import."""
    module = _module(name)
    module.__path__ = []  # type: ignore[attr-defined]
    module.__spec__.submodule_search_locations = []  # type: ignore[union-attr]
    return module
