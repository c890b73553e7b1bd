"""The product's TensorRT code on NVIDIA's real ``tensorrt`` module, as far as it goes without a GPU.

Not collected on its own: ``test_trt_real.py`` runs this file in a subprocess whose environment imports the
real module (``scripts/real_tensorrt.py``: the 10.x/11.x bindings over stub libraries whose factories log
TensorRT's no-GPU warning and return nullptr, and the real cuda-python 12.2). ``SAC_EDGE_REAL_TRT`` names
the release; ``SAC_EDGE_REAL_TRT_LIBS=0`` runs it with no TensorRT libraries at all (the import fails).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sac_edge.common.bundle import open_bundle
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.trt import builder
from sac_edge.common.trt.api import NUMPY_TYPES, create, import_problem, make_logger, numpy_type
from sac_edge.common.trt.generations import TRT10, TRT11, generation
from sac_edge.edge_runtime.backends.base import BackendOptions
from sac_edge.edge_runtime.config import DoctorConfig
from sac_edge.edge_runtime.doctor import doctor_command

RELEASE = os.environ.get("SAC_EDGE_REAL_TRT", "")
LIBS = os.environ.get("SAC_EDGE_REAL_TRT_LIBS", "1") != "0"
NO_DEVICE = "CUDA initialization failure with error: 35"
pytestmark = pytest.mark.skipif(not RELEASE, reason="runs under test_trt_real.py with the real tensorrt module")
needs_libs = pytest.mark.skipif(not LIBS, reason="needs the stub TensorRT libraries")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _rows(bundle: Path) -> dict[str, object]:
    rows = doctor_command(DoctorConfig(bundle=str(bundle), sensor_root=str(FIXTURES / "xavier_nx_jp5")))
    return {r.item: r for r in rows}


@pytest.mark.skipif(LIBS, reason="the release without its libraries")
def test_without_libraries_the_doctor_reports_everything(pendulum_bundle: Path) -> None:
    problem = import_problem()
    assert problem is not None and "does not import" in problem and "libnvinfer" in problem
    rows = _rows(pendulum_bundle)
    assert rows["tensorrt"].status == "no" and "libnvinfer" in rows["tensorrt"].value  # type: ignore[attr-defined]
    assert "does not import" in rows["tensorrt (any precision)"].value  # type: ignore[attr-defined]
    assert rows["onnxruntime fp32"].value == "usable" and "memory locking (--lock-memory)" in rows  # type: ignore[attr-defined]


@needs_libs
def test_import_and_generation() -> None:
    import tensorrt as trt

    assert import_problem() is None and trt.__version__ == RELEASE
    assert generation(trt.__version__) is (TRT11 if RELEASE.startswith("11.") else TRT10)


@needs_libs
def test_doctor_rows_say_no_cuda_device_is_usable(pendulum_bundle: Path) -> None:
    rows = _rows(pendulum_bundle)
    tensorrt = rows["tensorrt"]
    assert tensorrt.status == "ok" and f"{RELEASE} (generation" in tensorrt.value  # type: ignore[attr-defined]
    assert "no CUDA device usable" in rows["cuda device"].value  # type: ignore[attr-defined]
    refused = rows["tensorrt (any precision)"]
    assert "no CUDA device usable" in refused.value and refused.fix  # type: ignore[attr-defined]


@needs_libs
def test_the_logger_subclass_gets_tensorrts_messages_and_keeps_the_floor() -> None:
    import tensorrt as trt

    logger = make_logger(trt)
    assert isinstance(logger, trt.ILogger)
    for severity in trt.ILogger.Severity.__members__.values():
        logger.log(severity, f"{severity.name} line")
    assert [m for _, m in logger.messages] == ["INTERNAL_ERROR line", "ERROR line", "WARNING line"]
    fresh = make_logger(trt)
    with pytest.raises(SacEdgeError) as err:  # the warning comes back through NVIDIA's logger trampoline
        create(trt.Builder, fresh, logger=fresh, what="create a builder")
    assert str(err.value).startswith(f"TensorRT could not create a builder: {NO_DEVICE}") and "\n" not in str(err.value)
    with pytest.raises(SacEdgeError, match=f"could not create a runtime: {NO_DEVICE}"):
        create(trt.Runtime, fresh, logger=fresh, what="create a runtime")


@needs_libs
def test_the_calibrator_subclass() -> None:
    import tensorrt as trt

    if not generation(trt.__version__).implicit_int8 and not hasattr(trt, "IInt8EntropyCalibrator2"):
        return  # 11.x: no implicit INT8, and the product never asks for a calibrator there
    calibrator = builder._cache_calibrator(trt, b"TRT-100300-EntropyCalibration2\nobs: 3c000000\n")
    assert isinstance(calibrator, trt.IInt8EntropyCalibrator2)
    assert calibrator.get_batch_size() == 1 and calibrator.get_batch(["obs"]) is None
    assert calibrator.read_calibration_cache().startswith(b"TRT-")


@needs_libs
def test_weights_from_the_arrays_the_runner_passes(pendulum_bundle: Path) -> None:
    import onnx
    import tensorrt as trt
    from onnx import numpy_helper

    graph = onnx.load(str(pendulum_bundle / "policy.onnx"), load_external_data=False).graph
    for init in graph.initializer:
        array = np.asarray(numpy_helper.to_array(init), order="C")  # what swap_weights makes
        weights = trt.Weights(array)
        assert weights.size == array.size and numpy_type(weights.dtype) == array.dtype, init.name
    with pytest.raises(ValueError):  # the runner casts to the graph's own dtypes first
        trt.Weights(np.zeros(3, np.float64))


@needs_libs
def test_the_dtype_map_for_every_data_type() -> None:
    import tensorrt as trt

    for name, member in trt.DataType.__members__.items():
        try:
            theirs = np.dtype(trt.nptype(member))
        except TypeError:  # BF16, FP8, INT4, FP4, E8M0: numpy has no such type
            assert name not in NUMPY_TYPES
            with pytest.raises(SacEdgeError, match=name):
                numpy_type(member)
            continue
        assert numpy_type(member) == theirs, name


@needs_libs
def test_build_and_runner_fail_in_one_line_naming_the_reason(
    pendulum_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sac_edge.edge_runtime.backends.trt.runner import TensorRTBackend

    monkeypatch.setattr(builder, "_probe_cuda", lambda index=0: builder.CudaDevice("GPU", "8.7"))
    with pytest.raises(SacEdgeError, match=f"could not create a builder: {NO_DEVICE}"):
        builder.build_engine(builder.EngineSource(pendulum_bundle / "policy.onnx", "fp32"), tmp_path / "x.plan")
    with pytest.raises(SacEdgeError) as err:
        TensorRTBackend(open_bundle(pendulum_bundle), "fp32", BackendOptions(engine_dir=tmp_path))
    assert str(err.value).startswith(f"TensorRT could not create a runtime: {NO_DEVICE}")


@needs_libs
def test_cuda_python_without_a_driver_is_one_line() -> None:
    from sac_edge.edge_runtime.backends.trt.cuda import open_cuda

    with pytest.raises(SacEdgeError) as err:
        open_cuda()
    assert "cuda-python cannot reach the CUDA driver (Failed to dlopen libcuda.so.1)" in str(err.value)


def test_sac_edge_run_exits_2_with_one_line(pendulum_bundle: Path) -> None:
    # -W ignore: third-party warnings (cryptography's on Python 3.8) are not the product's line
    cmd = [sys.executable, "-W", "ignore", "-m", "sac_edge.edge_runtime.cli", "run", str(pendulum_bundle)]
    cmd += ["--backend", "tensorrt"]
    result = subprocess.run([*cmd, "--duration", "1"], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and ("does not import" in lines[0] if not LIBS else "no CUDA device usable" in lines[0])
