"""Where the ROS 2 node's step goes: each part of the message-mode step (``RobotInputs.on_state``, ``read``,
``Runtime.act``, ``CommandOutputs.publish``, the whole ``Stepper.step``, ``Runtime.tick``), and ``Runtime.act``'s
own stages, built as the runtime composes them (``ObservationGuard.check``, ``Backend.act`` on the bound input,
``ActionGuard.take``, ``Shield.filter_action``), against the echo's work (a list and rclpy's publish) and the
bare onnxruntime call, in-process on real rclpy, each call 1 ms
after the last (the caches as cold as at the control rate, where a step's cost is mostly its cold misses),
timed in thread CPU time, the parts interleaved.

Run it with the ROS venv's Python (``make venv-ros2``) on a bundle exported with ``--layout``::

    .venv-ros2/bin/python bench/ros2_step_parts.py --bundle runs/ros2-bundle --rounds 2500

Prints a table and one JSON line (mean and median microseconds per part).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def measure(bundle: str, rounds: int, skip: int) -> dict[str, dict[str, float]]:
    import rclpy
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    from sac_edge.common.bundle import open_bundle
    from sac_edge.common.io_layout import bundle_layout
    from sac_edge.edge_runtime.backends.registry import open_backend
    from sac_edge.edge_runtime.ros2.inputs import RobotInputs
    from sac_edge.edge_runtime.ros2.outputs import CommandOutputs
    from sac_edge.edge_runtime.ros2.parameters import run_config
    from sac_edge.edge_runtime.ros2.step import Stepper
    from sac_edge.edge_runtime.runtime import Runtime

    rclpy.init()
    node = rclpy.create_node("step_parts")
    opened = open_bundle(bundle)
    layout = bundle_layout(opened)
    if layout is None:
        raise SystemExit(f"{bundle} has no layout: export it with sac-export --layout FILE")
    clock = time.monotonic_ns
    inputs = RobotInputs(layout, "/joint_states", clock)
    outputs = CommandOutputs(layout, "commands", "", lambda t, topic: node.create_publisher(t, topic, 10), 10**6)
    backend = open_backend(opened, "onnxruntime", "fp32")
    bare = backend.bare_call()
    echo_pub, echo_msg = node.create_publisher(Float64MultiArray, "echo", 10), Float64MultiArray()
    msg = JointState()
    msg.name = list(layout.state_joints)
    n = len(msg.name)
    msg.position, msg.velocity, msg.effort = [0.1] * n, [0.0] * n, [0.0] * n
    options = run_config(bundle, {"backend": "onnxruntime", "precision": "fp32", "rate_hz": 1000.0}).check()
    times: dict[str, list[int]] = {}
    with Runtime(options) as runtime:
        stepper = Stepper(runtime, inputs, outputs, None, 10**9, logging.getLogger("step_parts"), "/joint_states")
        stepper.restart(True)
        obs = stepper.obs
        inputs.on_state(msg, clock())
        action = runtime.act(obs).copy()
        stage = act_stages(runtime._scratch, backend.act, obs)  # the stages exactly as the runtime composed them

        def echo() -> None:
            echo_msg.data = list(msg.position)
            echo_pub.publish(echo_msg)

        parts: dict[str, Callable[[], Any]] = {
            "echo: list + rclpy publish": echo,
            "bare onnxruntime call": bare,
            "RobotInputs.on_state": lambda: inputs.on_state(msg, clock()),
            "RobotInputs.read": lambda: inputs.read(clock(), 10**9, obs),
            "Runtime.act": lambda: runtime.act(obs),
            **stage,
            "CommandOutputs.publish": lambda: outputs.publish(action, action),
            "Stepper.step (read to publish)": lambda: stepper.step(clock(), clock),
            "Runtime.tick": runtime.tick,
        }
        for r in range(rounds):
            msg.position = [float(np.sin(r))] * n
            for name, call in parts.items():
                time.sleep(0.001)
                t0 = time.thread_time_ns()
                call()
                if r >= skip:
                    times.setdefault(name, []).append(time.thread_time_ns() - t0)
    node.destroy_node()
    rclpy.try_shutdown()
    return {k: {"mean_us": float(np.mean(v)) / 1e3, "median_us": float(np.median(v)) / 1e3} for k, v in times.items()}


def act_stages(pipeline: Any, infer: Callable[[np.ndarray], np.ndarray], obs: np.ndarray) -> dict[str, Any]:
    """``Runtime.act``'s stages on their own: ``pipeline``'s (the runtime's scratch pipeline, the same stages
    ``compose.step_pipeline`` builds for its step, on state of their own), each on the input the stage before
    it gives for ``obs``."""
    guard, act_guard, shield = pipeline.obs_guard, pipeline.act_guard, pipeline.shield
    observed, safe, inside = guard.check(obs)
    if safe is None:
        raise SystemExit("the bench's observation is outside the bundle's bounds")
    raw = infer(safe).copy()
    taken = list(act_guard.take(raw))
    stages: dict[str, Any] = {
        "  ObservationGuard.check": lambda: guard.check(obs),
        "  Backend.act (bound input)": lambda: infer(safe),
        "  ActionGuard.take": lambda: act_guard.take(raw),
    }
    if shield is not None:
        stages["  Shield.filter_action"] = lambda: shield.filter_action(observed, inside, taken, True)
    return stages


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    ap.add_argument("--bundle", required=True, help="a bundle exported with --layout")
    ap.add_argument("--rounds", type=int, default=2500, help="calls of each part (the first 300 not counted)")
    args = ap.parse_args(argv)
    result = measure(args.bundle, args.rounds, skip=min(300, args.rounds // 2))
    print(f"{'part':<34} {'mean us':>8} {'median us':>10}")
    for name, r in result.items():
        print(f"{name:<34} {r['mean_us']:>8.1f} {r['median_us']:>10.1f}")
    print(json.dumps({"bench": "ros2_step_parts", "parts": result, "loadavg": os.getloadavg()}))


if __name__ == "__main__":
    main()
