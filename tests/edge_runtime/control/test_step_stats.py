"""The loop's per-step records: exact per-second percentiles, whole-run histograms, lists reused in place."""

from __future__ import annotations

import numpy as np

from sac_edge.common.latency import latency_us
from sac_edge.edge_runtime.control.step_stats import HISTOGRAM_EDGES_US, StepStats


def test_fold_gives_the_window_exactly_and_keeps_the_run() -> None:
    stats = StepStats()
    add_latency, add_jitter = stats.latency.append, stats.jitter.append
    rng = np.random.default_rng(1)
    all_latency = []
    for _ in range(3):  # three seconds
        window = rng.integers(5_000, 60_000, 1000)
        for ns in window.tolist():
            add_latency(ns)
            add_jitter(ns // 10)
            stats.infer.append(ns)
            stats.env.append(20_000)
            stats.step.append(ns + 20_000 + 7_000)
        lat, jit = stats.fold()
        assert lat == latency_us(window) and jit == latency_us(window // 10)
        assert not stats.latency and not stats.step  # emptied in place: the loop's bound appends still work
        all_latency.append(window)
    breakdown = stats.breakdown()
    assert breakdown["loop_work_us"]["p50"] == 7.0 and breakdown["env_step_us"]["max"] == 20.0
    assert stats.run_percentiles_us("latency")["max"] == latency_us(np.concatenate(all_latency))["max"]
    hist = breakdown["histogram_us"]
    assert hist["edges"] == list(HISTOGRAM_EDGES_US) and sum(hist["step"]) == sum(hist["late_wakeup"]) == 3000
