"""Activation calibrators: each turns the values a tensor took on the calibration states into ``amax``,
the clipping threshold of symmetric INT8 (scale = amax / 127).

Our own numpy, not ``onnxruntime.quantization``'s calibraters: those build and run their own augmented
model per call, and ORT's entropy calibrater defaults to 128 histogram bins over a signed range, not
TensorRT's 2048-bin search over |x|. Here the activations are collected once (``session.collect_activations``)
and every method reads the same arrays, so methods can be mixed per tensor at no extra cost.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from sac_edge.common.errors import SacEdgeError

METHODS = ("minmax", "percentile", "entropy")
ENTROPY_BINS = 2048
QUANT_BINS = 128  # int8: 127 magnitudes + sign -> TensorRT merges into 128 bins


def amax_minmax(values: np.ndarray) -> float:
    """The largest magnitude seen: no clipping, coarsest resolution."""
    return float(np.max(np.abs(values))) if values.size else 0.0


def amax_percentile(values: np.ndarray, percentile: float = 99.99) -> float:
    """The ``percentile``-th percentile of |x| (exact, not binned): clips the rare outliers."""
    if not 0.0 < percentile <= 100.0:
        raise SacEdgeError(f"percentile must be in (0, 100], got {percentile}")
    return float(np.percentile(np.abs(values), percentile)) if values.size else 0.0


def amax_entropy(values: np.ndarray, bins: int = ENTROPY_BINS, quant_bins: int = QUANT_BINS) -> float:
    """TensorRT's entropy calibration: the threshold whose 128-level quantisation of the |x| histogram has
    the least KL divergence from the (clipped) original.

    Algorithm of "8-bit Inference with TensorRT" (Migacz, GTC 2017), as NVIDIA's pytorch-quantization
    implements it (NVIDIA/TensorRT tools/pytorch-quantization/pytorch_quantization/calib/histogram.py,
    ``_compute_amax_entropy``): a 2048-bin histogram of |x| over [0, max|x|]; for each candidate i in
    128..2048 the reference P is bins[:i] with the outliers bins[i:] added to its last bin, the candidate Q
    merges bins[:i] into 128 levels and spreads each level evenly over its non-empty source bins; the
    threshold is the upper edge of bin i with the least KL(P||Q) (the last such i on ties). Like
    pytorch-quantization, bin 0 is given bin 1's count first: half of a ReLU output is exact zeros, and
    that spike would otherwise dominate the divergence and pull the threshold far too low (measured here:
    5x the action error of min-max on a Pendulum actor without it, on par with min-max with it).
    """
    mags = np.abs(values).ravel()
    top = float(mags.max()) if mags.size else 0.0
    if top == 0.0:
        return 0.0
    hist, edges = np.histogram(mags, bins=bins, range=(0.0, top))
    hist = hist.astype(np.float64)
    hist[0] = hist[1]
    best_i, best_kl = bins, np.inf
    for i in range(quant_bins, bins + 1):
        ref = hist[:i].copy()
        ref[-1] += hist[i:].sum()
        level = (np.arange(i) * quant_bins) // i  # source bin -> quantised level
        nonzero = hist[:i] > 0
        level_sum = np.bincount(level, weights=hist[:i], minlength=quant_bins)
        level_n = np.bincount(level, weights=nonzero, minlength=quant_bins)
        cand = np.where(nonzero, level_sum[level] / np.maximum(level_n[level], 1), 0.0)
        kl = _kl(ref, cand)
        if kl <= best_kl:
            best_i, best_kl = i, kl
    return float(edges[best_i])


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """KL(p || q) of two unnormalised histograms; infinite where p has mass and q none."""
    p = p / p.sum()
    q_sum = q.sum()
    if q_sum == 0:
        return np.inf
    q = q / q_sum
    mask = p > 0
    if np.any(q[mask] == 0):
        return np.inf
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def compute_amax(
    activations: Mapping[str, np.ndarray],
    method: str = "entropy",
    *,
    overrides: Mapping[str, str] | None = None,
    percentile: float = 99.99,
) -> dict[str, float]:
    """``amax`` per tensor: ``method`` for all, or ``overrides[tensor]`` where given."""
    overrides = dict(overrides or {})
    for name, chosen in [("(default)", method), *overrides.items()]:
        if chosen not in METHODS:
            raise SacEdgeError(f"calibration method {chosen!r} for {name} is unknown; choose one of {METHODS}")
    unknown = sorted(set(overrides) - set(activations))
    if unknown:
        raise SacEdgeError(f"calibration overrides name tensors that are not calibrated: {', '.join(unknown)}")
    out: dict[str, float] = {}
    for name, values in activations.items():
        chosen = overrides.get(name, method)
        if chosen == "minmax":
            out[name] = amax_minmax(values)
        elif chosen == "percentile":
            out[name] = amax_percentile(values, percentile)
        else:
            out[name] = amax_entropy(values)
    return out
