"""Every module imports. In the device install (Python 3.8, no torch; ``make test-device``) this is what
catches a construct that Python 3.8 cannot run, such as a subscripted ``collections.abc`` alias."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import sac_edge

OPTIONAL = {"torch", "tqdm", "matplotlib", "onnxslim", "tensorrt", "pycuda", "cuda", "mujoco", "pynvml", "rclpy"}
MODULES = sorted(
    m.name
    for pkg in ("common", "train", "export", "calibration", "edge_runtime")
    for m in pkgutil.walk_packages(importlib.import_module(f"sac_edge.{pkg}").__path__, f"sac_edge.{pkg}.")
)


def test_modules_are_found() -> None:
    assert "sac_edge.edge_runtime.doctor" in MODULES and len(MODULES) > 50
    assert sac_edge.__name__ == "sac_edge"


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name: str) -> None:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:  # an optional dependency this install does not have
        if (err.name or "").split(".")[0] not in OPTIONAL:
            raise
        pytest.skip(f"needs {err.name}")
