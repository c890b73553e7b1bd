"""RAPL powercap counters: power from energy deltas, wrap-around, psys preference."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sac_edge.edge_runtime.budget.sensors import RaplSensor, SensorError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
CAP = Path("sys/class/powercap")
MAX_RANGE = 262143328850


class Clock:
    """A clock the test advances by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def rapl_tree(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "rapl", tmp_path / "rapl"))


def bump(root: Path, zone: str, uj: int) -> None:
    path = root / CAP / zone / "energy_uj"
    path.write_text(f"{(int(path.read_text()) + uj) % MAX_RANGE}\n")


def test_power_is_package_plus_dram_energy_over_time(tmp_path: Path) -> None:
    root, clock = rapl_tree(tmp_path), Clock()
    sensor = RaplSensor(root, clock)
    clock.t += 2.0
    bump(root, "intel-rapl:0", 30_000_000)  # 30 J in 2 s -> 15 W
    bump(root, "intel-rapl:0:0", 20_000_000)  # core: inside the package reading
    bump(root, "intel-rapl:0:2", 4_000_000)  # dram: 2 W, added
    reading = sensor.read()
    assert reading.total_w == pytest.approx(17.0)
    assert reading.rails_w == pytest.approx({"package-0": 15.0, "core": 10.0, "uncore": 0.0, "dram": 2.0})
    assert reading.energy_j == pytest.approx(34.0) and reading.measured and reading.source == "rapl"


def test_counter_wrap_around(tmp_path: Path) -> None:
    root, clock = rapl_tree(tmp_path), Clock()
    (root / CAP / "intel-rapl:0/energy_uj").write_text(f"{MAX_RANGE - 1_000_000}\n")  # 1 J before the wrap
    sensor = RaplSensor(root, clock)
    clock.t += 1.0
    (root / CAP / "intel-rapl:0/energy_uj").write_text("4000000\n")  # wrapped, then 4 J more
    assert sensor.read().rails_w["package-0"] == pytest.approx(5.0)
    clock.t += 1.0
    bump(root, "intel-rapl:0", 3_000_000)
    reading = sensor.read()
    assert reading.rails_w["package-0"] == pytest.approx(3.0)
    assert reading.energy_j == pytest.approx(8.0)  # unwrapped total since the sensor was made


def test_psys_is_the_total_where_present(tmp_path: Path) -> None:
    root, clock = rapl_tree(tmp_path), Clock()
    psys = root / CAP / "intel-rapl:1"
    psys.mkdir()
    (psys / "name").write_text("psys\n")
    (psys / "energy_uj").write_text("1000\n")
    (psys / "max_energy_range_uj").write_text(f"{MAX_RANGE}\n")
    sensor = RaplSensor(root, clock)
    clock.t += 1.0
    bump(root, "intel-rapl:0", 9_000_000)
    bump(root, "intel-rapl:1", 21_000_000)
    assert sensor.read().total_w == pytest.approx(21.0)


def test_missing_or_unreadable_counters(tmp_path: Path) -> None:
    with pytest.raises(SensorError, match="no RAPL zones"):
        RaplSensor(tmp_path)
    root = rapl_tree(tmp_path)
    (root / CAP / "intel-rapl:0/energy_uj").write_text("")
    with pytest.raises(SensorError, match=r"root-only since Linux 5\.10"):
        RaplSensor(root)
