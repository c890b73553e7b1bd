"""TensorRT as the registry sees it: whether it can run here, which precisions a bundle offers, how to open it."""

from __future__ import annotations

import importlib.util

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import CALIB_KIND, FP16, FP32, INT8, PLAN_KIND, PRECISIONS

from ..base import BackendKind
from .runner import TensorRTBackend


def _unavailable() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return "the Python package 'tensorrt' is not installed (TensorRT >= 8.5: sudo apt install python3-libnvinfer)"
    from sac_edge.common.trt.api import import_problem
    from sac_edge.common.trt.builder import cuda_problem

    problem = import_problem() or cuda_problem()
    if problem is not None:
        return problem
    if importlib.util.find_spec("cuda") is None and importlib.util.find_spec("pycuda") is None:
        return "neither 'cuda-python' nor 'pycuda' is installed (pip install pycuda, or 'cuda-python<13' on CUDA 12)"
    return None


def _precisions(bundle: Bundle) -> tuple[str, ...]:
    have = {p for p in (FP32, INT8) if bundle.onnx(p) is not None} | set(
        bundle.manifest["files"][n].get("precision") for n in bundle.files(PLAN_KIND)
    )
    out = []
    if FP32 in have:
        out += [FP32, FP16]
    if INT8 in have or (FP32 in have and bundle.files(CALIB_KIND)):
        out.append(INT8)
    return tuple(out)


#: Every engine, built or cached, and every refit or rebuild is gated (``registry.open_backend``).
KIND = BackendKind("tensorrt", _unavailable, _precisions, lambda b, p, o: TensorRTBackend(b, p, o), PRECISIONS)
