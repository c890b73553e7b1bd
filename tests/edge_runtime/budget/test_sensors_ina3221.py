"""INA3221 readers against the JetPack 4 (iio) and JetPack 5 (hwmon) fixture trees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sac_edge.edge_runtime.budget.sensors import Ina3221HwmonSensor, Ina3221IioSensor, SensorError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
IIO = Path("sys/bus/i2c/drivers/ina3221x/7-0040/iio:device0")
HWMON = Path("sys/bus/i2c/drivers/ina3221/7-0040/hwmon/hwmon6")


def tree(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def test_iio_reads_power_files_and_takes_vdd_in_as_total(tmp_path: Path) -> None:
    root = tree("xavier_nx_jp4", tmp_path)
    sensor = Ina3221IioSensor(root, clock=lambda: 12.5)
    reading = sensor.read()
    assert reading.rails_w == pytest.approx({"VDD_IN": 4.067, "VDD_CPU_GPU_CV": 0.738, "VDD_SOC": 1.353})
    assert reading.total_w == pytest.approx(4.067)
    assert reading.measured and reading.source == "ina3221-iio" and reading.timestamp == 12.5

    (root / IIO / "in_power0_input").write_text("9120\n")
    assert sensor.read().total_w == pytest.approx(9.12)


def test_hwmon_computes_power_from_mv_and_ma_and_skips_the_shunt_sum(tmp_path: Path) -> None:
    root = tree("xavier_nx_jp5", tmp_path)
    sensor = Ina3221HwmonSensor(root)
    reading = sensor.read()
    assert set(reading.rails_w) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}
    assert reading.total_w == pytest.approx(5024 * 1052 / 1e6)
    assert reading.rails_w["VDD_SOC"] == pytest.approx(5016 * 284 / 1e6)
    assert sensor.update_interval_ms == 26

    (root / HWMON / "curr1_input").write_text("1500\n")
    assert sensor.read().total_w == pytest.approx(5024 * 1500 / 1e6)


def test_hwmon_number_is_discovered_not_assumed(tmp_path: Path) -> None:
    root = tree("xavier_nx_jp5", tmp_path)
    (root / HWMON).rename(root / HWMON.parent / "hwmon3")
    assert Ina3221HwmonSensor(root).read().total_w == pytest.approx(5024 * 1052 / 1e6)


def test_hwmon_skips_nc_channels(tmp_path: Path) -> None:
    root = tree("xavier_nx_jp5", tmp_path)
    (root / HWMON / "in3_label").write_text("NC\n")
    assert set(Ina3221HwmonSensor(root).read().rails_w) == {"VDD_IN", "VDD_CPU_GPU_CV"}


def test_without_an_input_rail_the_total_is_the_sum(tmp_path: Path) -> None:
    root = tree("xavier_nx_jp4", tmp_path)
    (root / IIO / "rail_name_0").write_text("VDD_GPU\n")
    assert Ina3221IioSensor(root).read().total_w == pytest.approx(4.067 + 0.738 + 1.353)


def test_absent_tree_and_bad_value_are_sensor_errors(tmp_path: Path) -> None:
    with pytest.raises(SensorError, match="no INA3221 hwmon rails"):
        Ina3221HwmonSensor(tmp_path)
    with pytest.raises(SensorError, match="no INA3221 iio rails"):
        Ina3221IioSensor(tmp_path)
    root = tree("xavier_nx_jp5", tmp_path)
    sensor = Ina3221HwmonSensor(root)
    (root / HWMON / "curr1_input").write_text("garbage\n")  # VDD_IN, the total
    with pytest.raises(SensorError, match="curr1_input"):
        sensor.read()
    (root / HWMON / "curr1_input").unlink()
    with pytest.raises(SensorError, match="cannot read"):
        sensor.read()


@pytest.mark.jetson
def test_real_board_reads_a_plausible_total() -> None:
    for make in (Ina3221HwmonSensor, Ina3221IioSensor):
        try:
            sensor = make()
        except SensorError:
            continue
        assert 1.0 < sensor.read().total_w < 60.0
        return
    pytest.fail("a Jetson without INA3221 rails in either layout")
