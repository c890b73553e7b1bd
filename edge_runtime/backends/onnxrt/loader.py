"""onnxruntime as the registry sees it: the CPU, CUDA and TensorRT execution providers, what each can run
from a bundle, and how each session is opened."""

from __future__ import annotations

from pathlib import Path

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import ENGINES_DIR, FP16, FP32, INT8, ORT_TRT_CACHE, PRECISIONS
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.versions import parse_version

from ..base import Backend, BackendKind, BackendOptions
from .runner import INPUT, OrtBackend, import_ort


def _unavailable(provider: str) -> str | None:
    try:
        ort = import_ort()
    except ImportError:
        return "the Python package 'onnxruntime' is not installed (pip install onnxruntime)"
    if provider not in ort.get_available_providers():
        return f"this onnxruntime build has no {provider} (install onnxruntime-gpu built with it)"
    return None


def _onnx_precisions(bundle: Bundle) -> tuple[str, ...]:
    return tuple(p for p in PRECISIONS if bundle.onnx(p) is not None)


def _cpu_precisions(bundle: Bundle) -> tuple[str, ...]:
    """No fp16 on the CPU provider: without fp16 arithmetic it is no faster than fp32, so the governor's
    cheaper-precision step would buy nothing, and 1.16's arm64 build cannot load it (BENCHMARKS.md, "Edge:
    aarch64 under emulation")."""
    return tuple(p for p in _onnx_precisions(bundle) if p != FP16)


def _trt_ep_precisions(bundle: Bundle) -> tuple[str, ...]:
    """TensorRT builds fp16 from the fp32 graph; int8 from the explicit Q/DQ graph."""
    have = _onnx_precisions(bundle)
    return tuple(p for p in PRECISIONS if p in have or (p == FP16 and FP32 in have))


def _model(bundle: Bundle, precision: str, backend: str) -> Path:
    if backend == "onnxruntime":
        path = bundle.cpu_onnx(precision)
    else:
        path = bundle.onnx(precision) or (bundle.onnx(FP32) if backend == "onnxruntime-tensorrt" else None)
    if path is None:
        raise SacEdgeError(f"{bundle.path}: no {precision} ONNX graph in the bundle for backend {backend!r}")
    return path


def _open_cpu(bundle: Bundle, precision: str, options: BackendOptions) -> Backend:
    return OrtBackend(
        "onnxruntime", bundle, precision, _model(bundle, precision, "onnxruntime"), ["CPUExecutionProvider"], options
    )


def _open_cuda(bundle: Bundle, precision: str, options: BackendOptions) -> Backend:
    return OrtBackend(
        "onnxruntime-cuda",
        bundle,
        precision,
        _model(bundle, precision, "onnxruntime-cuda"),
        ["CUDAExecutionProvider", "CPUExecutionProvider"],
        options,
    )


# The TensorRT provider's engine covers batch 1..TRT_EP_MAX_BATCH (as the TensorRT backend's profiles do);
# act_batch runs larger batches in chunks of it.
TRT_EP_MAX_BATCH = 64
# onnxruntime takes explicit TensorRT profiles (trt_profile_min/opt/max_shapes, microsoft/onnxruntime#15546)
# from 1.16 at the latest; before, the provider builds its engine for the shapes it has seen and rebuilds it
# when a batch size outside them arrives.
TRT_EP_PROFILES_FROM = (1, 16)


def trt_ep_profile(obs_dim: int, ort_version: str) -> dict[str, str]:
    """The TensorRT provider options that fix its engine's profile to batch 1..TRT_EP_MAX_BATCH (opt 1, the
    control loop's batch), or none where this onnxruntime cannot take them."""
    if parse_version(ort_version, "onnxruntime")[:2] < TRT_EP_PROFILES_FROM:
        return {}
    shape = {batch: f"{INPUT}:{batch}x{obs_dim}" for batch in (1, TRT_EP_MAX_BATCH)}
    return {
        "trt_profile_min_shapes": shape[1],
        "trt_profile_opt_shapes": shape[1],
        "trt_profile_max_shapes": shape[TRT_EP_MAX_BATCH],
    }


def _open_trt(bundle: Bundle, precision: str, options: BackendOptions) -> Backend:
    cache = options.engine_dir or bundle.path / ENGINES_DIR
    cache.mkdir(parents=True, exist_ok=True)
    profile = trt_ep_profile(bundle.spec.obs_dim, import_ort().__version__)
    trt_options = {
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": str(cache / ORT_TRT_CACHE),
        "trt_fp16_enable": precision != FP32,
        "trt_int8_enable": precision == INT8,
        **profile,
    }
    return OrtBackend(
        "onnxruntime-tensorrt",
        bundle,
        precision,
        _model(bundle, precision, "onnxruntime-tensorrt"),
        [("TensorrtExecutionProvider", trt_options), "CUDAExecutionProvider", "CPUExecutionProvider"],
        options,
        max_batch=TRT_EP_MAX_BATCH if profile else None,
    )


#: The CPU provider is the parity gate's own reference path: ungated. The GPU providers' sessions are
#: gated at every precision, at open and on every swap (``registry.open_backend``).
CPU = BackendKind("onnxruntime", lambda: _unavailable("CPUExecutionProvider"), _cpu_precisions, _open_cpu)
CUDA = BackendKind(
    "onnxruntime-cuda", lambda: _unavailable("CUDAExecutionProvider"), _onnx_precisions, _open_cuda, PRECISIONS
)
TENSORRT_EP = BackendKind(
    "onnxruntime-tensorrt",
    lambda: _unavailable("TensorrtExecutionProvider"),
    _trt_ep_precisions,
    _open_trt,
    PRECISIONS,
)
