"""TensorRT engines from the bundle's ONNX, with the TensorRT Python API: 8.5/8.6 (JetPack 5), 10.x and 11.x.

``sac-export`` calls ``build_engine`` (an ``EngineSource`` and ``BuildSettings``) when tensorrt and a CUDA
device are present; the edge runtime calls the same function on the device on first run (engines are
specific to a GPU and a TensorRT version).
The generation (``generations.py``) decides the ONNX, the precision flags and the INT8 source; every
engine gets two optimisation profiles for batch 1..64 (profile 0 for ``act``'s context, profile 1 for
``act_batch``'s: on 8.5 a second context on a one-profile engine has no profile and its enqueues fail,
NvInferRuntime.h / NVIDIA/TensorRT#1590), a workspace limit, a timing cache loaded from and saved beside
the plan, detailed profiling verbosity so the engine inspector can say which layers run INT8, and the
REFIT flag only when asked for (on-device fine-tuning) and never from 11.3, whose release notes list a
known issue where REFIT drops a GEMM bias (``generations.refit_is_safe``: swaps rebuild there); every
engine is compared with the ONNX before it serves anyway (the edge runtime's parity gate).

Every TensorRT call whose result can fail (parse, profile, timing cache, build, deserialise) is checked;
a failure is one ``SacEdgeError``/``InternalError`` line with TensorRT's own last message. Nothing here
imports tensorrt at module import time.
"""

from __future__ import annotations

import ctypes
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ..atomic import atomic_write_bytes
from ..bundle_format import CALIB_CACHE, FP16, FP32, INT8, INT8_ONNX, PRECISIONS, TIMING_CACHE
from ..errors import InternalError, SacEdgeError
from .api import create, import_problem, make_logger, reason
from .generations import Generation, generation

DEFAULT_WORKSPACE = 512 << 20
PROFILES = 2  # profile 0: act's context, profile 1: act_batch's context
# cuda.h CUdevice_attribute values (stable driver ABI)
_CC_MAJOR, _CC_MINOR = 75, 76


class CudaDevice(NamedTuple):
    name: str
    compute_capability: str  # "7.2" on Xavier NX


class EngineInfo(NamedTuple):
    """What was built, for the manifest: the device and TensorRT version make a plan valid or not."""

    plan: Path
    precision: str
    tensorrt_version: str
    generation: str  # "8.5/8.6", "10.x", "10.12+", "11.x"
    device: str
    compute_capability: str
    onnx: str  # the bundle file it was built from
    flags: tuple[str, ...]
    refit: bool
    int8_source: str | None  # "explicit Q/DQ" or "calib.cache"
    calib_header: str | None  # the calib.cache header TensorRT was given (8.x implicit INT8)
    profile: dict[str, list[int]]  # input name -> min/opt/max batch (the same for every profile)
    profiles: int
    workspace_bytes: int
    io_tensors: tuple[str, ...]
    layers: int  # from the engine inspector
    int8_layers: int  # layers whose inspector record names an Int8 tensor
    plan_bytes: int
    build_s: float

    def to_dict(self) -> dict[str, Any]:
        out = self._asdict()
        out["plan"] = self.plan.name
        return out


def cuda_device(index: int = 0) -> CudaDevice | None:
    """The CUDA device through the driver API (libcuda, present wherever a GPU driver is, Jetson included),
    so no Python CUDA package is needed; None without a driver or device (``cuda_problem`` says which)."""
    found = _probe_cuda(index)
    return found if isinstance(found, CudaDevice) else None


def cuda_problem(index: int = 0) -> str | None:
    """Why no CUDA device ``index`` is usable here, in one phrase (None when it is)."""
    found = _probe_cuda(index)
    return None if isinstance(found, CudaDevice) else found


