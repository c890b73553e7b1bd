"""``OnlineChecks``: the findings that need no future data and the divergence between the policy's commands
and the robot's, fed one step at a time in the order the messages came (``state`` -> ``action``, then the
robot's ``command`` that answers that state). The ROS 2 node's shadow mode feeds it live; ``sac-edge replay``
feeds it from the log; the same inputs give the same figures."""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import numpy as np

from sac_edge.common.io_layout import IoLayout

from .findings import Finding, slots
from .reference import Reference


@dataclass(frozen=True)
class OnlineLimits:
    """When an online finding is raised."""

    gap_periods: float = 3.0
    """A state interval this many typical periods long is a gap (``stale``)."""
    frozen_steps: int = 20
    """A value that moves in training and stays bit-identical this many states in a row, while most of the
    others move, is ``frozen``."""
    out_of_range_fraction: float = 0.01
    """A slot outside the training range on more than this fraction of the states is ``out_of_range``..."""
    out_of_range_min: int = 5
    """... and on at least this many."""
    out_of_range_margin: float = 0.25
    """The training range is widened by this fraction of its width on each side first (a state just past
    the envelope's bounds, which already carry sac-export's margin, is the policy exploring, not a fault)."""
    window: int = 1 << 16
    """Divergence rows and timings kept (the percentiles are of the latest ones)."""


PERIOD_SAMPLES = 101  # the typical period: the median of this many latest intervals
MOVED = 1e-3
"""A slot moved between two states when it changed by more than this fraction of its training spread."""


