"""A sensor root (``--sensor-root``, a device tree copied from elsewhere) and the files a bundle or a
trusted-keys directory holds are data: nothing in them is executed, no FIFO or device file in them is
opened for reading (it would block or never end), and every read is bounded."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sac_edge.common.signing import generate_keypair
from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.edge_runtime.budget.memory import read_system_memory
from sac_edge.edge_runtime.budget.sensors.base import SensorError
from sac_edge.edge_runtime.budget.sensors.detect import detect_power_sensor
from sac_edge.edge_runtime.budget.sensors.tegrastats import TegrastatsSensor

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tegrastats"


def _planted_tegrastats(root: Path, marker: Path) -> None:
    """An executable ``root/usr/bin/tegrastats`` that leaves ``marker`` when run and prints a real line."""
    binary = root / "usr/bin/tegrastats"
    binary.parent.mkdir(parents=True)
    line = (FIXTURES / "xavier_nx_root_datadog.log").read_text().strip()
    binary.write_text(
        f"#!{sys.executable}\nimport pathlib, time\npathlib.Path({str(marker)!r}).touch()\n"
        f"while True:\n    print({line!r}, flush=True)\n    time.sleep(0.05)\n"
    )
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)


@pytest.mark.timeout(60)
def test_a_sensor_root_never_executes_its_tegrastats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, marker = tmp_path / "tree", tmp_path / "ran"
    _planted_tegrastats(root, marker)
    with detect_power_sensor(root, tegrastats_interval_ms=50) as sensor:
        assert not isinstance(sensor, TegrastatsSensor)
    assert edge_cli.main(["doctor", "--sensor-root", str(root)]) == 0
    assert not marker.exists(), "a program inside the sensor root was executed"
    capsys.readouterr()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_fifo_or_device_in_the_sensor_tree_is_never_read(tmp_path: Path, kind: str) -> None:
    meminfo = tmp_path / "proc/meminfo"
    meminfo.parent.mkdir(parents=True)
    os.mkfifo(meminfo) if kind == "fifo" else meminfo.symlink_to("/dev/zero")
    with pytest.raises(SensorError, match=r"proc/meminfo: a sensor file is not a regular file") as err:
        read_system_memory(tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.timeout(60)
def test_fifos_in_the_engine_cache_do_not_hang_doctor(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    engines = bundle / "engines"
    engines.mkdir()
    for name in ("policy.fp32.trt10.3.0-orin-sm87.json", "policy.fp32.trt10.3.0-orin-sm87.plan"):
        os.mkfifo(engines / name)  # nobody ever writes into them
    assert edge_cli.main(["doctor", str(bundle), "--sensor-root", str(bundle.parent)]) == 0
    capsys.readouterr()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-zero"])
def test_trusted_keys_that_are_not_regular_files_are_one_line(
    bundle: Path, tmp_path: Path, kind: str, refused: Callable[..., str]
) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    generate_keypair(keys / "good")
    hostile = keys / "hostile.pub"
    if kind == "fifo":
        os.mkfifo(hostile)
    elif kind == "directory":
        hostile.mkdir()
    else:
        hostile.symlink_to("/dev/zero")
    line = refused(edge_cli.main, ["doctor", str(bundle), "--trusted-keys", str(keys)])
    assert "hostile.pub" in line and "not a regular file" in line
