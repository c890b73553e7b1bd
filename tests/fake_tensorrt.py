"""A stand-in ``tensorrt`` module: one real release's names and signatures, and the behaviour of the real
module on a machine with (``device=True``) or without a usable GPU.

Names come from the committed surfaces (``api_surface``, read from NVIDIA's modules): every attribute the
code reads or sets is looked up there, so a name the release lacks raises AttributeError, a method read as
a property (or set) fails, a property that cannot be set raises, and a call whose argument count no
pybind11 overload accepts raises TypeError, as the real module would. Enum values are the release's own;
``trt.nptype`` answers what the real one answered when the surface was read (8.5's raises with numpy 1.24,
NVIDIA/TensorRT#2557); ``trt.Weights`` refuses what the real one refuses (non-contiguous arrays, float64).

Behaviour without a device is the real one's: ``Builder``/``Runtime`` send TensorRT 8.5's messages to the
logger they are given ("CUDA initialization failure with error: 35" at WARNING, after two WARNINGs and an
INFO) and raise pybind11's nullptr TypeError; a build with a device logs at every severity below ERROR.
With a device, calls return just enough (a plan, two I/O tensors, True for the bool results) for the build
and runner paths to run to their end; whether TensorRT then builds a correct engine is what the
``tensorrt``-marked tests and the parity gate check on a device.
"""

from __future__ import annotations

import enum
import importlib.machinery
import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from api_surface import VERSIONS, Surface, accepts, load

NULLPTR = "pybind11::init(): factory function returned nullptr"  # what pybind11 raises for a failed factory
NO_DEVICE = "CUDA initialization failure with error: 35"  # TensorRT 8.5's WARNING without a usable GPU
# What the real 8.5.3.1 logs from trt.Builder(logger) without a GPU, in order (read through a Python logger).
NO_DEVICE_LOG = (
    ("WARNING", "Unable to determine GPU memory usage"),
    ("WARNING", "Unable to determine GPU memory usage"),
    ("INFO", "[MemUsageChange] Init CUDA: CPU +0, GPU +0, now: CPU 15, GPU 0 (MiB)"),
    (
        "WARNING",
        f"{NO_DEVICE}. Please check your CUDA installation:  http://docs.nvidia.com/cuda/cuda-installation-guide-linux/index.html",
    ),
)
# TensorRT 11's migration guide's removed Python APIs, as far as this project could touch them.
REMOVED_IN_11 = (
    "BuilderFlag.FP16", "BuilderFlag.INT8", "IBuilderConfig.int8_calibrator",
    "IBuilderConfig.set_calibration_profile", "Builder.platform_has_fast_fp16", "Builder.platform_has_fast_int8",
    "NetworkDefinitionCreationFlag.EXPLICIT_BATCH", "IInt8EntropyCalibrator2",
)  # fmt: skip


