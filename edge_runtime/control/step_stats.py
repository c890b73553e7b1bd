"""Where the control loop's time goes, per step, in memory that does not grow with the run.

Each step appends five integers (nanoseconds) to Python lists, the window: an append is the cheapest
record the interpreter has (BENCHMARKS.md "Edge: the action in the control loop"). Once a second
(``fold``, from ``Runtime.tick``) the window's lists become arrays, the second's exact percentiles are
taken from them, and they are folded into whole-run ``LatencyHistogram``s and fixed-edge histograms. A
caller that never ticks (no budgets: no reason to) has its window folded by ``bound`` once it holds
``WINDOW_CAP`` steps, so memory stays at kilobytes for days at any rate, ticked or not; above
``WINDOW_CAP`` steps a second, a ticked second's percentiles then cover the steps since that fold.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sac_edge.common.latency import LatencyHistogram, latency_us

MISS_CAUSES = ("late_wakeup", "inference", "env", "loop")
HISTOGRAM_EDGES_US = (0, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
WINDOW_CAP = 4096
"""The most steps the window holds before ``bound`` folds it: a bound on both a fold's time and the window's memory."""


def miss_cause(wake_ns: int, inference_ns: int, env_ns: int, loop_ns: int) -> str:
    """What a missed deadline is blamed on: the largest of the wake-up lateness, the inference, the env's
    step (and reset) and the loop's own work (guards, hooks, bookkeeping, and whatever preempted them)."""
    parts = (wake_ns, inference_ns, env_ns, loop_ns)
    return MISS_CAUSES[max(range(len(parts)), key=parts.__getitem__)]


class StepStats:
    """The current second's per-step timings and the whole run's histograms."""

    def __init__(self) -> None:
        self.jitter: list[int] = []
        """Wake-up lateness: how long after its slot each step started."""
        self.latency: list[int] = []
        """Inference time of the steps that inferred (a held observation does not)."""
        self.infer: list[int] = []
        """Inference time of every step, 0 when held (so ``step - infer - env`` is the loop's own work)."""
        self.env: list[int] = []
        """The env's step (and reset) time."""
        self.step: list[int] = []
        """Wall time of the step, from the slot's start to the next observation."""
        self.run = {name: LatencyHistogram() for name in ("latency", "jitter", "loop_work", "env_step")}
        self._edges = np.array([*HISTOGRAM_EDGES_US, np.inf])
        self.coarse: dict[str, np.ndarray] = {
            name: np.zeros(len(HISTOGRAM_EDGES_US), np.int64) for name in ("late_wakeup", "step")
        }
        self.causes = dict.fromkeys(MISS_CAUSES, 0)

    def fold(self) -> tuple[dict[str, float], dict[str, float]]:
        """Fold the window into the run's histograms and start a new one; the window's exact latency and
        jitter percentiles (microseconds) are returned for its telemetry record."""
        jitter, latency = np.array(self.jitter, np.int64), np.array(self.latency, np.int64)
        step, infer, env = (np.array(x, np.int64) for x in (self.step, self.infer, self.env))
        for series in (self.jitter, self.latency, self.infer, self.env, self.step):
            series.clear()  # in place: the loop holds their bound append methods
        work = step - infer[: len(step)] - env  # a step cut short after its inference has no step time
        for name, values in (("latency", latency), ("jitter", jitter), ("loop_work", work), ("env_step", env)):
            self.run[name].add(values)
        for name, values in (("late_wakeup", jitter), ("step", step)):
            self.coarse[name] += np.histogram(values / 1000.0, self._edges)[0]
        return latency_us(latency), latency_us(jitter)

    def bound(self) -> None:
        """Fold the window if it holds ``WINDOW_CAP`` steps or more: whole when a scheduler records its
        series too (they line up step by step), else the inference times alone, into the run's histograms."""
        if len(self.infer) < WINDOW_CAP:
            return
        if self.step or self.jitter:
            self.fold()
            return
        self.run["latency"].add(np.array(self.latency, np.int64))
        self.latency.clear()
        self.infer.clear()

    def breakdown(self) -> dict[str, Any]:
        """Where the run's steps went: the loop's own work (a step less its inference and env step), the
        env step, the misses by cause, and histograms of wake-up lateness and step duration (us)."""
        return {
            "loop_work_us": self.run["loop_work"].latency_us(),
            "env_step_us": self.run["env_step"].latency_us(),
            "miss_causes": dict(self.causes),
            "histogram_us": {"edges": list(HISTOGRAM_EDGES_US), **{k: v.tolist() for k, v in self.coarse.items()}},
        }

    def run_percentiles_us(self, name: str) -> dict[str, float]:
        """Whole-run p50 / p99 / max / mean (us) of ``latency``, ``jitter``, ``loop_work`` or ``env_step``."""
        return self.run[name].latency_us()
