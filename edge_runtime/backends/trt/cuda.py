"""CUDA memory, streams and context for the TensorRT runner, through cuda-python or pycuda.

One context strategy for both: the device's *primary* context, made current on whichever thread touches
CUDA or TensorRT (the control thread's ``act``, the learner thread's weight swap, a benchmark thread).
Every such entry point runs inside ``with cuda.current():``:

- cuda-python (``cuda.bindings.runtime`` from 11.8.6 and 12.6; before them only ``cuda.cudart``, which
  they deprecate and 13 removes): the runtime API
  binds the primary context of the current device on first use in a thread; ``current`` makes that
  explicit with a checked ``cudaSetDevice`` (once per thread; nothing to undo).
- pycuda (JetPack 5's samples): ``pycuda.autoinit`` is *not* used, since it makes a non-primary context
  current on the importing thread only, and a weight swap on the learner thread would run with no context;
  instead the primary context is retained once, pushed when a thread enters ``current`` and popped when it
  leaves (nested entries push once). pycuda aborts the process when a thread's context stack is not empty
  as the thread or the interpreter ends (``context_stack``'s destructor in its ``cuda.hpp``), so no push
  may outlive the call that made it, ``close`` included.

Versions (edge-facts.md; cuda-python's release notes): cuda-python's major version follows the CUDA
toolkit's, so a CUDA 12 driver (JetPack 6) needs cuda-python < 13; ``open_cuda`` checks the installed
major against the driver's, before any device call (which a runtime newer than the driver refuses), and
says which to install. Stream handles are read with ``cuda.bindings.utils.get_cuda_native_handle`` where
it exists (12.9.1 and 13 deprecate ``int(cudaStream_t)``).
Every call's status is checked and a failure is one ``SacEdgeError`` line.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.versions import installed_version, parse_version

from ..base import missing_package

# cuda-python's runtime module, newest layout first: cuda.cudart is deprecated from 12.6 and gone in 13.
RUNTIME_MODULES = ("cuda.bindings.runtime", "cuda.cudart")


def _runtime_module() -> Any | None:
    """cuda-python's runtime bindings (new layout first), or None when cuda-python is not installed."""
    for name in RUNTIME_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return importlib.import_module(name)
        except (ImportError, ValueError):  # a bare "cuda" namespace package from another distribution
            continue
    return None


def check_cuda_python(installed: str | None, driver_cuda: int) -> str | None:
    """Why cuda-python ``installed`` cannot drive a CUDA ``driver_cuda`` driver (e.g. 12060), else None;
    from 12.9 cuda-python reports version 0 where no driver is installed."""
    if driver_cuda <= 0:
        return (
            "cuda-python finds no CUDA driver (version 0); check the NVIDIA driver with nvidia-smi or tegrastats, "
            "or use --backend onnxruntime"
        )
    if installed is None:
        return None
    major, driver_major = parse_version(installed, "cuda-python")[0], driver_cuda // 1000
    if major > driver_major:
        return (
            f"cuda-python {installed} needs a CUDA {major} driver, this device's driver is CUDA {driver_major}; "
            f"pip install 'cuda-python<{driver_major + 1}'"
        )
    return None


