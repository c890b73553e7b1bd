"""EnergyMeter over real readers on fixture trees, and NVML's behaviour where it is absent or present."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from sac_edge.edge_runtime.budget.sensors import EnergyMeter, Ina3221HwmonSensor, NvmlSensor, RaplSensor, SensorError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
HWMON = Path("sys/bus/i2c/drivers/ina3221/7-0040/hwmon/hwmon6")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def set_vdd_in(root: Path, watts: float) -> None:
    (root / HWMON / "curr1_input").write_text(f"{round(watts * 1e6 / 5024)}\n")


def test_trapezoid_energy_from_a_power_sensor(tmp_path: Path) -> None:
    root, clock = Path(shutil.copytree(FIXTURES / "xavier_nx_jp5", tmp_path / "jp5")), Clock()
    meter = EnergyMeter(Ina3221HwmonSensor(root, clock))
    for t, watts in ((0.0, 5.0), (1.0, 7.0), (3.0, 7.0)):
        clock.t = t
        set_vdd_in(root, watts)
        meter.sample()
    assert meter.joules == pytest.approx(6.0 + 14.0, rel=1e-3)
    assert meter.duration_s == 3.0 and meter.mean_power_w == pytest.approx(20.0 / 3, rel=1e-3)
    assert meter.millijoules_per(1000) == pytest.approx(20.0, rel=1e-3) and meter.measured
    json.dumps([r.to_dict() for r in meter.readings])


def test_counter_energy_is_used_where_the_source_has_one(tmp_path: Path) -> None:
    root, clock = Path(shutil.copytree(FIXTURES / "rapl", tmp_path / "rapl")), Clock()
    meter = EnergyMeter(RaplSensor(root, clock))
    meter.sample()
    clock.t = 0.5
    energy = root / "sys/class/powercap/intel-rapl:0/energy_uj"
    energy.write_text(f"{int(energy.read_text()) + 2_500_000}\n")
    meter.sample()
    assert meter.joules == pytest.approx(2.5)


def test_background_sampling_and_failed_reads(tmp_path: Path) -> None:
    root = Path(shutil.copytree(FIXTURES / "xavier_nx_jp5", tmp_path / "jp5"))
    meter = EnergyMeter(Ina3221HwmonSensor(root))
    with meter.sampling(interval_s=0.005):
        time.sleep(0.06)
    assert len(meter.readings) >= 3 and meter.joules > 0
    (root / HWMON / "in1_input").unlink()
    assert meter.sample() is None and meter.failures == 1


def test_nvml_is_a_clear_error_when_absent_and_reads_power_when_present() -> None:
    try:
        sensor = NvmlSensor()
    except SensorError as err:
        assert "NVML" in str(err) or "nvidia-ml-py" in str(err)
        return
    with sensor:  # an NVIDIA driver is here: read the real GPU
        meter = EnergyMeter(sensor)
        with meter.sampling(interval_s=0.05):
            time.sleep(0.5)
        reading = meter.readings[-1]
        assert 5.0 < reading.total_w < 1500.0 and reading.measured and reading.source.startswith("nvml:")
        assert meter.joules > 0
