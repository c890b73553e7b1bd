"""Jetson INA3221 power monitor, in its two sysfs layouts.

JetPack 4 (L4T 32, NVIDIA's own ``ina3221x`` iio driver, drivers/staging/iio/meter/ina3221.c in the L4T
tree; energymon jetson/ina3221x.c, jetson-stats jtop/core/power.py)::

    /sys/bus/i2c/drivers/ina3221x/7-0040/iio:device0/
        rail_name_N  in_voltageN_input (mV)  in_currentN_input (mA)  in_powerN_input (mW)   N = 0, 1, 2

JetPack 5+ (L4T 34+, mainline ``ina3221`` hwmon driver; kernel Documentation/hwmon/ina3221.rst,
energymon jetson/ina3221.c, alumet plugins/nvidia-jetson/README.md)::

    /sys/bus/i2c/drivers/ina3221/7-0040/hwmon/hwmonN/      (N varies between boots and boards)
        in[1-3]_label  in[1-3]_input (bus mV)  curr[1-3]_input (mA)  update_interval (ms)
        in[4-6]_input shunt uV, in7_label "sum of shunt voltages": not rails. No power file:
        P = mV * mA / 1000. A label "NC" marks an unconnected channel (Orin) and is skipped.

Xavier NX rails at 7-0040: VDD_IN (module input = the total), VDD_CPU_GPU_CV, VDD_SOC (energymon
jetson/JetsonPowerRails.md). Where no input rail exists (AGX Xavier) the total is the sum of the rails.

A labelled channel that cannot be read (the mainline driver keeps a disabled channel's ``inN_input`` but
its read fails with ENODATA) is left out of that reading and named once on stderr; the other rails and
the input-rail total are still served, as jetson-stats does. ``read()`` fails when no rail reads, or when
the board-input rail itself does not (jetson-stats then sums the other rails, which understates the board).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .base import (
    Clock,
    PowerReading,
    PowerSensor,
    SensorError,
    read_number,
    read_sensor_text,
    total_from_rails,
    total_rail,
)

IIO_DRIVER_DIR = Path("sys/bus/i2c/drivers/ina3221x")
HWMON_DRIVER_DIR = Path("sys/bus/i2c/drivers/ina3221")
_I2C_DEVICE = re.compile(r"^\d+-[0-9a-fA-F]{4}$")  # "7-0040": bus 7, address 0x40
_HWMON_LABEL = re.compile(r"^in(\d+)_label$")
_IIO_RAIL = re.compile(r"^rail_name_(\d+)$")


@dataclass(frozen=True)
class Rail:
    """Where one channel's files live. ``power_mw`` is None in the hwmon layout (computed from V and I)."""

    name: str
    voltage_mv: Path
    current_ma: Path
    power_mw: Path | None = None

    def watts(self) -> float:
        if self.power_mw is not None:
            return read_number(self.power_mw) / 1000.0
        return read_number(self.voltage_mv) * read_number(self.current_ma) / 1e6


def _i2c_devices(driver_dir: Path) -> list[Path]:
    if not driver_dir.is_dir():
        return []
    return sorted(p for p in driver_dir.iterdir() if _I2C_DEVICE.match(p.name) and p.is_dir())


def _label(path: Path) -> str:
    """A label file's text; an unreadable one counts as absent so detection can move on."""
    try:
        return read_sensor_text(path).strip()
    except SensorError:
        return ""


def _add_rail(
    rails: dict[str, Rail], device: Path, label: Path, voltage_mv: Path, current_ma: Path, power_mw: Path | None = None
) -> None:
    """The rail ``label`` names, with its files, unless the label is absent or NC; a second board monitor with
    the same rail name (rare) is keyed by its I2C device too."""
    name = _label(label)
    if name and name != "NC":
        rails[name if name not in rails else f"{name}@{device.name}"] = Rail(name, voltage_mv, current_ma, power_mw)


def find_iio_rails(root: Path) -> dict[str, Rail]:
    """Rails of every ``ina3221x`` iio device under ``root`` (JetPack 4)."""
    rails: dict[str, Rail] = {}
    for device in _i2c_devices(root / IIO_DRIVER_DIR):
        for iio in sorted(device.glob("iio:device*")):
            for entry in sorted(iio.iterdir()):
                match = _IIO_RAIL.match(entry.name)
                if match:
                    n = match.group(1)
                    files = (iio / f"in_voltage{n}_input", iio / f"in_current{n}_input", iio / f"in_power{n}_input")
                    _add_rail(rails, device, entry, *files)
    return rails


