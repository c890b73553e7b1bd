"""The node's step counts and times (``StepStats``), and its status report (``status_report``): what
/diagnostics shows and the summary holds."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Step times kept for the percentiles (a ring: the step only writes one slot).
WINDOW = 4096


class StepStats:
    """Per-step counts and times: step time (callback to publish), deadline misses, stale steps by input."""

    def __init__(self) -> None:
        self._took_ns: np.ndarray = np.zeros(WINDOW, np.int64)
        self.steps = self.misses = self.stale_steps = self.invalid_states = self.qos_incompatible = 0
        self.stale_by: dict[str, int] = {}
        self.timed = 0

    def took(self, ns: int) -> None:
        self._took_ns[self.timed % WINDOW] = ns
        self.timed += 1

    def stale(self, name: str) -> None:
        self.stale_steps += 1
        self.stale_by[name] = self.stale_by.get(name, 0) + 1

    def step_percentiles_us(self) -> dict[str, float]:
        """p50 and p99 of the last ``WINDOW`` step times (off the step: /diagnostics and the summary call it)."""
        n = min(self.timed, WINDOW)
        if not n:
            return {"step_p50_us": math.nan, "step_p99_us": math.nan}
        p50, p99 = np.percentile(self._took_ns[:n], (50, 99)) / 1e3
        return {"step_p50_us": float(p50), "step_p99_us": float(p99)}


def status_report(state: str, stats: StepStats, runtime: Any, summary: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """The node's counts and times and the runtime's (``summary``: the final one, else the runtime's so far)."""
    if summary is None and runtime is not None:
        summary = runtime.summary()
    out: dict[str, Any] = {"state": state, "steps": stats.steps, **stats.step_percentiles_us()}
    out.update(
        deadline_misses=stats.misses,
        stale_steps=stats.stale_steps,
        stale_by=dict(stats.stale_by),
        invalid_states=stats.invalid_states,
        qos_incompatible=stats.qos_incompatible,
        **extra,
    )
    if summary is not None:
        shield = dict(summary.shield)
        out.update(
            backend=summary.backend.get("backend"),
            precision=summary.precision,
            inference_p50_us=summary.latency_us.get("p50"),
            inference_p99_us=summary.latency_us.get("p99"),
            inference_overruns=summary.inference_overruns,
            held_steps=summary.obs_held,  # Runtime.hold's steps (the stale ones) and held observations
            shield_fallbacks=shield.get("fallbacks", 0),
            shield_fallback_steps=shield.get("fallback_steps", 0),
            shield_ramps=shield.get("ramps", 0),
            falling_back=bool(runtime is not None and runtime.shield is not None and runtime.shield.falling_back),
            rate_hz=summary.final_rate_hz,
            governor_events=summary.budget_events,
            peak_rss_mb=summary.peak_rss_mb,
            transitions=summary.transitions,
            episodes=summary.episodes,
            finetune=summary.finetune is not None,
            stopped_by=summary.stopped_by,
        )
    return out
