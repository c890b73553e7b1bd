"""Pick the best power source a machine has, falling back to the labelled estimate."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .base import Clock, NoPowerSensor, PowerReading, PowerSensor, SensorError
from .estimate import EstimatedSensor
from .ina3221 import Ina3221HwmonSensor, Ina3221IioSensor
from .nvml import NvmlSensor
from .rapl import RaplSensor
from .tegrastats import TegrastatsSensor

#: Where L4T installs tegrastats. Only this binary is ever run, and only when the sensors read the live
#: system: a tree under another root is data that was copied here, so a program in it is never executed.
SYSTEM_TEGRASTATS = Path("/usr/bin/tegrastats")


class CombinedSensor(PowerSensor):
    """Sums independent sources (RAPL for the CPU package + NVML for a discrete GPU)."""

    def __init__(self, sensors: Sequence[PowerSensor], clock: Clock = time.monotonic) -> None:
        self.sensors = list(sensors)
        self.source = "+".join(s.source for s in self.sensors)
        self.measured = all(s.measured for s in self.sensors)
        self._clock = clock

    def read(self) -> PowerReading:
        readings = [s.read() for s in self.sensors]
        rails = {f"{r.source}/{name}": w for r in readings for name, w in r.rails_w.items()}
        energies = [r.energy_j for r in readings]
        energy = sum(e for e in energies if e is not None) if all(e is not None for e in energies) else None
        measured = all(r.measured for r in readings)
        return PowerReading(sum(r.total_w for r in readings), rails, measured, self.source, self._clock(), energy)

    def close(self) -> None:
        for sensor in self.sensors:
            sensor.close()


def _try(make: Callable[[], PowerSensor], probe: bool = False) -> PowerSensor | None:
    """The sensor if it can be made (and, with ``probe``, read once), else None."""
    try:
        sensor = make()
    except SensorError:
        return None
    if probe:
        try:
            sensor.read()
        except SensorError:
            sensor.close()
            return None
    return sensor


def detect_power_sensor(
    root: Path = Path("/"),
    clock: Clock = time.monotonic,
    tegrastats_interval_ms: int = 1000,
    tegrastats: Path | None = None,
) -> PowerSensor:
    """The best real source present under ``root``, else :class:`EstimatedSensor`, else :class:`NoPowerSensor`.

    Order: INA3221 hwmon (JetPack 5+), INA3221 iio (JetPack 4), tegrastats (a Jetson whose sysfs rails are
    not readable: ``tegrastats`` when a caller names the binary, else ``/usr/bin/tegrastats`` when ``root`` is
    ``/``; nothing under another ``root`` is ever executed), then RAPL and NVML (summed when both are
    present), then the estimate where one fits the machine (Xavier NX, or a host that is not a Jetson), else
    no sensor. NVML is a library, not a file tree, so it is only consulted when ``root`` is ``/``. Every
    candidate is read once before it is chosen.
    """
    for make in (lambda: Ina3221HwmonSensor(root, clock), lambda: Ina3221IioSensor(root, clock)):
        sensor = _try(make, probe=True)
        if sensor is not None:
            return sensor
    binary = tegrastats if tegrastats is not None else SYSTEM_TEGRASTATS if root == Path("/") else None
    if binary is not None and os.access(binary, os.X_OK):
        found = _try(lambda: TegrastatsSensor(binary, tegrastats_interval_ms, clock), probe=True)
        if found is not None:
            return found
    host: list[PowerSensor] = []
    rapl = _try(lambda: RaplSensor(root, clock), probe=True)
    if rapl is not None:
        host.append(rapl)
    nvml = _try(lambda: NvmlSensor(0, clock), probe=True) if root == Path("/") else None
    if nvml is not None:
        host.append(nvml)
    if len(host) > 1:
        return CombinedSensor(host, clock)
    if host:
        return host[0]
    try:
        return EstimatedSensor(root, clock=clock)
    except SensorError as err:
        return NoPowerSensor(
            f"no readable power sensor and {err} (INA3221 rails and tegrastats may need root: run with sudo)"
        )
