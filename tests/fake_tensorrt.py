"""A stand-in ``tensorrt`` module that exposes exactly the Python names one TensorRT generation has.

It checks NAMES, NOT BEHAVIOUR: every attribute the code under test reads is looked up in the
generation's table (``SURFACE``) and a name the generation lacks raises AttributeError, as the real
module would; calls return just enough (a plan, two I/O tensors, True for the bool results) for the build
path to run to its end. Whether TensorRT then builds a correct engine is what the ``tensorrt``-marked tests
and the parity gate check on a real device.

Sources for the tables (NVIDIA TensorRT Python API docs and migration guides):
- 8.5/8.6: Python API 8.5.x/8.6.1 (``IExecutionContext.execute_async_v3``, ``set_input_shape``,
  ``set_tensor_address``, ``ICudaEngine.num_io_tensors``/``get_tensor_name`` are new in 8.5;
  ``NetworkDefinitionCreationFlag.EXPLICIT_BATCH`` required by the ONNX parser; ``IInt8EntropyCalibrator2``,
  ``IBuilderConfig.int8_calibrator``/``set_calibration_profile``; ``Refitter.set_named_weights``/
  ``get_all_weights``/``get_missing_weights`` from 8.5).
- 10.x: "Migrating from TensorRT 8.x to 10.x" (EXPLICIT_BATCH deprecated and ignored; implicit INT8
  deprecated in 10.1 but present; ``BuilderFlag.FP16/INT8`` present).
- 11.x: "Migrating from TensorRT 10.x to 11.x", Removed Python APIs (11.4): ``BuilderFlag.FP16``,
  ``BuilderFlag.INT8``, ``IBuilderConfig.int8_calibrator``, ``IBuilderConfig.set_calibration_profile()``,
  ``IBuilder.platform_has_fast_fp16/int8`` removed; networks always strongly typed.
"""

from __future__ import annotations

import enum
import importlib.machinery
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

NULLPTR = "pybind11::init(): factory function returned nullptr"  # what pybind11 raises for a failed factory
NO_DEVICE = "CUDA initialization failure with error: 35"  # TensorRT 8.5's WARNING without a usable GPU


class Severity(enum.IntEnum):
    """``trt.ILogger.Severity``: the values of NvInferRuntimeBase.h (most severe first)."""

    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


COMMON = frozenset(
    {
        "Builder", "OnnxParser", "Runtime", "Logger", "ILogger", "Weights", "Refitter", "nptype",
        "MemoryPoolType.WORKSPACE", "ProfilingVerbosity.DETAILED", "BuilderFlag.REFIT", "BuilderFlag.TF32",
        "LayerType.QUANTIZE", "LayerInformationFormat.JSON", "ILogger.Severity",
        "IBuilder.create_network", "IBuilder.create_builder_config", "IBuilder.create_optimization_profile",
        "IBuilder.build_serialized_network",
        "IBuilderConfig.set_memory_pool_limit", "IBuilderConfig.profiling_verbosity",
        "IBuilderConfig.add_optimization_profile", "IBuilderConfig.set_flag", "IBuilderConfig.create_timing_cache",
        "IBuilderConfig.set_timing_cache", "IBuilderConfig.get_timing_cache", "ITimingCache.serialize",
        "IOptimizationProfile.set_shape", "INetworkDefinition.num_inputs", "INetworkDefinition.get_input",
        "INetworkDefinition.num_layers", "INetworkDefinition.get_layer", "ITensor.name", "ITensor.shape",
        "ILayer.type", "OnnxParser.parse", "OnnxParser.num_errors", "OnnxParser.get_error",
        "Runtime.deserialize_cuda_engine", "ICudaEngine.num_io_tensors", "ICudaEngine.get_tensor_name",
        "ICudaEngine.get_tensor_dtype", "ICudaEngine.num_optimization_profiles", "ICudaEngine.create_engine_inspector",
        "ICudaEngine.create_execution_context", "IEngineInspector.get_engine_information",
        "IExecutionContext.set_optimization_profile_async", "IExecutionContext.set_input_shape",
        "IExecutionContext.set_tensor_address", "IExecutionContext.execute_async_v3",
        "Refitter.get_all_weights", "Refitter.set_named_weights", "Refitter.get_missing_weights",
        "Refitter.refit_cuda_engine",
    }
)  # fmt: skip
WEAK_TYPING = frozenset(
    {
        "BuilderFlag.FP16", "BuilderFlag.INT8", "IInt8EntropyCalibrator2", "IBuilderConfig.int8_calibrator",
        "IBuilderConfig.set_calibration_profile", "IBuilder.platform_has_fast_fp16", "IBuilder.platform_has_fast_int8",
        "NetworkDefinitionCreationFlag.EXPLICIT_BATCH",
    }
)  # fmt: skip
SURFACE = {v: COMMON | WEAK_TYPING for v in ("8.5.2", "8.6.1", "10.3.0")} | {"11.4.0": COMMON}
REMOVED_IN_11 = frozenset(  # the migration guide's list, as far as this code could touch it
    {
        "BuilderFlag.FP16", "BuilderFlag.INT8", "IBuilderConfig.int8_calibrator",
        "IBuilderConfig.set_calibration_profile", "IBuilder.platform_has_fast_fp16", "IBuilder.platform_has_fast_int8",
    }
)  # fmt: skip


