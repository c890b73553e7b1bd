"""sac-edge doctor against the Xavier NX fixture trees and on this machine's bundles."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sac_edge.edge_runtime.cli import main
from sac_edge.edge_runtime.config import DoctorConfig
from sac_edge.edge_runtime.doctor import OK, Row, doctor_command, doctor_table

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _rows(root: Path, bundle: Path | None = None) -> dict[str, Row]:
    rows = doctor_command(DoctorConfig(bundle=str(bundle) if bundle else None, sensor_root=str(root)))
    return {r.item: r for r in rows}


def test_xavier_nx_jetpack5_tree(tmp_path: Path) -> None:
    root = tmp_path / "nx"
    shutil.copytree(FIXTURES / "xavier_nx_jp5", root)
    rows = _rows(root)
    assert rows["jetson release"].value == "L4T 35.2.1 (JetPack 5.1)"
    assert rows["nvpmodel mode"].value == "2 MODE_15W_6CORE"
    assert rows["cuda"].value == "11.4.315"
    assert rows["model"].value == "NVIDIA Jetson Xavier NX Developer Kit"
    power = rows["power sensor"]
    assert power.status == OK and "ina3221-hwmon (sys/bus/i2c/drivers/ina3221/7-0040/hwmon/hwmon6)" in power.value
    assert "total 5.29 W (= VDD_IN)" in power.value
    assert "VDD_IN" in power.value and "NvMapMemUsed" in rows["memory"].value
    clocks = rows["clocks locked"]
    assert clocks.value.startswith("no (7 of 7") and clocks.fix == "sudo jetson_clocks"
    for lo in [
        *root.glob("sys/devices/system/cpu/cpu*/cpufreq/scaling_min_freq"),
        *root.glob("sys/class/devfreq/*/min_freq"),
    ]:
        lo.write_text((lo.parent / lo.name.replace("min", "max")).read_text())  # what jetson_clocks does
    assert _rows(root)["clocks locked"].value == "yes (7 clocks at their maximum)"


def test_jetpack4_tree_and_a_plain_host(tmp_path: Path) -> None:
    rows = _rows(FIXTURES / "xavier_nx_jp4")
    assert rows["power sensor"].value.startswith("ina3221-iio (sys/bus/i2c/drivers/ina3221x/7-0040/iio:device0)")
    assert "total 4.07 W (= VDD_IN)" in rows["power sensor"].value
    assert rows["jetson release"].value == "L4T 32.6.1 (JetPack 4.6)"
    bare = _rows(tmp_path)
    assert bare["jetson release"].value == "not a Jetson (no etc/nv_tegra_release)"
    assert bare["power sensor"].status != OK and bare["power sensor"].fix  # estimated, with what to do
    assert "--power-budget-w is enforced only with --enforce-estimated-power" in bare["power sensor"].fix


def test_bundle_entries_say_why_and_how_to_fix(pendulum_bundle: Path, rejected_bundle: Path) -> None:
    rows = _rows(FIXTURES / "xavier_nx_jp5", pendulum_bundle)
    assert rows["onnxruntime fp32"].value == "usable" and rows["onnxruntime int8"].value == "usable"
    assert "fp32, int8" in rows["graphs"].value
    refused = [r for r in rows.values() if r.section == "bundle" and r.status == "no"]
    assert all(r.fix for r in refused)  # every missing dependency names its install command
    rejected = _rows(FIXTURES / "xavier_nx_jp5", rejected_bundle)["onnxruntime int8"]
    assert rejected.status == "no" and "rejected by the bundle's accuracy gate" in rejected.value


def test_cli_table_and_json(pendulum_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", str(pendulum_bundle), "--sensor-root", str(FIXTURES / "xavier_nx_jp5"), "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].split()[:4] == ["section", "item", "status", "value"]
    report = json.loads(out[-1])
    assert {
        "section": "device",
        "item": "jetson release",
        "value": "L4T 35.2.1 (JetPack 5.1)",
        "status": "ok",
        "fix": "",
    } in report["rows"]
    assert main(["doctor", "--sensor-root", str(FIXTURES / "nope")]) == 2


@pytest.mark.parametrize("width", [100, 120])
def test_the_table_fits_the_terminal_with_each_fix_on_its_own_line(pendulum_bundle: Path, width: int) -> None:
    """The table was 304 columns wide (the longest value beside the longest fix) wherever it was read."""
    rows = doctor_command(DoctorConfig(bundle=str(pendulum_bundle)))
    lines = doctor_table(rows, width).splitlines()
    item, status, column = (lines[0].index(name) for name in ("item", "status", "value / fix"))
    too_wide = [line for line in lines if len(line) > width and " " in line[column:].strip()]
    assert too_wide == []  # only a single word longer than the room (a path) may run past the edge
    for row in rows:
        first = next(
            i
            for i, line in enumerate(lines)
            if (line[:item].strip(), line[item:status].strip()) == (row.section, row.item)
        )
        assert lines[first][column:].startswith(row.value.split()[0])
        if row.fix:
            fix = next(line for line in lines[first + 1 :] if line[column:].startswith("fix: "))
            assert fix[:column].strip() == "" and fix[column + 5 :].startswith(row.fix.split()[0])


def test_signature_and_engine_parity_rows(pendulum_bundle: Path, tmp_path: Path) -> None:
    from sac_edge.common.signing import generate_keypair, load_private_key, sign_bundle

    bundle = tmp_path / "bundle"
    shutil.copytree(pendulum_bundle, bundle)
    assert _rows(tmp_path, bundle)["signature"].value.startswith("unsigned")
    private, public = generate_keypair(str(tmp_path / "fleet"))
    sign_bundle(bundle, load_private_key(private))
    keys = tmp_path / "keys"
    keys.mkdir()
    shutil.copy(public, keys)
    rows = doctor_command(DoctorConfig(bundle=str(bundle), sensor_root=str(tmp_path), trusted_keys=str(keys)))
    sig = next(r for r in rows if r.item == "signature")
    assert sig.status == OK and sig.value.startswith("trusted")
    (keys / Path(public).name).unlink()
    _, other_pub = generate_keypair(str(tmp_path / "other"))
    shutil.copy(other_pub, keys)
    rows = doctor_command(DoctorConfig(bundle=str(bundle), sensor_root=str(tmp_path), trusted_keys=str(keys)))
    assert next(r for r in rows if r.item == "signature").status == "no"  # signed, but not by a trusted key
    engines = bundle / "engines"
    engines.mkdir()
    record = {"passed": False, "when": "cached plan", "rule": "max_abs", "value": 0.5, "limit": 0.002}
    (engines / "policy.fp16.trt10.3.0-orin-sm87.json").write_text(json.dumps({"parity": record}))
    row = _rows(tmp_path, bundle)["engine policy.fp16.trt10.3.0-orin-sm87.plan"]
    assert row.status == "no" and "failed" in row.value and "0.5" in row.value and row.fix


def test_tensorrt_generation_row() -> None:
    from sac_edge.edge_runtime.doctor import tensorrt_row

    assert "generation 8.5/8.6: implicit INT8 from calib.cache" in tensorrt_row("8.5.2.2").value
    assert "generation 10.x: Q/DQ INT8" in tensorrt_row("10.3.0").value
    assert "strongly typed" in tensorrt_row("11.4.0").value
    assert "generation 10.12+: strongly typed" in tensorrt_row("10.13.3.9").value
    old = tensorrt_row("7.1.3")
    assert old.status == "no" and old.fix


def test_an_installed_tensorrt_that_does_not_import_is_a_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pendulum_bundle: Path
) -> None:
    from fake_tensorrt import plant_broken_tensorrt

    plant_broken_tensorrt(tmp_path, monkeypatch)
    rows = _rows(FIXTURES / "xavier_nx_jp5", pendulum_bundle)
    assert rows["tensorrt"].status == "no" and "libnvinfer.so.10: cannot open" in rows["tensorrt"].value
    assert "does not import" in rows["tensorrt (any precision)"].value
    assert rows["onnxruntime fp32"].value == "usable" and "permissions" in {r.section for r in rows.values()}


def test_orin_trees_jetpack6_gpu_clock_power_mode_default_and_total(tmp_path: Path) -> None:
    root = Path(shutil.copytree(FIXTURES / "orin_nano_jp6", tmp_path / "nano", symlinks=True))
    rows = _rows(root)
    assert rows["model"].value == "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super"
    assert rows["jetson release"].value == "L4T 36.4.3 (JetPack 6.2)"
    assert rows["nvpmodel mode"].value == "1 25W (the conf's default; no var/lib/nvpmodel/status)"
    assert rows["power sensor"].value.startswith("ina3221-hwmon (sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1)")
    assert "total 4.74 W (= VDD_IN)" in rows["power sensor"].value
    assert rows["clocks locked"].value == "no (7 of 7 clocks scale)"  # 6 cores and the JetPack 6 GPU
    for lo in root.glob("sys/devices/system/cpu/cpu*/cpufreq/scaling_min_freq"):
        lo.write_text((lo.parent / "scaling_max_freq").read_text())
    assert _rows(root)["clocks locked"].value == "no (1 of 7 clocks scale)"  # the GPU (17000000.gpu) still scales
    gpu = root / "sys/class/devfreq/17000000.gpu"
    (gpu / "min_freq").write_text((gpu / "max_freq").read_text())
    assert _rows(root)["clocks locked"].value == "yes (7 clocks at their maximum)"
    agx = _rows(FIXTURES / "agx_orin_jp6")["power sensor"].value
    assert "(sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1, sys/bus/i2c/drivers/ina3221/1-0041/hwmon/hwmon2)" in agx
    assert "(sum of the rails)" in agx and "NC" not in agx


def test_an_orin_with_no_readable_sensor_says_so(tmp_path: Path) -> None:
    root = Path(shutil.copytree(FIXTURES / "orin_nx_jp6", tmp_path / "nx", symlinks=True))
    shutil.rmtree(root / "sys/bus/i2c/drivers/ina3221")
    power = _rows(root)["power sensor"]
    assert power.status != OK and power.value.startswith("none: read failed: no readable power sensor")
    assert "no power model for this Jetson (NVIDIA Jetson Orin NX" in power.value and power.fix
