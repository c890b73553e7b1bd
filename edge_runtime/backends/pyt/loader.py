"""The PyTorch reference as the registry sees it: available where torch is installed, fp32 only."""

from __future__ import annotations

import importlib.util

from sac_edge.common.errors import SacEdgeError

from ..base import Backend, BackendKind, BackendOptions, Bundle
from .runner import LEARNER_KIND, TorchBackend


def _unavailable() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "the Python package 'torch' is not installed (pip install 'sac-edge[finetune]')"
    return None


def _precisions(bundle: Bundle) -> tuple[str, ...]:
    return ("fp32",) if bundle.files(LEARNER_KIND) else ()


def _open(bundle: Bundle, precision: str, options: BackendOptions) -> Backend:
    if precision != "fp32":
        raise SacEdgeError(f"backend 'torch' runs fp32 only (asked for {precision})")
    return TorchBackend(bundle, precision, options)


KIND = BackendKind("torch", _unavailable, _precisions, _open)
