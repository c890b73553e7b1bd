"""A caller that never calls ``tick`` (no budgets: it has no reason to) runs for days at 1 kHz in
memory that does not grow (issue 42, item 10): the step statistics live in fixed-size structures,
folded into the run's histograms as they fill, whether or not ``tick`` is called."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sac_edge.edge_runtime.runtime import BackendSection, Runtime, RuntimeOptions

CALLS = 300_000
WARM = 100_000
"""Calls before the first reading: the window's structures (folded every 4096 steps) reach their size by then."""


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_many_steps_without_tick_keep_memory_flat(clean_bundle: Path) -> None:
    options = RuntimeOptions(str(clean_bundle), backend=BackendSection(kind="onnxruntime"), shield=None)
    obs = np.array([0.1, 0.2, 0.3], np.float32)
    with Runtime(options) as runtime:
        act = runtime.act
        for _ in range(WARM):
            act(obs)
        before = _rss_bytes()
        for _ in range(CALLS - WARM):
            act(obs)
        grown = _rss_bytes() - before
        summary = runtime.summary()
    assert summary.steps == CALLS
    # the lists of d879073 grew ~47 bytes a step: 9 MB over these 200k steps, twice the limit
    assert grown < 4 * 2**20, f"memory grew {grown / 2**20:.1f} MiB over {CALLS - WARM} act calls without tick"
    assert summary.latency_us["p50"] > 0  # the steps are in the run's latency without a tick
