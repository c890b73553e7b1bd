"""A model-based power estimate for machines without a power sensor; always labelled estimated.

Model: ``P = idle_w + core_w * sum_i(load_i * f_i / ref_mhz) + gpu_w * gpu_load * f_gpu / f_gpu_max``,
capped at the power mode's budget where one is known. Loads are busy fractions from ``/proc/stat``
deltas between reads; core clocks from ``cpufreq/scaling_cur_freq`` (kHz) where readable (else the
frequency factor is 1); the Jetson GPU load from the devfreq device's ``load`` file (per mille, jetson-stats
jtop/core/gpu.py) and its clock from ``cur_freq``/``max_freq``.

Xavier NX: idle 3.2 W is assumed; the core and GPU coefficients are then fitted to two public
VDD_IN readings in mode 15W_6CORE: 4.07 W at 6 x ~6 % CPU @ 1190 MHz with GR3D 62 % @ 306 MHz
(DataDog jetson_test.go) and 14.70 W at 6 x 100 % CPU @ 1420 MHz with GR3D 99 % (ai-blox stress test).
nvpmodel ids 0-2 are 15 W modes, 3-5 10 W, 6-8 20 W (JetPack >= 4.6); the estimate is capped at that
budget. The generic host coefficients are an order of magnitude for a desktop x86 core, useful only to
compare backends within one run, and are never used on a Jetson: a Jetson without a fitted model (every one
but Xavier NX so far) gets no estimate at all. Neither is a measurement.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .base import Clock, PowerReading, PowerSensor, SensorError, read_sensor_text
from .jetson import board_model, is_jetson, nvpmodel_mode

_STAT_CPU = re.compile(r"^cpu(\d+)\s+(.*)$")
_JETSON_GPUS = ("gv11b", "gp10b", "ga10b", "gpu")  # devfreq of_node names, as jetson-stats gpu.py checks


@dataclass(frozen=True)
class PowerModel:
    """Coefficients of the estimate. ``ref_mhz`` is the core clock ``core_w`` was fitted at."""

    name: str
    idle_w: float
    core_w: float
    gpu_w: float = 0.0
    ref_mhz: float | None = None
    cap_w: float | None = None

    def watts(
        self, core_loads: Sequence[float], core_mhz: Sequence[float | None], gpu_load: float | None, gpu_clock: float
    ) -> dict[str, float]:
        """Per-part watts (``idle``, ``cpu``, ``gpu``) for loads in [0, 1] and a GPU clock fraction."""
        cpu = 0.0
        for load, mhz in zip(core_loads, core_mhz):
            scale = mhz / self.ref_mhz if mhz and self.ref_mhz else 1.0
            cpu += self.core_w * load * scale
        gpu = self.gpu_w * (gpu_load or 0.0) * gpu_clock
        return {"idle": self.idle_w, "cpu": cpu, "gpu": gpu}


XAVIER_NX_15W = PowerModel("xavier-nx-15w", idle_w=3.2, core_w=1.55, gpu_w=2.2, ref_mhz=1420.0, cap_w=15.0)
XAVIER_NX_MODELS = {
    **{mode: XAVIER_NX_15W for mode in (0, 1, 2)},
    **{mode: PowerModel("xavier-nx-10w", 3.2, 1.55, 2.2, 1420.0, cap_w=10.0) for mode in (3, 4, 5)},
    **{mode: PowerModel("xavier-nx-20w", 3.2, 1.55, 2.2, 1420.0, cap_w=20.0) for mode in (6, 7, 8)},
}
GENERIC_HOST = PowerModel("generic-host", idle_w=10.0, core_w=4.0)


def _text(path: Path) -> str:
    try:
        return read_sensor_text(path).strip()
    except SensorError:
        return ""


def model_for(root: Path) -> PowerModel | None:
    """Xavier NX coefficients for its nvpmodel mode (default 15 W) when the device tree says Xavier NX; None on any
    other Jetson (the desktop coefficients would be 2x off: an Orin Nano idles near 5 W, not 10); generic elsewhere."""
    if "Xavier NX" in board_model(root):
        mode = nvpmodel_mode(root)
        return XAVIER_NX_15W if mode is None else XAVIER_NX_MODELS.get(mode, XAVIER_NX_15W)
    return None if is_jetson(root) else GENERIC_HOST


def read_cpu_times(root: Path) -> dict[int, tuple[int, int]]:
    """Per-core (busy, total) jiffies from ``/proc/stat``; idle and iowait count as not busy.

    Empty when the file is absent (not Linux), which leaves the estimate at the idle power.
    """
    times = {}
    text = _text(root / "proc/stat")
    for line in text.splitlines():
        match = _STAT_CPU.match(line)
        if match:
            fields = [int(v) for v in match.group(2).split()]
            idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
            total = sum(fields[:8])  # guest times are already inside user/nice
            times[int(match.group(1))] = (total - idle, total)
    return times


def _number(path: Path) -> float | None:
    text = _text(path)
    try:
        return float(text.split()[0]) if text else None
    except ValueError:
        return None


def find_jetson_gpu(root: Path) -> Path | None:
    """The devfreq entry of a Jetson integrated GPU (``/sys/class/devfreq/17000000.gv11b`` on Xavier)."""
    devfreq = root / "sys/class/devfreq"
    if not devfreq.is_dir():
        return None
    for entry in sorted(devfreq.iterdir()):
        if _text(entry / "device/of_node/name").replace("\x00", "") in _JETSON_GPUS:
            return entry
    return None


class EstimatedSensor(PowerSensor):
    """Power estimated from utilisation with a :class:`PowerModel`; every reading has ``measured=False``."""

    measured = False

    def __init__(self, root: Path = Path("/"), model: PowerModel | None = None, clock: Clock = time.monotonic) -> None:
        self.root = root
        found = model or model_for(root)
        if found is None:
            raise SensorError(f"no power model for this Jetson ({board_model(root) or 'unknown model'})")
        self.model = found
        self.source = f"estimate:{self.model.name}"
        self._clock = clock
        self._gpu = find_jetson_gpu(root)
        self._last = read_cpu_times(root)

    def _gpu_state(self) -> tuple[float | None, float]:
        if self._gpu is None:
            return None, 0.0
        load = _number(self._gpu / "device/load")
        cur, top = _number(self._gpu / "cur_freq"), _number(self._gpu / "max_freq")
        return (load / 1000.0 if load is not None else None), (cur / top if cur and top else 1.0)

    def read(self) -> PowerReading:
        times = read_cpu_times(self.root)
        loads, mhz = [], []
        for core, (busy, total) in sorted(times.items()):
            last_busy, last_total = self._last.get(core, (0, 0))
            span = total - last_total
            loads.append(min(1.0, max(0.0, (busy - last_busy) / span)) if span > 0 else 0.0)
            khz = _number(self.root / f"sys/devices/system/cpu/cpu{core}/cpufreq/scaling_cur_freq")
            mhz.append(khz / 1000.0 if khz else None)
        self._last = times
        gpu_load, gpu_clock = self._gpu_state()
        parts = self.model.watts(loads, mhz, gpu_load, gpu_clock)
        total_w = sum(parts.values())
        if self.model.cap_w is not None:
            total_w = min(total_w, self.model.cap_w)
        return PowerReading(total_w, parts, False, self.source, self._clock())