class OnlineChecks:
    """Online findings and divergence (module docstring) for one layout against one training reference."""

    def __init__(self, layout: IoLayout, reference: Reference, limits: OnlineLimits | None = None) -> None:
        self.layout = layout
        self.reference = reference
        self.limits = limits or OnlineLimits()
        self.slots = slots(layout)
        d, k, window = layout.obs_dim, layout.act_dim, self.limits.window
        self.steps = 0
        self._last_t: int | None = None
        self._state_t: int | None = None
        self._intervals: collections.deque[int] = collections.deque(maxlen=PERIOD_SAMPLES)
        self._all_intervals: collections.deque[int] = collections.deque(maxlen=window)
        self._ages: collections.deque[int] = collections.deque(maxlen=window)
        self.gaps: list[tuple[int, float, float]] = []
        """(step after the gap, its length in s, in typical periods)."""
        self._previous = np.full(d, np.nan, np.float32)
        self._run: np.ndarray = np.zeros(d, np.int64)
        self._longest: np.ndarray = np.zeros(d, np.int64)
        self._longest_from: np.ndarray = np.zeros(d, np.int64)
        self._held: np.ndarray = np.zeros(d, np.float64)
        self._outside: np.ndarray = np.zeros(d, np.int64)
        self._worst = np.full(d, np.nan)
        with np.errstate(invalid="ignore"):
            width = np.nan_to_num(reference.high - reference.low, nan=0.0, posinf=0.0)
        self.low = reference.low - self.limits.out_of_range_margin * width
        self.high = reference.high + self.limits.out_of_range_margin * width
        self._pending: np.ndarray | None = None
        self._divergence = np.zeros((window, k))
        self.compared = 0

    # -- feeding -------------------------------------------------------------------------------------
    def state(self, t_ns: int, obs: np.ndarray) -> None:
        """One state the policy acts on (its observation, gathered through the layout), at ``t_ns``."""
        self._interval(t_ns)
        self.steps += 1
        self._frozen(obs)
        outside = (obs < self.low) | (obs > self.high)
        if outside.any():
            self._outside += outside
            excess = np.where(outside, obs, np.nan)
            worst = np.abs(excess) > np.abs(np.nan_to_num(self._worst, nan=0.0))
            self._worst = np.where(outside & (worst | np.isnan(self._worst)), excess, self._worst)
        self._pending = None

    def action(self, command: np.ndarray) -> None:
        """The command the policy makes of the latest state (layout units, ``IoLayout.command_vector``)."""
        self._pending = np.array(command, dtype=np.float64, copy=True)

    def command(self, t_ns: int, data: Any) -> np.ndarray | None:
        """A command the robot's controller sent; the first after a state is compared with the policy's for
        that state. Returns the policy's command it was compared with (None: not compared)."""
        pending, self._pending = self._pending, None
        values = np.asarray(data, dtype=np.float64).reshape(-1)
        if pending is None or values.shape != pending.shape:
            return None
        self._divergence[self.compared % self.limits.window] = np.abs(values - pending)
        self.compared += 1
        if self._state_t is not None:
            self._ages.append(t_ns - self._state_t)
        return pending

    def _interval(self, t_ns: int) -> None:
        last, self._last_t, self._state_t = self._last_t, t_ns, t_ns
        if last is None:
            return
        interval = t_ns - last
        if len(self._intervals) >= 10:
            typical = float(np.median(self._intervals))
            if typical > 0 and interval > self.limits.gap_periods * typical:
                self.gaps.append((self.steps, interval / 1e9, interval / typical))
        self._intervals.append(interval)
        self._all_intervals.append(interval)

    def _frozen(self, obs: np.ndarray) -> None:
        """A slot's run of bit-identical values grows only on states where most slots moved by more than
        ``MOVED`` of their training spread: a robot at rest holds its values (or jitters them by far less),
        and that is not a frozen channel."""
        same = obs == self._previous
        with np.errstate(invalid="ignore"):
            moved = np.abs(obs - self._previous) > MOVED * self.reference.spread
        moving = int(moved.sum()) * 2 >= len(obs)
        self._run = np.where(same, self._run + moving, 0)
        longer = self._run > self._longest
        if longer.any():
            self._longest = np.where(longer, self._run, self._longest)
            self._longest_from = np.where(longer, self.steps - self._run, self._longest_from)
            self._held = np.where(longer, obs, self._held)
        self._previous[:] = obs

    # -- results -------------------------------------------------------------------------------------
    def divergence(self) -> dict[str, dict[str, float]]:
        """Per action joint: |robot command - policy command| p50, p99 and max over the compared steps kept."""
        rows = self._divergence[: min(self.compared, self.limits.window)]
        out = {}
        for k, joint in enumerate(self.layout.action.joints):
            if len(rows):
                col = rows[:, k]
                out[joint] = {"p50": float(np.percentile(col, 50)), "p99": float(np.percentile(col, 99)),
                              "max": float(col.max())}  # fmt: skip
            else:
                out[joint] = {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
        return out

    def timing(self) -> dict[str, float | None]:
        """The state period (p50), its jitter (p99 of |interval - p50|) and the command's age after its state."""
        out: dict[str, float | None] = {"period_ms": None, "jitter_p99_ms": None}
        if self._all_intervals:
            ms = np.asarray(self._all_intervals, np.float64) / 1e6
            p50 = float(np.median(ms))
            out.update(period_ms=p50, jitter_p99_ms=float(np.percentile(np.abs(ms - p50), 99)))
        ages = np.asarray(self._ages, np.float64) / 1e6
        out["command_age_p50_ms"] = float(np.percentile(ages, 50)) if len(ages) else None
        out["command_age_p99_ms"] = float(np.percentile(ages, 99)) if len(ages) else None
        return out

    def findings(self) -> list[Finding]:
        """The online findings so far: ``stale``, ``frozen``, ``out_of_range``."""
        out = []
        if self.gaps:
            step, seconds, periods = max(self.gaps, key=lambda g: g[1])
            out.append(Finding(
                "stale", self.layout.state_joints,
                f"the state stream stopped {len(self.gaps)}x, the longest {seconds:.3g} s ({periods:.1f} periods) "
                f"before state {step}",
            ))  # fmt: skip
        out += self._by_joint("frozen", self._frozen_slots())
        out += self._by_joint("out_of_range", self._outside_slots())
        return out

    def _frozen_slots(self) -> dict[int, str]:
        moving = self.reference.spread > 0
        found = {}
        for i in np.flatnonzero((self._longest + 1 >= self.limits.frozen_steps) & moving):
            found[int(i)] = (
                f"{self.slots[i].name} held at {self._held[i]:.4g} for {self._longest[i] + 1} states from state "
                f"{self._longest_from[i]} (training std {self.reference.spread[i]:.3g})"
            )
        return found

    def _outside_slots(self) -> dict[int, str]:
        need = max(self.limits.out_of_range_min, self.limits.out_of_range_fraction * self.steps)
        found = {}
        ref = self.reference
        margin = self.limits.out_of_range_margin
        for i in np.flatnonzero(self._outside >= need):
            found[int(i)] = (
                f"{self.slots[i].name} beyond the training range [{ref.low[i]:.3g}, {ref.high[i]:.3g}] by more "
                f"than {margin:.0%} of its width on {100 * self._outside[i] / self.steps:.0f}% of states (up to "
                f"{self._worst[i]:.3g})"
            )
        return found

    def _by_joint(self, kind: str, found: dict[int, str]) -> list[Finding]:
        groups: dict[tuple[str, ...], list[str]] = {}
        for i, text in found.items():
            groups.setdefault(self.slots[i].joints, []).append(text)
        return [Finding(kind, joints, "; ".join(texts)) for joints, texts in groups.items()]

    def slot_flags(self, kind: str) -> set[int]:
        """The slots an online finding of ``kind`` (``frozen``, ``out_of_range``) names."""
        return set(self._frozen_slots() if kind == "frozen" else self._outside_slots())

    def report(self) -> dict[str, Any]:
        """The figures for /diagnostics, the summary's ``shadow`` section and ``--json``."""
        return {
            "states": self.steps,
            "commands_compared": self.compared,
            "divergence": self.divergence(),
            "timing": self.timing(),
            "findings": [f.to_dict() for f in self.findings()],
        }
