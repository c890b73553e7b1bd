"""Bundles shared by the edge-runtime tests (built once per session; see bundles.py).

The device install has no torch to build them (``make test-device``): there they are read from
``$SAC_EDGE_TEST_BUNDLES``, where ``python tests/edge_runtime/bundles.py DIR`` in the main venv wrote them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# name -> make_bundle arguments of the bundles the device suite needs prebuilt
PREBUILT_BUNDLES: dict[str, dict[str, Any]] = {
    "pendulum": {"int8": "accepted"},
    "rejected": {"int8": "rejected", "seed": 1},
    "enveloped": {"int8": None, "envelope": True},
}


def _bundle(factory: pytest.TempPathFactory, name: str) -> Path:
    prebuilt = os.environ.get("SAC_EDGE_TEST_BUNDLES")
    if prebuilt:
        return Path(prebuilt) / name
    from bundles import make_bundle

    return make_bundle(factory.mktemp("bundles") / name, **PREBUILT_BUNDLES[name])


@pytest.fixture(scope="session")
def pendulum_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pendulum-v1 bundle with an INT8 graph the gate accepted."""
    return _bundle(tmp_path_factory, "pendulum")


@pytest.fixture(scope="session")
def enveloped_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pendulum-v1 bundle with envelope.json (fitted on rollouts of its policy) and no INT8 graph."""
    return _bundle(tmp_path_factory, "enveloped")


@pytest.fixture(scope="session")
def rejected_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pendulum-v1 bundle whose INT8 graph the gate rejected."""
    return _bundle(tmp_path_factory, "rejected")


@pytest.fixture(scope="session")
def finetune_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small Pendulum-v1 bundle (32x32) with an INT8 graph and calibration ranges as sac-export writes them."""
    from finetune_bundles import make_finetune_bundle

    return make_finetune_bundle(tmp_path_factory.mktemp("bundles") / "finetune")
