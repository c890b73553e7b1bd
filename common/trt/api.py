"""The TensorRT Python API pieces every generation shares: importing it, its logger, creating its top-level
objects, and numpy types for its tensor types.

Checked against the real modules (8.5.3.1, 10.3.0, 10.13.3.9, 11.4.0.106; ``tests/trt_surfaces/``):

- ``trt.Builder``, ``trt.Runtime``, ``trt.OnnxParser`` and ``trt.Refitter`` are pybind11 factory
  constructors: when TensorRT cannot create the object (no usable CUDA device, a driver too old) they raise
  ``TypeError: pybind11::init(): factory function returned nullptr`` and never return None. TensorRT says
  why only through its logger, at WARNING ("CUDA initialization failure with error: 35"), so the logger
  keeps warnings and ``create`` puts the last one in a one-line error.
- An ``ILogger`` subclass receives every message TensorRT emits, VERBOSE ones included (a build logs
  thousands); ``log`` drops those below the floor first, before anything else is done with them.
- TensorRT 8.5's ``trt.nptype`` builds its table with ``np.bool``, which numpy 1.24 removed, so it raises
  AttributeError on JetPack 5 with any numpy this project supports (NVIDIA/TensorRT#2557, fixed in 8.6);
  ``numpy_type`` is this project's own map from ``DataType`` names.
- A ``tensorrt`` package that is installed but whose libraries are missing (``libnvinfer.so.N``) fails at
  import with ImportError (or OSError from a loader); ``import_problem`` turns that into one line.

Nothing here imports tensorrt at module import time.
"""

from __future__ import annotations

import collections
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import SacEdgeError

# TensorRT DataType name -> numpy dtype; types numpy lacks (BF16, FP8, INT4, FP4, E8M0) have no entry.
NUMPY_TYPES = {
    "FLOAT": np.dtype(np.float32),
    "HALF": np.dtype(np.float16),
    "INT8": np.dtype(np.int8),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
}
SEVERITIES = ("INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE")  # ILogger.Severity, most severe first
DEFAULT_FLOOR = "WARNING"
NO_DEVICE_FIX = "check the GPU with nvidia-smi or tegrastats, or use --backend onnxruntime"
KEPT_MESSAGES = 32


def numpy_type(dtype: Any) -> np.dtype[Any]:
    """The numpy dtype of a TensorRT ``DataType`` (by name: the enum's values differ between generations)."""
    name = str(getattr(dtype, "name", dtype)).rsplit(".", 1)[-1]
    try:
        return NUMPY_TYPES[name]
    except KeyError:
        raise SacEdgeError(
            f"the engine has a {name} tensor, which numpy cannot hold; rebuild it from the bundle's fp32, fp16 or "
            "int8 graph"
        ) from None


def import_problem() -> str | None:
    """Why ``import tensorrt`` fails here (None when it imports)."""
    if importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt Python package is not installed"
    try:
        importlib.import_module("tensorrt")
    except (ImportError, OSError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return f"tensorrt is installed but does not import ({first}); install TensorRT's libraries with it"
    return None


def import_tensorrt() -> Any:
    """The tensorrt module, or a one-line SacEdgeError saying why it does not import."""
    problem = import_problem()
    if problem is not None:
        raise SacEdgeError(problem)
    return importlib.import_module("tensorrt")


def make_logger(trt: Any, floor: str = DEFAULT_FLOOR) -> Any:
    """A ``trt.ILogger`` that keeps TensorRT's last messages at ``floor`` or more severe (``reason()``)."""
    severity = trt.ILogger.Severity
    limit = int(getattr(severity, floor))
    error, warning = int(severity.ERROR), int(severity.WARNING)

    class Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: collections.deque[tuple[int, str]] = collections.deque(maxlen=KEPT_MESSAGES)

        def log(self, level: Any, msg: str) -> None:
            value = int(level)
            if value > limit:  # less severe than the floor: nothing else is done with it
                return
            self.messages.append((value, str(msg).strip()))

        def reason(self) -> str:
            """TensorRT's last error, else its last warning, else its last kept message."""
            for most in (error, warning, limit):
                found = [msg for value, msg in self.messages if value <= most and msg]
                if found:
                    return " ".join(found[-1].split())
            return "TensorRT gave no reason"

    return Logger()


def reason(logger: Any) -> str:
    """``logger.reason()`` for a logger from ``make_logger``; a fixed note for any other."""
    get = getattr(logger, "reason", None)
    return str(get()) if callable(get) else "TensorRT gave no reason"


def create(factory: Callable[..., Any], *args: Any, logger: Any, what: str, fix: str = NO_DEVICE_FIX) -> Any:
    """``factory(*args)`` (``trt.Builder``, ``trt.Runtime``, ...), or one SacEdgeError line with TensorRT's
    reason and ``fix`` where it cannot create the object (a nullptr factory result, or None)."""
    try:
        made = factory(*args)
    except TypeError as err:
        if "nullptr" not in str(err):
            raise
        made = None
    if made is None:
        raise SacEdgeError(f"TensorRT could not {what}: {reason(logger)}; {fix}")
    return made
