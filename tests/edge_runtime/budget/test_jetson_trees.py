"""The power and board readers on every Jetson generation's fixture tree, cross-checked with jetson-stats.

Each tree under tests/fixtures/ is laid out as the device's sysfs is (the i2c client folders under
``sys/devices`` reached through ``sys/bus/i2c/devices`` and the driver's links, the devicetree, hwmon);
its README names where each file's content comes from. jetson-stats' own readers (jtop's power module,
with its I2C walk pointed at the tree instead of the hard-coded ``/sys``) read the same tree, and the two
must agree on every rail, every volt and amp, and the board total.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sac_edge.edge_runtime.budget.governor import Governor, GovernorConfig, build_ladder
from sac_edge.edge_runtime.budget.sensors import (
    EstimatedSensor,
    Ina3221HwmonSensor,
    Ina3221IioSensor,
    NoPowerSensor,
    SensorError,
    detect_power_sensor,
)
from sac_edge.edge_runtime.budget.sensors.estimate import XAVIER_NX_15W, model_for
from sac_edge.edge_runtime.budget.sensors.jetson import JETPACK, board_model, jetpack, l4t_release, power_mode

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TREES = ["xavier_nx_jp4", "xavier_nx_jp5", "orin_nano_jp6", "orin_nx_jp6", "agx_orin_jp6"]
ORIN_NANO_HWMON = Path("sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1")
# jtop 7.2.2 logs its skips with Logger.warn
pytestmark = pytest.mark.filterwarnings("ignore:The 'warn' method is deprecated:DeprecationWarning")


def copy(name: str, tmp_path: Path) -> Path:
    """A writable copy that keeps the tree's links, so every path to a file reaches the same file."""
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name, symlinks=True))


def jtop_status(root: Path) -> dict[str, Any]:
    """jetson-stats' PowerService.get_status() on the tree: its own I2C walk, reads and total rule."""
    power = pytest.importorskip("jtop.core.power", reason="jetson-stats is not installed (pip install jetson-stats)")
    service = power.PowerService.__new__(power.PowerService)  # its __init__ only hard-codes /sys
    found = power.find_all_i2c_power_monitor(str(root / "sys/bus/i2c/devices"))
    service._power_sensor = dict(sorted(found.items()))
    service._power_avg = {}
    return dict(service.get_status())


def make_unreadable(path: Path) -> None:
    """What a disabled INA3221 channel is on the device: a file that exists but whose read() fails (ENODATA
    there; EIO from /proc/self/mem here, the one always-present file whose read fails for root too)."""
    path.unlink()
    path.symlink_to("/proc/self/mem")


@pytest.mark.parametrize("name", TREES)
def test_rails_volts_amps_and_total_agree_with_jetson_stats(name: str, tmp_path: Path) -> None:
    root = copy(name, tmp_path)
    sensor = detect_power_sensor(root)
    assert isinstance(sensor, (Ina3221HwmonSensor, Ina3221IioSensor))
    reading = sensor.read()
    status = jtop_status(root)
    theirs = dict(status["rail"])
    total = status["tot"]
    if "name" in total:  # jtop moves the input rail out of the rails into the total
        theirs[total["name"]] = total
    assert set(reading.rails_w) == set(theirs)
    for rail, values in theirs.items():
        ours = sensor.rails[rail]
        assert int(ours.voltage_mv.read_text()) == values["volt"]
        assert int(ours.current_ma.read_text()) == values["curr"]
        assert abs(reading.rails_w[rail] * 1000 - values["power"]) < 1.0  # jtop truncates to whole mW
    assert abs(reading.total_w * 1000 - total["power"]) < len(theirs)


def test_the_tree_totals() -> None:
    """The readings the trees were written with (README): an Orin Nano at 4.74 W, AGX Orin summed."""
    nano = detect_power_sensor(FIXTURES / "orin_nano_jp6").read()
    assert nano.total_w == pytest.approx(5064 * 936 / 1e6)
    agx = detect_power_sensor(FIXTURES / "agx_orin_jp6").read()  # no input rail: the sum, NC channels left out
    assert set(agx.rails_w) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}
    assert agx.total_w == pytest.approx(sum(agx.rails_w.values()))


def test_an_unreadable_labelled_rail_is_skipped_named_once_and_the_total_kept(tmp_path: Path) -> None:
    root = copy("orin_nano_jp6", tmp_path)
    make_unreadable(root / ORIN_NANO_HWMON / "in3_input")  # VDD_SOC
    said: list[str] = []
    sensor = Ina3221HwmonSensor(root, warn=said.append)
    for _ in range(3):
        reading = sensor.read()
        assert set(reading.rails_w) == {"VDD_IN", "VDD_CPU_GPU_CV"}
        assert reading.total_w == pytest.approx(5064 * 936 / 1e6)
    assert len(said) == 1 and "VDD_SOC" in said[0] and "the total is still VDD_IN" in said[0]
    assert set(sensor.skipped) == {"VDD_SOC"}
    status = jtop_status(root)
    assert set(status["rail"]) == {"VDD_CPU_GPU_CV"} and status["tot"]["name"] == "VDD_IN"
    assert isinstance(detect_power_sensor(root), Ina3221HwmonSensor)  # detection no longer falls back

    make_unreadable(root / ORIN_NANO_HWMON / "in1_input")  # the input rail: no total to serve
    with pytest.raises(SensorError, match="board-input rail VDD_IN could not be read"):
        sensor.read()
    make_unreadable(root / ORIN_NANO_HWMON / "in2_input")
    with pytest.raises(SensorError, match="no ina3221-hwmon rail could be read"):
        sensor.read()


