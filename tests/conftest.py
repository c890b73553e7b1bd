"""Turns the hardware markers into skips with a reason when the hardware is absent."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _why_missing(marker: str) -> str | None:
    if marker == "gpu":
        return None if _cuda() else "needs a CUDA device (none here)"
    if marker == "tensorrt":
        if importlib.util.find_spec("tensorrt") is None:
            return "needs the tensorrt Python package (not installed)"
        return None if _cuda() else "needs a CUDA device for TensorRT (none here)"
    if marker == "torch":
        return None if importlib.util.find_spec("torch") else "needs torch (not installed: the device install)"
    if marker == "jetson":
        return None if Path("/etc/nv_tegra_release").exists() else "needs a Jetson (no /etc/nv_tegra_release)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reasons: dict[str, str | None] = {}
    for item in items:
        for marker in ("gpu", "tensorrt", "torch", "jetson"):
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in reasons:
                reasons[marker] = _why_missing(marker)
            reason = reasons[marker]
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _private_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each test its own device record of accepted bundle releases (never the runner's ~/.local/state)."""
    monkeypatch.setenv("SAC_EDGE_STATE_DIR", str(tmp_path_factory.mktemp("state")))