def _probe_cuda(index: int) -> CudaDevice | str:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no CUDA device usable: libcuda.so.1 is not installed (no NVIDIA driver)"
    count, dev = ctypes.c_int(0), ctypes.c_int(0)
    status = lib.cuInit(0)
    if status != 0:
        return f"no CUDA device usable: the CUDA driver does not initialise (cuInit error {status})"
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value <= index:
        return f"no CUDA device usable: the driver reports {count.value} device(s)"
    if lib.cuDeviceGet(ctypes.byref(dev), index) != 0:
        return f"no CUDA device usable: device {index} cannot be opened"
    name = ctypes.create_string_buffer(256)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    lib.cuDeviceGetName(name, len(name), dev)
    lib.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, dev)
    lib.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, dev)
    return CudaDevice(name.value.decode(errors="replace"), f"{major.value}.{minor.value}")


def tensorrt_unavailable() -> str | None:
    """Why engines cannot be built here (None when they can)."""
    problem = import_problem()
    if problem is not None:
        return problem
    return cuda_problem()


def tensorrt_version() -> str:
    import tensorrt as trt

    return str(trt.__version__)


def engine_inputs(bundle: Path, precision: str, version: str) -> tuple[Path, Path | None]:
    """The ONNX (and calibration cache) an engine of ``precision`` is built from, for TensorRT ``version``."""
    gen = generation(version)
    cache = bundle / CALIB_CACHE
    has_cache = cache.is_file()
    onnx = bundle / gen.onnx_name(precision, has_cache)
    return onnx, cache if gen.uses_calib_cache(precision, has_cache) else None


@dataclass(frozen=True)
class EngineSource:
    """What an engine is built from: ``onnx`` at ``precision`` (fp32|fp16|int8), with ``calib_cache`` for
    implicit INT8 (8.x only).

    ``onnx`` must be what ``engine_inputs`` names for this TensorRT (``policy.fp16.onnx`` for fp16 on 11.x, the
    Q/DQ graph for int8 on 10/11). ``onnx_bytes`` and ``calib_bytes``, when given, are the files' contents as
    already read and verified (the runtime's bundle bytes): the build then never reopens the files, so a file
    swapped after its checksum was checked is not built.
    """

    onnx: Path
    precision: str
    calib_cache: Path | None = None
    onnx_bytes: bytes | None = None
    calib_bytes: bytes | None = None


@dataclass(frozen=True)
class BuildSettings:
    """How an engine is built."""

    batch: tuple[int, int, int] = (1, 1, 64)
    """(min, opt, max) batch of every optimisation profile."""
    workspace_bytes: int = DEFAULT_WORKSPACE
    """The builder's workspace memory limit."""
    timing_cache: Path | None = None
    """Loaded before and saved after the build; ``timing.cache`` beside the plan when None."""
    refit: bool = False
    """Add ``BuilderFlag.REFIT`` (on-device fine-tuning only)."""


class _Network(NamedTuple):
    """The parsed graph; the parser holds the weights the network points to, so it lives as long."""

    builder: Any
    network: Any
    parser: Any


class _Config(NamedTuple):
    """The builder config and what it was given; the calibrator must outlive the build."""

    config: Any
    shapes: dict[str, list[int]]
    flags: list[str]
    calibrator: Any
    calib_header: str | None


