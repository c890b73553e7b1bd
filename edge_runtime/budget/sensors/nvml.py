"""NVIDIA desktop/server GPU power through NVML (the ``nvidia-ml-py`` package, imported lazily).

``nvmlDeviceGetPowerUsage`` gives the board's draw in mW; ``nvmlDeviceGetTotalEnergyConsumption`` an
energy counter in mJ since the driver loaded (Volta and newer; NVML API reference, "Device Queries").
This is the GPU board only, not the host CPU: pair it with RAPL for a whole-machine reading. Jetson
boards have no NVML power (use the INA3221 readers).
"""

from __future__ import annotations

import contextlib
import time
from types import ModuleType

from .base import Clock, PowerReading, PowerSensor, SensorError


def _pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as err:
        raise SensorError("NVML power needs nvidia-ml-py: pip install 'sac-edge[nvidia]'") from err
    return pynvml


class NvmlSensor(PowerSensor):
    """Power (and the energy counter where supported) of GPU ``index``."""

    def __init__(self, index: int = 0, clock: Clock = time.monotonic) -> None:
        nvml = self._nvml = _pynvml()
        self._clock = clock
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            raise SensorError(f"NVML unavailable (no NVIDIA driver?): {err}") from err
        try:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(self._handle)
            nvml.nvmlDeviceGetPowerUsage(self._handle)
        except nvml.NVMLError as err:
            nvml.nvmlShutdown()
            raise SensorError(f"NVML cannot read power of GPU {index}: {err}") from err
        self.rail = f"gpu{index}"
        self.source = f"nvml:{name.decode() if isinstance(name, bytes) else name}"
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            self.has_energy_counter = True
        except nvml.NVMLError:  # pre-Volta or not supported: power is integrated instead
            self.has_energy_counter = False

    def read(self) -> PowerReading:
        nvml = self._nvml
        try:
            watts = nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
            energy_mj = nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) if self.has_energy_counter else None
        except nvml.NVMLError as err:
            raise SensorError(f"NVML read failed: {err}") from err
        energy_j = energy_mj / 1000.0 if energy_mj is not None else None
        return PowerReading(watts, {self.rail: watts}, True, self.source, self._clock(), energy_j)

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()
