"""The TensorRT API pieces every generation shares (``common/trt/api.py``): the dtype map, the logger and its
severity floor, creating Builder/Runtime where TensorRT cannot, and an installed tensorrt that does not import.

``trt`` is each generation's fake here (``fake_tensorrt``: failures raise as the real modules do without a
device); ``tests/edge_runtime/backends/test_trt_real.py`` runs the same code against NVIDIA's real modules.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from fake_tensorrt import NO_DEVICE, NULLPTR, VERSIONS, fake_tensorrt, plant_broken_tensorrt

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.trt import builder
from sac_edge.common.trt.api import NUMPY_TYPES, create, import_problem, make_logger, numpy_type


def test_numpy_types_of_the_data_types_numpy_has() -> None:
    assert numpy_type("DataType.FLOAT") == np.float32 and numpy_type("HALF") == np.float16
    assert {numpy_type(name) for name in NUMPY_TYPES} == set(NUMPY_TYPES.values())
    for name in ("BF16", "FP8", "INT4", "FP4", "E8M0"):
        with pytest.raises(SacEdgeError, match=f"a {name} tensor, which numpy cannot hold"):
            numpy_type(name)


@pytest.mark.parametrize("version", VERSIONS)
def test_create_names_tensorrts_reason_in_one_line(version: str) -> None:
    trt, _ = fake_tensorrt(version, device=False)
    logger = make_logger(trt)
    with pytest.raises(SacEdgeError) as err:
        create(trt.Builder, logger, logger=logger, what="create a builder")
    message = str(err.value)
    assert message.startswith(f"TensorRT could not create a builder: {NO_DEVICE}") and "\n" not in message
    assert "nvidia-smi" in message and err.value.exit_code == 2
    with pytest.raises(SacEdgeError, match=NO_DEVICE):
        create(trt.Runtime, logger, logger=logger, what="create a runtime")


def test_create_passes_other_type_errors_and_none_results() -> None:
    trt, _ = fake_tensorrt("10.3.0")
    logger = make_logger(trt)

    def wrong(*args: object) -> None:
        raise TypeError("__init__(): incompatible constructor arguments")

    with pytest.raises(TypeError, match="incompatible"):
        create(wrong, logger=logger, what="create it")
    with pytest.raises(SacEdgeError, match="could not create it: TensorRT gave no reason"):
        create(lambda: None, logger=logger, what="create it")
    assert NULLPTR.endswith("nullptr")


def test_logger_keeps_warnings_and_errors_above_its_floor() -> None:
    trt, _ = fake_tensorrt("11.4.0.106")
    logger = make_logger(trt)
    severity_type = trt.ILogger.Severity
    for severity in severity_type:
        logger.log(severity, f"{severity.name} message")
    assert [m for _, m in logger.messages] == ["INTERNAL_ERROR message", "ERROR message", "WARNING message"]
    assert logger.reason() == "ERROR message"  # an error says more than a later warning
    verbose = make_logger(trt, floor="VERBOSE")
    verbose.log(severity_type.VERBOSE, "tactic 7\n  chosen")
    assert verbose.reason() == "tactic 7 chosen"  # one line
    verbose.log(severity_type.WARNING, "the warning")
    assert verbose.reason() == "the warning"


def test_build_without_a_device_is_one_line_with_the_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trt, _ = fake_tensorrt("8.5.3.1", device=False)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(builder, "tensorrt_unavailable", lambda: None)
    monkeypatch.setattr(builder, "cuda_device", lambda index=0: builder.CudaDevice("GPU", "7.2"))
    (tmp_path / "policy.onnx").write_bytes(b"graph")
    with pytest.raises(SacEdgeError) as err:
        builder.build_engine(builder.EngineSource(tmp_path / "policy.onnx", "fp32"), tmp_path / "x.plan")
    assert f"could not create a builder: {NO_DEVICE}" in str(err.value) and err.value.exit_code == 2


def test_an_installed_tensorrt_that_does_not_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plant_broken_tensorrt(tmp_path, monkeypatch)
    problem = import_problem()
    assert problem is not None and "does not import (libnvinfer.so.10: cannot open" in problem
    assert builder.tensorrt_unavailable() == problem
