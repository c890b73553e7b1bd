"""TensorRT engines from the bundle's ONNX, with the TensorRT Python API (8.5 on JetPack 5, and 10.x).

``sac-export`` calls ``build_engine`` when tensorrt and a CUDA device are present; the edge runtime calls
the same function on the device on first run (engines are specific to a GPU and a TensorRT version).
Every engine gets: an optimisation profile for batch 1..64 (opt 1, the control loop's batch), a workspace
limit, a timing cache loaded from and saved beside the plan, and the REFIT flag so on-device fine-tuning
can swap weights in place. INT8 is explicit Q/DQ (``policy.int8.onnx``) on TensorRT >= 10, where implicit
calibration is deprecated (10.1); on 8.x the fp32 graph plus ``calib.cache`` through an
``IInt8EntropyCalibrator2`` that only returns the cache (so TensorRT never asks for data).

API notes (TensorRT Python API docs; onnx-tensorrt): ``EXPLICIT_BATCH`` is required by the ONNX parser on
8.x and gone in 10; ``build_serialized_network`` returns None on failure; ``num_io_tensors`` and
``get_tensor_name`` exist from 8.5. Nothing here imports tensorrt at module import time.
"""

from __future__ import annotations

import ctypes
import importlib.util
import time
from pathlib import Path
from typing import Any, NamedTuple

from sac_edge.common.atomic import atomic_write_bytes
from sac_edge.common.errors import InternalError, SacEdgeError

PRECISIONS = ("fp32", "fp16", "int8")
TIMING_CACHE = "timing.cache"
DEFAULT_WORKSPACE = 512 << 20
# cuda.h CUdevice_attribute values (stable driver ABI)
_CC_MAJOR, _CC_MINOR = 75, 76


def plan_name(precision: str) -> str:
    """``policy.<precision>.plan``, the engine's file name in a bundle (DESIGN.md)."""
    return f"policy.{precision}.plan"


class CudaDevice(NamedTuple):
    name: str
    compute_capability: str  # "7.2" on Xavier NX


class EngineInfo(NamedTuple):
    """What was built, for the manifest: the device and TensorRT version make a plan valid or not."""

    plan: Path
    precision: str
    tensorrt_version: str
    device: str
    compute_capability: str
    flags: tuple[str, ...]
    int8_source: str | None  # "explicit Q/DQ" or "calib.cache"
    profile: dict[str, list[int]]  # input name -> min/opt/max batch
    workspace_bytes: int
    io_tensors: tuple[str, ...]
    plan_bytes: int
    build_s: float

    def to_dict(self) -> dict[str, Any]:
        out = self._asdict()
        out["plan"] = self.plan.name
        return out


