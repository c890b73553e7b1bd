"""Latency summaries in one shape for the loop, telemetry, auto-selection and bench (microseconds)."""

from __future__ import annotations

import math
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


def _p50_us(fn: Callable[[], object], calls: int) -> float:
    """The median wall time of ``calls`` calls of ``fn`` (us; a bare loop: no wrapper call in the timing)."""
    out = np.empty(calls)
    clock = time.perf_counter_ns
    for i in range(calls):
        start = clock()
        fn()
        out[i] = clock() - start
    return float(np.median(out)) / 1000.0


def interleaved(fns: dict[str, Callable[[], object]], calls: int = 2000, rounds: int = 5) -> dict[str, float]:
    """p50 (us) of each function, timed in alternating rounds (A B A B ...) so drift hits all alike (the
    benchmarks' same-run references)."""
    for fn in fns.values():
        for _ in range(200):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(_p50_us(fn, calls))
    return {name: round(float(np.median(v)), 2) for name, v in samples.items()}


class LatencyHistogram:
    """Whole-run latency percentiles in bounded memory: log-spaced buckets 1% wide plus the exact extremes.

    The control loop may run for days at 1 kHz; keeping every sample (8 bytes each, several series) would
    grow without bound on a device with a few GiB. This is HdrHistogram's idea in a few lines of numpy:
    percentiles within 1% of the exact value, max and mean exact, memory fixed (about 20 KiB).
    """

    STEP = 1.01
    BUCKETS = 2600
    """Bucket ``i`` (i >= 1) holds [STEP**(i-1), STEP**i) ns; the last one everything above ~10 min."""

    def __init__(self) -> None:
        self.counts: np.ndarray = np.zeros(self.BUCKETS, dtype=np.int64)
        self.count = 0
        self.total_ns = 0
        self.min_ns: int | None = None
        self.max_ns = 0

    def add(self, samples_ns: np.ndarray) -> None:
        """Fold in a batch of nanosecond samples (the loop does it once a second)."""
        if len(samples_ns) == 0:
            return
        ns = np.asarray(samples_ns, dtype=np.int64)
        index: np.ndarray = np.ones(len(ns), dtype=np.int64)
        positive = ns >= 1
        index[positive] += np.floor(np.log(ns[positive]) / np.log(self.STEP)).astype(np.int64)
        index[~positive] = 0
        self.counts += np.bincount(np.minimum(index, self.BUCKETS - 1), minlength=self.BUCKETS)
        self.count += len(ns)
        self.total_ns += int(ns.sum())
        low, high = int(ns.min()), int(ns.max())
        self.min_ns = low if self.min_ns is None else min(self.min_ns, low)
        self.max_ns = max(self.max_ns, high)

    def percentile_ns(self, q: float) -> float:
        """The ``q``-th percentile (0..100): the middle of the bucket holding that rank, within the extremes."""
        assert self.count and self.min_ns is not None
        rank = max(1, math.ceil(q / 100.0 * self.count))
        i = int(np.searchsorted(np.cumsum(self.counts), rank))
        middle = 0.0 if i == 0 else self.STEP ** (i - 0.5)
        return min(max(middle, float(self.min_ns)), float(self.max_ns))

    def latency_us(self) -> dict[str, float]:
        """The ``latency_us`` shape: p50 / p99 / max / mean in microseconds (NaN when empty)."""
        if not self.count:
            return latency_us(np.empty(0))
        return {
            "p50": round(self.percentile_ns(50) / 1000.0, 2),
            "p99": round(self.percentile_ns(99) / 1000.0, 2),
            "max": round(self.max_ns / 1000.0, 2),
            "mean": round(self.total_ns / self.count / 1000.0, 2),
        }
