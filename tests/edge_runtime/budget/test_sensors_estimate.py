"""The utilisation-based estimate: always labelled estimated, its model, its inputs re-read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sac_edge.edge_runtime.budget.sensors import GENERIC_HOST, XAVIER_NX_MODELS, EstimatedSensor, parse_tegrastats_line
from sac_edge.edge_runtime.budget.sensors.estimate import XAVIER_NX_15W, model_for

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def jp5(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "xavier_nx_jp5", tmp_path / "jp5"))


def write_stat(root: Path, busy: list[int], idle: list[int]) -> None:
    """A /proc/stat whose per-core user and idle jiffies are ``busy`` and ``idle``."""
    lines = [f"cpu  {sum(busy)} 0 0 {sum(idle)} 0 0 0 0 0 0"]
    lines += [f"cpu{i} {b} 0 0 {d} 0 0 0 0 0 0" for i, (b, d) in enumerate(zip(busy, idle))]
    (root / "proc/stat").write_text("\n".join(lines) + "\nctxt 1\n")


def test_estimate_is_labelled_and_follows_load(tmp_path: Path) -> None:
    root = jp5(tmp_path)
    write_stat(root, [0] * 6, [0] * 6)
    sensor = EstimatedSensor(root, clock=lambda: 7.0)
    assert sensor.model is XAVIER_NX_15W and not sensor.measured
    write_stat(root, [50, 100, 0, 0, 0, 0], [50, 0, 100, 100, 100, 100])  # cores 0 and 1: 50 % and 100 %
    reading = sensor.read()
    assert not reading.measured and reading.source == "estimate:xavier-nx-15w" and reading.timestamp == 7.0
    cpu = 1.55 * 1.5 * 1190.4 / 1420
    gpu = 2.2 * 0.62 * 306 / 1109.25
    assert reading.rails_w == pytest.approx({"idle": 3.2, "cpu": cpu, "gpu": gpu})
    assert reading.total_w == pytest.approx(3.2 + cpu + gpu)

    (root / "sys/class/devfreq/17000000.gv11b/device/load").write_text("0\n")
    write_stat(root, [50, 100, 0, 0, 0, 0], [150, 100, 200, 200, 200, 200])  # all idle since the last read
    assert sensor.read().total_w == pytest.approx(3.2)


def test_estimate_is_capped_at_the_power_mode_budget(tmp_path: Path) -> None:
    root = jp5(tmp_path)
    (root / "var/lib/nvpmodel/status").write_text("pmode:0003 fmode:quiet\n")  # 10W_2CORE
    write_stat(root, [0] * 6, [0] * 6)
    sensor = EstimatedSensor(root)
    assert sensor.model is XAVIER_NX_MODELS[3] and sensor.model.cap_w == 10.0
    write_stat(root, [100] * 6, [0] * 6)
    assert sensor.read().total_w == 10.0


def test_model_reproduces_the_public_xavier_nx_lines() -> None:
    """The coefficients were fitted to these two lines; a changed coefficient must still match them."""
    for name, gpu_clock, measured in (
        ("xavier_nx_root_datadog.log", 306 / 1109.25, 4.067),
        ("xavier_nx_jp46_nonroot.log", 1.0, 14.703),
    ):
        s = parse_tegrastats_line((FIXTURES / "tegrastats" / name).read_text())
        loads = [c.load_pct / 100 for c in s.cpus if c.load_pct is not None]
        mhz = [c.freq_mhz for c in s.cpus if c.load_pct is not None]
        assert s.gr3d_pct is not None
        parts = XAVIER_NX_15W.watts(loads, mhz, s.gr3d_pct / 100, gpu_clock)
        assert sum(parts.values()) == pytest.approx(measured, rel=0.05)


def test_other_machines_get_the_generic_model(tmp_path: Path) -> None:
    assert model_for(tmp_path) is GENERIC_HOST
    sensor = EstimatedSensor(tmp_path)  # no /proc/stat at all: idle power, still labelled
    reading = sensor.read()
    assert reading.total_w == GENERIC_HOST.idle_w and not reading.measured
