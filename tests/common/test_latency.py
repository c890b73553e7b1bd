"""Whole-run latency histograms: within 1% of the exact percentiles, in memory that does not grow."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sac_edge.common.latency import LatencyHistogram, latency_us


@pytest.mark.parametrize("scale", [1e3, 3e4, 2e6])
def test_percentiles_are_within_one_percent_and_extremes_exact(scale: float) -> None:
    rng = np.random.default_rng(0)
    samples = (rng.lognormal(0.0, 1.0, 50_000) * scale).astype(np.int64)
    hist = LatencyHistogram()
    for chunk in np.array_split(samples, 50):  # once a second, as the loop folds
        hist.add(chunk)
    exact = latency_us(samples)
    got = hist.latency_us()
    for q in ("p50", "p99"):
        assert got[q] == pytest.approx(exact[q], rel=0.01, abs=0.011)  # abs: the values are rounded to 10 ns
    assert got["max"] == exact["max"] and got["mean"] == pytest.approx(exact["mean"], rel=1e-9)
    assert got["p50"] <= got["p99"] <= got["max"]
    assert hist.counts.size == LatencyHistogram.BUCKETS and hist.count == samples.size


def test_empty_zero_and_huge_samples() -> None:
    hist = LatencyHistogram()
    assert all(math.isnan(v) for v in hist.latency_us().values())
    hist.add(np.array([0, 0, 10**15]))  # a zero-length interval and one far beyond the last bucket
    summary = hist.latency_us()
    assert summary["p50"] == 0.0 and summary["max"] == 10**12
