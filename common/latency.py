"""Latency figures in one shape for the loop, telemetry, auto-selection and bench (microseconds)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def latency_us(samples_ns: np.ndarray) -> dict[str, float]:
    """p50 / p99 / max / mean in microseconds of nanosecond samples (NaN when there are none)."""
    if len(samples_ns) == 0:
        nan = float("nan")
        return {"p50": nan, "p99": nan, "max": nan, "mean": nan}
    us = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    p50, p99 = np.percentile(us, [50, 99])
    return {
        "p50": round(float(p50), 2),
        "p99": round(float(p99), 2),
        "max": round(float(us.max()), 2),
        "mean": round(float(us.mean()), 2),
    }


def time_calls(fn: Callable[[int], object], calls: int, warmup: int) -> np.ndarray:
    """Per-call wall time (ns) of ``fn(i)`` for ``calls`` timed calls after ``warmup`` untimed ones."""
    for i in range(warmup):
        fn(i)
    out: np.ndarray = np.empty(calls, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(calls):
        start = clock()
        fn(i)
        out[i] = clock() - start
    return out


class Samples:
    """A growable int64 sample store (doubling, so appends are amortised O(1) with rare reallocations)."""

    def __init__(self, capacity: int = 4096) -> None:
        self._data: np.ndarray = np.empty(max(capacity, 16), dtype=np.int64)
        self.count = 0

    def add(self, value: int) -> None:
        if self.count == len(self._data):
            self._data = np.concatenate([self._data, np.empty_like(self._data)])
        self._data[self.count] = value
        self.count += 1

    def view(self, start: int = 0) -> np.ndarray:
        """Samples from index ``start`` on (a view, no copy)."""
        return self._data[start : self.count]