class FakeObject:
    """An instance of TensorRT class ``kind``, its attributes checked against the release's surface."""

    def __init__(self, kind: str, surface: Surface, used: list[str], values: dict[str, Any]) -> None:
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_surface", surface)
        object.__setattr__(self, "_used", used)
        object.__setattr__(self, "_values", values)

    def _record(self, name: str) -> dict[str, Any]:
        record = self._surface.member(self._kind, name)
        if record is None:
            raise AttributeError(f"TensorRT {self._surface.version} has no {self._kind}.{name}")
        self._used.append(f"{self._kind}.{name}")
        return record

    def __getattr__(self, name: str) -> Any:
        record = self._record(name)
        if name not in self._values:
            raise NotImplementedError(f"fake_tensorrt gives {self._kind}.{name} no behaviour")
        value = self._values[name]
        if "method" in record:
            return checked(self._surface, self._kind, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        record = self._record(name)
        if record.get("property") != "rw":
            raise AttributeError(f"{self._kind}.{name}: can't set attribute (TensorRT {self._surface.version})")
        self._values[name] = value


def checked(surface: Surface, kind: str, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    """``call`` behind the argument-count check of ``kind.name``'s pybind11 overloads."""

    def method(*args: Any, **kwargs: Any) -> Any:
        if not accepts(surface.arities(kind, name), args, kwargs):
            raise TypeError(
                f"{name}(): incompatible function arguments ({len(args)} given; TensorRT {surface.version})"
            )
        result = call(*args, **kwargs)
        declared = surface.returns(kind, name)
        if isinstance(result, FakeObject) and declared and "::" not in declared:  # 8.5 leaks some C++ names
            assert result._kind == declared, f"fake {kind}.{name} returns {result._kind}, TensorRT a {declared}"
        return result

    return method


def _enum(surface: Surface, kind: str) -> type[enum.IntEnum]:
    values = sorted(surface.enum(kind).items(), key=lambda item: item[1])  # pybind11 lists members by value
    made = enum.IntEnum(kind.rsplit(".", 1)[-1], values)  # type: ignore[misc]
    made.__str__ = lambda self: f"{type(self).__name__}.{self.name}"  # type: ignore[method-assign]  as pybind11's
    return made


def fake_tensorrt(version: str, qdq: bool = True, device: bool = True) -> tuple[types.ModuleType, list[str]]:
    """A ``tensorrt`` module for ``version`` (one of ``api_surface.VERSIONS``) and the names the code used."""
    surface, used = load(version), []  # type: ignore[var-annotated]

    def obj(kind: str, **values: Any) -> FakeObject:
        return FakeObject(kind, surface, used, values)

    enums: dict[str, Any] = {}

    def enum_of(kind: str) -> FakeObject:
        if kind not in enums:
            members = _enum(surface, kind)
            enums[kind] = obj(kind, **dict(members.__members__))  # aliases too
        return enums[kind]

    def member(kind: str, name: str) -> Any:
        return getattr(enum_of(kind), name)

    timing = obj("ITimingCache", serialize=lambda: b"timing")

    def new_config() -> FakeObject:
        profiles: list[Any] = []
        weak = (
            {"set_calibration_profile": lambda p: True} if surface.member("IBuilderConfig", "int8_calibrator") else {}
        )
        return obj(
            "IBuilderConfig",
            **weak,
            set_memory_pool_limit=lambda pool, size: None,
            add_optimization_profile=lambda p: profiles.append(p) or len(profiles) - 1,
            set_flag=lambda flag: used.append(f"set_flag:{flag}"),
            create_timing_cache=lambda data: timing,
            set_timing_cache=lambda cache, ignore_mismatch: True,
            get_timing_cache=lambda: timing,
        )

    tensor = obj("ITensor", name="obs", shape=(-1, 3))
    layer = obj("ILayer", type=member("LayerType", "QUANTIZE" if qdq else "MATRIX_MULTIPLY"))
    network = obj(
        "INetworkDefinition", num_inputs=1, get_input=lambda i: tensor, num_layers=1, get_layer=lambda i: layer
    )
    layers = json.dumps({"Layers": ["gemm Int8", "tanh"]})
    inspector = obj("EngineInspector", get_engine_information=lambda fmt: layers)

    def context() -> FakeObject:
        return obj(
            "IExecutionContext",
            set_optimization_profile_async=lambda index, stream: True,
            set_input_shape=lambda name, shape: True,
            set_tensor_address=lambda name, ptr: True,
            execute_async_v3=lambda stream: True,
        )

    engine = obj(
        "ICudaEngine",
        num_io_tensors=2,
        get_tensor_name=lambda i: ("obs", "action")[i],
        get_tensor_dtype=lambda name: member("DataType", "FLOAT"),
        num_optimization_profiles=2,
        create_engine_inspector=lambda: inspector,
        create_execution_context=context,
    )
    builder = obj(
        "Builder",
        create_network=lambda flags=0: used.append(f"create_network:{flags}") or network,
        create_builder_config=new_config,
        create_optimization_profile=lambda: obj("IOptimizationProfile", set_shape=lambda *a: None),
        build_serialized_network=lambda net, cfg: build_log() or b"serialized plan",
    )
    refitted: dict[str, Any] = {}
    loggers: list[Any] = []

    def build_log() -> None:  # a real build's messages are mostly VERBOSE and INFO (the fake's own words)
        for logger in loggers:
            for level in ("VERBOSE", "INFO", "WARNING"):
                logger.log(getattr(ILogger.Severity, level), f"fake_tensorrt: a {level} message of the build")

    def refitter(engine: Any, logger: Any) -> FakeObject:
        return obj(
            "Refitter",
            get_all_weights=lambda: ["w", "b"],
            set_named_weights=lambda name, weights: name in ("w", "b") and refitted.__setitem__(name, weights) is None,
            get_missing_weights=lambda: [n for n in ("w", "b") if n not in refitted],
            refit_cuda_engine=lambda: True,
        )

    class ILogger:
        Severity = _enum(surface, "ILogger.Severity")

        def __init__(self) -> None:
            used.append("ILogger.__init__")

    for level, value in ILogger.Severity.__members__.items():  # ILogger.WARNING etc., as on the real class
        setattr(ILogger, level, value)

    class Logger(ILogger):
        """The real module's own logger: prints messages at ``min_severity`` or more severe to stderr."""

        def __init__(self, min_severity: Any = ILogger.Severity.WARNING) -> None:
            super().__init__()
            self.min_severity = min_severity

        def log(self, severity: Any, msg: str) -> None:
            if int(severity) <= int(self.min_severity):  # lower values are more severe
                print(f"[TRT] [{severity.name[0]}] {msg}", file=sys.stderr)

    def constructor(kind: str, make: Callable[..., Any], needs_device: bool = False) -> Callable[..., Any]:
        def factory(*args: Any) -> Any:
            if not accepts(surface.arities(kind, "__init__"), args, {}):
                raise TypeError(f"{kind}.__init__(): incompatible constructor arguments (TensorRT {version})")
            if needs_device:
                loggers.append(args[-1])
            if needs_device and not device:
                for level, msg in NO_DEVICE_LOG:
                    args[-1].log(getattr(ILogger.Severity, level), msg)
                raise TypeError(NULLPTR)
            return make(*args)

        return factory

    def nptype(dtype: Any) -> Any:
        answer = surface.probes["nptype"][dtype.name]
        kind, _, message = answer.partition(": ")
        if message:  # what the real nptype raised when the surface was read
            raise {"AttributeError": AttributeError, "TypeError": TypeError}.get(kind, RuntimeError)(message)
        return np.dtype(answer).type

    def weights(array: Any = None) -> FakeObject:
        if isinstance(array, np.ndarray):
            if not array.flags["C_CONTIGUOUS"]:
                raise ValueError("Could not convert non-contiguous NumPy array to Weights.")
            if array.dtype.name not in ("float32", "float16", "int8", "int32", "int64", "uint8", "bool"):
                raise ValueError("Could not implicitly convert NumPy data type to TensorRT.")
        return obj("Weights", size=0 if array is None else int(np.asarray(array).size))

    module = types.ModuleType("tensorrt")
    top: dict[str, Any] = {
        "Builder": constructor("Builder", lambda logger: builder, needs_device=True),
        "OnnxParser": constructor(
            "OnnxParser", lambda net, logger: obj("OnnxParser", parse=lambda data: True, num_errors=0, get_error=str)
        ),
        "Runtime": constructor(
            "Runtime", lambda logger: obj("Runtime", deserialize_cuda_engine=lambda plan: engine), needs_device=True
        ),
        "Refitter": constructor("Refitter", refitter),
        "Weights": constructor("Weights", weights),
        "nptype": nptype,
        "ILogger": ILogger,
        "Logger": Logger,
    }
    if surface.top("IInt8EntropyCalibrator2"):

        class IInt8EntropyCalibrator2:
            def __init__(self) -> None:
                used.append("IInt8EntropyCalibrator2.__init__")

        top["IInt8EntropyCalibrator2"] = IInt8EntropyCalibrator2

    def module_getattr(name: str) -> Any:
        if not surface.top(name):
            raise AttributeError(f"TensorRT {version} has no {name}")
        used.append(name)
        if name in top:
            return top[name]
        if surface.enum(name):
            return enum_of(name)
        raise NotImplementedError(f"fake_tensorrt gives {name} no behaviour")

    module.__getattr__ = module_getattr  # type: ignore[method-assign]
    module.__version__ = version  # type: ignore[attr-defined]
    module.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)  # find_spec sees it as installed
    return module, used


def plant_broken_tensorrt(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``tensorrt`` package on ``sys.path`` whose import fails as the real bindings' does without libnvinfer."""
    package = root / "tensorrt"
    package.mkdir()
    (package / "__init__.py").write_text(
        'raise ImportError("libnvinfer.so.10: cannot open shared object file: No such file or directory")\n'
    )
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)


__all__ = ["NO_DEVICE", "NULLPTR", "REMOVED_IN_11", "VERSIONS", "fake_tensorrt", "plant_broken_tensorrt"]
