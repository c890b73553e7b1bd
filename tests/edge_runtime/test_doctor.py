"""sac-edge doctor against the Xavier NX fixture trees and on this machine's bundles."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sac_edge.edge_runtime.cli import main
from sac_edge.edge_runtime.config import DoctorConfig
from sac_edge.edge_runtime.doctor import OK, Row, doctor_command

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
    assert power.status == OK and "ina3221-hwmon" in power.value and "xavier_nx_jp5" in power.value
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
    assert "ina3221-iio" in rows["power sensor"].value and "xavier_nx_jp4" in rows["power sensor"].value
    bare = _rows(tmp_path)
    assert bare["jetson release"].value == "not a Jetson (no etc/nv_tegra_release)"
    assert bare["power sensor"].status != OK and bare["power sensor"].fix  # estimated, with what to do


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
