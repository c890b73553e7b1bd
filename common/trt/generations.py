"""One code path per TensorRT generation, chosen once from ``tensorrt.__version__``.

=========  ===========================================  ============================================
generation  fp16                                          int8
=========  ===========================================  ============================================
8.5/8.6    ``policy.onnx`` + ``BuilderFlag.FP16``         ``policy.onnx`` + ``calib.cache`` (implicit,
           (weak typing, EXPLICIT_BATCH network)          header rewritten to this TensorRT's version)
                                                          + ``BuilderFlag.INT8``; Q/DQ graph without
                                                          a cache
10.0-10.11 ``policy.onnx`` + ``BuilderFlag.FP16``        ``policy.int8.onnx`` (explicit Q/DQ) +
                                                          ``BuilderFlag.INT8`` (calibration deprecated
                                                          in 10.1)
10.12+     ``policy.fp16.onnx``, ``STRONGLY_TYPED``       ``policy.int8.onnx`` (Q/DQ), ``STRONGLY_TYPED``
           network, no precision flag                     network, no precision flag
11.x       ``policy.fp16.onnx`` (strongly typed: fp16     ``policy.int8.onnx`` (Q/DQ), no precision
           tensors in the graph), no precision flag       flag
=========  ===========================================  ============================================

Sources: 10.13's own docstrings (``BuilderFlag.FP16/INT8``: "Deprecated in TensorRT 10.12. Superseded by
strong typing"; ``tests/trt_surfaces/``); "Migrating from TensorRT 10.x to 11.x" (NVIDIA docs, 11.3/11.4:
``BuilderFlag.FP16/INT8``,
``IBuilderConfig.int8_calibrator``/``set_calibration_profile`` and ``platform_has_fast_fp16/int8`` removed,
networks always strongly typed); "Migrating from TensorRT 8.x to 10.x" (``EXPLICIT_BATCH`` no longer
needed); TensorRT 10.1 release notes (implicit quantization deprecated). TensorRT below 8.5 lacks the
name-based tensor API (``execute_async_v3``, ``set_input_shape``) the runner uses, so it is refused.
Pure Python: the choice is testable without TensorRT.
"""

from __future__ import annotations

from typing import NamedTuple

from ..bundle_format import FP16, FP16_ONNX, INT8, INT8_ONNX, POLICY_ONNX
from ..errors import SacEdgeError
from ..versions import parse_version

SUPPORTED = "8.5/8.6, 10.x or 11.x"


class Generation(NamedTuple):
    """How engines are built on one TensorRT generation."""

    name: str  # "8.5/8.6", "10.x", "10.12+", "11.x": what the manifest and `sac-edge doctor` show
    explicit_batch_flag: bool  # create_network needs EXPLICIT_BATCH (8.x)
    precision_flags: bool  # weak typing: BuilderFlag.FP16 / INT8 exist and enable the precision
    implicit_int8: bool  # calib.cache through an IInt8EntropyCalibrator2 (8.x only, here)
    fp16_onnx: bool  # fp16 comes from policy.fp16.onnx (strong typing) rather than a flag
    strongly_typed_flag: bool = False  # create_network needs STRONGLY_TYPED (10.12+; always on, ignored, in 11)

    def onnx_name(self, precision: str, has_calib_cache: bool) -> str:
        """The bundle file an engine of ``precision`` is built from on this generation."""
        if precision == FP16 and self.fp16_onnx:
            return FP16_ONNX
        if precision == INT8 and not (self.implicit_int8 and has_calib_cache):
            return INT8_ONNX
        return POLICY_ONNX

    def uses_calib_cache(self, precision: str, has_calib_cache: bool) -> bool:
        return precision == INT8 and self.implicit_int8 and has_calib_cache


TRT8 = Generation("8.5/8.6", True, True, True, False)
TRT10 = Generation("10.x", False, True, False, False)
TRT10_STRONG = Generation("10.12+", False, False, False, True, True)
TRT11 = Generation("11.x", False, False, False, True)
GENERATIONS = (TRT8, TRT10, TRT10_STRONG, TRT11)
# The first 10.x whose precision flags are deprecated, superseded by strong typing.
STRONG_TYPING_FROM = (10, 12)


# TensorRT 11.3's release notes list a known issue: an engine built with REFIT can silently drop a
# matrix-multiply bias, and the policy is such an MLP. From 11.3 on (no later notes say it is fixed) engines
# are built without REFIT and a weight swap rebuilds the engine from the graph with the new weights instead;
# the parity gate checks every build and every swap either way, so a dropped bias is refused, not served.
REFIT_BIAS_ISSUE_FROM = (11, 3)


def refit_is_safe(version: str) -> bool:
    """Whether TensorRT ``version`` may build REFIT engines (not from 11.3: the dropped-bias known issue)."""
    return parse_version(version)[:2] < REFIT_BIAS_ISSUE_FROM


def generation(version: str) -> Generation:
    """The code path for TensorRT ``version``; an unsupported one is a one-line error naming the fix."""
    major, minor, _ = parse_version(version)
    if major == 8 and minor >= 5:
        return TRT8
    if major == 10:
        return TRT10_STRONG if (major, minor) >= STRONG_TYPING_FROM else TRT10
    if major == 11:
        return TRT11
    raise SacEdgeError(
        f"TensorRT {version} is not supported; install TensorRT {SUPPORTED} "
        "(JetPack 5.1 ships 8.5.2), or use --backend onnxruntime"
    )
