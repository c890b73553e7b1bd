"""Bundles shared by the edge-runtime tests (built once per session; see bundles.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bundles import make_bundle


@pytest.fixture(scope="session")
def pendulum_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pendulum-v1 bundle with an INT8 graph the gate accepted."""
    return make_bundle(tmp_path_factory.mktemp("bundles") / "pendulum", int8="accepted")


@pytest.fixture(scope="session")
def rejected_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pendulum-v1 bundle whose INT8 graph the gate rejected."""
    return make_bundle(tmp_path_factory.mktemp("bundles") / "rejected", int8="rejected", seed=1)


@pytest.fixture(scope="session")
def finetune_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small Pendulum-v1 bundle (32x32) with an INT8 graph and calibration ranges as sac-export writes them."""
    from finetune_bundles import make_finetune_bundle

    return make_finetune_bundle(tmp_path_factory.mktemp("bundles") / "finetune")
