"""``sac-edge ros2`` against real ROS 2 (Kilted's PyPI wheels in .venv-ros2): a simulated robot, the node and a
lifecycle driver, each in its own process on the loopback (harness.py)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import PYTHON, Procs, cpu_seconds, ros_children, shm, sockets, wait_for

from sac_edge.common.config import options
from sac_edge.common.delay import delay_from_profile
from sac_edge.edge_runtime.config import RunConfig

pytestmark = [pytest.mark.ros2, pytest.mark.timeout(240)]
PARAMS_FILE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "sac_edge.params.yaml"
EXACT = ("backend:=onnxruntime", "precision:=fp32", "rate_hz:=1.0")
"""Options that make the node's actions reproducible: one backend and precision (``auto`` times candidates),
and a budget (half a 1 s period) no inference overruns on a busy machine (an overrun holds the last action)."""


def _summary(procs: Procs, name: str = "node") -> dict:
    lines = procs.json_lines(name)
    assert lines, procs.text(name, "err")[-2000:]
    return lines[-1]


def _sim_record(path: Path, procs: Procs) -> dict:
    procs.stop("sim")
    return json.loads(path.read_text())


def test_lockstep_actions_equal_the_runtimes_bit_for_bit_on_the_loopback(
    procs: Procs, pendulum_layout_bundle: Path, tmp_path: Path
) -> None:
    shm_before = shm()
    record, sim_out, summary_file = tmp_path / "run.mcap", tmp_path / "sim.json", tmp_path / "summary.json"
    node = procs.node(pendulum_layout_bundle, "mode:=message", "max_input_age_ms:=5000.0", f"record:={record}",
                      f"summary:={summary_file}", *EXACT)  # fmt: skip
    procs.start("sim", "tests/ros2/sim.py", "--lockstep", "--out", str(sim_out))
    wait_for(lambda: "ready, unconfigured" in procs.text("node", "err"), 60, "the node")
    idle0, t0 = sum(cpu_seconds(p) for p in ros_children(node)), time.monotonic()
    time.sleep(2.0)  # unconfigured: the node spins on its services only
    idle = (sum(cpu_seconds(p) for p in ros_children(node)) - idle0) / (time.monotonic() - t0)
    assert idle < 0.1, f"an idle node used {idle:.0%} of a core"
    steps = procs.run(
        "driver", "tests/ros2/driver.py", "/sac_edge", "configure", "activate", "sleep:3", "diagnostics:1"
    )
    assert [s["ok"] for s in steps] == [True] * 4, steps
    addresses = sockets(procs.pids() + [c for n in ("node", "sim") for c in ros_children(procs.procs[n][0])])
    assert addresses and all(a.startswith(("127.0.0.1:", "239.255.0.1:")) for a in addresses), addresses
    diagnostics = steps[-1]
    assert diagnostics["level"] == 0 and diagnostics["values"]["backend"] == "onnxruntime", diagnostics
    assert int(diagnostics["values"]["steps"]) > 0 and diagnostics["values"]["precision"] == "fp32"
    assert procs.stop("node", signal.SIGINT) == 0
    summary = _summary(procs)
    assert summary["stopped_by_signal"] == "SIGINT" and summary["runtime"]["closed"], summary
    sim = _sim_record(sim_out, procs)
    assert summary["node"]["steps"] >= len(sim["commands"]) - 1 > 50, (summary["node"]["steps"], len(sim["commands"]))
    replay = subprocess.run(
        [str(PYTHON), "tests/ros2/replay.py", str(pendulum_layout_bundle), str(record),
         "backend=onnxruntime", "precision=fp32", "rate_hz=1.0"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2], check=True,
        env=procs.env,
    )  # fmt: skip
    result = json.loads(replay.stdout.splitlines()[-1])
    assert result["compared"] == summary["node"]["steps"], result
    assert result["equal"] == result["compared"], result["first_mismatch"]
    assert shm() - shm_before == set()
    _trains_in_the_delay_it_measured(summary_file, summary)


def _trains_in_the_delay_it_measured(summary_file: Path, printed: dict) -> None:
    """The summary file the node wrote is a ``sac-train --delay-profile`` (the trainer's own parser): its step
    time's p50 and p99 (and the slowest inference for the max) in control steps at Pendulum's 50 ms."""
    written = json.loads(summary_file.read_text())
    node, runtime = written["node"], written["runtime"]
    assert node["steps"] == printed["node"]["steps"] and node["step_p99_us"] >= node["step_p50_us"] > 0, node
    us = (node["step_p50_us"], node["step_p99_us"], max(node["step_p99_us"], runtime["latency_us"]["max"]))
    delay = delay_from_profile(str(summary_file), 0.05)
    assert delay.steps == tuple(sorted({math.floor(u * 1e-6 / 0.05 + 0.5) for u in us})), (delay, us)
    assert delay.source.endswith(f"p50/p99/max {us[0]:.0f}/{us[1]:.0f}/{us[2]:.0f} us at dt 0.05 s"), delay


@pytest.mark.parametrize("rate_hz", [200, 1000])
def test_timer_mode_multi_joint_with_autostart_and_sigterm(
    procs: Procs, multi_layout_bundle: Path, tmp_path: Path, rate_hz: int
) -> None:
    sim_out = tmp_path / "sim.json"
    procs.start("sim", "tests/ros2/sim.py", "--kind", "multi", "--rate-hz", str(rate_hz), "--reward",
                "--out", str(sim_out))  # fmt: skip
    procs.node(
        multi_layout_bundle, "autostart:=true", f"rate_hz:={rate_hz}.0", "max_input_age_ms:=1000.0",
        "command_topic:=/forward_command_controller/commands", "reward_topic:=/reward",
        "episode_end_topic:=/episode_end", "mem_budget_mb:=0.0", params_file=PARAMS_FILE,
    )  # fmt: skip
    wait_for(lambda: "active: timer mode" in procs.text("node", "err"), 90, "the node to be active")
    time.sleep(3.0)
    assert procs.stop("node", signal.SIGTERM) == 0
    summary = _summary(procs)
    node = summary["node"]
    # No speed goal here (a busy 2-core machine runs late; bench/ros2_loop.py measures): the timer ran at the
    # rate asked, its late steps counted
    assert summary["stopped_by_signal"] == "SIGTERM" and node["steps"] > 10 and node["rate_hz"] == rate_hz, node
    assert 0 <= node["deadline_misses"] < node["steps"] and node["step_p99_us"] > 0
    # (a sim starved of CPU for a second on a loaded machine makes stale steps: allowed, they are counted)
    assert node["invalid_states"] == 0 and node["stale_steps"] < node["steps"], node
    runtime = summary["runtime"]  # the reward and episode-end topics fed Runtime.observe
    assert (
        runtime["transitions"] > 0 and runtime["episodes"] >= 1 and runtime["reward_invalid"] < runtime["transitions"]
    )
    assert runtime["shield"]["ramp_steps"] == 50 and runtime["backend"]["backend"] == "onnxruntime"  # the params file
    sim = _sim_record(sim_out, procs)
    commands = sim["commands"]
    # A Python sim on a busy 2-core machine may drop some of 1000 commands a second (its queue keeps 10): the
    # node's own count is the one asserted above
    assert 0 < len(commands) <= node["steps"] + 1 and all(len(c) == 6 for c in commands)
    assert all(abs(v) <= 10.0 for c in commands for v in c)  # the action bounds (+-1) times the layout's scale


def test_stale_input_falls_back_within_the_age_limit_and_ramps_back(
    procs: Procs, pendulum_layout_bundle: Path, tmp_path: Path
) -> None:
    sim_out, record = tmp_path / "sim.json", tmp_path / "run.mcap"
    limit_ms, rate = 50.0, 200
    procs.start("sim", "tests/ros2/sim.py", "--rate-hz", str(rate), "--pause-at", "1.0", "--pause-s", "0.6",
                "--out", str(sim_out))  # fmt: skip
    procs.node(pendulum_layout_bundle, "autostart:=true", f"rate_hz:={rate}.0", f"max_input_age_ms:={limit_ms}",
               f"record:={record}", "backend:=onnxruntime", "ramp_steps:=5", "max_stale_s:=60.0")  # fmt: skip
    wait_for(lambda: "active: timer mode" in procs.text("node", "err"), 90, "the node to be active")
    time.sleep(2.2)  # the sim pauses 1.0 s after the first command, for 0.6 s

    def recovered() -> bool:
        err = procs.text("node", "err")
        return 1 <= err.count("is stale") <= err.count("inputs fresh again")

    wait_for(recovered, 60, "the sim's pause and its end")
    time.sleep(0.3)
    assert procs.stop("node", signal.SIGINT) == 0
    summary = _summary(procs)
    node = summary["node"]
    assert node["stale_steps"] > 0 and node["stale_by"].get("state", 0) == node["stale_steps"], node
    # every stale step was Runtime.hold's: in the runtime's counts, each step once
    assert summary["runtime"]["obs_held"] == node["held_steps"] == node["stale_steps"], (summary["runtime"], node)
    assert summary["runtime"]["steps"] == node["steps"], (summary["runtime"]["steps"], node["steps"])
    assert node["shield_fallbacks"] >= 1 and node["shield_ramps"] >= 1, node  # back through the ramp
    replay = subprocess.run(
        [str(PYTHON), "tests/ros2/replay.py", str(pendulum_layout_bundle), str(record), "backend=onnxruntime"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2], check=True,
        env=procs.env,
    )  # fmt: skip
    # Every step checks the age: the step before each onset (after the first step, whose state may have aged
    # since configure) saw a fresh state, so the fallback came within the limit plus that step's own period
    # (as late as the machine ran it). The sim's pause is one of these onsets.
    onsets = [e for e in json.loads(replay.stdout.splitlines()[-1])["stale"] if e["step"] > 1]
    assert onsets and all(e["input"] == "state" for e in onsets), onsets
    for e in onsets:
        assert e["age_ms"] - e["since_previous_step_ms"] <= limit_ms < e["age_ms"], e
    err = procs.text("node", "err")
    assert "input state is stale" in err and "the shield's fallback" in err


def test_activation_ramps_in_from_the_robots_current_joint_positions(
    procs: Procs, position_layout_bundle: Path, tmp_path: Path
) -> None:
    """Position commands: the first commands after activate are the robot's own pose (joints j0..j5 at 0.1 * i,
    the sim's start), each joint under its own name, and leave it through the ramp, not from the safe action."""
    sim_out, ramp = tmp_path / "sim.json", 40
    procs.start("sim", "tests/ros2/sim.py", "--kind", "multi", "--rate-hz", "50", "--out", str(sim_out))
    procs.node(position_layout_bundle, "rate_hz:=50.0", "max_input_age_ms:=1000.0", f"ramp_steps:={ramp}",
               "backend:=onnxruntime")  # fmt: skip
    steps = procs.run("driver", "tests/ros2/driver.py", "/sac_edge", "configure", "sleep:1", "activate", "sleep:1")
    assert [s["ok"] for s in steps] == [True] * 3, steps
    assert "ramp from the robot's pose" in procs.text("node", "err")
    assert procs.stop("node", signal.SIGINT) == 0
    commands = _sim_record(sim_out, procs)["commands"]
    assert len(commands) > 5, commands
    pose = [0.1 * i for i in (5, 4, 3, 2, 1, 0)]  # the layout's action order
    # command = 0.05 + 0.5 * action, actions in [-1, 1]: a ramp step moves a command by at most 0.5 * 2 / ramp
    for k, command in enumerate(commands[:3], start=1):
        assert max(abs(c - p) for c, p in zip(command, pose)) <= k * 1.0 / ramp + 1e-9, (k, command, pose)


def test_a_backend_failing_mid_run_takes_the_node_to_the_error_state_with_a_safe_command_and_a_summary(
    procs: Procs, failing_bundle: Path, tmp_path: Path
) -> None:
    """The policy's backend fails once the pendulum swings past 3 rad/s (a few steps in): the runtime stops
    serving, the node publishes the configured safe command, goes through the error state (``on_error``) to
    unconfigured, writes its summary, publishes nothing more, and still ends cleanly on SIGINT."""
    sim_out, summary_file = tmp_path / "sim.json", tmp_path / "summary.json"
    procs.start("sim", "tests/ros2/sim.py", "--lockstep", "--out", str(sim_out))
    procs.node(failing_bundle, "mode:=message", "max_input_age_ms:=5000.0", "max_backend_errors:=1",
               "ramp_steps:=0", f"summary:={summary_file}", "safe_action:=0.25", "fallback:=fixed",
               *EXACT)  # fmt: skip
    steps = procs.run("driver", "tests/ros2/driver.py", "/sac_edge", "configure", "activate")
    assert [s["ok"] for s in steps] == [True] * 3, steps
    wait_for(summary_file.is_file, 60, "the summary the error state writes")
    time.sleep(0.6)  # the sim re-sends its state every 0.2 s without a command: the node must stay silent
    state = procs.run("driver-state", "tests/ros2/driver.py", "/sac_edge", "state", "diagnostics:1")
    assert state[1]["state"] == "unconfigured", state  # ErrorProcessing's on_error succeeded
    status = state[2]  # the error stays on /diagnostics after the teardown
    assert status["level"] == 2 and status["message"].startswith("stopped serving: backend error x1"), status
    summary = json.loads(summary_file.read_text())
    runtime, node = summary["runtime"], summary["node"]
    assert runtime["closed"] and runtime["backend_errors"] == 1, runtime
    assert runtime["stopped_by"].startswith("backend error x1: "), runtime["stopped_by"]
    assert node["state"] == "error" and node["stopped_by"] == runtime["stopped_by"], node
    assert runtime["steps"] >= 4, runtime  # mid-run: the policy served first
    err = procs.text("node", "err")
    errors = [line for line in err.splitlines() if "[ERROR]" in line]
    assert len(errors) == 2, errors  # one line as it stops, one from on_error
    assert "the runtime stopped serving: backend error x1: RuntimeError" in errors[0], errors
    assert errors[0].endswith("going to the error state") and "safe command published" in errors[1], errors
    assert procs.stop("node", signal.SIGINT) == 0
    assert _summary(procs)["runtime"]["stopped_by"] == runtime["stopped_by"]
    commands = _sim_record(sim_out, procs)["commands"]
    # the failed step's command and the one at deactivate: the configured safe action's (the layout's scale is 1),
    # not the last action the policy served; nothing after it
    assert len(commands) == runtime["steps"] + 1, (len(commands), runtime["steps"])
    assert commands[-2:] == [[0.25], [0.25]] and commands[-3] != [0.25], commands[-6:]


#: ``sac-edge run`` options that are the robot's or the node's own schedule's business: no node parameter.
NOT_PARAMETERS = {"env", "seed", "shift", "json", "duration", "spin_us", "warm_cache"}


def test_every_run_option_is_a_parameter_and_the_realtime_ones_apply_at_configure(
    procs: Procs, pendulum_layout_bundle: Path, tmp_path: Path
) -> None:
    """Every ``sac-edge run`` option (but the robot's and the schedule's) is a node parameter under its flag's
    name, described, with its flag's range; fixed once configured; ``cpus`` pins the thread every step runs on
    (and with root, ``idle_latency_us`` holds the PM QoS cap while active), as ``sac-edge run`` applies them."""
    cpu = max(os.sched_getaffinity(0))
    root = os.access("/dev/cpu_dma_latency", os.W_OK)  # the PM QoS request needs root
    procs.start("sim", "tests/ros2/sim.py", "--rate-hz", "50", "--out", str(tmp_path / "sim.json"))
    procs.node(pendulum_layout_bundle, "backend:=onnxruntime", "rate_hz:=50.0", f"cpus:={cpu}",
               *(["idle_latency_us:=1000"] if root else []))  # fmt: skip
    steps = procs.run("driver", "tests/ros2/driver.py", "/sac_edge", "parameters", "configure", "activate",
                      "set:cpus='0'", "set:max_input_age_ms=100.0", "sleep:0.5")  # fmt: skip
    assert [s["ok"] for s in steps] == [True, True, True, True, False, True], steps
    assert "cpus is fixed once configured" in steps[4]["reason"], steps[4]
    declared = steps[1]["parameters"]
    expected = {o.dest for o in options(RunConfig)} - NOT_PARAMETERS
    assert expected - set(declared) == set(), sorted(expected - set(declared))
    assert all(declared[name]["description"] for name in expected)
    assert declared["realtime_priority"]["range"] == [0, 99], declared["realtime_priority"]
    idle = declared["idle_latency_us"]
    assert idle["range"] == [-1, 2**31 - 1] and "-1: not set" in idle["description"], idle
    assert declared["lock_memory"]["type"] == 1 and declared["cpus"]["dynamic"]  # bool; A,B, a number or a list
    err = procs.text("node", "err")
    assert f"realtime: pinned to CPUs [{cpu}]" in err, err
    assert ("CPU idle states limited to 1000 us" in err) is root, err
    threads = [  # the node's main thread (the executor's): the wheels' bootstrapper re-executes Python as a child
        Path(f"/proc/{pid}/task/{pid}/status").read_text() for pid in ros_children(procs.procs["node"][0])
    ]
    assert any(f"Cpus_allowed_list:\t{cpu}\n" in status for status in threads), threads
    assert procs.stop("node", signal.SIGINT) == 0


def test_a_wrong_joint_name_fails_configure_in_one_line(
    procs: Procs, pendulum_layout_bundle: Path, tmp_path: Path
) -> None:
    procs.start("sim", "tests/ros2/sim.py", "--names", "pendulum_joint", "--out", str(tmp_path / "sim.json"))
    procs.node(pendulum_layout_bundle, "backend:=onnxruntime")
    steps = procs.run("driver", "tests/ros2/driver.py", "/sac_edge", "configure")
    assert steps[-1] == {**steps[-1], "step": "configure", "ok": False, "state": "unconfigured"}, steps
    errors = [line for line in procs.text("node", "err").splitlines() if "[ERROR]" in line]
    assert (
        len(errors) == 1
        and "joint 'pendulum' of the layout is missing (the robot publishes pendulum_joint)" in errors[0]
    )


@pytest.mark.parametrize(
    ("parameter", "line"),
    [
        ("shield:=sometimes", "--shield must be one of on, guards, got 'sometimes'"),
        ("slew:=fast", "parameter slew: expected a comma-separated list, got 'fast'; set it as its flag takes it"),
    ],
)
def test_a_bad_run_option_fails_configure_in_one_line_before_the_robot_is_waited_for(
    procs: Procs, pendulum_layout_bundle: Path, parameter: str, line: str
) -> None:
    """No robot publishes, and configure would wait 100 s for its first state: a bad value is refused first."""
    procs.node(pendulum_layout_bundle, "backend:=onnxruntime", "first_state_timeout_s:=100.0", parameter)
    steps = procs.run("driver", "tests/ros2/driver.py", "/sac_edge", "configure")
    assert steps[-1] == {**steps[-1], "step": "configure", "ok": False, "state": "unconfigured"}, steps
    assert steps[-1]["s"] < 30, steps  # not the wait for a JointState
    errors = [line for line in procs.text("node", "err").splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and f"configure failed: {line}" in errors[0], errors


def test_without_rclpy_the_command_says_so_in_one_line(pendulum_layout_bundle: Path) -> None:
    """In the device runtime's venv (no ROS 2): exit 2, one line naming the fix."""
    proc = subprocess.run(
        [sys.executable, "-m", "sac_edge.edge_runtime.cli", "ros2", str(pendulum_layout_bundle)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "rclpy is not importable here: source the robot's ROS 2 first" in proc.stderr


def test_an_incompatible_qos_peer_is_reported(procs: Procs, pendulum_layout_bundle: Path, tmp_path: Path) -> None:
    """A best-effort command publisher and a reliable subscriber never connect: the node says so."""
    procs.start("sim", "tests/ros2/sim.py", "--rate-hz", "50", "--out", str(tmp_path / "sim.json"))
    procs.node(
        pendulum_layout_bundle, "autostart:=true", "command_qos_reliability:=best_effort", "backend:=onnxruntime"
    )
    wait_for(
        lambda: "QoS mismatch on /forward_command_controller/commands" in procs.text("node", "err"), 60, "a warning"
    )
    assert procs.stop("node", signal.SIGINT) == 0
    assert _summary(procs)["node"]["qos_incompatible"] >= 1
    assert "RELIABILITY" in procs.text("node", "err")


def test_doctor_has_a_ros2_row(procs: Procs) -> None:
    """Without ROS 2 (the device runtime's venv) the row says what to source; with it, rclpy and its middleware."""
    rows = {}
    for python in (sys.executable, str(PYTHON)):
        proc = subprocess.run(
            [python, "-m", "sac_edge.edge_runtime.cli", "doctor", "--json"],
            capture_output=True, text=True, timeout=120, check=True, env=procs.env,
        )  # fmt: skip
        report = json.loads(proc.stdout.splitlines()[-1])
        rows[python] = next(r for r in report["rows"] if r["item"] == "ros 2 (sac-edge ros2)")
    without, with_ros = rows[sys.executable], rows[str(PYTHON)]
    assert without["status"] == "info" and "source the robot's ROS 2 first" in without["value"], without
    assert with_ros["status"] == "ok" and "rmw_fastrtps_cpp" in with_ros["value"], with_ros
