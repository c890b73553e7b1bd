"""How far an fp32 or fp16 engine or graph may be from the fp32 ONNX, shared by sac-export (the fp16 graph's
CPU parity) and the edge runtime's engine parity gate, which must not import torch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .bundle_format import FP16, FP32

# Max abs action error as a fraction of the widest action range: an fp32 engine may use TF32 tensor cores
# on Ampere and later (TensorRT's default) and reorders sums; fp16 keeps ~3 decimal digits through three
# layers and a tanh. INT8 is judged by the accuracy gate's mean action-error rule instead.
TOLERANCE_FRAC = {FP32: 1e-3, FP16: 1e-2}


def tolerance(precision: str, low: Sequence[float], high: Sequence[float]) -> float:
    """Max abs action error allowed for an fp32 or fp16 engine/graph against the fp32 ONNX, in env units."""
    span = float(np.max(np.asarray(high, np.float64) - np.asarray(low, np.float64)))
    return TOLERANCE_FRAC[precision] * span
