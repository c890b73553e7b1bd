"""One interface for every power source, and an energy meter on top of it.

A sensor's ``read()`` returns a :class:`PowerReading`: board (or package) total in watts, the rails it
saw, whether the value was measured by hardware or modelled, the source's name and a timestamp from
the sensor's clock (``time.monotonic`` unless one is injected). Readers take ``root: Path`` so a test
can point them at a fixture tree laid out like the real sysfs.
"""

from __future__ import annotations

import contextlib
import threading
import typing
from abc import ABC, abstractmethod
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from sac_edge.common.bounded import read_capped
from sac_edge.common.errors import SacEdgeError

Clock = typing.Callable[[], float]


class SensorError(SacEdgeError):
    """A power or memory source is absent or could not be read; the message names the path and the fix."""


@dataclass(frozen=True)
class PowerReading:
    """One power sample. ``measured`` is False for a model-based estimate, which must be reported as such."""

    total_w: float
    rails_w: Mapping[str, float]
    measured: bool
    source: str
    timestamp: float
    # Cumulative energy in joules where the source keeps a counter (RAPL, NVML); unwrapped by the sensor.
    energy_j: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for telemetry records."""
        return {
            "total_w": round(self.total_w, 4),
            "rails_w": {k: round(v, 4) for k, v in self.rails_w.items()},
            "measured": self.measured,
            "source": self.source,
            "timestamp": self.timestamp,
            "energy_j": self.energy_j,
        }


class PowerSensor(ABC):
    """A power source. ``read()`` raises :class:`SensorError` when the source fails; ``close()`` frees it."""

    #: short name of the source, e.g. ``ina3221-hwmon``; copied into each reading
    source: str = "unknown"
    #: False only for the estimate
    measured: bool = True

    @abstractmethod
    def read(self) -> PowerReading:
        """Sample the source now."""

    def close(self) -> None:  # noqa: B027 - most sources hold nothing to release
        """Release the source (a subprocess, a library handle). Reading after close is undefined."""

    def __enter__(self) -> PowerSensor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


#: The largest sysfs/procfs file a sensor reads (``proc/meminfo`` is ~1.5 KiB, the NvMap table a few KiB).
MAX_SENSOR_BYTES = 1 << 20


def read_sensor_text(path: Path, max_bytes: int = MAX_SENSOR_BYTES) -> str:
    """The text of a sysfs/procfs file under a sensor root, read with a bound and only from a regular file
    (sysfs and procfs attributes are regular files): a FIFO or device file in a copied tree (``proc/meminfo``
    as a link to ``/dev/zero``) is refused without reading. SensorError, one line, when it cannot be read."""
    fix = "point --sensor-root at a copied device tree of regular files"
    try:
        return read_capped(path, max_bytes, "a sensor file", fix).decode(errors="replace")
    except SensorError:
        raise
    except SacEdgeError as err:
        raise SensorError(str(err)) from None
    except OSError as err:
        raise SensorError(f"cannot read {path}: {err.strerror or err}") from None


def read_number(path: Path) -> float:
    """First whitespace-separated token of a sysfs file as a number (``"32760 ma"`` -> 32760)."""
    text = read_sensor_text(path)
    try:
        return float(text.split()[0])
    except (IndexError, ValueError) as err:
        raise SensorError(f"{path} does not hold a number: {text.strip()!r}") from err


# The rails that measure the whole board's input, in jetson-stats' order (power.py `total_power`): VIN on
# Thor's carrier board, POM_5V_IN on Nano/TX2, VDD_IN on Xavier NX and Orin Nano/NX.
TOTAL_RAILS = ("VIN", "POM_5V_IN", "VDD_IN")


def total_rail(rails: Container[str], total_rails: Sequence[str] = TOTAL_RAILS) -> str | None:
    """The name of the board-input rail among ``rails``, None when there is none (AGX Xavier, AGX Orin)."""
    return next((name for name in total_rails if name in rails), None)


def total_from_rails(rails_w: Mapping[str, float], total_rails: Sequence[str] = TOTAL_RAILS) -> float:
    """The board total: the input rail when there is one (jetson-stats power.py `total_power`), else the sum."""
    name = total_rail(rails_w, total_rails)
    return rails_w[name] if name is not None else sum(rails_w.values())


class NoPowerSensor(PowerSensor):
    """What a machine with neither a readable sensor nor a power model gets: every read fails with ``reason``.

    ``sac-edge run`` says once that a power budget cannot be enforced; bench reports no energy.
    """

    source = "none"
    measured = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def read(self) -> PowerReading:
        raise SensorError(self.reason)


def energy_between(readings: Sequence[PowerReading]) -> float:
    """Joules over a series of readings: counter deltas where both ends have one, else the trapezoid rule."""
    joules = 0.0
    for a, b in zip(readings, readings[1:]):
        if a.energy_j is not None and b.energy_j is not None:
            joules += b.energy_j - a.energy_j
        else:
            joules += 0.5 * (a.total_w + b.total_w) * (b.timestamp - a.timestamp)
    return joules


@dataclass
class EnergyMeter:
    """Integrates a sensor's power over a window, for energy per inference in ``sac-edge bench``.

    Call ``sample()`` yourself, or wrap the measured work in ``with meter.sampling(interval_s):`` to
    sample from a background thread (one reading at the start and one at the end are always taken).
    ``readings`` keeps every sample for a power-over-time plot.
    """

    sensor: PowerSensor
    readings: list[PowerReading] = field(default_factory=list)
    failures: int = 0

    def sample(self) -> PowerReading | None:
        """Take one reading; a failed read is counted in ``failures`` and returns None."""
        try:
            reading = self.sensor.read()
        except SensorError:
            self.failures += 1
            return None
        self.readings.append(reading)
        return reading

    def reset(self) -> None:
        self.readings.clear()
        self.failures = 0

    @contextlib.contextmanager
    def sampling(self, interval_s: float = 0.05) -> Iterator[EnergyMeter]:
        """Sample every ``interval_s`` seconds in a daemon thread while the block runs."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(interval_s):
                self.sample()

        self.sample()
        thread = threading.Thread(target=run, name="energy-meter", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self.sample()

    @property
    def joules(self) -> float:
        return energy_between(self.readings)

    @property
    def millijoules(self) -> float:
        return 1000.0 * self.joules

    @property
    def duration_s(self) -> float:
        return self.readings[-1].timestamp - self.readings[0].timestamp if len(self.readings) > 1 else 0.0

    @property
    def mean_power_w(self) -> float:
        """Average power over the window (energy / time), NaN before two readings."""
        return self.joules / self.duration_s if self.duration_s > 0 else float("nan")

    @property
    def measured(self) -> bool:
        """True only when every reading was measured; an estimate anywhere makes the whole reading estimated."""
        return bool(self.readings) and all(r.measured for r in self.readings)

    def millijoules_per(self, count: int) -> float:
        """Energy per item (e.g. per inference) in mJ; NaN when nothing was counted."""
        return self.millijoules / count if count > 0 else float("nan")