class CudaPython:
    """CUDA runtime calls through cuda-python, on the primary context of ``device``."""

    def __init__(self, rt: Any, device: int = 0) -> None:
        self.rt, self.device = rt, device
        self._local = threading.local()
        # The driver's version before any device call: a runtime newer than the driver fails cudaSetDevice
        # with cudaErrorInsufficientDriver, which would hide the advice on which cuda-python to install.
        driver = int(self._check(rt.cudaDriverGetVersion(), "get the driver version"))
        reason = check_cuda_python(installed_version("cuda-bindings", "cuda-python"), driver)
        if reason is not None:
            raise SacEdgeError(reason)
        self._select()
        self._stream = self._check(rt.cudaStreamCreate(), "create a stream")
        self.stream = _handle(self._stream)
        self._owned: list[tuple[str, int]] = []

    def _check(self, result: Any, what: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.rt.cudaError_t.cudaSuccess:
            raise SacEdgeError(f"CUDA could not {what}: {err} (check the device with nvidia-smi or tegrastats)")
        return rest[0] if len(rest) == 1 else rest

    def _select(self) -> None:
        if not getattr(self._local, "ready", False):
            self._check(self.rt.cudaSetDevice(self.device), f"select CUDA device {self.device}")
            self._local.ready = True

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """The device's primary context current on this thread for the block (selected once per thread)."""
        self._select()
        yield

    def device_alloc(self, nbytes: int) -> int:
        ptr = int(self._check(self.rt.cudaMalloc(nbytes), f"allocate {nbytes} bytes of device memory"))
        self._owned.append(("device", ptr))
        return ptr

    def pinned(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        ptr = int(self._check(self.rt.cudaMallocHost(nbytes), f"allocate {nbytes} bytes of pinned memory"))
        self._owned.append(("host", ptr))
        raw = (ctypes.c_byte * nbytes).from_address(ptr)
        return np.frombuffer(raw, dtype=dtype).reshape(shape)

    def htod(self, dst: int, src: np.ndarray) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self.rt.cudaMemcpyAsync(dst, src.ctypes.data, src.nbytes, kind, self._stream), "copy to the device")

    def dtoh(self, dst: np.ndarray, src: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self.rt.cudaMemcpyAsync(dst.ctypes.data, src, dst.nbytes, kind, self._stream), "copy to the host")

    def sync(self) -> None:
        self._check(self.rt.cudaStreamSynchronize(self._stream), "finish the stream")

    def close(self) -> None:
        self._select()
        for where, ptr in reversed(self._owned):
            self._check(self.rt.cudaFreeHost(ptr) if where == "host" else self.rt.cudaFree(ptr), "free memory")
        self._owned.clear()
        self._check(self.rt.cudaStreamDestroy(self._stream), "destroy the stream")


class PyCuda:
    """The same calls through pycuda, on the retained primary context, pushed and popped around each use."""

    def __init__(self, device: int = 0) -> None:
        import pycuda.driver as cuda

        self.cuda = cuda
        self._local = threading.local()
        try:
            cuda.init()
            self._context = cuda.Device(device).retain_primary_context()
        except cuda.Error as err:
            raise SacEdgeError(f"pycuda cannot open CUDA device {device}: {err}") from None
        self._owned: list[Any] = []
        with self.current():
            self._stream = cuda.Stream()
        self.stream = int(self._stream.handle)

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """The primary context pushed on this thread for the block and popped after it (once when nested)."""
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            self._guard(self._context.push, "make the CUDA context current")
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                self._guard(self.cuda.Context.pop, "release the CUDA context")

    def device_alloc(self, nbytes: int) -> int:
        mem = self._guard(lambda: self.cuda.mem_alloc(nbytes), f"allocate {nbytes} bytes of device memory")
        self._owned.append(mem)
        return int(mem)

    def pinned(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        out: np.ndarray = self._guard(lambda: self.cuda.pagelocked_empty(shape, dtype), "allocate pinned memory")
        return out

    def htod(self, dst: int, src: np.ndarray) -> None:
        self._guard(lambda: self.cuda.memcpy_htod_async(dst, src, self._stream), "copy to the device")

    def dtoh(self, dst: np.ndarray, src: int) -> None:
        self._guard(lambda: self.cuda.memcpy_dtoh_async(dst, src, self._stream), "copy to the host")

    def sync(self) -> None:
        self._guard(self._stream.synchronize, "finish the stream")

    def _guard(self, call: Any, what: str) -> Any:
        try:
            return call()
        except self.cuda.Error as err:
            raise SacEdgeError(f"CUDA could not {what}: {err}") from None

    def close(self) -> None:
        with self.current():
            for mem in self._owned:
                mem.free()
            self._owned.clear()
            self._stream = None


def _handle(stream: Any) -> int:
    """The stream's address as an int (``get_cuda_native_handle`` from cuda-bindings 12.9/13, else int())."""
    try:
        from cuda.bindings.utils import get_cuda_native_handle
    except ImportError:
        return int(stream)
    return int(get_cuda_native_handle(stream))


def open_cuda() -> CudaPython | PyCuda:
    """cuda-python when its runtime bindings import, else pycuda; a one-line error naming what to install."""
    rt = _runtime_module()
    if rt is not None:
        try:
            return CudaPython(rt)
        except RuntimeError as err:  # cuda-python 11.8/12.2 raise it, not an error code, where libcuda is missing
            raise SacEdgeError(
                f"cuda-python cannot reach the CUDA driver ({err}); check the NVIDIA driver with nvidia-smi or "
                "tegrastats, or use --backend onnxruntime"
            ) from None
    if importlib.util.find_spec("pycuda") is not None:
        return PyCuda()
    raise missing_package(
        "tensorrt", "cuda-python", "pip install 'cuda-python<13' on CUDA 12 (JetPack 6), or pycuda on JetPack 5"
    )