def test_a_power_budget_is_still_enforced_with_an_unreadable_rail(tmp_path: Path) -> None:
    """4 W budget, board at 4.74 W, one channel disabled: the governor steps down."""
    root = copy("orin_nano_jp6", tmp_path)
    make_unreadable(root / ORIN_NANO_HWMON / "in3_input")
    sensor = Ina3221HwmonSensor(root, warn=lambda _: None)
    config = GovernorConfig(power_budget_w=4.0)
    governor = Governor(config, build_ladder(100.0, "fp32", ["fp32", "int8"]))
    events = [e for t in range(config.degrade_after) for e in governor.tick(float(t), sensor.read(), 100.0)]
    assert events and governor.knobs.precision == "int8"


@pytest.mark.parametrize("name", ["orin_nano_jp6", "orin_nx_jp6", "agx_orin_jp6"])
def test_an_orin_without_a_readable_sensor_gets_no_estimate(name: str, tmp_path: Path) -> None:
    root = copy(name, tmp_path)
    shutil.rmtree(root / "sys/bus/i2c/drivers/ina3221")
    assert model_for(root) is None
    sensor = detect_power_sensor(root)
    assert isinstance(sensor, NoPowerSensor) and not sensor.measured
    assert board_model(root) in sensor.reason
    with pytest.raises(SensorError, match="no power model"):
        sensor.read()


def test_xavier_nx_without_a_readable_sensor_keeps_its_fitted_estimate(tmp_path: Path) -> None:
    root = copy("xavier_nx_jp4", tmp_path)
    shutil.rmtree(root / "sys/bus/i2c/drivers/ina3221x")
    sensor = detect_power_sensor(root)
    assert isinstance(sensor, EstimatedSensor) and sensor.model is XAVIER_NX_15W


@pytest.mark.parametrize(
    ("name", "model", "release", "mode"),
    [
        ("xavier_nx_jp4", "NVIDIA Jetson Xavier NX Developer Kit", "32.6.1", "2 MODE_15W_6CORE"),
        ("xavier_nx_jp5", "NVIDIA Jetson Xavier NX Developer Kit", "35.2.1", "2 MODE_15W_6CORE"),
        (
            "orin_nano_jp6",
            "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super",
            "36.4.3",
            "1 25W (the conf's default; no var/lib/nvpmodel/status)",
        ),
        ("orin_nx_jp6", "NVIDIA Jetson Orin NX Engineering Reference Developer Kit", "36.4.3", "3 25W"),
        ("agx_orin_jp6", "NVIDIA Jetson AGX Orin Developer Kit", "36.4.3", "0 MAXN"),
    ],
)
def test_board_release_and_power_mode(name: str, model: str, release: str, mode: str) -> None:
    root = FIXTURES / name
    assert board_model(root) == model
    assert (root / "proc/device-tree").is_symlink()  # as on the device, a link to the devicetree
    assert l4t_release(root) == release and jetpack(release) is not None
    found = power_mode(root)
    assert found is not None and found.describe() == mode


def test_the_l4t_table_matches_jetson_stats_for_jetpack_4_to_6() -> None:
    variables = pytest.importorskip("jtop.core.jetson_variables", reason="jetson-stats is not installed")
    theirs = {
        l4t: jp.replace(" GA", "")
        for l4t, jp in variables.NVIDIA_JETPACK.items()
        if l4t.split(".")[0] in ("32", "34", "35", "36") and l4t.count(".") == 2
    }
    assert {k: JETPACK.get(k) for k in theirs} == theirs
    assert jetpack("32.6.1") == "4.6" and jetpack("36.4.4") == "6.2.1" and jetpack("35.5.0") == "5.1.3"


def _jtop_board(root: Path) -> dict[str, str]:
    """jetson-stats' get_jetson_variables() with the tree's etc/ laid over /etc and its devicetree over
    /sys/firmware, in a private mount namespace (so nothing on this machine changes)."""
    pytest.importorskip("jtop.core.jetson_variables", reason="jetson-stats is not installed")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private mount namespace")
    if not Path("/sys/firmware").is_dir():
        pytest.skip("no /sys/firmware to lay the tree's devicetree over")
    code = "import json; from jtop.core.jetson_variables import get_jetson_variables as g; print(json.dumps(g()))"
    script = (
        f'mount -t overlay overlay -o "lowerdir={root}/etc:/etc" /etc && '
        f'mount --bind "{root}/sys/firmware" /sys/firmware && exec "$0" -c "$1"'
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, sys.executable, code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0 and "mount" in done.stderr:
        pytest.skip(f"cannot mount in a private namespace here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("name", TREES)
def test_model_l4t_and_jetpack_agree_with_jetson_stats(name: str) -> None:
    root = FIXTURES / name
    theirs = _jtop_board(root)
    release = l4t_release(root)
    assert theirs["Model"] == board_model(root)
    assert theirs["L4T"] == release
    assert release is not None and theirs["Jetpack"].replace(" GA", "") == jetpack(release)
