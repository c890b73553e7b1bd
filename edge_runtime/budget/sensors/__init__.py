"""Power sensors behind one interface (:class:`PowerSensor`), and an energy meter over them.

``detect_power_sensor()`` picks the best source present; the estimate is the fallback and is always
labelled ``measured=False``.
"""

from .base import EnergyMeter, NoPowerSensor, PowerReading, PowerSensor, SensorError, energy_between
from .detect import CombinedSensor, detect_power_sensor
from .estimate import GENERIC_HOST, XAVIER_NX_MODELS, EstimatedSensor, PowerModel
from .ina3221 import Ina3221HwmonSensor, Ina3221IioSensor
from .nvml import NvmlSensor
from .rapl import RaplSensor
from .tegrastats import (
    TegrastatsLogSensor,
    TegrastatsSample,
    TegrastatsSensor,
    parse_tegrastats_line,
    parse_tegrastats_lines,
    read_tegrastats_log,
)

__all__ = [
    "GENERIC_HOST",
    "XAVIER_NX_MODELS",
    "CombinedSensor",
    "EnergyMeter",
    "EstimatedSensor",
    "Ina3221HwmonSensor",
    "Ina3221IioSensor",
    "NoPowerSensor",
    "NvmlSensor",
    "PowerModel",
    "PowerReading",
    "PowerSensor",
    "RaplSensor",
    "SensorError",
    "TegrastatsLogSensor",
    "TegrastatsSample",
    "TegrastatsSensor",
    "detect_power_sensor",
    "energy_between",
    "parse_tegrastats_line",
    "parse_tegrastats_lines",
    "read_tegrastats_log",
]
