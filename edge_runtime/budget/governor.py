"""The budget governor: keeps ``--mem-budget-mb`` and ``--power-budget-w`` by stepping down a fixed ladder.

The ladder is built once (:func:`build_ladder`). Level 0 is the configuration asked for; each level
below changes one knob, in this order:

1. ``finetune_rate``  - lower the fine-tuner's update rate (``Knobs.update_rate_scale``: 1 -> 0.5 -> 0.25)
2. ``finetune_batch`` - halve the fine-tuning batch, down to ``min_finetune_batch``
3. ``finetune_pause`` - pause fine-tuning (experience is still collected)
4. ``precision``      - a cheaper precision, fp32 -> fp16 -> int8, among those the bundle's gate accepted
5. ``control_rate``   - lower the control rate by ``rate_factor`` per level, down to ``min_rate_hz``

Steps that do not apply are left out: 1-3 without fine-tuning, 4 with one precision, 5 when the rate
is already at the floor. Recovery walks the same ladder upwards, so knobs come back in reverse order.

Hysteresis: a budget counts as exceeded on a sample above it; ``degrade_after`` consecutive exceeded
samples move one level down (and the count restarts, which gives the change time to show). Recovery
needs ``recover_after`` consecutive samples with every enforced budget below ``budget * (1 - headroom)``;
a sample between the two lines resets both counts, so one noisy sample never moves the governor. A
missing or non-finite reading is no evidence either way: it degrades nothing and blocks recovery.
Exceeding a budget at the lowest level is reported once as ``unmeetable`` (re-armed after the budgets
are met again); the governor keeps running and never raises from ``tick``.

Use from the control loop, about once a second::

    governor = Governor(GovernorConfig(mem_budget_mb=600, power_budget_w=10), build_ladder(...))
    events = governor.tick(time.monotonic(), sensor_reading_or_None, memory_sample.budget_mb)
    knobs = governor.knobs    # apply rate_hz / precision; the fine-tuner reads the rest

``Knobs`` is frozen and ``governor.knobs`` is a single attribute read, so another thread (the
fine-tuner) may read it at any time without a lock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, NamedTuple

from sac_edge.common.bundle_format import FP32, PRECISIONS
from sac_edge.common.errors import SacEdgeError

from .sensors.base import PowerReading

EventKind = Literal["degrade", "recover", "unmeetable"]


@dataclass(frozen=True)
class Knobs:
    """What the governor controls; consumers apply these values as they are."""

    #: multiply the fine-tuner's nominal update rate (updates per collected step) by this
    update_rate_scale: float
    #: fine-tuning batch size; None when no fine-tuning runs
    finetune_batch: int | None
    #: True: make no updates (keep collecting experience)
    finetune_paused: bool
    #: backend precision to serve; always one the bundle's accuracy gate accepted
    precision: str
    #: control loop rate
    rate_hz: float


@dataclass(frozen=True)
class Level:
    """One rung: its knobs, and which step/knob changed from the rung above (None for level 0)."""

    index: int
    knobs: Knobs
    step: str | None
    knob: str | None


def build_ladder(
    rate_hz: float,
    precision: str = FP32,
    precisions: Sequence[str] | None = None,
    *,
    min_rate_hz: float | None = None,
    finetune_batch: int | None = None,
    min_finetune_batch: int = 32,
    update_rate_scales: Sequence[float] = (0.5, 0.25),
    rate_factor: float = 0.5,
) -> tuple[Level, ...]:
    """The levels from the asked-for configuration (level 0) to the cheapest one.

    ``precision`` is the one being served; ``precisions`` those the gate accepted (default: only it).
    ``finetune_batch=None`` means fine-tuning is off. ``min_rate_hz`` defaults to a quarter of the rate.
    """
    if not rate_hz > 0:
        raise SacEdgeError(f"rate must be positive, got {rate_hz} Hz")
    accepted = tuple(precisions) if precisions is not None else (precision,)
    for name in (precision, *accepted):
        if name not in PRECISIONS:
            raise SacEdgeError(f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}")
    if precision not in accepted:
        raise SacEdgeError(f"precision {precision} is not among those the gate accepted ({', '.join(accepted)})")
    floor = rate_hz / 4 if min_rate_hz is None else min_rate_hz
    if not 0 < floor <= rate_hz:
        raise SacEdgeError(f"the minimum control rate must be in (0, {rate_hz}] Hz, got {floor}")
    if not 0 < rate_factor < 1:
        raise SacEdgeError(f"rate_factor must be in (0, 1), got {rate_factor}")
    scales = list(update_rate_scales)
    if any(not 0 < s < 1 for s in scales) or scales != sorted(scales, reverse=True):
        raise SacEdgeError(f"update_rate_scales must decrease within (0, 1), got {scales}")
    if finetune_batch is not None and not 1 <= min_finetune_batch <= finetune_batch:
        raise SacEdgeError(
            f"need 1 <= min_finetune_batch <= finetune_batch, got {min_finetune_batch}, {finetune_batch}"
        )

    levels = [Level(0, Knobs(1.0, finetune_batch, False, precision, float(rate_hz)), None, None)]

    def add(step: str, knob: str, value: Any) -> None:
        knobs = replace(levels[-1].knobs, **{knob: value})
        levels.append(Level(len(levels), knobs, step, knob))

    if finetune_batch is not None:
        for scale in scales:
            add("finetune_rate", "update_rate_scale", scale)
        batch = finetune_batch
        while batch // 2 >= min_finetune_batch:
            batch //= 2
            add("finetune_batch", "finetune_batch", batch)
        add("finetune_pause", "finetune_paused", True)
    for name in PRECISIONS[PRECISIONS.index(precision) + 1 :]:
        if name in accepted:
            add("precision", "precision", name)
    rate = float(rate_hz)
    while rate > floor:
        rate = max(float(floor), rate * rate_factor)
        add("control_rate", "rate_hz", rate)
    return tuple(levels)


@dataclass(frozen=True)
class GovernorConfig:
    """Budgets (None: not enforced) and the hysteresis that guards them."""

    mem_budget_mb: float | None = None
    power_budget_w: float | None = None
    degrade_after: int = 3
    recover_after: int = 5
    headroom: float = 0.10

    def __post_init__(self) -> None:
        for name, budget in (("--mem-budget-mb", self.mem_budget_mb), ("--power-budget-w", self.power_budget_w)):
            if budget is not None and not (math.isfinite(budget) and budget > 0):
                raise SacEdgeError(f"{name} must be a positive number, got {budget}")
        if self.degrade_after < 1 or self.recover_after < 1:
            raise SacEdgeError("degrade_after and recover_after must be at least 1 sample")
        if not 0 <= self.headroom < 1:
            raise SacEdgeError(f"headroom must be in [0, 1), got {self.headroom}")


@dataclass(frozen=True)
class GovernorEvent:
    """One transition (or the one-off unmeetable report), with the readings that caused it."""

    time: float
    kind: EventKind
    from_level: int
    to_level: int
    step: str | None
    knob: str | None
    old_value: float | int | bool | str | None
    new_value: float | int | bool | str | None
    reason: str
    power_w: float | None
    power_measured: bool | None
    power_source: str | None
    power_budget_w: float | None
    memory_mb: float | None
    mem_budget_mb: float | None

    def to_dict(self) -> dict[str, Any]:
        """A telemetry JSONL record."""
        return {"event": "governor", **asdict(self)}


def event_line(event: dict[str, Any]) -> str:
    """One line for the terminal from an event's telemetry record: what changed, which budget, the readings,
    and, when an estimated power reading was over its budget, that it is an estimate and what to do."""
    if event["kind"] == "unmeetable":
        said = f"governor: {event['reason']}"
    else:
        verb = "lowered" if event["kind"] == "degrade" else "restored"
        said = f"governor {verb} {event['knob']} {event['old_value']} -> {event['new_value']}: {event['reason']}"
    power, budget = event.get("power_w"), event.get("power_budget_w")
    if event["kind"] != "recover" and event.get("power_measured") is False and power and budget and power > budget:
        said += (
            " (an estimate from the CPU load of the whole machine, other processes included, not a measurement:"
            " enforced because --enforce-estimated-power is set)"
        )
    return said


class _Check(NamedTuple):
    """One enforced budget and this sample's reading for it (None: unknown)."""

    label: str
    value: float | None
    budget: float
    unit: str


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