def find_hwmon_dirs(root: Path) -> list[Path]:
    """The ``hwmonN`` folders of every ``ina3221`` device under ``root`` (N is whatever the kernel chose)."""
    return [
        hwmon
        for device in _i2c_devices(root / HWMON_DRIVER_DIR)
        for hwmon in sorted((device / "hwmon").glob("hwmon*"))
        if hwmon.is_dir()
    ]


def find_hwmon_rails(root: Path) -> dict[str, Rail]:
    """Rails of every ``ina3221`` hwmon device under ``root`` (JetPack 5+), skipping NC and the shunt sum."""
    rails: dict[str, Rail] = {}
    for hwmon in find_hwmon_dirs(root):
        device = hwmon.parent.parent
        for entry in sorted(hwmon.iterdir()):
            match = _HWMON_LABEL.match(entry.name)
            if match and 1 <= int(match.group(1)) <= 3:  # in4-6 are shunt voltages, in7 their sum
                n = match.group(1)
                _add_rail(rails, device, entry, hwmon / f"in{n}_input", hwmon / f"curr{n}_input")
    return rails


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _RailSensor(PowerSensor):
    """Reads a fixed set of rails on every call; the files are re-read, never cached.

    ``skipped`` maps each rail that failed the last read to why; each is named once per sensor through
    ``warn``, and a rail that reads again later is served again.
    """

    def __init__(self, rails: dict[str, Rail], source: str, clock: Clock, warn: Callable[[str], None]) -> None:
        self.rails = rails
        self.source = source
        self._clock = clock
        self._warn = warn
        self.skipped: dict[str, str] = {}
        self._named: set[str] = set()

    def read(self) -> PowerReading:
        rails_w: dict[str, float] = {}
        failed: dict[str, str] = {}
        for name, rail in self.rails.items():
            try:
                rails_w[name] = rail.watts()
            except SensorError as err:
                failed[name] = str(err)
        if not rails_w:
            raise SensorError(f"no {self.source} rail could be read: {'; '.join(failed.values())}")
        total = total_rail(self.rails)
        if total in failed:  # the sum of the module's own rails would understate the board by watts
            raise SensorError(f"the board-input rail {total} could not be read: {failed[total]}")
        for name in sorted(failed.keys() - self._named):
            self._warn(
                f"sac-edge: power rail {name} skipped: {failed[name]}; "
                + (f"the total is still {total}" if total else "the total is the sum of the other rails")
            )
        self._named |= failed.keys()
        self.skipped = failed
        return PowerReading(
            total_w=total_from_rails(rails_w),
            rails_w=rails_w,
            measured=True,
            source=self.source,
            timestamp=self._clock(),
        )


class _Ina3221Sensor(_RailSensor):
    """INA3221 rails through one kernel driver (``driver``, under ``driver_dir``), found once under ``root``."""

    driver = ""
    driver_dir = Path()
    jetpack = ""

    def __init__(
        self, root: Path = Path("/"), clock: Clock = time.monotonic, warn: Callable[[str], None] = _stderr
    ) -> None:
        rails = self._find_rails(root)
        if not rails:
            raise SensorError(
                f"no INA3221 {self.driver} rails under {root / self.driver_dir} (not a {self.jetpack} Jetson?)"
            )
        super().__init__(rails, f"ina3221-{self.driver}", clock, warn)
        #: the monitor folders read, relative to ``root`` (one per INA3221 on the board)
        self.where = sorted({str(r.voltage_mv.parent.relative_to(root)) for r in rails.values()})

    def _find_rails(self, root: Path) -> dict[str, Rail]:
        raise NotImplementedError


class Ina3221IioSensor(_Ina3221Sensor):
    """INA3221 through the JetPack 4 ``ina3221x`` iio driver (power read from ``in_powerN_input``)."""

    driver, driver_dir, jetpack = "iio", IIO_DRIVER_DIR, "JetPack 4"

    def _find_rails(self, root: Path) -> dict[str, Rail]:
        return find_iio_rails(root)


class Ina3221HwmonSensor(_Ina3221Sensor):
    """INA3221 through the JetPack 5+ mainline hwmon driver (power = bus mV * mA)."""

    driver, driver_dir, jetpack = "hwmon", HWMON_DRIVER_DIR, "JetPack 5"

    def __init__(
        self, root: Path = Path("/"), clock: Clock = time.monotonic, warn: Callable[[str], None] = _stderr
    ) -> None:
        super().__init__(root, clock, warn)
        intervals = [hw / "update_interval" for hw in find_hwmon_dirs(root) if (hw / "update_interval").is_file()]
        #: the monitor's conversion time; reading faster than this returns the same values
        self.update_interval_ms: float | None = max(read_number(p) for p in intervals) if intervals else None

    def _find_rails(self, root: Path) -> dict[str, Rail]:
        return find_hwmon_rails(root)