def build_engine(source: EngineSource, plan_path: Path, settings: BuildSettings | None = None) -> EngineInfo:
    """Build ``plan_path`` from ``source`` with ``settings`` (the defaults when None): check the request,
    parse the graph, configure the builder, build and load the engine, then write the plan and the timing
    cache. A parse or build failure is an InternalError carrying TensorRT's own messages."""
    settings = settings or BuildSettings()
    _check_source(source)
    import tensorrt as trt

    gen = generation(trt.__version__)
    device = cuda_device()
    assert device is not None
    _check_inputs(source, gen)
    started = time.perf_counter()
    logger = make_logger(trt)
    parsed = _parse(trt, gen, source, logger)
    configured = _configure(trt, gen, parsed, source, settings, logger)
    cache_path = settings.timing_cache or plan_path.with_name(TIMING_CACHE)
    _use_timing_cache(configured.config, cache_path, logger)
    plan, engine = _build(trt, parsed, configured.config, source.precision, logger)
    atomic_write_bytes(plan_path, plan)
    atomic_write_bytes(cache_path, bytes(configured.config.get_timing_cache().serialize()))
    layers, int8_layers = _inspect(trt, engine)
    return EngineInfo(
        plan_path,
        source.precision,
        trt.__version__,
        gen.name,
        device.name,
        device.compute_capability,
        source.onnx.name,
        tuple(configured.flags),
        settings.refit,
        _int8_source(source.precision, configured.calibrator),
        configured.calib_header,
        configured.shapes,
        int(engine.num_optimization_profiles),
        settings.workspace_bytes,
        tuple(engine.get_tensor_name(i) for i in range(engine.num_io_tensors)),
        layers,
        int8_layers,
        len(plan),
        round(time.perf_counter() - started, 3),
    )


def _check_source(source: EngineSource) -> None:
    """A known precision, and TensorRT and a CUDA device here (before tensorrt is imported)."""
    if source.precision not in PRECISIONS:
        raise SacEdgeError(f"unknown precision {source.precision!r}; choose from {', '.join(PRECISIONS)}")
    problem = tensorrt_unavailable()
    if problem is not None:
        raise SacEdgeError(f"cannot build a TensorRT engine: {problem}")


def _check_inputs(source: EngineSource, gen: Generation) -> None:
    """The graph is there, and a calibration cache only where ``gen`` reads one."""
    if source.onnx_bytes is None and not source.onnx.is_file():
        raise SacEdgeError(
            f"{source.onnx} is missing; re-export the bundle with this sac-export to build {source.precision}"
        )
    if source.calib_cache is not None and not gen.implicit_int8:
        raise SacEdgeError(f"TensorRT {gen.name} has no implicit INT8 calibration; build int8 from policy.int8.onnx")


def _parse(trt: Any, gen: Generation, source: EngineSource, logger: Any) -> _Network:
    """A builder and the network TensorRT's ONNX parser makes of the graph."""
    builder = create(trt.Builder, logger, logger=logger, what="create a builder")
    flags = 0
    if gen.explicit_batch_flag:
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    elif gen.strongly_typed_flag:  # the graph's types decide the precision (policy.fp16.onnx, Q/DQ)
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = _require(builder.create_network(flags), logger, "create a network")
    parser = create(trt.OnnxParser, network, logger, logger=logger, what="create an ONNX parser")
    if not parser.parse(source.onnx.read_bytes() if source.onnx_bytes is None else source.onnx_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise InternalError(f"TensorRT cannot parse {source.onnx.name}: {errors or reason(logger)}")
    return _Network(builder, network, parser)


def _configure(
    trt: Any, gen: Generation, parsed: _Network, source: EngineSource, settings: BuildSettings, logger: Any
) -> _Config:
    """The builder config: workspace, detailed profiling, the profiles, precision flags, REFIT, calibrator."""
    config = _require(parsed.builder.create_builder_config(), logger, "create a builder config")
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_bytes)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    shapes, profile = _add_profiles(parsed.builder, parsed.network, config, settings.batch, logger)
    used = _set_precision(trt, gen, config, parsed.network, source.precision, source.onnx)
    if settings.refit:
        config.set_flag(trt.BuilderFlag.REFIT)
        used.append("REFIT")
    calibrator, header = None, None
    if source.calib_cache is not None and source.precision == INT8:
        from .calib_cache import for_tensorrt

        data = for_tensorrt(source.calib_cache, trt.__version__, source.calib_bytes)
        header = data.split(b"\n", 1)[0].decode()
        calibrator = _cache_calibrator(trt, data)
        config.int8_calibrator = calibrator
        _check(config.set_calibration_profile(profile), logger, "set the calibration profile")
    return _Config(config, shapes, used, calibrator, header)


