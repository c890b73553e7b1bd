"""x86 RAPL energy counters through the Linux powercap framework.

Layout (kernel Documentation/power/powercap/powercap.rst and Documentation/ABI/testing/sysfs-class-powercap)::

    /sys/class/powercap/intel-rapl:0/       name "package-0", energy_uj, max_energy_range_uj
    /sys/class/powercap/intel-rapl:0:0/     name "core"   (inside the package reading)
    /sys/class/powercap/intel-rapl:0:1/     name "uncore" (inside the package reading)
    /sys/class/powercap/intel-rapl:0:2/     name "dram"   (NOT inside the package reading)
    /sys/class/powercap/intel-rapl:1/       name "psys"   (whole platform, where present)

``energy_uj`` is a free-running counter that wraps to 0 after ``max_energy_range_uj``; the sensor
unwraps it. Power is the energy delta over the time between two reads. Since Linux 5.10 ``energy_uj``
is readable by root only (CVE-2020-8694, "Platypus").
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

from .base import Clock, PowerReading, PowerSensor, SensorError, read_number, read_sensor_text

POWERCAP_DIR = Path("sys/class/powercap")
_ZONE = re.compile(r"^intel-rapl:\d+(:\d+)?$")


@dataclass
class _Zone:
    key: str
    name: str
    energy_file: Path
    max_range_uj: float
    last_uj: float
    total_uj: float = 0.0  # unwrapped energy since the sensor was made

    def advance(self) -> float:
        """Read the counter, add the (wrap-corrected) delta to ``total_uj``; return the delta in uJ."""
        value = read_number(self.energy_file)
        delta = value - self.last_uj
        if delta < 0:  # the counter wrapped past max_energy_range_uj
            delta += self.max_range_uj
        self.last_uj = value
        self.total_uj += delta
        return delta


def _zone_name(path: Path) -> str:
    try:
        return read_sensor_text(path).strip()
    except SensorError:
        return ""


class RaplSensor(PowerSensor):
    """Package (+ DRAM) power from RAPL, or the platform ``psys`` zone where the CPU has one.

    The first ``read()`` reports the average power since the sensor was made, each later one the
    average since the previous read, so call it at the interval you want averaged.
    """

    source = "rapl"

    def __init__(self, root: Path = Path("/"), clock: Clock = time.monotonic) -> None:
        self._clock = clock
        base = root / POWERCAP_DIR
        self._zones: list[_Zone] = []
        entries = sorted(p for p in base.iterdir() if _ZONE.match(p.name)) if base.is_dir() else []
        names = [_zone_name(p / "name") for p in entries]
        for path, name in zip(entries, names):
            energy = path / "energy_uj"
            if not name or not energy.exists():
                continue
            key = name if names.count(name) == 1 else f"{name}:{path.name.split(':', 1)[1]}"
            try:
                zone = _Zone(key, name, energy, read_number(path / "max_energy_range_uj"), read_number(energy))
            except SensorError as err:
                raise SensorError(f"{err} (energy_uj is root-only since Linux 5.10)") from err
            self._zones.append(zone)
        if not self._zones:
            raise SensorError(f"no RAPL zones under {base} (not an x86 Linux host with intel_rapl loaded?)")
        self._last_t = clock()
        self._last_w: dict[str, float] = {z.key: 0.0 for z in self._zones}

    def _is_total_part(self, zone: _Zone) -> bool:
        if any(z.name == "psys" for z in self._zones):
            return zone.name == "psys"
        return zone.name.startswith("package") or zone.name == "dram"

    def read(self) -> PowerReading:
        t = self._clock()
        dt = t - self._last_t
        deltas = {z.key: z.advance() for z in self._zones}
        if dt > 0:
            self._last_w = {key: uj / 1e6 / dt for key, uj in deltas.items()}
            self._last_t = t
        total_w = sum(self._last_w[z.key] for z in self._zones if self._is_total_part(z))
        energy_j = sum(z.total_uj for z in self._zones if self._is_total_part(z)) / 1e6
        return PowerReading(total_w, dict(self._last_w), True, self.source, t, energy_j)
