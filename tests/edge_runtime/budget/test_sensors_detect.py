"""detect_power_sensor picks the best real source present, then falls back to the estimate."""

from __future__ import annotations

import shutil
import stat
import sys
from pathlib import Path

from sac_edge.edge_runtime.budget.sensors import (
    EstimatedSensor,
    Ina3221HwmonSensor,
    Ina3221IioSensor,
    RaplSensor,
    TegrastatsSensor,
    detect_power_sensor,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def merged(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    for name in names:
        shutil.copytree(FIXTURES / name, root, dirs_exist_ok=True)
    return root


def test_order_hwmon_then_iio_then_rapl_then_estimate(tmp_path: Path) -> None:
    root = merged(tmp_path, "xavier_nx_jp4", "xavier_nx_jp5", "rapl")
    assert isinstance(detect_power_sensor(root), Ina3221HwmonSensor)
    shutil.rmtree(root / "sys/bus/i2c/drivers/ina3221")
    assert isinstance(detect_power_sensor(root), Ina3221IioSensor)
    shutil.rmtree(root / "sys/bus/i2c/drivers/ina3221x")
    assert isinstance(detect_power_sensor(root), RaplSensor)
    shutil.rmtree(root / "sys/class/powercap")
    fallback = detect_power_sensor(root)
    assert isinstance(fallback, EstimatedSensor) and not fallback.read().measured


def test_unreadable_rails_fall_through_only_when_none_reads(tmp_path: Path) -> None:
    root = merged(tmp_path, "xavier_nx_jp4", "xavier_nx_jp5")
    hwmon = root / "sys/bus/i2c/drivers/ina3221/7-0040/hwmon/hwmon6"
    (hwmon / "curr3_input").write_text("")
    assert isinstance(detect_power_sensor(root), Ina3221HwmonSensor)  # VDD_IN and VDD_CPU_GPU_CV still read
    (hwmon / "curr1_input").write_text("")  # the board-input rail: no total, so the next source
    assert isinstance(detect_power_sensor(root), Ina3221IioSensor)


def test_tegrastats_binary_when_sysfs_rails_are_absent(tmp_path: Path) -> None:
    root = merged(tmp_path, "rapl")
    binary = tmp_path / "bin/tegrastats"  # named by the caller: a binary inside root is never run
    binary.parent.mkdir(parents=True)
    line = (FIXTURES / "tegrastats/xavier_nx_root_datadog.log").read_text().strip()
    binary.write_text(
        f"#!{sys.executable}\nimport sys, time\nwhile True:\n    print({line!r}, flush=True)\n"
        "    time.sleep(int(sys.argv[2]) / 1000)\n"
    )
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    with detect_power_sensor(root, tegrastats_interval_ms=50, tegrastats=binary) as sensor:
        assert isinstance(sensor, TegrastatsSensor)
        assert abs(sensor.read().total_w - 4.067) < 1e-9
