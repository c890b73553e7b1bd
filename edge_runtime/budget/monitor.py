"""The loop's once-a-second view of its budgets: memory and power readings, and the governor fed with them.

Sensors and the governor live beside it in ``budget/`` (``sensors/``, ``memory.py``, ``governor.py``); this only
reads them, keeps a failed read from stopping the loop (it is reported as unknown), and turns the
result into telemetry fields and the knobs to apply.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from .governor import Governor
from .memory import MemoryProbe
from .sensors.base import PowerReading, PowerSensor, SensorError


class BudgetTick(NamedTuple):
    """What the monitor reports once a second, and the knobs the governor wants applied (``Runtime.tick``
    reads it once a second)."""

    memory: dict[str, Any]
    power: dict[str, Any] | None
    events: list[dict[str, Any]]
    governor: dict[str, Any] | None
    precision: str | None
    rate_hz: float | None


def power_fields(reading: PowerReading | None) -> dict[str, Any] | None:
    """The per-second telemetry view of a power reading (always says measured or estimated)."""
    if reading is None:
        return None
    return {
        "total_w": round(reading.total_w, 3),
        "measured": reading.measured,
        "label": "measured" if reading.measured else "estimated",
        "source": reading.source,
        "rails_w": {k: round(v, 3) for k, v in reading.rails_w.items()},
    }


class BudgetMonitor:
    """Reads memory and power, ticks the governor (when budgets are set) and reports the knobs."""

    def __init__(
        self, memory: MemoryProbe, sensor: PowerSensor | None = None, governor: Governor | None = None
    ) -> None:
        self.memory, self.sensor, self.governor = memory, sensor, governor
        self.read_failures = 0

    def read_memory(self) -> dict[str, Any]:
        try:
            sample = self.memory.read()
        except SensorError:
            self.read_failures += 1
            return {}
        return {k: v for k, v in sample.to_dict().items() if k != "system" and v is not None}

    def tick(self, now_s: float) -> BudgetTick:
        memory = self.read_memory()
        power = None
        if self.sensor is not None:
            try:
                power = self.sensor.read()
            except SensorError:
                self.read_failures += 1
        if self.governor is None:
            return BudgetTick(memory, power_fields(power), [], None, None, None)
        events = self.governor.tick(time.monotonic(), power, memory.get("budget_mb"))
        knobs = self.governor.knobs
        return BudgetTick(
            memory,
            power_fields(power),
            [e.to_dict() for e in events],
            self.governor.state(),
            knobs.precision,
            knobs.rate_hz,
        )

    def close(self) -> None:
        if self.sensor is not None:
            self.sensor.close()
