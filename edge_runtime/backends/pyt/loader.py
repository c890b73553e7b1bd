"""The PyTorch reference as the registry sees it: available where torch is installed, fp32 only."""

from __future__ import annotations

import importlib.util

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import FP32, LEARNER_KIND
from sac_edge.common.errors import SacEdgeError

from ..base import Backend, BackendKind, BackendOptions
from .runner import TorchBackend


def _unavailable() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "the Python package 'torch' is not installed (pip install 'sac-edge[finetune]')"
    return None


def _precisions(bundle: Bundle) -> tuple[str, ...]:
    return (FP32,) if bundle.files(LEARNER_KIND) else ()


def _open(bundle: Bundle, precision: str, options: BackendOptions) -> Backend:
    if precision != FP32:
        raise SacEdgeError(f"backend 'torch' runs fp32 only (asked for {precision})")
    return TorchBackend(bundle, precision, options)


KIND = BackendKind("torch", _unavailable, _precisions, _open)