class Governor:
    """Pure decision logic: the caller reads the sensors and passes the readings and the time to ``tick``."""

    def __init__(self, config: GovernorConfig, ladder: Sequence[Level]) -> None:
        if not ladder:
            raise SacEdgeError("the governor needs at least one level")
        self.config = config
        self.levels = tuple(ladder)
        self.history: list[GovernorEvent] = []
        self._level = 0
        self._over = 0
        self._under = 0
        self._unmeetable = False

    @property
    def level(self) -> int:
        return self._level

    @property
    def knobs(self) -> Knobs:
        return self.levels[self._level].knobs

    @property
    def enforcing(self) -> bool:
        return self.config.mem_budget_mb is not None or self.config.power_budget_w is not None

    def tick(self, now: float, power: PowerReading | None, memory_mb: float | None) -> list[GovernorEvent]:
        """Judge one sample; return the transitions it caused (usually none)."""
        if not self.enforcing:
            return []
        cfg = self.config
        power_w = _finite(power.total_w) if power is not None else None
        mem = _finite(memory_mb)
        checks = []
        if cfg.power_budget_w is not None:
            checks.append(_Check("power", power_w, cfg.power_budget_w, "W"))
        if cfg.mem_budget_mb is not None:
            checks.append(_Check("memory", mem, cfg.mem_budget_mb, "MB"))
        over = [c for c in checks if c.value is not None and c.value > c.budget]
        under = all(c.value is not None and c.value < c.budget * (1 - cfg.headroom) for c in checks)
        if over:
            self._over, self._under = self._over + 1, 0
        elif under:
            self._over, self._under = 0, self._under + 1
        else:
            self._over = self._under = 0

        readings = "; ".join(self._reading(c, power) for c in checks)
        if self._over >= cfg.degrade_after:
            self._over = 0
            why = f"{' and '.join(c.label for c in over)} over budget for {cfg.degrade_after} samples: {readings}"
            helps = self._level + 1 < len(self.levels) and (
                self.levels[self._level + 1].step != "control_rate" or any(c.label != "memory" for c in over)
            )  # a lower control rate saves power, not memory: over memory alone, the rate steps cannot help
            if helps:
                return self._emit(now, "degrade", self._level + 1, why, power, mem)
            if not self._unmeetable:
                self._unmeetable = True
                floor = self.levels[self._level].knobs
                why = f"budget cannot be met at the lowest level {self._level} ({_describe(floor)}): {readings}"
                return self._emit(now, "unmeetable", self._level, why, power, mem)
        elif self._under >= cfg.recover_after:
            self._under = 0
            self._unmeetable = False
            if self._level > 0:
                why = f"under budget less {cfg.headroom:.0%} headroom for {cfg.recover_after} samples: {readings}"
                return self._emit(now, "recover", self._level - 1, why, power, mem)
        return []

    @staticmethod
    def _reading(check: _Check, power: PowerReading | None) -> str:
        label, value, budget, unit = check
        shown = "unknown" if value is None else f"{value:.2f} {unit}"
        if label == "power" and power is not None:
            shown += f" ({'measured' if power.measured else 'ESTIMATED'}, {power.source})"
        return f"{label} {shown} vs budget {budget:g} {unit}"

    def _emit(
        self, now: float, kind: EventKind, to_level: int, reason: str, power: PowerReading | None, mem: float | None
    ) -> list[GovernorEvent]:
        from_level = self._level
        changed = self.levels[max(from_level, to_level)]  # the rung whose knob this transition sets or restores
        knob = changed.knob if kind != "unmeetable" else None
        old = getattr(self.levels[from_level].knobs, knob) if knob else None
        new = getattr(self.levels[to_level].knobs, knob) if knob else None
        event = GovernorEvent(
            time=now,
            kind=kind,
            from_level=from_level,
            to_level=to_level,
            step=changed.step if knob else None,
            knob=knob,
            old_value=old,
            new_value=new,
            reason=reason,
            power_w=_finite(power.total_w) if power is not None else None,
            power_measured=power.measured if power is not None else None,
            power_source=power.source if power is not None else None,
            power_budget_w=self.config.power_budget_w,
            memory_mb=mem,
            mem_budget_mb=self.config.mem_budget_mb,
        )
        self._level = to_level
        self.history.append(event)
        return [event]

    def state(self) -> dict[str, Any]:
        """The governor's part of a per-second telemetry record."""
        return {
            "level": self._level,
            "max_level": len(self.levels) - 1,
            "knobs": asdict(self.knobs),
            "over_samples": self._over,
            "under_samples": self._under,
            "unmeetable": self._unmeetable,
            "events": len(self.history),
        }


def _describe(knobs: Knobs) -> str:
    finetune = (
        "no fine-tuning"
        if knobs.finetune_batch is None
        else "fine-tuning paused"
        if knobs.finetune_paused
        else f"fine-tuning x{knobs.update_rate_scale:g} batch {knobs.finetune_batch}"
    )
    return f"{knobs.rate_hz:g} Hz, {knobs.precision}, {finetune}"
