"""CUDA memory and streams for the TensorRT runner, through cuda-python or pycuda.

cuda-python is what TensorRT 10's samples use (``samples/python/common_runtime.py``); pycuda is what
JetPack 5's samples use, so it is taken where cuda-python is absent.
"""

from __future__ import annotations

import ctypes
import importlib.util
from typing import Any

import numpy as np

from sac_edge.common.errors import SacEdgeError

from ..base import missing_package


class CudaPython:
    """CUDA runtime calls through cuda-python (``cuda.bindings.runtime``, or ``cuda.cudart`` before 12.6)."""

    def __init__(self) -> None:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart
        self.rt = cudart
        self.stream = int(self._check(cudart.cudaStreamCreate()))
        self._owned: list[tuple[str, int]] = []

    def _check(self, result: Any) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.rt.cudaError_t.cudaSuccess:
            raise SacEdgeError(f"CUDA runtime error {err}")
        return rest[0] if len(rest) == 1 else rest

    def device_alloc(self, nbytes: int) -> int:
        ptr = int(self._check(self.rt.cudaMalloc(nbytes)))
        self._owned.append(("device", ptr))
        return ptr

    def pinned(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        ptr = int(self._check(self.rt.cudaMallocHost(nbytes)))
        self._owned.append(("host", ptr))
        raw = (ctypes.c_byte * nbytes).from_address(ptr)
        return np.frombuffer(raw, dtype=dtype).reshape(shape)

    def htod(self, dst: int, src: np.ndarray) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self.rt.cudaMemcpyAsync(dst, src.ctypes.data, src.nbytes, kind, self.stream))

    def dtoh(self, dst: np.ndarray, src: int) -> None:
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self.rt.cudaMemcpyAsync(dst.ctypes.data, src, dst.nbytes, kind, self.stream))

    def sync(self) -> None:
        self._check(self.rt.cudaStreamSynchronize(self.stream))

    def close(self) -> None:
        for where, ptr in reversed(self._owned):
            self.rt.cudaFreeHost(ptr) if where == "host" else self.rt.cudaFree(ptr)
        self._owned.clear()
        self.rt.cudaStreamDestroy(self.stream)


class PyCuda:
    """The same calls through pycuda (``pycuda.autoinit`` makes the context), as on JetPack 5."""

    def __init__(self) -> None:
        import pycuda.autoinit  # noqa: F401 - creates and pushes the CUDA context
        import pycuda.driver as cuda

        self.cuda = cuda
        self._stream = cuda.Stream()
        self.stream = int(self._stream.handle)
        self._owned: list[Any] = []

    def device_alloc(self, nbytes: int) -> int:
        mem = self.cuda.mem_alloc(nbytes)
        self._owned.append(mem)
        return int(mem)

    def pinned(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return self.cuda.pagelocked_empty(shape, dtype)

    def htod(self, dst: int, src: np.ndarray) -> None:
        self.cuda.memcpy_htod_async(dst, src, self._stream)

    def dtoh(self, dst: np.ndarray, src: int) -> None:
        self.cuda.memcpy_dtoh_async(dst, src, self._stream)

    def sync(self) -> None:
        self._stream.synchronize()

    def close(self) -> None:
        for mem in self._owned:
            mem.free()
        self._owned.clear()


def open_cuda() -> CudaPython | PyCuda:
    if importlib.util.find_spec("cuda") is not None:
        return CudaPython()
    if importlib.util.find_spec("pycuda") is not None:
        return PyCuda()
    raise missing_package("tensorrt", "cuda-python", "pip install cuda-python, or pycuda on JetPack 5")
