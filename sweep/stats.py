"""Aggregates that can be trusted across seeds: the interquartile mean with a 95% bootstrap interval.

The rliable convention (Agarwal et al., 2021): IQM = mean of the middle 50% of runs
(``scipy.stats.trim_mean(x, 0.25)``), its interval a percentile bootstrap stratified by task. A sweep
point is one task, so its stratum is its seeds and scipy's ``bootstrap`` resamples them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 5000


class Interval(NamedTuple):
    """IQM and its 95% interval; ``low``/``high`` are None with fewer than two values (no spread to resample)."""

    iqm: float
    low: float | None
    high: float | None


def iqm(values: Any, axis: int = -1) -> Any:
    """Interquartile mean along ``axis`` (25% cut from each end)."""
    return stats.trim_mean(values, 0.25, axis=axis)


def iqm_interval(values: Sequence[float], seed: int = 0) -> Interval:
    """IQM of ``values`` with a 95% percentile-bootstrap interval (seeded, so a summary is reproducible)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no values")
    point = float(iqm(x))
    if x.size < 2:
        return Interval(point, None, None)
    res = stats.bootstrap(
        (x,),
        iqm,
        confidence_level=CONFIDENCE,
        n_resamples=RESAMPLES,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return Interval(point, float(res.confidence_interval.low), float(res.confidence_interval.high))
