"""Shadow mode against real ROS 2: a stand-in controller (sim.py --controller) commands the robot, the node runs
the policy beside it and commands nothing (no publisher on the command or trajectory topic, as the ROS graph
shows), and its divergence figures are those ``sac-edge replay`` computes from the node's own record."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from harness import PYTHON, Procs, wait_for

pytestmark = [pytest.mark.ros2, pytest.mark.timeout(240)]
EXACT = ("backend:=onnxruntime", "precision:=fp32", "rate_hz:=1.0")
"""One backend and precision, and a 0.5 s inference budget no step overruns: the replay's actions are the node's."""
COMMANDS = "/forward_command_controller/commands"


def test_shadow_mode_commands_nothing_and_its_divergence_is_the_replays(
    procs: Procs, multi_layout_bundle: Path, tmp_path: Path
) -> None:
    record, summary_file, sim_out = tmp_path / "shadow.mcap", tmp_path / "summary.json", tmp_path / "sim.json"
    procs.start("sim", "tests/ros2/sim.py", "--kind", "multi", "--controller", "--rate-hz", "50", "--out", str(sim_out))
    procs.node(
        multi_layout_bundle, "shadow:=true", "autostart:=true", "mode:=message", "max_input_age_ms:=1000.0",
        "trajectory_topic:=/trajectory", f"record:={record}", f"summary:={summary_file}", *EXACT,
    )  # fmt: skip
    wait_for(lambda: "active: message mode" in procs.text("node", "err"), 90, "the node to be active")
    time.sleep(3.0)
    steps = procs.run("driver", "tests/ros2/driver.py", "/sac_edge", f"graph:{COMMANDS}", "graph:/trajectory",
                      "diagnostics:1")  # fmt: skip
    commands, trajectory, diagnostics = steps[1:]
    assert commands["publishers"] == ["sim"] and "sac_edge" in commands["subscribers"], commands
    assert trajectory["publishers"] == [], trajectory
    assert diagnostics["message"].startswith("shadow:"), diagnostics
    values = diagnostics["values"]
    assert int(values["shadow.commands_compared"]) > 0 and float(values["shadow.divergence.j0.p99"]) > 0, values
    assert procs.stop("node", signal.SIGINT) == 0
    node = procs.json_lines("node")[-1]["node"]
    shadow = node["shadow"]
    assert json.loads(summary_file.read_text())["node"]["shadow"] == shadow
    assert shadow["commands_compared"] > 50 and set(shadow["divergence"]) == {f"j{i}" for i in range(6)}
    procs.stop("sim")
    sim = json.loads(sim_out.read_text())
    assert len(sim["commands"]) <= sim["published"]  # every command the robot took was its controller's
    replay = subprocess.run(
        [str(PYTHON), "-m", "sac_edge.edge_runtime.cli", "replay", str(multi_layout_bundle), str(record),
         "--backend", "onnxruntime", "--precision", "fp32", "--json"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2], env=procs.env,
    )  # fmt: skip
    assert replay.returncode in (0, 3), replay.stderr[-2000:]
    report = json.loads(replay.stdout.splitlines()[-1])
    assert report["commands_compared"] == shadow["commands_compared"]
    for joint, figures in shadow["divergence"].items():
        assert report["actions"][joint]["divergence"] == pytest.approx(figures, rel=1e-9, abs=1e-12), joint
