"""docs/ROS2.md's way to drive the node's lifecycle without the ``ros2`` command, which PyPI's ROS 2 lacks:
``docs/examples/lifecycle.py`` against the real node (its transitions, a refused one, the exit codes)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from harness import Procs, wait_for

pytestmark = [pytest.mark.ros2, pytest.mark.timeout(240)]
EXAMPLE = "docs/examples/lifecycle.py"


def test_the_lifecycle_example_steps_the_node_and_refuses_what_its_state_does_not_allow(
    procs: Procs, pendulum_layout_bundle: Path, tmp_path: Path
) -> None:
    procs.node(pendulum_layout_bundle, "mode:=message", "max_input_age_ms:=5000.0")
    procs.start("sim", "tests/ros2/sim.py", "--lockstep", "--out", str(tmp_path / "sim.json"))
    wait_for(lambda: "ready, unconfigured" in procs.text("node", "err"), 60, "the node")
    up = procs.start("up", EXAMPLE, "/sac_edge", "configure", "activate")
    assert up.wait(timeout=120) == 0, procs.text("up", "err")[-2000:]
    assert procs.text("up").splitlines() == ["/sac_edge: configure -> inactive", "/sac_edge: activate -> active"]
    wrong = procs.start("wrong", EXAMPLE, "/sac_edge", "configure")
    assert wrong.wait(timeout=120) == 1
    said = procs.text("wrong").strip()
    assert said.startswith("/sac_edge: configure is not a transition from active (these are: ") and "deactivate" in said
    down = procs.start("down", EXAMPLE, "/sac_edge", "deactivate", "cleanup")
    assert down.wait(timeout=120) == 0, procs.text("down", "err")[-2000:]
    assert procs.text("down").splitlines() == [
        "/sac_edge: deactivate -> inactive",
        "/sac_edge: cleanup -> unconfigured",
    ]
    assert procs.stop("node", signal.SIGINT) == 0