def cuda_device(index: int = 0) -> CudaDevice | None:
    """The CUDA device through the driver API (libcuda, present wherever a GPU driver is, Jetson included),
    so no Python CUDA package is needed; None without a driver or device."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count, dev = ctypes.c_int(0), ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value <= index:
        return None
    if lib.cuDeviceGet(ctypes.byref(dev), index) != 0:
        return None
    name = ctypes.create_string_buffer(256)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    lib.cuDeviceGetName(name, len(name), dev)
    lib.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, dev)
    lib.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, dev)
    return CudaDevice(name.value.decode(errors="replace"), f"{major.value}.{minor.value}")


def tensorrt_unavailable() -> str | None:
    """Why engines cannot be built here (None when they can)."""
    if importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt Python package is not installed"
    try:
        import tensorrt  # noqa: F401
    except ImportError as err:
        return f"tensorrt does not import ({err})"
    if cuda_device() is None:
        return "no CUDA device (libcuda.so.1 reports none)"
    return None


def tensorrt_major() -> int:
    import tensorrt as trt

    return int(trt.__version__.split(".")[0])


def engine_inputs(bundle: Path, precision: str, trt_major: int) -> tuple[Path, Path | None]:
    """The ONNX (and calibration cache) an engine of ``precision`` is built from, for this TensorRT."""
    if precision != "int8":
        return bundle / "policy.onnx", None
    cache = bundle / "calib.cache"
    if trt_major >= 10 or not cache.is_file():
        return bundle / "policy.int8.onnx", None
    return bundle / "policy.onnx", cache


def build_engine(
    onnx_path: Path,
    plan_path: Path,
    precision: str,
    *,
    calib_cache: Path | None = None,
    batch: tuple[int, int, int] = (1, 1, 64),
    workspace_bytes: int = DEFAULT_WORKSPACE,
    timing_cache: Path | None = None,
) -> EngineInfo:
    """Build ``plan_path`` from ``onnx_path`` at ``precision`` (fp32|fp16|int8); batch = (min, opt, max).

    INT8 uses the graph's Q/DQ nodes, or ``calib_cache`` (implicit calibration, TensorRT 8.x) when given.
    The timing cache defaults to ``timing.cache`` beside the plan. A parse or build failure is an
    InternalError carrying TensorRT's own messages.
    """
    if precision not in PRECISIONS:
        raise SacEdgeError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    reason = tensorrt_unavailable()
    if reason is not None:
        raise SacEdgeError(f"cannot build a TensorRT engine: {reason}")
    import tensorrt as trt

    device = cuda_device()
    assert device is not None
    started = time.perf_counter()
    logger = _logger(trt)
    builder = trt.Builder(logger)
    major = int(trt.__version__.split(".")[0])
    network = builder.create_network(0 if major >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise InternalError(f"TensorRT cannot parse {onnx_path.name}: {errors or _last(logger)}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    profile = builder.create_optimization_profile()
    shapes: dict[str, list[int]] = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        features = tuple(tensor.shape)[1:]
        profile.set_shape(tensor.name, *[(b, *features) for b in batch])
        shapes[tensor.name] = list(batch)
    config.add_optimization_profile(profile)
    flags = ["REFIT"]
    config.set_flag(trt.BuilderFlag.REFIT)
    if precision == "fp16":
        flags.append("FP16")
        config.set_flag(trt.BuilderFlag.FP16)
    int8_source, calibrator = None, None  # the calibrator must outlive the build
    if precision == "int8":
        flags.append("INT8")
        config.set_flag(trt.BuilderFlag.INT8)
        if calib_cache is not None:
            calibrator = _cache_calibrator(trt, calib_cache.read_bytes())
            config.int8_calibrator = calibrator
            config.set_calibration_profile(profile)
            int8_source = "calib.cache"
        elif not _has_qdq(trt, network):
            raise SacEdgeError(f"{onnx_path.name} has no Q/DQ nodes; INT8 needs policy.int8.onnx or a calib.cache")
        else:
            int8_source = "explicit Q/DQ"
    cache_path = timing_cache or plan_path.with_name(TIMING_CACHE)
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
    config.set_timing_cache(cache, False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise InternalError(f"TensorRT could not build the {precision} engine: {_last(logger)}")
    plan = bytes(serialized)
    atomic_write_bytes(plan_path, plan)
    atomic_write_bytes(cache_path, bytes(config.get_timing_cache().serialize()))
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    if engine is None:
        raise InternalError(f"TensorRT cannot load the {precision} engine it just built: {_last(logger)}")
    io_tensors = tuple(engine.get_tensor_name(i) for i in range(engine.num_io_tensors))
    return EngineInfo(
        plan_path,
        precision,
        trt.__version__,
        device.name,
        device.compute_capability,
        tuple(flags),
        int8_source,
        shapes,
        workspace_bytes,
        io_tensors,
        len(plan),
        round(time.perf_counter() - started, 3),
    )


def _logger(trt: Any) -> Any:
    """A TensorRT logger that keeps error messages, so failures are reported in TensorRT's own words."""

    class Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.Severity.INTERNAL_ERROR, trt.ILogger.Severity.ERROR):
                self.errors.append(msg)

    return Logger()


def _last(logger: Any) -> str:
    return logger.errors[-1] if logger.errors else "no error message from TensorRT"


def _cache_calibrator(trt: Any, cache: bytes) -> Any:
    """An entropy calibrator that only serves ``calib.cache``: TensorRT reads the scales and never calls
    ``get_batch`` for data (it returns None, "no more batches", if it did)."""

    class CacheCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: list[str]) -> None:
            return None

        def read_calibration_cache(self) -> bytes:
            return cache

        def write_calibration_cache(self, data: Any) -> None:
            return None

    return CacheCalibrator()


def _has_qdq(trt: Any, network: Any) -> bool:
    return any(network.get_layer(i).type == trt.LayerType.QUANTIZE for i in range(network.num_layers))