class Surface:
    """Attribute access checked against the generation's names; ``calls`` records what was used."""

    def __init__(self, kind: str, names: frozenset[str], used: list[str], values: dict[str, Any]) -> None:
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_used", used)
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> Any:
        full = f"{self._kind}.{name}"
        if full not in self._names:
            raise AttributeError(f"TensorRT generation has no {full}")
        self._used.append(full)
        return self._values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        full = f"{self._kind}.{name}"
        if full not in self._names:
            raise AttributeError(f"TensorRT generation has no {full}")
        self._used.append(full)


def fake_tensorrt(version: str, qdq: bool = True, device: bool = True) -> tuple[types.ModuleType, list[str]]:
    """A ``tensorrt`` module for ``version`` (a key of SURFACE) and the list of names the code used.

    Without a ``device``, ``Builder`` and ``Runtime`` log TensorRT's WARNING to the logger they are given
    and raise pybind11's nullptr TypeError, as the real modules do on a machine without a usable GPU."""
    names, used = SURFACE[version], []  # type: ignore[var-annotated]

    def obj(kind: str, **values: Any) -> Surface:
        return Surface(kind, names, used, values)

    def enum(kind: str, *members: str) -> Surface:
        return obj(kind, **{m: f"{kind}.{m}" for m in members})

    profiles: list[Any] = []
    timing = obj("ITimingCache", serialize=lambda: b"timing")
    config = obj(
        "IBuilderConfig",
        set_memory_pool_limit=lambda pool, size: None,
        add_optimization_profile=lambda p: profiles.append(p) or len(profiles) - 1,
        set_flag=lambda flag: used.append(f"set_flag:{flag}"),
        create_timing_cache=lambda data: timing,
        set_timing_cache=lambda cache, ignore_mismatch: True,
        get_timing_cache=lambda: timing,
        set_calibration_profile=lambda p: True,
    )
    tensor = obj("ITensor", name="obs", shape=(-1, 3))
    layer = obj("ILayer", type="LayerType.QUANTIZE" if qdq else "LayerType.MATRIX_MULTIPLY")
    network = obj(
        "INetworkDefinition", num_inputs=1, get_input=lambda i: tensor, num_layers=1, get_layer=lambda i: layer
    )
    layers = json.dumps({"Layers": ["gemm Int8", "tanh"]})
    inspector = obj("IEngineInspector", get_engine_information=lambda fmt: layers)
    engine = obj(
        "ICudaEngine",
        num_io_tensors=2,
        get_tensor_name=lambda i: ("obs", "action")[i],
        num_optimization_profiles=len(profiles) or 2,
        create_engine_inspector=lambda: inspector,
    )
    builder = obj(
        "IBuilder",
        create_network=lambda flags: network,
        create_builder_config=lambda: config,
        create_optimization_profile=lambda: obj("IOptimizationProfile", set_shape=lambda *a: None),
        build_serialized_network=lambda net, cfg: b"serialized plan",
    )

    class ILogger:
        Severity = globals()["Severity"]

        def __init__(self) -> None:
            used.append("ILogger.__init__")

    def needs_device(make: Any) -> Any:
        def factory(*args: Any) -> Any:
            if not device:
                args[-1].log(Severity.WARNING, NO_DEVICE)
                raise TypeError(NULLPTR)
            return make(*args)

        return factory

    def nptype(dtype: Any) -> Any:
        if version.startswith("8.5"):  # its table names np.bool, absent from numpy 1.24 to 1.26 (NVIDIA/TensorRT#2557):
            raise AttributeError("module 'numpy' has no attribute 'bool'")  # 8.5 is Python 3.8's, numpy <= 1.24.4
        return {"DataType.FLOAT": np.float32, "DataType.HALF": np.float16}[dtype]

    class IInt8EntropyCalibrator2:
        def __init__(self) -> None:
            used.append("IInt8EntropyCalibrator2.__init__")

    module = types.ModuleType("tensorrt")
    top: dict[str, Any] = {
        "Builder": needs_device(lambda logger: builder),
        "OnnxParser": lambda net, logger: obj("OnnxParser", parse=lambda data: True, num_errors=0, get_error=str),
        "Runtime": needs_device(lambda logger: obj("Runtime", deserialize_cuda_engine=lambda plan: engine)),
        "nptype": nptype,
        "ILogger": ILogger,
        "IInt8EntropyCalibrator2": IInt8EntropyCalibrator2,
        "MemoryPoolType": enum("MemoryPoolType", "WORKSPACE"),
        "ProfilingVerbosity": enum("ProfilingVerbosity", "DETAILED"),
        "BuilderFlag": enum("BuilderFlag", "FP16", "INT8", "REFIT", "TF32"),
        "LayerType": enum("LayerType", "QUANTIZE"),
        "LayerInformationFormat": enum("LayerInformationFormat", "JSON"),
        "NetworkDefinitionCreationFlag": obj("NetworkDefinitionCreationFlag", EXPLICIT_BATCH=0),
    }

    def module_getattr(name: str) -> Any:
        if name not in names and not any(n.startswith(name + ".") for n in names):
            raise AttributeError(f"TensorRT {version} has no {name}")
        if name in names:  # a namespace (BuilderFlag) records its members as they are read
            used.append(name)
        return top[name]

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