def _int8_source(precision: str, calibrator: Any) -> str | None:
    """Where an INT8 engine's scales came from (None for fp32/fp16)."""
    if precision != INT8:
        return None
    return CALIB_CACHE if calibrator is not None else "explicit Q/DQ"


def _use_timing_cache(config: Any, cache_path: Path, logger: Any) -> None:
    """The timing cache at ``cache_path`` when TensorRT accepts it, else an empty one."""
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
    if cache is None or not config.set_timing_cache(cache, False):
        cache = _require(config.create_timing_cache(b""), logger, "create an empty timing cache")
        _check(config.set_timing_cache(cache, False), logger, f"use a timing cache ({cache_path.name} is ignored)")


def _build(trt: Any, parsed: _Network, config: Any, precision: str, logger: Any) -> tuple[bytes, Any]:
    """The serialised plan, and the engine it loads as (a plan TensorRT cannot load is not written)."""
    serialized = parsed.builder.build_serialized_network(parsed.network, config)
    if serialized is None:
        raise InternalError(f"TensorRT could not build the {precision} engine: {reason(logger)}")
    plan = bytes(serialized)
    engine = create(trt.Runtime, logger, logger=logger, what="create a runtime").deserialize_cuda_engine(plan)
    if engine is None:
        raise InternalError(f"TensorRT cannot load the {precision} engine it just built: {reason(logger)}")
    return plan, engine


def _add_profiles(
    builder: Any, network: Any, config: Any, batch: tuple[int, int, int], logger: Any
) -> tuple[dict[str, list[int]], Any]:
    """``PROFILES`` identical batch profiles (one per execution context); returns the shapes and profile 0."""
    shapes: dict[str, list[int]] = {}
    first = None
    for index in range(PROFILES):
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            features = tuple(tensor.shape)[1:]
            profile.set_shape(tensor.name, *[(b, *features) for b in batch])
            shapes[tensor.name] = list(batch)
        if config.add_optimization_profile(profile) != index:
            raise InternalError(f"TensorRT refused optimisation profile {index} (batch {batch}): {reason(logger)}")
        first = first or profile
    return shapes, first


def _set_precision(trt: Any, gen: Generation, config: Any, network: Any, precision: str, onnx_path: Path) -> list[str]:
    """The builder flags ``precision`` needs on ``gen`` (none where strongly typed: the graph's types decide)."""
    if precision == INT8 and not gen.implicit_int8 and not _has_qdq(trt, network):
        raise SacEdgeError(f"{onnx_path.name} has no Q/DQ nodes; TensorRT {gen.name} builds INT8 from {INT8_ONNX}")
    if precision == FP32 or not gen.precision_flags:
        return []
    flag = "FP16" if precision == FP16 else "INT8"
    config.set_flag(getattr(trt.BuilderFlag, flag))
    return [flag]


def _inspect(trt: Any, engine: Any) -> tuple[int, int]:
    """Layers and layers with an Int8 tensor, from the engine inspector's JSON (detailed verbosity)."""
    inspector = engine.create_engine_inspector()
    if inspector is None:
        return 0, 0
    try:
        info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    except ValueError:
        return 0, 0
    layers = info.get("Layers", []) if isinstance(info, dict) else []
    return len(layers), sum("int8" in json.dumps(layer).lower() for layer in layers)


def _require(value: Any, logger: Any, what: str) -> Any:
    """``value`` unless TensorRT returned None for it (one line with TensorRT's last message)."""
    if value is None:
        raise InternalError(f"TensorRT could not {what}: {reason(logger)}")
    return value


def _check(ok: bool, logger: Any, what: str) -> None:
    if not ok:
        raise InternalError(f"TensorRT could not {what}: {reason(logger)}")


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
